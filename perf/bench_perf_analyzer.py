#!/usr/bin/env python
"""perf_analyzer (Triton's own C++ load generator) against `tokenizer` (~500-token texts) and the
`embed` ensemble (~90-token texts): a concurrency sweep and a Poisson request-rate sweep each.
Its CSVs and console reports (which break the ensemble's latency down into each composing
model's queue and compute time) are saved as perf_analyzer_<model>_<mode>.csv/.txt beside the
report; this script tabulates them in bench_perf_analyzer.md.
"""
from harness import report
from harness.analyzer import composing_breakdown, run_perf_analyzer, write_text_input
from harness.corpora import synthetic_texts
from harness.paths import RAW
from harness.server import benchmark_server


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_perf_analyzer", "perf_analyzer: tokenizer and embed (concurrency and Poisson sweeps)",
        tokenizer_concurrency="16:64:16", tokenizer_rates="100:700:200", embed_concurrency="8:32:8",
        embed_rates="10:40:10", window_ms=(4000, "perf_analyzer -p"))
    inputs = {"tokenizer": write_text_input(synthetic_texts(512, 500), RAW / "pa_tokenizer.json"),
              "embed": write_text_input(synthetic_texts(512, 90, seed=1), RAW / "pa_embed.json")}
    runs = {}
    with benchmark_server("bench_perf_analyzer", ["tokenizer", "encoder", "pooler", "embed"]) as server:
        for model, conc, rates in (("tokenizer", args.tokenizer_concurrency, args.tokenizer_rates),
                                   ("embed", args.embed_concurrency, args.embed_rates)):
            runs[(model, "concurrency")] = run_perf_analyzer(
                server.grpc_url, model, inputs[model], f"--concurrency-range={conc}", "--async",
                name=f"{model}_concurrency", out_dir=rep.directory, measurement_ms=args.window_ms)
            runs[(model, "poisson")] = run_perf_analyzer(
                server.grpc_url, model, inputs[model], "--request-distribution=poisson",
                f"--request-rate-range={rates}", name=f"{model}_poisson", out_dir=rep.directory,
                measurement_ms=args.window_ms)

    rep.add(f"perf_analyzer -i grpc --async, one text per request (--shape text_input:1) cycling through 512 "
            f"distinct texts (--input-data), {args.window_ms} ms windows, -s 100 (a tighter stability bound is never "
            "met on this shared machine and perf_analyzer then reports nothing). Latencies in ms. Full CSVs "
            "and console reports: perf/results/perf_analyzer_*.csv / .txt. An empty table means perf_analyzer "
            "produced no stable measurement (see its .txt).\n")
    for (model, mode), rows in runs.items():
        key = "Concurrency" if mode == "concurrency" else "Request Rate"
        rep.add(f"## {model}, {mode} sweep\n")
        rep.add(report.table(
            [key.lower(), "infer/s", "P50 ms", "P90 ms", "P99 ms", "server queue ms", "server compute ms"],
            [[f"{r.get(key, 0):g}", r["Inferences/Second"], r["p50 latency"] / 1000, r["p90 latency"] / 1000,
              r["p99 latency"] / 1000, r["Server Queue"] / 1000,
              (r["Server Compute Input"] + r["Server Compute Infer"] + r["Server Compute Output"]) / 1000]
             for r in sorted(rows, key=lambda r: r.get(key, 0))]))
        if model == "embed":
            console = (rep.directory / f"perf_analyzer_{model}_{mode}.txt").read_text()
            rep.add("Per composing model (from perf_analyzer's console report):\n")
            rep.add(report.table([key.lower(), "model", "queue ms", "compute ms", "request latency ms"],
                                 composing_breakdown(console)))

    fig, axes = report.plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, model in zip(axes, ("tokenizer", "embed")):
        for mode, style in (("concurrency", "o-"), ("poisson", "s--")):
            rows = sorted(runs[(model, mode)], key=lambda r: r["Inferences/Second"])
            ax.plot([r["Inferences/Second"] for r in rows], [r["p99 latency"] / 1000 for r in rows], style,
                    label=f"{mode} sweep")
        ax.set(xlabel="infer/s", ylabel="P99 latency (ms)", yscale="log", title=f"perf_analyzer: {model}")
        ax.legend(fontsize=8)
    rep.write(fig)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Tokenizer A/B in one run: the committed `tokenizer` (dynamic batching, one batch-encode per
execute) against `tokenizer_unbatched` (the committed tokenizer's config and model.py with its
`dynamic_batching` block removed, written for the run: one encode per request), both in one tritonserver, under open-loop
Poisson load at the same rates, the two models interleaved step by step.

Texts are ~500 tokens of varied words (the tokenizer encodes them whole, then truncates to 256).
Reported: the baseline's saturation rate (the lowest swept rate it cannot keep up with) and both
models' P99 there (target: batched >= 10x lower), and each model's highest rate with P99 under
100 ms (target: batched >= 2x).
"""
import asyncio
import math
import tempfile
from dataclasses import asdict
from pathlib import Path

from harness import report
from harness.clients.kserve import single_texts
from harness.corpora import synthetic_texts
from harness.load.unary import LoadResult, saturated, sweep, warm_up
from harness.observe import sweep_observer
from harness.deploy import write_variant
from harness.paths import COMMITTED
from harness.server import benchmark_server

BATCHED, BASELINE = "tokenizer", "tokenizer_unbatched"


def analyse(results: list[LoadResult], p99_limit_ms: float) -> dict:
    by = {m: {r.target_rps: r for r in results if r.model == m} for m in (BATCHED, BASELINE)}
    saturated_rates = sorted(rate for rate, r in by[BASELINE].items() if saturated(r))
    sat = saturated_rates[0] if saturated_rates else None

    def p99_at(model):
        r = by[model].get(sat)
        return r.p99_ms if r else math.nan

    def best_rate(model):
        ok = [rate for rate, r in by[model].items() if r.p99_ms < p99_limit_ms and not saturated(r)]
        return max(ok) if ok else math.nan

    out = {"saturation_rps": sat, "p99_at_saturation": {m: p99_at(m) for m in by},
           "best_rate": {m: best_rate(m) for m in by}}
    out["p99_ratio"] = out["p99_at_saturation"][BASELINE] / out["p99_at_saturation"][BATCHED]
    out["rate_ratio"] = out["best_rate"][BATCHED] / out["best_rate"][BASELINE]
    return out


def plot(results, summary, p99_limit_ms):
    fig, (ax1, ax2) = report.plt.subplots(1, 2, figsize=(12, 4.5))
    for model, style in ((BASELINE, "o--"), (BATCHED, "s-")):
        rows = sorted((r for r in results if r.model == model), key=lambda r: r.target_rps)
        rates = [r.target_rps for r in rows]
        ax1.plot(rates, [r.p99_ms for r in rows], style, label=f"{model} P99")
        ax1.plot(rates, [r.p50_ms for r in rows], style, alpha=0.35, label=f"{model} P50")
        ax2.plot(rates, [r.achieved_rps for r in rows], style, label=model)
    ax1.axhline(p99_limit_ms, color="grey", lw=0.8, ls=":", label=f"{p99_limit_ms:g} ms")
    if summary["saturation_rps"]:
        for ax in (ax1, ax2):
            ax.axvline(summary["saturation_rps"], color="red", lw=0.8, ls=":", label="baseline saturation")
    ax1.set(yscale="log", xlabel="offered load (Poisson, requests/s)", ylabel="latency (ms)",
            title="tokenizer latency, ~500-token texts")
    top = max(r.target_rps for r in results)
    ax2.plot([0, top], [0, top], color="grey", lw=0.8, ls=":", label="achieved = offered")
    ax2.set(xlabel="offered load (requests/s)", ylabel="achieved (responses/s)", title="throughput")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    return fig


def unbatched(target: Path) -> Path:
    """A repository in `target` holding the baseline: the committed tokenizer without its dynamic
    batcher (same instances, inputs and parameters), so every request is encoded on its own."""
    write_variant(BATCHED, BASELINE, target, [(r"(?s)^dynamic_batching \{.*?^\}\n", "")])
    return target


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_tokenizer", "Tokenizer: dynamic batching vs request-by-request (open-loop Poisson)",
        rates="100,200,300,400,500,600,700,800,1000,1200", duration=(12.0, "seconds per rate and model"), texts=512,
        tokens=500, p99_limit_ms=100.0, max_total_s=(420.0, "cap on the sweep"))
    texts = synthetic_texts(args.texts, args.tokens)
    factory = single_texts(texts)
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as baselines, \
            benchmark_server("bench_tokenizer", [BATCHED, BASELINE], [*COMMITTED, unbatched(Path(baselines))]) as server:
        asyncio.run(warm_up(server.grpc_url, factory, [BATCHED, BASELINE]))
        results = asyncio.run(sweep(server.grpc_url, [BASELINE, BATCHED], factory, rates, args.duration,
                                    max_total_s=args.max_total_s, observe=sweep_observer(server)))
    report.write_raw("bench_tokenizer", [asdict(r) for r in results])

    s = analyse(results, args.p99_limit_ms)
    rep.add(f"{len(texts)} distinct texts of ~{args.tokens} tokens (encoded whole, truncated to 256 by the model), "
            f"one text per request; {args.duration:g} s of Poisson arrivals per rate and model, the two models "
            "alternating step by step (order reversed at every rate); latency counted from each request's "
            "scheduled send time. Both models are the same model.py in the same tritonserver with 1 instance; "
            "the baseline has no `dynamic_batching`. Saturated = failed requests or achieved < 95% of offered.\n")
    rows = []
    for r in sorted(results, key=lambda r: (r.target_rps, r.model)):
        sv = r.server
        rows.append([r.model, r.target_rps, r.achieved_rps, f"{r.successful}/{r.total}", r.failed, r.avg_ms, r.p50_ms,
                     r.p90_ms, r.p99_ms, sv.get("mean_batch", math.nan), sv.get("queue_ms_per_request", math.nan),
                     sv.get("compute_ms_per_execution", math.nan), sv.get("server_cpu", math.nan), r.client_cpu,
                     sv.get("other_cpu", math.nan), "yes" if saturated(r) else ""])
    rep.add(report.table(["model", "offered rps", "achieved rps", "ok/total", "failed", "avg ms", "P50 ms", "P90 ms",
                          "P99 ms", "texts/execute", "queue ms/req", "compute ms/execute", "server CPU (cores)",
                          "loadgen CPU (cores)", "other work CPU (cores)", "saturated"], rows))
    sat = s["saturation_rps"]
    lines = ["## Summary", ""]
    if sat is None:
        lines.append("The baseline never saturated at the swept rates: extend --rates.")
    else:
        lines += [
            f"- baseline saturation rate: **{sat:g} requests/s** (lowest swept rate it could not keep up with)",
            f"- P99 there: baseline {s['p99_at_saturation'][BASELINE]:.1f} ms, batched "
            f"{s['p99_at_saturation'][BATCHED]:.1f} ms -> baseline/batched = {report.verdict(s['p99_ratio'], 10)}",
        ]
    lines += [
        f"- highest swept rate with P99 < {args.p99_limit_ms:g} ms (and not saturated): baseline "
        f"{s['best_rate'][BASELINE]:g}, batched {s['best_rate'][BATCHED]:g} requests/s -> batched/baseline = "
        f"{report.verdict(s['rate_ratio'], 2)}",
        f"- load generator CPU: {min(r.client_cpu for r in results):.2f}-{max(r.client_cpu for r in results):.2f} "
        "of one core (it shares the 2 cores with the server)",
    ]
    rep.add("\n".join(lines))
    rep.write(plot(results, s, args.p99_limit_ms))


if __name__ == "__main__":
    main()

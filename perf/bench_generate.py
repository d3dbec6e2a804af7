#!/usr/bin/env python
"""The whole `generate` ensemble (llm_tokenizer -> llm -> detokenizer) over a concurrency sweep,
streamed over gRPC like a TensorRT-LLM client: time to first token (TTFT), inter-token latency
(ITL), output tokens/s.

Committed deployment (llm: 1 instance, torch on all cores; detokenizer: 2 instances). Closed
loop: C clients, each sending its next request as soon as the last one ended, spread over at
most 8 gRPC streams (tritonclient.grpc.aio stream_infer, stream=true). Prompts: different
synthetic English-word texts of a fixed token count, raw text (no chat template), greedy.
TTFT = from sending to the first response with non-empty text_output; ITL = gaps between a
request's responses that carry tokens, per token. Output tokens/s = completion tokens of
finished requests / (last final response - first send).

Then perf_analyzer (C++, so the client costs the server less CPU) against `generate` with
--streaming at a few concurrencies; TTFT/ITL come from its --profile-export-file (per-response
timestamps and outputs), computed the same way. Report only, no target.
"""
import asyncio
import time

from harness import observe, report
from harness.analyzer import run_perf_analyzer, streaming_export_stats, write_input
from harness.clients.kserve import generate_inputs
from harness.corpora import synthetic_prompts
from harness.load import streaming
from harness.paths import RAW
from harness.server import benchmark_server

MODEL = "generate"
COMPOSING = ["llm_tokenizer", "llm", "detokenizer"]


def max_tokens_of(i: int, mean: int) -> int:
    """max_tokens of the i-th prompt: mean +-25%, so that closed-loop clients started together
    do not stay in lockstep (all prefilling at once, then all decoding)."""
    return mean + round(mean * 0.25 * ((i * 7919) % 101 / 50 - 1))


async def sweep(server, texts: list[str], max_tokens: int, levels: list[int], duration: float) -> list:
    url = server.grpc_url
    requests = [streaming.Request(generate_inputs(t, max_tokens_of(i, max_tokens), stream=True))
                for i, t in enumerate(texts)]
    warm = [requests[i] for i in range(4)]
    await streaming.open_loop(url, MODEL, warm, 100.0, connections=2, reader=streaming.read_generate())
    results = []
    for c in levels:
        finish, cpu = observe.step(server, COMPOSING), time.process_time()
        records, seconds = await streaming.closed_loop(url, MODEL, lambda i: requests[i % len(requests)], c, duration,
                                                       reader=streaming.read_generate())
        s = streaming.summary(records)
        s.update(concurrency=c, seconds=seconds, tokens_per_s=s["tokens"] / seconds, requests_per_s=s["ok"] / seconds,
                 tokens_per_request=s["tokens"] / max(1, s["ok"]), server=finish(),
                 client_cpu=(time.process_time() - cpu) / seconds)
        results.append(s)
        print(f"c={c:3d} ok {s['ok']:4d} failed {s['failed']}  ttft mean {s['ttft_mean']:7.0f} p50 {s['ttft_p50']:7.0f} "
              f"p99 {s['ttft_p99']:7.0f} ms  itl mean {s['itl_mean']:6.1f} p99 {s['itl_p99']:6.1f} ms  "
              f"{s['tokens_per_s']:6.1f} tok/s  server cpu {s['server']['server_cpu']:.2f}", flush=True)
    return results


def perf_analyzer_input(texts: list[str], max_tokens: int):
    return write_input([{"text_input": [t], "max_tokens": [max_tokens_of(i, max_tokens)], "stream": [True]}
                        for i, t in enumerate(texts)], RAW / "pa_generate.json")


def plot(results: list[dict], pa: list[dict]):
    fig, axes = report.plt.subplots(1, 3, figsize=(15, 4))
    levels = [r["concurrency"] for r in results]
    for ax, keys, label in ((axes[0], ("ttft_mean", "ttft_p99"), "TTFT (ms)"), (axes[1], ("itl_mean", "itl_p99"), "ITL (ms)"),
                            (axes[2], ("tokens_per_s",), "output tokens/s")):
        for key in keys:
            ax.plot(levels, [r[key] for r in results], "o-", label=f"asyncio client {key.split('_')[-1]}")
            if pa:
                ax.plot([p["concurrency"] for p in pa], [p[key] for p in pa], "s--", alpha=0.7,
                        label=f"perf_analyzer {key.split('_')[-1]}")
        ax.set(xscale="log", xlabel="concurrent streams", ylabel=label, title=f"generate: {label}")
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.legend(fontsize=7)
    return fig


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_generate", "generate ensemble: streaming TTFT, ITL and tokens/s over concurrency",
        concurrency="1,4,16,32", duration=(45.0, "seconds of sending per concurrency"), prompt_tokens=96,
        max_tokens=48, texts=256, pa_concurrency=("1,8", "perf_analyzer levels ('' to skip)"),
        pa_requests=(12, "perf_analyzer requests per measurement window"))
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = synthetic_prompts(args.texts, args.prompt_tokens, seed=7)
    pa_input = perf_analyzer_input(texts, args.max_tokens)
    pa_export = RAW / "pa_generate_export.json"
    pa_rows, pa_stats = [], []
    with benchmark_server("bench_generate", [*COMPOSING, MODEL]) as server:
        results = asyncio.run(sweep(server, texts, args.max_tokens, levels, args.duration))
        for c in [int(c) for c in args.pa_concurrency.split(",") if c]:
            pa_export.unlink(missing_ok=True)
            # Time windows report nothing when a window is shorter than a request: count windows.
            pa_rows += run_perf_analyzer(server.grpc_url, MODEL, pa_input, "--streaming", f"--concurrency-range={c}",
                                         "--measurement-mode=count_windows",
                                         f"--measurement-request-count={max(args.pa_requests, 2 * c)}",
                                         f"--profile-export-file={pa_export}", name=f"generate_c{c}",
                                         out_dir=rep.directory, max_trials=3)
            if pa_export.exists():
                pa_stats += streaming_export_stats(pa_export)
        crashed = server.crashed()
    report.write_raw("bench_generate", {"client": results, "perf_analyzer": pa_stats})

    rep.add(f"`generate` ensemble, committed deployment (llm 1 instance with torch on all cores, detokenizer 2 "
            f"instances). {len(texts)} different raw-text prompts of {args.prompt_tokens} tokens, max_tokens "
            f"{args.max_tokens} +-25% (varied so that clients started together drift apart), greedy, stream=true. Closed loop, {args.duration:g} s of sending per concurrency, "
            "then in-flight requests finish (counted). asyncio client (tritonclient.grpc.aio stream_infer, at most 8 "
            "gRPC streams) on the same 2 cores as the server.\n")
    rows = []
    for r in results:
        sv = r["server"]
        rows.append([r["concurrency"], f"{r['ok']}/{r['requests']}", r["ttft_mean"], r["ttft_p50"], r["ttft_p99"],
                     r["itl_mean"], r["itl_p50"], r["itl_p99"], r["tokens_per_s"], r["requests_per_s"],
                     r["tokens_per_request"],
                     " / ".join(f"{sv[m]['mean_batch']:.1f}" for m in ("llm_tokenizer", "detokenizer")),
                     f"{sv['server_cpu']:.2f} / {r['client_cpu']:.2f}"])
    rep.add(report.table(["streams", "ok", "TTFT mean ms", "TTFT P50 ms", "TTFT P99 ms", "ITL mean ms", "ITL P50 ms",
                          "ITL P99 ms", "output tok/s", "requests/s", "tokens/request",
                          "requests/execute llm_tokenizer / detokenizer", "CPU cores server / client"], rows))
    if pa_stats:
        rep.add("perf_analyzer `-i grpc --streaming --concurrency-range=C --measurement-mode=count_windows "
                "--profile-export-file=...` (commands and console output: perf/results/perf_analyzer_generate_c*.txt); "
                "TTFT/ITL computed from the export; its own columns as it reports them (response throughput: responses/s, "
                "one per token here; p50 latency: it prints \"Detected decoupled model, using the first response for "
                "measuring latency\", but compare with the TTFT column):\n\n" +
                report.table(["streams", "requests", "TTFT mean ms", "TTFT P50 ms", "TTFT P99 ms", "ITL mean ms",
                              "ITL P99 ms", "output tok/s", "PA response throughput /s", "PA p50 latency ms"],
                             [[p["concurrency"], p["requests"], p["ttft_mean"], p["ttft_p50"], p["ttft_p99"],
                               p["itl_mean"], p["itl_p99"], p["tokens_per_s"],
                               *next(([row.get("Response Throughput", float("nan")),
                                       row.get("p50 latency", float("nan")) / 1000]
                                      for row in pa_rows if row.get("Concurrency") == p["concurrency"]),
                                     [float("nan")] * 2)]
                              for p in pa_stats]))
    elif args.pa_concurrency:
        rep.add("perf_analyzer gave no results: see perf/results/perf_analyzer_generate_c*.txt.")
    best = max(results, key=lambda r: r["tokens_per_s"])
    rep.add("## Summary\n\n"
            f"- single stream: TTFT {results[0]['ttft_mean']:.0f} ms mean, ITL {results[0]['itl_mean']:.1f} ms mean "
            f"({1000 / results[0]['itl_mean']:.1f} tokens/s per stream)\n"
            f"- most output tokens/s: {best['tokens_per_s']:.1f} at {best['concurrency']} streams "
            f"({best['tokens_per_s'] / results[0]['tokens_per_s']:.1f}x one stream)\n"
            f"- failed requests: {sum(r['failed'] for r in results)}; server crashed: {crashed}\n")
    rep.write(plot(results, pa_stats))


if __name__ == "__main__":
    main()

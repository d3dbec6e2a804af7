#!/usr/bin/env python
"""The llm model's receive path: enqueue-only `execute` vs request preparation in the engine loop.

Committed design, served as `llm_step_timed` (perf/baseline_repository: the committed llm plus a
step-time histogram): Triton's execute thread parses and validates a request and queues it into
the engine; the generation loop thread only steps (takes the engine's outputs, sends chunks,
checks cancellations). Baseline, `llm_prepare_in_loop` (perf/baseline_repository, built on the
former): execute hands the raw request over and the loop thread parses, validates and queues it
between steps, as a scheduler loop that receives its own requests does. Both run with the
deployment's llm config (1 instance, torch on all cores) in one tritonserver; the histogram
tritonfront_llm_step_seconds holds the work of every loop turn once the engine's outputs are in
hand (sending chunks, cancellation checks, load publishing, and for the baseline the preparation
of the requests handed over).

Each round and variant: B background streams decode steadily (long max_tokens), then a burst of
N requests arrives at once (short prompts, a few stop words each, so preparation does its real
work). Measured over the burst window (first burst send .. last burst request final): loop step
time P50/P99 (from the histogram's bucket counts, 25%-wide buckets), the background streams'
inter-token latency P99 (what a client already streaming sees while the burst is received),
and the burst's TTFT. Then the background streams are cancelled (and the engine left idle)
before the next measurement. Variants alternate in order from round to round. Target: enqueue-only no
worse than in-loop (step time P99 and background ITL P99).
"""
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import report
from harness.clients.kserve import llm_inputs
from harness.corpora import synthetic_prompt_ids
from harness.deploy import write_deployment
from harness.load import streaming
from harness.ranks import wait_idle
from harness.server import benchmark_server
from harness.stats import percentile
from harness.triton_metrics import histogram, histogram_delta, histogram_quantile

COMMITTED, BASELINE = "llm_step_timed", "llm_prepare_in_loop"
VARIANTS = {COMMITTED: "execute (enqueue-only)", BASELINE: "engine_loop (baseline)"}
STEP_METRIC = "tritonfront_llm_step_seconds"


def requests(count: int, prompt_tokens: int, max_tokens: int, seed: int, stop_words: int) -> list:
    out = []
    for ids in synthetic_prompt_ids([prompt_tokens] * count, seed=seed):
        # Stop sequences of ids the model will not produce in a row: they cost parsing, not stops.
        rows = np.array([[49000 + 7 * k, 49001 + 7 * k, 49002 + 7 * k if k % 2 else -1]
                         for k in range(stop_words)], dtype=np.int32)
        out.append(streaming.Request(llm_inputs(ids, max_tokens, stream=True,
                                                stop_words_ids=rows[None] if stop_words else None)))
    return out


async def burst_round(url: str, model: str, background: list, burst: list, min_tokens: int, metrics,
                      idle) -> dict:
    pool = streaming.StreamPool(url, connections=8)
    now = time.perf_counter()
    background_done = [pool.send(model, r, now) for r in background]
    background_records = list(pool.records.values())
    while min(r.tokens for r in background_records) < min_tokens:  # all streams decoding
        if any(e.is_set() for e in background_done):
            raise RuntimeError("a background stream ended before the burst: raise --background-tokens")
        await asyncio.sleep(0.01)
    before = histogram(await asyncio.to_thread(metrics), STEP_METRIC, model=model, rank="0")
    start = time.perf_counter()
    burst_done = [pool.send(model, r, start) for r in burst]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in burst_done)), 300)
    end = time.perf_counter()
    after = histogram(await asyncio.to_thread(metrics), STEP_METRIC, model=model, rank="0")
    still_running = not any(e.is_set() for e in background_done)
    records = await pool.close(0.1)  # cancels the background streams: their tokens are no longer needed
    burst_records = records[len(background):]
    await asyncio.to_thread(idle)
    steps = histogram_delta(before, after)
    background_gaps = [(b - a) / n * 1000 for r in records[:len(background)]
                       for (a, _), (b, n) in zip(r.arrivals, r.arrivals[1:]) if start <= b <= end and n]
    burst_stats = streaming.summary(burst_records)
    # Cross-checks the histogram's count: every engine step gives each decoding stream a token.
    tokens_in_window = statistics.median(sum(start <= t <= end for t, _ in r.arrivals) for r in records[:len(background)])
    return {
        "steps": int(steps["count"]), "bg_tokens_in_window": tokens_in_window,
        "step_buckets": steps["cumulative"].tolist(), "step_bounds": steps["le"].tolist(), "step_sum": steps["sum"], "step_mean_ms": steps["sum"] / max(1, steps["count"]) * 1000,
        "step_p50_ms": histogram_quantile(steps, 0.5) * 1000,
        "step_p99_ms": histogram_quantile(steps, 0.99) * 1000,
        "step_max_bucket_ms": float(steps["le"][np.nonzero(np.diff(np.r_[0, steps["cumulative"]]))[0][-1]] * 1000)
        if steps["count"] else float("nan"),
        "bg_itl_p50_ms": percentile(background_gaps, 50),
        "bg_itl_p99_ms": percentile(background_gaps, 99),
        "bg_itl_max_ms": max(background_gaps, default=float("nan")),
        "burst_ttft_mean_ms": burst_stats["ttft_mean"], "burst_ttft_p99_ms": burst_stats["ttft_p99"],
        "burst_seconds": end - start, "burst_ok": burst_stats["ok"], "burst_failed": burst_stats["failed"],
        "background_covered_burst": still_running,
        "failed": sum(not r.ok for r in burst_records),
    }


def plot(rounds: list[dict]):
    fig, axes = report.plt.subplots(1, 3, figsize=(15, 4))
    metrics = [("step_p99_ms", "loop step P99 (ms)"), ("bg_itl_p99_ms", "background ITL P99 (ms)"),
               ("burst_ttft_mean_ms", "burst TTFT mean (ms)")]
    xs = np.arange(1, len(rounds) + 1)
    for ax, (key, label) in zip(axes, metrics):
        for offset, (model, color) in zip((-0.2, 0.2), ((COMMITTED, "tab:blue"), (BASELINE, "tab:orange"))):
            ax.bar(xs + offset, [rnd[model][key] for rnd in rounds], 0.4, color=color, label=VARIANTS[model])
        ax.set(xlabel="round", ylabel=label, title=label)
        ax.set_xticks(xs)
        ax.legend(fontsize=7)
    return fig


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_receive_path", "llm receive path: enqueue-only execute vs preparation in the engine loop",
        rounds=10, background=(8, "streams decoding before the burst"), background_tokens=(200, "their max_tokens"),
        burst=(48, "requests arriving at once"), burst_prompt=(24, "prompt tokens of a burst request"),
        burst_tokens=(4, "max_tokens of a burst request"), stop_words=(4, "stop sequences per burst request"),
        threads=(0, "torch threads (0: one per core)"))
    out = Path(tempfile.mkdtemp(prefix="bench_receive_"))
    repositories = write_deployment(
        out, "--dp", "1", "--set", f"llm.num_threads={args.threads}", keep=("llm",), llm_baselines=VARIANTS)
    rounds = []
    with benchmark_server("bench_receive_path", list(VARIANTS), repositories) as server:
        warm = requests(4, args.burst_prompt, 4, seed=999, stop_words=args.stop_words)
        for model in VARIANTS:
            asyncio.run(streaming.open_loop(server.grpc_url, model, warm, 100.0, connections=2))
        for k in range(args.rounds):
            background = requests(args.background, 64, args.background_tokens, seed=2 * k, stop_words=0)
            burst = requests(args.burst, args.burst_prompt, args.burst_tokens, seed=2 * k + 1,
                             stop_words=args.stop_words)
            order = list(VARIANTS) if k % 2 == 0 else list(reversed(VARIANTS))
            results = {}
            for model in order:
                results[model] = asyncio.run(burst_round(server.grpc_url, model, background, burst, 3, server.metrics,
                                                         lambda: wait_idle(server, model)))
                r = results[model]
                print(f"round {k + 1} {model:9s} steps {r['steps']:4d} (bg tokens {r['bg_tokens_in_window']}) step p50 {r['step_p50_ms']:6.2f} "
                      f"p99 {r['step_p99_ms']:6.2f} max<= {r['step_max_bucket_ms']:6.1f} ms  bg itl p50 "
                      f"{r['bg_itl_p50_ms']:6.1f} p99 {r['bg_itl_p99_ms']:6.1f} ms  burst ttft mean "
                      f"{r['burst_ttft_mean_ms']:6.0f} p99 {r['burst_ttft_p99_ms']:6.0f} ms  failed {r['failed']}",
                      flush=True)
                time.sleep(1)
            rounds.append(results)
        crashed = server.crashed()

    report.write_raw("bench_receive_path", rounds)
    rep.add(f"One tritonserver, `{COMMITTED}` (the committed llm with a step-time histogram) and `{BASELINE}` "
            f"(requests prepared by the loop thread), perf/baseline_repository, 1 instance each, torch threads "
            f"{args.threads or 'one per core'}. Per round and "
            f"variant: {args.background} background streams (64-token prompts, max_tokens {args.background_tokens}) "
            f"decoding, then {args.burst} requests at once ({args.burst_prompt}-token prompts, max_tokens "
            f"{args.burst_tokens}, {args.stop_words} stop sequences each) over 8 gRPC streams to the llm model. "
            "Step = one generation loop turn's work once the engine's outputs are in hand (P50/P99 interpolated in "
            "25%-wide histogram buckets; 'max <=' is the upper bound of the highest bucket hit). Background ITL: "
            "gaps between the background streams' tokens that arrived inside the burst window. "
            f"{args.rounds} rounds, order alternating.\n")
    keys = ["steps", "bg_tokens_in_window", "step_mean_ms", "step_p50_ms", "step_p99_ms", "step_max_bucket_ms", "bg_itl_p50_ms",
            "bg_itl_p99_ms", "bg_itl_max_ms", "burst_ttft_mean_ms", "burst_ttft_p99_ms", "burst_seconds"]
    headers = ["round", "variant", "loop steps", "tokens per bg stream in window", "step mean ms", "step P50 ms", "step P99 ms", "step max <= ms",
               "bg ITL P50 ms", "bg ITL P99 ms", "bg ITL max ms", "burst TTFT mean ms", "burst TTFT P99 ms",
               "burst window s", "failed"]
    rows = [[k + 1, f"`{m}` {VARIANTS[m]}", *[rnd[m][key] for key in keys], rnd[m]["failed"]]
            for k, rnd in enumerate(rounds) for m in VARIANTS]
    rep.add(report.table(headers, rows))
    medians = {m: {key: statistics.median(rnd[m][key] for rnd in rounds) for key in keys} for m in VARIANTS}
    rep.add("Medians over rounds:\n\n" + report.table(
        headers[1:-1], [[f"`{m}` {VARIANTS[m]}", *[medians[m][key] for key in keys]] for m in VARIANTS]))

    def ratio(key):  # baseline / committed: >= 1 means enqueue-only is no worse
        return statistics.median(rnd[BASELINE][key] / rnd[COMMITTED][key] for rnd in rounds)

    step, itl = ratio("step_p99_ms"), ratio("bg_itl_p99_ms")
    pooled = {m: {"le": np.array(rounds[0][m]["step_bounds"]),
                  "cumulative": np.sum([rnd[m]["step_buckets"] for rnd in rounds], axis=0),
                  "sum": sum(rnd[m]["step_sum"] for rnd in rounds), "count": sum(rnd[m]["steps"] for rnd in rounds)}
              for m in VARIANTS}
    pooled_p99 = {m: histogram_quantile(h, 0.99) * 1000 for m, h in pooled.items()}
    lines = [
        "## Summary", "",
        f"- loop step P99, engine_loop / execute (median over rounds): {step:.2f}x "
        f"(target: enqueue-only no worse, i.e. >= 1: {'met' if step >= 1 else 'MISSED'}); all rounds' steps pooled: "
        f"P99 {pooled_p99[COMMITTED]:.1f} ms execute vs {pooled_p99[BASELINE]:.1f} ms engine_loop "
        f"({pooled[COMMITTED]['count']:.0f} / {pooled[BASELINE]['count']:.0f} steps)",
        f"- background streams' ITL P99 during the burst, engine_loop / execute: {itl:.2f}x "
        f"({'met' if itl >= 1 else 'MISSED'})",
        f"- burst TTFT mean, engine_loop / execute: {ratio('burst_ttft_mean_ms'):.2f}x",
        f"- background streams still decoding through every burst window: "
        f"{all(rnd[m]['background_covered_burst'] for rnd in rounds for m in VARIANTS)}; failed requests: "
        f"{sum(rnd[m]['failed'] for rnd in rounds for m in VARIANTS)}; server crashed: {crashed}",
    ]
    rep.add("\n".join(lines))
    rep.write(plot(rounds))


if __name__ == "__main__":
    main()

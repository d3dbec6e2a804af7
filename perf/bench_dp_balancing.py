#!/usr/bin/env python
"""Data-parallel placement of `llm` requests: balanced by outstanding tokens vs Triton's own.

One tritonserver holds `llm` (balancing "tokens") and `llm_none` (balancing "none": Triton's
placement), each with 2 DP ranks (2 instances, 1 torch thread each on this 2-core machine) and
the same code. Requests go to the `llm` model itself (token ids in, stream=true), so the
measurement is the placement and the engines, not the tokenizer or detokenizer. The workload
is variable on purpose: prompt lengths uniform over a 10x range (20..200 tokens) and max_tokens
uniform over 8..64, greedy, open-loop Poisson arrivals. In each round the two models get the
very same requests at the very same scheduled times, one after the other (order alternating
from round to round), so drift in the machine's load hits both alike.

TTFT = from a request's scheduled send time to its first response with token ids. Per-rank
token load = each rank's outstanding tokens (prompt + generated of unfinished requests), read
from the ranks' load table every 50 ms while the round's requests arrive; the ratio is max/min
of the ranks' mean load (the issue's measure) and, alongside, the median of the instantaneous
max/min where both ranks hold work. Targets (from the issue): mean TTFT >= 20% lower with
balancing, max/min rank token load <= 1.1.
"""
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import report
from harness.accounting import model_cpu_seconds
from harness.clients.kserve import llm_inputs
from harness.corpora import synthetic_prompt_ids, uniform_lengths
from harness.deploy import write_deployment
from harness.load import streaming
from harness.ranks import RankLoad, load_ratio, sequence_skew
from harness.server import benchmark_server
from tritonfront.core import balancing

BALANCED, DEFAULT = "llm", "llm_none"
VARIANTS = {BALANCED: "tokens", DEFAULT: "none (Triton)"}


def workload(count: int, seed: int, prompt_range: tuple[int, int], max_tokens_range: tuple[int, int]):
    lengths = uniform_lengths(count, *prompt_range, seed=seed)
    max_tokens = uniform_lengths(count, *max_tokens_range, seed=seed + 1000)
    prompts = synthetic_prompt_ids(lengths, seed=seed)
    return [streaming.Request(llm_inputs(ids, n, stream=True), {"prompt": len(ids), "max_tokens": n})
            for ids, n in zip(prompts, max_tokens)]


def warm_up(url: str) -> None:
    requests = workload(4, 999, (20, 200), (4, 8))
    for model in VARIANTS:
        asyncio.run(streaming.open_loop(url, model, requests, 100.0, connections=2))


def run_round(server, samplers, requests, rate: float, seed: int, order: list[str]) -> dict:
    out = {}
    for model in order:
        cpu = {m: model_cpu_seconds(server.pid, m) for m in VARIANTS}
        start = time.perf_counter()
        records = asyncio.run(streaming.open_loop(server.grpc_url, model, requests, rate, seed=seed))
        end = max((r.done for r in records if r.done), default=time.perf_counter())
        wall = time.perf_counter() - start
        cores = {m: (model_cpu_seconds(server.pid, m) - cpu[m]) / wall for m in VARIANTS}
        # Rank load while requests arrive, when placement decides it; the drain after the last
        # arrival is one rank finishing its last long request, which no placement can spread.
        arrivals_end = max(r.scheduled for r in records)
        table = samplers[model]
        load = load_ratio(table.field_between(start, arrivals_end))
        load.update(sequence_skew(table.field_between(start, arrivals_end, balancing.WAITING),
                                  table.field_between(start, arrivals_end, balancing.ACTIVE)))
        s = streaming.summary(records)
        s.update(load, seconds=end - start, tokens_per_s=s["tokens"] / (end - start), ranks_cpu=cores[model],
                 idle_variant_cpu=sum(c for m, c in cores.items() if m != model))
        out[model] = {"summary": s, "records": records, "window": (start, end)}
        print(f"{model:9s} ttft mean {s['ttft_mean']:7.0f} p50 {s['ttft_p50']:7.0f} p99 {s['ttft_p99']:7.0f} ms  "
              f"itl p50 {s['itl_p50']:5.0f} ms  tok/s {s['tokens_per_s']:5.1f}  load max/min {s['mean_ratio']:.2f} "
              f"(instant {s['median_instant_ratio']:.2f}) means {[round(m) for m in s['means']]}  active "
              f"{[round(m, 1) for m in s['active_means']]} gap {s['active_gap']:.2f} waiting "
              f"{[round(m, 2) for m in s['waiting_means']]}  cpu {s['ranks_cpu']:.2f} idle other "
              f"{s['idle_variant_cpu']:.2f}  "
              f"failed {s['failed']}", flush=True)
        time.sleep(2)  # both ranks drain and settle before the other variant starts
    return out


def pooled(rounds: list[dict], model: str) -> dict:
    records = [r for rnd in rounds for r in rnd[model]["records"]]
    s = streaming.summary(records)
    seconds = sum(rnd[model]["summary"]["seconds"] for rnd in rounds)
    s["tokens_per_s"] = s["tokens"] / seconds
    s["mean_ratio"] = statistics.median(rnd[model]["summary"]["mean_ratio"] for rnd in rounds)
    s["median_instant_ratio"] = statistics.median(rnd[model]["summary"]["median_instant_ratio"] for rnd in rounds)
    return s


def plot(rounds: list[dict], samplers: dict, pooled_stats: dict):
    fig, axes = report.plt.subplots(1, 3, figsize=(16, 4.2))
    for model, style in ((BALANCED, "tab:blue"), (DEFAULT, "tab:orange")):
        ttft = np.sort([r.ttft * 1000 for rnd in rounds for r in rnd[model]["records"] if r.ok])
        axes[0].plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), color=style,
                     label=f"{model} ({VARIANTS[model]}): mean {pooled_stats[model]['ttft_mean']:.0f} ms")
    axes[0].set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT distribution, all rounds")
    axes[0].legend(fontsize=8)
    for ax, model in zip(axes[1:], (BALANCED, DEFAULT)):
        start, end = rounds[0][model]["window"]
        samples = [(t - start, rows[:, balancing.OUTSTANDING]) for t, rows in samplers[model].samples
                   if start <= t <= end]
        if samples:
            times = [t for t, _ in samples]
            for rank in range(samples[0][1].size):
                ax.plot(times, [tokens[rank] for _, tokens in samples], lw=0.8, label=f"rank {rank}")
        ax.set(xlabel="seconds into round 1", ylabel="outstanding tokens",
               title=f"{model}: balancing {VARIANTS[model]}, round 1")
        ax.legend(fontsize=8)
    return fig


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_dp_balancing", "DP placement of llm requests: token-balanced vs Triton's default",
        rate=(1.4, "Poisson arrivals per second (both ranks together)"), requests=(32, "per round and variant"),
        rounds=6, prompt_tokens=("20,200", "uniform range of prompt lengths"),
        max_tokens=("8,64", "uniform range of max_tokens"), threads=(1, "torch threads per rank"))
    prompt_range = tuple(int(x) for x in args.prompt_tokens.split(","))
    max_tokens_range = tuple(int(x) for x in args.max_tokens.split(","))
    out = Path(tempfile.mkdtemp(prefix="bench_dp_"))
    repositories = write_deployment(
        out, "--dp", "2", "--set", f"llm.num_threads={args.threads}", "--set", "llm.kv_cache_tokens=8192",
        llm_copies={DEFAULT: {"balancing": "none"}})
    rounds = []
    with benchmark_server("bench_dp_balancing", list(VARIANTS), repositories) as server:
        warm_up(server.grpc_url)
        samplers = {model: RankLoad(server, model, ranks=2) for model in VARIANTS}
        for sampler in samplers.values():
            sampler.start()
        for k in range(args.rounds):
            requests = workload(args.requests, seed=k, prompt_range=prompt_range, max_tokens_range=max_tokens_range)
            order = [BALANCED, DEFAULT] if k % 2 == 0 else [DEFAULT, BALANCED]
            print(f"round {k + 1}/{args.rounds}: {' then '.join(order)}", flush=True)
            rounds.append(run_round(server, samplers, requests, args.rate, seed=100 + k, order=order))
        for sampler in samplers.values():
            sampler.stop()
        server_log_errors = server.error_lines()

    report.write_raw("bench_dp_balancing", [{m: rnd[m]["summary"] for m in VARIANTS} for rnd in rounds])
    stats = {model: pooled(rounds, model) for model in VARIANTS}

    rep.add(f"`llm` (balancing \"tokens\") vs `llm_none` (balancing \"none\": Triton's placement), each 2 DP ranks "
            f"with {args.threads} torch thread per rank, one tritonserver, requests straight to the llm model over "
            f"8 gRPC streams (stream=true, greedy). Per round and variant: {args.requests} requests, prompt "
            f"{prompt_range[0]}..{prompt_range[1]} tokens and max_tokens {max_tokens_range[0]}..{max_tokens_range[1]} "
            f"(uniform), Poisson arrivals at {args.rate:g} requests/s; both variants get the same requests at the same "
            f"scheduled times; {args.rounds} rounds, order alternating. TTFT from the scheduled send time to the first "
            "response with token ids. Rank load from the ranks' load table every 50 ms while requests arrive (first "
            "to last scheduled send): max/min of the two ranks' mean outstanding tokens (\"means\"), and the median "
            "over samples of max/min where both ranks hold work (\"instant\"). Active sequences = unfinished "
            "requests of a rank; waiting = those with no token yet (queued prefills).\n")
    rows = []
    for k, rnd in enumerate(rounds):
        for model in VARIANTS:
            s = rnd[model]["summary"]
            rows.append([k + 1, f"{model} ({VARIANTS[model]})", f"{s['ok']}/{s['requests']}", s["ttft_mean"],
                         s["ttft_p50"], s["ttft_p99"], s["itl_p50"], s["itl_p99"], s["tokens_per_s"],
                         f"{s['mean_ratio']:.2f}", f"{s['median_instant_ratio']:.2f}",
                         " / ".join(f"{m:.0f}" for m in s["means"]),
                         " / ".join(f"{m:.1f}" for m in s["active_means"]),
                         " / ".join(f"{m:.2f}" for m in s["waiting_means"]),
                         f"{s['ranks_cpu']:.2f} / {s['idle_variant_cpu']:.2f}"])
    rep.add(report.table(["round", "model (balancing)", "ok", "TTFT mean ms", "TTFT P50 ms", "TTFT P99 ms",
                          "ITL P50 ms", "ITL P99 ms", "output tok/s", "rank load max/min (means)",
                          "rank load max/min (instant, median)", "mean outstanding tokens per rank",
                          "mean active sequences per rank", "mean waiting requests per rank",
                          "CPU cores: its ranks / the idle variant's ranks"], rows))
    rows = [[f"{m} ({VARIANTS[m]})", f"{s['ok']}/{s['requests']}", s["ttft_mean"], s["ttft_p50"], s["ttft_p99"],
             s["itl_mean"], s["itl_p99"], s["tokens_per_s"], f"{s['mean_ratio']:.2f}",
             f"{s['median_instant_ratio']:.2f}"] for m, s in stats.items()]
    rep.add("All rounds pooled (load ratios: median over rounds):\n\n" + report.table(
        ["model (balancing)", "ok", "TTFT mean ms", "TTFT P50 ms", "TTFT P99 ms", "ITL mean ms", "ITL P99 ms",
         "output tok/s", "rank load max/min (means)", "rank load max/min (instant, median)"], rows))
    per_round = [1 - rnd[BALANCED]["summary"]["ttft_mean"] / rnd[DEFAULT]["summary"]["ttft_mean"] for rnd in rounds]
    reduction = 1 - stats[BALANCED]["ttft_mean"] / stats[DEFAULT]["ttft_mean"]
    p99_reduction = 1 - stats[BALANCED]["ttft_p99"] / stats[DEFAULT]["ttft_p99"]
    ratio = stats[BALANCED]["mean_ratio"]
    median = statistics.median(per_round)
    lines = [
        "## Summary", "",
        f"- mean TTFT reduction with token balancing (1 - balanced / Triton's), per round: "
        f"{', '.join(f'{x:+.0%}' for x in per_round)}; median over rounds "
        f"{report.verdict(median * 100, 20, '%')}; all requests pooled {reduction:+.0%} (a pooled mean is "
        "dominated by the rounds where a queue built up)",
        f"- P99 TTFT reduction (pooled): {p99_reduction:+.0%}",
        f"- rank token load max/min (median over rounds of the max/min of per-rank means): balanced {ratio:.2f} "
        f"(target <= 1.1: {'met' if ratio <= 1.1 else 'MISSED'}), Triton's placement "
        f"{stats[DEFAULT]['mean_ratio']:.2f}",
        f"- output tokens/s: balanced {stats[BALANCED]['tokens_per_s']:.1f}, Triton's placement "
        f"{stats[DEFAULT]['tokens_per_s']:.1f}",
        f"- failed requests: balanced {stats[BALANCED]['failed']}, Triton's placement {stats[DEFAULT]['failed']}; "
        f"server log error lines: {len(server_log_errors)}",
    ]
    rep.add("\n".join(lines))
    rep.write(plot(rounds, samplers, stats))


if __name__ == "__main__":
    main()

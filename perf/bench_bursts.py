#!/usr/bin/env python
"""Bursts on an idle server: how long the last request of a burst waits, and where.

A closed loop of streams that all ask for the same number of tokens turns into bursts: every
stream ends in the same step and every client sends its next request at once. Triton's dynamic
batcher can then keep queued requests ~500 ms behind an instance that is already free (core
since #333, March 2024; seen in the 2.51 server here; unchanged at core main 73aad7c): an
execution ends with the payload's callback, which wakes the batcher, before the backend thread
is back in RateLimiter::DequeuePayload counting as a waiting consumer; a batcher that checks
first finds none and goes back to its 500 ms wait (counted from when it started waiting for an
instance), which only a new request cuts short. Only queues that cannot prefetch make that
check, and a queue policy with a timeout, a timeout override or a size turns prefetching off:
every tritonfront model has one (the overload contract's deadlines and queue sizes). The
committed llm_tokenizer and llm wait 2 ms for the rest of a burst, so that a burst arriving
within that forms one batch instead of queueing behind its first request, and the llm_tokenizer
runs 2 instances, so that a request queued behind a running batch goes to the free one.

Each variant is a server of the `generate` pipeline, driven through 8 gRPC streams opened once;
each round sends `--bursts` bursts of `--burst` simultaneous streamed requests (new prompts,
`--max-tokens` tokens) to each variant in turn, the server idle in between, then `--singles`
lone requests, for what a variant costs a request that arrives alone. Triton's trace
(TIMESTAMPS, every request) gives each model's queue wait per request; a stall is a wait of
400 ms or more, which here only the batcher's sleep explains (these models' executes take
milliseconds, and a burst's prefill is one llm step).

    python perf/bench_bursts.py --rounds 3 --bursts 6 --burst 16
"""
import asyncio
import json
import statistics
import time
from collections import defaultdict
from contextlib import ExitStack

import matplotlib.pyplot as plt

from harness import report
from harness.clients.kserve import generate_inputs
from harness.deploy import GENERATE_MODELS, write_deployment
from harness.load import streaming
from harness.paths import RAW
from harness.server import benchmark_server
from harness.stats import percentile

STALL_S = 0.4
NO_DELAY = ("--queue-delay", "llm_tokenizer=0", "--queue-delay", "llm=0")
COMMITTED = "committed (queue delay 2 ms: llm_tokenizer, llm; 2 llm_tokenizer instances)"
NO_DELAY_NAME = "no queue delay"
VARIANTS = {
    COMMITTED: (),
    "queue delay at the llm only": ("--queue-delay", "llm_tokenizer=0"),
    NO_DELAY_NAME: NO_DELAY,
    "no queue delay, 1 llm_tokenizer instance": (*NO_DELAY, "--tokenizers", "1"),
}
TOPICS = ("bread", "rivers", "clocks", "bridges", "salt", "maps", "glass", "bees")


def prompts(start: int, count: int) -> list[str]:
    return [f"Write a short note about {TOPICS[i % len(TOPICS)]}, number {i}." for i in range(start, start + count)]


async def send_all(pool: streaming.StreamPool, texts: list[str], max_tokens: int) -> list[streaming.Record]:
    """The texts' requests, sent at once through the pool's open streams; their records once all are done."""
    known = len(pool.records)
    # perf_counter here and Triton's steady_clock in the trace both read CLOCK_MONOTONIC (Linux),
    # so burst windows and queue timestamps compare.
    now = time.perf_counter()
    done = [pool.send("generate", streaming.Request(generate_inputs(t, max_tokens, stream=True, temperature=0.0)), now)
            for t in texts]
    await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done)), 120)
    return list(pool.records.values())[known:]


def first_response_s(record: streaming.Record) -> float:
    """Seconds to the first response with text, or to the final one when none had any (a
    2-token answer can be whitespace)."""
    return (record.first if record.first is not None else record.done) - record.scheduled


def queue_waits(trace_file) -> list[tuple[str, float, float]]:
    """(model, queue start, seconds in the queue) of every traced request of every model."""
    merged: dict = {}
    for entry in json.loads(trace_file.read_text()):
        record = merged.setdefault(entry["id"], {"stamps": {}})
        if "model_name" in entry:
            record["model"] = entry["model_name"]
        for stamp in entry.get("timestamps", []):
            record["stamps"].setdefault(stamp["name"], stamp["ns"] / 1e9)
    return [(r["model"], r["stamps"]["QUEUE_START"], r["stamps"]["COMPUTE_START"] - r["stamps"]["QUEUE_START"])
            for r in merged.values() if "QUEUE_START" in r["stamps"] and "COMPUTE_START" in r["stamps"]]


async def measure(args, servers: dict, windows: dict, singles: dict) -> None:
    pools = {name: streaming.StreamPool(server.grpc_url, streaming.read_generate(), connections=8)
             for name, server in servers.items()}
    for pool in pools.values():  # first passes are slow in any engine; the streams open here too
        await send_all(pool, prompts(10**6, args.burst), 8)
    sent = 0
    for k in range(args.rounds):
        order = list(VARIANTS) if k % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            for _ in range(args.bursts):
                start = time.perf_counter()
                records = await send_all(pools[name], prompts(sent, args.burst), args.max_tokens)
                sent += args.burst
                failed = [r.error for r in records if not r.ok]
                if failed:
                    raise RuntimeError(f"{name}: a burst request failed: {failed[0]}")
                windows[name].append((start, time.perf_counter(), max(first_response_s(r) for r in records)))
                await asyncio.sleep(0.3)
            for _ in range(args.singles):
                (record,) = await send_all(pools[name], prompts(sent, 1), args.max_tokens)
                sent += 1
                singles[name].append(first_response_s(record))
                await asyncio.sleep(0.1)
            print(f"round {k + 1} {name}: slowest first token per burst "
                  f"{[round(w[2] * 1000) for w in windows[name][-args.bursts:]]} ms", flush=True)
    for pool in pools.values():
        await pool.close(1.0)


def main() -> None:
    args, rep = report.start(__doc__, "bench_bursts", "Bursts on an idle server: where the last request waits",
                             rounds=3, bursts=(6, "bursts per variant per round"),
                             burst=(16, "simultaneous requests per burst"), max_tokens=2,
                             singles=(8, "lone requests per variant per round"),
                             engine=("llama_cpp", "the llm engine", {"choices": ["hf", "llama_cpp"]}))
    traces = {name: RAW / f"bench_bursts_{number}.trace.json" for number, name in enumerate(VARIANTS)}
    windows = defaultdict(list)  # variant -> (start, end, slowest TTFT s) of each burst
    singles = defaultdict(list)
    with ExitStack() as stack:
        servers = {}
        for number, (name, configure_args) in enumerate(VARIANTS.items()):
            traces[name].unlink(missing_ok=True)
            repositories = write_deployment(RAW / f"bench_bursts_{number}", "--engine", args.engine, *configure_args,
                                            keep=GENERATE_MODELS)
            servers[name] = stack.enter_context(benchmark_server(
                f"bench_bursts_{number}", ["generate"], repositories=repositories,
                extra_args=(f"--trace-config=triton,file={traces[name]}", "--trace-config=level=TIMESTAMPS",
                            "--trace-config=rate=1", "--trace-config=count=-1",
                            "--trace-config=triton,log-frequency=0")))
        asyncio.run(measure(args, servers, windows, singles))
    rows, stall_rows, stalled = [], [], {}
    for name in VARIANTS:
        per_model, stalled_bursts = defaultdict(list), set()
        for model, queued, wait in queue_waits(traces[name]):
            burst = next((k for k, (start, end, _) in enumerate(windows[name]) if start <= queued <= end), None)
            if burst is not None:
                per_model[model].append(wait)
                if wait >= STALL_S:
                    stalled_bursts.add(burst)
        stalled[name] = len(stalled_bursts)
        slowest = [w[2] * 1000 for w in windows[name]]
        rows.append([name, len(slowest), statistics.median(slowest), percentile(slowest, 90), max(slowest),
                     f"{stalled[name]} / {len(slowest)}", statistics.median(singles[name]) * 1000])
        for model, model_waits in sorted(per_model.items()):
            stall_rows.append([name, model, len(model_waits), sum(w >= STALL_S for w in model_waits),
                               max(model_waits) * 1000])
    rep.add(f"{args.rounds} rounds, variants alternating; per round and variant {args.bursts} bursts of {args.burst} "
            f"streamed requests ({args.max_tokens} tokens, engine {args.engine}, new prompts), 0.3 s idle between "
            f"bursts, then {args.singles} lone requests.")
    rep.add("### The slowest first token of each burst\n\n" + report.table(
        ["variant", "bursts", "slowest TTFT P50 ms", "P90 ms", "max ms", "bursts with a queue stall (>= 400 ms)",
         "lone request TTFT P50 ms"], rows))
    rep.add("### Queue waits per model (Triton trace, the requests of the measured bursts)\n\n" + report.table(
        ["variant", "model", "requests", "waits >= 400 ms", "longest wait ms"], stall_rows))
    committed, no_delay = COMMITTED, NO_DELAY_NAME
    rep.add(f"## Summary\n\n- {committed}: {stalled[committed]} of {len(windows[committed])} bursts with a queue "
            f"stall (target 0: {'met' if stalled[committed] == 0 else 'MISSED'}); a lone request's TTFT P50 "
            f"{statistics.median(singles[committed]) * 1000:.1f} ms against "
            f"{statistics.median(singles[no_delay]) * 1000:.1f} ms without the delay")
    figure, axis = plt.subplots(figsize=(7, 3.5))
    for position, name in enumerate(VARIANTS):
        values = [w[2] * 1000 for w in windows[name]]
        axis.scatter([position] * len(values), values, alpha=0.6)
    axis.set_xticks(range(len(VARIANTS)), [n.replace(" (", "\n(").replace(", ", ",\n") for n in VARIANTS], fontsize=7)
    axis.set_ylabel("slowest TTFT in a burst (ms)")
    axis.set_title(f"Bursts of {args.burst} on an idle server ({args.engine})", fontsize=9)
    axis.grid(alpha=0.3)
    report.write_raw("bench_bursts", {"windows": windows, "singles": singles})
    rep.write(figure)


if __name__ == "__main__":
    main()

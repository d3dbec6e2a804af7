#!/usr/bin/env python
"""Bursts on an idle server: how long the last request of a burst waits, and where.

A closed loop of streams that all ask for the same number of tokens turns into bursts: every
stream ends in the same step and every client sends its next request at once. Triton's dynamic
batcher (core, every release up to at least r25.x) can then hold queued requests up to 500 ms
behind an instance that is already free: when an execution ends, the backend thread signals
the batcher before it waits for its next payload, the batcher checks for a waiting instance,
finds none yet, and sleeps its default 500 ms unless another request arrives. Requests that
queued while the instance was busy then sit in the queue with the instance idle. Only models
whose queue policy disables prefetching check for a waiting instance; ours all have one (the
deadlines and queue sizes of the overload contract). The committed llm_tokenizer and llm wait
up to 2 ms for the rest of a burst, so that it forms one batch instead of queueing behind one.

Each variant is a server of the `generate` pipeline; each round sends `--bursts` bursts of
`--burst` simultaneous streamed requests (new prompts, `--max-tokens` tokens) to each variant
in turn, the server idle in between, and `--singles` lone requests to show what a variant costs
a request that arrives alone. Triton's trace (TIMESTAMPS, every request) gives each model's
queue wait per request: a stall is a wait of 400 ms or more.

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
VARIANTS = {
    "committed (queue delay 2 ms: llm_tokenizer, llm)": (),
    "no queue delay": NO_DELAY,
    "no queue delay, 2 llm_tokenizer instances": (*NO_DELAY, "--tokenizers", "2"),
}
TOPICS = ("bread", "rivers", "clocks", "bridges", "salt", "maps", "glass", "bees")


def prompts(start: int, count: int) -> list[str]:
    return [f"Write a short note about {TOPICS[i % len(TOPICS)]}, number {i}." for i in range(start, start + count)]


async def send_all(server, texts: list[str], max_tokens: int) -> list[streaming.Record]:
    pool = streaming.StreamPool(server.grpc_url, streaming.read_generate(), connections=min(len(texts), 8))
    now = time.perf_counter()
    done = [pool.send("generate", streaming.Request(generate_inputs(t, max_tokens, stream=True, temperature=0.0)), now)
            for t in texts]
    await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done)), 120)
    return await pool.close(1.0)


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
        for server in servers.values():  # first passes are slow in any engine
            asyncio.run(send_all(server, prompts(10**6, args.burst), 8))
        sent = 0
        for k in range(args.rounds):
            order = list(VARIANTS) if k % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                for _ in range(args.bursts):
                    start = time.perf_counter()
                    records = asyncio.run(send_all(servers[name], prompts(sent, args.burst), args.max_tokens))
                    sent += args.burst
                    failed = [r.error for r in records if not r.ok]
                    if failed:
                        raise RuntimeError(f"{name}: a burst request failed: {failed[0]}")
                    windows[name].append((start, time.perf_counter(), max(first_response_s(r) for r in records)))
                    time.sleep(0.3)
                for _ in range(args.singles):
                    (record,) = asyncio.run(send_all(servers[name], prompts(sent, 1), args.max_tokens))
                    sent += 1
                    singles[name].append(first_response_s(record))
                    time.sleep(0.1)
                print(f"round {k + 1} {name}: slowest first token per burst "
                      f"{[round(w[2] * 1000) for w in windows[name][-args.bursts:]]} ms", flush=True)
    rows, stall_rows = [], []
    for name in VARIANTS:
        waits = queue_waits(traces[name])
        slowest = [w[2] * 1000 for w in windows[name]]
        stalled_bursts = sum(1 for start, end, _ in windows[name]
                             if any(start <= queued <= end and wait >= STALL_S for _, queued, wait in waits))
        rows.append([name, len(slowest), statistics.median(slowest), percentile(slowest, 90), max(slowest),
                     f"{stalled_bursts} / {len(slowest)}", statistics.median(singles[name]) * 1000])
        per_model = defaultdict(list)
        for model, _, wait in waits:
            per_model[model].append(wait)
        for model, model_waits in sorted(per_model.items()):
            stall_rows.append([name, model, len(model_waits), sum(w >= STALL_S for w in model_waits),
                               max(model_waits) * 1000])
    rep.add(f"{args.rounds} rounds, variants alternating; per round and variant {args.bursts} bursts of {args.burst} "
            f"streamed requests ({args.max_tokens} tokens, engine {args.engine}, new prompts), 0.3 s idle between "
            f"bursts, then {args.singles} lone requests.")
    rep.add("### The slowest first token of each burst\n\n" + report.table(
        ["variant", "bursts", "slowest TTFT P50 ms", "P90 ms", "max ms", "bursts with a queue stall (>= 400 ms)",
         "lone request TTFT P50 ms"], rows))
    rep.add("### Queue waits per model (Triton trace, every request of the run)\n\n" + report.table(
        ["variant", "model", "requests", "waits >= 400 ms", "longest wait ms"], stall_rows))
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

#!/usr/bin/env python
"""Overload: the committed queue policies under a flood at 3x the measured capacity.

For `embed` and then `generate`, on one server with the committed configs:
1. probe: requests one at a time (median latency = the idle server's);
2. capacity: closed loop (embed: 32 clients; generate: as many as the llm admits,
   max_active_requests) for a while: served requests/s;
3. flood: open-loop Poisson arrivals at 3x that capacity for a bounded time;
4. probe again at once (is it fast again?) and check readiness.
Served results are checked: embeddings against the same texts embedded after the flood, greedy
texts against the probe's. Every request ends served, rejected at the door (the queue was full:
UNAVAILABLE "Exceeds maximum queue size"), timed out in a queue, or failed.

    python perf/bench_overload.py            # about 5 minutes on 2 cores
"""
import asyncio
import statistics
import time

import numpy as np
import tritonclient.grpc.aio as grpcclient

from harness import report
from harness.clients.kserve import generate_inputs, text_inputs
from harness.corpora import PROMPTS as ALL_PROMPTS, synthetic_texts
from harness.deploy import ALL_MODELS
from harness.load import unary
from harness.load.outcomes import FAILED, REJECTED, SERVED, TIMED_OUT, Outcome, count, latency_ms
from harness.server import benchmark_server

PROMPTS = [ALL_PROMPTS[i] for i in (0, 1, 2, 3, 4, 6, 7, 10)]


async def probe(send: unary.Send, requests: int) -> list[Outcome]:
    return [await send(i, time.perf_counter()) for i in range(requests)]


async def run_pipeline(name: str, url: str, send: unary.Send, concurrency: int, capacity_s: float,
                       flood_s: float, factor: float, probes: int) -> dict:
    before = await probe(send, probes)
    rate = await unary.capacity(send, concurrency, capacity_s)
    print(f"{name}: capacity {rate:.2f} requests/s with {concurrency} clients", flush=True)
    await asyncio.sleep(2)
    outcomes = await unary.flood(send, factor * rate, flood_s, seed=1)
    after = await probe(send, probes)
    async with grpcclient.InferenceServerClient(url) as client:
        ready = await client.is_server_ready()
    return {"name": name, "capacity": rate, "rate": factor * rate, "outcomes": outcomes, "before": before,
            "after": after, "ready": ready}


def row(result: dict) -> list:
    outcomes = result["outcomes"]
    kinds = count(outcomes)
    before = statistics.median(o.latency_s * 1000 for o in result["before"])
    after = statistics.median(o.latency_s * 1000 for o in result["after"])
    rejected = [o.latency_s * 1000 for o in outcomes if o.kind == REJECTED]
    # Everything that was neither served nor turned away at the door (timed out in a queue apart).
    failed = sum(n for kind, n in kinds.items() if kind not in (SERVED, REJECTED, TIMED_OUT))
    result.update(count=kinds, failed=failed, before_ms=before, after_ms=after,
                  rejection_p99=latency_ms(outcomes, REJECTED, 99))
    return [result["name"], f"{result['capacity']:.2f}", f"{result['rate']:.2f}", len(outcomes),
            kinds[SERVED], kinds[REJECTED], kinds[TIMED_OUT], failed,
            latency_ms(outcomes, SERVED, 50), latency_ms(outcomes, SERVED, 99),
            latency_ms(outcomes, REJECTED, 50), result["rejection_p99"],
            max(rejected, default=float("nan")), before, after, f"{after / before:.2f}",
            "yes" if result["ready"] else "NO", "yes" if all(o.kind == SERVED for o in result["after"]) else "NO"]


def plot(results: list[dict]):
    fig, axes = report.plt.subplots(1, len(results), figsize=(7 * len(results), 4.2), squeeze=False)
    colors = {SERVED: "tab:blue", REJECTED: "tab:orange", TIMED_OUT: "tab:red"}
    for ax, result in zip(axes[0], results):
        start = min(o.scheduled for o in result["outcomes"])
        for kind, color in [*colors.items(), (FAILED, "black")]:
            points = [(o.scheduled - start, o.latency_s * 1000) for o in result["outcomes"]
                      if o.kind == kind or (kind == FAILED and o.kind not in colors)]
            if points:
                xs, ys = zip(*points)
                ax.scatter(xs, ys, s=6, color=color, label=f"{kind} ({len(points)})")
        ax.set(yscale="log", xlabel="send time in the flood (s)", ylabel="latency (ms)",
               title=f"{result['name']}: {result['rate']:.1f} requests/s = 3x capacity")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


async def main_async(args, server) -> tuple[list[dict], dict]:
    texts = synthetic_texts(512, 90, seed=3)
    prompts = PROMPTS
    checks = {}
    async with grpcclient.InferenceServerClient(server.grpc_url) as client:
        prebuilt = [text_inputs([t]) for t in texts]

        async def embed(number, scheduled):
            return await unary.embed_once(client, prebuilt[number % len(prebuilt)], scheduled)

        async def generate(number, scheduled):
            inputs = generate_inputs(prompts[number % len(prompts)], args.max_tokens, stream=False)
            return await unary.generate_once(client, inputs, scheduled)

        await probe(embed, 16)  # warm-up
        await probe(generate, 2)
        results = [
            await run_pipeline("embed", server.grpc_url, embed, 32, args.capacity_s, args.embed_flood_s,
                               args.factor, 20),
            await run_pipeline("generate", server.grpc_url, generate, args.llm_admits, args.capacity_s * 3,
                               args.generate_flood_s, args.factor, len(prompts)),
        ]
        references = {}
        for start in range(0, len(texts), 32):
            outcome = await unary.embed_once(client, text_inputs(texts[start:start + 32]), time.perf_counter())
            references.update(zip(range(start, start + 32), outcome.result))
    embed_result, generate_result = results
    cosines = [float(np.dot(o.result[0], references[i % len(texts)]))
               for i, o in enumerate(embed_result["outcomes"]) if o.kind == SERVED]
    checks["embed: min cosine of served embeddings vs the same texts after the flood"] = f"{min(cosines):.6f}"
    expected = {i: o.result for i, o in enumerate(generate_result["before"])}
    mismatches = sum(o.result != expected[i % len(prompts)]
                     for i, o in enumerate(generate_result["outcomes"]) if o.kind == SERVED)
    checks["generate: served greedy texts differing from the probe's text of the same prompt"] = str(mismatches)
    return results, checks


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_overload", "Overload: queue policies under a flood at 3x measured capacity",
        factor=(3.0, "flood rate / measured capacity"),
        capacity_s=(20.0, "closed-loop seconds for embed (x3 generate)"), embed_flood_s=20.0, generate_flood_s=60.0,
        max_tokens=32, llm_admits=(16, "the llm's max_active_requests (committed: 16)"))
    with benchmark_server("bench_overload", ALL_MODELS) as server:
        results, checks = asyncio.run(main_async(args, server))
    rep.add(
        f"Committed configs (queue policies: model_repository/*/config.pbtxt). Per pipeline: capacity = served "
        f"requests/s of a closed loop (embed: 32 clients, one ~90-token text per request; generate: "
        f"{args.llm_admits} clients = the llm's max_active_requests, max_tokens {args.max_tokens}, greedy, not "
        f"streamed, 8 prompts); then a flood of Poisson arrivals at {args.factor:g}x that rate for "
        f"{args.embed_flood_s:g} s (embed) / {args.generate_flood_s:g} s (generate), each request on its own; "
        "latency from the scheduled send time. Probes: requests one at a time, median latency, before the capacity "
        "run and right after the flood.\n")
    rows = [row(result) for result in results]
    rep.add(report.table(["pipeline", "capacity req/s", "flood req/s", "sent", "served", "rejected (queue full)",
                          "timed out in queue", "other failures", "served P50 ms", "served P99 ms",
                          "rejection P50 ms", "rejection P99 ms", "rejection max ms", "probe before ms",
                          "probe right after ms", "after / before", "ready after", "probe after all served"],
                         rows))
    rep.add("\n".join(f"- {k}: {v}" for k, v in checks.items()))
    lines = []
    for result in results:
        kinds = result["count"]
        accepted = kinds[SERVED] + kinds[TIMED_OUT] + result["failed"]
        lines.append(f"- {result['name']}: {kinds[SERVED]}/{accepted} accepted requests served "
                     f"(target: all); rejection P99 {result['rejection_p99']:.1f} ms "
                     f"(target < 50 ms: {'met' if result['rejection_p99'] < 50 else 'MISSED'}); "
                     f"probe right after the flood {result['after_ms'] / result['before_ms']:.2f}x the idle probe")
    rep.add("## Summary\n\n" + "\n".join(lines))
    rep.write(plot(results))


if __name__ == "__main__":
    main()

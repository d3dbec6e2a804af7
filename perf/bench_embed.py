#!/usr/bin/env python
"""The `embed` ensemble against its ceiling: concurrent single-text gRPC requests through
tokenizer -> encoder -> pooler vs sentence-transformers encode(batch_size=32) in-process on the
same texts (~90 tokens). Target: >= 90% of the in-process texts/s.

Never both at once (they would share the 2 cores), but alternating in rounds with the server up
and idle during the in-process runs: C0 T0 C1 T1 ... Cn, each Triton measurement compared with
the mean of the ceiling measured just before and just after it, so drift in what else runs on
the machine hits both sides. Also: the server's resident memory (tritonserver plus every Python
stub) idle and under load, and each composing model's batching.
"""
import asyncio
import time

import numpy as np
import tritonclient.grpc.aio as grpcaio

from harness import observe, report
from harness.accounting import Sampler, tree_rss
from harness.ceiling import CeilingRounds, run_order_plot
from harness.clients.kserve import single_texts
from harness.corpora import synthetic_texts
from harness.load.unary import LoadResult, run_concurrency, warm_up
from harness.references import sentence_transformer
from harness.server import benchmark_server
from harness.stats import mean, median_rate

MODEL = "embed"
COMPOSING = ["tokenizer", "encoder", "pooler"]


def max_difference(url: str, factory, reference: np.ndarray) -> float:
    """Max |difference| from sentence-transformers on 16 texts: a wrong pipeline would be fast
    for nothing. Also warms every model up."""
    answers = asyncio.run(warm_up(url, factory, [MODEL], requests=16))
    asyncio.run(warm_up(url, factory, [MODEL], requests=128))
    return float(np.abs(np.stack([a.as_numpy("embedding")[0] for a in answers]) - reference[:16]).max())


async def closed_loop(server, factory, concurrency: list[int], duration: float) -> list[LoadResult]:
    async with grpcaio.InferenceServerClient(server.grpc_url) as client:
        results = []
        for c in concurrency:
            finish = observe.step(server, COMPOSING)
            results.append(await run_concurrency(client, MODEL, factory, c, duration))
            results[-1].server = finish()
            print(results[-1].row(), flush=True)
        return results


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_embed", "embed ensemble through Triton vs sentence-transformers in-process", texts=512,
        tokens=90, concurrency="32,64", rounds=3, duration=(25.0, "seconds per concurrency and round"),
        ceiling_seconds=(20.0, "per in-process measurement"))
    texts = synthetic_texts(args.texts, args.tokens, seed=1)
    st = sentence_transformer(threads=0)  # torch on all cores, as the encoder's num_threads "0"
    factory = single_texts(texts)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    reference = st.encode(texts[:16], batch_size=32, convert_to_numpy=True)
    offset = 0

    def encode_chunk(chunk: int = 128) -> int:
        """One encode(batch_size=32) pass over the next `chunk` texts, cycling through them."""
        nonlocal offset
        part = texts[offset:offset + chunk]
        offset = (offset + chunk) % len(texts)
        st.encode(part, batch_size=32, convert_to_numpy=True)
        return len(part)

    ceiling = CeilingRounds(lambda: median_rate(encode_chunk, args.ceiling_seconds))
    rounds = []
    with benchmark_server("bench_embed", [*COMPOSING, MODEL]) as server:
        time.sleep(5)  # the stubs finish settling after the server reports ready
        rss_idle_cold = tree_rss(server.pid)
        sampler = Sampler(lambda: tree_rss(server.pid))
        for i in range(args.rounds):
            ceiling.ceiling()
            if i == 0:
                max_diff = max_difference(server.grpc_url, factory, reference)
                sampler.start()
            rounds.append(asyncio.run(closed_loop(server, factory, concurrency, args.duration)))
        sampler.stop()
        ceiling.ceiling()
        rss_idle_warm = tree_rss(server.pid)

    mib = 2**20
    table = []
    for i, results in enumerate(rounds):
        table.append(ceiling.ceiling_row(i, f"round {i + 1}: in-process", 10, 8))
        for r in results:
            sv = r.server
            table.append([f"round {i + 1}: Triton `embed`", r.concurrency, r.achieved_rps, r.p50_ms, r.p99_ms,
                          " / ".join(f"{sv[m]['mean_batch']:.1f}" for m in COMPOSING),
                          " / ".join(f"{sv[m]['compute_ms_per_execution']:.0f}" for m in COMPOSING),
                          f"{r.client_cpu:.2f} / {sv['server_cpu']:.2f}", sv["other_cpu"],
                          f"{r.achieved_rps / ceiling.bracket(i):.0%}"])
        ceiling.add_round(i, max(r.achieved_rps for r in results))
    table.append(ceiling.ceiling_row(len(rounds), "in-process", 10, 8))
    all_results = [r for results in rounds for r in results]
    rss = sampler.values()

    rep.add(f"{len(texts)} distinct texts of ~{args.tokens} tokens, one text per gRPC request to the `embed` ensemble "
            f"(closed loop, {args.duration:g} s per concurrency, asyncio client on the same 2 cores). Ceiling: "
            f"`SentenceTransformer.encode(texts, batch_size=32)` in-process with torch using all cores, median of "
            f"whole passes over {args.ceiling_seconds:g} s, with the server up and idle. \"of ceiling\" = texts/s "
            "over the mean of the in-process measurements just before and just after. Server embeddings vs "
            f"sentence-transformers on 16 texts: max |diff| = {max_diff:.2e}.\n")
    rep.add(report.table(["step (in run order)", "concurrency", "texts/s", "P50 ms", "P99 ms",
                          "texts/execute tok / enc / pool", "ms/execute tok / enc / pool",
                          "CPU cores client / server", "other work CPU (cores)", "of ceiling"], table))
    rep.add(report.table(["server resident memory (tritonserver + stubs)", "MiB"], [
        ["idle, after start", round(rss_idle_cold / mib)],
        ["under load, mean", round(mean(rss) / mib) if rss else "-"],
        ["under load, max", round(max(rss) / mib) if rss else "-"],
        ["idle, after the load", round(rss_idle_warm / mib)],
    ]))
    rep.add("## Summary\n\n" + ceiling.summary(90) +
            f"- load generator CPU: {min(r.client_cpu for r in all_results):.2f}-"
            f"{max(r.client_cpu for r in all_results):.2f} of one core\n")

    fig, (ax1, ax2) = report.plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [2, 1]})
    run_order_plot(table, f"embed, ~{args.tokens}-token texts: in-process (grey) vs Triton (blue), run order",
                   "texts/s", ax1)
    if rss:
        ax2.plot(np.arange(len(rss)) * sampler.every, np.array(rss) / mib)
    ax2.axhline(rss_idle_cold / mib, color="grey", ls=":", lw=0.8, label="idle after start")
    ax2.set(xlabel="seconds since the first request", ylabel="MiB", title="server RSS (tritonserver + stubs)")
    ax2.legend(fontsize=8)
    rep.write(fig)


if __name__ == "__main__":
    main()

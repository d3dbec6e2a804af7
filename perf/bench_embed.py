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
import argparse
import asyncio
import os
import statistics
import threading
import time

import numpy as np

import loadgen
import report
import serving
from texts import synthetic_texts

MODEL = "embed"
COMPOSING = ["tokenizer", "encoder", "pooler"]


def sentence_transformer():
    import torch
    from sentence_transformers import SentenceTransformer

    from tritonfront import model_sources

    torch.set_num_threads(os.cpu_count())  # as the encoder model's num_threads "0"
    return SentenceTransformer(str(model_sources.embed_model_dir()), device="cpu")


def in_process_ceiling(model, texts: list[str], seconds: float, chunk: int = 128) -> float:
    """Median texts/s of encode(batch_size=32) passes over `chunk` texts at a time (cycling
    through all of them) for `seconds`, at least 3 passes."""
    rates, offset = [], 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        part = texts[offset:offset + chunk]
        offset = (offset + chunk) % len(texts)
        start = time.perf_counter()
        model.encode(part, batch_size=32, convert_to_numpy=True)
        rates.append(len(part) / (time.perf_counter() - start))
    return statistics.median(rates)


class RssSampler(threading.Thread):
    def __init__(self, server, every: float = 0.5):
        super().__init__(daemon=True)
        self.server, self.every, self.samples, self.stopped = server, every, [], threading.Event()

    def run(self):
        while not self.stopped.wait(self.every):
            self.samples.append(serving.server_rss(self.server))


async def check_embeddings(url: str, factory, reference: np.ndarray) -> float:
    """Max |difference| from sentence-transformers on 16 texts: a wrong pipeline would be fast
    for nothing. Also warms every model up."""
    loadgen.check_loopback(url)
    async with loadgen.grpcclient.InferenceServerClient(url) as client:
        answers = await asyncio.gather(*(client.infer(MODEL, factory(i)) for i in range(16)))
        got = np.stack([a.as_numpy("embedding")[0] for a in answers])
        await asyncio.gather(*(client.infer(MODEL, factory(i)) for i in range(128)))
        return float(np.abs(got - reference[:16]).max())


async def closed_loop(url: str, factory, concurrency: list[int], duration: float, observe) -> list[loadgen.LoadResult]:
    async with loadgen.grpcclient.InferenceServerClient(url) as client:
        results = []
        for c in concurrency:
            finish = observe()
            results.append(await loadgen.run_concurrency(client, MODEL, factory, c, duration))
            results[-1].server = finish()
            print(results[-1].row(), flush=True)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=90)
    parser.add_argument("--concurrency", default="32,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=25.0, help="seconds per concurrency and round")
    parser.add_argument("--ceiling-seconds", type=float, default=20.0, help="per in-process measurement")
    args = parser.parse_args()

    rep = report.Report("bench_embed", "embed ensemble through Triton vs sentence-transformers in-process")
    texts = synthetic_texts(args.texts, args.tokens, seed=1)
    st = sentence_transformer()
    factory = loadgen.text_inputs(texts)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    ceilings, ceiling_others, rounds = [], [], []
    reference = st.encode(texts[:16], batch_size=32, convert_to_numpy=True)

    def ceiling():
        with serving.other_work() as others:
            rate = in_process_ceiling(st, texts, args.ceiling_seconds)
        ceilings.append(rate)
        ceiling_others.append(others["cores"])
        print(f"in-process ceiling: {rate:.1f} texts/s", flush=True)

    with serving.benchmark_server("bench_embed", [*COMPOSING, MODEL]) as server:
        time.sleep(5)  # the stubs finish settling after the server reports ready
        rss_idle_cold = serving.server_rss(server)
        observe = serving.composing_observer(server, COMPOSING)
        sampler = RssSampler(server)
        for i in range(args.rounds):
            ceiling()
            if i == 0:
                max_diff = asyncio.run(check_embeddings(server.grpc_url, factory, reference))
                sampler.start()
            rounds.append(asyncio.run(closed_loop(server.grpc_url, factory, concurrency, args.duration, observe)))
        sampler.stopped.set()
        sampler.join()
        ceiling()
        rss_idle_warm = serving.server_rss(server)

    mib = 2**20
    table, ratios = [], []
    for i, results in enumerate(rounds):
        bracket = (ceilings[i] + ceilings[i + 1]) / 2
        table.append([f"round {i + 1}: in-process", "-", ceilings[i]] + ["-"] * 5 + [ceiling_others[i], "-"])
        for r in results:
            sv = r.server
            table.append([f"round {i + 1}: Triton `embed`", r.concurrency, r.achieved_rps, r.p50_ms, r.p99_ms,
                          " / ".join(f"{sv[m]['mean_batch']:.1f}" for m in COMPOSING),
                          " / ".join(f"{sv[m]['compute_ms_per_execution']:.0f}" for m in COMPOSING),
                          f"{r.client_cpu:.2f} / {sv['server_cpu']:.2f}", sv["other_cpu"],
                          f"{r.achieved_rps / bracket:.0%}"])
        ratios.append(max(r.achieved_rps for r in results) / bracket)
    table.append(["in-process", "-", ceilings[-1]] + ["-"] * 5 + [ceiling_others[-1], "-"])
    all_results = [r for results in rounds for r in results]

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
        ["under load, mean", round(statistics.mean(sampler.samples) / mib) if sampler.samples else "-"],
        ["under load, max", round(max(sampler.samples) / mib) if sampler.samples else "-"],
        ["idle, after the load", round(rss_idle_warm / mib)],
    ]))
    median = statistics.median(ratios)
    rep.add("## Summary\n\n"
            f"- in-process ceiling: {min(ceilings):.1f}-{max(ceilings):.1f} texts/s over the run "
            f"(median {statistics.median(ceilings):.1f})\n"
            f"- through Triton, best concurrency per round: {', '.join(f'{x:.0%}' for x in ratios)} of ceiling "
            f"-> median {report.verdict(median * 100, 90, '%')}\n"
            f"- load generator CPU: {min(r.client_cpu for r in all_results):.2f}-"
            f"{max(r.client_cpu for r in all_results):.2f} of one core\n")

    fig, (ax1, ax2) = report.plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [2, 1]})
    xs = range(len(table))
    ax1.bar(xs, [row[2] for row in table], color=["grey" if row[1] == "-" else "tab:blue" for row in table])
    ax1.set_xticks(list(xs), [row[0].replace(": ", "\n") + (f"\nc={row[1]}" if row[1] != "-" else "") for row in table],
                   fontsize=6)
    ax1.set(ylabel="texts/s", title=f"embed, ~{args.tokens}-token texts: in-process (grey) vs Triton (blue), run order")
    if sampler.samples:
        ax2.plot(np.arange(len(sampler.samples)) * sampler.every, np.array(sampler.samples) / mib)
    ax2.axhline(rss_idle_cold / mib, color="grey", ls=":", lw=0.8, label="idle after start")
    ax2.set(xlabel="seconds since the first request", ylabel="MiB", title="server RSS (tritonserver + stubs)")
    ax2.legend(fontsize=8)
    rep.write(fig)


if __name__ == "__main__":
    main()

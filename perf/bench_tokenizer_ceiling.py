#!/usr/bin/env python
"""The `tokenizer` model against its ceiling: single-text requests through Triton (closed loop at
high concurrency, with the harness's asyncio client and with perf_analyzer) vs the same texts
through BatchTokenizer.encode_requests in-process, in batches of the model's max_batch_size (the
work of one execute, no Triton, no IPC, no client).

Never both at once (they would share the 2 cores), but alternating in rounds with the server up
and idle during the in-process runs: C0 T0 C1 T1 ... Cn PA Cn+1, each Triton measurement
bracketed by two ceiling measurements and compared with their mean, so drift in what else runs
on the machine hits both sides. Target: >= 70% (median over rounds).
"""
import asyncio

import tritonclient.grpc.aio as grpcaio

from harness import report
from harness.accounting import OtherWork
from harness.analyzer import run_perf_analyzer, write_text_input
from harness.ceiling import CeilingRounds, run_order_plot
from harness.clients.kserve import single_texts
from harness.corpora import synthetic_texts
from harness.load.unary import LoadResult, run_concurrency, warm_up
from harness.paths import RAW
from harness.server import benchmark_server
from harness.stats import median_rate
from tritonfront.core import model_sources
from tritonfront.core.tokenization import BatchTokenizer, TextRequest

MODEL = "tokenizer"


async def closed_loop(url: str, factory, concurrency: list[int], duration: float) -> list[LoadResult]:
    await warm_up(url, factory, [MODEL])
    async with grpcaio.InferenceServerClient(url) as client:
        results = []
        for c in concurrency:
            with OtherWork() as others:
                results.append(await run_concurrency(client, MODEL, factory, c, duration))
            results[-1].server["other_cpu"] = others.cores
            print(results[-1].row(), flush=True)
        return results


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_tokenizer_ceiling", "Tokenizer through Triton vs in-process batch encoding", texts=512,
        tokens=500, batch=(64, "in-process batch (the model's max_batch_size)"), concurrency="64,128", rounds=3,
        duration=(15.0, "seconds per concurrency and round"), ceiling_seconds=(10.0, "per in-process measurement"))
    texts = synthetic_texts(args.texts, args.tokens)
    factory = single_texts(texts)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    input_file = write_text_input(texts, RAW / "tokenizer_texts.json")
    tokenizer = BatchTokenizer.from_folder(model_sources.embed_model_dir())
    requests = [TextRequest([t]) for t in texts]

    def encode_all() -> int:
        for k in range(0, len(requests), args.batch):
            tokenizer.encode_requests(requests[k:k + args.batch])
        return len(requests)

    ceiling = CeilingRounds(lambda: median_rate(encode_all, args.ceiling_seconds), digits=0)
    rounds = []
    with benchmark_server("bench_tokenizer_ceiling", [MODEL]) as server:
        for _ in range(args.rounds):
            ceiling.ceiling()
            rounds.append(asyncio.run(closed_loop(server.grpc_url, factory, concurrency, args.duration)))
        ceiling.ceiling()
        with OtherWork() as pa_others:
            pa = run_perf_analyzer(server.grpc_url, MODEL, input_file, f"--concurrency-range={max(concurrency)}",
                                   "--async", name="tokenizer_ceiling", out_dir=rep.directory,
                                   measurement_ms=int(args.duration * 1000 / 3))
        ceiling.ceiling()

    table = []
    for i, results in enumerate(rounds):
        table.append(ceiling.ceiling_row(i, f"round {i + 1}: in-process", 8, 6))
        for r in results:
            table.append([f"round {i + 1}: Triton, asyncio client", r.concurrency, r.achieved_rps, r.p50_ms, r.p99_ms,
                          r.client_cpu, r.server["other_cpu"], f"{r.achieved_rps / ceiling.bracket(i):.0%}"])
        ceiling.add_round(i, max(r.achieved_rps for r in results))
    table.append(ceiling.ceiling_row(len(rounds), "in-process", 8, 6))
    pa_rps = pa[0]["Inferences/Second"] if pa else float("nan")
    pa_ratio = pa_rps / ceiling.bracket(len(rounds))
    if pa:
        table.append(["Triton, perf_analyzer (C++)", max(concurrency), pa_rps, pa[0]["p50 latency"] / 1000,
                      pa[0]["p99 latency"] / 1000, "-", pa_others.cores, f"{pa_ratio:.0%}"])
    table.append(ceiling.ceiling_row(len(rounds) + 1, "in-process", 8, 6))
    rep.add(f"{len(texts)} distinct texts of ~{args.tokens} tokens, one text per request. In-process: "
            f"`BatchTokenizer.encode_requests` over batches of {args.batch} single-text requests (what one execute "
            f"of the model does), median of repeated passes over {args.ceiling_seconds:g} s, with the server up and "
            f"idle. Through Triton: closed loop over gRPC, {args.duration:g} s per concurrency, the client on the "
            "same 2 cores. \"of ceiling\" = texts/s over the mean of the in-process measurements just before and "
            "just after.\n")
    rep.add(report.table(["step (in run order)", "concurrency", "texts/s", "P50 ms", "P99 ms", "client CPU (cores)",
                          "other work CPU (cores)", "of ceiling"], table))
    rep.add("## Summary\n\n" + ceiling.summary(70, "through Triton with the asyncio client")
            + (f"- through Triton with perf_analyzer (C++ client, less client CPU): {pa_rps:.0f} texts/s -> "
               f"{report.verdict(pa_ratio * 100, 70, '%')}\n" if pa else "- perf_analyzer: no result (see its .txt)\n"))
    rep.write(run_order_plot(table, f"tokenizer, ~{args.tokens}-token texts: in-process (grey) vs Triton (blue), "
                             "run order", "texts/s"))


if __name__ == "__main__":
    main()

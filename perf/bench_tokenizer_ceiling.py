#!/usr/bin/env python
"""The `tokenizer` model against its ceiling: single-text requests through Triton (closed loop at
high concurrency, with this repository's asyncio client and with perf_analyzer) vs the same
texts through BatchTokenizer.encode_requests in-process, in batches of the model's
max_batch_size (the work of one execute, no Triton, no IPC, no client).

Never both at once (they would share the 2 cores), but alternating in rounds with the server up
and idle during the in-process runs: C0 T0 C1 T1 ... Cn PA Cn+1, each Triton measurement
bracketed by two ceiling measurements and compared with their mean, so drift in what else runs
on the machine hits both sides. Target: >= 70% (median over rounds).
"""
import argparse
import asyncio
import statistics
import time

import loadgen
import report
import serving
from analyzer import run_perf_analyzer
from texts import synthetic_texts, write_perf_analyzer_input
from tritonfront import model_sources
from tritonfront.tokenization import BatchTokenizer, TextRequest

MODEL = "tokenizer"


def in_process_ceiling(tokenizer: BatchTokenizer, texts: list[str], batch: int, seconds: float) -> float:
    """Texts/s of encode_requests over the texts in batches of `batch` single-text requests,
    the median of one-pass rounds over `seconds`."""
    requests = [TextRequest([t]) for t in texts]
    rates = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        start = time.perf_counter()
        for k in range(0, len(requests), batch):
            tokenizer.encode_requests(requests[k:k + batch])
        rates.append(len(requests) / (time.perf_counter() - start))
    return statistics.median(rates)


async def closed_loop(url: str, factory, concurrency: list[int], duration: float) -> list[loadgen.LoadResult]:
    loadgen.check_loopback(url)
    async with loadgen.grpcclient.InferenceServerClient(url) as client:
        await asyncio.gather(*(client.infer(MODEL, factory(i)) for i in range(64)))  # warm-up
        results = []
        for c in concurrency:
            with serving.other_work() as others:
                results.append(await loadgen.run_concurrency(client, MODEL, factory, c, duration))
            results[-1].server["other_cpu"] = others["cores"]
            print(results[-1].row(), flush=True)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--batch", type=int, default=64, help="in-process batch (the model's max_batch_size)")
    parser.add_argument("--concurrency", default="64,128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per concurrency and round")
    parser.add_argument("--ceiling-seconds", type=float, default=10.0, help="per in-process measurement")
    args = parser.parse_args()

    rep = report.Report("bench_tokenizer_ceiling", "Tokenizer through Triton vs in-process batch encoding")
    texts = synthetic_texts(args.texts, args.tokens)
    factory = loadgen.text_inputs(texts)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    input_file = write_perf_analyzer_input(texts, serving.RAW / "tokenizer_texts.json")
    ceilings, ceiling_others, rounds = [], [], []
    tokenizer = BatchTokenizer.from_folder(model_sources.embed_model_dir())

    def ceiling():
        with serving.other_work() as others:
            rate = in_process_ceiling(tokenizer, texts, args.batch, args.ceiling_seconds)
        ceilings.append(rate)
        ceiling_others.append(others["cores"])
        print(f"in-process ceiling: {rate:.0f} texts/s", flush=True)

    with serving.benchmark_server("bench_tokenizer_ceiling", [MODEL]) as server:
        for _ in range(args.rounds):
            ceiling()
            rounds.append(asyncio.run(closed_loop(server.grpc_url, factory, concurrency, args.duration)))
        ceiling()
        with serving.other_work() as pa_others:
            pa = run_perf_analyzer(server.grpc_url, MODEL, input_file, f"--concurrency-range={max(concurrency)}",
                                   "--async", name="tokenizer_ceiling", measurement_ms=int(args.duration * 1000 / 3))
        ceiling()

    table, ratios = [], []
    for i, results in enumerate(rounds):
        bracket = (ceilings[i] + ceilings[i + 1]) / 2
        table.append([f"round {i + 1}: in-process", "-", ceilings[i], "-", "-", "-", ceiling_others[i], "-"])
        for r in results:
            table.append([f"round {i + 1}: Triton, loadgen.py", r.concurrency, r.achieved_rps, r.p50_ms, r.p99_ms,
                          r.client_cpu, r.server["other_cpu"], f"{r.achieved_rps / bracket:.0%}"])
        ratios.append(max(r.achieved_rps for r in results) / bracket)
    table.append(["in-process", "-", ceilings[-2], "-", "-", "-", ceiling_others[-2], "-"])
    pa_rps = pa[0]["Inferences/Second"] if pa else float("nan")
    pa_ratio = pa_rps / ((ceilings[-2] + ceilings[-1]) / 2)
    if pa:
        table.append(["Triton, perf_analyzer (C++)", max(concurrency), pa_rps, pa[0]["p50 latency"] / 1000,
                      pa[0]["p99 latency"] / 1000, "-", pa_others["cores"], f"{pa_ratio:.0%}"])
    table.append(["in-process", "-", ceilings[-1], "-", "-", "-", ceiling_others[-1], "-"])
    rep.add(f"{len(texts)} distinct texts of ~{args.tokens} tokens, one text per request. In-process: "
            f"`BatchTokenizer.encode_requests` over batches of {args.batch} single-text requests (what one execute "
            f"of the model does), median of repeated passes over {args.ceiling_seconds:g} s, with the server up and "
            f"idle. Through Triton: closed loop over gRPC, {args.duration:g} s per concurrency, the client on the "
            "same 2 cores. \"of ceiling\" = texts/s over the mean of the in-process measurements just before and "
            "just after.\n")
    rep.add(report.table(["step (in run order)", "concurrency", "texts/s", "P50 ms", "P99 ms", "client CPU (cores)",
                          "other work CPU (cores)", "of ceiling"], table))
    median = statistics.median(ratios)
    rep.add("## Summary\n\n"
            f"- in-process ceiling: {min(ceilings):.0f}-{max(ceilings):.0f} texts/s over the run "
            f"(median {statistics.median(ceilings):.0f})\n"
            f"- through Triton with loadgen.py, best concurrency per round: "
            f"{', '.join(f'{x:.0%}' for x in ratios)} of ceiling -> median {report.verdict(median * 100, 70, '%')}\n"
            + (f"- through Triton with perf_analyzer (C++ client, less client CPU): {pa_rps:.0f} texts/s -> "
               f"{report.verdict(pa_ratio * 100, 70, '%')}\n" if pa else "- perf_analyzer: no result (see its .txt)\n"))

    fig, ax = report.plt.subplots(figsize=(9, 4))
    xs = range(len(table))
    ax.bar(xs, [row[2] for row in table], color=["grey" if row[1] == "-" else "tab:blue" for row in table])
    ax.set_xticks(list(xs), [row[0].replace(": ", "\n").replace("Triton, ", "") + (f"\nc={row[1]}" if row[1] != "-" else "")
                             for row in table], fontsize=6)
    ax.set(ylabel="texts/s", title=f"tokenizer, ~{args.tokens}-token texts: in-process (grey) vs Triton (blue), run order")
    rep.write(fig)


if __name__ == "__main__":
    main()

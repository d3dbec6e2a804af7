#!/usr/bin/env python
"""Streaming detokenizer throughput and inter-token latency, 1 instance vs N, in one server.

One tritonserver serves copies of the committed detokenizer that differ only in name and
instance count (detokenizer_1, detokenizer_2, ...; model.py is the committed one, linked).
perf_analyzer (C++, so the client takes little of the CPU the server needs) keeps C requests
in flight: C streams, each sending its next chunk as soon as the previous one is answered, so a
request's latency is that stream's inter-token latency. The chunks are real ones: one token of
multilingual text (stream_interval 1, the heaviest load per token) with its 8-id context
window. The detokenizer is stateless, so which stream a chunk belongs to does not change its
cost. Variants are measured in alternating rounds so drift on a shared machine hits them alike;
the table reports medians over rounds.

A second, in-process table shows what the one-decode-per-batch design buys: the library's
batched call over a batch of chunks vs one call per chunk.

    python perf/bench_detokenizer.py --counts 1 2 4 --concurrency 64 128 --rounds 3
"""
import shutil
import statistics
import time

from transformers import AutoTokenizer

from harness import report
from harness.analyzer import run_perf_analyzer, write_input
from harness.chunks import detokenizer_request, one_token_streams
from harness.deploy import write_variant
from harness.paths import RAW
from harness.server import benchmark_server
from harness.triton_metrics import model_statistics, statistics_delta
from tritonfront.core.detokenization import DETOKENIZER_WINDOW, StreamDetokenizer
from tritonfront.core.model_sources import llm_model_dir


def input_data(tokenizer, chunks: int) -> list[dict]:
    """perf_analyzer requests: one-token chunks with a full context window, from many streams."""
    data = []
    for stream in one_token_streams(tokenizer, chunks // 32, 40, seed=1):
        for k, chunk in enumerate(stream[DETOKENIZER_WINDOW:DETOKENIZER_WINDOW + 32]):
            chunk_tensor = detokenizer_request(chunk.output_ids, chunk.context_ids, final=chunk.is_final,
                                               prompt_tokens=16,
                                               completion_tokens=DETOKENIZER_WINDOW + k + 1)["chunk"]
            data.append({"chunk": {"content": chunk_tensor.reshape(-1).tolist(), "shape": [chunk_tensor.shape[1]]}})
    return data


def measure(server, model: str, concurrency: int, data, name: str) -> dict:
    """Tokens/s, P50 and P99 ITL (ms) of `concurrency` streams, and the mean batch meanwhile."""
    before = model_statistics(server.grpc_url, [model])
    rows = run_perf_analyzer(server.grpc_url, model, data, f"--concurrency-range={concurrency}", "--async",
                             name=name, out_dir=RAW, measurement_ms=3000, max_trials=10, shape=None)
    if not rows:
        raise RuntimeError(f"perf_analyzer measured nothing for {model}: see {RAW}/perf_analyzer_{name}.txt")
    batch = statistics_delta(before, model_statistics(server.grpc_url, [model]))[model]["mean_batch"]
    return {"tps": rows[0]["Inferences/Second"], "p50": rows[0]["p50 latency"] / 1e3,
            "p99": rows[0]["p99 latency"] / 1e3, "batch": batch}


def library_batching(tokenizer, batch: int, repeats: int) -> dict:
    """Seconds per chunk: one detokenize call over `batch` chunks vs one call per chunk."""
    detokenizer = StreamDetokenizer(tokenizer)
    chunks = [chunks[20] for chunks in one_token_streams(tokenizer, batch, 40, seed=3)]
    batched, single = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        detokenizer.detokenize(chunks)
        batched.append((time.perf_counter() - start) / len(chunks))
        start = time.perf_counter()
        for chunk in chunks:
            detokenizer.detokenize([chunk])
        single.append((time.perf_counter() - start) / len(chunks))
    return {"batch": batch, "batched_us": statistics.median(batched) * 1e6, "single_us": statistics.median(single) * 1e6}


def plot(results: dict, models: list[str], args):
    figure, (left, right) = report.plt.subplots(1, 2, figsize=(10, 4))
    for concurrency in args.concurrency:
        left.plot(args.counts, [statistics.median(results[(concurrency, m)]["tps"]) for m in models], marker="o",
                  label=f"{concurrency} streams")
        right.plot(args.counts, [statistics.median(results[(concurrency, m)]["p99"]) for m in models], marker="o",
                   label=f"{concurrency} streams")
    left.set(xlabel="detokenizer instances", ylabel="output tokens/s", title="Throughput", xticks=args.counts)
    right.set(xlabel="detokenizer instances", ylabel="P99 inter-token latency (ms)", title="P99 ITL",
              xticks=args.counts)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    return figure


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_detokenizer", "Streaming detokenizer: instance count 1 vs N",
        counts=([1, 2, 4], "instance counts to compare"), concurrency=([64, 128], "concurrent streams"), rounds=3)
    tokenizer = AutoTokenizer.from_pretrained(llm_model_dir())
    repository = RAW / "detokenizer_variants"
    shutil.rmtree(repository, ignore_errors=True)
    models = [write_variant("detokenizer", f"detokenizer_{count}", repository, [(r"count: \d+", f"count: {count}")]).name
              for count in args.counts]
    data = write_input(input_data(tokenizer, chunks=2048), RAW / "detokenizer_chunks.json")
    results: dict = {}
    with benchmark_server("bench_detokenizer", models, [repository]) as server:
        for model in models:  # warm-up: the first requests of each instance pay one-off costs
            measure(server, model, 8, data, "detokenizer_warmup")
        for round_ in range(args.rounds):
            for concurrency in args.concurrency:
                for model in (models if round_ % 2 == 0 else models[::-1]):
                    measured = measure(server, model, concurrency, data, "detokenizer")
                    entry = results.setdefault((concurrency, model), {key: [] for key in measured})
                    for key, value in measured.items():
                        entry[key].append(value)
                    print(f"round {round_} streams {concurrency} {model}: {measured['tps']:,.0f} tok/s, "
                          f"p99 ITL {measured['p99']:.1f} ms, mean batch {measured['batch']:.1f}", flush=True)
    batching = [library_batching(tokenizer, batch, repeats=20) for batch in (8, 32, 64)]
    report.write_raw("bench_detokenizer", {f"{c}/{m}": v for (c, m), v in results.items()}
                     | {"library_batching": batching})

    rep.add("perf_analyzer keeps one request per stream in flight: each stream sends its next one-token chunk "
            "(stream_interval 1) with its 8-id context window as soon as the previous one is answered, so request "
            f"latency = inter-token latency (ITL) added by the detokenizer. Medians over {args.rounds} alternating "
            "rounds (3 s windows); ratio = tokens/s relative to 1 instance at the same concurrency; mean batch = "
            "inferences per execution from Triton's statistics.\n")
    rows = []
    for concurrency in args.concurrency:
        base = statistics.median(results[(concurrency, models[0])]["tps"])
        for model, count in zip(models, args.counts):
            entry = {k: statistics.median(v) for k, v in results[(concurrency, model)].items()}
            rows.append([concurrency, count, f"{entry['tps']:,.0f}", f"{entry['tps'] / base:.2f}",
                         entry["p50"], entry["p99"], entry["batch"]])
    rep.add(report.table(["streams", "instances", "output tokens/s", "ratio", "P50 ITL ms", "P99 ITL ms",
                          "mean batch"], rows))
    rep.add("## One batched decode per batch (in-process, library only)\n\n"
            "Microseconds per chunk to detokenize a batch of one-token chunks of different streams: one "
            "`detokenize` call for the whole batch vs one call per chunk (medians of 20 runs).\n\n" + report.table(
                ["chunks in batch", "batched µs/chunk", "one call per chunk µs/chunk", "speed-up"],
                [[b["batch"], b["batched_us"], b["single_us"], f"{b['single_us'] / b['batched_us']:.2f}"]
                 for b in batching]))
    rep.write(plot(results, models, args))


if __name__ == "__main__":
    main()

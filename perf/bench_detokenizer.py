"""Streaming detokenizer throughput and inter-token latency, 1 instance vs N, in one server.

One tritonserver serves copies of the committed detokenizer that differ only in name and
instance count (detokenizer_1, detokenizer_2, ...; model.py is the committed one, symlinked).
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
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from detokenizer_client import chunk_stream, random_streams  # noqa: E402
from triton_server import triton_server  # noqa: E402
from tritonfront.detokenization import DETOKENIZER_WINDOW, StreamDetokenizer  # noqa: E402

RESULTS = ROOT / "perf" / "results"


def build_repository(directory: Path, counts: list[int]) -> list[str]:
    committed = ROOT / "model_repository" / "detokenizer"
    config = (committed / "config.pbtxt").read_text()
    assert 'name: "detokenizer"' in config and "count: 2" in config
    names = []
    for count in counts:
        name = f"detokenizer_{count}"
        model = directory / name
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").symlink_to(committed / "1" / "model.py")
        (model / "config.pbtxt").write_text(config.replace('name: "detokenizer"', f'name: "{name}"').replace("count: 2", f"count: {count}"))
        names.append(name)
    return names


def token_streams(tokenizer, count: int, tokens: int, seed: int) -> list[list]:
    """`count` streams of `tokens` one-token chunks each (context windows included)."""
    streams = []
    for ids, _ in random_streams(tokenizer, count, seed):
        while len(ids) < tokens:
            ids = ids + ids
        ids = ids[:tokens]
        streams.append(chunk_stream(ids, [1] * tokens))
    return streams


def write_input_data(path: Path, tokenizer, chunks: int) -> None:
    """perf_analyzer input: one-token chunks with a full context window, from many streams."""
    data = []
    for stream in token_streams(tokenizer, chunks // 32, 40, seed=1):
        for k, chunk in enumerate(stream[DETOKENIZER_WINDOW:DETOKENIZER_WINDOW + 32]):
            data.append({
                "output_ids": {"content": list(chunk.output_ids), "shape": [len(chunk.output_ids)]},
                "context_ids": {"content": list(chunk.context_ids), "shape": [len(chunk.context_ids)]},
                "is_final": [chunk.is_final],
                "finish_reason": {"content": ["length" if chunk.is_final else ""], "shape": [1]},
                "prompt_tokens": [16],
                "completion_tokens": [DETOKENIZER_WINDOW + k + 1],
            })
    path.write_text(json.dumps({"data": data}))


def perf_analyzer(server, model: str, concurrency: int, data: Path, csv: Path) -> dict:
    """Throughput and latency percentiles (ms) of `concurrency` requests kept in flight."""
    command = ["perf_analyzer", "-m", model, "-i", "grpc", "-u", server.grpc_url, "-a", "--input-data", str(data),
               "--concurrency-range", str(concurrency), "-p", "3000", "-s", "100", "--percentile", "99", "-f", str(csv)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    header, values = csv.read_text().splitlines()[:2]
    row = dict(zip(header.split(","), values.split(",")))
    return {"tps": float(row["Inferences/Second"]), "p50": float(row["p50 latency"]) / 1e3,
            "p99": float(row["p99 latency"]) / 1e3}


def inference_counts(server, model: str) -> tuple[int, int]:
    """(inferences, executions) of `model` so far, from Triton's statistics."""
    import tritonclient.grpc as grpcclient

    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def library_batching(tokenizer, batch: int, repeats: int) -> dict:
    """Seconds per chunk: one detokenize call over `batch` chunks vs one call per chunk."""
    detokenizer = StreamDetokenizer(tokenizer)
    chunks = [chunk for chunks in token_streams(tokenizer, batch, 40, seed=3) for chunk in chunks[20:21]]
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


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    memory = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    return f"{cpu}, {cores} cores, {int(memory) / 2**20:.0f} GiB RAM, {platform.platform()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4], help="instance counts to compare")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 128], help="concurrent streams")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "detokenizer")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from tritonfront.model_sources import llm_model_dir

    tokenizer = AutoTokenizer.from_pretrained(llm_model_dir())
    results: dict = {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp) / "repository"
        models = build_repository(repository, args.counts)
        data = Path(tmp) / "chunks.json"
        write_input_data(data, tokenizer, chunks=2048)
        with triton_server(Path(tmp) / "server.log", repositories=[repository]) as server:
            for model in models:  # warm-up: the first requests of each instance pay one-off costs
                perf_analyzer(server, model, 8, data, Path(tmp) / "warmup.csv")
            for round_ in range(args.rounds):
                for concurrency in args.concurrency:
                    for model in (models if round_ % 2 == 0 else models[::-1]):
                        before = inference_counts(server, model)
                        measured = perf_analyzer(server, model, concurrency, data, Path(tmp) / "run.csv")
                        after = inference_counts(server, model)
                        measured["batch"] = (after[0] - before[0]) / max(1, after[1] - before[1])
                        entry = results.setdefault((concurrency, model), {key: [] for key in measured})
                        for key, value in measured.items():
                            entry[key].append(value)
                        print(f"round {round_} streams {concurrency} {model}: {measured['tps']:,.0f} tok/s, "
                              f"p99 ITL {measured['p99']:.1f} ms, mean batch {measured['batch']:.1f}", flush=True)
    load = (load_before, os.getloadavg()[0])
    batching = [library_batching(tokenizer, batch, repeats=20) for batch in (8, 32, 64)]
    write_report(args, results, batching, models, load)


def write_report(args, results: dict, batching: list[dict], models: list[str], load: tuple[float, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    command = "python perf/bench_detokenizer.py " + " ".join(sys.argv[1:])
    lines = [
        "# Streaming detokenizer: instance count 1 vs N",
        "",
        f"Machine: {machine()}. Client (perf_analyzer) and server share these cores; the machine's",
        f"1-minute load average was {load[0]:.1f} at the start and {load[1]:.1f} at the end (other jobs ran too).",
        "",
        f"Command: `{command}` (from the repository root, after `source scripts/env.sh`).",
        "",
        "perf_analyzer keeps one request per stream in flight: each stream sends its next one-token chunk",
        "(stream_interval 1) with its 8-id context window as soon as the previous one is answered, so",
        "request latency = inter-token latency (ITL) added by the detokenizer. Medians over "
        f"{args.rounds} alternating rounds (3 s windows);",
        "ratio = tokens/s relative to 1 instance at the same concurrency; mean batch = inferences per",
        "execution from Triton's statistics.",
        "",
        "| streams | instances | output tokens/s | ratio | P50 ITL ms | P99 ITL ms | mean batch |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency in args.concurrency:
        base = statistics.median(results[(concurrency, models[0])]["tps"])
        for model, count in zip(models, args.counts):
            entry = {k: statistics.median(v) for k, v in results[(concurrency, model)].items()}
            lines.append(f"| {concurrency} | {count} | {entry['tps']:,.0f} | {entry['tps'] / base:.2f} | "
                         f"{entry['p50']:.1f} | {entry['p99']:.1f} | {entry['batch']:.1f} |")
    lines += [
        "",
        "## One batched decode per batch (in-process, library only)",
        "",
        "Microseconds per chunk to detokenize a batch of one-token chunks of different streams:",
        "one `detokenize` call for the whole batch vs one call per chunk (medians of 20 runs).",
        "",
        "| chunks in batch | batched µs/chunk | one call per chunk µs/chunk | speed-up |",
        "|---:|---:|---:|---:|",
    ]
    for row in batching:
        lines.append(f"| {row['batch']} | {row['batched_us']:.1f} | {row['single_us']:.1f} | {row['single_us'] / row['batched_us']:.2f} |")
    markdown = args.output.with_suffix(".md")
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text("\n".join(lines) + "\n")
    args.output.with_suffix(".json").write_text(json.dumps(
        {f"{c}/{m}": v for (c, m), v in results.items()} | {"library_batching": batching}, indent=1))

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for concurrency in args.concurrency:
        tps = [statistics.median(results[(concurrency, m)]["tps"]) for m in models]
        p99 = [statistics.median(results[(concurrency, m)]["p99"]) for m in models]
        left.plot(args.counts, tps, marker="o", label=f"{concurrency} streams")
        right.plot(args.counts, p99, marker="o", label=f"{concurrency} streams")
    left.set(xlabel="detokenizer instances", ylabel="output tokens/s", title="Throughput", xticks=args.counts)
    right.set(xlabel="detokenizer instances", ylabel="P99 inter-token latency (ms)", title="P99 ITL", xticks=args.counts)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
        axis.set_ylim(bottom=0)
    figure.suptitle(f"Streaming detokenizer on {machine().split(',')[1].strip()}")
    figure.tight_layout()
    figure.savefig(args.output.with_suffix(".png"), dpi=120)
    print(markdown.read_text())


if __name__ == "__main__":
    main()

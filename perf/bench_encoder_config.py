#!/usr/bin/env python
"""`embed` throughput under different `encoder` instance counts and torch thread counts, in one
server, interleaved: the evidence for the encoder's instance_group / num_threads settings.

Each variant is the committed encoder config.pbtxt with `count` and `num_threads` rewritten
(harness.deploy.write_variant: model.py linked, not copied) behind a copy of the `embed` ensemble
that points at it; the tokenizer and pooler are shared. Variants take turns, round by round,
under the same closed loop of single-text requests (~90 tokens), so drift in other work on
the machine hits all of them.
"""
import asyncio
import re
import shutil
import statistics
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

from harness import report
from harness.accounting import OtherWork
from harness.clients.kserve import single_texts
from harness.corpora import synthetic_texts
from harness.deploy import write_variant
from harness.load.unary import run_concurrency, warm_up
from harness.paths import ENSEMBLES, MODEL_REPOSITORY, RAW
from harness.server import benchmark_server


def committed_variant() -> str:
    config = (MODEL_REPOSITORY / "encoder" / "config.pbtxt").read_text()
    count = re.search(r"count: (\d+)", config).group(1)
    threads = re.search(r'key: "num_threads" value: \{ string_value: "(\d+)"', config).group(1)
    return f"{count}x{threads}"


def variant_repository(target: Path, variants: list[tuple[int, int]]) -> list[str]:
    """Writes encoder_<count>x<threads> + embed_<count>x<threads> for each variant; returns the
    ensemble names."""
    shutil.rmtree(target, ignore_errors=True)
    names = []
    for count, threads in variants:
        tag = f"{count}x{threads}"
        write_variant("encoder", f"encoder_{tag}", target, [
            (r"count: \d+", f"count: {count}"),
            (r'(key: "num_threads" value: \{ string_value: )"\d+"', rf'\g<1>"{threads}"'),
        ])
        write_variant("embed", f"embed_{tag}", target, [('model_name: "encoder"', f'model_name: "encoder_{tag}"')],
                      source=ENSEMBLES)
        names.append(f"embed_{tag}")
    return names


async def rounds(url: str, factory, models: list[str], concurrency: int, duration: float, count: int):
    results = {m: [] for m in models}
    await warm_up(url, factory, models)  # every instance loads its first batch shapes
    async with grpcaio.InferenceServerClient(url) as client:
        for k in range(count):
            for model in (models if k % 2 == 0 else models[::-1]):
                with OtherWork() as others:
                    r = await run_concurrency(client, model, factory, concurrency, duration)
                r.server["other_cpu"] = others.cores
                print(r.row(), f"other work {others.cores:.2f} cores", flush=True)
                results[model].append(r)
    return results


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_encoder_config", "embed throughput by encoder instance count x torch threads",
        variants=("1x0,2x1,1x1", "instances x torch threads (0 = one per core); the first is the reference"),
        concurrency=64, duration=20.0, rounds=4)
    variants = [tuple(int(x) for x in v.split("x")) for v in args.variants.split(",")]
    repository = RAW / "encoder_variants"
    models = variant_repository(repository, variants)
    factory = single_texts(synthetic_texts(512, 90, seed=1))
    encoders = [m.replace("embed_", "encoder_") for m in models]
    with benchmark_server("bench_encoder_config", ["tokenizer", "pooler", *encoders, *models],
                          [MODEL_REPOSITORY, repository]) as server:
        results = asyncio.run(rounds(server.grpc_url, factory, models, args.concurrency, args.duration, args.rounds))

    rep.add(f"Closed loop, concurrency {args.concurrency}, single ~90-token texts to an `embed` copy per variant, "
            f"{args.duration:g} s per step, {args.rounds} rounds, variants alternating (order reversed every round). "
            "Variant `NxT` = N encoder instances with T torch threads each (0 = one per core).\n")
    rows = []
    for model, runs in results.items():
        rates = [r.achieved_rps for r in runs]
        tag = model.removeprefix("embed_")
        rows.append([tag + (" (committed)" if tag == committed_variant() else ""), statistics.median(rates), min(rates),
                     max(rates), " ".join(f"{x:.1f}" for x in rates), statistics.median(r.p50_ms for r in runs),
                     statistics.median(r.p99_ms for r in runs),
                     " ".join(f"{r.server['other_cpu']:.2f}" for r in runs)])
    rep.add(report.table(["variant", "median texts/s", "min", "max", "per round (run order)", "median P50 ms",
                          "median P99 ms", "other work CPU per round (cores)"], rows))
    base = statistics.median(r.achieved_rps for r in results[models[0]])
    rep.add("Median texts/s relative to " + rows[0][0] + ": " + ", ".join(
        f"{row[0]} {row[1] / base:.2f}x" for row in rows[1:]) + "\n")

    fig, ax = report.plt.subplots(figsize=(7, 4))
    for model, runs in results.items():
        ax.plot(range(1, len(runs) + 1), [r.achieved_rps for r in runs], "o-", label=model.removeprefix("embed_"))
    ax.set(xlabel="round", ylabel="texts/s", title=f"embed, concurrency {args.concurrency}: encoder instances x threads")
    ax.legend(fontsize=8)
    rep.write(fig)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Pooler A/B in one process, no server: token-level embeddings through a Dense head 384 -> 128
(tanh, then L2 normalization, as a sentence-transformers Dense + Normalize head) for a batch of
32 sequences of mixed lengths.

  baseline: the loop the ragged pooler replaced, one matmul + bias + activation + normalize per
            sequence (per_sequence_token_embeddings below)
  ragged:   RaggedBatch.concat of the batch, PoolingHead.token_embeddings (one matmul over all
            tokens), RaggedBatch.split back into sequences, as the `pooler` model does

The two run alternately, repetition by repetition, on the same inputs and the same torch thread
count; each repetition draws a fresh batch of lengths. Reported: median times and their ratio
(target >= 3x), per thread count.
"""
import statistics
import time

import numpy as np
import torch

from harness import report
from tritonfront.core.pooling import DenseLayer, PoolingHead, normalize
from tritonfront.core.ragged import RaggedBatch


@torch.inference_mode()
def per_sequence_token_embeddings(sequences: list[np.ndarray], layer: DenseLayer, normalized: bool) -> list[torch.Tensor]:
    """The baseline: the Dense head applied one sequence at a time, as a per-request loop would."""
    out = []
    for states in sequences:
        rows = layer.activation(torch.from_numpy(states) @ layer.weight.T + layer.bias)
        out.append(normalize(rows) if normalized else rows)
    return out


def make_head(hidden: int, out: int, seed: int) -> PoolingHead:
    g = torch.Generator().manual_seed(seed)
    layer = DenseLayer(torch.randn(out, hidden, generator=g) / hidden**0.5, torch.randn(out, generator=g) * 0.1,
                       torch.tanh)
    return PoolingHead(modes=("mean",), dense=[layer], normalized=True, hidden_size=hidden)


def ragged(sequences, head: PoolingHead):
    batch = RaggedBatch.concat(sequences)
    return batch.split(head.token_embeddings(batch))


def measure(threads: int, min_len: int, max_len: int, args, head: PoolingHead) -> dict:
    torch.set_num_threads(threads)
    rng = np.random.default_rng(args.seed)
    times = {"baseline": [], "ragged": []}
    tokens = []
    for rep in range(args.warmup + args.repetitions):
        lengths = rng.integers(min_len, max_len + 1, size=args.batch)
        sequences = [rng.standard_normal((n, args.hidden), dtype=np.float32) for n in lengths]
        order = (("baseline", lambda: per_sequence_token_embeddings(sequences, head.dense[0], True)),
                 ("ragged", lambda: ragged(sequences, head)))
        results = {}
        for name, fn in (order if rep % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            results[name] = fn()
            elapsed = time.perf_counter() - start
            if rep >= args.warmup:
                times[name].append(elapsed)
        if rep == 0:  # same numbers both ways, or the comparison means nothing
            for a, b in zip(results["baseline"], results["ragged"]):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        tokens.append(int(lengths.sum()))
    base, rag = statistics.median(times["baseline"]), statistics.median(times["ragged"])
    return {"threads": threads, "lengths": f"{min_len}..{max_len}", "baseline_ms": base * 1e3, "ragged_ms": rag * 1e3, "ratio": base / rag,
            "baseline_p90_ms": float(np.percentile(times["baseline"], 90) * 1e3),
            "ragged_p90_ms": float(np.percentile(times["ragged"], 90) * 1e3),
            "tokens": statistics.median(tokens), "times": times}


def main() -> None:
    args, rep = report.start(
        __doc__, "bench_pooler", "Pooler: ragged batched projection vs per-sequence loop (in-process)",
        threads=("1,2", "torch thread counts to run (the pooler model uses 1)"), batch=32,
        lengths=("8-256,1-16", "length ranges to run; the target is for the first (8..256), the second shows "
                               "where per-call overhead dominates"),
        hidden=384, out=128, repetitions=400, warmup=20, seed=0)
    head = make_head(args.hidden, args.out, args.seed)
    ranges = [tuple(int(x) for x in r.split("-")) for r in args.lengths.split(",")]
    runs = [measure(int(t), lo, hi, args, head) for lo, hi in ranges for t in args.threads.split(",")]

    rep.add(f"Token-level embeddings through a Dense {args.hidden} -> {args.out} head (tanh) + L2 normalization, "
            f"batches of {args.batch} sequences with lengths uniform in the range shown, fp32 CPU. {args.repetitions} repetitions after "
            f"{args.warmup} warm-up ones, a fresh batch each, baseline and ragged alternating (order swapped every "
            "repetition). Outputs checked equal (assert_close) before timing. Ragged time includes the "
            "concatenation and the split back into sequences.\n")
    rep.add(report.table(
        ["lengths", "tokens/batch (median)", "torch threads", "per-sequence median ms", "ragged median ms", "per-sequence P90 ms", "ragged P90 ms",
         "speed-up (median)", "target >= 3x"],
        [[r["lengths"], r["tokens"], r["threads"], r["baseline_ms"], r["ragged_ms"], r["baseline_p90_ms"], r["ragged_p90_ms"],
          f"{r['ratio']:.2f}x", ("met" if r["ratio"] >= 3 else "MISSED") if r["lengths"] == runs[0]["lengths"]
          else "(no target)"] for r in runs]))

    fig, ax = report.plt.subplots(figsize=(10, 4.5))
    data, labels = [], []
    for r in runs:
        for name in ("baseline", "ragged"):
            data.append(np.array(r["times"][name]) * 1e3)
            labels.append(f"{'per-seq' if name == 'baseline' else 'ragged'}\n{r['lengths']}\n{r['threads']} thr")
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set(yscale="log", ylabel="ms per batch", title=f"Dense {args.hidden}->{args.out} over {args.batch} ragged sequences")
    rep.write(fig)


if __name__ == "__main__":
    main()

"""What the generate benchmarks share: deployments of the generate pipeline (the test suite's
scripts/configure.py helper, cut to the generate models, with renamed variant copies of `llm`),
prompts of a chosen token length, and the DP ranks' load read from their load table."""
import random
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

import serving
from texts import synthetic_texts

sys.path.insert(0, str(serving.ROOT / "tests" / "integration"))

from generate_client import copy_model, tokenizer, write_deployment  # noqa: E402
from tritonfront import balancing  # noqa: E402

PIPELINE = ["llm_tokenizer", "llm", "detokenizer", "generate"]


def deployment(out: Path, *configure_args: str, copies: dict[str, dict] = {}) -> list[Path]:
    """scripts/configure.py's deployment of the generate pipeline; `copies`: name -> llm
    parameters of extra copies of `llm` (same code, same instance groups)."""
    repositories = write_deployment(out, *configure_args)
    for name, parameters in copies.items():
        copy_model(out, "llm", name, **parameters)
    return repositories


def prompt_ids(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """One prompt of exactly each length, in SmolLM2 token ids: the start of a different
    synthetic English-word text each (BOS-free, as the llm_tokenizer sends raw text)."""
    longest = max(lengths)
    texts = synthetic_texts(len(lengths), int(longest * 1.3) + 8, seed=seed)
    prompts = []
    for text, length in zip(texts, lengths):
        ids = tokenizer()(text, add_special_tokens=False).input_ids
        if len(ids) < length:
            raise ValueError(f"a text gave {len(ids)} tokens, fewer than {length}")
        prompts.append(ids[:length])
    return prompts


def prompt_texts(count: int, tokens: int, seed: int = 0) -> list[str]:
    """Texts of exactly `tokens` SmolLM2 tokens (the ensemble's tokenizer), all different."""
    return [tokenizer().decode(ids) for ids in prompt_ids([tokens] * count, seed)]


def uniform_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


class RankLoad(threading.Thread):
    """Samples the ranks' rows of a model's load table (/dev/shm, written by the ranks
    themselves) every `every` seconds: outstanding tokens, waiting requests (queued, no token
    yet) and active sequences per rank over time. Reading the table costs the server nothing, unlike scraping its
    metrics endpoint."""

    def __init__(self, server, model: str, ranks: int, every: float = 0.05):
        super().__init__(daemon=True)
        self.path = balancing.table_path(model, server.process.pid)
        self.ranks, self.every = ranks, every
        self.samples: list[tuple[float, np.ndarray]] = []  # (time, [ranks, FIELDS] rows)
        self._stopping = threading.Event()

    def run(self) -> None:
        fields = len(balancing.FIELDS)
        while not self._stopping.wait(self.every):
            rows = np.fromfile(self.path, dtype=np.int64, count=self.ranks * fields).reshape(self.ranks, fields)
            self.samples.append((time.perf_counter(), rows))

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def between(self, start: float, end: float, field: int = balancing.OUTSTANDING) -> np.ndarray:
        """[samples, ranks] of one field of the table (balancing.OUTSTANDING, WAITING, ACTIVE)
        sampled in [start, end]."""
        rows = [rows[:, field] for t, rows in self.samples if start <= t <= end]
        return np.array(rows).reshape(-1, self.ranks)


def load_ratio(samples: np.ndarray) -> dict:
    """Per-rank token load over a window: max/min of the ranks' mean outstanding tokens (the
    issue's measure), and the median over samples of the instantaneous max/min, counted only
    where both ranks hold work."""
    busy = samples[samples.sum(axis=1) > 0]
    if not len(busy):
        return {"mean_ratio": float("nan"), "median_instant_ratio": float("nan"), "means": []}
    means = busy.mean(axis=0)
    both = busy[busy.min(axis=1) > 0]
    return {"mean_ratio": float(means.max() / means.min()) if means.min() > 0 else float("inf"),
            "median_instant_ratio": float(np.median(both.max(axis=1) / both.min(axis=1))) if len(both) else float("inf"),
            "means": [float(m) for m in means]}


def sequence_skew(waiting: np.ndarray, active: np.ndarray) -> dict:
    """How unevenly the ranks' compute is spread, which outstanding tokens do not measure: mean
    waiting requests (queued prefills) and active sequences per rank, and the mean over samples
    of |difference| of active sequences between the ranks (2 ranks)."""
    if not len(active):
        return {"waiting_means": [], "active_means": [], "active_gap": float("nan")}
    return {"waiting_means": [float(m) for m in waiting.mean(axis=0)],
            "active_means": [float(m) for m in active.mean(axis=0)],
            "active_gap": float(np.mean(active.max(axis=1) - active.min(axis=1)))}


def histogram(metrics: str, name: str, model: str, rank: int = 0) -> dict:
    """A Prometheus histogram of one model rank from Triton's metrics text: upper bounds,
    cumulative counts, sum and count."""
    labels = f'model="{model}",rank="{rank}"'
    buckets = re.findall(rf'^{name}_bucket\{{{labels},le="([^"]+)"\}} (\S+)$', metrics, re.M)
    if not buckets:  # label order is the exporter's choice
        buckets = re.findall(rf'^{name}_bucket\{{le="([^"]+)",{labels}\}} (\S+)$', metrics, re.M)
    total = re.search(rf'^{name}_sum\{{{labels}\}} (\S+)$', metrics, re.M)
    count = re.search(rf'^{name}_count\{{{labels}\}} (\S+)$', metrics, re.M)
    if not buckets or total is None or count is None:
        raise ValueError(f"no histogram {name} for {labels} in the metrics")
    return {"le": np.array([float(b) for b, _ in buckets]), "cumulative": np.array([float(c) for _, c in buckets]),
            "sum": float(total.group(1)), "count": float(count.group(1))}


def histogram_delta(before: dict, after: dict) -> dict:
    return {"le": after["le"], "cumulative": after["cumulative"] - before["cumulative"],
            "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}


def histogram_quantile(h: dict, q: float) -> float:
    """Like Prometheus' histogram_quantile: linear within the bucket holding the q-th observation."""
    if h["count"] <= 0:
        return float("nan")
    rank = q * h["count"]
    i = int(np.searchsorted(h["cumulative"], rank))
    if i >= len(h["le"]) or np.isinf(h["le"][i]):
        return float(h["le"][len(h["le"]) - 2])  # beyond the last finite bound
    lower = h["le"][i - 1] if i > 0 else 0.0
    below = h["cumulative"][i - 1] if i > 0 else 0.0
    inside = h["cumulative"][i] - below
    return float(lower + (h["le"][i] - lower) * ((rank - below) / inside if inside else 1.0))


def model_cpu_seconds(server, model: str) -> float:
    """CPU seconds of the Python stubs (one per instance) of one model of the server."""
    total = 0.0
    for process in serving.server_processes(server):
        try:
            if f"/{model}/1/model.py" in " ".join(process.cmdline()):
                times = process.cpu_times()
                total += times.user + times.system
        except serving.psutil.Error:
            continue
    return total

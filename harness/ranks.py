"""The llm ranks' load table (a file in /dev/shm each rank writes its own row of: outstanding
tokens, waiting requests, active sequences): read directly, which costs the server nothing,
unlike scraping its metrics endpoint."""
import numpy as np

from tritonfront.core import balancing

from .accounting import Sampler
from .load.threads import poll


def read_table(server, model: str, ranks: int) -> np.ndarray:
    """[ranks, balancing.FIELDS] rows of a model's load table now."""
    fields = len(balancing.FIELDS)
    path = balancing.table_path(model, server.pid)
    return np.fromfile(path, dtype=np.int64, count=ranks * fields).reshape(ranks, fields)


class RankLoad(Sampler):
    """The load table of one model sampled every `every` seconds."""

    def __init__(self, server, model: str, ranks: int, every: float = 0.05):
        super().__init__(lambda: read_table(server, model, ranks), every)
        self.ranks = ranks

    def field_between(self, start: float, end: float, field: int = balancing.OUTSTANDING) -> np.ndarray:
        """[samples, ranks] of one field (balancing.OUTSTANDING, WAITING, ACTIVE) in [start, end]."""
        return np.array([rows[:, field] for rows in self.between(start, end)]).reshape(-1, self.ranks)


def wait_idle(server, model: str, timeout: float = 60) -> None:
    """Until the model's (first) rank holds no sequence."""
    if not poll(lambda: read_table(server, model, 1)[0, balancing.ACTIVE] == 0, timeout):
        raise TimeoutError(f"{model} still has active sequences after {timeout} s")


def load_ratio(samples: np.ndarray) -> dict:
    """Per-rank token load over a window of [samples, ranks]: max/min of the ranks' mean
    outstanding tokens, and the median over samples of the instantaneous max/min, counted only
    where every rank holds work."""
    busy = samples[samples.sum(axis=1) > 0]
    if not len(busy):
        return {"mean_ratio": float("nan"), "median_instant_ratio": float("nan"), "means": []}
    means = busy.mean(axis=0)
    both = busy[busy.min(axis=1) > 0]
    return {"mean_ratio": float(means.max() / means.min()) if means.min() > 0 else float("inf"),
            "median_instant_ratio": (float(np.median(both.max(axis=1) / both.min(axis=1))) if len(both)
                                     else float("inf")),
            "means": [float(m) for m in means]}


def sequence_skew(waiting: np.ndarray, active: np.ndarray) -> dict:
    """How unevenly the ranks' compute is spread, which outstanding tokens do not show: mean
    waiting requests (queued prefills) and active sequences per rank, and the mean over samples
    of the gap in active sequences between the busiest and the idlest rank."""
    if not len(active):
        return {"waiting_means": [], "active_means": [], "active_gap": float("nan")}
    return {"waiting_means": [float(m) for m in waiting.mean(axis=0)],
            "active_means": [float(m) for m in active.mean(axis=0)],
            "active_gap": float(np.mean(active.max(axis=1) - active.min(axis=1)))}

"""Data-parallel balancing of the `llm` instances by outstanding tokens.

Every Triton Python model instance is a process with its own engine: a DP rank. Triton gives the
next request to whichever instance is free and knows nothing of how much work each one holds.
So the ranks publish their load in a small table shared through a file in /dev/shm (each rank
writes only its own row), and after queueing its requests an instance holds on to its `execute`
call while it is not among the least-loaded ranks. Triton's scheduler then hands the next
requests to the less-loaded instances, and waiting requests stay in Triton's own queue, where
its queue policies, priorities and metrics keep working.
"""
import time
from pathlib import Path
from typing import Optional

import numpy as np

from .rank_load import Load
from .shared_tables import DEFAULT_DIRECTORY, open_rows, remove_stale_tables, table_path

FIELDS = ("outstanding_tokens", "waiting_requests", "active_sequences", "heartbeat_ns", "kv_cache_blocks",
          "kv_cache_capacity_blocks")
OUTSTANDING, WAITING, ACTIVE, HEARTBEAT, KV_BLOCKS, KV_CAPACITY = range(len(FIELDS))
BALANCING_MODES = ("tokens", "none")


class LoadTable:
    """[ranks, FIELDS] int64 in a shared file. A rank whose heartbeat is older than `stale_s`
    (not started yet, or gone) is ignored, so no rank waits for one that takes no work."""

    def __init__(self, path: Path, rank: int, ranks: int, stale_s: float = 2.0):
        if not 0 <= rank < ranks:
            raise ValueError(f"rank {rank} is outside 0..{ranks - 1}")
        self.path, self.rank, self.ranks = Path(path), rank, ranks
        self.stale_ns = int(stale_s * 1e9)
        self._rows: Optional[np.memmap] = open_rows(self.path, ranks, len(FIELDS))
        self._rows[rank] = 0

    @classmethod
    def for_model(cls, model_name: str, rank: int, ranks: int, server_pid: int,
                  directory: Path = DEFAULT_DIRECTORY) -> "LoadTable":
        remove_stale_tables(directory)
        return cls(table_path(model_name, server_pid, directory), rank, ranks)

    def publish(self, load: Load) -> None:
        self._rows[self.rank] = (load.outstanding_tokens, load.waiting_requests, load.active_sequences,
                                 time.monotonic_ns(), load.kv_cache_blocks, load.kv_cache_capacity_blocks)

    def snapshot(self) -> np.ndarray:
        return np.array(self._rows)

    def live_ranks(self, rows: np.ndarray) -> np.ndarray:
        alive = (time.monotonic_ns() - rows[:, HEARTBEAT]) < self.stale_ns
        alive[self.rank] = True
        return alive

    def live_loads(self) -> list[Load]:
        """The loads of the live ranks (this one included), as their rows say."""
        rows = self.snapshot()
        return [Load(outstanding_tokens=int(row[OUTSTANDING]), waiting_requests=int(row[WAITING]),
                     active_sequences=int(row[ACTIVE]), kv_cache_blocks=int(row[KV_BLOCKS]),
                     kv_cache_capacity_blocks=int(row[KV_CAPACITY]))
                for row in rows[self.live_ranks(rows)]]

    def least_loaded(self) -> bool:
        """Whether no live rank has fewer outstanding tokens than this one (ties count as least)."""
        rows = self.snapshot()
        return bool(rows[self.rank, OUTSTANDING] <= rows[self.live_ranks(rows), OUTSTANDING].min())

    def close(self) -> None:
        if self._rows is not None:
            self._rows[self.rank] = 0  # heartbeat 0: the others stop counting this rank at once
            self._rows.flush()
            self._rows = None


class BalancingGate:
    def __init__(self, table: LoadTable, timeout_s: float = 1.0, poll_s: float = 0.001):
        self.table = table
        self.timeout_s = timeout_s  # bounds the hold when the least-loaded ranks take no work
        self.poll_s = poll_s

    def wait(self) -> bool:
        """Returns once this rank is among the least loaded (True) or after the timeout (False)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.table.least_loaded():
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return True

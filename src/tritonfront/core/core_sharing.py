"""The CPU cores one model's instances share, split by how many of them are computing right now.

The encoder runs as several single-process instances so that a busy machine keeps them all
working (a torch thread team stalls whenever another process takes one of its cores, while
independent instances just slow down). But with one thread each, a lone request (one client, a
quiet server) runs on one core while the others idle. So each instance marks itself busy in a
small table shared through /dev/shm and, before each forward pass and between its layers, takes
`cores // busy instances` intra-op threads: all cores for a lone request, one each under load.
An instance that starts while another is mid-pass makes the other drop to its share at its next
layer, so oversubscription lasts one layer at most.
"""
import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .shared_tables import DEFAULT_DIRECTORY, open_rows, remove_stale_tables, table_path

BUSY, HEARTBEAT = 0, 1


class CoreShare:
    """[instances, (busy, heartbeat)] int64 in a shared file; each instance writes its own row.
    A row whose heartbeat is older than `stale_s` (an instance that died mid-pass) counts as idle."""

    def __init__(self, rows: np.ndarray, index: int, cores: int, stale_s: float = 60.0,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        if not 0 <= index < len(rows):
            raise ValueError(f"instance {index} is outside 0..{len(rows) - 1}")
        self.rows, self.index, self.cores = rows, index, max(1, cores)
        self.stale_ns = int(stale_s * 1e9)
        self._set_threads = set_threads
        self._threads = 0
        self.rows[index] = 0

    @classmethod
    def for_instance(cls, model_name: str, index: int, instances: int, server_pid: int, cores: int,
                     directory: Path = DEFAULT_DIRECTORY) -> "CoreShare":
        remove_stale_tables(directory)
        return cls(open_rows(table_path(model_name, server_pid, directory, kind="cores"), instances, 2), index, cores)

    def busy_instances(self) -> int:
        fresh = time.monotonic_ns() - self.rows[:, HEARTBEAT] < self.stale_ns
        return max(1, int(np.count_nonzero((self.rows[:, BUSY] == 1) & fresh)))

    def threads(self) -> int:
        return max(1, self.cores // self.busy_instances())

    def adjust(self) -> int:
        """Takes this instance's current share of the cores (torch's intra-op threads)."""
        threads = self.threads()
        if threads != self._threads:
            self._set_threads(threads)
            self._threads = threads
        return threads

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        self.rows[self.index] = (1, time.monotonic_ns())
        try:
            self.adjust()
            yield
        finally:
            self.rows[self.index, BUSY] = 0

    def attach(self, model: torch.nn.Module) -> None:
        """Re-takes the share before each block of the model's layer stack (its longest ModuleList)."""
        def before_layer(module, args) -> None:  # a pre-hook that returns something replaces the inputs
            self.adjust()

        stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        if stacks:
            for layer in max(stacks, key=len):
                layer.register_forward_pre_hook(before_layer)

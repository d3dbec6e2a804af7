"""Streams abandoned behind the `generate` ensemble, found from the chunks nobody decodes.

A client that cancels a `generate` stream, or drops its connection, cancels the ensemble request.
Triton then cancels the ensemble's steps that have not started, but not the `llm` step, which
runs for the whole request (core's ensemble scheduler only calls Cancel() on new step requests).
So the llm is never told, and would go on to max_tokens holding its batch slot and KV cache.

What does change is downstream: the chunks the llm sends after the cancellation become cancelled
detokenizer requests. The detokenizer writes what became of each chunk in a table per llm model (a
row per rank, a slot per tracked stream): the chunk's serial once decoded, minus the serial when
Triton said its request was cancelled (it asks only for chunks the llm marks check_cancelled). A
refused chunk ends its stream at the llm's next turn; a chunk that no detokenizer answers within
the timeout (its step never ran) ends it too. The refusal is explicit because the detokenizer's
instances keep no order between them: an earlier rule, "chunks sent well after this one were
acknowledged already, so this one was dropped", held for one FIFO instance, and with two it ended
live streams whose chunk one instance was still decoding while the other went on (a generate
request then never got its final response after a stub reload under load, 2026-11-28). Only
streams whose request says a downstream step acknowledges (`delivery_acknowledged`, which the
ensemble passes) are tracked: chunks sent to a client directly are never acknowledged, and that
client's cancellation reaches the llm anyway.
"""
import collections
import logging
import time
import zlib
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .shared_tables import DEFAULT_DIRECTORY, open_existing_rows, open_rows, remove_stale_tables, table_path

logger = logging.getLogger("tritonfront.delivery")

SLOTS = 4096  # tracked streams per rank; a stream finding none free is simply not tracked
NO_SLOT = -1


def model_key(model_name: str) -> int:
    """Names the llm model's table inside the chunks it sends (a tensor carries no strings cheaply)."""
    return zlib.crc32(model_name.encode())


def ack_table_path(key: int, server_pid: int, directory: Path = DEFAULT_DIRECTORY) -> Path:
    return table_path(str(key), server_pid, directory, kind="acks")


class DeliveryTracker:
    """One llm rank's side: a slot per tracked stream, the serial and send time of each of its
    chunks not acknowledged yet. Not thread-safe: the generation loop calls it under its lock
    (`track` from Triton's execute thread, the rest from the loop's thread)."""

    def __init__(self, acks: np.ndarray, key: int, rank: int, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.acks = acks  # this rank's row: [slots] highest serial answered, negative when refused
        self.key, self.rank = key, rank
        self.timeout_s, self.clock = timeout_s, clock
        self._free = list(range(len(acks) - 1, -1, -1))
        self._slots: dict[str, int] = {}
        self._unacked: dict[str, collections.deque] = {}
        # Serials only grow, also across restarts of this rank (microseconds since the epoch to
        # start with), so an acknowledgement left in a reused slot never covers a new chunk.
        self._serial = time.time_ns() // 1000
        self._refused: set[str] = set()  # streams a chunk of which the detokenizer found cancelled
        # The row as of the last refresh(): a turn of the loop reads it once, not an element of the
        # shared memory per stream (numpy's per-element reads cost more than the rest of a check).
        self._seen: Optional[list[int]] = None

    @classmethod
    def for_model(cls, model_name: str, rank: int, ranks: int, server_pid: int, timeout_s: float,
                  directory: Path = DEFAULT_DIRECTORY) -> "DeliveryTracker":
        remove_stale_tables(directory)
        key = model_key(model_name)
        rows = open_rows(ack_table_path(key, server_pid, directory), ranks, SLOTS)
        return cls(rows[rank], key, rank, timeout_s)

    def track(self, request_id: str) -> bool:
        if not self._free:
            return False
        self._slots[request_id] = self._free.pop()
        self._unacked[request_id] = collections.deque()
        return True

    def stamp(self, request_id: str) -> tuple[int, int, int, int]:
        """The `delivery` value of the next chunk of this request: (model key, rank, slot, serial),
        slot NO_SLOT when it is not tracked."""
        slot = self._slots.get(request_id)
        if slot is None:
            return self.key, self.rank, NO_SLOT, 0
        self._serial += 1
        self._unacked[request_id].append((self._serial, self.clock()))
        return self.key, self.rank, slot, self._serial

    def release(self, request_id: str) -> None:
        slot = self._slots.pop(request_id, None)
        if slot is not None:
            del self._unacked[request_id]
            self._refused.discard(request_id)
            self._free.append(slot)

    def in_flight(self, request_id: str) -> bool:
        """Whether a chunk of this tracked stream was sent and not acknowledged yet (it waits in the
        detokenizer's queue or is being decoded)."""
        pending = self._unacked.get(request_id)
        if not pending:
            return False
        self._take_acknowledgements(request_id, pending)
        return bool(pending)

    def refresh(self) -> None:
        """Reads the acknowledgements once for the checks that follow, until the next refresh."""
        self._seen = self.acks.tolist()

    def _take_acknowledgements(self, request_id: str, pending: collections.deque) -> None:
        slot = self._slots[request_id]
        answered = self._seen[slot] if self._seen is not None else int(self.acks[slot])
        if answered < 0 and pending and pending[0][0] <= -answered:
            self._refused.add(request_id)
        while pending and pending[0][0] <= abs(answered):
            pending.popleft()

    def abandoned(self) -> list[str]:
        now = self.clock()
        for request_id, pending in self._unacked.items():
            self._take_acknowledgements(request_id, pending)
        return [request_id for request_id, pending in self._unacked.items()
                if request_id in self._refused or pending and now - pending[0][1] > self.timeout_s]


class Acknowledger:
    """The detokenizer's side: records the chunks it decoded in the tables their llm ranks read."""

    def __init__(self, server_pid: int, directory: Path = DEFAULT_DIRECTORY):
        self.server_pid, self.directory = server_pid, directory
        self._tables: dict[int, np.memmap] = {}
        self._later: list[tuple[np.ndarray, bool]] = []

    def acknowledge_later(self, deliveries: np.ndarray) -> None:
        """deliveries: [chunks, 4] (model key, rank, slot, serial) as the llm stamped them: decoded,
        written once `flush` is called: after the chunk's response has left the stub. An
        acknowledgement lets the llm send the stream's next chunk, which another instance may
        decode and answer first; written before this instance's response had reached Triton, it
        let streams arrive out of order (test_generate with 4 instances, every run once the stubs
        loaded faster)."""
        self._later.append((deliveries, False))

    def refuse_later(self, deliveries: np.ndarray) -> None:
        """The same for chunks whose request Triton says was cancelled: their streams end."""
        self._later.append((deliveries, True))

    def flush(self) -> None:
        """Writes what acknowledge_later and refuse_later recorded. A table that cannot be written
        (being created, or gone) costs only its own entries: their streams end at the llm's
        acknowledgement timeout."""
        later, self._later = self._later, []
        for deliveries, refused in later:
            try:
                self._record(deliveries, refused)
            except (OSError, ValueError) as error:
                logger.warning("acknowledgements not written: %s", error)

    def _record(self, deliveries: np.ndarray, refused: bool) -> None:
        for key, rank, slot, serial in deliveries.reshape(-1, 4).tolist():
            if not 0 <= slot < SLOTS:
                continue
            table = self._table(key, rank)
            # Answers never go back: with several detokenizer instances (configure.py
            # --detokenizers) one could write an older serial after a newer one.
            if table is not None and abs(int(table[rank, slot])) < serial:
                table[rank, slot] = -serial if refused else serial

    def _table(self, key: int, rank: int) -> Optional[np.memmap]:
        table = self._tables.get(key)
        if table is None or rank >= table.shape[0]:  # new, or grown by ranks that started later
            try:
                table = self._tables[key] = open_existing_rows(ack_table_path(key, self.server_pid, self.directory),
                                                               SLOTS)
            except FileNotFoundError:
                return None
        return table if 0 <= rank < table.shape[0] else None

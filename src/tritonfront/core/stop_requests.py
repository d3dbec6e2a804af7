"""Stop requests of the LLM-API contract, shared by every rank of an llm model.

TensorRT-LLM's LLM-API model lets a client end its own request by sending a second one with the
same request id and the input `stop` true (NVIDIA's llmapi_client.py --stop-after-ms). Here that
second request reaches whichever llm rank Triton hands it, not necessarily the one generating the
first, so a stop is posted to a table in /dev/shm that every rank of the model reads: a row per
rank (each writes only its own), a ring of (request id hash, time posted). A rank cancels its
LLM-API requests of that id that arrived before the stop was posted; a request that arrives later
is not affected, as in NVIDIA's model, where a stop for an id it does not hold changes nothing.
"""
import hashlib
import time
from pathlib import Path

import numpy as np

from .shared_tables import DEFAULT_DIRECTORY, open_rows, remove_stale_tables, table_path

SLOTS = 256  # stops remembered per rank; a request older than the oldest of them cannot be stopped by them
# Columns of a rank's row: the next slot to write, then (id hash, time posted in ns) per slot.
_NEXT = 0


def id_hash(request_id: str) -> int:
    """A request id as one signed 64-bit number (blake2b): ids compare cheaply in the table."""
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little", signed=True)


class StopBoard:
    def __init__(self, rows: np.ndarray, rank: int):
        self.rows = rows  # [ranks, 1 + 2 * SLOTS] int64
        self.rank = rank

    @classmethod
    def for_model(cls, model_name: str, rank: int, ranks: int, server_pid: int,
                  directory: Path = DEFAULT_DIRECTORY) -> "StopBoard":
        remove_stale_tables(directory)
        return cls(open_rows(table_path(model_name, server_pid, directory, kind="stops"), ranks, 1 + 2 * SLOTS), rank)

    def post(self, request_id: str, now_ns: int = 0) -> None:
        """Asks every rank to stop the LLM-API requests of this id that arrived before now."""
        row = self.rows[self.rank]
        slot = int(row[_NEXT]) % SLOTS
        # Time first, then the id: a reader that sees the new id sees its time too (a reader racing
        # the write may miss the stop for one check; the next one finds it).
        row[1 + 2 * slot + 1] = now_ns or time.time_ns()
        row[1 + 2 * slot] = id_hash(request_id)
        row[_NEXT] = slot + 1

    def stopped(self, key: int, arrived_ns: int) -> bool:
        """Whether a stop for the id hashed `key` was posted after a request of it arrived."""
        entries = self.rows[:, 1:].reshape(self.rows.shape[0], SLOTS, 2)
        return bool(np.any((entries[:, :, 0] == key) & (entries[:, :, 1] >= arrived_ns)))

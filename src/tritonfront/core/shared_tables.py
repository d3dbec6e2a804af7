"""Small int64 tables in /dev/shm that the Python stubs of one tritonserver share.

Each model instance is its own process, so state that several of them read (a rank's load, the
chunks a detokenizer has decoded) lives in a file mapped into each. A table belongs to one
server: its name ends with the server's pid, and tables of servers that are gone are removed.
"""
import os
import re
from pathlib import Path

import numpy as np

DEFAULT_DIRECTORY = Path("/dev/shm")


def table_path(name: str, server_pid: int, directory: Path = DEFAULT_DIRECTORY, kind: str = "load") -> Path:
    return directory / f"tritonfront-{re.sub(r'[^A-Za-z0-9_.]', '_', name)}-{server_pid}.{kind}"


def remove_stale_tables(directory: Path = DEFAULT_DIRECTORY) -> None:
    """Tables of servers that are gone (their pid ends the name)."""
    for path in directory.glob("tritonfront-*"):
        pid = path.stem.rsplit("-", 1)[-1]
        if pid.isdigit() and not _process_exists(int(pid)):
            path.unlink(missing_ok=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_rows(path: Path, rows: int, columns: int) -> np.memmap:
    """[rows, columns] int64 mapped from `path`, created or grown to that size. Growing is safe to
    race: every process asks for the same size and existing rows stay."""
    size = rows * columns * np.dtype(np.int64).itemsize
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return np.memmap(path, dtype=np.int64, mode="r+", shape=(rows, columns))


def open_existing_rows(path: Path, columns: int) -> np.memmap:
    """All whole rows of a table another process created; raises FileNotFoundError if there is none."""
    rows = os.stat(path).st_size // (columns * np.dtype(np.int64).itemsize)
    return np.memmap(path, dtype=np.int64, mode="r+", shape=(rows, columns))

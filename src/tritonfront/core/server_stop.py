"""The flag a stopping server's llm ranks read: set by the drain (tritonfront.watchdog.drain)
when scripts/serve.sh gets SIGTERM, before tritonserver itself is told to stop.

Triton 2.51 cannot finish a stream once it stops (the drain module says why), so the streams must
end first, and within a bound a pod's grace period allows: from the flag on, a rank takes no new
request (UNAVAILABLE, so a client or router sends it elsewhere) and, once its grace period passed,
ends every request it still holds with the text generated so far and finish reason "cancelled".
A file in /dev/shm named after the server, like the stubs' shared tables.
"""
import os
from pathlib import Path
from typing import Optional

from .shared_tables import DEFAULT_DIRECTORY, table_path


def stop_flag_path(server_pid: int, directory: Path = DEFAULT_DIRECTORY) -> Path:
    return table_path("stopping", server_pid, directory, kind="flag")


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); "" once gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def request_stop(server_pid: int, directory: Path = DEFAULT_DIRECTORY) -> Path:
    """Sets the flag of the server `server_pid` (idempotent); returns its path. The flag holds the
    server's start time: a later server that reuses the pid is not stopped by it."""
    path = stop_flag_path(server_pid, directory)
    path.write_text(_start_time(server_pid))
    return path


def stop_requested(server_pid: int, directory: Path = DEFAULT_DIRECTORY) -> bool:
    path = stop_flag_path(server_pid, directory)
    if not os.path.exists(path):  # the common case, read every STOP_CHECK_S: one stat
        return False
    try:
        return path.read_text() == _start_time(server_pid)
    except OSError:
        return False

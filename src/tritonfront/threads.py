"""OS-level names for threads, so a profile or a CPU split can tell them apart.

Python's thread names stay inside Python; /proc/<pid>/task/<tid>/comm is what `top -H`, py-spy
and the benchmarks' per-thread CPU accounting read. Threads started by libraries (transformers'
generation thread, torch's OpenMP workers) cannot be named from inside, but a process may rename
any of its own threads through /proc/self/task/<tid>/comm.
"""
import contextlib
import os

TASKS = "/proc/self/task"


def native_ids() -> set[int]:
    """The kernel ids of this process's threads (empty where /proc is absent)."""
    with contextlib.suppress(OSError):
        return {int(tid) for tid in os.listdir(TASKS)}
    return set()


def name_native(thread_ids, name: str) -> None:
    """Sets the OS name of these threads of this process (15 bytes at most, the kernel's limit)."""
    for tid in thread_ids:
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            with open(f"{TASKS}/{tid}/comm", "w") as comm:
                comm.write(name[:15])

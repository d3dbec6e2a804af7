"""CPU and memory accounting on a shared machine: the machine's busy time, the share of it that
other work used (the machine's busy time minus this process tree's), the CPU and resident memory
of a process tree (tritonserver and its Python stubs), and the CPU of each thread of a process
by its OS name, so that a benchmark can tell an engine thread from the rest of its stub.

    python -m harness.accounting --wait-quiet 0.3    # block until other work pauses
"""
import argparse
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def process_cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds of a process and of its children that ended and that it reaped (the kernel adds
    those to the parent): a server's stub that was killed and reaped still counts, in its server."""
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def threads_cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds of a process's own threads, without the children it reaped."""
    times = process.cpu_times()
    return times.user + times.system


def own_cpu_seconds() -> float:
    """CPU seconds of this process and every process it started: live ones (a server and its
    stubs) through psutil, finished ones (perf_analyzer, a stopped server, a stub killed and reaped
    by its server) through the children's times the kernel adds up when they are reaped."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += process_cpu_seconds(process)
    return total


class OtherWork:
    """The cores that work other than this process and its children used since it was made (the
    machine is shared); as a context manager, the value is frozen at the end of the block."""

    def __init__(self):
        self._busy, self._own, self._start = machine_busy_seconds(), own_cpu_seconds(), time.monotonic()
        self._frozen: Optional[float] = None

    @property
    def cores(self) -> float:
        if self._frozen is not None:
            return self._frozen
        others = machine_busy_seconds() - self._busy - (own_cpu_seconds() - self._own)
        return max(0.0, others / max(time.monotonic() - self._start, 1e-9))

    def __enter__(self) -> "OtherWork":
        return self

    def __exit__(self, *exc) -> None:
        self._frozen = self.cores


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    total = 0
    for process in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process tree, its reaped descendants included (process_cpu_seconds)."""
    total = 0.0
    for process in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process_cpu_seconds(process)
    return total


def server_rss_by_process(server_pid: int) -> dict[str, int]:
    """Resident bytes of tritonserver ("tritonserver") and of each of its stubs by instance name."""
    from tritonfront.watchdog import live_stubs

    stubs = live_stubs(server_pid)
    out = {}
    for process in process_tree(server_pid):
        with contextlib.suppress(psutil.Error):
            name = stubs[process.pid][1] if process.pid in stubs else process.name()
            out[name] = process.memory_info().rss
    return out


def model_cpu_seconds(server_pid: int, model: str) -> float:
    """CPU seconds of the Python stubs (one per instance) of one model of a server."""
    from tritonfront.watchdog import live_stubs

    total = 0.0
    for pid, (name, _) in live_stubs(server_pid).items():
        if name == model:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
    return total


def parse_task_stat(text: str) -> tuple[str, float]:
    """(thread name, CPU seconds) from /proc/<pid>/task/<tid>/stat. The name (comm) sits in
    parentheses and may itself hold spaces and parentheses, so the fields after it are counted
    from the last ')'; utime and stime are fields 14 and 15, in clock ticks."""
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of a process's live threads, summed per thread name (threads nobody named
    share the process's name)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            name, seconds = parse_task_stat((task / "stat").read_text())
            out[name] = out.get(name, 0.0) + seconds
    return out


def thread_cpu_by_id(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of a process by its kernel id (names are no reliable key:
    an OpenMP worker takes the name of whichever thread first entered a parallel region)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            out[int(task.name)] = parse_task_stat((task / "stat").read_text())[1]
    return out


def split_thread_cpu(pid: int, names: tuple[str, ...]) -> tuple[float, float]:
    """(CPU seconds of the threads called one of `names`, of all the others) of a process."""
    seconds = thread_cpu_seconds(pid)
    named = sum(s for name, s in seconds.items() if name in names)
    return named, sum(seconds.values()) - named


class Sampler(threading.Thread):
    """Calls `read()` every `every` seconds until stopped; samples are (time.perf_counter(), value)."""

    def __init__(self, read: Callable[[], object], every: float = 0.5):
        super().__init__(daemon=True)
        self.read, self.every = read, every
        self.samples: list[tuple[float, object]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.every):
            self.samples.append((time.perf_counter(), self.read()))

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def values(self) -> list:
        return [value for _, value in self.samples]

    def between(self, start: float, end: float) -> list:
        return [value for t, value in self.samples if start <= t <= end]


def wait_for_quiet(max_cores: float = 0.3, window_s: float = 20.0, timeout_s: float = 900.0) -> float:
    """Blocks until the machine's busy CPU over `window_s` is under `max_cores` (other work
    sharing it has paused) or `timeout_s` passes; returns the last window's busy cores."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy, start = machine_busy_seconds(), time.monotonic()
        time.sleep(window_s)
        cores = (machine_busy_seconds() - busy) / (time.monotonic() - start)
        print(f"machine busy: {cores:.2f} cores over {window_s:g} s", flush=True)
        if cores < max_cores or time.monotonic() > deadline:
            return cores


def main() -> None:
    parser = argparse.ArgumentParser(description="wait until other work on the machine pauses")
    parser.add_argument("--wait-quiet", type=float, default=0.3, metavar="CORES")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    wait_for_quiet(args.wait_quiet, timeout_s=args.timeout)


if __name__ == "__main__":
    main()

"""What the threads of a live process do, from py-spy's sampling of their Python stacks.

py-spy (`record --format raw --threads --nonblocking`) samples every thread's Python stack at a
fixed rate without stopping the process, and keeps only the samples in which the thread was not
idle (running or runnable, by its OS state): a thread's samples over all sampling rounds are the
share of the wall time it worked rather than waited (for work, a lock, I/O). A thread inside a C
call (a matmul) shows the Python frame that made the call. A thread's role is told from its
stacks (a generation loop thread runs GenerationLoop._run, an engine thread transformers'
continuous batching), never from its OS name. Threads with no Python stack (OpenMP workers,
Triton's IPC threads) never appear in the samples: their CPU is what the per-thread accounting
finds beside the sampled threads.
"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

LINE = re.compile(r"^thread \((\d+)\)(?:: (?P<name>[^;]*?))?(?P<frames>(?:;.*)?) (?P<count>\d+)$")
ROUNDS = re.compile(r"Samples: (\d+)")
FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str


@dataclass
class Profile:
    rounds: int  # sampling rounds: a thread busy throughout has this many samples
    threads: dict  # kernel thread id -> ThreadProfile

    def busy_fraction(self, tid: int) -> float:
        return self.threads[tid].samples / self.rounds if tid in self.threads and self.rounds else 0.0


@dataclass
class ThreadProfile:
    name: str  # Python's name of the thread, as py-spy read it
    stacks: Counter = field(default_factory=Counter)  # tuple[Frame, ...] outermost first -> samples

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    def runs(self, predicate: Callable[[Frame], bool]) -> bool:
        """Whether most of its samples pass through a frame that `predicate` accepts."""
        passing = sum(count for stack, count in self.stacks.items() if any(predicate(f) for f in stack))
        return passing * 2 > self.samples


def parse_raw(text: str) -> dict[int, ThreadProfile]:
    """py-spy's raw (collapsed) output with --threads, by kernel thread id."""
    threads: dict[int, ThreadProfile] = {}
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if not match:
            continue
        frames = []
        for part in match["frames"].split(";")[1:]:
            frame = FRAME.match(part)
            frames.append(Frame(frame["function"], frame["file"]) if frame else Frame(part, ""))
        profile = threads.setdefault(int(match[1]), ThreadProfile(""))
        profile.name = profile.name or match["name"] or ""
        profile.stacks[tuple(frames)] += int(match["count"])
    return threads


def py_spy() -> str:
    """The py-spy of this interpreter's environment (requirements-dev.txt), or the one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed: pip install -r requirements-dev.txt")
    return found


def start_recording(pid: int, seconds: float, rate: int = 100) -> tuple[subprocess.Popen, Path]:
    """Starts py-spy on `pid` for `seconds`; finish_recording reads what it wrote."""
    out = Path(tempfile.mkstemp(prefix="py-spy-", suffix=".txt")[1])
    process = subprocess.Popen([py_spy(), "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                                "--rate", str(rate), "--format", "raw", "--threads", "--nonblocking",
                                "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return process, out


def finish_recording(process: subprocess.Popen, out: Path, timeout: float = 60) -> Profile:
    said = process.communicate(timeout=timeout)[0].decode(errors="replace")
    try:
        rounds = ROUNDS.search(said)
        if process.returncode != 0 or not rounds:
            raise RuntimeError(f"py-spy failed ({process.returncode}): {said[-500:]}")
        return Profile(int(rounds[1]), parse_raw(out.read_text()))
    finally:
        out.unlink(missing_ok=True)


def dump(pid: int, timeout: float = 60) -> dict[int, ThreadProfile]:
    """Every Python thread of `pid` now, idle ones included (py-spy dump), by kernel thread id:
    what `roles` needs for threads a recording may not catch working."""
    said = subprocess.run([py_spy(), "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True,
                          text=True, timeout=timeout)
    if said.returncode != 0:
        raise RuntimeError(f"py-spy dump failed ({said.returncode}): {(said.stdout + said.stderr)[-500:]}")
    threads = {}
    for thread in json.loads(said.stdout):
        stack = tuple(Frame(frame["name"], frame["short_filename"]) for frame in reversed(thread["frames"]))
        threads[thread["os_thread_id"]] = ThreadProfile(thread["thread_name"] or "", Counter({stack: 1}))
    return threads


def merged(*sources: dict[int, ThreadProfile]) -> dict[int, ThreadProfile]:
    """The stacks of each thread over several dumps and recordings."""
    threads: dict[int, ThreadProfile] = {}
    for source in sources:
        for tid, profile in source.items():
            into = threads.setdefault(tid, ThreadProfile(profile.name))
            into.name = into.name or profile.name
            into.stacks.update(profile.stacks)
    return threads


def roles(threads: dict[int, ThreadProfile], rules: Sequence[tuple[str, Callable[[Frame], bool]]],
          default: str = "other Python threads") -> dict[int, str]:
    """Each sampled thread's role: the first rule whose frames most of its samples pass through."""
    return {tid: next((role for role, predicate in rules if profile.runs(predicate)), default)
            for tid, profile in threads.items()}

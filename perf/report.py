"""perf/results/<name>.md and .png: the machine, the date, the exact command, the machine's load
at start and end (other work shares these 2 cores), the numbers and the targets."""
import datetime
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib

from serving import machine_busy_seconds, own_cpu_seconds

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"


def cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import torch

    return (f"{cpu_model()}, {os.cpu_count()} cores, {memory:.0f} GiB RAM, "
            f"{'GPU' if has_gpu() else 'no GPU'}; Python {platform.python_version()}, torch {torch.__version__}")


def command() -> str:
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def table(headers: list[str], rows: list[list]) -> str:
    def cell(value):
        if isinstance(value, float):
            return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(value: float, target: float, unit: str = "x") -> str:
    return f"{value:.2f}{unit} (target >= {target:g}{unit}: {'met' if value >= target else 'MISSED'})"


class Report:
    def __init__(self, name: str, title: str):
        self.name, self.title = name, title
        self.started = datetime.datetime.now().astimezone()
        self.load_start = loadavg()
        self.sections: list[str] = []
        # Other work on the machine moves every number: the load average through the run, and
        # the CPU that processes other than this benchmark's (itself, its server and stubs, its
        # perf_analyzer) used, from the machine's busy time minus theirs.
        self.loads: list[float] = []
        self._busy_start, self._own_start, self._wall_start = (machine_busy_seconds(), own_cpu_seconds(),
                                                               time.monotonic())
        self._stop = threading.Event()
        threading.Thread(target=self._sample_load, daemon=True).start()

    def _sample_load(self) -> None:
        while True:
            self.loads.append(os.getloadavg()[0])
            if self._stop.wait(5):
                return

    def other_work_cores(self) -> float:
        others = machine_busy_seconds() - self._busy_start - (own_cpu_seconds() - self._own_start)
        return max(0.0, others / (time.monotonic() - self._wall_start))

    def add(self, text: str) -> None:
        self.sections.append(text)
        print(text, flush=True)

    def write(self, figure=None) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self._stop.set()
        mean_load, max_load = sum(self.loads) / len(self.loads), max(self.loads)
        others = self.other_work_cores()
        warning = ([f"**The machine was busy**: other work used {others:.2f} of the {os.cpu_count()} cores on "
                    "average during this run. Comparisons made within the run (interleaved) hold better than its "
                    "absolute numbers.", ""] if others > 0.25 else [])
        header = [
            f"# {self.title}", "",
            "| | |", "|---|---|",
            f"| machine | {machine()} |",
            f"| date | {self.started:%Y-%m-%d %H:%M %Z} |",
            f"| command | `{command()}` (from the repository root) |",
            f"| load average (1/5/15 min) at start | {self.load_start} |",
            f"| load average at end | {loadavg()} |",
            f"| 1-minute load average during the run | mean {mean_load:.2f}, max {max_load:.2f} |",
            f"| CPU used by other work during the run | {others:.2f} cores (machine busy time minus this benchmark's processes) |",
            "",
            *warning,
        ]
        path = RESULTS / f"{self.name}.md"
        path.write_text("\n".join(header) + "\n" + "\n\n".join(self.sections) + "\n")
        if figure is not None:
            figure.savefig(RESULTS / f"{self.name}.png", dpi=110, bbox_inches="tight")
            plt.close(figure)
        print(f"wrote {path}", flush=True)
        return path


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


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="wait until other work on the machine pauses")
    parser.add_argument("--wait-quiet", type=float, default=0.3, metavar="CORES")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    wait_for_quiet(args.wait_quiet, timeout_s=args.timeout)

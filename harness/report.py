"""Result files of a benchmark: <name>.md (the machine, the date, the exact command, the load
average through the run and the CPU other work used, then the benchmark's sections) and
<name>.png. Published runs (--publish) write them to perf/results/ (committed); others to
perf/results/raw/ (ignored by git), where raw JSON and server logs always go."""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

from .accounting import OtherWork
from .paths import RAW, RESULTS, ROOT

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OTHER_WORK_WARNING = 0.25  # cores


def argument_parser(doc: str, **options) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring as description, --publish, and one --flag per option
    (flag_name=default, or (default, help), or (default, help, more argparse keywords)); the type
    is the default's, a list default takes several values."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publish", action="store_true",
                        help="write the result to perf/results/ (committed); without it, to perf/results/raw/")
    for name, option in options.items():
        default, help_text, more = (*option, {})[:3] if isinstance(option, tuple) else (option, None, {})
        kind = {"nargs": "+", "type": type(default[0])} if isinstance(default, list) else (
            {} if default is None else {"type": type(default)})
        parser.add_argument(f"--{name.replace('_', '-')}", default=default, help=help_text, **{**kind, **more})
    return parser


def start(doc: str, name: str, title: str, **options) -> tuple[argparse.Namespace, "Report"]:
    """Parses a benchmark's command line (see argument_parser) and starts its Report."""
    args = argument_parser(doc, **options).parse_args()
    return args, Report(name, title, args.publish)


def cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = "GPU" if Path("/dev/nvidia0").exists() else "no GPU"
    import torch

    return (f"{cpu_model()}, {os.cpu_count()} cores, {memory:.0f} GiB RAM, {gpu}; "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def command(argv: Optional[Sequence[str]] = None) -> str:
    """The command line as run from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *argv[1:]])


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A markdown table; floats to 3 significant digits (1 decimal from 10 on)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(value: float, target: float, unit: str = "x", at_most: bool = False) -> str:
    """"1.23x (target >= 2x: MISSED)"; `at_most`: the target is an upper bound."""
    met = value <= target if at_most else value >= target
    return f"{value:.2f}{unit} (target {'<=' if at_most else '>='} {target:g}{unit}: {'met' if met else 'MISSED'})"


class Report:
    def __init__(self, name: str, title: str, publish: bool = False, directory: Optional[Path] = None):
        self.name, self.title = name, title
        self.directory = directory or (RESULTS if publish else RAW)
        self.started = datetime.datetime.now().astimezone()
        self._wall_start = time.monotonic()
        self.load_start = loadavg()
        self.sections: list[str] = []
        # Other work on the machine moves every number: the load average through the run, and
        # the CPU that processes other than this benchmark's used.
        self.loads: list[float] = []
        self.others = OtherWork()
        self._stop = threading.Event()
        threading.Thread(target=self._sample_load, daemon=True).start()

    def _sample_load(self) -> None:
        while True:
            self.loads.append(os.getloadavg()[0])
            if self._stop.wait(5):
                return

    def add(self, text: str) -> None:
        self.sections.append(text)
        print(text, flush=True)

    def header(self) -> list[str]:
        others = self.others.cores
        warning = ([f"**The machine was busy**: other work used {others:.2f} of the {os.cpu_count()} cores on "
                    "average during this run. Comparisons made within the run (interleaved) hold better than its "
                    "absolute numbers.", ""] if others > OTHER_WORK_WARNING else [])
        return [
            f"# {self.title}", "",
            "| | |", "|---|---|",
            f"| machine | {machine()} |",
            f"| date | {self.started:%Y-%m-%d %H:%M %Z} |",
            f"| run time | {(time.monotonic() - self._wall_start) / 60:.1f} min |",
            f"| command | `{command()}` (from the repository root) |",
            f"| load average (1/5/15 min) at start | {self.load_start} |",
            f"| load average at end | {loadavg()} |",
            f"| 1-minute load average during the run | mean {sum(self.loads) / len(self.loads):.2f}, "
            f"max {max(self.loads):.2f} |",
            f"| CPU used by other work during the run | {others:.2f} cores (machine busy time minus this "
            "benchmark's processes) |",
            "", *warning]

    def write(self, figure=None) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stop.set()
        path = self.directory / f"{self.name}.md"
        path.write_text("\n".join(self.header()) + "\n" + "\n\n".join(self.sections) + "\n")
        if figure is not None:
            figure.savefig(self.directory / f"{self.name}.png", dpi=110, bbox_inches="tight")
            plt.close(figure)
        print(f"wrote {path}", flush=True)
        return path


def outcome_tables(tally, latency_is: dict[str, str]) -> str:
    """A harness.load.outcomes.Tally as markdown: per kind of request (in the order of
    `latency_is`, which says what each one's latency measures), the requests of each outcome, the
    unexpected ones and latency percentiles; then the unexpected messages and the overload ones."""
    from .load.outcomes import KINDS, REJECTED, TIMED_OUT
    from .stats import percentile

    total = tally.total()
    columns = [kind for kind in KINDS if total[kind]]
    order = list(latency_is) + sorted(set(tally.counts) - set(latency_is))
    rows = [[kind, counts["sent"], *(counts[k] for k in columns), counts["unexpected"],
             percentile([s * 1000 for s in tally.latencies[kind]], 50),
             percentile([s * 1000 for s in tally.latencies[kind]], 99), latency_is.get(kind, "")]
            for kind in order if (counts := tally.counts.get(kind))]
    rows.append(["**all**", total["sent"], *(total[k] for k in columns), total["unexpected"], "", "", ""])
    text = table(["request", "sent", *columns, "unexpected", "P50 ms", "P99 ms", "latency is"], rows)
    if total["unexpected"]:
        text += ("\n\nUnexpected outcomes (message: count):\n\n" +
                 "\n".join(f"- {kind}: `{message}`: {n}" for kind, counter in tally.unexpected_messages.items()
                           for message, n in counter.most_common(8)))
    overload = tally.messages[REJECTED] + tally.messages[TIMED_OUT]
    if overload:
        text += "\n\nRejected or timed out (overload):\n\n" + "\n".join(
            f"- `{m}`: {n}" for m, n in overload.most_common(5))
    return text


def memory_tables(total: dict, processes: dict[str, dict], after: Optional[int] = None) -> str:
    """Resident memory growth (harness.stats.window_growth of bytes over seconds) of a process
    tree, and of each process."""
    mib = lambda b: b / 2**20  # noqa: E731
    span = lambda pair: f"{pair[0] / 60:.1f}-{pair[1] / 60:.1f} min"  # noqa: E731
    rows = [[f"median over the first window ({span(total['early'])})", mib(total["base"])],
            [f"median over the last window ({span(total['late'])})", mib(total["end"])],
            ["largest sample", mib(total["peak"])],
            *([["at the end", mib(after)]] if after is not None else []),
            ["growth: last window vs first", f"{total['growth_end'] * 100:+.1f}%"],
            ["growth: largest sample vs first window", f"{total['growth_peak'] * 100:+.1f}%"],
            ["linear trend", f"{mib(total['slope']) * 60:+.2f} MiB/min"]]
    return (table(["", "RSS MiB (tritonserver + all stubs)"], rows) + "\n\nPer process (medians over the same "
            "windows):\n\n" + table(
                ["process", "first window MiB", "last window MiB", "change", "largest sample MiB", "trend MiB/min"],
                [[name, mib(g["base"]), mib(g["end"]), f"{g['growth_end'] * 100:+.1f}%" if g["base"] else "new",
                  mib(g["peak"]), f"{mib(g['slope']) * 60:+.2f}"] for name, g in processes.items()]))


def write_raw(name: str, data) -> Path:
    """perf/results/raw/<name>.json: the numbers behind a report, for a later look."""
    RAW.mkdir(parents=True, exist_ok=True)
    path = RAW / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    return path

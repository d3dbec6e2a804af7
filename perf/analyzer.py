"""perf_analyzer (Triton's C++ load generator) runs for the benchmarks: the CSV goes to
perf/results/perf_analyzer_<name>.csv, the console report (with the per-composing-model queue
and compute times of an ensemble) to perf/results/perf_analyzer_<name>.txt."""
import csv
import shlex
import subprocess
from pathlib import Path

from report import RESULTS


def run_perf_analyzer(grpc_url: str, model: str, input_file: Path, *load: str, name: str,
                      measurement_ms: int = 4000, max_trials: int = 6, stability: int = 100,
                      timeout: float = 300) -> list[dict]:
    """`load`: e.g. "--concurrency-range=8:64:8" or "--request-distribution=poisson",
    "--request-rate-range=50:200:50". Returns the CSV's rows (numbers as floats).

    `stability` is perf_analyzer's allowed spread (%) between its last 3 windows; its default
    (10) is never met on a shared 2-core machine, and perf_analyzer then reports nothing."""
    host = grpc_url.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"{grpc_url}: benchmarks only target a local server")
    RESULTS.mkdir(parents=True, exist_ok=True)
    csv_path, text_path = RESULTS / f"perf_analyzer_{name}.csv", RESULTS / f"perf_analyzer_{name}.txt"
    command = ["perf_analyzer", "-m", model, "-u", grpc_url, "-i", "grpc", "--input-data", str(input_file),
               "--shape", "text_input:1", "-p", str(measurement_ms), "-r", str(max_trials), "-s", str(stability),
               "--percentile", "99", "-f", str(csv_path), *load]
    print("+", shlex.join(command), flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        output, status = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, status = f"{expired.stdout or ''}{expired.stderr or ''}\n(timed out after {timeout} s)", -1
    text_path.write_text("$ " + shlex.join(command) + "\n\n" + output)
    if status != 0 or not csv_path.exists():
        print(output[-3000:], flush=True)
        return []
    with open(csv_path) as f:
        return [{k: (float(v) if _is_number(v) else v) for k, v in row.items()} for row in csv.DictReader(f)]


def _is_number(value: str) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False

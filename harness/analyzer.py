"""perf_analyzer, Triton's C++ load generator (its client costs the server less CPU than a Python
one): runs, their CSV and console reports (perf_analyzer_<name>.csv / .txt in the directory a
benchmark writes to), and what those say: per-composing-model times of an ensemble, and TTFT
and ITL of a streamed model from its profile export."""
import csv
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from .clients.kserve import check_loopback
from .stats import mean, percentile

_LEVEL = re.compile(r"^(Request concurrency|Request Rate): ([\d.]+)", re.M)
_COMPOSING = re.compile(r"^  (\w+), version: \d+\n(?:.*\n)*?\s+Avg request latency: (\d+) usec \(overhead (\d+) usec "
                        r"\+ queue (\d+) usec \+ compute input (\d+) usec \+ compute infer (\d+) usec \+ compute "
                        r"output (\d+) usec\)", re.M)


def run_perf_analyzer(grpc_url: str, model: str, input_file: Path, *load: str, name: str, out_dir: Path,
                      measurement_ms: int = 4000, max_trials: int = 6, stability: int = 100,
                      shape: Optional[str] = "text_input:1", timeout: float = 300) -> list[dict]:
    """`load`: e.g. "--concurrency-range=8:64:8", "--async" or "--request-distribution=poisson",
    "--request-rate-range=50:200:50". Returns the CSV's rows (numbers as floats); none when
    perf_analyzer failed or measured nothing stable (its console report says why).

    `stability` is perf_analyzer's allowed spread (%) between its last 3 windows; its default
    (10) is never met on a shared 2-core machine, and perf_analyzer then reports nothing."""
    check_loopback(grpc_url)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, text_path = out_dir / f"perf_analyzer_{name}.csv", out_dir / f"perf_analyzer_{name}.txt"
    csv_path.unlink(missing_ok=True)
    command = ["perf_analyzer", "-m", model, "-u", grpc_url, "-i", "grpc", "--input-data", str(input_file),
               *(["--shape", shape] if shape else []), "-p", str(measurement_ms), "-r", str(max_trials),
               "-s", str(stability), "--percentile", "99", "-f", str(csv_path), *load]
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


def write_text_input(texts: Sequence[str], path: Path, name: str = "text_input") -> Path:
    """--input-data file: one single-text request per entry, cycled through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": [{name: [text]} for text in texts]}))
    return path


def write_input(entries: list[dict], path: Path) -> Path:
    """--input-data file of whole requests (input name -> value or {"content", "shape"})."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": entries}))
    return path


def composing_breakdown(console: str) -> list[list]:
    """Rows of (load level, model, queue ms, compute ms, request latency ms) of each composing
    model of an ensemble, from perf_analyzer's console report."""
    rows = []
    levels = list(_LEVEL.finditer(console))
    for i, level in enumerate(levels):
        block = console[level.end(): levels[i + 1].start() if i + 1 < len(levels) else len(console)]
        for m in _COMPOSING.finditer(block):
            queue, c_in, c_infer, c_out = (int(x) / 1000 for x in m.group(4, 5, 6, 7))
            rows.append([level.group(2), m.group(1), queue, c_in + c_infer + c_out, int(m.group(2)) / 1000])
    return rows


def streaming_export_stats(path: Path) -> list[dict]:
    """TTFT, ITL and output tokens/s per experiment (concurrency) from a --profile-export-file of
    a streamed `generate`: every request's send timestamp, and each response's timestamp (ns) and
    outputs. TTFT: to the first response with text; ITL: between responses whose
    completion_tokens grew, per token."""
    data = json.loads(path.read_text())
    out = []
    for experiment in data["experiments"]:
        ttft, gaps, tokens, first_send, last_response, failed = [], [], 0, None, 0, 0
        for request in experiment["requests"]:
            sent, seen, previous, first = request["timestamp"], 0, None, None
            for at, output in zip(request.get("response_timestamps", []), request.get("response_outputs", [])):
                count = int(output.get("completion_tokens", seen))
                if first is None and output.get("text_output"):
                    first = at
                if count > seen:
                    if previous is not None:
                        gaps.append((at - previous) / 1e6 / (count - seen))
                    previous, seen = at, count
            if first is None:
                failed += 1
                continue
            first_send = sent if first_send is None else min(first_send, sent)
            last_response = max(last_response, request["response_timestamps"][-1])
            ttft.append((first - sent) / 1e6)
            tokens += seen
        seconds = (last_response - first_send) / 1e9 if first_send is not None else float("nan")
        out.append({"concurrency": experiment["experiment"]["value"], "requests": len(ttft), "failed": failed,
                    "ttft_mean": mean(ttft), "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
                    "itl_mean": mean(gaps), "itl_p99": percentile(gaps, 99), "tokens_per_s": tokens / seconds})
    return out

"""A tritonserver for a benchmark: the test suite's launcher, only the models the benchmark names
(explicit model control, so models other work adds to the repositories cost it nothing), and
its memory and CPU (tritonserver plus every Python stub it started)."""
import contextlib
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "perf" / "results" / "raw"  # server logs and raw JSON, not committed
sys.path.insert(0, str(ROOT / "tests"))

from triton_server import triton_server  # noqa: E402

COMMITTED = [ROOT / "model_repository", ROOT / "ensembles"]
BASELINES = ROOT / "perf" / "baseline_repository"


@contextlib.contextmanager
def benchmark_server(name: str, models: list[str], repositories: list[Path] = COMMITTED, attempts: int = 2):
    """Started again once if it dies while loading: the Python backend can abort at start-up
    (boost::interprocess::lock_exception) when the machine is overloaded."""
    RAW.mkdir(parents=True, exist_ok=True)
    extra = ("--model-control-mode=explicit", *(f"--load-model={m}" for m in models))
    for attempt in range(1, attempts + 1):
        stack = contextlib.ExitStack()
        try:
            server = stack.enter_context(triton_server(RAW / f"{name}.server.log", repositories, extra_args=extra))
        except RuntimeError as error:
            stack.close()
            if attempt == attempts:
                raise
            print(f"tritonserver failed to start, starting it again: {str(error)[-300:]}", flush=True)
            continue
        with stack:
            yield server
        return


def server_processes(server) -> list[psutil.Process]:
    root = psutil.Process(server.process.pid)
    return [root, *root.children(recursive=True)]


def server_rss(server) -> int:
    """Resident bytes of tritonserver and all its stubs."""
    total = 0
    for process in server_processes(server):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


def server_cpu_seconds(server) -> float:
    total = 0.0
    for process in server_processes(server):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def model_statistics(grpc_url: str, models: list[str], attempts: int = 5) -> dict[str, dict]:
    """Triton's cumulative per-model counters, to subtract around a load step: requests and the
    time they spent queued; executions (batches), the texts in them and their compute time.
    Retried: right after an overload step a starved server can miss a connection deadline, and
    the counters being cumulative, reading them a little later loses nothing."""
    import time

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    for attempt in range(attempts):
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            return _read_statistics(client, models)
        except InferenceServerException:
            if attempt == attempts - 1:
                raise
            time.sleep(5)
        finally:
            client.close()


def _read_statistics(client, models: list[str]) -> dict[str, dict]:
    out = {}
    for model in models:
        stats = client.get_inference_statistics(model, as_json=True, client_timeout=60)["model_stats"][0]
        inference = stats["inference_stats"]
        batches = stats.get("batch_stats", [])
        out[model] = {
            "requests": int(inference.get("success", {}).get("count", 0)),
            "queue_ns": int(inference.get("queue", {}).get("ns", 0)),
            "executions": sum(int(b["compute_infer"].get("count", 0)) for b in batches),
            "batched_inferences": sum(int(b["batch_size"]) * int(b["compute_infer"].get("count", 0)) for b in batches),
            "compute_ns": sum(int(b[k].get("ns", 0)) for b in batches
                              for k in ("compute_input", "compute_infer", "compute_output")),
        }
    return out


def statistics_delta(before: dict, after: dict) -> dict[str, dict]:
    """Per model over a step: mean batch (texts per execution), mean queue ms per request, mean
    compute ms per execution."""
    out = {}
    for model, end in after.items():
        d = {key: end[key] - before[model][key] for key in end}
        executions, requests = max(d["executions"], 1), max(d["requests"], 1)
        out[model] = {
            "requests": d["requests"], "executions": d["executions"],
            "mean_batch": d["batched_inferences"] / executions,
            "queue_ms_per_request": d["queue_ns"] / requests / 1e6,
            "compute_ms_per_execution": d["compute_ns"] / executions / 1e6,
        }
    return out


def machine_busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def composing_observer(server, models: list[str]):
    """observe() before a load step returns finish(), which gives each model's statistics_delta
    over the step, the whole server's CPU use (cores busy) and `other_cpu`: the cores that work
    other than this process and the server used meanwhile (the machine is shared)."""
    import time

    def observe():
        stats = model_statistics(server.grpc_url, models)
        cpu, own, busy, start = server_cpu_seconds(server), own_cpu_seconds(), machine_busy_seconds(), time.perf_counter()

        def finish() -> dict:
            wall = time.perf_counter() - start
            server_cpu = server_cpu_seconds(server) - cpu
            others = machine_busy_seconds() - busy - (own_cpu_seconds() - own)
            out = statistics_delta(stats, model_statistics(server.grpc_url, models))
            out["server_cpu"] = round(server_cpu / wall, 3)
            out["other_cpu"] = round(max(others, 0.0) / wall, 3)
            return out

        return finish

    return observe


def step_observer(server):
    """A loadgen.sweep `observe` hook: the stepped model's counters and the server's CPU."""
    def observe(model: str):
        finish = composing_observer(server, [model])()

        def flat() -> dict:
            out = finish()
            return {**{k: round(v, 3) if isinstance(v, float) else v for k, v in out[model].items()},
                    "server_cpu": out["server_cpu"], "other_cpu": out["other_cpu"]}

        return flat

    return observe


def write_variant(model: str, name: str, target: Path, replacements: list[tuple[str, str]]) -> Path:
    """A copy of model_repository/<model> as `name` under `target` with its config.pbtxt edited
    by regex (pattern, replacement) pairs, each of which must match; 1/model.py is a link to the
    committed one, so the variant differs in configuration only."""
    import re

    config = (ROOT / "model_repository" / model / "config.pbtxt").read_text()
    for pattern, replacement in [(rf'^name: "{model}"', f'name: "{name}"'), *replacements]:
        config, found = re.subn(pattern, replacement, config, flags=re.M)
        if not found:
            raise ValueError(f"{model}/config.pbtxt: nothing matches {pattern!r}")
    folder = target / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.py").symlink_to(ROOT / "model_repository" / model / "1" / "model.py")
    return folder


def own_cpu_seconds() -> float:
    """CPU seconds of this process and every process it started: live ones (the server and its
    stubs) through psutil, finished ones (perf_analyzer, a stopped server) through the
    children's times the kernel adds up when they are reaped."""
    import os

    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


@contextlib.contextmanager
def other_work():
    """Yields a dict whose "cores" becomes, on exit, the cores that work other than this process
    and its children used during the block: the machine is shared."""
    import time

    box: dict = {}
    busy, own, start = machine_busy_seconds(), own_cpu_seconds(), time.perf_counter()
    yield box
    others = machine_busy_seconds() - busy - (own_cpu_seconds() - own)
    box["cores"] = max(others, 0.0) / (time.perf_counter() - start)

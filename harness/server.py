"""A real tritonserver for tests and benchmarks, started through scripts/serve.sh on free loopback
ports, in its own process group so that stopping it stops every Python stub it started.

`openai=True` starts serve.sh's OpenAI front too, on a free port, and waits until it answers
/health; otherwise the front is off (OPENAI_PORT=0). serve.sh runs tritonfront.watchdog beside the
server unless `watchdog` is False (a test that drives its own watchdog); the repository API opens
only with the server's `repository_key`, which the harness chooses. With a companion serve.sh
supervises tritonserver, else it becomes tritonserver: `Server.pid` is tritonserver's own pid
either way (its stubs are its children; the llm's tables are named by it); `Server.process` is
serve.sh.

`models` loads only the models named (a benchmark then pays nothing for models added to the
repositories). The Python backend can abort while loading on an overloaded machine
(boost::interprocess::lock_exception, seen once): that abort, and only that one, gets a second
start."""
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import psutil

from .paths import COMMITTED, RAW, ROOT

KNOWN_STARTUP_ABORT = "boost::interprocess"
# E-level lines Triton logs at start on a machine without a GPU; they say nothing about a run.
NO_GPU_NOTICES = ("CudaDriverHelper", "CUDA driver version is insufficient", "NVML")
EXPLICIT_ALL = ("--model-control-mode=explicit", "--load-model=*")


# A stop with nothing in flight takes a few seconds (test_nothing_in_flight holds one under load to
# 10 s), and serve.sh's exit timeout (10 s) bounds what Triton waits for a model it never releases;
# past this, the drain or a stub's exit held the stop, or a caller's longer exit timeout ran out.
STOP_LIMIT_S = 15.0
IN_FLIGHT = re.compile(r"(?:Found|has) (\d+) (?:model versions that have )?in-flight inferences")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Server:
    http_port: int
    grpc_port: int
    metrics_port: int
    process: subprocess.Popen
    log_path: Path
    repository_key: str = ""  # the value of the header that opens the repository API (serve.sh)
    openai_port: Optional[int] = None
    triton_pid: Optional[int] = None

    @property
    def pid(self) -> int:
        """tritonserver's pid (serve.sh's own when it became tritonserver)."""
        if self.triton_pid is None:
            self.triton_pid = tritonserver_pid(self.process.pid)
        return self.triton_pid

    @property
    def openai_url(self) -> str:
        """The OpenAI API's base URL (…/v1), for the openai SDK's base_url."""
        if self.openai_port is None:
            raise RuntimeError("this server was started without its OpenAI front (openai=True)")
        return f"http://127.0.0.1:{self.openai_port}/v1"

    def openai_health(self) -> tuple[int, dict]:
        """(status, JSON body) of the front's /health; (0, {}) while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.openai_port}/health", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")
        except OSError:
            return 0, {}

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def in_flight_lines(self) -> list[str]:
        """Triton's lines while it stops that report in-flight inferences ("Found N model versions
        that have in-flight inferences", "Model 'generate' (version 1) has N in-flight inferences"), N > 0."""
        return [line for line in self.log().splitlines() if (m := IN_FLIGHT.search(line)) and int(m.group(1)) > 0]

    def error_lines(self) -> list[str]:
        """Error-level log lines, tracebacks and crashes, without the no-GPU start-up notices."""
        return [line for line in self.log().splitlines()
                if (re.match(r"^E\d{4} ", line) or "Traceback" in line or "Segmentation" in line)
                and not any(notice in line for notice in NO_GPU_NOTICES)]

    def crashed(self) -> bool:
        return "Segmentation" in self.log() or not self.is_ready()


def tritonserver_pid(serve_pid: int) -> int:
    """The pid of the tritonserver serve.sh runs: serve.sh itself once it exec'd it, else its child."""
    process = psutil.Process(serve_pid)
    if process.name() == "tritonserver":
        return serve_pid
    for child in process.children():
        if child.name() == "tritonserver":
            return child.pid
    raise LookupError(f"no tritonserver under serve.sh (pid {serve_pid})")


def repositories_variable(repositories: Iterable[Path]) -> str:
    """TRITONFRONT_REPOSITORIES: colon-separated, as PATH, so folders with spaces work."""
    paths = [str(r) for r in repositories]
    for path in paths:
        if ":" in path:
            raise ValueError(f"model repository {path!r}: a ':' cannot be passed in TRITONFRONT_REPOSITORIES")
    return ":".join(paths)


@contextlib.contextmanager
def triton_server(log_path: Path, repositories: Optional[Iterable[Path]] = None, env: Optional[dict] = None,
                  timeout: float = 300, extra_args: tuple = (), models: Optional[Iterable[str]] = None,
                  attempts: int = 2, watchdog: bool = True, openai: bool = False):
    """Yields a ready Server; `repositories` default to serve.sh's (the committed ones)."""
    if models is not None:
        extra_args = ("--model-control-mode=explicit", *(f"--load-model={m}" for m in models), *extra_args)
    env = {"TRITONFRONT_REPOSITORY_KEY": secrets.token_hex(16), "TRITONFRONT_WATCHDOG": "1" if watchdog else "0",
           **(env or {})}
    for attempt in range(1, attempts + 1):
        try:
            server = _start(log_path, repositories, env, timeout, extra_args, openai)
        except StartupAbort as abort:
            if attempt == attempts:
                raise
            kept = Path(log_path).rename(f"{log_path}.attempt{attempt}")
            print(f"tritonserver aborted while loading (log: {kept}), starting it again: {str(abort)[-300:]}",
                  flush=True)
            continue
        try:
            yield server
        except BaseException:
            stop(server.process)
            raise
        took = stop(server.process)
        if took > STOP_LIMIT_S:
            waits = [line for line in server.log().splitlines() if "live models" in line]
            raise SlowStop(f"tritonserver took {took:.0f} s to stop after SIGTERM (limit {STOP_LIMIT_S:g} s); "
                           f"it waited for: {waits[-1] if waits else 'nothing it logged'} (log: {log_path})")
        return


class SlowStop(RuntimeError):
    """A server whose stop outlasted STOP_LIMIT_S: with nothing in flight it stops in a few
    seconds and a model that never unloads waits out serve.sh's 10 s exit timeout, so a longer
    stop is something else kept alive."""


class StartupAbort(RuntimeError):
    """The Python backend's known abort while loading models on a starved machine."""


def _start(log_path: Path, repositories, env, timeout: float, extra_args: tuple, openai: bool) -> Server:
    http, grpc, metrics, openai_port = free_ports(4)
    environment = dict(os.environ, HTTP_PORT=str(http), GRPC_PORT=str(grpc), METRICS_PORT=str(metrics),
                       OPENAI_PORT=str(openai_port if openai else 0), **(env or {}))
    if repositories:
        environment["TRITONFRONT_REPOSITORIES"] = repositories_variable(repositories)
    with open(log_path, "w") as log:
        process = subprocess.Popen([str(ROOT / "scripts" / "serve.sh"), *extra_args], stdout=log,
                                   stderr=subprocess.STDOUT, env=environment, start_new_session=True)
    server = Server(http, grpc, metrics, process, Path(log_path), environment["TRITONFRONT_REPOSITORY_KEY"],
                    openai_port if openai else None)
    try:
        deadline = time.monotonic() + timeout
        while not server.is_ready() or (openai and server.openai_health()[0] != 200):
            if process.poll() is not None:
                log_text = server.log()
                error = StartupAbort if KNOWN_STARTUP_ABORT in log_text else RuntimeError
                raise error(f"tritonserver exited with {process.returncode}:\n{log_text[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tritonserver not ready after {timeout}s:\n{server.log()[-4000:]}")
            time.sleep(0.5)
    except BaseException:
        stop(process)
        raise
    return server


def benchmark_server(name: str, models: Iterable[str], repositories: Iterable[Path] = COMMITTED, **kwargs):
    """A server loading only `models`, its log in perf/results/raw/<name>.server.log."""
    RAW.mkdir(parents=True, exist_ok=True)
    return triton_server(RAW / f"{name}.server.log", repositories, models=list(models), **kwargs)


def stop(process: subprocess.Popen) -> float:
    """SIGTERM to the server's process group, SIGKILL after 30 s; the seconds it took."""
    started = time.monotonic()
    if process.poll() is not None:
        return 0.0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return time.monotonic() - started

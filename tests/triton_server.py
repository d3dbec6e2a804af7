"""A real tritonserver for integration tests: started through scripts/serve.sh on free ports."""
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


@contextlib.contextmanager
def triton_server(log_path: Path, repositories: list[Path] | None = None, env: dict | None = None,
                  timeout: float = 300, extra_args: tuple = ()):
    http, grpc, metrics = free_ports(3)
    environment = dict(os.environ, HTTP_PORT=str(http), GRPC_PORT=str(grpc), METRICS_PORT=str(metrics), **(env or {}))
    if repositories:
        environment["TRITONFRONT_REPOSITORIES"] = ":".join(str(r) for r in repositories)
    log = open(log_path, "w")
    # Own process group: a stop kills tritonserver and every Python stub it started.
    process = subprocess.Popen([str(ROOT / "scripts" / "serve.sh"), *extra_args], stdout=log,
                               stderr=subprocess.STDOUT, env=environment, start_new_session=True)
    server = Server(http, grpc, metrics, process, log_path)
    try:
        deadline = time.monotonic() + timeout
        while not server.is_ready():
            if process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {process.returncode}:\n{server.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tritonserver not ready after {timeout}s:\n{server.log()[-4000:]}")
            time.sleep(0.5)
        yield server
    finally:
        stop(process)
        log.close()


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

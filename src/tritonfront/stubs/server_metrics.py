"""Reads Triton's own metrics from inside one of its Python stubs: how many requests wait in
Triton's queue of a model (nv_inference_pending_request_count: requests not handed to an
instance yet), which no model instance can see otherwise.

The metrics endpoint is found from the server's command line (the stub's parent is tritonserver),
so it follows whatever the server was started with, through scripts/serve.sh or not."""
import re
import urllib.request
from typing import Optional, Sequence

import psutil

DEFAULT_PORT, DEFAULT_ADDRESS = 8002, "0.0.0.0"
PENDING = "nv_inference_pending_request_count"
FALSE = ("false", "0", "off", "no")


def _flag(args: Sequence[str], name: str) -> Optional[str]:
    """The value of --name=VALUE or --name VALUE (the last one wins, as in getopt)."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def metrics_url(server_args: Sequence[str]) -> Optional[str]:
    """The /metrics URL of a tritonserver started with these arguments; None when its metrics
    are off. A wildcard bind address is reached on loopback."""
    if (_flag(server_args, "allow-metrics") or "true").lower() in FALSE:
        return None
    port = int(_flag(server_args, "metrics-port") or DEFAULT_PORT)
    address = _flag(server_args, "metrics-address") or DEFAULT_ADDRESS
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/metrics"


def pending_requests(metrics: str, model: str) -> Optional[int]:
    """Requests in Triton's queue of `model`, all versions; None when the model has no sample."""
    pattern = re.compile(rf'^{PENDING}\{{([^}}]*)\}} (\S+)$', re.M)
    values = [float(value) for labels, value in pattern.findall(metrics) if f'model="{model}"' in labels.split(",")]
    return int(sum(values)) if values else None


class PendingRequests:
    """Callable: Triton's queue length of one model now, None when it cannot be read."""

    def __init__(self, model: str, server_pid: int, timeout_s: float = 2.0):
        self.model, self.timeout_s = model, timeout_s
        try:
            self.url = metrics_url(psutil.Process(server_pid).cmdline())
        except psutil.Error:
            self.url = None

    def __call__(self) -> Optional[int]:
        if self.url is None:
            return None
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                return pending_requests(response.read().decode(), self.model)
        except OSError:  # the metrics server starts after the models load, and may be busy
            return None

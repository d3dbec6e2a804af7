"""Reads Triton's own metrics from inside one of its Python stubs: how many requests wait in
Triton's queue of a model (nv_inference_pending_request_count: requests not handed to an
instance yet), which no model instance can see otherwise.

The metrics endpoint is found from the server's command line (the stub's parent is tritonserver;
tritonfront.triton.flags reads it)."""
import re
import urllib.request
from typing import Optional

import psutil

from ..triton.flags import PENDING_REQUESTS, metrics_url


def pending_requests(metrics: str, model: str) -> Optional[int]:
    """Requests in Triton's queue of `model`, all versions; None when the model has no sample."""
    pattern = re.compile(rf'^{PENDING_REQUESTS}\{{([^}}]*)\}} (\S+)$', re.M)
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

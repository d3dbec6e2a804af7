"""A rank's load: what the balancing table and the metrics endpoint publish about one `llm`
instance, and which metric changes a new load makes."""
import threading
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Load:
    """This instance's share of the work, as the balancing gate and the metrics see it."""

    outstanding_tokens: int = 0  # prompt + generated tokens of every unfinished request
    waiting_requests: int = 0  # queued, no token generated yet
    active_sequences: int = 0  # unfinished requests
    cancelled_requests: int = 0  # since start, abandoned streams included
    kv_cache_blocks: int = 0  # held by unfinished requests, as the engine counts them


@dataclass(frozen=True)
class MetricSpec:
    name: str
    description: str
    kind: str  # "gauge", "counter" or "histogram"


# Load field -> the gauge that shows it, labelled by model and rank.
LOAD_GAUGES = {
    "outstanding_tokens": MetricSpec("tritonfront_llm_outstanding_tokens",
                                     "Prompt and generated tokens of unfinished requests", "gauge"),
    "waiting_requests": MetricSpec("tritonfront_llm_waiting_requests", "Requests with no token generated yet", "gauge"),
    "active_sequences": MetricSpec("tritonfront_llm_active_sequences", "Unfinished requests", "gauge"),
    "kv_cache_blocks": MetricSpec("tritonfront_llm_kv_cache_blocks", "KV cache blocks held by unfinished requests",
                                  "gauge"),
}
CANCELLED_REQUESTS = MetricSpec("tritonfront_llm_cancelled_requests_total",
                                "Requests cancelled or abandoned by their client", "counter")


class LoadMetrics:
    """Turns each new load into the metric calls it needs: a gauge is set only when its value
    changed, the counter grows by the cancellations since the last load. `metric` makes the
    metric of a spec (an object with set() or increment()); the loop thread and Triton's execute
    thread both publish loads, hence the lock."""

    def __init__(self, metric: Callable[[MetricSpec], Any]):
        self.gauges = {field: metric(spec) for field, spec in LOAD_GAUGES.items()}
        self.cancelled = metric(CANCELLED_REQUESTS)
        self._last = Load()
        self._lock = threading.Lock()

    def update(self, load: Load) -> None:
        with self._lock:
            for field, gauge in self.gauges.items():
                if getattr(load, field) != getattr(self._last, field):
                    gauge.set(getattr(load, field))
            if load.cancelled_requests > self._last.cancelled_requests:
                self.cancelled.increment(load.cancelled_requests - self._last.cancelled_requests)
            self._last = load

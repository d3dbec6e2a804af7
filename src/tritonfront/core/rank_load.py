"""A rank's load and a model's load: what the balancing table and the metrics endpoint publish
about the `llm` instances, and which metric changes a new load makes.

Each rank publishes its own gauges (labels model, rank). A router picking between replicas
(Gateway API Inference Extension's endpoint picker) reads one series per replica, so the model's
rank 0 also publishes the model's totals (label model), with the meaning of vLLM's
`vllm:num_requests_waiting`, `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`:
waiting counts the requests in Triton's queue of the model as well as those the ranks hold
without a token yet, since both wait to be scheduled; a rank cannot see Triton's queue, which
Triton itself exports (nv_inference_pending_request_count, tritonfront.stubs.server_metrics reads it).
The same totals go out a second time under the names of TensorRT-LLM's Triton backend
(ROUTER_GAUGES), which a stock router reads with no configuration.
"""
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Load:
    """This instance's share of the work, as the balancing gate and the metrics see it."""

    outstanding_tokens: int = 0  # prompt + generated tokens of every unfinished request
    waiting_requests: int = 0  # queued, no token generated yet
    active_sequences: int = 0  # unfinished requests
    cancelled_requests: int = 0  # since start, abandoned streams included
    kv_cache_blocks: int = 0  # held by unfinished requests, as the engine counts them
    kv_cache_capacity_blocks: int = 0  # the engine's whole KV cache; 0: the engine does not tell
    kv_cache_capacity_tokens: int = 0  # the same in tokens; 0: the engine does not tell
    # Since start, in prompt tokens (vLLM's prefix_cache_queries / prefix_cache_hits): looked up in
    # the engine's prefix cache, and found there (reused instead of computed).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def running_requests(self) -> int:
        """Unfinished requests that generated a token: in the engine's running batch."""
        return self.active_sequences - self.waiting_requests

    @property
    def kv_cache_utilization(self) -> float:
        """Held KV cache blocks as a fraction of the cache, 0..1 (0 when the capacity is unknown;
        a block that several requests share counts once per request, hence the cap)."""
        if self.kv_cache_capacity_blocks <= 0:
            return 0.0
        return min(1.0, self.kv_cache_blocks / self.kv_cache_capacity_blocks)


@dataclass(frozen=True)
class ModelLoad:
    """A model's load over its live ranks and Triton's queue."""

    waiting_requests: int = 0
    running_requests: int = 0
    kv_cache_utilization: float = 0.0
    kv_cache_max_blocks: int = 0  # the live ranks' whole KV caches (0: the engine does not tell)
    kv_cache_tokens_per_block: int = 0  # what one of those blocks holds

    @classmethod
    def of(cls, ranks: Sequence[Load], queued: int, tokens_per_block: int = 0) -> "ModelLoad":
        """`ranks`: the live ranks' loads; `queued`: requests in Triton's queue of the model;
        `tokens_per_block`: the engine's block size in tokens (the same on every rank)."""
        capacity = sum(rank.kv_cache_capacity_blocks for rank in ranks)
        held = sum(rank.kv_cache_blocks for rank in ranks)
        return cls(waiting_requests=queued + sum(rank.waiting_requests for rank in ranks),
                   running_requests=sum(rank.running_requests for rank in ranks),
                   kv_cache_utilization=min(1.0, held / capacity) if capacity > 0 else 0.0,
                   kv_cache_max_blocks=capacity, kv_cache_tokens_per_block=tokens_per_block)


@dataclass(frozen=True)
class ModelMetricSpec:
    name: str
    description: str
    kind: str  # "gauge", "counter" or "histogram"


# Load field -> the gauge that shows it, labelled by model and rank.
LOAD_GAUGES = {
    "outstanding_tokens": ModelMetricSpec("tritonfront_llm_outstanding_tokens",
                                          "Prompt and generated tokens of unfinished requests", "gauge"),
    "waiting_requests": ModelMetricSpec("tritonfront_llm_waiting_requests",
                                        "Requests this rank holds with no token generated yet", "gauge"),
    "active_sequences": ModelMetricSpec("tritonfront_llm_active_sequences", "Unfinished requests", "gauge"),
    "kv_cache_blocks": ModelMetricSpec("tritonfront_llm_kv_cache_blocks",
                                       "KV cache blocks held by unfinished requests", "gauge"),
    "running_requests": ModelMetricSpec("tritonfront_llm_running_requests",
                                        "Unfinished requests that generated a token (in the running batch)",
                                        "gauge"),
    "kv_cache_utilization": ModelMetricSpec("tritonfront_llm_kv_cache_utilization",
                                            "Fraction (0..1) of this rank's KV cache held by unfinished requests",
                                            "gauge"),
    "kv_cache_capacity_tokens": ModelMetricSpec("tritonfront_llm_kv_cache_capacity_tokens",
                                                "Tokens this rank's KV cache holds in all", "gauge"),
}
# Load field (a running total) -> the counter that shows it, labelled by model and rank.
LOAD_COUNTERS = {
    "cancelled_requests": ModelMetricSpec("tritonfront_llm_cancelled_requests_total",
                                          "Requests cancelled or abandoned by their client", "counter"),
    "prefix_cache_queries": ModelMetricSpec("tritonfront_llm_prefix_cache_queries_total",
                                            "Prompt tokens looked up in the engine's prefix cache "
                                            "(as vllm:prefix_cache_queries)", "counter"),
    "prefix_cache_hits": ModelMetricSpec("tritonfront_llm_prefix_cache_hits_total",
                                         "Prompt tokens found in the engine's prefix cache, their KV reused instead "
                                         "of computed (as vllm:prefix_cache_hits)", "counter"),
}

# ModelLoad field -> the gauge that shows it, labelled by model only: what a router reads.
MODEL_GAUGES = {
    "waiting_requests": ModelMetricSpec("tritonfront_num_requests_waiting",
                                        "Requests waiting to be scheduled: in Triton's queue of the model, or held "
                                        "by a rank with no token generated yet (as vllm:num_requests_waiting)",
                                        "gauge"),
    "running_requests": ModelMetricSpec("tritonfront_num_requests_running",
                                        "Requests in the ranks' running batches, summed over the ranks "
                                        "(as vllm:num_requests_running)", "gauge"),
    "kv_cache_utilization": ModelMetricSpec("tritonfront_kv_cache_utilization",
                                            "Fraction (0..1) of the ranks' KV caches held by unfinished requests "
                                            "(as vllm:kv_cache_usage_perc)", "gauge"),
}

# The model's totals again, under the metric families and labels TensorRT-LLM's Triton backend
# exports, which llm-d-router's built-in engine type `triton-tensorrt-llm` reads (v0.10.0,
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go: queued
# nv_trt_llm_request_metrics{request_type=waiting}, running {request_type=scheduled}, KV cache
# nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}, and the cache's size for its
# prefix scorers, {kv_cache_block_type=tokens_per} (tokens a block holds) and {..=max} (blocks,
# summed over the ranks: TensorRT-LLM's backend publishes them per model instance)). ModelLoad
# field -> (family, the labels that pick the series), each series also labelled by model.
TRT_LLM_REQUESTS = ModelMetricSpec("nv_trt_llm_request_metrics",
                                   "TensorRT-LLM backend request metrics, as tritonfront counts them (request_type "
                                   "waiting: as tritonfront_num_requests_waiting; scheduled: as "
                                   "tritonfront_num_requests_running)", "gauge")
TRT_LLM_KV_CACHE = ModelMetricSpec("nv_trt_llm_kv_cache_block_metrics",
                                   "TensorRT-LLM backend KV cache metrics, as tritonfront counts them "
                                   "(kv_cache_block_type fraction: as tritonfront_kv_cache_utilization; tokens_per: "
                                   "tokens one block holds; max: blocks in the ranks' KV caches)", "gauge")
ROUTER_GAUGES = {
    "waiting_requests": (TRT_LLM_REQUESTS, {"request_type": "waiting"}),
    "running_requests": (TRT_LLM_REQUESTS, {"request_type": "scheduled"}),
    "kv_cache_utilization": (TRT_LLM_KV_CACHE, {"kv_cache_block_type": "fraction"}),
    "kv_cache_tokens_per_block": (TRT_LLM_KV_CACHE, {"kv_cache_block_type": "tokens_per"}),
    "kv_cache_max_blocks": (TRT_LLM_KV_CACHE, {"kv_cache_block_type": "max"}),
}


class LoadMetrics:
    """Turns each new load into the metric calls it needs: a gauge is set only when its value
    changed, a counter grows by what its total grew since the last load. `metric` makes the
    metric of a spec (an object with set() or increment())."""

    def __init__(self, metric: Callable[[ModelMetricSpec], Any]):
        self.gauges = {field: metric(spec) for field, spec in LOAD_GAUGES.items()}
        self.counters = {field: metric(spec) for field, spec in LOAD_COUNTERS.items()}
        self._last = Load()
        self._lock = threading.Lock()

    def update(self, load: Load) -> None:
        with self._lock:
            for field, gauge in self.gauges.items():
                if getattr(load, field) != getattr(self._last, field):
                    gauge.set(getattr(load, field))
            for field, counter in self.counters.items():
                if getattr(load, field) > getattr(self._last, field):
                    counter.increment(getattr(load, field) - getattr(self._last, field))
            self._last = load


class ModelLoadMetrics:
    """Sets the model's gauges (MODEL_GAUGES, and ROUTER_GAUGES with their extra labels: `metric`
    takes them as `labels`) from the live ranks' loads (`ranks`) and Triton's queue of the model
    (`queued`: None when it cannot be read, then counted as 0), changed values only. One rank of
    a model does it: the gauges have no rank label.

    Triton's queue is read only while some rank holds a request: a read is a /metrics request
    to tritonserver (1.2 CPU ms here, half of it in the stub, 4 times a second), and with every
    rank empty the queue is empty too, since a rank's `execute` holds Triton's thread only while
    that rank is full or, with token balancing, has more outstanding tokens than another."""

    def __init__(self, ranks: Callable[[], Sequence[Load]], queued: Callable[[], Optional[int]],
                 metric: Callable[..., Any], tokens_per_block: int = 0):
        self.ranks, self.queued, self.tokens_per_block = ranks, queued, tokens_per_block
        self.gauges = [(field, metric(spec)) for field, spec in MODEL_GAUGES.items()]
        self.gauges += [(field, metric(spec, labels=labels)) for field, (spec, labels) in ROUTER_GAUGES.items()]
        self._last: Optional[ModelLoad] = None
        self._queue_unknown = False

    def update(self) -> ModelLoad:
        ranks = self.ranks()
        queued = 0
        if any(rank.active_sequences for rank in ranks):
            queued = self.queued()
            if queued is None and not self._queue_unknown:
                logger.warning("Triton's queue of the model cannot be read from its metrics endpoint: %s counts "
                               "only what the ranks hold", MODEL_GAUGES["waiting_requests"].name)
            self._queue_unknown = queued is None
        load = ModelLoad.of(ranks, queued or 0, self.tokens_per_block)
        for field, gauge in self.gauges:
            if self._last is None or getattr(load, field) != getattr(self._last, field):
                gauge.set(getattr(load, field))
        self._last = load
        return load


class GaugeThread:
    """Calls each of `updates` every `interval_s` from a thread of its own. A gauge's set() in a
    Triton Python stub is a round trip to tritonserver that holds the stub's GIL throughout
    (python_backend r24.10, Metric::SendSetValueRequest), stalling every thread of the stub: the
    threads that serve requests only record the latest load, and this thread sets the gauges."""

    def __init__(self, updates: Sequence[Callable[[], Any]], interval_s: float = 0.25):
        self.updates, self.interval_s = list(updates), interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritonfront-gauges", daemon=True)

    def update(self) -> None:
        for update in self.updates:
            try:
                update()
            except Exception:  # a metrics hiccup must not end the thread
                logger.exception("updating gauges failed")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.update()

    def start(self) -> "GaugeThread":
        self.update()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

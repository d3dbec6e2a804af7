"""Which metric calls a new load makes (changed gauges only, the counter by the difference), and
what the model's gauges a router reads add up to."""
import re
import threading

from tritonfront.core.rank_load import (LOAD_COUNTERS, LOAD_GAUGES, MODEL_GAUGES, ROUTER_GAUGES, GaugeThread, Load,
                                       LoadMetrics, ModelLoad, ModelLoadMetrics)


class Recorded:
    def __init__(self, spec, calls, labels=None):
        self.spec, self.calls, self.labels = spec, calls, labels

    def set(self, value):
        if self.labels:
            self.calls.append((self.spec.name, self.labels, "set", value))
        else:
            self.calls.append((self.spec.name, "set", value))

    def increment(self, value):
        self.calls.append((self.spec.name, "increment", value))


def test_only_changes_reach_the_metrics():
    calls, made = [], []
    metrics = LoadMetrics(lambda spec: made.append(spec) or Recorded(spec, calls))
    assert made == [*LOAD_GAUGES.values(), *LOAD_COUNTERS.values()]
    assert {spec.kind for spec in LOAD_GAUGES.values()} == {"gauge"}
    assert {spec.kind for spec in LOAD_COUNTERS.values()} == {"counter"}
    metrics.update(Load(outstanding_tokens=12, waiting_requests=1, active_sequences=1))
    assert calls == [("tritonfront_llm_outstanding_tokens", "set", 12), ("tritonfront_llm_waiting_requests", "set", 1),
                     ("tritonfront_llm_active_sequences", "set", 1)]
    calls.clear()
    metrics.update(Load(outstanding_tokens=12, waiting_requests=1, active_sequences=1))
    assert calls == []
    metrics.update(Load(outstanding_tokens=0, cancelled_requests=2, kv_cache_blocks=3, kv_cache_capacity_blocks=12))
    assert calls == [("tritonfront_llm_outstanding_tokens", "set", 0), ("tritonfront_llm_waiting_requests", "set", 0),
                     ("tritonfront_llm_active_sequences", "set", 0), ("tritonfront_llm_kv_cache_blocks", "set", 3),
                     ("tritonfront_llm_kv_cache_utilization", "set", 0.25),
                     ("tritonfront_llm_cancelled_requests_total", "increment", 2)]
    calls.clear()
    metrics.update(Load(cancelled_requests=5, kv_cache_blocks=3, kv_cache_capacity_blocks=12))
    assert calls == [("tritonfront_llm_cancelled_requests_total", "increment", 3)]
    metrics.update(Load(waiting_requests=1, active_sequences=4, cancelled_requests=5, kv_cache_blocks=3,
                        kv_cache_capacity_blocks=12))
    assert ("tritonfront_llm_running_requests", "set", 3) in calls
    calls.clear()
    # The prefix cache's totals in prompt tokens, and the cache's size in tokens.
    metrics.update(Load(waiting_requests=1, active_sequences=4, cancelled_requests=5, kv_cache_blocks=3,
                        kv_cache_capacity_blocks=12, kv_cache_capacity_tokens=12, prefix_cache_queries=100,
                        prefix_cache_hits=64))
    assert calls == [("tritonfront_llm_kv_cache_capacity_tokens", "set", 12),
                     ("tritonfront_llm_prefix_cache_queries_total", "increment", 100),
                     ("tritonfront_llm_prefix_cache_hits_total", "increment", 64)]


def test_a_rank_runs_what_generated_a_token_and_its_cache_is_a_fraction():
    load = Load(waiting_requests=2, active_sequences=5, kv_cache_blocks=6, kv_cache_capacity_blocks=8)
    assert load.running_requests == 3 and load.kv_cache_utilization == 0.75
    assert Load(kv_cache_blocks=3).kv_cache_utilization == 0.0  # an engine that does not tell its capacity
    # Blocks shared by requests count once per request: never above the whole cache.
    assert Load(kv_cache_blocks=9, kv_cache_capacity_blocks=8).kv_cache_utilization == 1.0


def test_the_model_waits_for_its_queue_and_its_ranks_and_runs_what_the_ranks_run():
    ranks = [Load(waiting_requests=1, active_sequences=4, kv_cache_blocks=2, kv_cache_capacity_blocks=8),
             Load(waiting_requests=0, active_sequences=3, kv_cache_blocks=6, kv_cache_capacity_blocks=8)]
    assert ModelLoad.of(ranks, queued=5, tokens_per_block=16) == ModelLoad(
        waiting_requests=6, running_requests=6, kv_cache_utilization=0.5, kv_cache_max_blocks=16,
        kv_cache_tokens_per_block=16)
    assert ModelLoad.of([], queued=2) == ModelLoad(waiting_requests=2)


METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_metric_names_are_prometheus_names_of_tritonfront():
    specs = [*LOAD_GAUGES.values(), *LOAD_COUNTERS.values(), *MODEL_GAUGES.values()]
    for spec in specs:
        assert METRIC_NAME.match(spec.name) and spec.name.startswith("tritonfront_") and ":" not in spec.name
    assert len({spec.name for spec in specs}) == len(specs)


def test_the_model_gauges_follow_the_ranks_and_the_queue_and_survive_an_unreadable_queue():
    calls = []
    queue = iter([3, 3, None])
    model = ModelLoadMetrics(lambda: [Load(waiting_requests=1, active_sequences=2, kv_cache_blocks=1,
                                           kv_cache_capacity_blocks=4)],
                             lambda: next(queue), lambda spec, labels=None: Recorded(spec, calls, labels),
                             tokens_per_block=1)
    assert model.update() == ModelLoad(4, 1, 0.25, kv_cache_max_blocks=4, kv_cache_tokens_per_block=1)
    assert calls == [("tritonfront_num_requests_waiting", "set", 4), ("tritonfront_num_requests_running", "set", 1),
                     ("tritonfront_kv_cache_utilization", "set", 0.25),
                     # the same totals under TensorRT-LLM backend's names (ROUTER_GAUGES)
                     ("nv_trt_llm_request_metrics", {"request_type": "waiting"}, "set", 4),
                     ("nv_trt_llm_request_metrics", {"request_type": "scheduled"}, "set", 1),
                     ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}, "set", 0.25),
                     # and the KV cache's size, which the picker's prefix scorers read
                     ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "tokens_per"}, "set", 1),
                     ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "max"}, "set", 4)]
    calls.clear()
    model.update()
    assert calls == []  # nothing changed
    assert model.update().waiting_requests == 1  # the queue unknown: what the ranks hold
    assert calls == [("tritonfront_num_requests_waiting", "set", 1),
                     ("nv_trt_llm_request_metrics", {"request_type": "waiting"}, "set", 1)]
    # Every model gauge has its router twin; the router's KV cache size has no tritonfront_ name.
    assert set(ROUTER_GAUGES) - set(MODEL_GAUGES) == {"kv_cache_tokens_per_block", "kv_cache_max_blocks"}
    assert set(MODEL_GAUGES) <= set(ROUTER_GAUGES)


def test_triton_s_queue_is_read_only_while_a_rank_holds_a_request():
    ranks, reads, calls = [[Load()], [Load(active_sequences=1)], [Load()]], [], []
    model = ModelLoadMetrics(lambda: ranks.pop(0), lambda: reads.append(1) or 2,
                             lambda spec, labels=None: Recorded(spec, calls, labels))
    assert model.update().waiting_requests == 0 and reads == []
    assert model.update().waiting_requests == 2 and reads == [1]
    assert model.update().waiting_requests == 0 and reads == [1]


def test_an_unreadable_queue_is_warned_of_once_across_idle_spells(caplog):
    ranks = iter([[Load(active_sequences=1)], [Load()], [Load(active_sequences=1)]])
    model = ModelLoadMetrics(lambda: next(ranks), lambda: None, lambda spec, labels=None: Recorded(spec, [], labels))
    for _ in range(3):
        model.update()
    assert sum("cannot be read" in record.message for record in caplog.records) == 1


def test_the_gauge_thread_updates_at_start_and_then_until_stopped():
    updated = threading.Event()
    count = []

    def update():
        count.append(1)
        if len(count) > 2:
            updated.set()
        if len(count) == 2:
            raise RuntimeError("a metrics hiccup")  # logged; the thread goes on

    gauges = GaugeThread([update], interval_s=0.01).start()
    assert count  # once at start, before any interval passed
    try:
        assert updated.wait(5)
    finally:
        gauges.stop()
    assert not gauges._thread.is_alive()

"""Which metric calls a new load makes: changed gauges only, the counter by the difference."""
from tritonfront.load import CANCELLED_REQUESTS, LOAD_GAUGES, Load, LoadMetrics


class Recorded:
    def __init__(self, spec, calls):
        self.spec, self.calls = spec, calls

    def set(self, value):
        self.calls.append((self.spec.name, "set", value))

    def increment(self, value):
        self.calls.append((self.spec.name, "increment", value))


def test_only_changes_reach_the_metrics():
    calls, made = [], []
    metrics = LoadMetrics(lambda spec: made.append(spec) or Recorded(spec, calls))
    assert made == [*LOAD_GAUGES.values(), CANCELLED_REQUESTS]
    assert {spec.kind for spec in LOAD_GAUGES.values()} == {"gauge"} and CANCELLED_REQUESTS.kind == "counter"
    metrics.update(Load(outstanding_tokens=12, waiting_requests=1, active_sequences=1))
    assert calls == [("tritonfront_llm_outstanding_tokens", "set", 12), ("tritonfront_llm_waiting_requests", "set", 1),
                     ("tritonfront_llm_active_sequences", "set", 1)]
    calls.clear()
    metrics.update(Load(outstanding_tokens=12, waiting_requests=1, active_sequences=1))
    assert calls == []
    metrics.update(Load(outstanding_tokens=0, cancelled_requests=2, kv_cache_blocks=3))
    assert calls == [("tritonfront_llm_outstanding_tokens", "set", 0), ("tritonfront_llm_waiting_requests", "set", 0),
                     ("tritonfront_llm_active_sequences", "set", 0), ("tritonfront_llm_kv_cache_blocks", "set", 3),
                     ("tritonfront_llm_cancelled_requests_total", "increment", 2)]
    calls.clear()
    metrics.update(Load(cancelled_requests=5, kv_cache_blocks=3))
    assert calls == [("tritonfront_llm_cancelled_requests_total", "increment", 3)]

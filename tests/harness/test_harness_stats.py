"""Percentiles, medians, ratios and growth: a missing value (NaN, None) is left out, never zero;
and the Prometheus text and Triton statistics the benchmarks subtract."""
import math

import numpy as np
import pytest

from harness.stats import (latency_summary, mean, median, median_rate, median_ratio, percentile, ratio,
                           window_growth)
from harness.load.threads import poll
from harness.triton_metrics import (counters, histogram, histogram_delta, histogram_quantile, llm_gauges, metric_sum,
                                    metric_value, rank_values, samples, statistics_delta)


def test_percentiles_skip_missing_values_and_are_nan_when_nothing_is_left():
    values = [float("nan"), 1.0, None, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5 and percentile(values, 100) == 4.0 and percentile(values, 0) == 1.0
    assert mean(values) == 2.5 and median(values) == 2.5 and median([5.0, 1.0, 3.0]) == 3.0
    for empty in ([], [None, float("nan")]):
        assert math.isnan(percentile(empty, 99)) and math.isnan(mean(empty)) and math.isnan(median(empty))
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)


def test_ratio_is_nan_without_a_denominator():
    assert ratio(3.0, 2.0) == 1.5
    for numerator, denominator in ((1.0, 0.0), (1.0, None), (None, 1.0), (float("nan"), 1.0), (1.0, float("nan"))):
        assert math.isnan(ratio(numerator, denominator))
    # Each round compared within itself, then the median: one noisy round does not decide.
    assert median_ratio([(2.0, 1.0), (3.0, 1.0), (100.0, 1.0), (1.0, 0.0)]) == 3.0


def test_latency_summary_in_milliseconds():
    summary = latency_summary([0.001, 0.002, 0.003, None])
    assert summary["mean_ms"] == pytest.approx(2.0) and summary["p50_ms"] == pytest.approx(2.0)
    assert summary["max_ms"] == pytest.approx(3.0)
    assert math.isnan(latency_summary([])["p99_ms"])


def test_window_growth_compares_medians_of_the_first_and_last_windows():
    times = list(range(0, 610, 10))
    values = [100.0 + t / 60 for t in times]  # 100 -> 110 over ten minutes
    values[3] = values[-3] = 1000.0  # one spike in each window: the medians do not see it
    growth = window_growth(times, values, window=60)
    # The 4th of 7 sorted values, the spike being the largest of its window.
    assert growth["base"] == pytest.approx(100 + 40 / 60) and growth["end"] == pytest.approx(100 + 570 / 60)
    assert growth["growth_end"] == pytest.approx(growth["end"] / growth["base"] - 1)
    assert growth["peak"] == 1000.0 and growth["growth_peak"] == pytest.approx(1000 / growth["base"] - 1)
    assert growth["early"] == (0, 60) and growth["late"] == (540, 600)
    assert window_growth(times, [100.0 + t / 60 for t in times], 60)["slope"] == pytest.approx(1 / 60)
    with pytest.raises(ValueError):
        window_growth([], [], 60)


def test_median_rate_runs_at_least_the_minimum():
    runs = []
    rate = median_rate(lambda: runs.append(1) or 10, seconds=0.0, min_runs=3)
    assert len(runs) == 3 and rate > 0


METRICS = """# HELP nv_inference_exec_count Number of model executions performed
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="encoder",version="1"} 12
nv_inference_exec_count{model="embed",version="1"} 40
tritonfront_llm_outstanding_tokens{model="llm",rank="0"} 120
tritonfront_llm_outstanding_tokens{model="llm",rank="1"} 80
tritonfront_llm_outstanding_tokens{model="llm_none",rank="0"} 5
tritonfront_llm_step_seconds_bucket{model="llm",rank="0",le="0.01"} 10
tritonfront_llm_step_seconds_bucket{le="0.02",model="llm",rank="0"} 30
tritonfront_llm_step_seconds_bucket{model="llm",rank="0",le="+Inf"} 40
tritonfront_llm_step_seconds_sum{model="llm",rank="0"} 0.9
tritonfront_llm_step_seconds_count{model="llm",rank="0"} 40
"""


def test_prometheus_samples_by_labels():
    assert samples(METRICS, "nv_inference_exec_count")[0] == ({"model": "encoder", "version": "1"}, 12.0)
    assert metric_value(METRICS, "nv_inference_exec_count", model="embed", version="1") == 40
    with pytest.raises(LookupError):
        metric_value(METRICS, "tritonfront_llm_outstanding_tokens", model="llm")  # two ranks
    assert metric_sum(METRICS, "tritonfront_llm_outstanding_tokens", model="llm") == 200
    assert metric_sum(METRICS, "tritonfront_llm_outstanding_tokens") == 205
    assert metric_sum(METRICS, "tritonfront_llm_kv_cache_blocks") is None
    assert rank_values(METRICS, "tritonfront_llm_outstanding_tokens") == {"llm/0": 120, "llm/1": 80, "llm_none/0": 5}


def test_llm_gauges_sum_the_ranks_of_one_model():
    gauges = llm_gauges(METRICS + 'nv_inference_pending_request_count{model="llm",version="1"} 3\n')
    assert gauges["outstanding_tokens"] == 200 and gauges["pending_requests"] == 3
    assert gauges["kv_cache_blocks"] is None  # not exported: absent, not 0
    assert llm_gauges(METRICS, "llm_none")["outstanding_tokens"] == 5


def test_poll_returns_the_first_true_value_or_none_after_the_timeout():
    values = iter([0, None, 7, 8])
    assert poll(lambda: next(values), timeout=5, every=0.001) == 7
    assert poll(lambda: 0, timeout=0.05, every=0.01) is None


def test_histogram_in_any_label_order_and_its_quantiles():
    h = histogram(METRICS, "tritonfront_llm_step_seconds", model="llm", rank="0")
    assert h["le"].tolist() == [0.01, 0.02, math.inf] and h["cumulative"].tolist() == [10, 30, 40]
    assert h["count"] == 40 and h["sum"] == 0.9
    assert histogram_quantile(h, 0.25) == pytest.approx(0.01)  # the 10th of 40 at the first bound
    assert histogram_quantile(h, 0.5) == pytest.approx(0.015)  # halfway into the second bucket
    assert histogram_quantile(h, 0.99) == 0.02  # beyond the last finite bound: that bound
    empty = histogram_delta(h, h)
    assert empty["count"] == 0 and math.isnan(histogram_quantile(empty, 0.5))
    with pytest.raises(LookupError):
        histogram(METRICS, "tritonfront_llm_step_seconds", model="llm", rank="1")


def test_statistics_delta_per_execution_and_per_request():
    def stats(requests, queue_ns, executions, batch_size):
        return {"model_stats": [{"inference_stats": {"success": {"count": requests}, "queue": {"ns": queue_ns}},
                                 "batch_stats": [{"batch_size": batch_size,
                                                  "compute_input": {"count": executions, "ns": executions * 1e6},
                                                  "compute_infer": {"count": executions, "ns": executions * 8e6},
                                                  "compute_output": {"count": executions, "ns": executions * 1e6}}]}]}

    before, after = counters(stats(10, 0, 5, 2)), counters(stats(110, 200e6, 25, 5))
    delta = statistics_delta({"m": before}, {"m": after})["m"]
    assert delta["requests"] == 100 and delta["executions"] == 20
    assert delta["mean_batch"] == pytest.approx((25 * 5 - 5 * 2) / 20)
    assert delta["queue_ms_per_request"] == pytest.approx(2.0) and delta["compute_ms_per_execution"] == 10.0
    assert np.isfinite(statistics_delta({"m": before}, {"m": before})["m"]["mean_batch"])

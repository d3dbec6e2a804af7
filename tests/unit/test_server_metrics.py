"""Where a stub finds its server's metrics, and Triton's queue length of one model in them."""
import pytest

from tritonfront.stubs.server_metrics import PendingRequests, metrics_url, pending_requests

METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="llm",version="1"} 7
nv_inference_pending_request_count{model="llm",version="2"} 1
nv_inference_pending_request_count{model="llm_tokenizer",version="1"} 3
nv_inference_queue_duration_us{model="llm",version="1"} 12345
"""


@pytest.mark.parametrize("args, url", [
    (["tritonserver"], "http://127.0.0.1:8002/metrics"),
    (["tritonserver", "--metrics-address=127.0.0.2", "--metrics-port=9102"], "http://127.0.0.2:9102/metrics"),
    (["tritonserver", "--metrics-port", "9103", "--metrics-address", "0.0.0.0"], "http://127.0.0.1:9103/metrics"),
    (["tritonserver", "--metrics-address=::"], "http://[::1]:8002/metrics"),
    (["tritonserver", "--metrics-address=[::]"], "http://[::1]:8002/metrics"),
    (["tritonserver", "--metrics-address=fd00::5"], "http://[fd00::5]:8002/metrics"),
    (["tritonserver", "--metrics-port=1", "--metrics-port=2"], "http://127.0.0.1:2/metrics"),
    (["tritonserver", "--allow-metrics=false"], None),
])
def test_the_metrics_endpoint_follows_the_server_flags(args, url):
    assert metrics_url(args) == url


def test_pending_requests_sum_the_versions_of_one_model_only():
    assert pending_requests(METRICS, "llm") == 8
    assert pending_requests(METRICS, "llm_tokenizer") == 3
    assert pending_requests(METRICS, "encoder") is None


def test_an_unreachable_endpoint_reads_as_unknown():
    reader = PendingRequests("llm", server_pid=1)
    reader.url = "http://127.0.0.1:9/metrics"  # the discard port: nothing listens
    assert reader() is None

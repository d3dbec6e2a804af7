"""Waits until no request is in flight in tritonserver, for scripts/serve.sh to run between the
SIGTERM it receives and the one it passes on.

Triton 2.51 cannot finish a streamed `generate` or `ensemble` request once it is told to stop:
its stop makes every model's scheduler refuse new requests (core: InferenceServer::Stop ->
StopAllModels -> DynamicBatchScheduler::Stop), and the requests an ensemble sends to its next step
for each streamed chunk (the detokenizer's) are new requests. Seen here: SIGTERM to serve.sh with
16 streams running, every stream stopped at its next chunk and tritonserver reported the 16 in
flight until its exit timeout (30 s) ran out. So serve.sh waits for this first, while Triton still
serves; a Kubernetes pod that is stopping is no longer a Service endpoint, so the streams it holds
end and no new ones come.

In flight, as Triton's metrics show it: the llm's unfinished requests (tritonfront_llm_active_sequences,
every rank; a stream counts until its last chunk was handed on) and the requests queued at any
model (nv_inference_pending_request_count). Both at zero for QUIET_S in a row (the gauges are set
every 0.25 s; the last chunk still crosses the detokenizer) is drained. A short request such as
`embed` is not counted while a model computes it: it takes milliseconds, and the quiet period
lets it end.

    python -m tritonfront.watchdog.drain --metrics-url http://127.0.0.1:8002/metrics --timeout 30

Exit status 0 when drained, 1 when the timeout passed first or the metrics could not be read
(then the caller stops the server anyway: waiting longer would only delay the stop).
"""
import argparse
import sys
import time
import urllib.request
from typing import Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

IN_FLIGHT_FAMILIES = ("tritonfront_llm_active_sequences", "nv_inference_pending_request_count")
QUIET_S = 1.0
POLL_S = 0.2


def in_flight(metrics_text: str) -> int:
    """The requests in flight that `metrics_text` (Triton's /metrics) shows."""
    return int(sum(sample.value for family in text_string_to_metric_families(metrics_text)
                   if family.name in IN_FLIGHT_FAMILIES for sample in family.samples))


def drain(read_metrics: Callable[[], str], timeout_s: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> tuple[bool, Optional[int]]:
    """Polls until nothing was in flight for QUIET_S or `timeout_s` passed: (drained, the last
    count seen; None when the metrics could not be read)."""
    deadline = clock() + timeout_s
    quiet_since, count = None, None
    while True:
        try:
            count = in_flight(read_metrics())
        except (OSError, ValueError):
            return False, None
        now = clock()
        if count:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= QUIET_S:
            return True, 0
        if now >= deadline:
            return False, count
        sleep(POLL_S)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics-url", required=True, help="Triton's metrics endpoint, http://host:port/metrics")
    parser.add_argument("--timeout", type=float, required=True, help="seconds to wait at most")
    args = parser.parse_args(argv)

    def read_metrics() -> str:
        with urllib.request.urlopen(args.metrics_url, timeout=5) as response:
            return response.read().decode()

    started = time.monotonic()
    drained, count = drain(read_metrics, args.timeout)
    took = time.monotonic() - started
    if drained:
        print(f"serve.sh: drained in {took:.1f} s, stopping tritonserver", file=sys.stderr)
        return 0
    if count is None:
        print(f"serve.sh: cannot read {args.metrics_url}, stopping tritonserver without draining", file=sys.stderr)
    else:
        print(f"serve.sh: {count} requests still in flight after {took:.1f} s "
              f"(TRITONFRONT_DRAIN_TIMEOUT), stopping tritonserver", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

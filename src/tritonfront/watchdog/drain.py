"""Waits until tritonserver's llm holds no unfinished request and no model has a queued one, for
scripts/serve.sh to run between the SIGTERM it receives and the one it passes on.

Triton 2.51 cannot finish a streamed `generate` or `ensemble` request once it is told to stop:
its stop makes every model's scheduler refuse new requests (core: InferenceServer::Stop ->
StopAllModels -> DynamicBatchScheduler::Stop), and the requests an ensemble sends to its next step
for each streamed chunk (the detokenizer's) are new requests. Seen here: SIGTERM to serve.sh with
16 streams running, every stream stopped at its next chunk and tritonserver reported the 16 in
flight until its exit timeout (30 s) ran out. So serve.sh waits for this first, while Triton still
serves; a Kubernetes pod that is stopping is no longer a Service endpoint, so the streams it holds
end and no new ones come. Before waiting it sets the server's stop flag (core/server_stop.py): the
llm ranks then refuse new requests UNAVAILABLE (a client or router retries elsewhere) and, after
their stop_grace_ms (20 s, inside the 30 s default wait), end what they still hold with the text so
far and finish reason "cancelled", so a stream with no end in sight cannot hold the stop.

In flight, as Triton's metrics show it: the llm's unfinished requests (tritonfront_llm_active_sequences,
every rank; a stream counts until its last chunk was handed on) and the requests queued at any
model (nv_inference_pending_request_count). Both at zero for QUIET_S in a row (the gauges are set
every 0.25 s; the last chunk still crosses the detokenizer) is drained. A short request such as
`embed` is not counted while a model computes it: it takes milliseconds, and the quiet period
lets it end.

    python -m tritonfront.watchdog.drain --server-pid PID --timeout 30

The metrics endpoint is found from tritonserver's command line (tritonfront.triton.flags). Exit
status 0 when drained, 1 when the timeout passed first, the metrics are off or refuse connections
(then the caller stops the server anyway: waiting longer would only delay the stop).
"""
import argparse
import http.client
import sys
import time
import urllib.error
import urllib.request
from typing import Callable, Optional

import psutil
from prometheus_client.parser import text_string_to_metric_families

from ..core.rank_load import LOAD_GAUGES
from ..core.server_stop import request_stop
from ..triton.flags import PENDING_REQUESTS, metrics_url

IN_FLIGHT_FAMILIES = (LOAD_GAUGES["active_sequences"].name, PENDING_REQUESTS)
QUIET_S = 1.0
POLL_S = 0.2
READ_TIMEOUT_S = 5.0


def in_flight(metrics_text: str) -> int:
    """The requests in flight that `metrics_text` (Triton's /metrics) shows."""
    return int(sum(sample.value for family in text_string_to_metric_families(metrics_text)
                   if family.name in IN_FLIGHT_FAMILIES for sample in family.samples))


def drain(read_metrics: Callable[[float], str], timeout_s: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> tuple[bool, Optional[int]]:
    """Polls until nothing was in flight for QUIET_S, or nothing is at `timeout_s`: (drained, the
    last count seen; None when none could be read). `read_metrics(timeout)` gives the metrics text.
    A refused connection ends the wait (no metrics server: it is not up yet, or gone); a slow or
    broken read is tried again until the timeout (a busy server answers late)."""
    deadline = clock() + timeout_s
    quiet_since, count = None, None
    while True:
        try:
            count = in_flight(read_metrics(max(0.1, min(READ_TIMEOUT_S, deadline - clock()))))
        except ConnectionRefusedError:
            return False, None
        except (OSError, http.client.HTTPException, ValueError):
            pass  # count keeps the last reading
        now = clock()
        if count:
            quiet_since = None
        elif count == 0 and quiet_since is None:
            quiet_since = now
        elif count == 0 and now - quiet_since >= QUIET_S:
            return True, 0
        if now >= deadline:
            return count == 0, count
        sleep(POLL_S)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-pid", type=int, required=True, help="tritonserver's pid")
    parser.add_argument("--timeout", type=float, required=True, help="seconds to wait at most")
    args = parser.parse_args(argv)
    try:
        url = metrics_url(psutil.Process(args.server_pid).cmdline())
    except psutil.Error:
        print("serve.sh: tritonserver is gone, nothing to drain", file=sys.stderr)
        return 1
    if url is None:
        print("serve.sh: tritonserver's metrics are off, stopping it without draining", file=sys.stderr)
        return 1

    def read_metrics(timeout: float) -> str:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return response.read().decode()
        except urllib.error.URLError as error:  # urllib wraps a refused connection, which drain() tells apart
            if isinstance(error.reason, ConnectionRefusedError):
                raise error.reason from error
            raise

    started = time.monotonic()
    # The llm ranks take no new request from now on and end what they hold after their grace
    # period (core/server_stop.py), so the wait below ends even under load.
    request_stop(args.server_pid)
    drained, count = drain(read_metrics, args.timeout)
    took = time.monotonic() - started
    if drained:
        print(f"serve.sh: drained in {took:.1f} s, stopping tritonserver", file=sys.stderr)
        return 0
    if count is None:
        print(f"serve.sh: cannot read {url}, stopping tritonserver without draining", file=sys.stderr)
    else:
        print(f"serve.sh: {count} requests still in flight after {took:.1f} s "
              f"(TRITONFRONT_DRAIN_TIMEOUT), stopping tritonserver", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

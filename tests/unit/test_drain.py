"""tritonfront.watchdog.drain's reading of Triton's metrics and its wait, on made-up metrics and a
fake clock (the SIGTERM path through serve.sh: tests/integration/test_graceful_stop.py)."""
import os
import http.client
import socket
import subprocess
import sys
from time import monotonic

import pytest

from tritonfront.core.server_stop import request_stop, stop_flag_path, stop_requested
from tritonfront.watchdog.drain import POLL_S, QUIET_S, drain, in_flight, main


def metrics(rank0: int, rank1: int = 0, queued_llm: int = 0, queued_encoder: int = 0) -> str:
    return f"""# HELP tritonfront_llm_active_sequences Unfinished requests
# TYPE tritonfront_llm_active_sequences gauge
tritonfront_llm_active_sequences{{model="llm",rank="0"}} {rank0}
tritonfront_llm_active_sequences{{model="llm",rank="1"}} {rank1}
# HELP tritonfront_llm_running_requests Unfinished requests that generated a token
# TYPE tritonfront_llm_running_requests gauge
tritonfront_llm_running_requests{{model="llm",rank="0"}} 7
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="llm",version="1"}} {queued_llm}
nv_inference_pending_request_count{{model="encoder",version="1"}} {queued_encoder}
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="llm",version="1"}} 120
"""


def test_in_flight_counts_every_ranks_unfinished_requests_and_every_models_queue_only():
    assert in_flight(metrics(3, 2, queued_llm=4, queued_encoder=1)) == 10
    assert in_flight(metrics(0)) == 0
    assert in_flight("") == 0  # a server without the llm: nothing of it in flight


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_drained_once_nothing_was_in_flight_for_the_quiet_period():
    time = FakeTime()
    counts = iter([5, 2, 0, 1] + [0] * 100)  # a request arrives in the quiet period: it starts again
    reads = []

    def read(timeout: float) -> str:
        reads.append(time.now)
        return metrics(next(counts))

    assert drain(read, timeout_s=30, clock=time.clock, sleep=time.sleep) == (True, 0)
    quiet_from = reads[4]  # the read after the last busy one
    assert quiet_from + QUIET_S <= time.now + 1e-9 <= quiet_from + QUIET_S + POLL_S + 1e-9


def test_gives_up_at_the_timeout_with_the_last_count():
    time = FakeTime()
    assert drain(lambda timeout: metrics(4, 1), timeout_s=2, clock=time.clock, sleep=time.sleep) == (False, 5)
    assert time.now == pytest.approx(2, abs=POLL_S)


def test_nothing_in_flight_at_the_timeout_is_drained_even_if_not_for_the_whole_quiet_period():
    time = FakeTime()
    counts = iter([3] * 9 + [0] * 100)
    assert drain(lambda timeout: metrics(next(counts)), timeout_s=2, clock=time.clock, sleep=time.sleep) == (True, 0)


def test_a_refused_connection_ends_the_wait_at_once():
    def read(timeout: float) -> str:
        raise ConnectionRefusedError("refused")

    time = FakeTime()
    assert drain(read, timeout_s=30, clock=time.clock, sleep=time.sleep) == (False, None)
    assert time.now == 0


@pytest.mark.parametrize("failure", [TimeoutError("timed out"), http.client.IncompleteRead(b""),
                                     ConnectionResetError("reset"), ValueError("not metrics")])
def test_a_slow_or_broken_read_is_tried_again_and_a_read_never_outlasts_the_timeout(failure):
    time = FakeTime()
    timeouts = []
    answers = iter([failure, metrics(2), failure, failure] + [metrics(0)] * 100)

    def read(timeout: float) -> str:
        timeouts.append(timeout)
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert drain(read, timeout_s=30, clock=time.clock, sleep=time.sleep) == (True, 0)
    assert max(timeouts) <= 5


def test_metrics_never_read_give_up_at_the_timeout_with_no_count():
    time = FakeTime()
    timeouts = []

    def read(timeout: float) -> str:
        timeouts.append(timeout)
        raise TimeoutError("timed out")

    assert drain(read, timeout_s=3, clock=time.clock, sleep=time.sleep) == (False, None)
    assert timeouts[0] == 3 and max(timeouts) <= 3  # no read outlasts what is left of the wait


def test_a_server_whose_metrics_refuse_connections_is_stopped_at_once(capsys):
    """Through urllib, which wraps a refused connection: SIGTERM while tritonserver starts, before
    its metrics endpoint listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--metrics-port={port}",
                                   "--metrics-address=127.0.0.1"])
        try:
            started = monotonic()
            assert main(["--server-pid", str(server.pid), "--timeout", "30"]) == 1
            assert monotonic() - started < 10
            # The llm ranks were told first: they take no new request and end the running ones.
            assert stop_requested(server.pid)
        finally:
            server.kill()
            server.wait()
            stop_flag_path(server.pid).unlink(missing_ok=True)
    assert f"cannot read http://127.0.0.1:{port}/metrics" in capsys.readouterr().err


def test_a_stop_flag_stops_only_the_server_that_had_the_pid(tmp_path):
    """Pids are reused: a flag left by a server that is gone must not stop a later one with its pid."""
    me = os.getpid()
    assert not stop_requested(me, tmp_path)
    flag = request_stop(me, tmp_path)
    assert stop_requested(me, tmp_path)
    flag.write_text("1")  # as written for an earlier process with this pid
    assert not stop_requested(me, tmp_path)

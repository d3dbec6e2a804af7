"""SIGTERM to scripts/serve.sh alone, as `docker stop` (through tini) and Kubernetes send it, while
`generate` streams run: every stream ends whole, and the server then stops with nothing in flight.

Triton 2.51 cannot finish a stream once it stops (tritonfront.watchdog.drain says why): before
serve.sh waited for the requests in flight, every stream stopped at its next chunk and tritonserver
reported them in flight until its 30 s exit timeout ran out (16 of 16 streams in a run here)."""
import os
import signal
import time

import pytest

from harness.clients.kserve import generate_inputs
from harness.clients.streams import Streams, run_requests
from harness.deploy import GENERATE_MODELS, write_deployment
from harness.server import triton_server
from tritonfront.core.generation_loop import STOP_CHECK_S
from tritonfront.core.server_stop import stop_requested
from tritonfront.watchdog import live_stubs, running

PROMPTS = ["The lighthouse keeper wrote in his log that", "A short list of reasons to learn chess:",
           "Once the river froze, the village", "The recipe needs three things:"]
MAX_TOKENS = 40
STOP_S = 60  # the drain (the streams' last tokens) and Triton's own stop, on a loaded 2-core machine


SHORT_GRACE_MS = 3000  # the unbounded stream's test waits this out instead of the committed 20 s


@pytest.fixture
def server(tmp_path):
    repositories = write_deployment(tmp_path / "deployment", keep=GENERATE_MODELS)
    with triton_server(tmp_path / "server.log", repositories=repositories, models=GENERATE_MODELS) as running:
        yield running


@pytest.fixture
def short_grace_server(tmp_path):
    repositories = write_deployment(tmp_path / "deployment", "--set", f"llm.stop_grace_ms={SHORT_GRACE_MS}",
                                    keep=GENERATE_MODELS)
    with triton_server(tmp_path / "server.log", repositories=repositories, models=GENERATE_MODELS) as running:
        yield running


def start_unbounded_stream(streams: Streams) -> None:
    """A stream without max_tokens (it could run to the context's end), once it has sent a chunk."""
    streams.send("long", generate_inputs(PROMPTS[0], None, stream=True))
    deadline = time.monotonic() + 120
    while not streams.responses["long"]:
        assert time.monotonic() < deadline, "the stream sent nothing in 120 s"
        time.sleep(0.05)


def test_sigterm_lets_running_streams_end_whole_then_stops_with_nothing_in_flight(server):
    requests = {f"p{i}": prompt for i, prompt in enumerate(PROMPTS)}
    whole = run_requests(server.grpc_url, {rid: generate_inputs(text, MAX_TOKENS, stream=False)
                                           for rid, text in requests.items()})
    streams = Streams(server.grpc_url)
    try:
        for rid, text in requests.items():
            streams.send(rid, generate_inputs(text, MAX_TOKENS, stream=True))
        deadline = time.monotonic() + 120
        while not all(streams.responses[rid] for rid in requests):
            assert time.monotonic() < deadline, "the streams sent nothing in 120 s"
            time.sleep(0.05)
        assert not any(streams.done[rid].is_set() for rid in requests), "a stream ended before the stop began"
        stopping = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)  # serve.sh alone, not its process group
        streams.wait(requests, timeout=STOP_S)
        assert not streams.errors, streams.errors
        for rid in requests:
            assert "".join(streams.texts(rid)) == whole[rid][0][0], rid
            assert streams.last(rid, "finish_reason").decode() == whole[rid][1], rid
    finally:
        # Cancelled: a stream still open would hold tritonserver's gRPC shutdown, and this close, forever.
        streams.close(cancel=True)
    server.process.wait(timeout=STOP_S)
    took = time.monotonic() - stopping
    log = server.log()
    assert "serve.sh: drained in" in log, log[-2000:]
    in_flight = server.in_flight_lines()
    assert not in_flight, in_flight[-5:]
    print(f"SIGTERM -> streams ended and serve.sh gone: {took:.1f} s")


def test_sigterm_ends_an_unbounded_stream_cleanly_and_refuses_new_requests(short_grace_server):
    """A stream without max_tokens (it could run to the context's end) does not hold the stop: after
    the llm's grace (stop_grace_ms, here 3 s) it ends with its text so far and finish reason cancelled;
    a request sent meanwhile is refused UNAVAILABLE; nothing stays in flight."""
    server = short_grace_server
    streams = Streams(server.grpc_url)
    try:
        start_unbounded_stream(streams)
        stopping = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        # The drain (a Python process serve.sh starts) sets the flag; the llm looks every STOP_CHECK_S.
        while not stop_requested(server.pid):
            assert time.monotonic() - stopping < 30, "the drain set no stop flag in 30 s"
            time.sleep(0.05)
        time.sleep(4 * STOP_CHECK_S)
        late = Streams(server.grpc_url)
        try:
            _, refused = late.request("late", generate_inputs(PROMPTS[1], 8, stream=True), timeout=30)
        finally:
            late.close(cancel=True)
        assert refused is not None and "server is stopping" in str(refused), refused
        streams.wait(["long"], timeout=STOP_S)
        ended = time.monotonic() - stopping
        assert streams.last("long", "finish_reason") == b"cancelled"
        assert "".join(streams.texts("long")), "the text generated before the stop is kept"
    finally:
        streams.close(cancel=True)
    server.process.wait(timeout=STOP_S)
    took = time.monotonic() - stopping
    assert not server.in_flight_lines(), server.in_flight_lines()[-5:]
    print(f"SIGTERM with an unbounded stream: it ended after {ended:.1f} s, serve.sh gone after {took:.1f} s")


def test_stubs_exit_when_tritonserver_is_killed_under_an_unbounded_request(server):
    """A stub whose tritonserver is gone exits within seconds, whatever its threads do (an llm
    stub went on generating for 51 minutes before: glue.exit_with_server)."""
    streams = Streams(server.grpc_url)
    try:
        start_unbounded_stream(streams)
        stubs = live_stubs(server.pid)  # pid -> (model, instance)
        assert stubs
        os.kill(server.pid, signal.SIGKILL)  # tritonserver itself, not serve.sh
        killed = time.monotonic()
        while any(running(pid) for pid in stubs):
            assert time.monotonic() - killed < 10, {pid: stubs[pid] for pid in stubs if running(pid)}
            time.sleep(0.1)
        print(f"every stub gone {time.monotonic() - killed:.1f} s after tritonserver's SIGKILL")
    finally:
        streams.close(cancel=True)


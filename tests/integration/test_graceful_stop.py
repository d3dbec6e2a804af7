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

PROMPTS = ["The lighthouse keeper wrote in his log that", "A short list of reasons to learn chess:",
           "Once the river froze, the village", "The recipe needs three things:"]
MAX_TOKENS = 40
STOP_S = 60  # the drain (the streams' last tokens) and Triton's own stop, on a loaded 2-core machine


@pytest.fixture
def server(tmp_path):
    repositories = write_deployment(tmp_path / "deployment", keep=GENERATE_MODELS)
    with triton_server(tmp_path / "server.log", repositories=repositories, models=GENERATE_MODELS) as running:
        yield running


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

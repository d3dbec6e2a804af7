"""Streams abandoned through the `generate` ensemble leave the engine: Triton does not cancel the
running llm step, so the llm learns of them from chunks the detokenizer never acknowledges."""
import subprocess
import sys
import textwrap
import time

import pytest

from harness.clients.kserve import generate_inputs
from harness.clients.streams import Streams
from harness.deploy import write_deployment
from harness.server import triton_server
from harness.triton_metrics import llm_gauges as harness_llm_gauges

LONG = 1500  # tokens: at this machine's speed, minutes of work each if nothing frees them
LIVE = 300  # tokens of the stream that goes on throughout (it must not be taken for abandoned)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Room for all 52 streams in one rank's engine, and for them arriving at once in its queue."""
    out = tmp_path_factory.mktemp("abandon")
    repositories = write_deployment(out, "--set", "llm.max_active_requests=64", "--queue", "llm=64")
    with triton_server(out / "server.log", repositories=repositories) as running:
        yield running


def counting(n: int) -> str:
    """A prompt greedy decoding goes on from without end (counting), different for each n."""
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


def llm_gauges(server) -> dict[str, float]:
    return harness_llm_gauges(server.metrics(), "llm")


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def dropped_connection_client(url: str, count: int) -> subprocess.Popen:
    """A client process that opens `count` streams and is then killed: its connection drops
    without a cancel message."""
    prompts = [counting(100 + i) for i in range(count)]
    script = textwrap.dedent(f"""
        import time
        from harness.clients.kserve import generate_inputs
        from harness.clients.streams import Streams
        streams = Streams({url!r})
        for i in range({count}):
            streams.send(f"d{{i}}", generate_inputs({prompts!r}[i], {LONG}, stream=True))
        while sum(bool(r) for r in streams.responses.values()) < 1:
            time.sleep(0.05)
        print("streaming", flush=True)
        time.sleep(600)
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_50_abandoned_streams_free_their_slots_and_kv_cache(server):
    before = llm_gauges(server)
    # Counting runs on without EOS: the live stream and its non-streamed twin run throughout.
    live = Streams(server.grpc_url)
    live.send("whole", generate_inputs(counting(1000), LIVE, stream=False))
    live.send("live", generate_inputs(counting(1000), LIVE, stream=True))
    cancelling = Streams(server.grpc_url)
    for i in range(25):
        cancelling.send(f"c{i}", generate_inputs(counting(i), LONG, stream=True))
    dropping = dropped_connection_client(server.grpc_url, 25)
    assert dropping.stdout.readline().strip() == "streaming"
    wait_for(lambda: sum(bool(r) for r in cancelling.responses.values()) >= 3, 120, "cancelled streams started")
    wait_for(lambda: llm_gauges(server)["active_sequences"] == 52, 120, f"52 in the engine: {llm_gauges(server)}")
    engaged = llm_gauges(server)
    assert not cancelling.errors

    assert not live.done["live"].is_set()  # it streams on while the others are abandoned
    abandoned_at = time.monotonic()
    cancelling.close(cancel=True)
    dropping.kill()
    dropping.wait()
    unfinished_live = lambda: sum(not live.done[r].is_set() for r in ("live", "whole"))  # noqa: E731
    wait_for(lambda: llm_gauges(server)["active_sequences"] <= unfinished_live(), 90,
             f"the abandoned streams were not freed: {llm_gauges(server)}")
    seconds = time.monotonic() - abandoned_at
    print(f"50 abandoned streams ({engaged['active_sequences']:.0f} in the engine, "
          f"{engaged['kv_cache_blocks']:.0f} KV blocks) freed in {seconds:.1f} s")

    live.wait(["live", "whole"])
    assert "".join(live.texts("live")) == live.texts("whole")[0]
    assert live.last("live", "completion_tokens") == LIVE
    live.close()
    idle = wait_for(lambda: (g := llm_gauges(server))["active_sequences"] == 0 and g, 30, "idle")
    assert idle["kv_cache_blocks"] == 0 and idle["outstanding_tokens"] == 0, idle
    assert idle["cancelled_requests_total"] - before["cancelled_requests_total"] == 50
    assert server.is_ready()

"""2,000 abandoned `generate` streams leave nothing behind in memory: tritonserver's and each
stub's resident memory after them is within 5% of what it was after the first 100 (a request
Triton kept, as 2.51's ensemble did for each abandoned stream, holds its tensors and responses).

Marked slow (pytest.ini deselects it by default; run it with `-m slow`): each stream has to reach
the llm before it is abandoned: 5.3 minutes on an idle 2-core machine (2026-11-26)."""
import statistics
import threading
import time

import pytest

from harness.accounting import server_rss_by_process
from harness.clients.http import sse_then_reset
from harness.clients.kserve import generate_inputs
from harness.clients.streams import Streams
from harness.deploy import write_deployment
from harness.server import triton_server
from harness.triton_metrics import llm_gauges

FIRST, TOTAL, WAVE = 100, 2000, 20
LONG = 1500
TOLERANCE = 0.05

pytestmark = pytest.mark.slow


def counting(n: int) -> str:
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


def abandon_wave(server, start: int) -> None:
    """WAVE streams, half on a gRPC stream cancelled once each has answered (or after 5 s), half
    over HTTP generate_stream reset after their first event."""
    half = WAVE // 2
    streams = Streams(server.grpc_url)
    for i in range(start, start + half):
        streams.send(str(i), generate_inputs(counting(i % 5000), LONG, stream=True))
    dropping = [threading.Thread(target=sse_then_reset, args=(
        server.http_url, "generate", {"text_input": counting((i + half) % 5000), "max_tokens": LONG, "stream": True},
        1, 120)) for i in range(start, start + half)]
    for thread in dropping:
        thread.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(streams.responses.values()):
        time.sleep(0.05)
    streams.close(cancel=True)
    for thread in dropping:
        thread.join()


def settled_rss(server) -> dict[str, int]:
    """Per process, the median of 5 samples once the llm freed every abandoned stream."""
    deadline = time.monotonic() + 120
    while llm_gauges(server.metrics())["active_sequences"]:
        assert time.monotonic() < deadline, llm_gauges(server.metrics())
        time.sleep(0.5)
    samples = []
    for _ in range(5):
        samples.append(server_rss_by_process(server.pid))
        time.sleep(1)
    return {name: int(statistics.median(s.get(name, 0) for s in samples)) for name in samples[0]}


def test_2000_abandoned_streams_leave_memory_where_the_first_100_left_it(tmp_path):
    repositories = write_deployment(tmp_path, "--set", "llm.max_active_requests=64", "--queue", "llm=64")
    with triton_server(tmp_path / "server.log", repositories=repositories, timeout=900) as server:
        for start in range(0, FIRST, WAVE):
            abandon_wave(server, start)
        first = settled_rss(server)
        for start in range(FIRST, TOTAL, WAVE):
            abandon_wave(server, start)
        last = settled_rss(server)
        assert server.is_ready()
    grown = {name: f"{first[name] / 2**20:.0f} -> {last.get(name, 0) / 2**20:.0f} MiB"
             for name in first if last.get(name, 0) > first[name] * (1 + TOLERANCE)}
    print({name: f"{first[name] / 2**20:.0f} -> {last.get(name, 0) / 2**20:.0f} MiB" for name in first})
    assert set(last) == set(first), "a stub was replaced (it died) during the run"
    assert not grown, f"grew by more than {TOLERANCE:.0%}: {grown}"

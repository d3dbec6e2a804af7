"""The front's metrics: what one generation request adds, response counting by route and status,
and the keep-alive wrapper of SSE streams."""
import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tritonfront.openai import keepalive
from tritonfront.openai.metrics import METRICS, CountResponses, FrontMetrics, GenerationMetrics


def samples(metrics: FrontMetrics) -> dict:
    """(sample name, sorted label items) -> value, parsed back from the exposition text."""
    text, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def test_every_declared_metric_is_exposed_under_its_name():
    metrics = FrontMetrics()
    metrics.generation("m").finished(1, 1, ["stop"])
    metrics.answered("/x", "GET", 200)
    names = {name for name, _ in samples(metrics)}
    for spec in METRICS.values():
        expected = spec.name if spec.kind == "counter" else spec.name + "_count"
        assert expected in names, spec.name


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_one_generation_request():
    metrics, clock = FrontMetrics(), Clock()
    request = GenerationMetrics(metrics, "generate", clock)
    clock.now += 0.5
    request.response(0, 0)  # a response without a token (a role chunk) is not a first token
    request.response(0, 1)
    clock.now += 0.1
    request.response(1, 1)  # the second choice's first token: no inter-token latency
    clock.now += 0.2
    request.response(0, 3)  # two tokens in one response, 0.3 s after the choice's first: 0.15 s each
    clock.now += 0.3
    request.finished(7, 4, ["stop", "length"])
    got = samples(metrics)
    label = (("model_name", "generate"),)
    assert got[("vllm:time_to_first_token_seconds_count", label)] == 1
    assert got[("vllm:time_to_first_token_seconds_sum", label)] == pytest.approx(0.5)
    assert got[("vllm:inter_token_latency_seconds_count", label)] == 2
    assert got[("vllm:inter_token_latency_seconds_sum", label)] == pytest.approx(0.3)
    assert got[("vllm:e2e_request_latency_seconds_sum", label)] == pytest.approx(1.1)
    assert got[("vllm:prompt_tokens_total", label)] == 7
    assert got[("vllm:generation_tokens_total", label)] == 4
    assert got[("vllm:request_generation_tokens_sum", label)] == 4
    assert got[("vllm:request_success_total", (("finished_reason", "stop"), ("model_name", "generate")))] == 1
    assert got[("vllm:request_success_total", (("finished_reason", "length"), ("model_name", "generate")))] == 1


def test_responses_counted_by_route_template_and_status():
    metrics = FrontMetrics()

    async def hello(request):
        return PlainTextResponse("hi", status_code=201 if request.path_params.get("name") == "new" else 200)

    routes = [Route("/hello/{name}", hello, methods=["GET"])]
    app = CountResponses(Starlette(routes=routes), metrics, routes)
    with TestClient(app) as client:
        for path in ("/hello/a", "/hello/b", "/hello/new", "/nowhere", "/else"):
            client.get(path)
        client.post("/hello/a")
    got = samples(metrics)

    def count(handler, method, status):
        return got.get(("http_requests_total", (("handler", handler), ("method", method), ("status", status))))
    assert count("/hello/{name}", "GET", "200") == 2
    assert count("/hello/{name}", "GET", "201") == 1
    assert count("/hello/{name}", "POST", "405") == 1
    assert count("unmatched", "GET", "404") == 2


async def _events(gaps, log):
    try:
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            yield f"data: {i}\n\n".encode()
    finally:
        log.append("closed")


def test_keep_alive_opens_at_once_and_fills_silences():
    async def main():
        log = []
        got = [chunk async for chunk in keepalive.with_keep_alive(_events([0.25, 0.0, 0.12], log), 0.1)]
        return got, log
    got, log = asyncio.run(main())
    assert got[0] == keepalive.OPENED
    data = [c for c in got if c.startswith(b"data")]
    assert data == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    before_first = got[1:got.index(b"data: 0\n\n")]
    assert before_first == [keepalive.KEEP_ALIVE] * 2  # 0.25 s of silence at 0.1 s
    assert keepalive.KEEP_ALIVE in got[got.index(b"data: 1\n\n"):]
    assert log == ["closed"]


def test_leaving_cancels_the_pending_read_and_closes_the_events():
    async def main():
        log = []
        stream = keepalive.with_keep_alive(_events([30.0], log), 0.05)
        assert await stream.__anext__() == keepalive.OPENED
        assert await stream.__anext__() == keepalive.KEEP_ALIVE
        await stream.aclose()  # the client left while the first token was awaited
        return log
    assert asyncio.run(asyncio.wait_for(main(), 5)) == ["closed"]

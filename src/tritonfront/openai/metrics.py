"""The front's own Prometheus metrics, served at /metrics on its port (prometheus_client's text
format): HTTP requests by route and status, and per generation request the latencies a client
sees (from the request's arrival at the front) and its tokens, under vLLM's names where the
meaning is the same, so dashboards and routers built for vLLM read them unchanged.

Latencies: time to first token is from the route's start to the first response that carries a
generated token; inter-token latency is observed once per generated token after a choice's first,
the wait for a response shared by the tokens it carries (a response usually carries one); end to
end is to the last response. Tokens are the ensemble's own counts (the usage the client gets).
Each metric is declared once in METRICS; README's table of the front's metrics is checked against it.
"""
import time
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

# Seconds; from a few ms (a short prompt on a GPU) to the front's stream deadline and beyond.
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                         5.0, 10.0, 20.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
# A client that leaves before its response starts gets no status; counted as nginx logs it.
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class FrontMetricSpec:
    name: str  # as exposed (a counter's name with its _total)
    kind: str  # counter, histogram
    labels: tuple[str, ...]
    help: str
    buckets: Optional[tuple] = None


METRICS = {spec.name: spec for spec in (
    FrontMetricSpec("http_requests_total", "counter", ("handler", "method", "status"),
                    "HTTP requests answered by the OpenAI front, by route template and status code"),
    FrontMetricSpec("vllm:time_to_first_token_seconds", "histogram", ("model_name",),
                    "Seconds from a generation request's arrival to its first generated token",
                    LATENCY_BUCKETS),
    FrontMetricSpec("vllm:inter_token_latency_seconds", "histogram", ("model_name",),
                    "Seconds between generated tokens of a choice", TOKEN_LATENCY_BUCKETS),
    FrontMetricSpec("vllm:e2e_request_latency_seconds", "histogram", ("model_name",),
                    "Seconds from a generation request's arrival to its last token", LATENCY_BUCKETS),
    FrontMetricSpec("vllm:prompt_tokens_total", "counter", ("model_name",), "Prompt tokens of finished requests"),
    FrontMetricSpec("vllm:generation_tokens_total", "counter", ("model_name",),
                    "Generated tokens of finished requests"),
    FrontMetricSpec("vllm:request_prompt_tokens", "histogram", ("model_name",), "Prompt tokens per finished request",
                    TOKEN_BUCKETS),
    FrontMetricSpec("vllm:request_generation_tokens", "histogram", ("model_name",),
                    "Generated tokens per finished request, summed over its choices", TOKEN_BUCKETS),
    FrontMetricSpec("vllm:request_success_total", "counter", ("model_name", "finished_reason"),
                    "Choices finished, by the engine's finish reason (stop, length)"),
)}


class FrontMetrics:
    """The metrics of one front, in a registry of their own."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self._metrics = {}
        for spec in METRICS.values():
            if spec.kind == "counter":  # prometheus_client adds the _total itself
                metric = Counter(spec.name.removesuffix("_total"), spec.help, spec.labels, registry=self.registry)
            else:
                metric = Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=self.registry)
            self._metrics[spec.name] = metric

    def __getitem__(self, name: str):
        return self._metrics[name]

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def answered(self, handler: str, method: str, status: int) -> None:
        self["http_requests_total"].labels(handler, method, str(status)).inc()

    def generation(self, model: str) -> "GenerationMetrics":
        return GenerationMetrics(self, model)


class GenerationMetrics:
    """One generation request's timings and tokens, from its arrival (when this is made)."""

    def __init__(self, metrics: FrontMetrics, model: str, clock=time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.first: Optional[float] = None
        self.last: dict[int, float] = {}  # choice -> when its latest token came
        self.tokens: dict[int, int] = {}  # choice -> its tokens so far
        self._ttft = metrics["vllm:time_to_first_token_seconds"].labels(model)
        self._itl = metrics["vllm:inter_token_latency_seconds"].labels(model)
        self._e2e = metrics["vllm:e2e_request_latency_seconds"].labels(model)
        self._prompt = metrics["vllm:prompt_tokens_total"].labels(model)
        self._generated = metrics["vllm:generation_tokens_total"].labels(model)
        self._request_prompt = metrics["vllm:request_prompt_tokens"].labels(model)
        self._request_generated = metrics["vllm:request_generation_tokens"].labels(model)
        self._success = metrics["vllm:request_success_total"]
        self.model = model

    def response(self, choice: int, completion_tokens: int) -> None:
        """A response of `choice` arrived; `completion_tokens` is the choice's running count."""
        new = completion_tokens - self.tokens.get(choice, 0)
        if new <= 0:
            return
        now = self.clock()
        self.tokens[choice] = completion_tokens
        if self.first is None:
            self.first = now
            self._ttft.observe(now - self.start)
        previous = self.last.get(choice)
        self.last[choice] = now
        if previous is not None:
            for _ in range(new):
                self._itl.observe((now - previous) / new)

    async def observe(self, deltas: AsyncIterator) -> AsyncIterator:
        """The backend's deltas (backend.TextDelta) passed on, observed; the request counts as
        finished when they end (not when they fail or the client leaves)."""
        prompt_tokens: dict[int, int] = {}
        completion_tokens: dict[int, int] = {}
        reasons: dict[int, str] = {}
        try:
            async for delta in deltas:
                self.response(delta.choice, delta.completion_tokens)
                prompt_tokens[delta.prompt] = delta.prompt_tokens
                completion_tokens[delta.choice] = max(completion_tokens.get(delta.choice, 0), delta.completion_tokens)
                if delta.finish_reason:
                    reasons[delta.choice] = delta.finish_reason
                yield delta
        finally:
            await deltas.aclose()
        self.finished(sum(prompt_tokens.values()), sum(completion_tokens.values()), list(reasons.values()))

    def finished(self, prompt_tokens: int, completion_tokens: int, finish_reasons: list[Optional[str]]) -> None:
        self._e2e.observe(self.clock() - self.start)
        self._prompt.inc(prompt_tokens)
        self._generated.inc(completion_tokens)
        self._request_prompt.observe(prompt_tokens)
        self._request_generated.observe(completion_tokens)
        for reason in finish_reasons:
            self._success.labels(self.model, reason or "unknown").inc()


class CountResponses:
    """ASGI middleware counting every answer by route template, method and status."""

    def __init__(self, app, metrics: FrontMetrics, routes):
        self.app, self.metrics, self.routes = app, metrics, routes

    def _handler(self, scope) -> str:
        from starlette.routing import Match

        for route in self.routes:
            if route.matches(scope)[0] != Match.NONE:
                return route.path
        return "unmatched"  # one label for every unknown path: a client cannot grow the series

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                # counted as the answer starts: a client that has its answer finds it counted
                started = True
                self.metrics.answered(self._handler(scope), scope["method"], message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if not started:
                self.metrics.answered(self._handler(scope), scope["method"], CLIENT_CLOSED)

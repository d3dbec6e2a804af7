"""Streamed generation load (the `llm` model, the `generate` ensemble) over gRPC bidirectional
streams (tritonclient.grpc.aio stream_infer), in one event loop.

Per request: when it was scheduled, when its first token arrived (time to first token, TTFT: the
first response carrying generated tokens, i.e. non-empty `output_ids` from `llm`, non-empty
`text_output` from `generate`), when each later response arrived (inter-token latency, ITL) and
how many tokens it got. Requests are spread over a few connections, one gRPC stream each, so no
stream carries a large share of them.

- `open_loop`: every request once at Poisson times (see schedule); latency from the scheduled time.
- `closed_loop`: `concurrency` clients, each sending its next request when its last one ended.
Only a loopback server is targeted."""
import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

import tritonclient.grpc.aio as grpcaio

from ..clients.kserve import check_loopback
from ..stats import mean, percentile
from .outcomes import NO_ANSWER, SERVED, classify
from .schedule import closed_loop as closed_loop_of, paced, poisson_offsets

UNFINISHED = "no final response within the drain timeout"


@dataclass
class Chunk:
    tokens: int  # generated tokens in this response
    visible: bool  # it carries tokens a client would show (ids, or non-empty text)
    final: bool
    finish_reason: str


def read_llm(result) -> Chunk:
    reason = result.as_numpy("finish_reason").reshape(-1)[0].decode()
    tokens = int(result.as_numpy("output_ids").size)
    return Chunk(tokens, tokens > 0, bool(result.as_numpy("is_final").reshape(-1)[0]), reason)


class _GenerateReader:
    """completion_tokens is a running count: the tokens of a chunk are its increase."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def __call__(self, result) -> Chunk:
        request_id = result.get_response().id
        reason = result.as_numpy("finish_reason").reshape(-1)[0].decode()
        total = int(result.as_numpy("completion_tokens").reshape(-1)[0])
        tokens = total - self.seen.get(request_id, 0)
        self.seen[request_id] = total
        if reason:
            self.seen.pop(request_id, None)
        return Chunk(tokens, bool(result.as_numpy("text_output").reshape(-1)[0]), bool(reason), reason)


def read_generate() -> Callable:
    return _GenerateReader()


@dataclass
class Request:
    inputs: list
    tag: dict = field(default_factory=dict)  # what the benchmark groups results by


@dataclass
class Record:
    tag: dict
    scheduled: float
    first: Optional[float] = None  # first visible response
    arrivals: list = field(default_factory=list)  # (time, tokens) of each response with tokens
    done: Optional[float] = None
    tokens: int = 0
    finish_reason: str = ""
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.done is not None and self.error is None

    @property
    def kind(self) -> str:
        if self.ok:
            return SERVED
        return NO_ANSWER if self.error in (None, UNFINISHED) else classify(self.error)

    @property
    def ttft(self) -> float:
        return self.first - self.scheduled if self.first is not None else float("nan")

    def gaps(self) -> list[float]:
        """Seconds between consecutive responses with tokens, per token of the later one."""
        return [(b - a) / n for (a, _), (b, n) in zip(self.arrivals, self.arrivals[1:])]


class _Connection:
    """One client and one bidirectional stream; requests are queued onto it."""

    def __init__(self, url: str, reader: Callable, records: dict):
        self.client = grpcaio.InferenceServerClient(url)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reader, self.records = reader, records
        self.stream_errors: list[str] = []
        self.finished: dict[str, asyncio.Event] = {}

    async def _requests(self):
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    def start(self) -> None:
        self.responses = self.client.stream_infer(self._requests())
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for result, error in self.responses:
            now = time.perf_counter()
            if error is not None:
                self.stream_errors.append(str(error)[:200])  # stream errors carry no request id
                continue
            request_id = result.get_response().id
            record = self.records[request_id]
            chunk = self.reader(result)
            if chunk.tokens:
                record.arrivals.append((now, chunk.tokens))
                record.tokens += chunk.tokens
            if chunk.visible and record.first is None:
                record.first = now
            if chunk.final:
                record.done, record.finish_reason = now, chunk.finish_reason
                self.finished.pop(request_id).set()

    def send(self, model: str, request_id: str, request: Request) -> asyncio.Event:
        self.finished[request_id] = event = asyncio.Event()
        self.queue.put_nowait({"model_name": model, "inputs": request.inputs, "request_id": request_id})
        return event

    async def close(self, timeout: float) -> None:
        self.queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except asyncio.TimeoutError:
            self.responses.cancel()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.client.close()


_ids = itertools.count()


class StreamPool:
    """`connections` gRPC streams; `send` puts a request on the next one (round robin) and
    returns an event set at its final response; `close` waits for the rest and gives every
    request's Record. Use inside a running event loop."""

    def __init__(self, url: str, reader: Callable = read_llm, connections: int = 8):
        check_loopback(url)
        self.records: dict[str, Record] = {}
        self.connections = [_Connection(url, reader, self.records) for _ in range(connections)]
        for connection in self.connections:
            connection.start()
        self._next = itertools.cycle(self.connections)

    def send(self, model: str, request: Request, scheduled: float) -> asyncio.Event:
        request_id = f"s{next(_ids)}"
        self.records[request_id] = Record(request.tag, scheduled)
        return next(self._next).send(model, request_id, request)

    async def close(self, drain_timeout: float) -> list[Record]:
        deadline = time.perf_counter() + drain_timeout
        pending = [e.wait() for c in self.connections for e in list(c.finished.values())]
        if pending:
            await asyncio.wait([asyncio.ensure_future(p) for p in pending], timeout=drain_timeout)
        for connection in self.connections:
            await connection.close(max(0.1, deadline - time.perf_counter()))
        errors = [e for c in self.connections for e in c.stream_errors]
        for record in self.records.values():
            if record.done is None:
                record.error = errors[0] if errors else UNFINISHED
        return list(self.records.values())


async def open_loop(url: str, model: str, requests: Sequence[Request], rate: float, *, seed: int = 0,
                    connections: int = 8, drain_timeout: float = 120.0, reader: Callable = read_llm) -> list[Record]:
    """Every request once, in order, at Poisson times of `rate` requests/s; each record's tag
    gets its `offset_s` from the start."""
    pool = StreamPool(url, reader, connections)
    start = time.perf_counter()
    async for number, scheduled in paced(poisson_offsets(rate, seed, count=len(requests)), start):
        pool.send(model, requests[number], scheduled)
    records = await pool.close(drain_timeout)
    for record in records:
        record.tag.setdefault("offset_s", record.scheduled - start)
    return records


async def closed_loop(url: str, model: str, make_request: Callable[[int], Request], concurrency: int,
                      duration: float, *, drain_timeout: float = 120.0, reader: Callable = read_llm,
                      max_connections: int = 8) -> tuple[list[Record], float]:
    """(records, seconds from the first send to the last final response)."""
    pool = StreamPool(url, reader, min(concurrency, max_connections))
    start = time.perf_counter()

    async def send(number: int, now: float):
        await pool.send(model, make_request(number), now).wait()

    await closed_loop_of(send, concurrency, duration, drain_timeout)
    records = await pool.close(1.0)
    last = max((r.done for r in records if r.done is not None), default=start)
    return records, last - start


async def closed_loop_records(send: Callable[[int, Record], Awaitable], concurrency: int, duration: float, *,
                              drain_timeout: float = 120.0) -> tuple[list[Record], float]:
    """A closed loop over any client that fills a Record (send(number, record)), such as
    clients.openai.ChatStreams: (records, seconds from the first send to the last final response)."""
    records: list[Record] = []
    start = time.perf_counter()

    async def one(number: int, now: float) -> None:
        record = Record({}, now)
        records.append(record)
        await send(number, record)

    await closed_loop_of(one, concurrency, duration, drain_timeout)
    for record in records:
        if record.done is None and record.error is None:
            record.error = UNFINISHED
    last = max((r.done for r in records if r.done is not None), default=start)
    return records, last - start


def summary(records: Sequence[Record]) -> dict:
    """TTFT and ITL in ms (mean, P50, P99), requests and tokens, for the records of one variant."""
    ok = [r for r in records if r.ok]
    ttft = [r.ttft * 1000 for r in ok]
    gaps = [g * 1000 for r in ok for g in r.gaps()]
    return {
        "requests": len(records), "ok": len(ok), "failed": len(records) - len(ok),
        "ttft_mean": mean(ttft), "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
        "itl_mean": mean(gaps), "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
        "tokens": sum(r.tokens for r in ok),
    }

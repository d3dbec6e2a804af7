"""Load for OpenAI-style HTTP servers (aiohttp, one event loop): streamed completions over SSE and
embeddings, recorded like the gRPC loads so one report serves both.

- `stream_completion`: one streamed `/v1/completions` (or chat) request; a streaming.Record with
  an arrival per SSE chunk that carries text (one token each, the way token-by-token servers
  stream) and the completion tokens from the final usage when the server sends it.
- `stream_closed_loop`: `concurrency` clients, each sending its next request when its last ended.
- `embeddings_once`: one `/embeddings` request, an Outcome (503 is `rejected`).
Only a loopback server is targeted."""
import asyncio
import json
import time
from typing import Callable, Optional

import aiohttp

from ..clients.kserve import check_loopback
from .outcomes import INVALID, REJECTED, SERVED, Outcome, classify
from .schedule import closed_loop
from .streaming import UNFINISHED, Record


def session(timeout_s: float = 600, force_close: bool = False) -> aiohttp.ClientSession:
    """No connection limit: a closed loop of N clients holds N connections. `force_close`: a new
    connection per request, for servers that close theirs after a stream (llama-server: reusing
    them failed ~45% of requests with "Can not write request body", STACK.md)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=force_close),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


def _status_error(status: int, body: str) -> str:
    return f"HTTP {status}: {body[:300]}"


async def stream_completion(client: aiohttp.ClientSession, url: str, body: dict, record: Record) -> Record:
    """POST `body` (with "stream": true) to `url` and fill `record` as the SSE chunks arrive."""
    try:
        async with client.post(url, json=body) as response:
            if response.status != 200:
                record.error = _status_error(response.status, await response.text())
                return record
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                now = time.perf_counter()
                if data == b"[DONE]":
                    record.done = record.done or now
                    break
                event = json.loads(data)
                if "error" in event:
                    record.error = str(event["error"])[:300]
                    return record
                for choice in event.get("choices") or []:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        record.arrivals.append((now, 1))
                        record.tokens += 1
                        if record.first is None:
                            record.first = now
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                        record.done = now  # some servers end the stream without a [DONE]
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    record.tokens = int(usage["completion_tokens"])
    except aiohttp.ClientPayloadError as error:
        # transformers serve (5.23) closes its stream after the final chunk without ending the
        # chunked body: the answer is whole if the finish came.
        if record.done is None:
            record.error = f"{type(error).__name__}: {error}"
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        record.done = None
        record.error = f"{type(error).__name__}: {error}"
    if record.done is None and record.error is None:
        record.error = UNFINISHED
    return record


async def stream_closed_loop(url: str, make_body: Callable[[int], dict], concurrency: int, duration: float, *,
                             drain_timeout: Optional[float] = None, force_close: bool = False) -> list[Record]:
    """Records of every request a closed loop of `concurrency` streams sent within `duration`; a
    stream still running `drain_timeout` after the end is cancelled (its record keeps what arrived)."""
    check_loopback(url.split("//", 1)[-1])
    records: list[Record] = []
    async with session(force_close=force_close) as client:
        async def send(number: int, now: float) -> Record:
            record = Record({"number": number}, now)
            records.append(record)
            return await stream_completion(client, url, make_body(number), record)

        await closed_loop(send, concurrency, duration, drain_timeout)
    for record in records:
        if record.done is None and record.error is None:
            record.error = UNFINISHED
    return records


async def embeddings_once(client: aiohttp.ClientSession, url: str, body: dict, scheduled: float) -> Outcome:
    """One embeddings request; a served outcome holds the number of vectors returned."""
    outcome = Outcome(scheduled)
    try:
        async with client.post(url, json=body) as response:
            text = await response.text()
            if response.status != 200:
                message = _status_error(response.status, text)
                kind = {400: INVALID, 503: REJECTED}.get(response.status) or classify(message)
                return outcome.end(time.perf_counter(), kind, message)
            return outcome.end(time.perf_counter(), SERVED, result=len(json.loads(text)["data"]))
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        return outcome.fail(time.perf_counter(), error)

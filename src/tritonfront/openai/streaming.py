"""Answers that end when their client leaves: server-sent events through Starlette's
StreamingResponse, and any awaited work raced against the client's disconnect (`with_cancellation`).

A client that goes away cancels the work at once, even while it waits for its first token: the
cancellation reaches the backend's iterator, whose `finally` blocks cancel its Triton stream.
Starlette's StreamingResponse watches for `http.disconnect` only under ASGI servers below spec 2.4
(uvicorn says 2.3 today); above, it would notice a client gone only at its next write, which for a
request waiting in a queue comes up to a minute later. EventStream watches always.

A stream's response starts with its first event or after FIRST_EVENT_WAIT_S (`open_stream`): an
error up to then (a bad parameter the front or Triton refused) is an ordinary JSON error with its
HTTP status, as OpenAI answers; a request still waiting then (in Triton's queue) gets its headers
and an SSE comment, and a keep-alive comment every `keep_alive_s` of silence (keepalive); an error
after the start is an event `data: {"error": {...}}` and the stream ends without `data: [DONE]`.
"""
import asyncio
import json
import logging
from typing import AsyncIterator, Awaitable, TypeVar, Union

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .api_errors import OpenAIError, internal
from .keepalive import with_keep_alive

log = logging.getLogger("tritonfront.openai")

DONE = b"data: [DONE]\n\n"
# How long a stream's response waits for its first event before it starts without it: errors that
# come at once keep their HTTP status, and a client (or proxy) still gets headers within a second.
FIRST_EVENT_WAIT_S = 1.0
T = TypeVar("T")


def json_bytes(data: Union[BaseModel, dict]) -> bytes:
    """An openai.types object as OpenAI sends it: the fields set, nothing else."""
    if isinstance(data, BaseModel):
        return data.model_dump_json(exclude_unset=True).encode()
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def event(data: Union[BaseModel, dict]) -> bytes:
    return b"data: " + json_bytes(data) + b"\n\n"


def as_openai_error(error: BaseException) -> OpenAIError:
    if isinstance(error, OpenAIError):
        return error
    log.exception("unexpected error", exc_info=error)
    return internal(error)


def error_response(error: BaseException) -> Response:
    error = as_openai_error(error)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def model_response(data: Union[BaseModel, dict]) -> Response:
    return Response(json_bytes(data), media_type="application/json")


class ClientLeft(Exception):
    """The client went away before its answer was ready."""


class NothingToSend(Response):
    """The response to a client that left: nothing."""

    def __init__(self):
        super().__init__()

    async def __call__(self, scope, receive, send) -> None:
        return


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first_of(*tasks: asyncio.Future) -> None:
    """Waits for the first task to end, then cancels and awaits the others."""
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def with_cancellation(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, awaited while the connection is watched; a client that leaves cancels the
    work and raises ClientLeft. The request's body must have been read."""
    task = asyncio.ensure_future(work)
    await _first_of(task, asyncio.ensure_future(_until_disconnect(request.receive)))
    if task.cancelled():
        raise ClientLeft()
    return task.result()


async def answer(request: Request, work: Awaitable[Union[BaseModel, dict]]) -> Response:
    """A whole answer: the JSON of what `work` returns, or its error; nothing to a client that left."""
    try:
        return model_response(await with_cancellation(request, work))
    except ClientLeft:
        return NothingToSend()
    except Exception as error:  # the client gets an error, never a traceback
        return error_response(error)


class EventStream(StreamingResponse):
    """The SSE events (bytes) of `events`; closed, and its work cancelled, when the client leaves."""
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]):
        super().__init__(events, headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await _first_of(asyncio.ensure_future(self.stream_response(send)),
                            asyncio.ensure_future(self.listen_for_disconnect(receive)))
        finally:
            await self.body_iterator.aclose()


async def _events_after(first: asyncio.Future, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield await first
        async for chunk in events:
            yield chunk
    except Exception as error:  # the client gets an error event, never a traceback
        yield event(as_openai_error(error).body())
    finally:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await events.aclose()


async def open_stream(request: Request, events: AsyncIterator[bytes], keep_alive_s: float) -> Response:
    """An SSE response of `events` with keep-alive comments (keepalive). The response starts with
    the first event or after FIRST_EVENT_WAIT_S, whichever comes first (the connection watched
    meanwhile): an error before then, a parameter the front or Triton refused at once, is a JSON
    error with its status, as OpenAI answers it; a request that waits longer (in Triton's queue)
    gets its headers and a first comment then, so a proxy sees the stream open."""
    first = asyncio.ensure_future(events.__anext__())
    try:
        await with_cancellation(request, asyncio.wait((first,), timeout=min(FIRST_EVENT_WAIT_S, keep_alive_s)))
    except ClientLeft:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await events.aclose()
        return NothingToSend()
    if first.done() and first.exception() is not None:
        await events.aclose()
        return error_response(first.exception())
    return EventStream(with_keep_alive(_events_after(first, events), keep_alive_s))

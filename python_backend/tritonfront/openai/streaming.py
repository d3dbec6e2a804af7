"""Answers that end when their client leaves: server-sent events through Starlette's
StreamingResponse, and any awaited work raced against the client's disconnect (`with_cancellation`).

A client that goes away cancels the work at once, even while it waits for its first token: the
cancellation reaches the backend's iterator, whose `finally` blocks cancel its Triton stream.
Starlette's StreamingResponse watches for `http.disconnect` only under ASGI servers below spec 2.4
(uvicorn says 2.3 today); above, it would notice a client gone only at its next write, which for a
request waiting in a queue comes up to a minute later. EventStream watches always.

A stream's first event is awaited before the response starts (`open_stream`): an error up to then
(a bad parameter Triton refused, overload) is an ordinary JSON error with its HTTP status, as OpenAI
answers; an error after it is an event `data: {"error": {...}}` and the stream ends without
`data: [DONE]`.
"""
import asyncio
import json
import logging
from typing import AsyncIterator, Awaitable, TypeVar, Union

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .api_errors import OpenAIError, internal

log = logging.getLogger("tritonfront.openai")

DONE = b"data: [DONE]\n\n"
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


async def with_cancellation(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, awaited while the connection is watched; a client that leaves cancels the
    work and raises ClientLeft. The request's body must have been read."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
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
        stream = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((stream, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, watch):
                task.cancel()
            await asyncio.gather(stream, watch, return_exceptions=True)
            await self.body_iterator.aclose()


async def _events_after(first: bytes, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield first
        async for chunk in events:
            yield chunk
    except Exception as error:  # the client gets an error event, never a traceback
        yield event(as_openai_error(error).body())
    finally:
        await events.aclose()


async def open_stream(request: Request, events: AsyncIterator[bytes]) -> Response:
    """An SSE response of `events` once its first event has come (the connection watched meanwhile);
    an error before it is a JSON error with its status."""
    try:
        first = await with_cancellation(request, events.__anext__())
    except ClientLeft:
        await events.aclose()
        return NothingToSend()
    except Exception as error:
        await events.aclose()
        return error_response(error)
    return EventStream(_events_after(first, events))


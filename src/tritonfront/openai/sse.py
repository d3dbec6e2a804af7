"""Responses that end when their client leaves: server-sent events, and whole answers computed while
the front watches the connection.

Both watch for the ASGI `http.disconnect` message themselves (whatever the server's ASGI version),
so a client that goes away cancels the work at once, even while it waits for its first token; the
work's `finally` blocks then cancel its Triton stream.

A stream's first event is awaited before the response starts: an error up to then (a bad
parameter Triton refused, overload) is an ordinary JSON error with its HTTP status, as OpenAI
answers; an error after it is an event `data: {"error": {...}}` and the stream ends without
`data: [DONE]`.
"""
import asyncio
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Optional

from .errors import OpenAIError, internal

log = logging.getLogger("tritonfront.openai")

DONE = b"data: [DONE]\n\n"
_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]


def event(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


async def send_json(send, status: int, body: Any, headers: Optional[dict] = None) -> None:
    payload = dumps(body)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(key.lower().encode(), value.encode()) for key, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


async def send_error(send, error: OpenAIError) -> None:
    await send_json(send, error.status, error.body(), error.headers())


def as_openai_error(error: BaseException) -> OpenAIError:
    if isinstance(error, OpenAIError):
        return error
    log.exception("unexpected error", exc_info=error)
    return internal(error)


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(*tasks: asyncio.Task) -> None:
    """Waits for the first task to end, then cancels and awaits the others."""
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class WholeAnswer:
    """An ASGI response: the JSON `work` returns (awaited while the connection is watched), or its
    OpenAIError; a client that leaves cancels the work and is sent nothing."""

    def __init__(self, work: Awaitable):
        self.work = work

    async def __call__(self, scope, receive, send) -> None:
        work = asyncio.ensure_future(self.work)
        await _first(work, asyncio.ensure_future(_until_disconnect(receive)))
        if work.cancelled():
            return
        if work.exception() is not None:
            await send_error(send, as_openai_error(work.exception()))
            return
        await send_json(send, 200, work.result())


class EventStream:
    """An ASGI response streaming the SSE events (bytes) of `events`, closed when the client leaves."""

    def __init__(self, events: AsyncIterator[bytes]):
        self.events = events
        self.started = False

    async def __call__(self, scope, receive, send) -> None:
        try:
            await _first(asyncio.ensure_future(self._pump(send)), asyncio.ensure_future(_until_disconnect(receive)))
        finally:
            await self.events.aclose()

    async def _pump(self, send) -> None:
        try:
            async for chunk in self.events:
                if not self.started:
                    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
                    self.started = True
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception as error:  # the client gets an error, never a traceback
            error = as_openai_error(error)
            if not self.started:
                await send_error(send, error)
            else:
                await send({"type": "http.response.body", "body": event(error.body()), "more_body": False})

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


class _Disconnected(Exception):
    pass


async def _until_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected()


async def _race(work: Awaitable, watcher: asyncio.Task):
    """The result of `work`, or _Disconnected when the client leaves first (work is cancelled)."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise _Disconnected()


class WholeAnswer:
    """An ASGI response: the JSON `work` returns (awaited while the connection is watched), or its
    OpenAIError; nothing is sent to a client that left."""

    def __init__(self, work: Awaitable):
        self.work = work

    async def __call__(self, scope, receive, send) -> None:
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        try:
            body = await _race(self.work, watcher)
        except _Disconnected:
            return
        except BaseException as error:  # noqa: BLE001 - the client gets an error, never a traceback
            if isinstance(error, asyncio.CancelledError):
                raise
            await send_error(send, as_openai_error(error))
            return
        finally:
            watcher.cancel()
        await send_json(send, 200, body)


class EventStream:
    """An ASGI response streaming the SSE events (bytes) of `events`, closed when the client leaves."""

    def __init__(self, events: AsyncIterator[bytes]):
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        started = False
        try:
            while True:
                try:
                    chunk = await _race(self.events.__anext__(), watcher)
                except StopAsyncIteration:
                    break
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
                    started = True
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except _Disconnected:
            return
        except BaseException as error:  # noqa: BLE001 - the client gets an error, never a traceback
            if isinstance(error, asyncio.CancelledError):
                raise
            error = as_openai_error(error)
            if not started:
                await send_error(send, error)
            else:
                await send({"type": "http.response.body", "body": event(error.body()), "more_body": False})
        finally:
            watcher.cancel()
            await self.events.aclose()

"""Server-sent events that a proxy does not cut while the generation waits: a comment as soon as
the stream opens (so the status line and headers go out at once, not with the first token, which
can wait up to the llm queue's deadline), then a comment each time `interval` seconds pass with no
event. SSE clients ignore comment lines (WHATWG HTML, 9.2.6); proxies see bytes moving.

Closing the wrapped stream (the client left) cancels the pending read of `events`, whose own
`finally` then cancels its Triton stream.
"""
import asyncio
from typing import AsyncIterator

OPENED = b": stream opened\n\n"
KEEP_ALIVE = b": keep-alive\n\n"


async def with_keep_alive(events: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    yield OPENED
    iterator = events.__aiter__()
    pending = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait((pending,), timeout=interval)
            if not done:
                yield KEEP_ALIVE
                continue
            read, pending = pending, None
            try:
                item = read.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()

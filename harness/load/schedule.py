"""When requests go out.

Open loop: send times drawn up front with exponential gaps (Poisson arrivals, from a seed, so two
variants can get the very same schedule); each request goes out at its time whether or not
earlier ones have answered, so a server that falls behind meets a growing queue, as it would
from independent users, and latency counts from the *scheduled* time (a client that falls
behind cannot hide server queueing: no coordinated omission).

Closed loop: `concurrency` clients, each sending its next request as soon as its last one ended:
a throughput measurement, not a latency one."""
import asyncio
import itertools
import random
import time
from typing import AsyncIterator, Awaitable, Callable, Optional, TypeVar

T = TypeVar("T")


def poisson_offsets(rate: float, seed: int = 0, *, duration: Optional[float] = None,
                    count: Optional[int] = None) -> list[float]:
    """Send times in seconds from the start, the first one gap after it: every arrival within
    `duration`, or the first `count` arrivals."""
    if rate <= 0:
        raise ValueError(f"rate {rate} must be > 0")
    if (duration is None) == (count is None):
        raise ValueError("give either duration or count")
    rng, offsets, at = random.Random(seed), [], 0.0
    while count is None or len(offsets) < count:
        at += rng.expovariate(rate)
        if duration is not None and at > duration:
            break
        offsets.append(at)
    return offsets


async def paced(offsets: list[float], start: Optional[float] = None) -> AsyncIterator[tuple[int, float]]:
    """(number, scheduled time.perf_counter()) of each offset, each yielded once its time came."""
    start = time.perf_counter() if start is None else start
    for number, offset in enumerate(offsets):
        scheduled = start + offset
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield number, scheduled


async def open_loop(send: Callable[[int, float], Awaitable[T]], offsets: list[float]) -> list[T]:
    """send(number, scheduled) at each offset, without waiting for answers; then every answer,
    in order of sending."""
    tasks = [asyncio.create_task(send(number, scheduled)) async for number, scheduled in paced(offsets)]
    return list(await asyncio.gather(*tasks))


async def closed_loop(send: Callable[[int, float], Awaitable[T]], concurrency: int, duration: float,
                      drain_timeout: Optional[float] = None, stop_after: Optional[int] = None) -> list[T]:
    """`concurrency` clients, each calling send(number, now) again as soon as its last call
    returned, until `duration` passed (or, with `stop_after`, until that many were sent);
    numbers are 0, 1, 2 ... in order of sending. A call still running `drain_timeout` after the
    end is cancelled (its result is left out). Returns what the calls returned, in order of
    sending."""
    numbers = itertools.count()
    results: dict[int, T] = {}
    end = time.perf_counter() + duration if stop_after is None else float("inf")

    async def client():
        while time.perf_counter() < end:
            number = next(numbers)
            if stop_after is not None and number >= stop_after:
                return
            results[number] = await send(number, time.perf_counter())

    clients = [asyncio.create_task(client()) for _ in range(concurrency)]
    timeout = None if drain_timeout is None else duration + drain_timeout
    _, late = await asyncio.wait(clients, timeout=timeout)
    for task in late:
        task.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    for task in clients:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    return [results[n] for n in sorted(results)]

"""When requests go out: Poisson send times, the open loop that keeps them without waiting for
answers, the closed loop's bookkeeping, and the load steps built on them."""
import asyncio
import statistics
import time

import pytest
from tritonclient.utils import InferenceServerException

from harness.load.outcomes import NO_ANSWER, REJECTED, SERVED
from harness.load.schedule import closed_loop, open_loop, paced, poisson_offsets
from harness.load.unary import DRAINED, capacity, run_concurrency, run_rate, saturated


def test_poisson_offsets_are_seeded_increasing_and_at_the_rate():
    offsets = poisson_offsets(200.0, seed=3, duration=50.0)
    assert offsets == poisson_offsets(200.0, seed=3, duration=50.0)
    assert offsets != poisson_offsets(200.0, seed=4, duration=50.0)
    assert all(b > a for a, b in zip(offsets, offsets[1:])) and 0 < offsets[0] and offsets[-1] <= 50.0
    assert len(offsets) == pytest.approx(200 * 50, rel=0.05)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    # Exponential gaps: mean and standard deviation both 1/rate.
    assert statistics.mean(gaps) == pytest.approx(1 / 200, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 200, rel=0.08)


def test_poisson_offsets_by_count_are_the_same_draw_as_by_duration():
    by_duration = poisson_offsets(10.0, seed=1, duration=5.0)
    assert poisson_offsets(10.0, seed=1, count=len(by_duration)) == by_duration
    assert len(poisson_offsets(10.0, seed=1, count=7)) == 7


@pytest.mark.parametrize("arguments", [dict(rate=0, duration=1), dict(rate=5), dict(rate=5, duration=1, count=3)])
def test_poisson_offsets_refuse_what_they_cannot_draw(arguments):
    rate = arguments.pop("rate")
    with pytest.raises(ValueError):
        poisson_offsets(rate, **arguments)


def test_paced_yields_each_number_at_its_time():
    async def run():
        start = time.perf_counter()
        return start, [(n, s, time.perf_counter()) async for n, s in paced([0.05, 0.10, 0.20], start)]

    start, sent = asyncio.run(run())
    assert [n for n, _, _ in sent] == [0, 1, 2]
    for (_, scheduled, at), offset in zip(sent, [0.05, 0.10, 0.20]):
        assert scheduled == pytest.approx(start + offset)
        assert scheduled <= at < scheduled + 0.1  # never early; late only by the event loop's wake-up


def test_open_loop_sends_on_time_whatever_earlier_answers_take():
    sent = {}

    async def send(number, scheduled):
        sent[number] = time.perf_counter() - scheduled
        await asyncio.sleep(0.3 if number == 0 else 0.0)  # the first answer is slow
        return number

    results = asyncio.run(open_loop(send, [0.01, 0.02, 0.03, 0.04]))
    assert results == [0, 1, 2, 3]
    assert max(sent.values()) < 0.15  # nobody waited for the slow (0.3 s) first answer


def test_closed_loop_keeps_concurrency_in_flight_and_numbers_every_request():
    in_flight, peak, numbers = 0, 0, []

    async def send(number, now):
        nonlocal in_flight, peak
        numbers.append(number)
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return number

    started = time.perf_counter()
    results = asyncio.run(closed_loop(send, concurrency=4, duration=0.2))
    elapsed = time.perf_counter() - started
    assert peak == 4
    assert sorted(numbers) == list(range(len(numbers))) and results == sorted(numbers)
    assert 4 * 0.2 / 0.01 * 0.5 < len(numbers) <= 4 * (0.2 / 0.01 + 1)
    assert 0.2 <= elapsed < 0.6


def test_closed_loop_cancels_what_is_still_running_after_the_drain_timeout():
    async def send(number, now):
        await asyncio.sleep(0.05 if number < 2 else 5.0)
        return number

    started = time.perf_counter()
    results = asyncio.run(closed_loop(send, concurrency=2, duration=0.01, drain_timeout=0.2))
    assert results == [0, 1] and time.perf_counter() - started < 1.0


def test_closed_loop_can_stop_after_a_number_of_requests():
    in_flight, peak = 0, 0

    async def send(number, now):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return number

    assert asyncio.run(closed_loop(send, concurrency=3, duration=0.0, stop_after=10)) == list(range(10))
    assert peak == 3


class FakeClient:
    """tritonclient.grpc.aio's infer: answers after `seconds`, or raises `error` for some requests."""

    def __init__(self, seconds: float, fail_every: int = 0, hang_every: int = 0):
        self.seconds, self.fail_every, self.hang_every, self.calls = seconds, fail_every, hang_every, 0

    async def infer(self, model, inputs, outputs=None, client_timeout=None):
        self.calls += 1
        call = self.calls
        if self.hang_every and call % self.hang_every == 0:
            await asyncio.sleep(60)
        await asyncio.sleep(self.seconds)
        if self.fail_every and call % self.fail_every == 0:
            raise InferenceServerException("[request id: <id_unknown>] Exceeds maximum queue size",
                                           "StatusCode.UNAVAILABLE")
        return inputs


def test_run_concurrency_counts_outcomes_and_latencies():
    result = asyncio.run(run_concurrency(FakeClient(0.01, fail_every=4), "m", lambda n: [n], concurrency=2,
                                         duration=0.3))
    assert result.total == result.successful + result.failed and result.total > 20
    assert result.outcomes[REJECTED] == result.failed == result.total // 4
    assert result.errors == {"[StatusCode.UNAVAILABLE] [request id: <id_unknown>] Exceeds maximum queue size":
                             result.failed}
    assert 10 <= result.p50_ms < 60 and result.achieved_rps == pytest.approx(2 / 0.01 * 0.75, rel=0.4)
    assert saturated(result)  # failures


def test_run_rate_offers_the_schedule_and_counts_unanswered_as_no_answer():
    result = asyncio.run(run_rate(FakeClient(0.005, hang_every=10), "m", lambda n: [n], rate=200, duration=0.5,
                                  drain_timeout=0.2, seed=2))
    assert result.total == len(poisson_offsets(200, 2, duration=0.5)) == result.successful + result.failed
    assert result.outcomes[SERVED] == result.successful and result.outcomes[NO_ANSWER] == result.failed > 0
    assert result.errors == {DRAINED: result.failed}
    assert result.offered_rps == pytest.approx(result.total / 0.5) and result.p99_send_lag_ms < 150


def test_run_rate_drops_sends_beyond_max_outstanding():
    result = asyncio.run(run_rate(FakeClient(0.3), "m", lambda n: [n], rate=400, duration=0.2,
                                  max_outstanding=5, drain_timeout=1.0))
    assert result.successful == 5 and result.dropped == result.total - 5 > 0 and result.failed == result.dropped


def test_capacity_is_served_requests_per_second_of_the_closed_loop():
    async def send(number, scheduled):
        from harness.load.outcomes import Outcome

        await asyncio.sleep(0.02)
        return Outcome(scheduled).end(time.perf_counter(), SERVED if number % 2 else REJECTED)

    assert asyncio.run(capacity(send, concurrency=2, duration_s=0.4)) == pytest.approx(50, rel=0.3)

#!/usr/bin/env python
"""Open-loop Poisson load for Triton models over gRPC (asyncio, one process, one event loop).

Open loop: send times are drawn up front with exponential gaps and each request goes out at its
time whether or not earlier ones have answered, so a server that falls behind meets a growing
queue, as it would from independent users. Latency is measured from the *scheduled* send time,
so a client that fell behind its schedule cannot hide server queueing (coordinated omission);
`p99_send_lag_ms` says how late the client itself was.

Bounded: each step stops sending after its duration, waits at most `drain_timeout` for answers,
then cancels the rest (counted failed); at most `max_outstanding` requests are in flight (a send
beyond that is dropped and counted failed, never delayed, which would close the loop); a sweep
stops before `max_total_s`. Only a loopback server can be targeted.

As a library:  results = asyncio.run(sweep(url, ["tokenizer"], text_inputs(texts), [100, 200], 15))
From the shell: python perf/loadgen.py --url 127.0.0.1:8001 --model tokenizer --rates 100,200
"""
import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")

InputsFactory = Callable[[int], list]  # request number -> the InferInputs of that request


@dataclass
class LoadResult:
    model: str
    target_rps: Optional[float]  # Poisson steps
    concurrency: Optional[int]  # closed-loop steps
    duration_s: float  # of the sending window
    total: int  # requests the schedule asked for
    offered_rps: float  # total / duration: the rate this step's random draw actually offered
    successful: int
    failed: int  # errors, timeouts and drops
    dropped: int  # never sent: max_outstanding requests were already in flight
    achieved_rps: float  # successful responses / (last response - first send)
    avg_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p99_send_lag_ms: float
    client_cpu: float  # this process's CPU seconds / wall seconds (1.0 = one full core)
    errors: dict = field(default_factory=dict)
    server: dict = field(default_factory=dict)  # what the sweep's `observe` hook reported

    def row(self) -> str:
        load = f"{self.target_rps:8.1f} rps" if self.target_rps is not None else f"conc {self.concurrency:6d}"
        return (f"{self.model:>20} {load} achieved {self.achieved_rps:8.1f}  ok {self.successful:6d}/{self.total:<6d} "
                f"failed {self.failed:5d}  avg {self.avg_ms:8.1f}  p50 {self.p50_ms:8.1f}  p90 {self.p90_ms:8.1f}  "
                f"p99 {self.p99_ms:8.1f} ms  lag99 {self.p99_send_lag_ms:6.1f} ms  client cpu {self.client_cpu:4.2f}")


def check_loopback(url: str) -> None:
    host = url.rsplit(":", 1)[0].strip("[]")
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"{url}: the load generator only targets a local server ({', '.join(LOOPBACK_HOSTS)})")


def text_inputs(texts: Sequence[str], name: str = "text_input") -> InputsFactory:
    """One single-text request per text, built once: serializing inputs per request would cost
    the client CPU the server needs."""
    prebuilt = []
    for text in texts:
        tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=np.object_))
        prebuilt.append([tensor])
    return lambda i: prebuilt[i % len(prebuilt)]


class _Step:
    """Bookkeeping of one load step."""

    def __init__(self, client, model: str, make_inputs: InputsFactory, outputs, timeout: float):
        self.client, self.model, self.make_inputs, self.outputs, self.timeout = client, model, make_inputs, outputs, timeout
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.errors: Counter = Counter()
        self.last_done = 0.0

    async def one(self, number: int, scheduled: float) -> None:
        self.lags.append(time.perf_counter() - scheduled)
        try:
            await self.client.infer(self.model, self.make_inputs(number), outputs=self.outputs, client_timeout=self.timeout)
        except InferenceServerException as error:
            self.errors[str(error)[:160]] += 1
            return
        done = time.perf_counter()
        self.latencies.append(done - scheduled)
        self.last_done = done

    async def finish(self, pending: set, drain_timeout: float) -> None:
        if pending:
            _, late = await asyncio.wait(pending, timeout=drain_timeout)
            for task in late:
                task.cancel()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
                self.errors["cancelled: no answer within the drain timeout"] += len(late)

    def result(self, target_rps, concurrency, duration, total, dropped, start, cpu_start) -> LoadResult:
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        lat = np.array(self.latencies) * 1000
        pct = np.percentile(lat, [50, 90, 99]) if len(lat) else [float("nan")] * 3
        errors = dict(self.errors)
        if dropped:
            errors[f"dropped: max_outstanding in flight"] = dropped
        return LoadResult(
            model=self.model, target_rps=target_rps, concurrency=concurrency, duration_s=duration, total=total,
            offered_rps=total / duration,
            successful=len(lat), failed=total - len(lat), dropped=dropped,
            achieved_rps=len(lat) / (self.last_done - start) if len(lat) else 0.0,
            avg_ms=float(lat.mean()) if len(lat) else float("nan"),
            p50_ms=float(pct[0]), p90_ms=float(pct[1]), p99_ms=float(pct[2]),
            p99_send_lag_ms=float(np.percentile(self.lags, 99) * 1000) if self.lags else 0.0,
            client_cpu=cpu / wall, errors=errors,
        )


async def run_rate(client, model: str, make_inputs: InputsFactory, rate: float, duration: float, *,
                   max_outstanding: int = 1024, drain_timeout: float = 30.0, seed: int = 0,
                   outputs=None) -> LoadResult:
    """One Poisson step at `rate` requests/s for `duration` seconds."""
    step = _Step(client, model, make_inputs, outputs, duration + drain_timeout)
    rng = random.Random(seed)
    pending: set = set()
    total = dropped = 0
    cpu_start, start = time.process_time(), time.perf_counter()
    scheduled = start
    while True:
        scheduled += rng.expovariate(rate)
        if scheduled - start > duration:
            break
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        total += 1
        if len(pending) >= max_outstanding:
            dropped += 1
            continue
        task = asyncio.create_task(step.one(total, scheduled))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await step.finish(pending, drain_timeout)
    return step.result(rate, None, duration, total, dropped, start, cpu_start)


async def run_concurrency(client, model: str, make_inputs: InputsFactory, concurrency: int, duration: float, *,
                          drain_timeout: float = 30.0, outputs=None) -> LoadResult:
    """Closed loop: `concurrency` workers, each sending its next request when the last one answers
    (a throughput measurement, not a latency one)."""
    step = _Step(client, model, make_inputs, outputs, duration + drain_timeout)
    counter = iter(range(1 << 62))
    cpu_start, start = time.process_time(), time.perf_counter()
    end = start + duration

    async def worker():
        while time.perf_counter() < end:
            await step.one(next(counter), time.perf_counter())

    workers = {asyncio.create_task(worker()) for _ in range(concurrency)}
    await asyncio.sleep(duration)
    await step.finish(workers, drain_timeout)
    return step.result(None, concurrency, duration, len(step.lags), 0, start, cpu_start)


def saturated(result: LoadResult, fraction: float = 0.95) -> bool:
    """The server did not keep up with the offered rate: its queue grew during the step.
    Against the rate actually offered, not the target, which a Poisson draw misses by a few %."""
    return result.failed > 0 or result.achieved_rps < fraction * result.offered_rps


async def sweep(url: str, models: Sequence[str], make_inputs: InputsFactory, rates: Sequence[float],
                duration: float, *, max_total_s: float = 600, max_outstanding: int = 1024,
                drain_timeout: float = 30.0, stop_after_saturated: int = 2, outputs=None, seed: int = 0,
                pause_s: float = 1.0, observe: Optional[Callable[[str], Callable[[], dict]]] = None,
                log: Callable[[str], None] = print) -> list[LoadResult]:
    """Every rate for every model, the models interleaved (their order alternating from rate to
    rate) so that drift in the machine's load hits all of them alike. A model stops after
    `stop_after_saturated` consecutive saturated steps (0: never). `observe(model)`, called before
    a step, returns a function called after it whose dict lands in the result's `server`."""
    check_loopback(url)
    results: list[LoadResult] = []
    streak = {m: 0 for m in models}
    deadline = time.monotonic() + max_total_s
    async with grpcclient.InferenceServerClient(url) as client:
        for k, rate in enumerate(rates):
            for model in (models if k % 2 == 0 else list(reversed(models))):
                if stop_after_saturated and streak[model] >= stop_after_saturated:
                    continue
                if time.monotonic() + duration + pause_s > deadline:
                    log(f"loadgen: max_total_s={max_total_s} reached, stopping the sweep")
                    return results
                finish = observe(model) if observe else None
                result = await run_rate(client, model, make_inputs, rate, duration, max_outstanding=max_outstanding,
                                        drain_timeout=drain_timeout, seed=seed + k, outputs=outputs)
                if finish:
                    result.server = finish()
                results.append(result)
                log(result.row() + (f"  server {result.server}" if result.server else ""))
                streak[model] = streak[model] + 1 if saturated(result) else 0
                await asyncio.sleep(pause_s)  # let the server's threads settle between steps
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="127.0.0.1:8001", help="gRPC address of a local tritonserver")
    parser.add_argument("--model", action="append", required=True, help="repeat to interleave several models")
    parser.add_argument("--rates", default="50,100,200", help="comma-separated target requests/s")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of sending per step")
    parser.add_argument("--max-total-s", type=float, default=600.0)
    parser.add_argument("--max-outstanding", type=int, default=1024)
    parser.add_argument("--texts", type=int, default=256, help="distinct synthetic texts")
    parser.add_argument("--tokens", type=int, default=500, help="tokens per synthetic text")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    from texts import synthetic_texts

    factory = text_inputs(synthetic_texts(args.texts, args.tokens))
    results = asyncio.run(sweep(args.url, args.model, factory, [float(r) for r in args.rates.split(",")],
                                args.duration, max_total_s=args.max_total_s, max_outstanding=args.max_outstanding))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)


if __name__ == "__main__":
    main()

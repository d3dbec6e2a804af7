"""Request/response load over gRPC (tritonclient.grpc.aio, one event loop), every request ending
in an Outcome.

- `run_rate`: one open-loop Poisson step, bounded: it stops sending after its duration, waits at
  most `drain_timeout` for answers and cancels the rest (no answer), and keeps at most
  `max_outstanding` requests in flight (a send beyond that is dropped and counted failed, never
  delayed, which would close the loop). `p99_send_lag_ms` says how late the client itself was.
- `run_concurrency`: a closed loop, for throughput.
- `sweep`: rates x models, the models interleaved (order alternating from rate to rate) so drift
  in the machine's load hits all of them alike, a model stopping after consecutive saturated
  steps, the whole under `max_total_s`.
- `flood`, `burst`, `capacity`: what a send function (number, scheduled) -> Outcome gets under
  a Poisson flood, all at once, or from a closed loop.
Only a loopback server is targeted.

    results = asyncio.run(sweep(url, ["tokenizer"], single_texts(texts), rates=[100, 200], duration=15))
"""
import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ..clients.kserve import check_loopback
from ..stats import percentile
from .outcomes import NO_ANSWER, SERVED, Outcome, count
from .schedule import closed_loop, open_loop, paced, poisson_offsets

InputsFactory = Callable[[int], list]  # request number -> the InferInputs of that request
Send = Callable[[int, float], Awaitable[Outcome]]  # (request number, scheduled time) -> outcome
DRAINED = "cancelled: no answer within the drain timeout"


@dataclass
class LoadResult:
    model: str
    target_rps: Optional[float]  # Poisson steps
    concurrency: Optional[int]  # closed-loop steps
    duration_s: float  # of the sending window
    total: int  # requests the schedule asked for
    offered_rps: float  # total / duration: the rate this step's random draw actually offered
    successful: int  # served
    failed: int  # everything else: errors, no answer, drops
    dropped: int  # never sent: max_outstanding requests were already in flight
    achieved_rps: float  # served responses / (last response - first send)
    avg_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p99_send_lag_ms: float
    client_cpu: float  # this process's CPU seconds / wall seconds (1.0 = one full core)
    outcomes: dict = field(default_factory=dict)  # kind -> requests
    errors: dict = field(default_factory=dict)  # message -> requests
    server: dict = field(default_factory=dict)  # what the sweep's `observe` hook reported

    def row(self) -> str:
        load = f"{self.target_rps:8.1f} rps" if self.target_rps is not None else f"conc {self.concurrency:6d}"
        return (f"{self.model:>20} {load} achieved {self.achieved_rps:8.1f}  ok {self.successful:6d}/{self.total:<6d} "
                f"failed {self.failed:5d}  avg {self.avg_ms:8.1f}  p50 {self.p50_ms:8.1f}  p90 {self.p90_ms:8.1f}  "
                f"p99 {self.p99_ms:8.1f} ms  lag99 {self.p99_send_lag_ms:6.1f} ms  client cpu {self.client_cpu:4.2f}")


async def infer_once(client, model: str, inputs: list, scheduled: float, outputs=None, timeout=None,
                     read: Optional[Callable] = None, deadline_us: Optional[int] = None) -> Outcome:
    """One request; a served outcome holds read(result) (the result itself without `read`).
    `timeout`: the client's own limit (s); `deadline_us`: the request's Triton `timeout`, how long
    it may wait in each model's queue before the server rejects it (the queue policy's timeout
    when shorter)."""
    outcome = Outcome(scheduled)
    # The HTTP aio client has no client_timeout argument; `timeout` (the deadline) both have.
    limits = {} if timeout is None else {"client_timeout": timeout}
    if deadline_us is not None:
        limits["timeout"] = deadline_us
    try:
        result = await client.infer(model, inputs, outputs=outputs, **limits)
    except InferenceServerException as error:
        return outcome.fail(time.perf_counter(), error)
    return outcome.end(time.perf_counter(), SERVED, result=read(result) if read else result)


async def embed_once(client, inputs: list, scheduled: float, deadline_us: Optional[int] = None) -> Outcome:
    return await infer_once(client, "embed", inputs, scheduled, outputs=[grpcaio.InferRequestedOutput("embedding")],
                            read=lambda result: result.as_numpy("embedding"), deadline_us=deadline_us)


async def generate_once(client, inputs: list, scheduled: float, model: str = "generate",
                        deadline_us: Optional[int] = None) -> Outcome:
    """One request on a gRPC stream of its own (a stream's errors carry no request id); a served
    outcome holds the text (a streamed one's chunks joined). `deadline_us` as in infer_once."""
    async def one_request():
        yield {"model_name": model, "inputs": inputs, "timeout": deadline_us}

    outcome, text, finished = Outcome(scheduled), [], None
    try:
        # Read on to the stream's end after the response that finishes the request: leaving the
        # loop there dropped the call, and its cancel, arriving as Triton 2.51 sent the final
        # response, could keep `generate` loaded until the server's exit timeout
        # (docs/triton-quirks.md).
        async for result, error in client.stream_infer(one_request()):
            if error is not None:
                return outcome.fail(time.perf_counter(), error)
            text.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            if finished is None and result.as_numpy("finish_reason").reshape(-1)[0]:
                finished = time.perf_counter()
    except InferenceServerException as error:
        return outcome.fail(time.perf_counter(), error)
    if finished is not None:
        return outcome.end(finished, SERVED, result="".join(text))
    return outcome.fail(time.perf_counter(), "the stream ended without a final response")


class _Step:
    """Bookkeeping of one load step."""

    def __init__(self, client, model: str, make_inputs: InputsFactory, outputs, timeout: float):
        self.client, self.model, self.make_inputs = client, model, make_inputs
        self.outputs, self.timeout = outputs, timeout
        self.outcomes: list[Outcome] = []
        self.lags: list[float] = []
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    async def one(self, number: int, scheduled: float) -> Outcome:
        self.lags.append(time.perf_counter() - scheduled)
        outcome = Outcome(scheduled)
        self.outcomes.append(outcome)
        result = await infer_once(self.client, self.model, self.make_inputs(number), scheduled, self.outputs,
                                  self.timeout)
        return outcome.end(result.ended, result.kind, result.message)

    async def drain(self, pending: set, drain_timeout: float) -> None:
        if pending:
            _, late = await asyncio.wait(pending, timeout=drain_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    def result(self, target_rps, concurrency, duration, total, dropped) -> LoadResult:
        wall = time.perf_counter() - self.start
        for outcome in self.outcomes:
            if outcome.kind is None:
                outcome.end(time.perf_counter(), NO_ANSWER, DRAINED)
        served = [o for o in self.outcomes if o.kind == SERVED]
        latencies = [o.latency_s * 1000 for o in served]
        errors: dict = {}
        for o in self.outcomes:
            if o.kind != SERVED:
                errors[o.message[:160]] = errors.get(o.message[:160], 0) + 1
        if dropped:
            errors["dropped: max_outstanding in flight"] = dropped
        kinds = {k: n for k, n in count(self.outcomes).items() if n}
        return LoadResult(
            model=self.model, target_rps=target_rps, concurrency=concurrency, duration_s=duration, total=total,
            offered_rps=total / duration, successful=len(served), failed=total - len(served), dropped=dropped,
            achieved_rps=len(served) / (max(o.ended for o in served) - self.start) if served else 0.0,
            avg_ms=sum(latencies) / len(latencies) if latencies else float("nan"),
            p50_ms=percentile(latencies, 50), p90_ms=percentile(latencies, 90), p99_ms=percentile(latencies, 99),
            p99_send_lag_ms=percentile(self.lags, 99) * 1000 if self.lags else 0.0,
            client_cpu=(time.process_time() - self.cpu_start) / wall, outcomes=kinds, errors=errors)


async def run_rate(client, model: str, make_inputs: InputsFactory, rate: float, duration: float, *,
                   max_outstanding: int = 1024, drain_timeout: float = 30.0, seed: int = 0,
                   outputs=None) -> LoadResult:
    """One Poisson step at `rate` requests/s for `duration` seconds."""
    step = _Step(client, model, make_inputs, outputs, duration + drain_timeout)
    offsets = poisson_offsets(rate, seed, duration=duration)
    pending: set = set()
    dropped = 0
    async for number, scheduled in paced(offsets, step.start):
        if len(pending) >= max_outstanding:
            dropped += 1
            continue
        task = asyncio.create_task(step.one(number, scheduled))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await step.drain(pending, drain_timeout)
    return step.result(rate, None, duration, len(offsets), dropped)


async def run_concurrency(client, model: str, make_inputs: InputsFactory, concurrency: int, duration: float, *,
                          drain_timeout: float = 30.0, outputs=None) -> LoadResult:
    """Closed loop: `concurrency` clients, each sending its next request when the last one answered."""
    step = _Step(client, model, make_inputs, outputs, duration + drain_timeout)
    await closed_loop(step.one, concurrency, duration, drain_timeout)
    return step.result(None, concurrency, duration, len(step.outcomes), 0)


def saturated(result: LoadResult, fraction: float = 0.95) -> bool:
    """The server did not keep up with the offered rate: its queue grew during the step.
    Against the rate actually offered, not the target, which a Poisson draw misses by a few %."""
    return result.failed > 0 or result.achieved_rps < fraction * result.offered_rps


async def sweep(url: str, models: Sequence[str], make_inputs: InputsFactory, rates: Sequence[float],
                duration: float, *, max_total_s: float = 600, max_outstanding: int = 1024,
                drain_timeout: float = 30.0, stop_after_saturated: int = 2, outputs=None, seed: int = 0,
                pause_s: float = 1.0, observe: Optional[Callable[[str], Callable[[], dict]]] = None,
                log: Callable[[str], None] = print) -> list[LoadResult]:
    """Every rate for every model, interleaved. A model stops after `stop_after_saturated`
    consecutive saturated steps (0: never). `observe(model)`, called before a step, returns a
    function called after it whose dict lands in the result's `server`."""
    check_loopback(url)
    results: list[LoadResult] = []
    streak = {m: 0 for m in models}
    deadline = time.monotonic() + max_total_s
    async with grpcaio.InferenceServerClient(url) as client:
        for k, rate in enumerate(rates):
            for model in (models if k % 2 == 0 else list(reversed(models))):
                if stop_after_saturated and streak[model] >= stop_after_saturated:
                    continue
                if time.monotonic() + duration + pause_s > deadline:
                    log(f"max_total_s={max_total_s} reached, stopping the sweep")
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


async def warm_up(url: str, make_inputs: InputsFactory, models: Sequence[str], requests: int = 64,
                  concurrency: int = 16) -> list:
    """`requests` requests to each model, `concurrency` at a time (every instance loads its first
    batch shapes; more at once would meet the committed queue limits); returns the last model's
    results in order."""
    check_loopback(url)
    async with grpcaio.InferenceServerClient(url) as client:
        for model in models:
            results = await closed_loop(lambda n, _: client.infer(model, make_inputs(n)), concurrency, 0.0,
                                        stop_after=requests)
    return results


async def flood(send: Send, rate: float, duration_s: float, seed: int = 0) -> list[Outcome]:
    """Requests at Poisson times of `rate` per second for `duration_s`; waits for every answer."""
    return await open_loop(send, poisson_offsets(rate, seed, duration=duration_s))


async def burst(send: Send, count: int) -> list[Outcome]:
    """`count` requests all at once."""
    now = time.perf_counter()
    return list(await asyncio.gather(*(send(number, now) for number in range(count))))


async def capacity(send: Send, concurrency: int, duration_s: float) -> float:
    """Served requests per second of a closed loop of `concurrency` clients (no request waits in
    a queue beyond those in flight)."""
    start = time.perf_counter()
    served = [o.ended for o in await closed_loop(send, concurrency, duration_s) if o.kind == SERVED]
    return len(served) / (max(served) - start) if served else 0.0


def main() -> None:
    """python -m harness.load.unary --model tokenizer --rates 100,200: a Poisson sweep of single
    synthetic texts against a running local server."""
    import argparse
    import json
    from dataclasses import asdict

    from ..clients.kserve import single_texts
    from ..corpora import synthetic_texts

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--url", default="127.0.0.1:8001", help="gRPC address of a local tritonserver")
    parser.add_argument("--model", action="append", required=True, help="repeat to interleave several models")
    parser.add_argument("--rates", default="50,100,200", help="comma-separated target requests/s")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of sending per step")
    parser.add_argument("--max-total-s", type=float, default=600.0)
    parser.add_argument("--texts", type=int, default=256, help="distinct synthetic texts")
    parser.add_argument("--tokens", type=int, default=500, help="tokens per synthetic text")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(sweep(args.url, args.model, single_texts(synthetic_texts(args.texts, args.tokens)),
                                [float(r) for r in args.rates.split(",")], args.duration, max_total_s=args.max_total_s))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)


if __name__ == "__main__":
    main()

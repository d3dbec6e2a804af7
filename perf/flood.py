"""Floods that record what became of each request: served, rejected at the door (Triton's queue
full: UNAVAILABLE), timed out in a queue, or failed otherwise, and after how long.

Open loop at a fixed rate (Poisson gaps from a seed): a request goes out at its time whether or
not earlier ones answered, and its latency counts from that time. `generate` requests use one
gRPC stream each, so an error is known to belong to its request. Only a loopback server can be
targeted (loadgen.check_loopback). Used by perf/bench_overload.py and tests/integration/test_overload.py.
"""
import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

SERVED, REJECTED, TIMED_OUT, FAILED = "served", "rejected", "timed out", "failed"


@dataclass
class Outcome:
    kind: str
    scheduled: float  # perf_counter time it was due to be sent
    latency_s: float  # from `scheduled` to its answer (the final response of a stream)
    message: str = ""
    result: object = None  # embedding row, or generated text


def classify(message: str) -> str:
    if "Exceeds maximum queue size" in message:
        return REJECTED
    if "timeout" in message.lower():
        return TIMED_OUT
    return FAILED


def tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


def embed_inputs(texts: Sequence[str]) -> list:
    return [tensor("text_input", np.array([[t.encode()] for t in texts], dtype=np.object_))]


def generate_inputs(text: str, max_tokens: int) -> list:
    return [tensor("text_input", np.array([[text.encode()]], dtype=np.object_)),
            tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
            tensor("stream", np.array([[False]], dtype=bool))]


async def embed_once(client, inputs: list, scheduled: float) -> Outcome:
    try:
        result = await client.infer("embed", inputs, outputs=[grpcclient.InferRequestedOutput("embedding")])
    except InferenceServerException as error:
        return Outcome(classify(str(error)), scheduled, time.perf_counter() - scheduled, str(error))
    return Outcome(SERVED, scheduled, time.perf_counter() - scheduled, result=result.as_numpy("embedding"))


async def generate_once(client, inputs: list, scheduled: float) -> Outcome:
    async def one_request():
        yield {"model_name": "generate", "inputs": inputs}

    text = []
    try:
        async for result, error in client.stream_infer(one_request()):
            if error is not None:
                return Outcome(classify(str(error)), scheduled, time.perf_counter() - scheduled, str(error))
            text.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            if result.as_numpy("finish_reason").reshape(-1)[0]:
                return Outcome(SERVED, scheduled, time.perf_counter() - scheduled, result="".join(text))
    except InferenceServerException as error:
        return Outcome(classify(str(error)), scheduled, time.perf_counter() - scheduled, str(error))
    return Outcome(FAILED, scheduled, time.perf_counter() - scheduled, "the stream ended without a final response")


Send = Callable[[int, float], Awaitable[Outcome]]  # (request number, scheduled time) -> outcome


async def flood(send: Send, rate: float, duration_s: float, seed: int = 0) -> list[Outcome]:
    """Requests at Poisson times of `rate` per second for `duration_s`; waits for every answer."""
    rng = random.Random(seed)
    tasks, number = [], 0
    start = scheduled = time.perf_counter()
    while True:
        scheduled += rng.expovariate(rate)
        if scheduled - start > duration_s:
            break
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(number, scheduled)))
        number += 1
    return list(await asyncio.gather(*tasks))


async def burst(send: Send, count: int) -> list[Outcome]:
    """`count` requests all at once."""
    now = time.perf_counter()
    return list(await asyncio.gather(*(send(number, now) for number in range(count))))


async def capacity(send: Send, concurrency: int, duration_s: float) -> float:
    """Served requests per second with `concurrency` clients each sending its next request as
    soon as the last one answered (no request waits in a queue beyond those in flight)."""
    end = time.perf_counter() + duration_s
    served, number = [], iter(range(10**9))

    async def client():
        while time.perf_counter() < end:
            outcome = await send(next(number), time.perf_counter())
            if outcome.kind == SERVED:
                served.append(time.perf_counter())

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return len(served) / (max(served) - start) if served else 0.0


def latency_ms(outcomes: Sequence[Outcome], kind: str, q: float) -> float:
    values = [o.latency_s * 1000 for o in outcomes if o.kind == kind]
    return float(np.percentile(values, q)) if values else float("nan")

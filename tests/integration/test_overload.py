"""Beyond their queues' size, models reject at once with UNAVAILABLE; what they accepted is served
correctly, and the server is ready and serving right after. (Rates and latency figures:
perf/bench_overload.py.)"""
import asyncio
from collections import Counter

import numpy as np
import tritonclient.grpc.aio as grpcclient

from harness.clients.kserve import generate_inputs, text_inputs
from harness.load.outcomes import REJECTED, SERVED, latency_ms
from harness.load.unary import burst, embed_once, generate_once

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Water boils at"]


def run_burst(url: str, send_factory, count: int):
    async def main():
        async with grpcclient.InferenceServerClient(url) as client:
            send = send_factory(client)
            before = await send(-1, 0.0)
            outcomes = await burst(send, count)
            after = await send(-1, 0.0)
            ready = await client.is_server_ready()
        return before, outcomes, after, ready

    return asyncio.run(main())


def check(outcomes, before, after, ready) -> Counter:
    kinds = Counter(o.kind for o in outcomes)
    print(dict(kinds), f"rejection P99 {latency_ms(outcomes, REJECTED, 99):.0f} ms")
    assert kinds[REJECTED] > 0, kinds  # the burst went beyond the queues
    # Nothing failed or timed out in a queue: every request was served or rejected at the door.
    unexpected = [o for o in outcomes if o.kind not in (SERVED, REJECTED)]
    assert not unexpected, [(o.kind, o.message) for o in unexpected][:3]
    for outcome in outcomes:
        if outcome.kind == REJECTED:
            assert "UNAVAILABLE" in outcome.message or "Exceeds maximum queue size" in outcome.message
            assert outcome.latency_s < 5, outcome  # answered, not left waiting
    assert before.kind == after.kind == SERVED and ready
    return kinds


def test_embed_burst_beyond_the_queues(server):
    texts = [f"Request {i} asks about the weather in city number {i % 97}." for i in range(600)]

    def sender(client):
        async def send(number, scheduled):
            return await embed_once(client, text_inputs([texts[number]]), scheduled)
        return send

    before, outcomes, after, ready = run_burst(server.grpc_url, sender, len(texts))
    check(outcomes, before, after, ready)
    assert np.allclose(before.result, after.result, atol=1e-5)  # texts[-1], before and after

    async def references():
        async with grpcclient.InferenceServerClient(server.grpc_url) as client:
            return [await embed_once(client, text_inputs(texts[i:i + 50]), 0.0) for i in range(0, 600, 50)]

    reference = np.concatenate([o.result for o in asyncio.run(references())])
    for number, outcome in enumerate(outcomes):
        if outcome.kind == SERVED:
            assert float(np.dot(outcome.result[0], reference[number])) > 0.9999, number


def test_generate_burst_beyond_admission_and_queue(server):
    """The llm's queue holds 16 (and its ranks max_active_requests, 16, once it has taken them
    from the queue one by one): of 60 arriving at once, the rest are rejected."""
    def sender(client):
        async def send(number, scheduled):
            return await generate_once(client, generate_inputs(PROMPTS[number % len(PROMPTS)], 8, stream=False),
                                       scheduled)
        return send

    async def references():
        async with grpcclient.InferenceServerClient(server.grpc_url) as client:
            return [(await generate_once(client, generate_inputs(p, 8, stream=False), 0.0)).result for p in PROMPTS]

    expected = asyncio.run(references())
    before, outcomes, after, ready = run_burst(server.grpc_url, sender, 60)
    kinds = check(outcomes, before, after, ready)
    assert kinds[SERVED] >= 16  # the queue's size at the least
    for number, outcome in enumerate(outcomes):
        if outcome.kind == SERVED:
            assert outcome.result == expected[number % len(PROMPTS)], number

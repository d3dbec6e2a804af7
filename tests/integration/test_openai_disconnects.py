"""OpenAI clients that leave mid-answer free their engine sequences: the front cancels their gRPC
streams (every request is a stream, whole answers too), and the llm frees what its detokenizer no
longer acknowledges. Read from the llm's own gauges, as tests/integration/test_abandoned_streams.py
does for gRPC clients."""
import asyncio
import time

from harness.clients.openai import async_sdk
from harness.triton_metrics import llm_gauges

LONG = 1000  # tokens: minutes of work each at this machine's speed if nothing frees them; within the
# llama_cpp deployment's context per sequence (1024 tokens: scripts/configure.py --engine llama_cpp)
LIVE = 200  # tokens of the answer that goes on throughout (it must not be taken for abandoned)


def counting(n: int) -> str:
    """A prompt greedy decoding goes on from without end (counting), different for each n."""
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


def gauges(server) -> dict:
    return llm_gauges(server.metrics(), "llm")


async def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)
    return value


def test_50_clients_that_leave_mid_answer_leave_no_sequence_and_no_kv_block(openai_server):
    async def scenario():
        client = async_sdk(openai_server.openai_url, timeout=600)
        before = gauges(openai_server)
        request = dict(model="generate", max_tokens=LONG, temperature=0)
        live_text = client.completions.create(**{**request, "max_tokens": LIVE}, prompt=counting(1000))
        live_stream = await client.completions.create(**{**request, "max_tokens": LIVE}, prompt=counting(1000),
                                                      stream=True)
        live_parts = []

        async def read_live():
            async for chunk in live_stream:
                live_parts.append(chunk.choices[0].text)

        live = [asyncio.ensure_future(live_text), asyncio.ensure_future(read_live())]
        # A stream's response starts with its first token: once created, each stream is answering.
        opening = asyncio.gather(*(client.completions.create(**request, prompt=counting(i), stream=True)
                                   for i in range(25)))
        # Whole answers: the client gives up (its task cancelled, its connection closed) mid-answer.
        wholes = [asyncio.ensure_future(client.completions.create(**request, prompt=counting(100 + i)))
                  for i in range(25)]
        streams = await asyncio.wait_for(opening, 300)
        for stream in streams:
            await stream.__anext__()
        await wait_for(lambda: gauges(openai_server)["active_sequences"] == 52, 300,
                       "52 sequences in the engine")
        engaged = gauges(openai_server)
        assert not any(task.done() for task in live), "the live answers ended before the others left"

        left = time.monotonic()
        for stream in streams:
            await stream.close()
        for task in wholes:
            task.cancel()
        await asyncio.gather(*wholes, return_exceptions=True)
        unfinished = lambda: sum(not task.done() for task in live)  # noqa: E731
        await wait_for(lambda: gauges(openai_server)["active_sequences"] <= unfinished(), 120,
                       "the abandoned sequences were not freed")
        print(f"50 OpenAI clients left ({engaged['active_sequences']:.0f} sequences, "
              f"{engaged['kv_cache_blocks']:.0f} KV blocks in the engine): freed in {time.monotonic() - left:.1f} s")

        whole, _ = await asyncio.wait_for(asyncio.gather(*live), 600)
        assert "".join(live_parts) == whole.choices[0].text and whole.usage.completion_tokens == LIVE
        idle = await wait_for(lambda: (g := gauges(openai_server))["active_sequences"] == 0 and g, 60, "idle")
        assert idle["kv_cache_blocks"] == 0 and idle["outstanding_tokens"] == 0, idle
        assert idle["cancelled_requests_total"] - before["cancelled_requests_total"] == 50
        await client.close()

    asyncio.run(scenario())
    assert openai_server.is_ready() and openai_server.openai_health()[0] == 200

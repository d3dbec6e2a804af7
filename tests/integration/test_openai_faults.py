"""The OpenAI front when the server behind it cannot answer: a full queue is a 503 with Retry-After,
requests refused while a killed stub's model is restored wait for it and are served, a killed llm
stub (whose requests Triton never ends) is an error within the front's inactivity deadline, and
when tritonserver exits, serve.sh stops the front and exits with the server's status.

One small deployment: at most 4 sequences in the llm and 1 request in its queue, so a burst
overflows it; a 30 s inactivity deadline, which is also how long a request waits out a model's
restore. Its tests run in file order: the llm stub kill leaves the llm dead, and the last test
ends the server."""
import asyncio
import contextlib
import os
import signal
import time

import openai
import psutil
import pytest

from harness.clients.openai import async_sdk, sdk
from harness.deploy import write_deployment
from harness.faults import SteadyLoad, kill_stub, model_stubs
from harness.ranks import wait_idle
from harness.server import triton_server

DEADLINE_S = 30.0  # a loaded 2-core machine restored llm_tokenizer in 9 s (CI, 2026-11-28)


def counting(n: int) -> str:
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("openai-faults")
    repositories = write_deployment(out, "--set", "llm.max_active_requests=4", "--queue", "llm=1")
    with triton_server(out / "server.log", repositories=repositories, openai=True,
                       env={"TRITONFRONT_OPENAI_STREAM_TIMEOUT": str(DEADLINE_S)}) as running:
        yield running


def test_a_burst_beyond_the_llms_queue_is_503_with_retry_after(server):
    client = sdk(server.openai_url)
    expected = client.completions.create(model="generate", prompt=counting(3), max_tokens=32, temperature=0)

    async def burst():
        async_client = async_sdk(server.openai_url)
        calls = [async_client.completions.with_raw_response.create(model="generate", prompt=counting(3), max_tokens=32,
                                                                    temperature=0) for _ in range(12)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        await async_client.close()
        return results

    started = time.monotonic()
    results = asyncio.run(burst())
    rejected = [r for r in results if isinstance(r, openai.APIStatusError)]
    served = [r.parse() for r in results if not isinstance(r, BaseException)]
    assert rejected and served, results
    assert len(rejected) + len(served) == len(results), [r for r in results if isinstance(r, BaseException)]
    for error in rejected:
        assert error.status_code == 503 and error.body["code"] == "queue_full", error.body
        assert int(error.response.headers["retry-after"]) >= 1
    assert all(answer.choices[0].text == expected.choices[0].text for answer in served)
    print(f"{len(served)} served, {len(rejected)} rejected with 503 in {time.monotonic() - started:.1f} s")


def test_requests_wait_out_a_killed_tokenizer_stubs_restore_and_are_served(server):
    """A steady load through the front while every llm_tokenizer stub is SIGKILLed and the watchdog
    reloads the model: the requests it refuses meanwhile ("is not healthy", none had output) are
    sent again by the front until it is back, so every request is served, and correctly."""
    client = sdk(server.openai_url, timeout=120)
    prompt = counting(2)

    def complete() -> str:
        return client.completions.create(model="generate", prompt=prompt, max_tokens=6, temperature=0).choices[0].text

    expected = complete()
    wait_idle(server, "llm")
    # One client: this deployment's llm queues 1 request (the burst test's overflow), and two
    # clients' requests found it full now and then.
    with SteadyLoad(complete, lambda text: text == expected, clients=1) as load:
        deadline = time.monotonic() + 120
        while sum(1 for o in load.snapshot() if o.correct) < 3:
            assert time.monotonic() < deadline, load.snapshot()
            time.sleep(0.05)
        for pid in model_stubs(server.pid, "llm_tokenizer"):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        # Requests sent from a second after the kill go to a dead or reloading model: six correct
        # answers to them end the load after the restore.
        while sum(1 for o in load.snapshot() if o.correct and o.scheduled > killed + 1) < 6:
            assert time.monotonic() < killed + 120, load.snapshot()
            time.sleep(0.2)
    after = [o for o in load.snapshot() if o.scheduled > killed]
    waited = server.log().count("waiting up to")
    print(f"{len(after)} requests sent after the kill, {waited} of them waited out the restore")
    assert all(o.kind == "served" and o.correct for o in load.snapshot()), \
        [(o.scheduled - killed, o.kind, o.message[:120]) for o in load.snapshot() if not o.correct]
    assert waited, "no request met the dead model"


def test_a_killed_llm_stub_ends_its_clients_requests_within_the_deadline(server):
    """Streamed and whole: both are gRPC streams the front gives up on once they go quiet."""
    client = async_sdk(server.openai_url, timeout=300)

    async def streamed(ended: dict):
        stream = await client.chat.completions.create(
            model="generate", messages=[{"role": "user", "content": "Count from 1 to 1000."}], max_tokens=1500,
            temperature=0, stream=True)
        try:
            async for chunk in stream:
                ended["chunks"] = ended.get("chunks", 0) + 1
        except openai.APIError as error:
            ended["error"], ended["at"] = error, time.monotonic()

    async def whole(ended: dict):
        try:
            await client.completions.create(model="generate", prompt=counting(5), max_tokens=1500, temperature=0)
        except openai.APIStatusError as error:
            ended["error"], ended["at"] = error, time.monotonic()

    async def scenario():
        stream_end, whole_end = {}, {}
        # The whole request is sent once the stream runs: sent together, the second of the two
        # found this deployment's llm queue (1) full now and then (2 clean-clone runs of 2,
        # 2026-12-06), as two clients did in the test before.
        tasks = [asyncio.ensure_future(streamed(stream_end))]
        deadline = time.monotonic() + 300
        while stream_end.get("chunks", 0) < 1:
            ended = [t.exception() or t.result() for t in tasks if t.done()]
            assert time.monotonic() < deadline and not ended, (stream_end, ended)
            await asyncio.sleep(0.05)
        tasks.append(asyncio.ensure_future(whole(whole_end)))
        while stream_end.get("chunks", 0) < 3:
            ended = [t.exception() or t.result() for t in tasks if t.done()]
            assert time.monotonic() < deadline and not ended, (stream_end, whole_end, ended)
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # the whole answer is being generated too
        instance, killed = kill_stub(server.pid, "llm")
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S + 60)
        await client.close()
        return stream_end, whole_end, killed

    # The burst before may still hold sequences for a moment (a rank's table counts them), and
    # with max_active_requests 4 and a queue of 1 this test's two requests need the room.
    wait_idle(server, "llm")
    stream_end, whole_end, killed = asyncio.run(scenario())
    for ended in (stream_end, whole_end):
        assert "error" in ended, ended
        seconds = ended["at"] - killed
        print(f"{type(ended['error']).__name__} {seconds:.1f} s after the kill: {ended['error'].body}")
        assert DEADLINE_S - 5 < seconds < DEADLINE_S + 15  # the deadline ended it, not anything else
        assert ended["error"].body["code"] == "stream_timeout"
    assert whole_end["error"].status_code == 504
    assert server.openai_health()[0] == 200  # Triton 2.51 still says ready; the front answers


def test_serve_sh_stops_the_front_when_tritonserver_exits_and_keeps_its_status(server):
    front = [p for p in psutil.Process(server.process.pid).children() if "tritonfront.openai" in " ".join(p.cmdline())]
    assert len(front) == 1
    os.kill(server.pid, signal.SIGKILL)
    try:
        assert server.process.wait(timeout=60) == 128 + signal.SIGKILL
        front[0].wait(timeout=30)
        assert not front[0].is_running()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)  # the dead server's orphaned stubs

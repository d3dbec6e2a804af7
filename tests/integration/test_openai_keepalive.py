"""SSE through a proxy-like client that gives up after 5 s without a byte: a streamed request that
waits 20 s in the llm's queue survives, because the front sends its headers and a comment at once
and a keep-alive comment every interval (1 s here, TRITONFRONT_OPENAI_SSE_KEEP_ALIVE); a client
that leaves while queued still cancels its generation. The queue wait is made by a deployment whose
llm holds one request at a time (llm.max_active_requests=1) and a long answer ahead of it."""
import time

import httpx

from harness.deploy import GENERATE_MODELS, write_deployment
from harness.server import triton_server
from harness.triton_metrics import llm_gauges

IDLE_TIMEOUT_S = 5.0  # the client's (a proxy's) read timeout
WAIT_S = 20.0
KEEP_ALIVE_S = 1.0


def counting(n: int) -> str:
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


def test_a_stream_queued_20_s_survives_a_5_s_idle_timeout(tmp_path):
    repositories = write_deployment(tmp_path / "deploy", "--detokenizers", "1", "--set", "llm.max_active_requests=1",
                                    keep=GENERATE_MODELS)
    env = {"TRITONFRONT_OPENAI_SSE_KEEP_ALIVE": str(KEEP_ALIVE_S)}
    with triton_server(tmp_path / "server.log", repositories, env=env, openai=True) as server:
        url = server.openai_url + "/completions"
        timeout = httpx.Timeout(connect=5, read=IDLE_TIMEOUT_S, write=5, pool=5)
        body = dict(model="generate", temperature=0, stream=True)
        with httpx.Client(timeout=timeout) as client:
            with client.stream("POST", url, json={**body, "prompt": counting(1), "max_tokens": 1500}) as blocker:
                lines = blocker.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))  # the llm is busy with it
                started = time.monotonic()
                with client.stream("POST", url, json={**body, "prompt": counting(2), "max_tokens": 1500}) as leaver:
                    assert leaver.status_code == 200  # headers at once, while queued
                    assert next(leaver.iter_lines()).startswith(":")
                # the leaver is gone while queued; the waiter waits behind the blocker
                with client.stream("POST", url, json={**body, "prompt": "The capital of France is",
                                                      "max_tokens": 8}) as waiter:
                    assert waiter.status_code == 200
                    assert waiter.headers["content-type"].startswith("text/event-stream")
                    waiting = waiter.iter_lines()
                    comments, first_data = 0, None
                    while time.monotonic() - started < WAIT_S:  # the blocker keeps the llm busy meanwhile
                        line = next(waiting)
                        comments += line.startswith(":")
                        assert not line.startswith("data:"), "the waiter was not queued"
                        next(lines, None)
                    blocker.close()  # the llm frees its only place
                    data = []
                    for line in waiting:
                        if line.startswith("data:"):
                            first_data = first_data or time.monotonic() - started
                            data.append(line)
                    assert data[-1] == "data: [DONE]" and len(data) >= 3
                    print(f"queued {first_data:.1f} s behind the blocker with {comments} comments, "
                          f"then {len(data) - 1} chunks")
                    assert first_data >= WAIT_S and comments >= WAIT_S / KEEP_ALIVE_S / 2
        deadline = time.monotonic() + 60
        while (gauges := llm_gauges(server.metrics(), "llm"))["active_sequences"] > 0:
            assert time.monotonic() < deadline, f"the leaver's or the blocker's sequence was not freed: {gauges}"
            time.sleep(0.5)

"""SSE through a proxy-like client that gives up after 5 s without a byte: a streamed request that
waits 10 s in the llm's queue survives, because the front sends its headers and a comment at once
and a keep-alive comment every interval (1 s here, TRITONFRONT_OPENAI_SSE_KEEP_ALIVE); a client
that leaves while queued still cancels its generation. The queue wait is made by a deployment whose
llm holds one request at a time (llm.max_active_requests=1) and a long answer ahead of it."""
import http.client
import json
import time
from urllib.parse import urlsplit

from harness.deploy import GENERATE_MODELS, write_deployment
from harness.server import triton_server
from harness.triton_metrics import llm_gauges

IDLE_TIMEOUT_S = 5.0  # the client's (a proxy's) read timeout
# Twice the idle timeout; the blocker must still be generating when it ends. At 20 s the llama_cpp
# engine finished the blocker's 1,500 tokens first once (clean-clone run, 2026-12-06), and the
# waiter was not queued; the blocker now asks for more than it can generate in WAIT_S.
WAIT_S = 10.0
KEEP_ALIVE_S = 1.0


def counting(n: int) -> str:
    return ", ".join(str(k) for k in range(7 * n, 7 * n + 5)) + ","


class Stream:
    """One streamed completion over its own connection; reading waits at most IDLE_TIMEOUT_S for
    each byte (a socket timeout: what a proxy's idle timeout does)."""

    def __init__(self, url: str, body: dict):
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=IDLE_TIMEOUT_S)
        self.connection.request("POST", parts.path + "/completions", json.dumps(body),
                                {"Content-Type": "application/json"})
        self.response = self.connection.getresponse()

    def line(self) -> str:
        """The next non-empty line (raises TimeoutError after IDLE_TIMEOUT_S of silence)."""
        while True:
            line = self.response.readline().decode().strip()
            if line or self.response.isclosed():
                return line

    def close(self) -> None:
        self.connection.close()


def test_a_stream_queued_10_s_survives_a_5_s_idle_timeout(tmp_path):
    repositories = write_deployment(tmp_path / "deploy", "--detokenizers", "1", "--set", "llm.max_active_requests=1",
                                    keep=GENERATE_MODELS)
    env = {"TRITONFRONT_OPENAI_SSE_KEEP_ALIVE": str(KEEP_ALIVE_S)}
    with triton_server(tmp_path / "server.log", repositories, env=env, openai=True) as server:
        body = dict(model="generate", temperature=0, stream=True)
        blocker = Stream(server.openai_url, {**body, "prompt": counting(1), "max_tokens": 4000})
        while not blocker.line().startswith("data:"):  # the llm is busy with it
            pass
        started = time.monotonic()
        leaver = Stream(server.openai_url, {**body, "prompt": counting(2), "max_tokens": 1500})
        assert leaver.response.status == 200  # headers within a second, while queued
        assert leaver.line().startswith(":")
        leaver.close()  # gone while queued
        waiter = Stream(server.openai_url, {**body, "prompt": "The capital of France is", "max_tokens": 8})
        assert waiter.response.status == 200
        assert waiter.response.getheader("content-type").startswith("text/event-stream")
        comments = 0
        while time.monotonic() - started < WAIT_S:  # the blocker keeps the llm busy meanwhile
            line = waiter.line()
            assert not line.startswith("data:"), "the waiter was not queued"
            comments += line.startswith(":")
            blocker.line()
        blocker.close()  # the llm frees its only place
        data, first_data = [], None
        while not data or data[-1] != "data: [DONE]":
            line = waiter.line()
            if line.startswith("data:"):
                first_data = first_data or time.monotonic() - started
                data.append(line)
        waiter.close()
        print(f"queued {first_data:.1f} s behind the blocker with {comments} comments, then {len(data) - 1} chunks")
        assert first_data >= WAIT_S and comments >= WAIT_S / KEEP_ALIVE_S / 2 and len(data) >= 3
        deadline = time.monotonic() + 60
        while (gauges := llm_gauges(server.metrics(), "llm"))["active_sequences"] > 0:
            assert time.monotonic() < deadline, f"the leaver's or the blocker's sequence was not freed: {gauges}"
            time.sleep(0.5)

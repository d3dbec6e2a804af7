"""The OpenAI front's routes over a fake Backend (openai.backend), without a server: what the routes
hand the backend, the openai.types objects and SSE they answer with, errors before and after a
stream's first event, and work cancelled at once when its client leaves."""
import asyncio
import base64
import contextlib
import json

import numpy as np
import openai.types
import openai.types.chat
import pytest
from starlette.testclient import TestClient

from tritonfront.openai.api_errors import OpenAIError
from tritonfront.openai.config import FrontConfig
from tritonfront.openai.router import Router, build

from fake_openai_backend import HANG, FakeBackend, Prompts, delta

CHAT_PROMPT = "user:hi|assistant:"
CHAT = {"model": "generate", "messages": [{"role": "user", "content": "hi"}]}


def router(backend: FakeBackend, config: FrontConfig = FrontConfig()) -> Router:
    @contextlib.asynccontextmanager
    async def open_backend():
        yield backend

    return Router(config, open_backend, Prompts())


@pytest.fixture
def answering():
    """A client of the app over a backend that answers CHAT_PROMPT "Hello there." and "Once" " upon"."""
    backend = FakeBackend({CHAT_PROMPT: [delta("Hello"), delta(" there.", "stop", 2)],
                           "Once": [delta(" upon", "length", 1)]})
    with TestClient(build(router(backend))) as client:
        yield client, backend


def test_a_chat_answer_is_a_chat_completion_with_usage(answering):
    client, backend = answering
    reply = client.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    answer = reply.json()
    openai.types.chat.ChatCompletion.model_validate(answer)
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello there."},
                                  "logprobs": None, "finish_reason": "stop"}]
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    [request] = backend.requests
    # Without a limit none is sent: the llm allows what the context leaves after the prompt.
    assert (request.prompts, request.prompt_param) == ([CHAT_PROMPT], "messages")
    assert request.max_tokens is None


def test_a_completion_defaults_to_16_tokens_and_streams_chunks_then_done(answering):
    client, backend = answering
    with client.stream("POST", "/v1/completions", json={"model": "generate", "prompt": "Once", "stream": True}) as reply:
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        lines = [line for line in reply.iter_lines() if line]
    assert lines[0] == ": stream opened"  # an SSE comment: headers and bytes at once, before any token
    events = [line[6:] for line in lines if not line.startswith(":")]
    assert events[-1] == "[DONE]"
    chunk = json.loads(events[0])
    assert chunk["object"] == "text_completion" and chunk["choices"] == [
        {"index": 0, "text": " upon", "logprobs": None, "finish_reason": "length"}]
    assert backend.requests[0].max_tokens == 16 and backend.requests[0].prompt_param == "prompt"


def test_models_health_and_embeddings_are_openai_objects(answering):
    client, _ = answering
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == ["generate", "embed"]
    assert openai.types.Model.model_validate(client.get("/v1/models/generate").json()).owned_by == "tritonfront"
    assert client.get("/v1/models/gpt-4").json()["error"]["code"] == "model_not_found"
    assert client.get("/health").json() == {"status": "ready"}
    answer = client.post("/v1/embeddings", json={"model": "embed", "input": ["a", "b"]}).json()
    assert openai.types.CreateEmbeddingResponse.model_validate(answer).usage.total_tokens == 14
    assert [d["embedding"] for d in answer["data"]] == [[0.5, -0.25, 0.0], [0.5, -0.25, 1.0]]
    raw = client.post("/v1/embeddings", json={"model": "embed", "input": "a", "encoding_format": "base64"}).json()
    assert np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4").tolist() == [0.5, -0.25, 0.0]


@pytest.mark.parametrize("method, path, body, status, code", [
    ("POST", "/v1/chat/completions", {**CHAT, "model": "embed"}, 400, "wrong_endpoint"),
    ("POST", "/v1/embeddings", {"model": "generate", "input": "x"}, 400, "wrong_endpoint"),
    ("POST", "/v1/chat/completions", {**CHAT, "model": "gpt-4"}, 404, "model_not_found"),
    ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": "8"}, 400, "invalid_type"),
    ("POST", "/v1/completions", {"model": "generate", "prompt": [1, 2]}, 400, "unsupported_parameter"),
    ("GET", "/nothing/here", None, 404, "unknown_route"),
    ("GET", "/v1/chat/completions", None, 405, "method_not_allowed"),
])
def test_errors_are_openai_errors_before_the_backend(answering, method, path, body, status, code):
    client, backend = answering
    reply = client.request(method, path, json=body)
    assert reply.status_code == status and set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert reply.json()["error"]["code"] == code and backend.requests == []


def test_a_backend_that_is_not_ready_makes_health_503():
    with TestClient(build(router(FakeBackend(ready=False)))) as client:
        reply = client.get("/health")
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
        assert reply.json()["error"]["code"] == "not_ready"
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["generate"]  # embed is not ready


class Client:
    """An ASGI client: what the app sent, and a receive() that gives the body, then reports a
    disconnect when told."""

    def __init__(self, body: dict):
        self.sent = []
        self.gone = asyncio.Event()
        self.body_sent = False
        self.request = json.dumps(body).encode()

    async def receive(self):
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.request, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        self.sent.append(message)

    @property
    def status(self):
        return self.sent[0]["status"]

    @property
    def body(self):
        return b"".join(m.get("body", b"") for m in self.sent[1:])


def scope(path: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 9000)}


def serve(backend: FakeBackend, body: dict, path="/v1/chat/completions", leave_after: float = None,
          config: FrontConfig = FrontConfig()) -> Client:
    """One request through the app (its lifespan entered); the client leaves after `leave_after` s."""
    async def go():
        front = router(backend, config)
        app = build(front)
        client = Client(body)
        async with front.serving(app):
            task = asyncio.ensure_future(app(scope(path), client.receive, client.send))
            if leave_after is not None:
                await asyncio.sleep(leave_after)
                client.gone.set()
            await asyncio.wait_for(task, 5)
            await asyncio.wait_for(backend.closed.wait(), 5)
        return client

    return asyncio.run(go())


def test_an_error_before_the_first_event_is_a_json_error_with_its_status():
    overloaded = OpenAIError(503, "overloaded", type="service_unavailable_error", code="queue_full", retry_after=1)
    client = serve(FakeBackend({CHAT_PROMPT: [overloaded]}), {**CHAT, "stream": True})
    assert client.status == 503
    assert (b"retry-after", b"1") in client.sent[0]["headers"]
    assert json.loads(client.body)["error"]["code"] == "queue_full"


def test_an_error_after_the_first_event_is_an_error_event_without_done():
    quiet = OpenAIError(504, "quiet", type="server_error", code="stream_timeout")
    client = serve(FakeBackend({CHAT_PROMPT: [delta("a"), quiet]}), {**CHAT, "stream": True})
    assert client.status == 200
    body = client.body.decode()
    assert body.startswith(': stream opened\n\ndata: {"id":"chatcmpl-') and '"code":"stream_timeout"' in body
    assert "[DONE]" not in body
    assert body.count("data: ") == 2


def test_a_waiting_stream_opens_within_a_second_and_keeps_alive_until_its_client_leaves():
    config = FrontConfig(sse_keep_alive=0.2)
    client = serve(FakeBackend({CHAT_PROMPT: [HANG]}), {**CHAT, "stream": True}, leave_after=2.0, config=config)
    assert client.status == 200  # before any token: headers after min(FIRST_EVENT_WAIT_S, keep-alive)
    body = client.body.decode()
    assert body.startswith(": stream opened\n\n: keep-alive\n\n") and "data:" not in body
    assert 3 <= body.count(": keep-alive") <= 10  # every 0.2 s of the 2 s
    # serve() checked that the backend's generation was closed when the client left


@pytest.mark.parametrize("streamed", [True, False])
def test_an_unexpected_exception_is_a_500_without_its_traceback(streamed):
    client = serve(FakeBackend({CHAT_PROMPT: [KeyError("secret internals")]}), {**CHAT, "stream": streamed})
    assert client.status == 500
    assert json.loads(client.body)["error"] == {"message": "internal error (KeyError)", "type": "server_error",
                                                "param": None, "code": "internal_error"}


def test_a_parameter_the_backend_refuses_is_a_400_naming_it():
    refused = OpenAIError(400, "presence_penalty: model 'generate' cannot take it", param="presence_penalty",
                          code="unsupported_parameter")
    for streamed in (True, False):
        backend = FakeBackend(refuse=refused)
        backend.closed.set()  # nothing was started
        client = serve(backend, {**CHAT, "stream": streamed, "presence_penalty": 0.5})
        assert client.status == 400 and json.loads(client.body)["error"]["param"] == "presence_penalty"


@pytest.mark.parametrize("streamed, first", [(True, True), (True, False), (False, True)])
def test_a_client_that_leaves_stops_the_work_at_once(streamed, first):
    """Before its first token (streamed or whole) or mid-stream: the backend's generation is closed."""
    script = [HANG] if first else [delta("a"), HANG]
    # mid-stream: the client leaves once the first chunk has had time to go out after the comment
    client = serve(FakeBackend({CHAT_PROMPT: script}), {**CHAT, "stream": streamed}, leave_after=0.05 if first else 0.5)
    if first:
        assert client.sent == []  # nothing is sent to a client that left
    else:
        assert client.status == 200 and client.body.startswith(b": stream opened\n\ndata: ")

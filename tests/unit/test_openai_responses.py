"""How the OpenAI front answers, without a server: Triton's stream responses (stand-ins with the
tritonclient InferResult API) read into chat and completion objects and SSE chunks; the stream's
inactivity deadline and its cancellation; responses that stop when their client leaves."""
import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from tritonfront.openai import generation, sse
from tritonfront.openai.errors import OpenAIError
from tritonfront.openai.translate import Plan
from tritonfront.openai.triton import FINAL_FLAG, Contract, Triton

CONTRACT = Contract("generate", {"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL"},
                    frozenset({"text_output", "finish_reason", "prompt_tokens", "completion_tokens"}), 64)


class Result:
    """A stream response as tritonclient.grpc.InferResult shows it."""

    def __init__(self, final: bool, **outputs):
        self.outputs = {name: np.array([[value.encode() if isinstance(value, str) else value]])
                        if not isinstance(value, np.ndarray) else value for name, value in outputs.items()}
        self.final = final

    def as_numpy(self, name):
        return self.outputs.get(name)

    def get_response(self):
        return SimpleNamespace(parameters={FINAL_FLAG: SimpleNamespace(bool_param=self.final)})


def chunks(texts, prompt_tokens=5, reason="stop", sequence=None, log_probs=None):
    """One sequence's responses: running completion counts, the reason on the last."""
    out = []
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        outputs = dict(text_output=text, finish_reason=reason if last else "", prompt_tokens=prompt_tokens,
                       completion_tokens=i + 1)
        if sequence is not None:
            outputs["sequence_index"] = sequence
        if log_probs is not None:
            outputs["output_log_probs"] = np.array([[[log_probs[i]]]], dtype=np.float32)
        out.append(Result(last, **outputs))
    return out


class FakeTriton:
    """Triton.stream's stand-in: per prompt, the responses given."""

    def __init__(self, responses: dict):
        self.responses = responses
        self.sent = []

    async def stream(self, contract, inputs, outputs, params):
        prompt = next(i for i in inputs if i.name() == "text_input")
        self.sent.append(inputs)
        for result in self.responses[prompt._raw_content[4:].decode()]:
            yield result


class Words:
    """Prompts' stand-in for log-prob tokens: one token per response."""

    def token_texts(self, text, count):
        return [text] if count == 1 else [""] * (count - 1) + [text]


def plan(prompts, n=1, **kwargs) -> Plan:
    outputs = ["text_output", "finish_reason", "prompt_tokens", "completion_tokens"]
    return Plan("generate", prompts, {"max_tokens": 8, "stream": True}, {"text_input": "prompt"}, outputs, n=n,
                **kwargs)


def run(coroutine):
    return asyncio.run(coroutine)


def collect(events) -> list:
    async def go():
        return [e async for e in events]
    return run(go())


def decoded(events: list[bytes]) -> list:
    out = []
    for e in events:
        assert e.startswith(b"data: ") and e.endswith(b"\n\n")
        data = e[6:-2]
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_a_whole_chat_answer_from_streamed_chunks():
    triton = FakeTriton({"hi": chunks(["The", " capital", " is", " Paris."])})
    answer = run(generation.Generation(triton, CONTRACT, plan(["hi"]), Words(), chat=True).whole())
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "The capital is Paris."},
                                  "logprobs": None, "finish_reason": "stop"}]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_streamed_chat_chunks_join_to_the_answer_and_end_with_usage_then_done():
    triton = FakeTriton({"hi": chunks(["The", "", " end"], reason="length")})
    events = decoded(collect(generation.Generation(triton, CONTRACT, plan(["hi"], include_usage=True), Words(),
                                                   chat=True).events()))
    assert events[-1] == "[DONE]"
    *chunks_, usage, _ = events
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks_)
    assert chunks_[0]["choices"][0]["delta"] == {"role": "assistant", "content": "The"}
    assert len(chunks_) == 2  # the empty middle response sends nothing
    assert chunks_[-1]["choices"][0] == {"index": 0, "delta": {"content": " end"}, "logprobs": None,
                                         "finish_reason": "length"}
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_n_sequences_of_several_prompts_are_choices_in_openai_order():
    triton = FakeTriton({"a": chunks(["a0"], sequence=0, prompt_tokens=2) + chunks(["a1", "!"], sequence=1, prompt_tokens=2),
                         "b": chunks(["b1"], sequence=1, prompt_tokens=3) + chunks(["b0"], sequence=0, prompt_tokens=3)})
    p = plan(["a", "b"], n=2)
    p.outputs.append("sequence_index")
    answer = run(generation.Generation(triton, CONTRACT, p, Words(), chat=False).whole())
    assert [c["text"] for c in answer["choices"]] == ["a0", "a1!", "b0", "b1"]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_echo_puts_the_prompt_before_the_answer_whole_and_streamed():
    triton = FakeTriton({"Once": chunks([" upon", " a time"])})
    whole = run(generation.Generation(triton, CONTRACT, plan(["Once"], echo=True), Words(), chat=False).whole())
    assert whole["choices"][0]["text"] == "Once upon a time"
    events = decoded(collect(generation.Generation(triton, CONTRACT, plan(["Once"], echo=True), Words(),
                                                   chat=False).events()))
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Once upon a time"


def test_log_probs_per_token_in_chat_and_completion_shapes():
    triton = FakeTriton({"hi": chunks(["A", "B"], log_probs=[-0.5, -1.25])})
    p = plan(["hi"], logprobs=0)
    p.outputs.append("output_log_probs")
    chat = run(generation.Generation(triton, CONTRACT, p, Words(), chat=True).whole())
    assert chat["choices"][0]["logprobs"] == {"content": [
        {"token": "A", "logprob": -0.5, "bytes": [65], "top_logprobs": []},
        {"token": "B", "logprob": -1.25, "bytes": [66], "top_logprobs": []}]}
    completion = run(generation.Generation(triton, CONTRACT, p, Words(), chat=False).whole())
    assert completion["choices"][0]["logprobs"] == {"tokens": ["A", "B"], "token_logprobs": [-0.5, -1.25],
                                                    "top_logprobs": None, "text_offset": [0, 1]}


class FakeCall:
    """tritonclient's stream_infer iterator: responses (or None: never answers), and cancel()."""

    def __init__(self, responses, gap: float = 0.0):
        self.responses, self.gap, self.cancelled = list(responses), gap, False

    async def __anext__(self):
        if not self.responses:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.gap)
        return self.responses.pop(0)

    def cancel(self):
        self.cancelled = True


def fake_triton_client(call: FakeCall, timeout: float) -> Triton:
    triton = Triton.__new__(Triton)
    triton.stream_timeout_s, triton._contracts = timeout, {}
    triton.client = SimpleNamespace(stream_infer=lambda requests: call)
    return triton


def test_a_stream_that_goes_quiet_is_cancelled_with_an_error():
    call = FakeCall([(chunks(["a", "b"])[0], None)])
    triton = fake_triton_client(call, timeout=0.2)

    async def read():
        got = []
        with pytest.raises(OpenAIError) as caught:
            async for result in triton.stream(CONTRACT, [], [], {}):
                got.append(result)
        return got, caught.value

    got, error = run(read())
    assert len(got) == 1 and error.status == 504 and error.code == "stream_timeout"
    assert call.cancelled


def test_a_stream_ends_at_the_final_flag_and_an_error_names_the_param():
    call = FakeCall([(r, None) for r in chunks(["a", "b"])])
    triton = fake_triton_client(call, timeout=5)

    async def read(triton):
        return [r async for r in triton.stream(CONTRACT, [], [], {"max_tokens": "max_tokens"})]

    assert len(run(read(triton))) == 2 and call.cancelled
    failing = FakeCall([(None, SimpleNamespace(message=lambda: "in ensemble 'generate', max_tokens: 0 is outside 1..8",
                                               status=lambda: None))])
    with pytest.raises(OpenAIError) as caught:
        run(read(fake_triton_client(failing, timeout=5)))
    assert (caught.value.status, caught.value.param) == (400, "max_tokens")


def test_leaving_a_stream_early_cancels_it():
    call = FakeCall([(r, None) for r in chunks(["a", "b", "c"])])
    triton = fake_triton_client(call, timeout=5)

    async def first_only():
        stream = triton.stream(CONTRACT, [], [], {})
        await stream.__anext__()
        await stream.aclose()

    run(first_only())
    assert call.cancelled


class Client:
    """An ASGI client: what the app sent, and a receive() that reports a disconnect when told."""

    def __init__(self):
        self.sent = []
        self.gone = asyncio.Event()

    async def receive(self):
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


def test_an_error_before_the_first_event_is_a_json_error_with_its_status():
    async def events():
        raise OpenAIError(503, "overloaded", type="service_unavailable_error", code="queue_full", retry_after=1)
        yield b""

    client = Client()
    run(sse.EventStream(events())({}, client.receive, client.send))
    assert client.status == 503
    assert (b"retry-after", b"1") in client.sent[0]["headers"]
    assert json.loads(client.body)["error"]["code"] == "queue_full"


def test_an_error_after_the_first_event_is_an_error_event_without_done():
    async def events():
        yield sse.event({"n": 1})
        raise OpenAIError(504, "quiet", type="server_error", code="stream_timeout")

    client = Client()
    run(sse.EventStream(events())({}, client.receive, client.send))
    assert client.status == 200
    body = client.body.decode()
    assert body.startswith('data: {"n":1}\n\n') and '"code":"stream_timeout"' in body and "[DONE]" not in body


def test_an_unexpected_exception_is_a_500_without_its_traceback():
    async def events():
        raise KeyError("secret internals")
        yield b""

    client = Client()
    run(sse.EventStream(events())({}, client.receive, client.send))
    assert client.status == 500
    assert json.loads(client.body)["error"] == {"message": "internal error (KeyError)", "type": "server_error",
                                                "param": None, "code": "internal_error"}


@pytest.mark.parametrize("streamed", [True, False])
def test_a_client_that_leaves_stops_the_work_at_once(streamed):
    closed = asyncio.Event()

    async def events():
        try:
            yield sse.event({"n": 1})
            await asyncio.sleep(3600)
            yield sse.event({"n": 2})
        finally:
            closed.set()

    async def whole():
        async for _ in events():
            pass

    async def go():
        client = Client()
        response = sse.EventStream(events()) if streamed else sse.WholeAnswer(whole())
        task = asyncio.ensure_future(response({}, client.receive, client.send))
        await asyncio.sleep(0.05)
        client.gone.set()
        await asyncio.wait_for(task, 5)
        await asyncio.wait_for(closed.wait(), 5)
        return client

    client = run(go())
    if not streamed:
        assert client.sent == []  # nothing is sent to a client that left

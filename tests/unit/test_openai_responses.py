"""How the OpenAI front answers, without a server: Triton's stream responses (stand-ins with the
tritonclient InferResult API) read by the Triton backend into deltas, and the deltas into chat and
completion objects (openai.types) and SSE chunks; the stream's inactivity deadline and its
cancellation. (The routes over a fake backend: test_openai_routes.py.)"""
import asyncio
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tritonfront.openai import protocol, streaming
from tritonfront.openai.api_errors import OpenAIError
from tritonfront.openai.metrics import FrontMetrics
from tritonfront.openai.serving_chat import ChatServing
from tritonfront.openai.serving_completions import CompletionServing
from tritonfront.openai.triton_backend import TritonBackend
from tritonfront.openai.triton_client import FINAL_FLAG, RETRY_PAUSE_S, Contract, TritonClient

CONTRACT = Contract("generate", {"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32",
                                 "num_return_sequences": "INT32", "return_log_probs": "BOOL",
                                 "return_token_texts": "BOOL"},
                    frozenset({"text_output", "finish_reason", "prompt_tokens", "completion_tokens",
                               "sequence_index"}), 64)


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


def chunks(texts, prompt_tokens=5, reason="stop", sequence=None, log_probs=None, token_texts=None):
    """One sequence's responses: running completion counts, the reason on the last; with log probs,
    one token per response, its bytes `token_texts[i]` (default: the response's text)."""
    out = []
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        outputs = dict(text_output=text, finish_reason=reason if last else "", prompt_tokens=prompt_tokens,
                       completion_tokens=i + 1)
        if sequence is not None:
            outputs["sequence_index"] = sequence
        if log_probs is not None:
            outputs["output_log_probs"] = np.array([[[log_probs[i]]]], dtype=np.float32)
            token = token_texts[i] if token_texts else text.encode()
            outputs["output_token_texts"] = np.array([[[token]]], dtype=object)
        out.append(Result(last, **outputs))
    return out


class FakeTriton:
    """TritonClient's stand-in: the contract, and per prompt the stream responses given."""

    def __init__(self, responses: dict):
        self.responses = responses
        self.sent = []

    async def contract(self, model):
        return CONTRACT

    async def stream(self, contract, inputs, outputs, params):
        prompt = next(i for i in inputs if i.name() == "text_input")
        self.sent.append(inputs)
        for result in self.responses[prompt._raw_content[4:].decode()]:
            yield result


class Words:
    """Prompts' stand-in: a chat prompt is the last message's text."""
    has_chat_template = True
    template_takes_tools = False

    def chat(self, messages, tools=None, add_generation_prompt=True):
        return messages[-1]["content"]


def chat(triton, **fields) -> ChatServing:
    body = {"model": "generate", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
            **fields}
    return ChatServing(TritonBackend(triton), Words(), FrontMetrics()), \
        protocol.parse(protocol.ChatCompletionRequest, json.dumps(body).encode())


def completion(triton, prompts, **fields):
    body = {"model": "generate", "prompt": prompts, "max_tokens": 8, "temperature": 0, **fields}
    return CompletionServing(TritonBackend(triton), FrontMetrics()), \
        protocol.parse(protocol.CompletionRequest, json.dumps(body).encode())


def whole(serving_and_request) -> dict:
    """The whole answer as the client receives it."""
    serving, request = serving_and_request
    return json.loads(streaming.json_bytes(run(serving.whole(request))))


def streamed(serving_and_request) -> list:
    serving, request = serving_and_request
    return decoded(collect(serving.stream(request)))


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
    answer = whole(chat(triton))
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "The capital is Paris."},
                                  "logprobs": None, "finish_reason": "stop"}]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_streamed_chat_chunks_join_to_the_answer_and_end_with_usage_then_done():
    triton = FakeTriton({"hi": chunks(["The", "", " end"], reason="length")})
    events = streamed(chat(triton, stream=True, stream_options={"include_usage": True}))
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
    answer = whole(completion(triton, ["a", "b"], n=2))
    assert [c["text"] for c in answer["choices"]] == ["a0", "a1!", "b0", "b1"]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_echo_puts_the_prompt_before_the_answer_whole_and_streamed():
    triton = FakeTriton({"Once": chunks([" upon", " a time"])})
    assert whole(completion(triton, "Once", echo=True))["choices"][0]["text"] == "Once upon a time"
    events = streamed(completion(triton, "Once", echo=True, stream=True))
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Once upon a time"


def test_log_probs_per_token_in_chat_and_completion_shapes():
    triton = FakeTriton({"hi": chunks(["A", "B"], log_probs=[-0.5, -1.25])})
    answer = whole(chat(triton, logprobs=True))
    assert answer["choices"][0]["logprobs"] == {"content": [
        {"token": "A", "logprob": -0.5, "bytes": [65], "top_logprobs": []},
        {"token": "B", "logprob": -1.25, "bytes": [66], "top_logprobs": []}]}
    answer = whole(completion(triton, "hi", logprobs=0))
    assert answer["choices"][0]["logprobs"] == {"tokens": ["A", "B"], "token_logprobs": [-0.5, -1.25],
                                                "top_logprobs": None, "text_offset": [0, 1]}


def test_a_character_split_across_tokens_keeps_its_bytes_per_token():
    """The detokenizer's per-token bytes: "é" over two tokens is two byte tokens, each shown as U+FFFD."""
    triton = FakeTriton({"hi": chunks(["", "é"], log_probs=[-0.5, -1.0], token_texts=[b"\xc3", b"\xa9"])})
    content = whole(chat(triton, logprobs=True))["choices"][0]["logprobs"]["content"]
    assert [t["bytes"] for t in content] == [[0xC3], [0xA9]] and [t["token"] for t in content] == ["\ufffd"] * 2
    assert bytes(b for t in content for b in t["bytes"]).decode() == "é"


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


def fake_triton_client(call: FakeCall, timeout: float) -> TritonClient:
    triton = TritonClient.__new__(TritonClient)
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

    # answered whole, the stream is not cancelled (docs/triton-quirks.md: a cancel after the final
    # response can keep the ensemble loaded)
    assert len(run(read(triton))) == 2 and not call.cancelled
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


UNHEALTHY = "in ensemble 'generate', Stub process 'llm_tokenizer_0_0' is not healthy."


def triton_error(message: str):
    return SimpleNamespace(message=lambda: message, status=lambda: None)


def client_of_calls(calls: list, timeout: float) -> TritonClient:
    """A TritonClient whose n-th stream_infer is calls[n] (a retry takes the next)."""
    triton = fake_triton_client(calls[0], timeout)
    remaining = iter(calls)
    triton.client = SimpleNamespace(stream_infer=lambda requests: next(remaining))
    return triton


async def texts_of(triton) -> list[str]:
    return [r.as_numpy("text_output").item().decode() async for r in triton.stream(CONTRACT, [], [], {})]


def test_a_stream_refused_while_its_model_is_restored_is_sent_again_and_served():
    calls = [FakeCall([(None, triton_error(UNHEALTHY))]) for _ in range(2)]
    calls.append(FakeCall([(r, None) for r in chunks(["a", "b"])]))
    started = time.monotonic()
    assert run(texts_of(client_of_calls(calls, timeout=5))) == ["a", "b"]
    assert time.monotonic() - started >= 2 * RETRY_PAUSE_S


def test_a_stream_that_had_sent_output_is_not_sent_again_and_says_why():
    first = chunks(["a", "b"])[0]
    calls = [FakeCall([(first, None), (None, triton_error(UNHEALTHY))]), FakeCall([(r, None) for r in chunks(["a"])])]
    with pytest.raises(OpenAIError) as caught:
        run(texts_of(client_of_calls(calls, timeout=5)))
    assert (caught.value.status, caught.value.code) == (503, "model_died_while_answering")
    assert "is not healthy" in caught.value.message and "not sent again" in caught.value.message


def test_a_model_not_restored_within_the_deadline_is_503_saying_how_long_it_waited():
    calls = [FakeCall([(None, triton_error(UNHEALTHY))]) for _ in range(50)]
    started = time.monotonic()
    with pytest.raises(OpenAIError) as caught:
        run(texts_of(client_of_calls(calls, timeout=1.2)))
    assert time.monotonic() - started < 1.2 + RETRY_PAUSE_S
    assert (caught.value.status, caught.value.code) == (503, "model_unavailable") and "Waited" in caught.value.message


@pytest.mark.parametrize("message", ["Request for unknown model: 'generate' is not found",
                                     "in ensemble 'generate', max_tokens: 0 is outside 1..8"])
def test_other_errors_are_not_retried(message):
    calls = [FakeCall([(None, triton_error(message))]), FakeCall([(r, None) for r in chunks(["a"])])]
    with pytest.raises(OpenAIError):
        run(texts_of(client_of_calls(calls, timeout=5)))


def test_a_unary_request_waits_out_a_restore_too():
    triton = fake_triton_client(FakeCall([]), timeout=5)
    answers = [InferenceServerException(UNHEALTHY), InferenceServerException(UNHEALTHY), "served"]

    async def infer(*args, **kwargs):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    triton.client = SimpleNamespace(infer=infer)
    assert run(triton.infer(CONTRACT, [], [], {})) == "served" and not answers


class EmbedClient:
    """TritonClient's stand-in for embeddings: `embed` (texts, returns token counts) and `embed_ids`
    (ids, embeddings only), max batch 2; each input embeds to its row number, each text counts 3."""

    def __init__(self):
        self.calls = []

    async def contract(self, model):
        if model == "embed":
            return Contract(model, {"text_input": "BYTES", "dimensions": "INT32"},
                            frozenset({"embedding", "input_lengths"}), 2)
        return Contract(model, {"input_ids": "INT32", "input_lengths": "INT32", "dimensions": "INT32"},
                        frozenset({"embedding"}), 2)

    async def infer(self, contract, inputs, outputs, params, offset=0):
        arrays = {i.name(): np.frombuffer(i._raw_content, dtype=np.int32).reshape(i.shape())
                  for i in inputs if i.datatype() == "INT32"}
        rows = inputs[0].shape()[0]
        self.calls.append((contract.model, offset, outputs, arrays))
        embedding = np.arange(offset, offset + rows, dtype=np.float32).reshape(-1, 1)
        if "input_lengths" in outputs:
            return Result(True, embedding=embedding, input_lengths=np.full((rows, 1), 3, dtype=np.int32))
        return Result(True, embedding=embedding)


def test_embeddings_count_the_tokens_the_ensemble_returns_in_requests_of_its_batch_size():
    client = EmbedClient()
    embedded = run(TritonBackend(client).embed("embed", ["a", "b", "c"], None))
    assert embedded.vectors.reshape(-1).tolist() == [0, 1, 2] and embedded.prompt_tokens == 9
    assert [(model, offset) for model, offset, _, _ in client.calls] == [("embed", 0), ("embed", 2)]
    assert all(outputs == ["embedding", "input_lengths"] for _, _, outputs, _ in client.calls)


def test_token_ids_go_to_the_ids_ensemble_padded_with_their_lengths():
    client = EmbedClient()
    embedded = run(TritonBackend(client).embed("embed", [[101, 7, 102], [101, 102]], 16))
    [(model, _, outputs, arrays)] = client.calls
    assert model == "embed_ids" and outputs == ["embedding"] and embedded.prompt_tokens == 5
    assert arrays["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert arrays["input_lengths"].tolist() == [[3], [2]] and arrays["dimensions"].tolist() == [[16], [16]]

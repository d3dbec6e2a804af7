"""The OpenAI API (scripts/serve.sh's front) against a real tritonserver, driven by the official
openai SDK: answers equal what `generate` and `embed` give over gRPC (and sentence-transformers),
streams join to whole answers, and every error is OpenAI's shape with the right status and param.

Checks of parameters that need inputs of TensorRT-LLM's `ensemble` contract that the committed
`generate` does not declare yet are skipped, naming the input (they run once it has them)."""
import base64
import json
import socket
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import openai
import pytest

from harness.clients import kserve
from harness.clients.openai import call, error_of, sdk
from harness.clients.streams import one_streamed_request
from harness.corpora import varied_texts
from harness.references import cosines, sentence_transformer
from harness.server import free_ports

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "How many legs does a spider have?",
             "Explain gravity in one sentence."]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Once upon a time"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def client(openai_server):
    return sdk(openai_server.openai_url)


def generate(server, text: str, max_tokens: Optional[int] = MAX_TOKENS, **optional) -> dict:
    """`generate`'s whole answer over gRPC (max_tokens None: not sent): text, finish reason, token
    counts (and any other output)."""
    responses = one_streamed_request(server.grpc_url, "generate",
                                     kserve.generate_inputs(text, max_tokens, stream=False, **optional), 300)
    last = responses[-1]
    answer = {name: kserve.output(last, name) for name in ("text_output", "finish_reason", "prompt_tokens",
                                                            "completion_tokens")}
    answer["response"] = last
    return answer


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def test_models_are_the_served_ensembles(client, openai_server):
    assert sorted(model.id for model in client.models.list()) == ["embed", "generate"]
    assert client.models.retrieve("generate").owned_by == "tritonfront"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4")
    assert caught.value.body["code"] == "model_not_found"
    health = call(openai_server.openai_url.removesuffix("/v1"), "GET", "/health")
    assert (health.status, health.json()) == (200, {"status": "ready"})


@pytest.mark.parametrize("question", QUESTIONS)
def test_chat_equals_generate_under_greedy(client, openai_server, question):
    answer = client.chat.completions.create(model="generate", messages=[{"role": "user", "content": question}],
                                            max_tokens=MAX_TOKENS, temperature=0)
    expected = generate(openai_server, question, apply_chat_template=True)
    choice = answer.choices[0]
    assert choice.message.content == expected["text_output"] and choice.message.role == "assistant"
    assert choice.finish_reason == expected["finish_reason"]
    assert answer.usage.model_dump(exclude_none=True) == usage(expected["prompt_tokens"], expected["completion_tokens"])
    assert answer.object == "chat.completion" and answer.model == "generate"


def test_a_chat_without_max_tokens_is_generate_without_max_tokens(client, openai_server):
    """No limit given: the front sends none, and the llm allows what the context leaves after the
    prompt (its committed default_max_tokens is 0): the greedy answer ends on its own, past the
    limits the other tests set, as generate's does (this question's greedy answer: 32 tokens, with
    either CPU engine)."""
    question = QUESTIONS[3]
    answer = client.chat.completions.create(model="generate", messages=[{"role": "user", "content": question}],
                                            temperature=0)
    expected = generate(openai_server, question, None, apply_chat_template=True)
    assert expected["finish_reason"] == "stop" and expected["completion_tokens"] > MAX_TOKENS
    assert answer.choices[0].message.content == expected["text_output"]
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.model_dump(exclude_none=True) == usage(expected["prompt_tokens"], expected["completion_tokens"])


def test_a_conversation_with_a_system_prompt_is_rendered_by_the_models_template(client, openai_server):
    from harness.model_tokenizers import llm_tokenizer

    messages = [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "And of Italy?"}]
    answer = client.chat.completions.create(model="generate", messages=messages, max_completion_tokens=12, temperature=0)
    rendered = llm_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = generate(openai_server, rendered, 12)
    assert answer.choices[0].message.content == expected["text_output"]
    assert answer.usage.prompt_tokens == expected["prompt_tokens"]


def test_completions_equal_generate_in_prompt_order_with_echo(client, openai_server):
    answer = client.completions.create(model="generate", prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0)
    expected = [generate(openai_server, prompt) for prompt in PROMPTS]
    assert [c.text for c in answer.choices] == [e["text_output"] for e in expected]
    assert [c.index for c in answer.choices] == list(range(len(PROMPTS)))
    assert answer.usage.model_dump(exclude_none=True) == usage(sum(e["prompt_tokens"] for e in expected),
                                                               sum(e["completion_tokens"] for e in expected))
    echoed = client.completions.create(model="generate", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == PROMPTS[0] + expected[0]["text_output"]
    assert client.completions.create(model="generate", prompt=PROMPTS[0], temperature=0).usage.completion_tokens == 16


def test_streamed_chat_chunks_join_to_the_whole_answer_with_usage(client):
    request = dict(model="generate", messages=[{"role": "user", "content": QUESTIONS[1]}], max_tokens=40, temperature=0)
    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_streams_end_with_done_and_carry_no_usage_unless_asked(openai_server):
    reply = call(openai_server.openai_url, "POST", "/completions",
                 {"model": "generate", "prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0, "stream": True})
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == generate(openai_server, PROMPTS[2], 8)["text_output"]


def test_stop_as_a_string_and_as_a_list_equals_generates_stop_words(client, openai_server):
    prompt = "1, 2, 3, 4, 5,"
    for stop, last in ((" 9", " 8,"), ([" 8", " 9"], " 7,")):
        answer = client.completions.create(model="generate", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stop=stop)
        expected = generate(openai_server, prompt, stop_words=[stop] if isinstance(stop, str) else stop)
        assert answer.choices[0].text == expected["text_output"] and answer.choices[0].finish_reason == "stop"
        assert answer.choices[0].text.endswith(last)  # the stop sequence itself is not in the answer


def test_max_completion_tokens_and_max_tokens_limit_the_answer(client):
    for limit in ({"max_tokens": 3}, {"max_completion_tokens": 5}):
        answer = client.chat.completions.create(model="generate", temperature=0, **limit,
                                                messages=[{"role": "user", "content": "Tell me a long story."}])
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage.completion_tokens == next(iter(limit.values()))


def test_seeded_sampling_is_reproducible_and_equals_generate(client, openai_server):
    request = dict(model="generate", prompt=PROMPTS[3], max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=1234)
    first, second = (client.completions.create(**request).choices[0].text for _ in range(2))
    assert first == second
    expected = generate(openai_server, PROMPTS[3], temperature=0.9, top_p=0.95,
                        seed=np.array([[1234]], dtype=np.uint64))
    assert first == expected["text_output"]
    other = client.completions.create(**{**request, "seed": 99}).choices[0].text
    assert other != first  # the seed matters: sampling, not greedy


def test_n_choices_whole_and_streamed(client):
    request = dict(model="generate", messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=16, temperature=0)
    one = client.chat.completions.create(**request).choices[0].message.content
    answer = client.chat.completions.create(**request, n=3)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert [c.message.content for c in answer.choices] == [one] * 3  # greedy: n identical
    streamed = {}
    for chunk in client.chat.completions.create(**request, n=3, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert streamed == {0: one, 1: one, 2: one}
    assert answer.usage.completion_tokens == 3 * client.chat.completions.create(**request).usage.completion_tokens


def test_logprobs_are_the_ensembles_output_log_probs(client, openai_server):
    answer = client.chat.completions.create(model="generate", messages=[{"role": "user", "content": QUESTIONS[0]}],
                                            max_tokens=12, temperature=0, logprobs=True)
    tokens = answer.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == answer.choices[0].message.content
    assert len(tokens) == answer.usage.completion_tokens and all(t.top_logprobs == [] for t in tokens)
    expected = generate(openai_server, QUESTIONS[0], 12, apply_chat_template=True, return_log_probs=True)
    reference = expected["response"].as_numpy("output_log_probs").reshape(-1)
    assert np.allclose([t.logprob for t in tokens], reference, atol=1e-5)
    # Greedy: the chosen token is the likeliest of its alternatives (#21's top_logprobs).
    alternatives = client.chat.completions.create(
        model="generate", messages=[{"role": "user", "content": "x"}], max_tokens=2, temperature=0, logprobs=True,
        top_logprobs=3).choices[0].logprobs.content
    assert alternatives and all(len(t.top_logprobs) == 3 for t in alternatives)
    assert all(abs(t.logprob - max(a.logprob for a in t.top_logprobs)) < 1e-5 for t in alternatives)


def test_penalties_reach_the_engine_as_generate_takes_them(client, openai_server):
    prompt = "The cat sat on the mat. The cat sat on the mat. The cat"
    for penalty in ({"presence_penalty": 1.5}, {"frequency_penalty": 1.5}):
        answer = client.completions.create(model="generate", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **penalty)
        expected = generate(openai_server, prompt, **{k: float(v) for k, v in penalty.items()})
        assert answer.choices[0].text == expected["text_output"]


def test_response_format_json_object_and_json_schema(client):
    # A guide constrains the tokens, not the length: this prompt leads the bundled model to close
    # its object well within max_tokens ("Describe a cat as JSON" made it add keys until the limit).
    messages = [{"role": "user", "content": "Return a JSON object with keys name and age for a cat named Tom aged 3."}]
    answer = client.chat.completions.create(model="generate", messages=messages, max_tokens=80, temperature=0,
                                            response_format={"type": "json_object"})
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    answer = client.chat.completions.create(model="generate", messages=messages, max_tokens=80, temperature=0,
                                            response_format={"type": "json_schema",
                                                             "json_schema": {"name": "cat", "schema": schema}})
    assert answer.choices[0].finish_reason == "stop"
    cat = json.loads(answer.choices[0].message.content)
    assert set(cat) == {"name", "age"} and isinstance(cat["name"], str) and isinstance(cat["age"], int)


def embed_grpc(server, texts, **kwargs) -> np.ndarray:
    connection = kserve.connect("grpc", server)
    try:
        return np.concatenate([kserve.embed(connection, texts[i:i + 64], **kwargs)["embedding"]
                               for i in range(0, len(texts), 64)])
    finally:
        connection.close()


@pytest.mark.embed
def test_embeddings_equal_embed_and_sentence_transformers(client, openai_server):
    # More than one Triton request (64 texts each); no empty string, which OpenAI refuses (400 naming input).
    texts = [text for text in varied_texts() * 2 if text][:70]
    answer = client.embeddings.create(model="embed", input=texts)
    ours = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert [d.index for d in answer.data] == list(range(len(texts)))
    assert np.abs(ours - embed_grpc(openai_server, texts)).max() < 1e-5
    assert cosines(ours, sentence_transformer().encode(texts)).min() > 0.9999
    tokenizer = sentence_transformer().tokenizer
    counts = [min(len(tokenizer(t)["input_ids"]), sentence_transformer().max_seq_length) for t in texts]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(counts)


@pytest.mark.embed
def test_embedding_dimensions_base64_and_token_ids(client, openai_server):
    texts = ["Triton serves sentence embeddings", "Ensembles chain models"]
    cut = client.embeddings.create(model="embed", input=texts, dimensions=64)
    expected = embed_grpc(openai_server, texts, dimensions=64)
    assert np.abs(np.array([d.embedding for d in cut.data]) - expected).max() < 1e-6
    plain = client.embeddings.create(model="embed", input=texts[0], encoding_format="float").data[0].embedding
    raw = call(openai_server.openai_url, "POST", "/embeddings",
               {"model": "embed", "input": texts[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, np.array(plain, dtype=np.float32))
    ids = [sentence_transformer().tokenizer(t)["input_ids"] for t in texts]
    by_ids = client.embeddings.create(model="embed", input=ids)
    assert np.abs(np.array([d.embedding for d in by_ids.data]) - embed_grpc(openai_server, texts)).max() < 1e-5
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)
    single = client.embeddings.create(model="embed", input=ids[0]).data
    assert len(single) == 1 and np.allclose(single[0].embedding, by_ids.data[0].embedding, atol=1e-6)


BAD_REQUESTS = [
    ("/chat/completions", b'{"model": "generate", "messages": [', 400, None, "invalid_json"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "8"},
     400, "max_tokens", "invalid_type"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}], "temperature": "0.5"},
     400, "temperature", "invalid_type"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": 42}]}, 400,
     "messages[0].content", "invalid_value"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}],
                           "max_new_tokens": 8}, 400, "max_new_tokens", "unrecognized_argument"),
    ("/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "model",
     "model_not_found"),
    ("/chat/completions", {"model": "embed", "messages": [{"role": "user", "content": "hi"}]}, 400, "model",
     "wrong_endpoint"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 100000}, 400, "max_tokens", "invalid_value"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}],
                           "max_completion_tokens": 100000, "stream": True}, 400, "max_completion_tokens",
     "invalid_value"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "x " * 9000}],
                           "max_tokens": 8}, 400, "messages", "invalid_value"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "x " * 9000}]}, 400,
     "messages", "invalid_value"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}],
                           "stop": [f"w{i}" for i in range(20)]}, 400, "stop", "invalid_value"),
    ("/chat/completions", {"model": "generate", "messages": [{"role": "user", "content": "hi"}],
                           "tools": [{"type": "function", "function": {"name": "f g"}}]}, 400,
     "tools[0].function.name", "invalid_value"),
    ("/completions", {"model": "generate", "prompt": ""}, 400, "prompt", "invalid_value"),
    ("/completions", {"model": "generate", "prompt": [1, 2, 3]}, 400, "prompt", "unsupported_parameter"),
    ("/embeddings", {"model": "embed", "input": "x", "dimensions": 999}, 400, "dimensions", "invalid_value"),
    ("/embeddings", {"model": "embed", "input": [[101, 102], [101, 99999, 102]]}, 400, "input", "invalid_value"),
    ("/embeddings", {"model": "embed", "input": [[101] * 300]}, 400, "input", "invalid_value"),
    ("/embeddings", {"model": "embed", "input": ["ok", "x" * 70000]}, 400, "input", "invalid_value"),
    ("/embeddings", {"model": "embed", "input": []}, 400, "input", "invalid_value"),
    ("/embeddings", {"model": "generate", "input": "x"}, 400, "model", "wrong_endpoint"),
]


@pytest.mark.parametrize("path, body, status, param, code", BAD_REQUESTS,
                         ids=[f"{b[0]}:{b[3]}:{b[4]}" for b in BAD_REQUESTS])
def test_every_bad_request_is_an_openai_error_naming_the_param(openai_server, path, body, status, param, code):
    reply = call(openai_server.openai_url, "POST", path, body)
    assert reply.status == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = error_of(reply)
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code), error
    assert "Traceback" not in reply.text and "File \"" not in reply.text
    if param and code != "unrecognized_argument":
        assert error["message"].startswith(param), error


def test_the_sdk_raises_its_own_error_classes(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="generate", messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert caught.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


def test_unknown_routes_and_methods_answer_in_openai_shape(openai_server):
    assert error_of(call(openai_server.openai_url, "GET", "/nothing/here"))["code"] == "unknown_route"
    reply = call(openai_server.openai_url, "GET", "/chat/completions")
    assert reply.status == 405 and error_of(reply)["code"] == "method_not_allowed"


def test_a_front_without_triton_is_not_ready_and_says_so(tmp_path):
    """The front alone, pointed at a port where no Triton listens: /health is 503, no model is
    listed, and a request is a 503 with Retry-After, never a hang."""
    port, nobody = free_ports(2)
    front = subprocess.Popen([sys.executable, "-m", "tritonfront.openai", "--triton-url", f"127.0.0.1:{nobody}",
                              "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert front.poll() is None and time.monotonic() < deadline, "the front did not start"
                time.sleep(0.5)
        health = call(base, "GET", "/health")
        assert health.status == 503 and error_of(health)["code"] == "not_ready"
        assert call(base, "GET", "/v1/models").json()["data"] == []
        started = time.monotonic()
        reply = call(base, "POST", "/v1/completions", {"model": "generate", "prompt": "hi"})
        assert reply.status == 503 and reply.headers["retry-after"] and time.monotonic() - started < 30
        assert error_of(reply)["code"] == "triton_unreachable"
    finally:
        front.terminate()
        front.wait(timeout=30)

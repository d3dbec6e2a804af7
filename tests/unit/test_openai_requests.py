"""The OpenAI front's request checks, error mapping and configuration, without a server: every bad
body gets a 400 in OpenAI's shape naming the field; Triton's errors map onto OpenAI's statuses."""
import json

import pytest

from tritonfront.errors import ConfigError
from tritonfront.openai import config, protocol
from tritonfront.openai.api_errors import OpenAIError
from tritonfront.openai.triton_errors import from_triton

CHAT = {"model": "generate", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


def refused(model, body: bytes) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        protocol.parse(model, body)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    return caught.value


def test_a_good_chat_request_parses_with_openai_defaults():
    request = protocol.parse(protocol.ChatCompletionRequest, chat(stop="\n", max_completion_tokens=5, max_tokens=9,
                                                                user="u", metadata={"k": "v"}))
    assert request.stop == ["\n"]
    assert request.completion_limit == (5, "max_completion_tokens")
    assert (request.n, request.stream, request.temperature) == (1, False, None)


@pytest.mark.parametrize("fields, param, words", [
    ({"max_tokens": "8"}, "max_tokens", "valid integer"),
    ({"temperature": "0.5"}, "temperature", "valid number"),
    ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    ({"max_tokens": 3_000_000_000}, "max_tokens", "2147483647"),
    ({"stop": 5}, "stop", "a string or a list of strings, got an integer"),
    ({"stop": ["a", 1]}, "stop", "a list of a string, an integer"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"presence_penalty": 3}, "presence_penalty", "less than or equal to 2"),
    ({"seed": 2**64}, "seed", "less than or equal to"),
    ({"messages": []}, "messages", "at least 1 item"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'system'"),
    ({"messages": [{"role": "user"}]}, "messages[0]", "content is required"),
    ({"messages": [{"role": "tool", "content": "21 C"}]}, "messages[0]", "a tool message needs tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].function.arguments", "is required"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", "parts of type 'image_url' are not supported"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0]",
     "only an assistant message has tool_calls"),
    ({"max_new_tokens": 3}, "max_new_tokens", "Unrecognized request argument supplied: max_new_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
    ({"top_logprobs": 2}, "top_logprobs", "only allowed when logprobs is true"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema is required"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "'text', 'json_object' or 'json_schema'"),
    ({"functions": [{"name": "f"}]}, "functions", "function calling is not supported"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "logit bias is not supported"),
])
def test_a_bad_chat_field_is_named(fields, param, words):
    error = refused(protocol.ChatCompletionRequest, chat(**fields))
    assert error.param == param and words in error.message
    # OpenAI's own wording for an unknown field ends with its name; every other message starts with it
    assert error.message.startswith(param) or error.message.endswith(f"supplied: {param}")


def test_fields_that_ask_for_nothing_are_accepted():
    request = protocol.parse(protocol.ChatCompletionRequest, chat(tools=[], tool_choice="none", logit_bias={},
                                                                parallel_tool_calls=False, store=False))
    assert request.tools == []


def test_a_tool_call_history_parses():
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
    request = protocol.parse(protocol.ChatCompletionRequest, chat(messages=history))
    assert request.messages[1].tool_calls[0].function.arguments == '{"city": "Oslo"}'
    assert request.messages[2].tool_call_id == "call_1"


@pytest.mark.parametrize("body, words", [
    (b'{"model": "generate", "messages"', "not valid JSON"),
    (b"[1, 2]", "must be a JSON object, got a list"),
    (b"", "not valid JSON"),
    (b'{"model": "generate", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', ""),
])
def test_a_body_that_is_not_a_json_object_is_400(body, words):
    error = refused(protocol.ChatCompletionRequest, body)
    assert words in error.message


def test_completion_prompts_and_best_of():
    request = protocol.parse(protocol.CompletionRequest, b'{"model": "g", "prompt": ["a", "b"], "n": 2, "best_of": 2}')
    assert request.prompt == ["a", "b"] and request.max_tokens is None
    assert refused(protocol.CompletionRequest, b'{"model": "g", "prompt": "a", "best_of": 3}').param == "best_of"
    assert refused(protocol.CompletionRequest, b'{"model": "g", "prompt": "a", "suffix": "z"}').param == "suffix"
    assert refused(protocol.CompletionRequest, b'{"model": "g", "prompt": "a", "logprobs": 6}').param == "logprobs"


@pytest.mark.parametrize("value, expected", [
    ("one text", ["one text"]),
    (["a", "b"], ["a", "b"]),
    ([101, 7592, 102], [[101, 7592, 102]]),
    ([[101, 102], [101, 7592, 102]], [[101, 102], [101, 7592, 102]]),
])
def test_embedding_inputs_in_every_openai_shape(value, expected):
    body = json.dumps({"model": "embed", "input": value}).encode()
    assert protocol.parse(protocol.EmbeddingRequest, body).input == expected


@pytest.mark.parametrize("fields, param, words", [
    ({"input": []}, "input", "must not be empty"),
    ({"input": [1, -2]}, "input", "token ids (integers in 0..2147483647)"),
    ({"input": [[1], []]}, "input", "non-empty lists"),
    ({"input": [1, "a"]}, "input", "a list of a string, an integer"),
    ({"input": ["x"] * 2049}, "input", "2049 inputs is over the limit of 2048"),
    ({"input": ""}, "input", "input: must not be an empty string"),
    ({"input": ["a", ""]}, "input", "input[1] must not be an empty string"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "x", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "x", "truncate": False}, "truncate", "Unrecognized"),
])
def test_a_bad_embedding_field_is_named(fields, param, words):
    error = refused(protocol.EmbeddingRequest, json.dumps({"model": "embed", **fields}).encode())
    assert error.param == param and words in error.message


@pytest.mark.parametrize("message, status, code, param", [
    ("in ensemble 'generate', max_tokens: 100000 is outside 1..8191", "", "invalid_value", "max_completion_tokens"),
    ("in ensemble 'generate', text_input: 9001 tokens leave no room", "", "invalid_value", "messages"),
    ("in ensemble 'generate', stop_words[3]: has no tokens for this model", "", "invalid_value", "stop"),
    ("[StatusCode.INVALID_ARGUMENT] unexpected thing", "StatusCode.INVALID_ARGUMENT", "invalid_value", None),
    ("in ensemble 'generate', Exceeds maximum queue size", "", "queue_full", None),
    ("Request timeout expired", "StatusCode.UNAVAILABLE", "queue_timeout", None),
    ("in ensemble 'generate', Stub process 'llm_0_0' is not healthy.", "", "model_unavailable", None),
    ("failed to connect to all addresses", "StatusCode.UNAVAILABLE", "triton_unreachable", None),
    ("in ensemble 'generate', RuntimeError: engine stopped", "", "model_error", None),
])
def test_triton_errors_map_onto_openai(message, status, code, param):
    params = {"text_input": "messages", "max_tokens": "max_completion_tokens", "stop_words": "stop"}
    error = from_triton(message, status, "generate", params)
    assert (error.code, error.param) == (code, param)
    expected = {"invalid_value": 400, "queue_full": 503, "queue_timeout": 503, "model_unavailable": 503,
                "triton_unreachable": 503, "model_error": 500}[code]
    assert error.status == expected
    assert ("Retry-After" in error.headers()) == (expected == 503)
    if param:
        assert error.message.startswith(param)


def test_an_index_into_a_batch_is_the_clients_index():
    error = from_triton("in ensemble 'embed', text_input[2]: 70000 bytes is over the limit", "StatusCode.INVALID_ARGUMENT",
                        "embed", {"text_input": "input"}, offset=64)
    assert error.message.startswith("input[66]: 70000 bytes") and error.param == "input"


def test_config_flags_and_environment():
    parsed = config.parse(["--port", "9100", "--embed-models", ""],
                          {"TRITONFRONT_OPENAI_STREAM_TIMEOUT": "12.5", "TRITONFRONT_OPENAI_GENERATE_MODELS": "generate,ensemble"})
    assert (parsed.port, parsed.stream_timeout, parsed.generate_models, parsed.embed_models) == (
        9100, 12.5, ("generate", "ensemble"), ())


@pytest.mark.parametrize("argv, environ, words", [
    (["--port", "0"], {}, "--port: '0' is not allowed"),
    ([], {"TRITONFRONT_OPENAI_STREAM_TIMEOUT": "soon"}, "--stream-timeout (TRITONFRONT_OPENAI_STREAM_TIMEOUT): 'soon'"),
    (["--generate-models", "embed"], {}, "embed: served both for generation and for embeddings"),
    (["--generate-models", "", "--embed-models", ","], {}, "name no model"),
    (["--log-level", "loud"], {}, "is not one of"),
])
def test_config_errors_name_the_flag(argv, environ, words):
    with pytest.raises(ConfigError) as caught:
        config.parse(argv, environ)
    assert words in str(caught.value)

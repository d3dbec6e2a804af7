"""OpenAI requests -> the serving modules' TextGenerationRequest -> the generation ensemble's inputs
(TensorRT-LLM's names), against the inputs a model declares: OpenAI's sampling defaults, the current
or older input name, and a parameter whose input the model lacks refused by name."""
import json

import pytest

from tritonfront.openai import protocol, triton_inputs
from tritonfront.openai.api_errors import OpenAIError
from tritonfront.openai.metrics import FrontMetrics
from tritonfront.openai.serving_chat import ChatServing
from tritonfront.openai.serving_completions import CompletionServing
from tritonfront.openai.triton_client import Contract

from fake_openai_backend import Prompts

MAIN = {"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32", "top_k": "INT32",
        "top_p": "FP32", "random_seed": "UINT64", "stop_words": "BYTES", "end_id": "INT32",
        "apply_chat_template": "BOOL"}
TRTLLM = {**{k: v for k, v in MAIN.items() if k != "random_seed"}, "seed": "UINT64", "random_seed": "UINT64",
          "num_return_sequences": "INT32", "presence_penalty": "FP32", "frequency_penalty": "FP32",
          "repetition_penalty": "FP32", "min_tokens": "INT32", "return_log_probs": "BOOL", "return_token_texts": "BOOL",
          "guided_decoding_guide_type": "BYTES", "guided_decoding_guide": "BYTES"}
OUTPUTS = frozenset({"text_output", "finish_reason", "prompt_tokens", "completion_tokens", "sequence_index",
                     "output_log_probs", "output_token_texts"})


def contract(inputs) -> Contract:
    return Contract("generate", inputs, OUTPUTS, 64)


def chat_plan(inputs=TRTLLM, **fields):
    body = {"model": "generate", "messages": [{"role": "user", "content": "hi"}], **fields}
    request = protocol.parse(protocol.ChatCompletionRequest, json.dumps(body).encode())
    return triton_inputs.plan(ChatServing(None, Prompts(), FrontMetrics()).generation_request(request)[0], contract(inputs))


def completion_plan(inputs=TRTLLM, **fields):
    body = {"model": "generate", "prompt": "Once", **fields}
    request = protocol.parse(protocol.CompletionRequest, json.dumps(body).encode())
    return triton_inputs.plan(CompletionServing(None, FrontMetrics()).generation_request(request), contract(inputs))


def test_openai_samples_at_temperature_1_unless_told():
    plan = chat_plan()
    assert plan.prompts == ["user:hi|assistant:"]
    # No max_tokens sent: the llm allows what the context leaves (its default_max_tokens lowers it).
    assert plan.inputs == {"temperature": 1.0, "top_p": 1.0, "stream": True}
    assert plan.params["text_input"] == "messages"


def test_a_limit_given_is_sent_by_the_parameter_it_came_in():
    assert (chat_plan(max_tokens=50).inputs["max_tokens"], chat_plan(max_tokens=50).params["max_tokens"]) == (
        50, "max_tokens")
    assert (chat_plan(max_completion_tokens=30).inputs["max_tokens"],
            chat_plan(max_completion_tokens=30).params["max_tokens"]) == (30, "max_completion_tokens")


def test_temperature_0_is_greedy_alone():
    plan = chat_plan(temperature=0, top_p=0.5, top_k=4, max_completion_tokens=7)
    assert plan.inputs == {"max_tokens": 7, "temperature": 0.0, "stream": True}
    assert plan.params["max_tokens"] == "max_completion_tokens"


def test_every_sampling_parameter_reaches_its_input():
    plan = chat_plan(temperature=0.7, top_p=0.9, top_k=5, seed=-1, stop="\n", presence_penalty=0.5,
                     frequency_penalty=-0.5, repetition_penalty=1.1, min_tokens=2, n=3, logprobs=True,
                     response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    assert plan.inputs == {"temperature": 0.7, "top_p": 0.9, "top_k": 5,
                           "seed": 2**64 - 1, "stop_words": ["\n"], "presence_penalty": 0.5,
                           "frequency_penalty": -0.5, "repetition_penalty": 1.1, "min_tokens": 2,
                           "num_return_sequences": 3, "stream": True, "return_log_probs": True,
                           "return_token_texts": True,
                           "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": "object"}'}
    assert plan.n == 3 and plan.logprobs == 0
    assert {"sequence_index", "output_log_probs", "output_token_texts"} <= set(plan.outputs)
    assert plan.params["num_return_sequences"] == "n" and plan.params["guided_decoding_guide"] == "response_format"


def test_json_object_is_the_json_guide_without_a_schema():
    plan = chat_plan(response_format={"type": "json_object"})
    assert plan.inputs["guided_decoding_guide_type"] == "json" and "guided_decoding_guide" not in plan.inputs
    assert "guided_decoding_guide_type" not in chat_plan(response_format={"type": "text"}).inputs


def test_the_older_seed_name_when_the_model_has_only_it():
    assert chat_plan(MAIN, seed=7).inputs["random_seed"] == 7


@pytest.mark.parametrize("fields, param, missing", [
    ({"presence_penalty": 0.5}, "presence_penalty", "'presence_penalty'"),
    ({"n": 2}, "n", "'num_return_sequences'"),
    ({"logprobs": True}, "logprobs", "'return_log_probs'"),
    ({"response_format": {"type": "json_object"}}, "response_format", "'guided_decoding_guide_type'"),
    ({"min_tokens": 3}, "min_tokens", "'min_tokens' or 'min_length'"),
])
def test_a_parameter_the_model_cannot_take_is_refused_by_name(fields, param, missing):
    with pytest.raises(OpenAIError) as caught:
        chat_plan(MAIN, **fields)
    assert caught.value.status == 400 and caught.value.param == param
    assert caught.value.message == f"{param}: model 'generate' cannot take it: it has no input {missing}"


def test_log_probs_need_the_tokens_texts_the_front_never_decodes_itself():
    without = {k: v for k, v in TRTLLM.items() if k != "return_token_texts"}
    with pytest.raises(OpenAIError) as caught:
        chat_plan(without, logprobs=True)
    assert caught.value.param == "logprobs" and "'return_token_texts'" in caught.value.message


def test_top_logprobs_are_refused_by_a_model_without_the_extension():
    with pytest.raises(OpenAIError) as caught:
        chat_plan(logprobs=True, top_logprobs=2)
    assert caught.value.param == "top_logprobs" and "no input 'top_logprobs'" in caught.value.message
    assert chat_plan(logprobs=True, top_logprobs=0).inputs["return_log_probs"] is True


def test_top_logprobs_ask_the_extension_for_alternatives_and_token_texts():
    extended = {**TRTLLM, "top_logprobs": "INT32", "return_token_texts": "BOOL"}
    plan = chat_plan(extended, logprobs=True, top_logprobs=3)
    assert plan.inputs["top_logprobs"] == 3 and plan.inputs["return_token_texts"] is True
    assert "return_log_probs" not in plan.inputs and plan.params["top_logprobs"] == "top_logprobs"
    assert {"output_log_probs", "output_token_texts", "output_top_log_probs", "output_top_texts"} <= set(plan.outputs)
    plan = completion_plan(extended, logprobs=0)
    assert plan.inputs["return_log_probs"] is True and "output_top_texts" not in plan.outputs
    assert "output_token_texts" in plan.outputs
    plan = completion_plan(extended, logprobs=2)
    assert plan.inputs["top_logprobs"] == 2 and plan.params["top_logprobs"] == "logprobs"


def test_a_forced_tool_call_sends_its_guide():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    plan = chat_plan(tools=tools, tool_choice="required", max_tokens=8)
    assert plan.inputs["guided_decoding_guide_type"] == "ebnf_grammar" and "root ::=" in plan.inputs["guided_decoding_guide"]
    assert plan.params["guided_decoding_guide"] == "tools"
    assert "guided_decoding_guide" not in chat_plan(tools=tools, max_tokens=8).inputs  # auto: the text is parsed
    with pytest.raises(OpenAIError) as caught:
        chat_plan(tools=tools, tool_choice="required", max_tokens=8, response_format={"type": "json_object"})
    assert caught.value.param == "response_format"


def test_completions_default_to_16_tokens_and_keep_their_prompts():
    plan = completion_plan(prompt=["a", "b"], echo=True)
    assert plan.prompts == ["a", "b"] and plan.inputs["max_tokens"] == 16
    assert plan.params["text_input"] == "prompt"


@pytest.mark.parametrize("fields, param", [
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"echo": True, "logprobs": 0}, "echo"),
    ({"logprobs": 2}, "logprobs"),
])
def test_completions_refuse_what_the_contract_cannot_give(fields, param):
    with pytest.raises(OpenAIError) as caught:
        completion_plan(**fields)
    assert caught.value.param == param


def test_a_model_without_a_chat_template_refuses_chat():
    class Plain(Prompts):
        has_chat_template = False

    request = protocol.parse(protocol.ChatCompletionRequest,
                            b'{"model": "generate", "messages": [{"role": "user", "content": "hi"}]}')
    with pytest.raises(OpenAIError) as caught:
        ChatServing(None, Plain(), FrontMetrics()).generation_request(request)
    assert caught.value.param == "messages" and "no chat template" in caught.value.message

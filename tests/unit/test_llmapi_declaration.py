"""The committed configs serve TensorRT-LLM's LLM-API contract (tritonfront.core.llmapi_contract)
exactly: `tensorrt_llm` (not decoupled) and `tensorrt_llm_decoupled` (the ensemble) declare its
tensors with NVIDIA's names, types and shapes, every input reaches the step its route names with the
same type and shape, every output comes from the detokenizer, which declares it; and the contract's
request-parameter check and error codes."""
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from harness.deploy import read_model_config
from tritonfront.core import llmapi_contract as contract
from tritonfront.core.model_config import from_model_config
from tritonfront.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
DTYPE = model_config_pb2.DataType
# NVIDIA's config.pbtxt (triton_backend/all_models/llmapi/tensorrt_llm, read 2026-11): name, type,
# dims and optional flag of each tensor, transcribed once, so that a change to the declaration is
# checked against what NVIDIA declares and not only against itself.
NVIDIA_INPUTS = {
    "text_input": ("TYPE_STRING", (-1,), False), "image_url": ("TYPE_STRING", (-1,), True),
    "streaming": ("TYPE_BOOL", (1,), True), "sampling_param_best_of": ("TYPE_INT32", (1,), True),
    "sampling_param_temperature": ("TYPE_FP32", (1,), True), "sampling_param_top_k": ("TYPE_INT32", (1,), True),
    "sampling_param_top_p": ("TYPE_FP32", (1,), True), "sampling_param_frequency_penalty": ("TYPE_FP32", (1,), True),
    "sampling_param_presence_penalty": ("TYPE_FP32", (1,), True), "sampling_param_max_tokens": ("TYPE_INT32", (1,), True),
    "sampling_param_stop": ("TYPE_STRING", (-1,), True), "sampling_param_seed": ("TYPE_UINT64", (1,), True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", (1,), True),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", (1,), True), "return_finish_reason": ("TYPE_BOOL", (1,), True),
    "return_stop_reason": ("TYPE_BOOL", (1,), True), "return_cumulative_logprob": ("TYPE_BOOL", (1,), True),
    "stop": ("TYPE_BOOL", (1,), True), "lora_id": ("TYPE_UINT64", (1,), True), "lora_name": ("TYPE_STRING", (1,), True),
    "lora_path": ("TYPE_STRING", (1,), True), "lora_ckpt_source": ("TYPE_STRING", (1,), True),
}
NVIDIA_OUTPUTS = {
    "text_output": ("TYPE_STRING", (-1,)), "finish_reason": ("TYPE_STRING", (-1,)), "stop_reason": ("TYPE_STRING", (-1,)),
    "cumulative_logprob": ("TYPE_FP32", (-1,)), "kv_cache_reused_block": ("TYPE_INT32", (-1,)),
    "kv_cache_missed_block": ("TYPE_INT32", (-1,)), "kv_cache_alloc_new_blocks": ("TYPE_INT32", (-1,)),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", (-1,)), "kv_cache_hit_rate": ("TYPE_FP32", (-1,)),
    "arrival_time_ns": ("TYPE_INT64", (1,)), "first_scheduled_time_ns": ("TYPE_INT64", (1,)),
    "first_token_time_ns": ("TYPE_INT64", (1,)), "last_token_time_ns": ("TYPE_INT64", (1,)),
    "acceptance_rate": ("TYPE_FP32", (1,)), "total_accepted_draft_tokens": ("TYPE_INT32", (1,)),
    "total_draft_tokens": ("TYPE_INT32", (1,)),
}


@pytest.fixture(scope="module", params=["model_repository/tensorrt_llm", "ensembles/tensorrt_llm_decoupled"])
def config(request):
    return read_model_config(ROOT / request.param)


@pytest.fixture(scope="module")
def ensemble():
    return read_model_config(ROOT / "ensembles" / contract.DECOUPLED_MODEL_NAME)


def declared(tensors) -> dict:
    return {t.name: (DTYPE.Name(t.data_type), tuple(t.dims)) for t in tensors}


def test_the_declaration_is_nvidias_but_for_text_input_being_optional():
    assert [spec.name for spec in contract.INPUTS] == list(NVIDIA_INPUTS)
    assert {s.name: (s.dtype, s.dims, s.optional or s.name in contract.REQUIRED_BY_NVIDIA) for s in contract.INPUTS} \
        == {name: (dtype, dims, True) for name, (dtype, dims, _) in NVIDIA_INPUTS.items()}
    assert [name for name, (_, _, optional) in NVIDIA_INPUTS.items() if not optional] == \
        list(contract.REQUIRED_BY_NVIDIA)
    assert {s.name: (s.dtype, s.dims) for s in contract.OUTPUTS} == NVIDIA_OUTPUTS
    assert [s.name for s in contract.OUTPUTS] == list(NVIDIA_OUTPUTS)


def test_both_models_declare_exactly_the_contract_in_its_order(config):
    assert config.max_batch_size == contract.MAX_BATCH_SIZE == 0
    assert [t.name for t in config.input] == [s.name for s in contract.INPUTS]
    assert declared(config.input) == {s.name: (s.dtype, s.dims) for s in contract.INPUTS}
    assert all(t.optional for t in config.input)
    assert [t.name for t in config.output] == [s.name for s in contract.OUTPUTS]
    assert declared(config.output) == {s.name: (s.dtype, s.dims) for s in contract.OUTPUTS}


def test_the_model_named_tensorrt_llm_is_not_decoupled_and_hands_on_to_the_decoupled_one():
    front = read_model_config(ROOT / "model_repository" / contract.MODEL_NAME)
    assert front.name == contract.MODEL_NAME and front.backend == "python"
    assert not front.model_transaction_policy.decoupled and not front.HasField("dynamic_batching")
    from google.protobuf import json_format
    typed = from_model_config(contract.MODEL_NAME, json_format.MessageToDict(front, preserving_proto_field_name=True))
    assert typed.decoupled_model == contract.DECOUPLED_MODEL_NAME


def test_every_input_reaches_the_step_of_its_route_with_its_type_and_shape(ensemble):
    assert ensemble.name == contract.DECOUPLED_MODEL_NAME and ensemble.platform == "ensemble"
    steps = {step.model_name: step for step in ensemble.ensemble_scheduling.step}
    assert list(steps) == ["llm_tokenizer", "llm", "detokenizer"]
    routes = {(step, key): name for name, (step, key) in contract.ROUTES.items()}
    routes.update({route: "stop" for route in contract.STOP_ROUTES})
    inputs = {t.name: t for t in ensemble.input}
    found = {}
    for name, step in steps.items():
        model_inputs = {t.name: t for t in read_model_config(ROOT / "model_repository" / name).input}
        for key, value in step.input_map.items():
            assert key in model_inputs, f"{name} does not declare {key}"
            if value in inputs:
                found[(name, key)] = value
                assert (model_inputs[key].data_type, list(model_inputs[key].dims)) == (
                    inputs[value].data_type, list(inputs[value].dims)), (name, key)
                assert model_inputs[key].optional, (name, key)
    assert found == routes
    assert set(routes.values()) == set(inputs)


def test_every_output_comes_from_the_detokenizer_which_declares_it(ensemble):
    first, llm, last = ensemble.ensemble_scheduling.step
    detokenizer = read_model_config(ROOT / "model_repository" / "detokenizer")
    produced = {t.name: t for t in detokenizer.output}
    assert {value: key for key, value in last.output_map.items()} == contract.OUTPUT_SOURCES
    for output in ensemble.output:
        source = produced[contract.OUTPUT_SOURCES[output.name]]
        assert source.data_type == output.data_type, output.name
    # What the llm hands the detokenizer, each declared on both sides; the flag from the first step.
    llm_outputs = {t.name for t in read_model_config(ROOT / "model_repository" / "llm").output}
    detokenizer_inputs = {t.name for t in detokenizer.input}
    assert set(llm.output_map) <= llm_outputs and set(last.input_map) <= detokenizer_inputs
    assert {llm.output_map[key] for key in llm.output_map} == set(last.input_map.values())
    assert first.output_map[contract.LLMAPI_FLAG] == llm.input_map[contract.LLMAPI_FLAG]
    assert contract.STOP_REASON_IDS in llm.output_map and set(contract.UNMEASURED_OUTPUTS) <= set(llm.output_map)


def test_request_parameters_are_refused_by_name_except_nvidia_clients_streaming_and_tritons_own():
    contract.check_request_parameters(["Streaming", "timeout", "priority", "triton_enable_empty_final_response"])
    with pytest.raises(InvalidInput, match=r"^max_tokens: tensorrt_llm has no input .*did you mean "
                                           r"sampling_param_max_tokens\?"):
        contract.check_request_parameters(["max_tokens"])  # NVIDIA's own curl example sends it
    with pytest.raises(InvalidInput, match=r"^sampling_param_temprature: .*did you mean sampling_param_temperature"):
        contract.check_request_parameters(["sampling_param_temprature"])


@pytest.mark.parametrize("message, code", [
    ("in ensemble 'tensorrt_llm_decoupled', sampling_param_top_p: 3.0 must be in [0, 1]", "INVALID_ARG"),
    ("text_input: is required", "INVALID_ARG"),
    ("in ensemble 'x', sampling_param_stop[2]: has no tokens for this model", "INVALID_ARG"),
    ("in ensemble 'x', max_tokens: tensorrt_llm has no input or parameter of this name", "INVALID_ARG"),
    ("in ensemble 'x', Request cancelled by client: the tensorrt_llm requests ...", "CANCELLED"),
    ("in ensemble 'x', Exceeds maximum queue size", "UNAVAILABLE"),
    ("Request timeout expired", "UNAVAILABLE"),
    ("in ensemble 'x', RuntimeError: the engine failed", "INTERNAL"),
    ("in ensemble 'x', max_tokens: 9 is outside 1..8", "INTERNAL"),  # a generate name: not this client's error
])
def test_error_codes_come_back_from_the_message(message, code):
    assert contract.error_code(message) == code


def test_errors_of_generate_names_are_renamed_to_the_clients():
    renamed = contract.client_error(InvalidInput("stop_words[3]", "has no tokens for this model"))
    assert (renamed.field, str(renamed)) == ("sampling_param_stop[3]", "sampling_param_stop[3]: has no tokens for this model")
    assert str(contract.client_error(InvalidInput("return_log_probs", "x"))) == "return_cumulative_logprob: x"
    kept = InvalidInput("text_input", "is empty")
    assert contract.client_error(kept) is kept
    assert set(contract.CLIENT_NAMES.values()) <= {s.name for s in contract.INPUTS}

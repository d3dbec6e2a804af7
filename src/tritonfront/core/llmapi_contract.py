"""TensorRT-LLM's LLM-API Triton contract as the `tensorrt_llm` models serve it: the one place that
lists its tensors (names, Triton types, shapes as in NVIDIA's config.pbtxt), where each input goes
in the generate pipeline (llm_tokenizer -> llm -> detokenizer) and under which name, where each
output comes from, its defaults, and what no engine here honours and why.

Learned from NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm (config.pbtxt,
1/model.py, 1/helpers.py, 1/model.yaml) and the clients that talk to it (triton_backend/tools/
llmapi_client.py, tools/inflight_batcher_llm/end_to_end_test.py --test-llmapi): one prompt per
request, no batch dimension (model.yaml's max_batch_size 0), scalars as [1], sampling_param_stop
as [words]. The tensors of model_repository/tensorrt_llm and ensembles/tensorrt_llm_decoupled, and
what this contract adds to the steps' configs, are written from LLMAPI_MODEL and LLMAPI_PIPELINE
(`python scripts/configure.py --write-committed`, tritonfront.core.config_tensors);
tests/unit/test_llmapi_declaration.py checks them against NVIDIA's config, transcribed; docs/llmapi-contract.md's
table describes it.
"""
import difflib
from typing import Iterable, Optional

from tritonfront.errors import InvalidInput
from .config_tensors import REQUEST, RESPONSE, Pipeline, PipelineTensor
from .inputs import Inputs, scalar
from . import trtllm_contract
from .trtllm_contract import DETOKENIZER, LLM, TOKENIZER, TRITON_REQUEST_PARAMETERS

# NVIDIA's model is decoupled or not as its model.yaml says (decoupled: False by default), and
# Triton lets a client call a decoupled model over gRPC streams only (unary ModelInfer and HTTP infer
# refuse it), so its clients do one or the other. Both are served here: `tensorrt_llm`, not
# decoupled (model_repository/tensorrt_llm: NVIDIA's default; unary gRPC, HTTP infer and generate),
# answers each request through `tensorrt_llm_decoupled` (ensembles/: the generate pipeline,
# decoupled; streams), one call per request. scripts/configure.py --llmapi-decoupled serves the
# decoupled one under NVIDIA's name instead, as decoupled: True in model.yaml does.
MODEL_NAME = "tensorrt_llm"
DECOUPLED_MODEL_NAME = "tensorrt_llm_decoupled"
# model.yaml's triton_config.max_batch_size: no batch dimension, so clients send [1] tensors. The
# ensemble's steps batch (max_batch_size 64): Triton puts a batch dimension of 1 in front of each
# tensor a step gets, and takes it off what the last step answers.
MAX_BATCH_SIZE = 0

_TEXT_INPUT_NOTE = ("Required by the llm_tokenizer, which names it (NVIDIA's declares it required; Triton 2.51 counts "
                    "inputs only: src/tritonfront/core/trtllm_contract.py).")


def _input(name: str, dtype: str, dims: tuple, note: str = "") -> PipelineTensor:
    return PipelineTensor(name, dtype, dims, REQUEST, MODEL_NAME, optional=True, source_note=note, sink_note=note)


def _output(name: str, dtype: str, dims: tuple) -> PipelineTensor:
    return PipelineTensor(name, dtype, dims, MODEL_NAME, RESPONSE)


# NVIDIA's inputs, in its order. One difference: text_input, required there, is optional here, as
# on `generate` (trtllm_contract says why: an ensemble whose required input is missing answers
# nothing); the llm_tokenizer requires it itself, naming it.
INPUTS = (
    _input("text_input", "TYPE_STRING", (-1,), _TEXT_INPUT_NOTE),
    _input("image_url", "TYPE_STRING", (-1,)),
    _input("streaming", "TYPE_BOOL", (1,)),
    _input("sampling_param_best_of", "TYPE_INT32", (1,)),
    _input("sampling_param_temperature", "TYPE_FP32", (1,)),
    _input("sampling_param_top_k", "TYPE_INT32", (1,)),
    _input("sampling_param_top_p", "TYPE_FP32", (1,)),
    _input("sampling_param_frequency_penalty", "TYPE_FP32", (1,)),
    _input("sampling_param_presence_penalty", "TYPE_FP32", (1,)),
    _input("sampling_param_max_tokens", "TYPE_INT32", (1,)),
    _input("sampling_param_stop", "TYPE_STRING", (-1,)),
    _input("sampling_param_seed", "TYPE_UINT64", (1,)),
    _input("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,)),
    _input("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,)),
    _input("return_finish_reason", "TYPE_BOOL", (1,)),
    _input("return_stop_reason", "TYPE_BOOL", (1,)),
    _input("return_cumulative_logprob", "TYPE_BOOL", (1,)),
    _input("stop", "TYPE_BOOL", (1,)),
    _input("lora_id", "TYPE_UINT64", (1,)),
    _input("lora_name", "TYPE_STRING", (1,)),
    _input("lora_path", "TYPE_STRING", (1,)),
    _input("lora_ckpt_source", "TYPE_STRING", (1,)),
)
# Required in NVIDIA's config, optional here (see above).
REQUIRED_BY_NVIDIA = ("text_input",)

OUTPUTS = (
    _output("text_output", "TYPE_STRING", (-1,)),
    _output("finish_reason", "TYPE_STRING", (-1,)),
    _output("stop_reason", "TYPE_STRING", (-1,)),
    _output("cumulative_logprob", "TYPE_FP32", (-1,)),
    _output("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    _output("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    _output("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    _output("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    _output("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    _output("arrival_time_ns", "TYPE_INT64", (1,)),
    _output("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    _output("first_token_time_ns", "TYPE_INT64", (1,)),
    _output("last_token_time_ns", "TYPE_INT64", (1,)),
    _output("acceptance_rate", "TYPE_FP32", (1,)),
    _output("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    _output("total_draft_tokens", "TYPE_INT32", (1,)),
)

# The non-decoupled model: the contract's tensors as its own inputs and outputs.
LLMAPI_MODEL = Pipeline(declared_in="LLMAPI_MODEL in src/tritonfront/core/llmapi_contract.py", ensemble=None,
                        steps=(MODEL_NAME,), tensors=(*INPUTS, *OUTPUTS), ragged_batches=False)

# Where each input goes: (step, that step's input name). Inputs that mean what a generate input
# means go to it; those whose meaning differs go to the llm under their own name, where
# tritonfront.core.llmapi_request reads them (greedy rule, defaults, cumulative streaming).
# text_input reaches the llm_tokenizer under a name of its own so that the first step knows which
# contract a request follows (an ensemble cannot add a constant): it checks the request's
# parameters against this contract and tells the llm (LLMAPI_FLAG).
ROUTES = {
    "text_input": (TOKENIZER, "llmapi_text_input"),
    "sampling_param_stop": (TOKENIZER, "sampling_param_stop"),
    "streaming": (LLM, "stream"),
    "sampling_param_frequency_penalty": (LLM, "frequency_penalty"),
    "sampling_param_presence_penalty": (LLM, "presence_penalty"),
    "sampling_param_seed": (LLM, "seed"),
    "sampling_param_return_perf_metrics": (LLM, "return_perf_metrics"),
    **{name: (LLM, name) for name in (
        "image_url", "sampling_param_best_of", "sampling_param_temperature", "sampling_param_top_k",
        "sampling_param_top_p", "sampling_param_max_tokens", "sampling_param_exclude_input_from_output",
        "return_finish_reason", "return_stop_reason", "return_cumulative_logprob", "lora_id", "lora_name",
        "lora_path", "lora_ckpt_source")},
}
# `stop` goes to both: the llm_tokenizer lets a stop request's prompt through unchecked (NVIDIA's
# client sends an empty one), the llm answers it.
STOP_ROUTES = ((TOKENIZER, "stop"), (LLM, "stop"))
# The llm_tokenizer's output that tells the llm a request follows this contract.
LLMAPI_FLAG = "llmapi_request"

# Where each output comes from: the detokenizer's output of this name (it passes on what the llm
# sends). cumulative_logprob is generate's cum_log_probs, kv_cache_reused_block its
# kv_cache_reused_blocks.
OUTPUT_SOURCES = {tensor.name: tensor.name for tensor in OUTPUTS}
OUTPUT_SOURCES.update(cumulative_logprob="cum_log_probs", kv_cache_reused_block="kv_cache_reused_blocks")
# Outputs only this contract has, which the llm sends for its requests (return_perf_metrics): not
# measured by any engine adapter here, so 0 (a hit rate of 0 is no claim that nothing was reused).
UNMEASURED_OUTPUTS = ("kv_cache_missed_block", "kv_cache_hit_rate")
# The llm's output for return_stop_reason: the ids of the stop word that ended the sequence (empty
# otherwise); the detokenizer decodes them into stop_reason.
STOP_REASON_IDS = "stop_reason_ids"

# What this contract's inputs are called at the steps, with what each step's config says of them.
_STEP_NOTES = {
    (TOKENIZER, "llmapi_text_input"):
        "The tensorrt_llm model's text_input (TensorRT-LLM's LLM-API contract, src/tritonfront/core/"
        "llmapi_contract.py): one prompt, raw. Its own name tells this step which contract the request follows "
        "(request parameters, error names), and the llm (llmapi_request below).",
    (TOKENIZER, "sampling_param_stop"): "The LLM-API contract's stop strings: stop words, under that contract's name.",
    (TOKENIZER, "stop"): "The LLM-API contract's stop request: its prompt is not checked (the llm answers it).",
    (LLM, "stop"): "true: a stop request of the LLM-API contract, which ends the requests sent with its request id.",
    (LLM, "image_url"): "This and the LoRA inputs below are declared so that a request using them gets an "
                        "INVALID_ARG saying why (tritonfront.core.llmapi_contract.UNSUPPORTED).",
}


def _routed(name: str, step: str, step_name: str) -> PipelineTensor:
    """One of the contract's inputs as the step of its route takes it: under the step's name, the
    ensemble's input keeping NVIDIA's."""
    contract = next(tensor for tensor in INPUTS if tensor.name == name)
    return PipelineTensor(step_name, contract.dtype, contract.dims, REQUEST, step, optional=True,
                          source_note=contract.source_note, sink_note=_STEP_NOTES.get((step, step_name), ""),
                          ensemble_name=name if step_name != name else "")


def _answered(name: str, step_output: Optional[PipelineTensor] = None) -> PipelineTensor:
    """One of the contract's outputs, from the detokenizer's output OUTPUT_SOURCES names: that
    output as the generate pipeline declares it (`step_output`: one only this contract has)."""
    contract = next(tensor for tensor in OUTPUTS if tensor.name == name)
    source = step_output or trtllm_contract.spec(OUTPUT_SOURCES[name])
    return PipelineTensor(source.name, source.dtype, source.dims, DETOKENIZER, RESPONSE,
                          source_note=source.source_note, ensemble_name=name if source.name != name else "",
                          ensemble_dims=contract.dims if contract.dims != source.dims else None)


# The generate pipeline's tensors between the steps that this contract's requests use too (never
# bad_words_ids: the contract has no bad words; not output_log_probs: it returns the sum alone).
_SHARED = ("input_ids", "input_lengths", "stop_words_ids", "delivery_acknowledged", "chunk", "cum_log_probs",
           *trtllm_contract.PERF_METRIC_OUTPUTS)
_PERF_METRICS_ONLY_HERE = "Passed on (tensorrt_llm requests' perf metrics; not measured, 0)."

# tensorrt_llm_decoupled: the contract's tensors on the generate pipeline's steps. Its steps'
# configs carry the generate pipeline's tensors and these (tritonfront.core.config_tensors'
# merged_model): each step reads one name for one meaning.
LLMAPI_PIPELINE = Pipeline(
    declared_in="LLMAPI_PIPELINE in src/tritonfront/core/llmapi_contract.py",
    ensemble=DECOUPLED_MODEL_NAME, steps=(TOKENIZER, LLM, DETOKENIZER),
    tensors=(
        *(_routed(tensor.name, step, step_name) for tensor in INPUTS
          for step, step_name in (STOP_ROUTES if tensor.name == "stop" else (ROUTES[tensor.name],))),
        *(tensor for tensor in trtllm_contract.GENERATE_PIPELINE.tensors
          if tensor.name in _SHARED and tensor.source != REQUEST and tensor.sink != RESPONSE),
        PipelineTensor(LLMAPI_FLAG, "TYPE_BOOL", (1,), TOKENIZER, LLM, optional=True,
                       source_note="True, for the requests that came as llmapi_text_input only: the tensorrt_llm "
                                   "model feeds it to the llm, which then reads the request by the LLM-API contract.",
                       sink_note="true: the request came through the tensorrt_llm model (TensorRT-LLM's LLM-API "
                                 "contract, src/tritonfront/core/llmapi_request.py): the inputs below are read by that "
                                 "contract's rules (greedy rule, defaults, the text so far when streamed). The rest of "
                                 "what that model sends arrives under the generate names above (stream, penalties, "
                                 "seed, return_perf_metrics)."),
        PipelineTensor(STOP_REASON_IDS, "TYPE_INT32", (-1,), LLM, DETOKENIZER, optional=True,
                       source_note="LLM-API requests that asked for return_stop_reason: the ids of the stop word that "
                                   "ended the sequence (empty until then, and when none did); the detokenizer decodes "
                                   "them.",
                       sink_note='tensorrt_llm requests with return_stop_reason: decoded into stop_reason ("None" '
                                 "when empty)."),
        PipelineTensor("kv_cache_missed_block", "TYPE_INT32", (1,), LLM, DETOKENIZER, optional=True,
                       source_note="LLM-API requests with return_perf_metrics: outputs only that contract has; not "
                                   "measured (0).", sink_note=_PERF_METRICS_ONLY_HERE),
        PipelineTensor("kv_cache_hit_rate", "TYPE_FP32", (1,), LLM, DETOKENIZER, optional=True),
        _answered("text_output"),
        _answered("finish_reason"),
        _answered("stop_reason", PipelineTensor(
            "stop_reason", "TYPE_STRING", (1,), DETOKENIZER, RESPONSE,
            source_note='The stop word that ended a tensorrt_llm sequence, decoded from stop_reason_ids, or "None".')),
        _answered("cumulative_logprob"),
        _answered("kv_cache_reused_block"),
        _answered("kv_cache_missed_block", PipelineTensor("kv_cache_missed_block", "TYPE_INT32", (1,), DETOKENIZER,
                                                          RESPONSE)),
        _answered("kv_cache_alloc_new_blocks"),
        _answered("kv_cache_alloc_total_blocks"),
        _answered("kv_cache_hit_rate", PipelineTensor("kv_cache_hit_rate", "TYPE_FP32", (1,), DETOKENIZER, RESPONSE)),
        *(_answered(name) for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                       "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens",
                                       "total_draft_tokens")),
    ))

# NVIDIA's model sends str() of the LLM API's values: a field that has none is the text "None"
# (finish_reason before the last response, stop_reason unless a stop word ended the sequence).
NONE_TEXT = "None"
# TensorRT-LLM's SamplingParams defaults where a request leaves the input out (helpers.py sends only
# what the request has, and exclude_input_from_output False, best_of 1).
DEFAULT_MAX_TOKENS = 32
DEFAULT_EXCLUDE_INPUT = False
# best_of > 1 samples several sequences and returns the best: not served (one sequence per request).
MAX_BEST_OF = 1

# Inputs no engine here honours: a request whose value asks for something (anything but an empty
# string) is INVALID_ARG with this reason, as NVIDIA's model would fail it where it has no adapters
# or no multimodal model.
UNSUPPORTED = {
    "image_url": "image inputs are not supported: the served model is text-only",
    **{name: "LoRA adapters are not supported: no engine here loads adapters, the base model serves every request"
       for name in ("lora_id", "lora_name", "lora_path", "lora_ckpt_source")},
}

# The generate-contract names the pipeline's checks use, as this contract's client knows them: an
# error a step raises for one of these is renamed (tritonfront.core.llmapi_request.renamed).
CLIENT_NAMES = {
    "text_input": "text_input",
    "input_ids": "text_input",
    "stop_words": "sampling_param_stop",
    "stream": "streaming",
    "max_tokens": "sampling_param_max_tokens",
    "temperature": "sampling_param_temperature",
    "top_k": "sampling_param_top_k",
    "top_p": "sampling_param_top_p",
    "frequency_penalty": "sampling_param_frequency_penalty",
    "presence_penalty": "sampling_param_presence_penalty",
    "seed": "sampling_param_seed",
    "random_seed": "sampling_param_seed",
    "return_log_probs": "return_cumulative_logprob",
    "exclude_input_in_output": "sampling_param_exclude_input_from_output",
    "return_perf_metrics": "sampling_param_return_perf_metrics",
}

# Request parameters NVIDIA's own client sends that its model ignores: llmapi_client.py sends
# {"Streaming": ...} with every request (model.py reads the `streaming` input only). Accepted and
# ignored here too, so that client works.
IGNORED_PARAMETERS = frozenset({"Streaming"})
NO_SUCH_NAME = "has no input or parameter of this name"


def check_request_parameters(names: Iterable[str]) -> None:
    """Refuses a request parameter this contract does not define, naming it (over HTTP's generate
    extension every JSON key that is not an input arrives as one, so a misspelled input would
    otherwise be ignored without a word)."""
    known = [tensor.name for tensor in INPUTS]
    for name in names:
        if name in TRITON_REQUEST_PARAMETERS or name.startswith("triton_") or name in IGNORED_PARAMETERS:
            continue
        # The LLM API's own keyword (NVIDIA's curl example sends max_tokens) is this input's suffix.
        close = [f"sampling_param_{name}"] if f"sampling_param_{name}" in known else \
            difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InvalidInput(name, f"{MODEL_NAME} {NO_SUCH_NAME}{hint}; over HTTP's generate extension every key of "
                                 "the JSON body that is not an input arrives as a parameter")


# NVIDIA's answer to a stop request (model.py: TritonError CANCELLED); ours starts with it.
STOP_ANSWER = "Request cancelled by client"
# Triton's own messages for a request it rejects because a queue is full or its time ran out.
_UNAVAILABLE_MESSAGES = ("Exceeds maximum queue size", "Request timeout expired")


def error_code(message: str) -> str:
    """The Triton error code (pb_utils.TritonError's name) of an error the decoupled model answered,
    from its message alone: Triton 2.51's BLS hands the non-decoupled model every error as
    INTERNAL. The pipeline's client errors name an input of this contract first ("field: why",
    tritonfront.errors.InvalidInput, after Triton's "in ensemble '...', "), the stop request's
    answer starts with STOP_ANSWER, and Triton's rejections say why; anything else is INTERNAL."""
    text = message.split("', ", 1)[1] if message.startswith("in ensemble '") and "', " in message else message
    if text.startswith(STOP_ANSWER):
        return "CANCELLED"
    if any(reason in text for reason in _UNAVAILABLE_MESSAGES):
        return "UNAVAILABLE"
    field = text.split(":", 1)[0].split("[", 1)[0].split(" (", 1)[0]
    if ":" in text and (field in {tensor.name for tensor in INPUTS} or NO_SUCH_NAME in text):
        return "INVALID_ARG"
    return "INTERNAL"


def check_not_streaming(inputs: Inputs) -> None:
    """The non-decoupled model's refusal of a streamed request (NVIDIA's model.py: "Streaming is
    only supported in decoupled mode")."""
    if scalar(inputs, "streaming", False):
        raise InvalidInput("streaming", f"true needs a decoupled model: {MODEL_NAME} answers once per request (as "
                                        f"NVIDIA's with model.yaml's default decoupled: False); stream from "
                                        f"{DECOUPLED_MODEL_NAME} over a gRPC stream or HTTP generate_stream")


def spec(name: str) -> PipelineTensor:
    """The contract's input or output of this name."""
    return next(tensor for tensor in (*INPUTS, *OUTPUTS) if tensor.name == name)


def client_error(error: InvalidInput) -> InvalidInput:
    """The error a step raised under a generate input's name, under the name this contract's
    client sent (CLIENT_NAMES); an indexed field (`stop_words[2]`) keeps its index."""
    base, bracket, rest = error.field.partition("[")
    name = CLIENT_NAMES.get(base)
    if name is None or name == base:
        return error
    problem = str(error)[len(error.field) + 2:]
    return InvalidInput(name + bracket + rest, problem)

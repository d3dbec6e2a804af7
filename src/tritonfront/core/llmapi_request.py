"""An `llm` request that came through the `tensorrt_llm` model (TensorRT-LLM's LLM-API contract,
tritonfront.core.llmapi_contract): its inputs read by that contract's rules, turned into the
generate contract's inputs, then parsed as any request (generation_request.parse_batch), so every
limit is checked in one place; errors name the inputs this contract's client sent.

What differs from the generate contract, as NVIDIA's model.py and TensorRT-LLM's SamplingParams
define it:
- greedy unless a temperature, top_k or top_p is given, and greedy again if top_k is 1, top_p is 0
  or temperature is 0 (SamplingParams.params_imply_greedy_decoding); a temperature alone samples,
  from the whole vocabulary at that temperature;
- sampling_param_max_tokens defaults to 32 (SamplingParams.max_tokens), not to what the context leaves;
- sampling_param_exclude_input_from_output defaults to false (helpers.py): the prompt precedes the
  answer, and a stream's text_output is the text so far (CompletionOutput.text), not the new part;
- finish_reason and stop_reason only on request, "None" where the LLM API has none;
- a request with `stop` true is not generated: it stops the requests of its id (stop_requests).
"""
import dataclasses
import math
from typing import Any, Callable, Optional

import numpy as np

from ..errors import Cancelled, InvalidInput
from .generation_request import LLMAPIOutputs, SequenceRequest, parse_batch
from .inputs import Inputs, scalar
from .llmapi_contract import (DEFAULT_EXCLUDE_INPUT, DEFAULT_MAX_TOKENS, LLMAPI_FLAG, MAX_BEST_OF, MODEL_NAME,
                              STOP_ANSWER, UNSUPPORTED, client_error)
from .stop_requests import StopBoard

# This contract's inputs the llm reads itself; the rest of what it gets is the generate contract's.
OWN_INPUTS = ("image_url", "sampling_param_best_of", "sampling_param_temperature", "sampling_param_top_k",
              "sampling_param_top_p", "sampling_param_max_tokens", "sampling_param_exclude_input_from_output",
              "return_finish_reason", "return_stop_reason", "return_cumulative_logprob", "stop",
              "lora_id", "lora_name", "lora_path", "lora_ckpt_source", LLMAPI_FLAG)


def follows_contract(inputs: Inputs) -> bool:
    """Whether the request came through the tensorrt_llm model (its llm_tokenizer flagged it)."""
    return bool(scalar(inputs, LLMAPI_FLAG, False))


def parse(inputs: Inputs, request_id: str, vocab_size: int, context_length: int,
          check: Callable[[Any], None], stops: Optional[StopBoard]) -> list[SequenceRequest]:
    """The request's one sequence, checked by `check` (the engine's check_request) too; a stop
    request is posted to `stops` and raises Cancelled, its answer."""
    if scalar(inputs, "stop", False):
        _stop(request_id, stops)
    try:
        _check_unsupported(inputs)
        sent_max_tokens = "sampling_param_max_tokens" in inputs
        try:
            sequences = parse_batch(generate_inputs(inputs), vocab_size, context_length, DEFAULT_EXCLUDE_INPUT)
        except InvalidInput as error:
            if error.field == "max_tokens" and not sent_max_tokens:
                problem = str(error)[len(error.field) + 2:]
                raise InvalidInput("sampling_param_max_tokens", f"not sent, so TensorRT-LLM's default of "
                                                                f"{DEFAULT_MAX_TOKENS}: {problem}") from None
            raise
        for sequence in sequences:
            check(sequence.params)
    except InvalidInput as error:
        raise client_error(error) from None
    outputs = LLMAPIOutputs(finish_reason=bool(scalar(inputs, "return_finish_reason", False)),
                            stop_reason=bool(scalar(inputs, "return_stop_reason", False)))
    return [dataclasses.replace(sequence, options=dataclasses.replace(sequence.options, llmapi=outputs))
            for sequence in sequences]


def _stop(request_id: str, stops: Optional[StopBoard]) -> None:
    if not request_id:
        raise InvalidInput("stop", "needs the request id of the requests to stop: a stop request ends the "
                                   f"{MODEL_NAME} requests in flight that were sent with the same id")
    if stops is not None:
        stops.post(request_id)
    raise Cancelled(f"{STOP_ANSWER}: a stop request; the {MODEL_NAME} requests in flight with id {request_id!r} "
                    "were told to stop")


def _check_unsupported(inputs: Inputs) -> None:
    for name, reason in UNSUPPORTED.items():
        value = inputs.get(name)
        if value is None or value.size == 0:
            continue
        if value.dtype == np.object_ and all(item in (b"", "") for item in value.reshape(-1)):
            continue  # an empty string asks for nothing
        raise InvalidInput(name, reason)
    best_of = scalar(inputs, "sampling_param_best_of")
    if best_of is not None and best_of != MAX_BEST_OF:
        raise InvalidInput("sampling_param_best_of", f"{best_of}: only {MAX_BEST_OF} is served (best_of > 1 samples "
                                                     "several sequences to return the best one: not supported)")


def _column(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def sampling(temperature: Optional[float], top_k: Optional[int], top_p: Optional[float]) -> dict[str, np.ndarray]:
    """The generate contract's temperature, top_k and top_p for the LLM API's: checked as TensorRT-
    LLM's SamplingParams checks them, then greedy or sampled by its rule (module docstring)."""
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidInput("sampling_param_temperature", f"{temperature} must be a finite number >= 0 (0 is greedy)")
    if top_k is not None and top_k < 0:
        raise InvalidInput("sampling_param_top_k", f"{top_k} must be >= 0 (0: all tokens; 1 is greedy)")
    if top_p is not None and not (math.isfinite(top_p) and 0 <= top_p <= 1):
        raise InvalidInput("sampling_param_top_p", f"{top_p} must be in [0, 1] (0 is greedy)")
    greedy = (temperature is None and top_k is None and top_p is None) or top_k == 1 or top_p == 0 or temperature == 0
    if greedy:
        return {"temperature": _column(0.0, np.float32)}
    # The generate contract samples when a top_p is given: 1.0 where the LLM API leaves it unset.
    return {"temperature": _column(1.0 if temperature is None else temperature, np.float32),
            "top_k": _column(top_k or 0, np.int32), "top_p": _column(1.0 if top_p is None else top_p, np.float32)}


def generate_inputs(inputs: Inputs) -> dict[str, np.ndarray]:
    """The request as the generate contract's inputs: what the ensemble routed to those names
    already (prompt ids, stop words, stream, penalties, seed, return_perf_metrics), plus this
    contract's own inputs turned into theirs."""
    converted = {name: value for name, value in inputs.items() if name not in OWN_INPUTS}
    converted.update(sampling(scalar(inputs, "sampling_param_temperature"), scalar(inputs, "sampling_param_top_k"),
                              scalar(inputs, "sampling_param_top_p")))
    converted["max_tokens"] = _column(scalar(inputs, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS), np.int32)
    converted["exclude_input_in_output"] = _column(
        bool(scalar(inputs, "sampling_param_exclude_input_from_output", DEFAULT_EXCLUDE_INPUT)), bool)
    # The cumulative log probability is the sum of the sent tokens' log probs (cum_log_probs).
    converted["return_log_probs"] = _column(bool(scalar(inputs, "return_cumulative_logprob", False)), bool)
    return converted

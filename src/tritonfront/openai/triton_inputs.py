"""A TextGenerationRequest -> the inputs of the generation ensemble, whose contract is TensorRT-LLM's
`ensemble` (docs/ensemble-contract.md): one Triton request per prompt, every one streamed.

Which inputs a model has is read from the model itself (its config, through Triton): a parameter
whose input the model lacks is refused naming the parameter and the input, never dropped. Where
TensorRT-LLM renamed an input (random_seed -> seed, min_length -> min_tokens) the current name is
used when the model has it.

Sampling follows OpenAI's defaults, not TensorRT-LLM's: OpenAI samples at temperature 1 and top_p 1
unless told otherwise, while the contract is greedy unless top_k or top_p asks for sampling; so the
front always sends top_p with a non-zero temperature, and temperature 0 alone for greedy.
"""
import json
from dataclasses import dataclass
from typing import Any, Optional

from . import logprobs
from .api_errors import unsupported
from .backend import TextGenerationRequest
from .protocol import ResponseFormat, Sampling
from .triton_client import Contract

OPENAI_TEMPERATURE = OPENAI_TOP_P = 1.0
UINT64 = 2**64
# Outputs every request reads; the others only when asked for.
TEXT_OUTPUTS = ("text_output", "finish_reason", "prompt_tokens", "completion_tokens")
SEQUENCE_INDEX, LOG_PROBS, TOKEN_TEXTS = "sequence_index", "output_log_probs", "output_token_texts"


@dataclass
class Plan:
    """What to send for one request: one Triton request per prompt, the same inputs beside it."""
    prompts: list[str]
    inputs: dict[str, Any]  # Triton input -> value (a scalar, or a list for a list input)
    params: dict[str, str]  # Triton input -> the OpenAI parameter it came from (for errors)
    outputs: list[str]
    n: int = 1
    logprobs: Optional[int] = None  # None: not asked for; k: with up to k alternatives per token


class _Inputs:
    """The inputs being built for one model, refusing what the model cannot take."""

    def __init__(self, contract: Contract):
        self.contract = contract
        self.values: dict[str, Any] = {}
        self.params: dict[str, str] = {}

    def put(self, param: str, value: Any, *names: str) -> None:
        """Sends `value` as the first of `names` the model declares."""
        for name in names:
            if name in self.contract.inputs:
                self.values[name], self.params[name] = value, param
                return
        raise unsupported(param, f"model '{self.contract.model}' cannot take it: it has no input "
                                 f"{' or '.join(repr(n) for n in names)}")


def _sampling(request: Sampling, inputs: _Inputs) -> None:
    temperature = OPENAI_TEMPERATURE if request.temperature is None else request.temperature
    inputs.put("temperature", float(temperature), "temperature")
    if temperature > 0:
        inputs.put("top_p", float(OPENAI_TOP_P if request.top_p is None else request.top_p), "top_p")
        if request.top_k is not None:
            inputs.put("top_k", request.top_k, "top_k")
    if request.seed is not None:
        inputs.put("seed", request.seed % UINT64, "seed", "random_seed")
    if request.stop:
        inputs.put("stop", list(request.stop), "stop_words")
    for param in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = getattr(request, param)
        if value is not None:
            inputs.put(param, float(value), param)
    if request.min_tokens is not None:
        inputs.put("min_tokens", request.min_tokens, "min_tokens", "min_length")
    if request.n > 1:
        inputs.put("n", request.n, "num_return_sequences")
    inputs.put("stream", True, "stream")


def _log_probs(inputs: _Inputs, param: str, alternatives: int) -> None:
    if alternatives:  # the tritonfront extension; it turns the log-prob outputs on by itself
        inputs.put(param, alternatives, logprobs.TOP_LOGPROBS)
    else:
        inputs.put(param, True, "return_log_probs")
    inputs.put(param, True, logprobs.TOKEN_TEXTS_INPUT)  # each token's bytes, the text its log prob belongs to


def _outputs(contract: Contract, inputs: dict, alternatives: Optional[int]) -> list[str]:
    outputs = list(TEXT_OUTPUTS)
    if SEQUENCE_INDEX in contract.outputs:
        outputs.append(SEQUENCE_INDEX)
    if alternatives is not None:
        outputs.extend((LOG_PROBS, logprobs.TOKEN_TEXTS))
        if alternatives:
            outputs += [logprobs.TOP_LOG_PROBS, logprobs.TOP_TEXTS]
    return outputs


def _response_format(form: Optional[ResponseFormat], inputs: _Inputs) -> None:
    if form is None or form.type == "text":
        return
    if form.type == "json_object":
        inputs.put("response_format", "json", "guided_decoding_guide_type")
        return
    inputs.put("response_format", "json_schema", "guided_decoding_guide_type")
    inputs.put("response_format", json.dumps(form.json_schema.schema_), "guided_decoding_guide")


def _guide(guide: tuple[str, str], inputs: _Inputs) -> None:
    kind, text = guide
    inputs.put("tool_choice", kind, "guided_decoding_guide_type")
    inputs.put("tools", text, "guided_decoding_guide")


def plan(request: TextGenerationRequest, contract: Contract) -> Plan:
    inputs = _Inputs(contract)
    inputs.put(request.prompt_param, request.prompts[0], "text_input")
    inputs.values.pop("text_input")  # each prompt goes in a request of its own
    if request.max_tokens is not None:
        inputs.put(request.max_tokens_param, request.max_tokens, "max_tokens")
    _sampling(request.sampling, inputs)
    if request.logprobs is not None:
        _log_probs(inputs, request.logprobs_param, request.logprobs)
    _response_format(request.response_format, inputs)
    if request.guide is not None:
        _guide(request.guide, inputs)
    return Plan(list(request.prompts), inputs.values, inputs.params,
                _outputs(contract, inputs.values, request.logprobs), n=request.sampling.n, logprobs=request.logprobs)

"""An OpenAI completion or chat request -> the inputs of the generation ensemble, whose contract is
TensorRT-LLM's `ensemble` (README: Interfaces): one Triton request per prompt, every one streamed.

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
from typing import Any, Optional, Union

from .errors import invalid, unsupported
from .prompts import Prompts
from .schemas import ChatCompletionRequest, CompletionRequest
from .triton import Contract

OPENAI_TEMPERATURE = OPENAI_TOP_P = 1.0
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
UINT64 = 2**64
# Outputs every request reads; the others only when asked for.
TEXT_OUTPUTS = ("text_output", "finish_reason", "prompt_tokens", "completion_tokens")
SEQUENCE_INDEX, LOG_PROBS = "sequence_index", "output_log_probs"


@dataclass
class Plan:
    """What to send for one OpenAI request: one Triton request per prompt, the same inputs beside it."""
    model: str
    prompts: list[str]
    inputs: dict[str, Any]  # Triton input -> value (a scalar, or a list for a list input)
    params: dict[str, str]  # Triton input -> the OpenAI parameter it came from (for errors)
    outputs: list[str]
    n: int = 1
    logprobs: Optional[int] = None  # None: not asked for; k: with up to k alternatives per token
    echo: bool = False  # completions: the prompt before the answer
    stream: bool = False
    include_usage: bool = False


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


def _sampling(request: Union[ChatCompletionRequest, CompletionRequest], inputs: _Inputs) -> None:
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
    if alternatives:
        raise unsupported(param, f"{alternatives} alternatives per token asked for, but the generation contract "
                                 "returns only the chosen token's log probability (output_log_probs): use 0")
    inputs.put(param, True, "return_log_probs")


def _outputs(contract: Contract, logprobs: bool) -> list[str]:
    outputs = list(TEXT_OUTPUTS)
    if SEQUENCE_INDEX in contract.outputs:
        outputs.append(SEQUENCE_INDEX)
    if logprobs:
        outputs.append(LOG_PROBS)
    return outputs


def chat_plan(request: ChatCompletionRequest, contract: Contract, prompts: Prompts, default_max_tokens: int = 0) -> Plan:
    """`default_max_tokens`: FrontConfig.default_max_tokens, the limit of a request that sets none."""
    if not prompts.has_chat_template:
        raise invalid("messages", f"messages: model '{request.model}' has no chat template; use /v1/completions")
    prompt = prompts.chat([message.model_dump(exclude_none=True) for message in request.messages])
    inputs = _Inputs(contract)
    inputs.put("messages", prompt, "text_input")
    limit, limit_param = request.completion_limit
    if limit is None:  # OpenAI's and vLLM's default: as many tokens as the context leaves
        limit = prompts.room(prompt)
        if limit < 1:
            raise invalid("messages", f"messages: the prompt leaves no room to generate in the model's context of "
                                      f"{prompts.context_length} tokens")
        if default_max_tokens:
            limit = min(limit, default_max_tokens)
    inputs.put(limit_param, limit, "max_tokens")
    _sampling(request, inputs)
    if request.logprobs:
        _log_probs(inputs, "top_logprobs" if request.top_logprobs else "logprobs", request.top_logprobs or 0)
    _response_format(request, inputs)
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return Plan(request.model, [inputs.values.pop("text_input")], inputs.values, inputs.params,
                _outputs(contract, bool(request.logprobs)), n=request.n,
                logprobs=0 if request.logprobs else None, stream=request.stream, include_usage=include_usage)


def _response_format(request: ChatCompletionRequest, inputs: _Inputs) -> None:
    form = request.response_format
    if form is None or form.type == "text":
        return
    if form.type == "json_object":
        inputs.put("response_format", "json", "guided_decoding_guide_type")
        return
    inputs.put("response_format", "json_schema", "guided_decoding_guide_type")
    inputs.put("response_format", json.dumps(form.json_schema.schema_), "guided_decoding_guide")


def completion_plan(request: CompletionRequest, contract: Contract) -> Plan:
    if not all(isinstance(prompt, str) for prompt in request.prompt):
        raise unsupported("prompt", "token ids are not supported: the generation ensemble takes text")
    if request.echo and request.logprobs is not None:
        raise unsupported("echo", "echo with logprobs would need the prompt's log probs, which the generation "
                                  "contract does not return")
    inputs = _Inputs(contract)
    inputs.put("prompt", request.prompt[0], "text_input")
    inputs.put("max_tokens", COMPLETIONS_MAX_TOKENS if request.max_tokens is None else request.max_tokens, "max_tokens")
    _sampling(request, inputs)
    if request.logprobs is not None:
        _log_probs(inputs, "logprobs", request.logprobs)
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    inputs.values.pop("text_input")
    return Plan(request.model, list(request.prompt), inputs.values, inputs.params,
                _outputs(contract, request.logprobs is not None), n=request.n, logprobs=request.logprobs,
                echo=request.echo, stream=request.stream, include_usage=include_usage)

"""An `llm` request: its input tensors in, what the generation loop needs out, every limit checked.

Parsing happens on Triton's execute thread, before the request reaches the engine, so a bad
request gets its INVALID_ARG naming the input at once and never occupies the generation loop.

A request may hold several prompts (TensorRT-LLM's batched requests: every input has one row per
prompt) and ask for num_return_sequences sequences of each; `parse_batch` fans it out into one
SequenceRequest per sequence, each an engine request of its own, tagged with its batch and
sequence index. Inputs follow TensorRT-LLM's tensorrt_llm model (tritonfront.core.trtllm_contract).
"""
import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..engines.base import GUIDE_TYPES, GuidedDecoding, SamplingParams
from ..errors import InvalidInput
from .inputs import Inputs, required, row_scalar
from .stopping import stop_sequences_from_tensor
from .trtllm_contract import ALIASES, MAX_RETURN_SEQUENCES, MAX_SEQUENCES_PER_REQUEST, UNSUPPORTED


@dataclass(frozen=True)
class LLMAPIOutputs:
    """What a request of the LLM-API contract (tritonfront.core.llmapi_request) asked its responses
    to carry beside text_output, which is the text so far when streamed."""

    finish_reason: bool = False
    stop_reason: bool = False


@dataclass(frozen=True)
class ResponseOptions:
    """What a sequence's responses carry beside its text (TensorRT-LLM's output switches)."""

    exclude_input: bool = False  # False: a whole (non-streamed) answer's text starts with its prompt
    log_probs: bool = False
    top_logprobs: int = 0  # alternatives per token (tritonfront's extension); > 0 implies log_probs
    token_texts: bool = False  # the detokenizer adds each token's share of the text
    perf_metrics: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    llmapi: Optional[LLMAPIOutputs] = None  # set for the LLM-API contract's requests


@dataclass(frozen=True)
class SequenceRequest:
    """One sequence an `llm` request asks for: a request of its own to the engine."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    stop_sequences: Sequence[Sequence[int]] = ()
    stream: bool = False
    # A later step acknowledges each chunk it decodes (the generate ensemble's detokenizer), so a
    # stream whose chunks stop being acknowledged was abandoned (tritonfront.core.delivery).
    delivery_acknowledged: bool = False
    batch_index: int = 0  # the prompt's row in its request
    sequence_index: int = 0  # which of the prompt's num_return_sequences
    options: ResponseOptions = ResponseOptions()

    @classmethod
    def parse(cls, inputs: Inputs, vocab_size: int, context_length: int,
              exclude_input_default: bool = False, default_max_tokens: int = 0) -> "SequenceRequest":
        """A request of one prompt and one sequence; raises InvalidInput naming the first input
        outside its limit. `default_max_tokens`: LLMConfig.default_max_tokens (0: no cap below
        what the context leaves), the limit of a request that sends no max_tokens."""
        ids = required(inputs, "input_ids")
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise InvalidInput("input_ids", f"shape {list(ids.shape)} must be [1, tokens]: one prompt per request")
        return _parse_prompt(inputs, 0, 1, vocab_size, context_length, exclude_input_default, default_max_tokens)[0]


def parse_batch(inputs: Inputs, vocab_size: int, context_length: int,
                exclude_input_default: bool = False, default_max_tokens: int = 0) -> list[SequenceRequest]:
    """Every sequence a request asks for: its prompts (rows of input_ids) times each prompt's
    num_return_sequences, in that order. Raises InvalidInput naming the first bad input; nothing
    is returned for a request with any bad prompt."""
    ids = required(inputs, "input_ids")
    if ids.ndim != 2 or ids.shape[0] < 1:
        raise InvalidInput("input_ids", f"shape {list(ids.shape)} must be [prompts, tokens]")
    check_supported(inputs)
    rows = ids.shape[0]
    sequences = [request for row in range(rows)
                 for request in _parse_prompt(inputs, row, rows, vocab_size, context_length, exclude_input_default,
                                              default_max_tokens)]
    if len(sequences) > MAX_SEQUENCES_PER_REQUEST:
        raise InvalidInput("num_return_sequences", f"{len(sequences)} sequences ({rows} prompts) is over the limit "
                                                   f"of {MAX_SEQUENCES_PER_REQUEST} per request")
    return sequences


def check_supported(inputs: Inputs) -> None:
    """Raises InvalidInput for an input that asks for what no engine here does (trtllm_contract's
    UNSUPPORTED); inputs that ask for nothing (beam_width 1, return_*_logits false, empty
    tensors and strings) pass."""
    for name, reason in UNSUPPORTED.items():
        value = inputs.get(name)
        if value is None or value.size == 0:
            continue
        values = value.reshape(-1)
        if name == "beam_width":
            bad = [int(v) for v in values if int(v) not in (0, 1)]  # 0: TensorRT-LLM's "unset", i.e. 1
            if bad:
                raise InvalidInput(name, f"{bad[0]}: {reason}")
        elif value.dtype == np.bool_:
            if values.any():
                raise InvalidInput(name, f"true: {reason}")
        elif value.dtype == np.object_:
            if any(item not in (b"", "") for item in values):
                raise InvalidInput(name, reason)
        else:
            raise InvalidInput(name, reason)


def _alias(inputs: Inputs, name: str, row: int, rows: int):
    """The value of an input that has an older name (trtllm_contract.ALIASES) under either name."""
    values = {other: row_scalar(inputs, other, row, rows) for other, current in ALIASES.items() if current == name}
    values[name] = row_scalar(inputs, name, row, rows)
    given = {other: value for other, value in values.items() if value is not None}
    if len(set(given.values())) > 1:
        raise InvalidInput(name, f"{' and '.join(sorted(given))} are the same input and differ: {given}")
    return next(iter(given.values()), None)


def sequence_seed(seed: int, index: int) -> int:
    """The seed of sequence `index` of a prompt seeded with `seed`: the seed itself for the first,
    so one sequence samples as it always did; for the others a 64-bit hash of both, so n sampled
    sequences differ and a seeded request reproduces all of them."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _sampling(inputs: Inputs, row: int, rows: int) -> dict:
    """SamplingParams fields with TensorRT-LLM's defaults: greedy unless top_k > 1 or a top_p is
    given (temperature alone does not sample: its kernels take top_k = top_p = 0 as greedy), then
    temperature 1.0 unless given."""
    temperature = row_scalar(inputs, "temperature", row, rows)
    top_k = int(row_scalar(inputs, "top_k", row, rows, 0))
    top_p = row_scalar(inputs, "top_p", row, rows)
    samples = top_k > 1 or top_p is not None
    if temperature is not None and not samples and math.isfinite(temperature) and temperature > 0:
        temperature = 0.0
    elif temperature is None and samples:
        temperature = 1.0
    length_penalty = row_scalar(inputs, "length_penalty", row, rows)  # beam search only: no effect at width 1
    if length_penalty is not None and not math.isfinite(length_penalty):
        raise InvalidInput("length_penalty", f"{length_penalty} must be a finite number")
    return dict(
        temperature=temperature, top_k=top_k, top_p=float(1.0 if top_p is None else top_p),
        min_tokens=int(_alias(inputs, "min_tokens", row, rows) or 0),
        repetition_penalty=float(row_scalar(inputs, "repetition_penalty", row, rows, 1.0)),
        presence_penalty=float(row_scalar(inputs, "presence_penalty", row, rows, 0.0)),
        frequency_penalty=float(row_scalar(inputs, "frequency_penalty", row, rows, 0.0)),
        return_log_probs=bool(row_scalar(inputs, "return_log_probs", row, rows, False)),
        top_logprobs=int(row_scalar(inputs, "top_logprobs", row, rows, 0)),
    )


def _guided_decoding(inputs: Inputs, row: int, rows: int) -> Optional[GuidedDecoding]:
    """The guide of a prompt; its type and text are checked by GuidedDecoding.validate, whether it
    compiles by the engine (Engine.check_params)."""
    guide_type = row_scalar(inputs, "guided_decoding_guide_type", row, rows) or None
    guide = row_scalar(inputs, "guided_decoding_guide", row, rows) or None
    if guide_type is None:
        if guide is not None:
            raise InvalidInput("guided_decoding_guide_type", f"is required with guided_decoding_guide; one of "
                                                             f"{', '.join(GUIDE_TYPES)}")
        return None
    return GuidedDecoding(guide_type, guide)


def _parse_prompt(inputs: Inputs, row: int, rows: int, vocab_size: int, context_length: int,
                  exclude_input_default: bool, default_max_tokens: int) -> list[SequenceRequest]:
    ids = required(inputs, "input_ids")
    lengths = required(inputs, "input_lengths").reshape(-1)
    if lengths.size != rows:
        raise InvalidInput("input_lengths", f"has {lengths.size} values for {rows} prompts")
    length = int(lengths[row])
    if not 1 <= length <= ids.shape[1]:
        raise InvalidInput("input_lengths", f"{length} is outside 1..{ids.shape[1]}")
    prompt = ids[row, :length]
    if prompt.min() < 0 or prompt.max() >= vocab_size:
        raise InvalidInput("input_ids", f"token ids must be in 0..{vocab_size - 1}")
    max_tokens = row_scalar(inputs, "max_tokens", row, rows)
    unsent = max_tokens is None
    if max_tokens is None:
        # OpenAI's default: what the context leaves (a prompt that leaves nothing is refused by
        # validate below, naming input_ids), lowered by the llm's parameter.
        room = context_length - length
        max_tokens = min(room, default_max_tokens) if default_max_tokens else room
    max_tokens = int(max_tokens)
    count = int(row_scalar(inputs, "num_return_sequences", row, rows, 1))
    if not 1 <= count <= MAX_RETURN_SEQUENCES:
        raise InvalidInput("num_return_sequences", f"{count} is outside 1..{MAX_RETURN_SEQUENCES}")
    pad_id = row_scalar(inputs, "pad_id", row, rows)
    if pad_id is not None and not 0 <= pad_id < vocab_size:
        raise InvalidInput("pad_id", f"{pad_id} is outside the vocabulary 0..{vocab_size - 1}")
    fields = dict(max_tokens=max_tokens, random_seed=_alias(inputs, "seed", row, rows),
                  end_id=row_scalar(inputs, "end_id", row, rows), **_sampling(inputs, row, rows))
    min_tokens = fields["min_tokens"]
    bad_words = stop_sequences_from_tensor(_row(inputs, "bad_words_ids", row, rows), vocab_size, "bad_words_ids")
    fields.update(bad_words=tuple(tuple(word) for word in bad_words), guided_decoding=_guided_decoding(inputs, row, rows))
    # By its current name (SamplingParams names a negative one by the older), and against
    # max_tokens once max_tokens is known to be good.
    min_tokens_limit = InvalidInput("min_tokens", f"{min_tokens} is outside 0..max_tokens ({max_tokens})" + (
        "; no max_tokens was sent, so that is what the context leaves or the llm's default_max_tokens" if unsent else ""))
    if min_tokens < 0:
        raise min_tokens_limit
    params = SamplingParams(**fields).validate(length, context_length, vocab_size)
    if min_tokens > max_tokens:
        raise min_tokens_limit
    options = ResponseOptions(
        exclude_input=bool(row_scalar(inputs, "exclude_input_in_output", row, rows, exclude_input_default)),
        log_probs=params.wants_log_probs,
        top_logprobs=params.top_logprobs,
        token_texts=bool(row_scalar(inputs, "return_token_texts", row, rows, False)),
        perf_metrics=bool(row_scalar(inputs, "return_perf_metrics", row, rows, False)),
        num_input_tokens=bool(row_scalar(inputs, "return_num_input_tokens", row, rows, False)),
        num_output_tokens=bool(row_scalar(inputs, "return_num_output_tokens", row, rows, False)))
    stop = stop_sequences_from_tensor(_row(inputs, "stop_words_ids", row, rows), vocab_size)
    stream = bool(row_scalar(inputs, "stream", row, rows, False))
    acknowledged = bool(row_scalar(inputs, "delivery_acknowledged", row, rows, False))
    requests = []
    for index in range(count):
        seeded = params
        if params.random_seed is not None:
            seeded = dataclasses.replace(params, random_seed=sequence_seed(params.random_seed, index))
        requests.append(SequenceRequest(prompt.tolist(), seeded, stop, stream, acknowledged, row, index, options))
    return requests


def _row(inputs: Inputs, name: str, row: int, rows: int) -> Optional[np.ndarray]:
    """One prompt's [1, words, longest] slice of a [prompts, words, longest] word-list tensor."""
    tensor = inputs.get(name)
    if tensor is None or rows == 1:
        return tensor
    if tensor.ndim != 3 or tensor.shape[0] != rows:
        raise InvalidInput(name, f"shape {list(tensor.shape)} must be [{rows}, words, longest]: one list per prompt")
    return tensor[row:row + 1]

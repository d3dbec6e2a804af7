"""An `llm` request: its input tensors in, what the generation loop needs out, every limit checked.

Parsing happens on Triton's execute thread, before the request reaches the engine, so a bad
request gets its INVALID_ARG naming the input at once and never occupies the generation loop.
"""
from dataclasses import dataclass
from typing import Sequence

from .engines.base import SamplingParams
from .errors import InvalidInput
from .inputs import Inputs, required, scalar
from .stopping import stop_sequences_from_tensor


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: Sequence[int]
    params: SamplingParams
    stop_sequences: Sequence[Sequence[int]] = ()
    stream: bool = False
    # A later step acknowledges each chunk it decodes (the generate ensemble's detokenizer), so a
    # stream whose chunks stop being acknowledged was abandoned (tritonfront.delivery).
    delivery_acknowledged: bool = False

    @classmethod
    def parse(cls, inputs: Inputs, vocab_size: int, context_length: int) -> "GenerationRequest":
        """Raises InvalidInput naming the first input outside its limit."""
        ids = required(inputs, "input_ids")
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise InvalidInput("input_ids", f"shape {list(ids.shape)} must be [1, tokens]: one prompt per request")
        length = int(required(inputs, "input_lengths").reshape(-1)[0])
        if not 1 <= length <= ids.shape[1]:
            raise InvalidInput("input_lengths", f"{length} is outside 1..{ids.shape[1]}")
        prompt = ids[0, :length]
        if prompt.min() < 0 or prompt.max() >= vocab_size:
            raise InvalidInput("input_ids", f"token ids must be in 0..{vocab_size - 1}")
        max_tokens = scalar(inputs, "max_tokens")
        if max_tokens is None:
            raise InvalidInput("max_tokens", "is required")
        params = SamplingParams(
            max_tokens=int(max_tokens),
            temperature=scalar(inputs, "temperature"),
            top_k=int(scalar(inputs, "top_k", 0)),
            top_p=float(scalar(inputs, "top_p", 1.0)),
            random_seed=scalar(inputs, "random_seed"),
            end_id=scalar(inputs, "end_id"),
        ).validate(length, context_length, vocab_size)
        return cls(prompt.tolist(), params, stop_sequences_from_tensor(inputs.get("stop_words_ids"), vocab_size),
                   bool(scalar(inputs, "stream", False)), bool(scalar(inputs, "delivery_acknowledged", False)))

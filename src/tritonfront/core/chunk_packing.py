"""A streamed chunk as the llm hands it to the detokenizer inside the generate ensemble: one INT64
tensor per chunk, `chunk`, instead of a tensor per field.

Each tensor a step response carries costs Triton a shared-memory allocation and copy in the
Python backend, a hash-map entry in the ensemble and a numpy array in each stub, for every chunk
of every stream: with the synthetic engine at 256 streams, a Python model round trip with ten
small tensors cost about twice one with a single tensor (/tmp measurements of an echo model,
2026-11-28). The fields a chunk always has travel together here; what a request asks for beside
text (log probs, top alternatives, perf metrics) still travels as the contract's own tensors.

Layout: HEADER fields, then the context ids, the echoed prompt ids and the new ids. The finish
reason is a code (FINISH_REASONS); the delivery stamp (tritonfront.core.delivery) takes four
fields.
"""
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import InvalidInput

# The reasons a sequence ends, by code; 0: not final. One list, so both ends agree.
FINISH_REASONS = ("", "stop", "length", "cancelled")
# Header fields, in order.
HEADER = ("final", "finish_reason", "prompt_tokens", "completion_tokens", "batch_index", "sequence_index",
          "several_sequences", "check_cancelled", "delivery_key", "delivery_rank", "delivery_slot", "delivery_serial",
          "context_length", "echo_length")
_INDEX = {name: i for i, name in enumerate(HEADER)}
_HEAD = len(HEADER)


@dataclass(frozen=True)
class PackedChunk:
    """One chunk, unpacked. Ids are Python ints: the detokenizer compares and hashes them."""
    final: bool
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    batch_index: int
    sequence_index: int
    several_sequences: bool  # the request has several sequences: its responses carry their indexes
    # The detokenizer asks Triton whether this chunk's request was cancelled (a round trip) and
    # leaves it unacknowledged if so; the llm asks for it on a stream's chunks now and then
    # (GenerationLoop.cancel_check_s), not on each.
    check_cancelled: bool
    delivery: tuple[int, int, int, int]  # (model key, rank, slot, serial); slot -1: not tracked
    context_ids: list[int]
    echo_ids: list[int]  # the prompt, before a whole answer that includes it
    output_ids: list[int]


def pack(final: bool, finish_reason: str, prompt_tokens: int, completion_tokens: int, batch_index: int,
         sequence_index: int, several_sequences: bool, check_cancelled: bool, delivery: Sequence[int],
         context_ids: Sequence[int], echo_ids: Sequence[int], output_ids: Sequence[int]) -> np.ndarray:
    """The `chunk` tensor of one response: [1, HEADER + ids]."""
    header = [int(final), FINISH_REASONS.index(finish_reason), prompt_tokens, completion_tokens, batch_index,
              sequence_index, int(several_sequences), int(check_cancelled), *delivery, len(context_ids),
              len(echo_ids)]
    return np.array([header + list(context_ids) + list(echo_ids) + list(output_ids)], dtype=np.int64)


def unpack(row: np.ndarray) -> PackedChunk:
    """One row of a `chunk` tensor; InvalidInput naming `chunk` when it does not hold one."""
    values = row.tolist()
    if len(values) < _HEAD:
        raise InvalidInput("chunk", f"{len(values)} values: a chunk has at least the {_HEAD} header fields")
    head, ids = values[:_HEAD], values[_HEAD:]
    context, echo = head[_INDEX["context_length"]], head[_INDEX["echo_length"]]
    reason = head[_INDEX["finish_reason"]]
    if context < 0 or echo < 0 or context + echo > len(ids) or not 0 <= reason < len(FINISH_REASONS):
        raise InvalidInput("chunk", f"header {head} does not describe its {len(ids)} ids")
    key, rank, slot, serial = head[_INDEX["delivery_key"]:_INDEX["delivery_serial"] + 1]
    return PackedChunk(bool(head[_INDEX["final"]]), FINISH_REASONS[reason], head[_INDEX["prompt_tokens"]],
                       head[_INDEX["completion_tokens"]], head[_INDEX["batch_index"]], head[_INDEX["sequence_index"]],
                       bool(head[_INDEX["several_sequences"]]), bool(head[_INDEX["check_cancelled"]]),
                       (key, rank, slot, serial), ids[:context], ids[context:context + echo], ids[context + echo:])

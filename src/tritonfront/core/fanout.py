"""One Triton request, many engine sequences, one stream of responses back.

A request may hold several prompts and ask for several sequences of each (TensorRT-LLM's batched
requests and num_return_sequences); tritonfront.core.generation_request turns it into one
SequenceRequest per sequence, and `submit_group` submits each to the generation loop as an
engine request of its own. GroupResponder, the loop's Responder, joins them again: every chunk of
every sequence is a response of the one Triton request, tagged with batch_index and
sequence_index, and only the chunk that ends the last unfinished sequence carries Triton's final
flag (as TensorRT-LLM's tensorrt_llm model answers a batched request). Cancelling the request
cancels all its sequences; if one sequence fails, the request gets that error and the others are
cancelled.

It also adds to each chunk what the request asked for beside text (trtllm_contract): the prompt's
ids for a whole answer that includes its prompt (the detokenizer decodes them with the answer, as
TensorRT-LLM's postprocessing decodes output_ids that start with the prompt), log probs, token
counts and timings; and for tritonfront's extension the top alternatives per token and the flag
that asks the detokenizer for per-token texts.
"""
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .chunk_packing import pack
from .generation_loop import GenerationLoop, LLMChunk, Responder
from .generation_request import SequenceRequest
from .trtllm_contract import PERF_METRIC_OUTPUTS, TOKEN_TEXTS_FLAG, UNMEASURED_PERF_METRICS, spec

_NUMPY = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}


class RequestGroup:
    """The sequences of one Triton request: how many have yet to send their final chunk, and
    whether the request failed (its error was sent: nothing more may be)."""

    def __init__(self, handle: Any, sequences: int, arrival_ns: int):
        self.handle = handle
        self.arrival_ns = arrival_ns  # time.time_ns() when the llm took the request
        self.sequences = sequences
        self.unfinished = sequences
        self.failed = False
        self.lock = threading.Lock()  # sends of one request never interleave with its failure


@dataclass
class SequenceHandle:
    """The generation loop's handle of one sequence."""

    group: RequestGroup
    request: SequenceRequest
    cum_log_prob: float = 0.0  # over the ids sent so far


@dataclass
class Reply:
    """What the inner Responder sends: a chunk's tensors and whether it ends the Triton request."""

    outputs: dict
    final: bool

    def tensors(self) -> dict[str, np.ndarray]:
        return self.outputs


def submit_group(loop: GenerationLoop, handle: Any, sequences: Sequence[SequenceRequest]) -> None:
    """Submits every sequence of a request to the loop. If one cannot be submitted, the request
    fails (the caller sends the error) and the sequences already in the engine are cancelled at the
    loop's next cancellation check, with nothing more sent."""
    group = RequestGroup(handle, len(sequences), time.time_ns())
    try:
        for sequence in sequences:
            loop.submit(SequenceHandle(group, sequence), sequence)
    except Exception:
        with group.lock:
            group.failed = True
        raise


class GroupResponder:
    """tritonfront.core.generation_loop's Responder for SequenceHandles, over a Responder of Triton requests."""

    def __init__(self, responder: Responder):
        self.responder = responder

    def send(self, handle: SequenceHandle, chunk: LLMChunk) -> None:
        group = handle.group
        with group.lock:
            if group.failed:
                return
            if chunk.final:
                group.unfinished -= 1
            self.responder.send(group.handle, Reply(chunk_outputs(handle, chunk), final=group.unfinished == 0))

    def fail(self, handle: SequenceHandle, error: Exception) -> None:
        group = handle.group
        with group.lock:
            if group.failed:
                return
            group.failed = True
            self.responder.fail(group.handle, error)

    def is_cancelled(self, handle: SequenceHandle, ask_client: bool = True) -> bool:
        return handle.group.failed or self.responder.is_cancelled(handle.group.handle, ask_client=ask_client)


def _column(name: str, value) -> np.ndarray:
    return np.array([[value]], dtype=_NUMPY[spec(name).dtype])


def chunk_outputs(handle: SequenceHandle, chunk: LLMChunk) -> dict[str, np.ndarray]:
    """The llm's outputs for one chunk of a sequence: behind the ensemble the chunk packed for the
    detokenizer (core/chunk_packing.py), to a direct client a tensor per field with its batch and
    sequence index and, for a whole answer that includes its prompt, the prompt ids; then the
    outputs its request asked for."""
    request, options = handle.request, handle.request.options
    echo = request.prompt_ids if chunk.final and not request.stream and not options.exclude_input else ()
    if request.delivery_acknowledged:
        outputs = {"chunk": pack(chunk.final, chunk.finish_reason, chunk.prompt_tokens, chunk.completion_tokens,
                                 request.batch_index, request.sequence_index, handle.group.sequences > 1,
                                 chunk.check_cancelled, chunk.delivery, chunk.context_ids, echo, chunk.output_ids)}
    else:
        outputs = chunk.tensors()
        outputs["batch_index"] = _column("batch_index", request.batch_index)
        outputs["sequence_index"] = _column("sequence_index", request.sequence_index)
        if len(echo):
            outputs["echo_ids"] = np.array([echo], dtype=np.int32)
    if options.log_probs:
        handle.cum_log_prob += math.fsum(chunk.log_probs)
        outputs["cum_log_probs"] = _column("cum_log_probs", handle.cum_log_prob)
        outputs["output_log_probs"] = np.array(chunk.log_probs, dtype=np.float32).reshape(1, 1, -1)
    if options.top_logprobs:
        outputs.update(top_log_prob_outputs(chunk.top_log_probs, options.top_logprobs))
    if options.token_texts:
        outputs[TOKEN_TEXTS_FLAG] = np.array([[True]], dtype=bool)
    if options.num_input_tokens:
        outputs["num_input_tokens"] = _column("num_input_tokens", chunk.prompt_tokens)
    if options.num_output_tokens:
        outputs["num_output_tokens"] = _column("num_output_tokens", len(chunk.output_ids))
    if options.perf_metrics:
        measured = {"arrival_time_ns": handle.group.arrival_ns, "first_token_time_ns": chunk.first_token_ns,
                    "last_token_time_ns": chunk.last_token_ns}
        for name in PERF_METRIC_OUTPUTS:
            outputs[name] = _column(name, 0 if name in UNMEASURED_PERF_METRICS else measured[name])
    return outputs


def top_log_prob_outputs(per_token: Sequence[Sequence[tuple[int, float]]], k: int) -> dict[str, np.ndarray]:
    """output_top_ids and output_top_log_probs, [1, 1, tokens, k]; a token with fewer than k
    alternatives from its engine is padded with id -1 and log prob -inf (probability 0)."""
    ids = np.full((1, 1, len(per_token), k), -1, dtype=np.int32)
    log_probs = np.full((1, 1, len(per_token), k), -np.inf, dtype=np.float32)
    for i, top in enumerate(per_token):
        for j, (token, log_prob) in enumerate(top[:k]):
            ids[0, 0, i, j], log_probs[0, 0, i, j] = token, log_prob
    return {"output_top_ids": ids, "output_top_log_probs": log_probs}

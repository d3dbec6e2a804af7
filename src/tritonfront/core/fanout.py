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
that asks the detokenizer for per-token texts. A request of the LLM-API contract
(tritonfront.core.llmapi_request) gets that contract's outputs instead: a stream's chunks carry
every id so far (the detokenizer decodes the text so far, as NVIDIA's model streams it), the
prompt's ids with each when it asked for the prompt, finish_reason and stop_reason only on request,
and can be stopped by a stop request of its id (tritonfront.core.stop_requests).
"""
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from . import llmapi_contract
from .chunk_packing import pack
from .generation_loop import GenerationLoop, LLMChunk, Responder
from .generation_request import ResponseOptions, SequenceRequest
from .stop_requests import StopBoard, id_hash
from .trtllm_contract import PERF_METRIC_OUTPUTS, TOKEN_TEXTS_FLAG, UNMEASURED_PERF_METRICS, spec

_NUMPY = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}


class RequestGroup:
    """The sequences of one Triton request: how many have yet to send their final chunk, and
    whether the request failed (its error was sent: nothing more may be)."""

    def __init__(self, handle: Any, sequences: int, arrival_ns: int, stop_key: Optional[int] = None):
        self.handle = handle
        self.arrival_ns = arrival_ns  # time.time_ns() when the llm took the request
        self.sequences = sequences
        self.unfinished = sequences
        self.failed = False
        self.lock = threading.Lock()  # sends of one request never interleave with its failure
        self.stop_key = stop_key  # an LLM-API request's id, hashed (stop_requests.id_hash): stop requests find it


@dataclass
class SequenceHandle:
    """The generation loop's handle of one sequence."""

    group: RequestGroup
    request: SequenceRequest
    cum_log_prob: float = 0.0  # over the ids sent so far
    sent_ids: list = field(default_factory=list)  # an LLM-API stream's ids so far (its chunks carry all of them)


@dataclass
class Reply:
    """What the inner Responder sends: a chunk's tensors and whether it ends the Triton request."""

    outputs: dict
    final: bool

    def tensors(self) -> dict[str, np.ndarray]:
        return self.outputs


def submit_group(loop: GenerationLoop, handle: Any, sequences: Sequence[SequenceRequest],
                 request_id: str = "") -> None:
    """Submits every sequence of a request to the loop. If one cannot be submitted, the request
    fails (the caller sends the error) and the sequences already in the engine are cancelled at the
    loop's next cancellation check, with nothing more sent. `request_id`: Triton's id of the
    request, by which a stop request of the LLM-API contract finds an LLM-API request."""
    llmapi = any(sequence.options.llmapi for sequence in sequences)
    group = RequestGroup(handle, len(sequences), time.time_ns(),
                         stop_key=id_hash(request_id) if llmapi and request_id else None)
    try:
        for sequence in sequences:
            loop.submit(SequenceHandle(group, sequence), sequence)
    except Exception:
        with group.lock:
            group.failed = True
        raise


class GroupResponder:
    """tritonfront.core.generation_loop's Responder for SequenceHandles, over a Responder of Triton requests."""

    def __init__(self, responder: Responder, stops: Optional[StopBoard] = None):
        self.responder = responder
        self.stops = stops

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
        group = handle.group
        # A stop request is read from the shared table, without a round trip to Triton.
        stopped = group.stop_key is not None and self.stops is not None and self.stops.stopped(group.stop_key,
                                                                                                group.arrival_ns)
        return group.failed or stopped or self.responder.is_cancelled(group.handle, ask_client=ask_client)


def _column(name: str, value) -> np.ndarray:
    return np.array([[value]], dtype=_NUMPY[(spec(name) or llmapi_contract.spec(name)).dtype])


def chunk_outputs(handle: SequenceHandle, chunk: LLMChunk) -> dict[str, np.ndarray]:
    """The llm's outputs for one chunk of a sequence: behind the ensemble the chunk packed for the
    detokenizer (core/chunk_packing.py), to a direct client a tensor per field with its batch and
    sequence index and, for a whole answer that includes its prompt, the prompt ids; then the
    outputs its request asked for."""
    request, options = handle.request, handle.request.options
    llmapi = options.llmapi is not None
    if llmapi and request.stream:
        # The LLM API streams the text so far: every chunk carries all ids sent so far, and no
        # context (the detokenizer decodes the whole text again).
        handle.sent_ids.extend(chunk.output_ids)
        output_ids, context_ids = handle.sent_ids, []
    else:
        output_ids, context_ids = chunk.output_ids, chunk.context_ids
    # The prompt's ids before a whole answer that includes its prompt, as TensorRT-LLM's
    # postprocessing decodes it; for the LLM API before every text so far.
    echo = request.prompt_ids if not options.exclude_input and (chunk.final and not request.stream or llmapi) else ()
    if request.delivery_acknowledged:
        shown = "generate" if not llmapi else "llmapi" if options.llmapi.finish_reason else "omitted"
        outputs = {"chunk": pack(chunk.final, chunk.finish_reason, chunk.prompt_tokens, chunk.completion_tokens,
                                 request.batch_index, request.sequence_index, handle.group.sequences > 1,
                                 chunk.check_cancelled, chunk.delivery, context_ids, echo, output_ids, shown)}
    else:
        outputs = chunk.tensors()
        outputs["output_ids"] = np.array([output_ids], dtype=np.int32).reshape(1, -1)
        outputs["context_ids"] = np.array([context_ids], dtype=np.int32).reshape(1, -1)
        outputs["batch_index"] = _column("batch_index", request.batch_index)
        outputs["sequence_index"] = _column("sequence_index", request.sequence_index)
        if len(echo):
            outputs["echo_ids"] = np.array([echo], dtype=np.int32)
        if llmapi:
            del outputs["finish_reason"]  # llmapi_outputs: on request only
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
    if llmapi:
        outputs.update(llmapi_outputs(chunk, options, packed=request.delivery_acknowledged))
    return outputs


def llmapi_outputs(chunk: LLMChunk, options: ResponseOptions, packed: bool) -> dict[str, np.ndarray]:
    """What a chunk of an LLM-API request carries beside the generate contract's outputs: to a
    direct client finish_reason (when asked) with NVIDIA's "None" until the last chunk (behind the
    ensemble the packed chunk's header tells the detokenizer so); the ids of the stop word that
    ended the sequence (the detokenizer decodes them into stop_reason); with the perf metrics, the
    ones only that contract has (not measured: 0)."""
    outputs = {}
    if options.llmapi.finish_reason and not packed:
        outputs["finish_reason"] = np.array([[(chunk.finish_reason or llmapi_contract.NONE_TEXT).encode()]],
                                            dtype=np.object_)
    if options.llmapi.stop_reason:
        outputs[llmapi_contract.STOP_REASON_IDS] = np.array([chunk.stop_sequence], dtype=np.int32).reshape(1, -1)
    if options.perf_metrics:
        for name in llmapi_contract.UNMEASURED_OUTPUTS:
            outputs[name] = _column(name, 0)
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

"""What every model.py shares with Triton's Python backend, and the only module beside them that
imports triton_python_backend_utils (it exists only inside a Triton Python stub, which adds its
classes, MetricFamily and the like, only after model.py is imported: nothing here may use them at
import time).

Requests come in as mappings of input name to numpy array for the library (tritonfront), whose
results go back as responses; a bad request gets an INVALID_ARG error naming the input, anything
else an INTERNAL error with the exception's type and message (the traceback goes to the server
log, never to the client).
"""
import contextlib
import ctypes
import json
import logging
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Sequence

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonfront.core import model_config
from tritonfront.errors import Cancelled, InvalidInput, Unavailable
from tritonfront.core.rank_load import ModelMetricSpec

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
logger = logging.getLogger("tritonfront.glue")


def load_config(args: dict, kind: str) -> model_config.Config:
    """The model's typed config (tritonfront.core.model_config) from initialize's args; raises
    tritonfront.errors.ConfigError, which fails loading with its message."""
    return model_config.from_model_config(kind, json.loads(args["model_config"]))


# How often a stub's watcher looks whether its tritonserver is still there.
SERVER_WATCH_S = 1

# A shell loop, not a thread of the stub: a stub blocked in a call to tritonserver that never
# returns (a detokenizer asking is_cancelled() when the server was killed) holds the GIL, and a
# Python watcher thread then never runs (a detokenizer stub outlived its server that way). $1: the
# server, $2: the stub; the loop ends with the stub, or kills it once it has a new parent (the
# server is gone: its children were re-parented, even while it is an unreaped zombie). It ignores
# the stop signals: a SIGTERM to serve.sh's process group reaches the watcher too, and a watcher
# that died of it left its stub behind once tritonserver had exited (CI, 2026-11-28).
_WATCH = """
trap '' TERM INT HUP
while [ -e "/proc/$2" ]; do
  read -r _ _ _ parent _ < "/proc/$2/stat" || exit 0
  if [ "$parent" != "$1" ]; then
    echo "tritonserver (pid $1) is gone: stub $2 exits" >&2
    kill -9 "$2"
    exit 0
  fi
  sleep $3
done
"""


def exit_with_server() -> None:
    """Ends this stub within SERVER_WATCH_S of its tritonserver's exit, whatever its threads are
    doing. Triton 2.51's stub notices a dead parent only between messages: an llm stub whose
    engine thread was generating (a request with no max_tokens) went on at half a core for 51
    minutes after tritonserver had gone (2026-11-28), and a tokenizer stub for minutes. A small
    shell process watches (_WATCH says why not a thread); prctl's PDEATHSIG is not used, since it
    fires when the parent *thread* that started the stub ends, and tritonserver starts stubs from
    worker threads."""
    subprocess.Popen(["sh", "-c", _WATCH, "sh", str(os.getppid()), str(os.getpid()), str(SERVER_WATCH_S)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)


def inputs(request) -> dict[str, np.ndarray]:
    """The request's input tensors by name; optional inputs it did not send are absent."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


def parameters(request) -> dict[str, Any]:
    """The request's parameters (KServe v2 request parameters; over HTTP's generate extension, every
    JSON key that is not an input)."""
    return json.loads(request.parameters() or "{}")


def response(outputs: dict[str, np.ndarray]) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items()])


def error_response(error: Exception) -> "pb_utils.InferenceResponse":
    if isinstance(error, InvalidInput):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
    if isinstance(error, Cancelled):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.CANCELLED))
    if isinstance(error, Unavailable):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.UNAVAILABLE))
    logger.error("request failed", exc_info=error)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(error).__name__}: {error}",
                                                                 pb_utils.TritonError.INTERNAL))


def execute_batch(requests: Sequence, parse: Callable, compute: Callable[[list], list],
                  requested_outputs: bool = False, request_parameters: bool = False,
                  cancellation: bool = False) -> list:
    """The dynamic batch of a non-decoupled model: `parse` each request's inputs (then the names of
    the outputs it asked for when `requested_outputs`, then its parameters when
    `request_parameters`, then, when `cancellation`, a callable that asks Triton whether it was
    cancelled; a request that fails gets its own error), run `compute` once over every
    parsed request (it returns, per request, a dict of outputs or the exception that request
    earned), then answer each request."""
    responses: list = [None] * len(requests)
    parsed, positions = [], []
    for i, request in enumerate(requests):
        try:
            arguments = (inputs(request),)
            if requested_outputs:
                arguments += (request.requested_output_names(),)
            if request_parameters:
                arguments += (parameters(request),)
            if cancellation:
                # The check itself, not its answer: asking is a round trip to tritonserver, which a
                # model makes only for the requests that need the answer.
                arguments += (request.is_cancelled,)
            parsed.append(parse(*arguments))
            positions.append(i)
        except Exception as error:
            responses[i] = error_response(error)
    if parsed:
        try:
            results = compute(parsed)
        except Exception as error:  # a bug must fail this batch, not the server
            results = [error] * len(parsed)
        for i, result in zip(positions, results):
            responses[i] = _answer(result)
    return responses


def send_each(requests: Sequence, responses: Sequence) -> None:
    """Sends each request of a non-decoupled model its one response (FINAL) through its response
    sender, for an execute that returns None: the send returns once tritonserver has the response,
    so what the model does next (the detokenizer's acknowledgements) comes after it, where a
    returned response would leave the stub only after execute."""
    for request, answer in zip(requests, responses):
        sender = request.get_response_sender()
        try:
            sender.send(answer, flags=FINAL)
        except Exception as error:  # one request's failed send must not stop the others' answers
            logger.error("sending a response failed", exc_info=error)
            # A request left without a final response would stay in flight in Triton for good.
            with contextlib.suppress(Exception):
                sender.send(error_response(error), flags=FINAL)


def _answer(result: Any) -> "pb_utils.InferenceResponse":
    if isinstance(result, Exception):
        return error_response(result)
    try:
        return response(result)
    except Exception as error:
        return error_response(error)


def submit_each(requests: Sequence, parse: Callable[[Any], Any], submit: Callable[[tuple, Any], None],
                together: Callable[[], ContextManager] = contextlib.nullcontext) -> None:
    """The requests of a decoupled model: each one's handle is (request, its response sender).
    `parse(request)` reads and checks every request first; then, inside one `together()` block,
    `submit(handle, parsed)` takes on each that parsed. A request whose parse or submit raises
    gets the error as its only response, flagged final."""
    parsed = []
    for request in requests:
        sender = request.get_response_sender()
        try:
            parsed.append(((request, sender), parse(request)))
        except Exception as error:  # InvalidInput
            sender.send(error_response(error), flags=FINAL)
    with together():
        for handle, value in parsed:
            try:
                submit(handle, value)
            except Exception as error:  # an engine that stopped taking requests
                handle[1].send(error_response(error), flags=FINAL)


class DecoupledForwarder:
    """A model that is not decoupled answering each request through a decoupled model of the same
    inputs and outputs, by one BLS call per request (the request's id, parameters and wanted
    outputs go along): its one response, or its error, whose Triton code `error_code(message)`
    names. Calls run on a pool of `workers` threads, so execute returns at once and requests are
    answered concurrently, each by its own sender."""

    def __init__(self, model_name: str, output_names: Sequence[str], workers: int, error_code: Callable[[str], str]):
        self.model_name, self.output_names, self.error_code = model_name, list(output_names), error_code
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="forward")

    def execute(self, requests: Sequence, check: Callable[[dict], None]) -> None:
        """`check(inputs)` refuses a request here (an InvalidInput) before it is handed on."""
        for request in requests:
            sender = request.get_response_sender()
            try:
                check(inputs(request))
            except Exception as error:
                sender.send(error_response(error), flags=FINAL)
                continue
            self.pool.submit(self._forward, request, sender)

    def _forward(self, request, sender) -> None:
        try:
            child = pb_utils.InferenceRequest(model_name=self.model_name, inputs=request.inputs(),
                                              requested_output_names=list(request.requested_output_names()) or self.output_names,
                                              request_id=request.request_id(), parameters=parameters(request))
            answer = None
            for response in child.exec(decoupled=True):
                if response.has_error():
                    # Triton 2.51's BLS gives every error of the called model code INTERNAL:
                    # `error_code` restores it from the message.
                    message = response.error().message()
                    code = getattr(pb_utils.TritonError, self.error_code(message))
                    answer = pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
                elif response.output_tensors():
                    answer = pb_utils.InferenceResponse(output_tensors=response.output_tensors())
            if answer is None:
                raise RuntimeError(f"{self.model_name} answered without a response")
        except Exception as error:
            answer = error_response(error)
        sender.send(answer, flags=FINAL)

    def close(self) -> None:
        self.pool.shutdown(wait=True)  # every request handed on gets its answer (or its error)


class StreamResponder:
    """tritonfront.core.generation_loop's Responder over a decoupled model's handles (request, sender):
    a chunk is a response, final when the chunk is."""

    @staticmethod
    def send(handle: tuple, chunk) -> None:
        handle[1].send(response(chunk.tensors()), flags=FINAL if chunk.final else 0)

    @staticmethod
    def fail(handle: tuple, error: Exception) -> None:
        handle[1].send(error_response(error), flags=FINAL)

    @staticmethod
    def is_cancelled(handle: tuple, ask_client: bool = True) -> bool:
        return ask_client and handle[0].is_cancelled()


def outlive_the_stub(model) -> None:
    """Called last in a model's finalize: keeps the model object, and so its metric families,
    from ever being destroyed. A MetricFamily destroyed at interpreter exit, after the stub's IPC
    is gone, segfaults the stub (python_backend#429, fixed after Triton 2.51; the hf llm stub at
    most stops). Destroying the families in finalize instead is worse: when the watchdog reloads
    a model, the old version's finalize deleted the family the new version shares by name, and
    tritonserver crashed (test_recovery.py, 2 runs of 2: a segfault, a heap corruption). Never
    destroyed, their deletion is never sent, as it never reached tritonserver before.
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(model))


class Metrics:
    """Makes Prometheus metrics on Triton's metrics port, all with the same labels (and any a
    metric adds); holds their families, which must outlive the metrics. Metrics of one spec share
    its family (one family per name and process)."""

    def __init__(self, labels: dict[str, str]):
        self.labels = labels
        self.families: dict[str, Any] = {}

    def __call__(self, spec: ModelMetricSpec, buckets: Sequence[float] = (), labels: Optional[dict] = None) -> Any:
        family = self.families.get(spec.name)
        if family is None:
            kind = getattr(pb_utils.MetricFamily, spec.kind.upper())  # GAUGE, COUNTER, HISTOGRAM
            family = self.families[spec.name] = pb_utils.MetricFamily(name=spec.name, description=spec.description,
                                                                      kind=kind)
        labels = {**self.labels, **(labels or {})}
        if spec.kind == "histogram":
            return family.Metric(labels=labels, buckets=list(buckets))
        return family.Metric(labels=labels)

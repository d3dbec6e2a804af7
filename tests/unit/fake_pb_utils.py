"""A stand-in for triton_python_backend_utils, the module Triton's Python stub provides, with the
parts of its API the adapters use. Tests load this file as that module (tests/unit/test_adapters.py).

Beside the real names it has what a test needs to play Triton's side: FakeRequest (the requests
execute gets), ResponseSender (records what is sent) and a record of the metrics made.
"""
import json
import threading
import weakref

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
# What the real module gets from the stub's C++ side only after model.py was imported (the module
# file itself defines constants and helpers): used at import time, they fail in a real server.
STUB_PROVIDED = ("Tensor", "TritonError", "InferenceResponse", "MetricFamily")


class Tensor:
    def __init__(self, name: str, array: np.ndarray):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"tensor {name}: a numpy array is required, got {type(array).__name__}")
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = UNKNOWN):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self._tensors, self._error = list(output_tensors), error

    def output_tensors(self) -> list:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error

    def outputs(self) -> dict:
        """Test side: the output arrays by name."""
        return {tensor.name(): tensor.as_numpy() for tensor in self._tensors}


class ResponseSender:
    """Test side: what a decoupled model sent, as (response, flags), in order."""

    def __init__(self):
        self.sent: list[tuple] = []
        self.finished = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        if self.finished.is_set():
            raise RuntimeError("a response was sent after the final flag")
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.finished.set()


class FakeRequest:
    """Test side: a request as execute gets it."""

    def __init__(self, inputs: dict, requested_outputs=(), parameters: dict | None = None, request_id: str = ""):
        self._inputs = [Tensor(name, value) for name, value in inputs.items()]
        self._requested = list(requested_outputs)
        self._parameters = dict(parameters or {})
        self._request_id = request_id
        self.sender = ResponseSender()
        self.cancelled = False

    def request_id(self) -> str:
        """The client's request id; "" when it sent none, as the stub's."""
        return self._request_id

    def inputs(self) -> list:
        return self._inputs

    def requested_output_names(self) -> list:
        return self._requested

    def parameters(self) -> str:
        """JSON, as the stub's (an empty object when the request has none)."""
        return json.dumps(self._parameters)

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.cancelled


class Metric:
    """Like the stub's, it fails once its family is gone: the stub deletes a MetricFamily when
    nothing references it, and every later use of its metrics fails the request."""

    def __init__(self, family: "MetricFamily", labels: dict, buckets=None):
        self._family, self.labels, self.buckets = weakref.ref(family), labels, buckets
        self.name = family.name
        self.value, self.observations = 0, []

    def _alive(self) -> None:
        if self._family() is None:
            raise RuntimeError(f"Failed to observe metric value: the MetricFamily {self.name} has been deleted")

    def set(self, value) -> None:
        self._alive()
        self.value = value

    def increment(self, value) -> None:
        self._alive()
        self.value += value

    def observe(self, value) -> None:
        self._alive()
        self.observations.append(value)


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = range(3)
    made: dict = {}  # test side: name -> every Metric of that family made so far

    def __init__(self, name: str, description: str, kind: int):
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels=None, buckets=None) -> Metric:
        if (buckets is not None) != (self.kind == self.HISTOGRAM):
            raise ValueError(f"{self.name}: buckets are for histograms, and histograms need them")
        metric = Metric(self, labels or {}, buckets)
        MetricFamily.made.setdefault(self.name, []).append(metric)
        return metric

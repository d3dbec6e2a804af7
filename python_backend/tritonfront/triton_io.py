"""Tensor plumbing shared by the model.py files (only importable inside a Triton Python stub)."""
import json
from typing import Any, Callable, Optional, Sequence

import numpy as np
import triton_python_backend_utils as pb_utils

from .errors import InvalidInput
from .tokenization import decode_texts


def parameters(args: dict) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def array(request, name: str) -> Optional[np.ndarray]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def required(request, name: str) -> np.ndarray:
    value = array(request, name)
    if value is None:
        raise InvalidInput(name, "is required")
    return value


def strings(request, name: str) -> list[str]:
    return decode_texts(required(request, name).reshape(-1), name)


def scalar(request, name: str, default: Any = None) -> Any:
    """The single value of an optional input; one value per request."""
    value = array(request, name)
    if value is None:
        return default
    values = value.reshape(-1)
    if values.size == 0:
        return default
    if np.any(values != values[0]):
        raise InvalidInput(name, f"must have one value per request, got {values.size} different values")
    item = values[0]
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else item.item()


def response(outputs: dict[str, np.ndarray]) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])


def error_response(error: Exception) -> "pb_utils.InferenceResponse":
    if isinstance(error, InvalidInput):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(error).__name__}: {error}"))


def batch_execute(requests: Sequence, parse: Callable, compute: Callable, build: Callable) -> list:
    """The dynamic-batch pattern of every non-decoupled model here: parse each request (a bad one
    gets its own error), run `compute` once over all parsed requests (it returns one result or
    InvalidInput per request), then build each response."""
    responses: list = [None] * len(requests)
    parsed, positions = [], []
    for i, request in enumerate(requests):
        try:
            parsed.append(parse(request))
            positions.append(i)
        except InvalidInput as error:
            responses[i] = error_response(error)
    if parsed:
        try:
            results = compute(parsed)
        except Exception as error:  # a bug must fail this batch, not the server
            results = [error] * len(parsed)
        for i, result in zip(positions, results):
            responses[i] = error_response(result) if isinstance(result, Exception) else build(requests[i], result)
    return responses

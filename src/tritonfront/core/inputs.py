"""A request's input tensors as numpy arrays, by name: what every model reads them with.

The Triton glue hands each request over as a mapping of input name to array (absent optional
inputs are simply missing), so everything here runs and is tested without a server.
"""
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..errors import InvalidInput

Inputs = Mapping[str, np.ndarray]


def required(inputs: Inputs, name: str) -> np.ndarray:
    value = inputs.get(name)
    if value is None:
        raise InvalidInput(name, "is required")
    return value


def scalar(inputs: Inputs, name: str, default: Any = None) -> Any:
    """The single value of an optional input, as a Python value; one value per request (a
    request with several batch rows must give each row the same value)."""
    value = inputs.get(name)
    if value is None:
        return default
    values = value.reshape(-1)
    if values.size == 0:
        return default
    if not _all_equal(values):
        raise InvalidInput(name, f"must have one value per request, got {values.size} different values")
    item = values[0]
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else item.item()


def _all_equal(values: np.ndarray) -> bool:
    if values.dtype.kind == "f":  # NaN is its own value here: the limit check names it
        return bool(np.array_equal(values, np.full_like(values, values[0]), equal_nan=True))
    return bool(np.all(values == values[0]))


def row_scalar(inputs: Inputs, name: str, row: int, rows: int, default: Any = None) -> Any:
    """The value of an optional input for one prompt of a request with `rows` prompts: its row of
    the tensor, as TensorRT-LLM reads per-prompt inputs (a request of one prompt takes the single
    value `scalar` gives)."""
    value = inputs.get(name)
    if value is None or rows == 1:
        return scalar(inputs, name, default)
    if value.shape[0] != rows:
        raise InvalidInput(name, f"has {value.shape[0]} rows for {rows} prompts: one value per prompt")
    return scalar({name: value[row]}, name, default)


def decode_texts(items: Sequence, field: str) -> list[str]:
    """BYTES tensor items as text; bad UTF-8 is the client's error, named by item and byte."""
    texts = []
    for i, raw in enumerate(items):
        try:
            texts.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
        except UnicodeDecodeError as error:
            raise InvalidInput(f"{field}[{i}]", f"is not valid UTF-8 (byte {error.start}: {error.reason})") from None
    return texts


def strings(inputs: Inputs, name: str) -> list[str]:
    return decode_texts(required(inputs, name).reshape(-1), name)


def optional_strings(inputs: Inputs, name: str) -> Optional[list[str]]:
    return None if inputs.get(name) is None else strings(inputs, name)

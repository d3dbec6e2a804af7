"""Reading a request's inputs from name -> numpy array mappings, as every model does."""
import numpy as np
import pytest

from tritonfront.errors import InvalidInput
from tritonfront.core.inputs import optional_strings, required, scalar, strings


def test_required_names_the_missing_input():
    assert required({"a": np.zeros(1)}, "a").shape == (1,)
    with pytest.raises(InvalidInput, match="^b: is required$"):
        required({"a": np.zeros(1)}, "b")


@pytest.mark.parametrize("value, expected", [
    (None, "default"),
    (np.zeros((0, 1), dtype=np.int32), "default"),  # an empty tensor is no value
    (np.array([[3]], dtype=np.int32), 3),
    (np.array([[2], [2]], dtype=np.uint64), 2),  # client-batched rows with one value
    (np.array([[True]]), True),
    (np.array([[b"yes"]], dtype=np.object_), "yes"),
    (np.array([[0.5]], dtype=np.float32), 0.5),
])
def test_scalar_is_one_python_value_per_request(value, expected):
    inputs = {} if value is None else {"x": value}
    result = scalar(inputs, "x", "default")
    assert result == expected and type(result) is type(expected)


def test_scalar_refuses_rows_that_disagree():
    with pytest.raises(InvalidInput, match="^top_k: must have one value per request, got 2 different values$"):
        scalar({"top_k": np.array([[1], [2]], dtype=np.int32)}, "top_k")


def test_strings_decode_every_row_and_name_bad_utf8():
    assert strings({"t": np.array([[b"a"], ["b\u00e9".encode()]], dtype=np.object_)}, "t") == ["a", "b\u00e9"]
    with pytest.raises(InvalidInput, match=r"^t\[1\]: is not valid UTF-8 \(byte 0: invalid continuation byte\)$"):
        strings({"t": np.array([[b"a"], [b"\xc3("]], dtype=np.object_)}, "t")
    assert optional_strings({}, "t") is None
    assert optional_strings({"t": np.array([[b""]], dtype=np.object_)}, "t") == [""]

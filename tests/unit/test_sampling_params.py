"""SamplingParams: every limit named in the error, and the greedy/sampling rule."""
import math

import pytest

from tritonfront.engines import SamplingParams
from tritonfront.engines.base import UINT64_MAX
from tritonfront.errors import InvalidInput

CONTEXT, VOCAB = 8192, 49152


def check(prompt_tokens=10, **fields):
    return SamplingParams(**{"max_tokens": 16, **fields}).validate(prompt_tokens, CONTEXT, VOCAB)


@pytest.mark.parametrize("fields, prompt_tokens, field, limit", [
    ({"max_tokens": 0}, 10, "max_tokens", "1..8182"),
    ({"max_tokens": -3}, 10, "max_tokens", "1..8182"),
    ({"max_tokens": 8183}, 10, "max_tokens", "1..8182"),
    ({"max_tokens": 2}, 8191, "max_tokens", "1..1"),
    ({}, 8192, "input_ids", "at most 8191"),
    ({}, 9000, "input_ids", "at most 8191"),
    ({"temperature": -0.1}, 10, "temperature", ">= 0"),
    ({"temperature": math.nan}, 10, "temperature", ">= 0"),
    ({"temperature": math.inf}, 10, "temperature", ">= 0"),
    ({"top_k": -1}, 10, "top_k", ">= 0"),
    ({"top_p": 0.0}, 10, "top_p", "(0, 1]"),
    ({"top_p": 1.5}, 10, "top_p", "(0, 1]"),
    ({"top_p": -0.5}, 10, "top_p", "(0, 1]"),
    ({"random_seed": -1}, 10, "random_seed", f"0..{UINT64_MAX}"),
    ({"random_seed": UINT64_MAX + 1}, 10, "random_seed", f"0..{UINT64_MAX}"),
    ({"end_id": VOCAB}, 10, "end_id", f"0..{VOCAB - 1}"),
    ({"end_id": -2}, 10, "end_id", f"0..{VOCAB - 1}"),
])
def test_out_of_range_fields_are_named_with_their_limit(fields, prompt_tokens, field, limit):
    with pytest.raises(InvalidInput) as error:
        check(prompt_tokens, **fields)
    assert error.value.field == field
    assert limit in str(error.value)


def test_limits_themselves_are_accepted():
    check(max_tokens=1)
    check(max_tokens=CONTEXT - 10)
    check(prompt_tokens=CONTEXT - 1, max_tokens=1)
    check(temperature=0.0, top_k=0, top_p=1.0, random_seed=0, end_id=0)
    check(temperature=5.0, top_k=VOCAB * 2, top_p=1e-6, random_seed=UINT64_MAX, end_id=VOCAB - 1)


@pytest.mark.parametrize("fields, greedy", [
    ({}, True),  # TensorRT-LLM: nothing asked for sampling
    ({"temperature": 0.0}, True),
    ({"temperature": 0.0, "top_k": 40, "top_p": 0.9}, True),
    ({"temperature": 0.7}, False),
    ({"temperature": 0.7, "top_k": 1}, True),  # only one candidate
    ({"top_k": 1}, True),
    ({"top_k": 40}, False),  # temperature defaults to 1.0 then
    ({"top_p": 0.9}, False),
    ({"random_seed": 3}, True),  # a seed alone does not ask for sampling
])
def test_greedy_unless_sampling_is_asked_for(fields, greedy):
    params = SamplingParams(max_tokens=4, **fields)
    assert params.greedy is greedy
    if not greedy:
        assert params.effective_temperature == fields.get("temperature", 1.0)

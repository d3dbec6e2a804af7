"""An llm request's tensors to what the generation loop takes, with every limit named."""
import numpy as np
import pytest

from tritonfront.engines import SamplingParams
from tritonfront.errors import InvalidInput
from tritonfront.core.generation_request import SequenceRequest

VOCAB, CONTEXT = 1000, 64


def inputs(**changes) -> dict:
    tensors = {"input_ids": np.array([[5, 6, 7, 0]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
               "max_tokens": np.array([[8]], dtype=np.int32)}
    tensors.update(changes)
    return {name: value for name, value in tensors.items() if value is not None}


def parse(default_max_tokens: int = 0, **changes) -> SequenceRequest:
    return SequenceRequest.parse(inputs(**changes), VOCAB, CONTEXT, default_max_tokens=default_max_tokens)


def test_a_minimal_request_is_greedy_and_whole():
    assert parse() == SequenceRequest([5, 6, 7], SamplingParams(max_tokens=8), [], False, False)


def test_every_input_reaches_the_request():
    request = parse(stream=np.array([[True]]), temperature=np.array([[0.7]], dtype=np.float32),
                    top_k=np.array([[40]], dtype=np.int32), top_p=np.array([[0.9]], dtype=np.float32),
                    random_seed=np.array([[2**63]], dtype=np.uint64), end_id=np.array([[9]], dtype=np.int32),
                    stop_words_ids=np.array([[[11, 12], [13, -1]]], dtype=np.int32),
                    delivery_acknowledged=np.array([[True]]))
    assert request.prompt_ids == [5, 6, 7] and request.stream and request.delivery_acknowledged
    assert request.stop_sequences == [[11, 12], [13]]
    params = request.params
    assert (params.top_k, params.random_seed, params.end_id) == (40, 2**63, 9)
    assert params.temperature == pytest.approx(0.7) and params.top_p == pytest.approx(0.9) and not params.greedy


def test_top_logprobs_turn_the_log_probs_on_and_token_texts_are_asked_for_apart():
    request = parse(top_logprobs=np.array([[4]], dtype=np.int32), return_token_texts=np.array([[True]]))
    assert request.params.top_logprobs == 4 and request.params.wants_log_probs
    assert request.options.log_probs and request.options.top_logprobs == 4 and request.options.token_texts
    plain = parse(return_log_probs=np.array([[True]]))
    assert plain.options.log_probs and plain.options.top_logprobs == 0 and not plain.options.token_texts
    assert not parse().options.log_probs


@pytest.mark.parametrize("changes, message", [
    ({"input_ids": None}, "input_ids: is required"),
    ({"input_ids": np.array([[1], [2]], dtype=np.int32)}, "input_ids: shape [2, 1] must be [1, tokens]: one prompt per request"),
    ({"input_lengths": None}, "input_lengths: is required"),
    ({"input_lengths": np.array([[5]], dtype=np.int32)}, "input_lengths: 5 is outside 1..4"),
    ({"input_lengths": np.array([[0]], dtype=np.int32)}, "input_lengths: 0 is outside 1..4"),
    ({"input_ids": np.array([[5, 1000]], dtype=np.int32), "input_lengths": np.array([[2]], dtype=np.int32)},
     "input_ids: token ids must be in 0..999"),
    ({"max_tokens": np.array([[62]], dtype=np.int32)}, "max_tokens: 62 is outside 1..61"),
    ({"top_p": np.array([[0.0]], dtype=np.float32)}, "top_p: 0.0 must be in (0, 1]"),
    ({"top_k": np.array([[3], [4]], dtype=np.int32)}, "top_k: must have one value per request"),
    ({"stop_words_ids": np.array([[[1000]]], dtype=np.int32)}, "stop_words_ids[0]: token ids must be in 0..999"),
    ({"top_logprobs": np.array([[21]], dtype=np.int32)}, "top_logprobs: 21 is outside 0..20"),
])
def test_bad_inputs_are_named_with_their_limit(changes, message):
    with pytest.raises(InvalidInput) as error:
        parse(**changes)
    assert str(error.value).startswith(message)


def test_without_max_tokens_a_request_may_use_what_the_context_leaves():
    """OpenAI's default (the llm's default_max_tokens 0): the 3-token prompt leaves 61 of 64."""
    assert parse(max_tokens=None).params.max_tokens == CONTEXT - 3


def test_the_default_max_tokens_parameter_lowers_only_the_default():
    assert parse(default_max_tokens=10, max_tokens=None).params.max_tokens == 10
    assert parse(default_max_tokens=10, max_tokens=np.array([[20]], dtype=np.int32)).params.max_tokens == 20
    assert parse(default_max_tokens=500, max_tokens=None).params.max_tokens == CONTEXT - 3  # never past the context


@pytest.mark.parametrize("default_max_tokens", [0, 10])
def test_without_max_tokens_a_prompt_that_fills_the_context_is_refused_by_name(default_max_tokens):
    full = np.arange(1, CONTEXT + 1, dtype=np.int32).reshape(1, -1)
    with pytest.raises(InvalidInput) as error:
        parse(default_max_tokens, max_tokens=None, input_ids=full, input_lengths=np.array([[CONTEXT]], dtype=np.int32))
    assert str(error.value).startswith(f"input_ids: {CONTEXT} prompt tokens leave no room for generation")

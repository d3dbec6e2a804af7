"""TensorRT-LLM's ensemble inputs as the llm parses them: a request's prompts and
num_return_sequences fanned out into one SequenceRequest per sequence, TensorRT-LLM's defaults,
and a named error for every bad value and every input no engine here honours."""
import numpy as np
import pytest

from tritonfront.errors import InvalidInput
from tritonfront.core.generation_request import SequenceRequest, ResponseOptions, parse_batch, sequence_seed
from tritonfront.core.trtllm_contract import MAX_RETURN_SEQUENCES, MAX_SEQUENCES_PER_REQUEST, UNSUPPORTED

VOCAB, CONTEXT = 1000, 64


def column(value, rows: int = 1, dtype=None) -> np.ndarray:
    """A [rows, 1] tensor, as TensorRT-LLM's clients send scalars."""
    if isinstance(value, str):
        return np.array([[value.encode()]] * rows, dtype=np.object_)
    return np.array([[value]] * rows, dtype=dtype)


PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def inputs(rows: int = 1, **changes) -> dict:
    """`rows` prompts (PROMPTS over and over), right-padded with 0 as the llm_tokenizer sends them."""
    prompts = [PROMPTS[row % len(PROMPTS)] for row in range(rows)]
    ids = np.array([prompt + [0] * (4 - len(prompt)) for prompt in prompts], dtype=np.int32)
    tensors = {"input_ids": ids, "input_lengths": np.array([[len(p)] for p in prompts], dtype=np.int32),
               "max_tokens": column(8, rows, np.int32)}
    tensors.update(changes)
    return {name: value for name, value in tensors.items() if value is not None}


def parse(rows: int = 1, exclude_default: bool = False, **changes) -> list[SequenceRequest]:
    return parse_batch(inputs(rows, **changes), VOCAB, CONTEXT, exclude_default)


def error(**changes) -> str:
    with pytest.raises(InvalidInput) as raised:
        parse(**changes)
    return str(raised.value)


def test_one_prompt_one_sequence_is_the_single_request():
    request, = parse()
    assert request == SequenceRequest.parse(inputs(), VOCAB, CONTEXT)
    assert (request.batch_index, request.sequence_index, request.options) == (0, 0, ResponseOptions())


def test_prompts_and_sequences_fan_out_in_order_with_their_own_values():
    requests = parse(rows=3, num_return_sequences=np.array([[2], [1], [3]], dtype=np.int32),
                     max_tokens=np.array([[4], [5], [6]], dtype=np.int32),
                     stop_words_ids=np.array([[[1, -1]], [[2, 3]], [[-1, -1]]], dtype=np.int32))
    assert [(r.batch_index, r.sequence_index) for r in requests] == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert [r.prompt_ids for r in requests[::2]] == [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    assert [r.params.max_tokens for r in requests] == [4, 4, 5, 6, 6, 6]
    assert [r.stop_sequences for r in (requests[0], requests[2], requests[3])] == [[[1]], [[2, 3]], []]


def test_sampled_sequences_get_their_own_seeds_the_first_keeps_the_request_seed():
    requests = parse(num_return_sequences=column(3, dtype=np.int32), top_k=column(40, dtype=np.int32),
                     seed=column(2**63 + 5, dtype=np.uint64))
    seeds = [r.params.random_seed for r in requests]
    assert seeds[0] == 2**63 + 5 and len(set(seeds)) == 3
    assert seeds == [sequence_seed(2**63 + 5, i) for i in range(3)]  # reproducible from the seed alone
    assert all(0 <= s < 2**64 for s in seeds)


def test_greedy_sequences_are_the_same_request():
    first, second = parse(num_return_sequences=column(2, dtype=np.int32))
    assert first.params == second.params and first.params.greedy


@pytest.mark.parametrize("changes, greedy, temperature", [
    ({}, True, None),
    ({"temperature": column(0.7, dtype=np.float32)}, True, 0.0),  # temperature alone does not sample
    ({"top_k": column(1, dtype=np.int32), "temperature": column(0.7, dtype=np.float32)}, True, 0.0),
    ({"top_k": column(40, dtype=np.int32)}, False, 1.0),
    ({"top_p": column(1.0, dtype=np.float32)}, False, 1.0),  # any given top_p samples
    ({"top_p": column(0.5, dtype=np.float32), "temperature": column(0.7, dtype=np.float32)}, False, 0.7),
    ({"top_k": column(40, dtype=np.int32), "temperature": column(0.0, dtype=np.float32)}, True, 0.0),
])
def test_tensorrt_llm_sampling_defaults(changes, greedy, temperature):
    request, = parse(**changes)
    assert request.params.greedy == greedy
    assert request.params.temperature == pytest.approx(temperature)


def test_older_names_are_the_same_inputs():
    by_old, = parse(random_seed=column(7, dtype=np.uint64), min_length=column(3, dtype=np.int32), top_k=column(5, dtype=np.int32))
    by_new, = parse(seed=column(7, dtype=np.uint64), min_tokens=column(3, dtype=np.int32), top_k=column(5, dtype=np.int32))
    both, = parse(seed=column(7, dtype=np.uint64), random_seed=column(7, dtype=np.uint64),
                  min_tokens=column(3, dtype=np.int32), top_k=column(5, dtype=np.int32))
    assert by_old == by_new == both
    assert by_new.params.random_seed == 7 and by_new.params.min_tokens == 3


def test_every_engine_input_reaches_the_sampling_params():
    request, = parse(repetition_penalty=column(1.3, dtype=np.float32), presence_penalty=column(-0.5, dtype=np.float32),
                     frequency_penalty=column(0.25, dtype=np.float32), min_tokens=column(2, dtype=np.int32),
                     return_log_probs=column(True), bad_words_ids=np.array([[[11, 12], [13, -1]]], dtype=np.int32),
                     end_id=column(9, dtype=np.int32), pad_id=column(0, dtype=np.int32),
                     length_penalty=column(1.0, dtype=np.float32), beam_width=column(1, dtype=np.int32))
    params = request.params
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) == pytest.approx((1.3, -0.5, 0.25))
    assert (params.min_tokens, params.return_log_probs, params.end_id) == (2, True, 9)
    assert params.bad_words == ((11, 12), (13,))


@pytest.mark.parametrize("guide_type, guide", [("json", None), ("json", "{}"), ("json_schema", '{"type": "object"}'),
                                               ("regex", "[0-9]+"), ("ebnf_grammar", 'root ::= "yes" | "no"')])
def test_guided_decoding_reaches_the_sampling_params(guide_type, guide):
    changes = {"guided_decoding_guide_type": column(guide_type)}
    if guide is not None:
        changes["guided_decoding_guide"] = column(guide)
    request, = parse(**changes)
    assert (request.params.guided_decoding.guide_type, request.params.guided_decoding.guide) == (guide_type, guide)


def test_response_options_and_the_deployment_default_for_exclude():
    default_in, = parse()
    default_out, = parse(exclude_default=True)
    asked, = parse(exclude_default=True, exclude_input_in_output=column(False), return_log_probs=column(True),
                   return_perf_metrics=column(True), return_num_input_tokens=column(True),
                   return_num_output_tokens=column(True))
    assert (default_in.options.exclude_input, default_out.options.exclude_input) == (False, True)
    assert asked.options == ResponseOptions(exclude_input=False, log_probs=True, perf_metrics=True,
                                           num_input_tokens=True, num_output_tokens=True)


def test_a_min_tokens_error_says_where_an_unsent_max_tokens_came_from():
    with pytest.raises(InvalidInput, match=r"min_tokens: 90 is outside 0\.\.max_tokens \(61\); no max_tokens was sent"):
        parse_batch(inputs(1, max_tokens=None, min_tokens=column(90, dtype=np.int32)), VOCAB, CONTEXT,
                    default_max_tokens=61)


@pytest.mark.parametrize("changes, message", [
    ({"num_return_sequences": column(0, dtype=np.int32)}, f"num_return_sequences: 0 is outside 1..{MAX_RETURN_SEQUENCES}"),
    ({"num_return_sequences": column(MAX_RETURN_SEQUENCES + 1, dtype=np.int32)}, "num_return_sequences: 17 is outside"),
    ({"rows": 5, "num_return_sequences": column(MAX_RETURN_SEQUENCES, 5, np.int32)},
     f"num_return_sequences: 80 sequences (5 prompts) is over the limit of {MAX_SEQUENCES_PER_REQUEST}"),
    ({"repetition_penalty": column(0.0, dtype=np.float32)}, "repetition_penalty: 0.0 must be a finite number > 0"),
    ({"bad_words_ids": np.array([[[-1, 5]]], dtype=np.int32)}, "bad_words_ids[0]: token ids must be in 0..999"),
    ({"repetition_penalty": column(-1.0, dtype=np.float32)}, "repetition_penalty: -1.0 must be a finite number > 0"),
    ({"presence_penalty": column(np.inf, dtype=np.float32)}, "presence_penalty: inf must be a finite number"),
    ({"frequency_penalty": column(np.nan, dtype=np.float32)}, "frequency_penalty: nan must be a finite number"),
    ({"length_penalty": column(np.nan, dtype=np.float32)}, "length_penalty: nan must be a finite number"),
    ({"min_tokens": column(-1, dtype=np.int32)}, "min_tokens: -1 is outside 0..max_tokens (8)"),
    ({"min_tokens": column(9, dtype=np.int32)}, "min_tokens: 9 is outside 0..max_tokens (8)"),
    ({"seed": column(1, dtype=np.uint64), "random_seed": column(2, dtype=np.uint64)},
     "seed: random_seed and seed are the same input and differ"),
    ({"min_tokens": column(1, dtype=np.int32), "min_length": column(2, dtype=np.int32)},
     "min_tokens: min_length and min_tokens are the same input and differ"),
    ({"pad_id": column(1000, dtype=np.int32)}, "pad_id: 1000 is outside the vocabulary 0..999"),
    ({"end_id": column(-3, dtype=np.int32)}, "end_id: -3 is outside the vocabulary"),
    ({"beam_width": column(2, dtype=np.int32)}, "beam_width: 2: beam search is not implemented"),
    ({"beam_width": column(-1, dtype=np.int32)}, "beam_width: -1: beam search is not implemented"),
    ({"return_context_logits": column(True)}, "return_context_logits: true: returning logits is not supported"),
    ({"return_generation_logits": column(True)}, "return_generation_logits: true: returning logits"),
    ({"guided_decoding_guide_type": column("yaml")}, "guided_decoding_guide_type: 'yaml' must be one of"),
    ({"guided_decoding_guide": column("[0-9]")}, "guided_decoding_guide_type: is required with guided_decoding_guide"),
    ({"guided_decoding_guide_type": column("regex")}, "guided_decoding_guide: is required for guide type 'regex'"),
    ({"rows": 2, "stop_words_ids": np.array([[[1]]], dtype=np.int32)},
     "stop_words_ids: shape [1, 1, 1] must be [2, words, longest]: one list per prompt"),
    ({"bad_words_ids": np.array([[[VOCAB]]], dtype=np.int32)}, "bad_words_ids[0]: token ids must be in 0..999"),
    ({"rows": 2, "input_lengths": np.array([[3]], dtype=np.int32)}, "input_lengths: has 1 values for 2 prompts"),
])
def test_bad_values_are_named_with_their_limit(changes, message):
    assert error(**changes).startswith(message)


@pytest.mark.parametrize("name", sorted(set(UNSUPPORTED) - {"beam_width", "return_context_logits",
                                                            "return_generation_logits"}))
def test_inputs_no_engine_honours_are_refused_by_name_with_the_reason(name):
    value = {"decoder_text_input": column("Bonjour"), "embedding_bias_words": column("bad"),
             "prompt_embedding_table": np.zeros((1, 2, 4), dtype=np.float16),
             "lora_weights": np.zeros((1, 2, 4), dtype=np.float16), "lora_config": np.zeros((1, 2, 3), dtype=np.int32),
             "embedding_bias_weights": column(1.0, dtype=np.float32)}.get(name, column(1, dtype=np.int32))
    assert error(**{name: value}) == f"{name}: {UNSUPPORTED[name]}"


@pytest.mark.parametrize("changes", [{"beam_width": column(1, dtype=np.int32)}, {"beam_width": column(0, dtype=np.int32)},
                                     {"return_context_logits": column(False)}, {"return_generation_logits": column(False)},
                                     {"decoder_text_input": column("")},
                                     {"embedding_bias_words": np.zeros((1, 0), dtype=np.object_)}])
def test_values_that_ask_for_nothing_are_accepted(changes):
    request, = parse(**changes)
    assert request.params.greedy


def test_without_max_tokens_each_prompt_may_use_what_the_context_leaves_after_it():
    """Prompts of 3, 2 and 4 tokens in one request, max_tokens not sent (it is optional in the
    contract): each gets its own rest of the context, or the llm's lower default_max_tokens."""
    uncapped = parse_batch(inputs(3, max_tokens=None), VOCAB, CONTEXT)
    assert [r.params.max_tokens for r in uncapped] == [CONTEXT - 3, CONTEXT - 2, CONTEXT - 4]
    capped = parse_batch(inputs(3, max_tokens=None), VOCAB, CONTEXT, default_max_tokens=61)
    assert [r.params.max_tokens for r in capped] == [61, 61, CONTEXT - 4]

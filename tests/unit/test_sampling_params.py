"""SamplingParams: every limit named in the error (by TensorRT-LLM's input names), and TensorRT-LLM's
greedy/sampling rule."""
import math

import pytest

from tritonfront.engines import Engine, SamplingParams
from tritonfront.engines.base import MAX_BAD_WORDS, MAX_TOP_LOGPROBS, UINT64_MAX, GuidedDecoding
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
    ({"min_tokens": -1}, 10, "min_length", ">= 0"),
    ({"repetition_penalty": 0.0}, 10, "repetition_penalty", "> 0"),
    ({"repetition_penalty": -1.2}, 10, "repetition_penalty", "> 0"),
    ({"repetition_penalty": math.inf}, 10, "repetition_penalty", "> 0"),
    ({"repetition_penalty": math.nan}, 10, "repetition_penalty", "> 0"),
    ({"presence_penalty": math.nan}, 10, "presence_penalty", "finite"),
    ({"frequency_penalty": -math.inf}, 10, "frequency_penalty", "finite"),
    ({"bad_words": ((1, 2), ())}, 10, "bad_words[1]", "is empty"),
    ({"bad_words": ((VOCAB,),)}, 10, "bad_words[0]", f"0..{VOCAB - 1}"),
    ({"bad_words": ((5, -1),)}, 10, "bad_words[0]", f"0..{VOCAB - 1}"),
    ({"bad_words": ((1,),) * (MAX_BAD_WORDS + 1)}, 10, "bad_words", f"more than {MAX_BAD_WORDS}"),
    ({"guided_decoding": GuidedDecoding("xml", "<a/>")}, 10, "guided_decoding_guide_type", "'regex'"),
    ({"guided_decoding": GuidedDecoding("json_schema", "  ")}, 10, "guided_decoding_guide", "is required"),
    ({"guided_decoding": GuidedDecoding("regex")}, 10, "guided_decoding_guide", "is required"),
    ({"top_logprobs": -1}, 10, "top_logprobs", f"0..{MAX_TOP_LOGPROBS}"),
    ({"top_logprobs": MAX_TOP_LOGPROBS + 1}, 10, "top_logprobs", f"0..{MAX_TOP_LOGPROBS}"),
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
    check(min_tokens=0, repetition_penalty=1e-3, presence_penalty=-2.0, frequency_penalty=-2.0, bad_words=(),
          top_logprobs=0)
    # TensorRT-LLM puts no upper bound on min_length (past max_tokens it only means no end token).
    check(min_tokens=10**6, repetition_penalty=100.0, presence_penalty=2.0, frequency_penalty=2.0,
          bad_words=((0,), (VOCAB - 1, 0, 7)) * (MAX_BAD_WORDS // 2), return_log_probs=True,
          top_logprobs=MAX_TOP_LOGPROBS, guided_decoding=GuidedDecoding("json"))
    check(guided_decoding=GuidedDecoding("ebnf_grammar", 'root ::= "a"'))


@pytest.mark.parametrize("fields, greedy", [
    ({}, True),  # TensorRT-LLM: nothing asked for sampling
    ({"temperature": 0.0}, True),
    ({"temperature": 0.0, "top_k": 40, "top_p": 0.9}, True),
    ({"temperature": 0.7}, False),  # the TensorRT-LLM contract's parser sends 0 for a temperature alone
    ({"temperature": 0.7, "top_k": 1}, True),  # only one candidate
    ({"top_k": 1}, True),
    ({"top_k": 40}, False),  # temperature defaults to 1.0 then
    ({"top_p": 0.9}, False),
    ({"random_seed": 3}, True),  # a seed alone does not ask for sampling
    ({"repetition_penalty": 1.5, "min_tokens": 3, "return_log_probs": True}, True),  # nor do the other features
])
def test_greedy_unless_sampling_is_asked_for(fields, greedy):
    params = SamplingParams(max_tokens=4, **fields)
    assert params.greedy is greedy
    if not greedy:
        assert params.effective_temperature == fields.get("temperature", 1.0)


def test_features_are_off_by_default():
    params = SamplingParams(max_tokens=4)
    assert not params.penalized and not params.wants_log_probs and params.min_tokens == 0
    assert params.bad_words == () and params.guided_decoding is None
    assert SamplingParams(max_tokens=4, presence_penalty=-0.5).penalized
    assert SamplingParams(max_tokens=4, top_logprobs=3).wants_log_probs


def test_a_negative_max_tokens_says_http_may_have_wrapped_it():
    """Triton's HTTP generate extension turns "max_tokens": 3000000000 into -1294967296."""
    with pytest.raises(InvalidInput, match=r"^max_tokens: -1294967296 is outside 1\.\.8182 .*arrives wrapped around"):
        check(max_tokens=-1294967296)
    with pytest.raises(InvalidInput) as error:
        check(max_tokens=0)
    assert "wrapped" not in str(error.value)


class _NoAlternatives(Engine):
    """An engine that does not give top alternatives and checks nothing of its own."""

    context_length, vocab_size, eos_token_ids = 100, 1000, frozenset()
    checked = 0

    def check_params(self, params):
        self.checked += 1

    add = cancel = outputs = shutdown = lambda *args: None


class _WithAlternatives(_NoAlternatives):
    gives_top_log_probs = True


def test_an_engine_without_alternatives_refuses_top_logprobs_by_name_before_its_own_checks():
    engine = _NoAlternatives()
    with pytest.raises(InvalidInput) as error:
        engine.check_request(SamplingParams(max_tokens=4, top_logprobs=2))
    assert error.value.field == "top_logprobs" and "the _NoAlternatives engine gives no top alternatives" in str(error.value)
    assert engine.checked == 0
    engine.check_request(SamplingParams(max_tokens=4, return_log_probs=True))  # the chosen tokens' log probs stay
    with_alternatives = _WithAlternatives()
    with_alternatives.check_request(SamplingParams(max_tokens=4, top_logprobs=20))
    assert (engine.checked, with_alternatives.checked) == (1, 1)


def test_which_engines_give_top_alternatives():
    """The transformers engine records them from the processed scores (test_hf_engine); TensorRT-LLM's
    LLM API reports raw log probs from its own top-k (the sampled token may be missing), so its
    engine refuses them until it maps the processed distribution."""
    from tritonfront.engines.hf.engine import HFEngine
    from tritonfront.engines.tensorrt_llm import TensorRTLLMEngine

    assert HFEngine.gives_top_log_probs and not TensorRTLLMEngine.gives_top_log_probs

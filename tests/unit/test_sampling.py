"""The transformers engine's per-request sampling (engines/hf/sampling.py) as pure logic, on made-up
request states and logits: Gumbel-max draws follow the softmax, top-k and top-p keep what they
should, and each step's plan does to its rows what transformers' own processors do, and nothing to
the other rows."""
import math
from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from tritonfront.engines import SamplingParams
from tritonfront.engines.hf.sampling import (
    GumbelNoise,
    PerRequestSampling,
    RequestFeatures,
    StepPlan,
    TopK,
    TopP,
    _ends_with,
    _tokens_from,
    as_int32,
    gumbel_noise,
    noise_key,
)

VOCAB = 50


def state(request_id: str, prompt: list[int], generated: list[int], reprefilled: int = 0):
    """A transformers RequestState as the features read it; `reprefilled` generated tokens were
    moved into initial_tokens, as transformers does when it re-prefills an offloaded request."""
    return SimpleNamespace(request_id=request_id, initial_tokens=prompt + generated[:reprefilled],
                           generated_tokens=generated[reprefilled:])


def batch(*states):
    return [SimpleNamespace(state=s, has_new_token=True) for s in states]


def plan_for(features: dict, states) -> StepPlan:
    sampling = PerRequestSampling(features, VOCAB, max_rows=4)
    return sampling.plan(batch(*states), torch.device("cpu"))


def test_tokens_survive_a_reprefill():
    plain, moved = state("a", [1, 2, 3], [4, 5, 6]), state("a", [1, 2, 3], [4, 5, 6], reprefilled=2)
    for s in (plain, moved):
        assert _tokens_from(s, 0) == [1, 2, 3, 4, 5, 6] and _tokens_from(s, 4) == [5, 6] and _tokens_from(s, 6) == []
        assert _ends_with(s, [5, 6]) and _ends_with(s, [3, 4, 5, 6]) and not _ends_with(s, [4, 6])
        assert _ends_with(s, [1, 2, 3, 4, 5, 6]) and not _ends_with(s, [0, 1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize("repetition, presence, frequency", [(1.3, 0.0, 0.0), (0.7, 0.0, 0.0), (1.0, 0.8, 0.0),
                                                             (1.0, 0.0, -0.4), (1.5, 0.3, 0.2)])
def test_penalties_match_transformers_over_prompt_and_output(repetition, presence, frequency):
    torch.manual_seed(0)
    prompt, generated = [3, 7, 7, 9], [7, 12, 3]
    sequence = torch.tensor([prompt + generated])
    scores = torch.randn(3, VOCAB) * 4
    params = SamplingParams(max_tokens=8, repetition_penalty=repetition, presence_penalty=presence,
                            frequency_penalty=frequency)
    features = {"b": RequestFeatures(len(prompt), params, {2})}
    step = plan_for(features, [state("a", [1], []), state("b", prompt, generated), state("c", [1], [])])
    got = step.constrain(scores.clone())
    expected = RepetitionPenaltyLogitsProcessor(repetition)(sequence, scores[1:2].clone())[0]
    counts = torch.bincount(sequence[0], minlength=VOCAB).float()
    expected = expected - presence * (counts > 0) - frequency * counts
    assert torch.equal(got[1], expected)
    assert torch.equal(got[0], scores[0]) and torch.equal(got[2], scores[2])


def test_penalty_counts_grow_with_each_step_only_by_the_new_tokens():
    params = SamplingParams(max_tokens=8, frequency_penalty=1.0)
    features = RequestFeatures(2, params, {2})
    scores = torch.zeros(1, VOCAB)
    for generated in ([], [5], [5, 5], [5, 5, 8]):
        step = plan_for({"a": features}, [state("a", [5, 6], generated)])
        got = step.constrain(scores.clone())[0]
        assert got[5].item() == -(1 + generated.count(5)) and got[6].item() == -1
        assert got[8].item() == -generated.count(8)
    # A re-prefilled request (its output moved into the prompt side) is counted the same.
    moved = plan_for({"a": RequestFeatures(2, params, {2})}, [state("a", [5, 6], [5, 5, 8], reprefilled=2)])
    assert torch.equal(moved.constrain(scores.clone())[0], got)


def test_min_tokens_bans_every_end_token_until_reached():
    params = SamplingParams(max_tokens=8, min_tokens=3)
    features = {"a": RequestFeatures(2, params, {2, 9})}
    processor = MinNewTokensLengthLogitsProcessor(2, 3, [2, 9])
    for generated in ([], [4], [4, 4], [4, 4, 4]):
        scores = torch.randn(1, VOCAB)
        step = plan_for(features, [state("a", [1, 1], generated)])
        got = step.constrain(scores.clone()) if step.ban_rows else scores
        assert torch.equal(got, processor(torch.tensor([[1, 1] + generated]), scores.clone()))


def test_bad_words_ban_the_last_token_when_the_rest_matches():
    bad = ((4,), (7, 8), (1, 7, 9), (3, 3, 3, 11))
    params = SamplingParams(max_tokens=8, bad_words=bad)
    processor = NoBadWordsLogitsProcessor([list(w) for w in bad], eos_token_id=2)
    for prompt, generated in (([1], []), ([1], [7]), ([5, 1], [7]), ([3, 3], [3]), ([3], [3, 3]), ([1, 7], [])):
        scores = torch.randn(1, VOCAB)
        step = plan_for({"a": RequestFeatures(len(prompt), params, {2})}, [state("a", prompt, generated)])
        got = step.constrain(scores.clone())
        assert torch.equal(got, processor(torch.tensor([prompt + generated]), scores.clone())), (prompt, generated)


class FakeMatcher:
    """Allows only `allowed` next; records what it accepts."""

    def __init__(self, allowed: list[int]):
        self.allowed, self.accepted = allowed, []

    def accept_token(self, token):
        self.accepted.append(token)
        return token in self.allowed

    def is_terminated(self):
        return False

    def fill_next_token_bitmask(self, bitmask, row):
        bitmask[row] = 0
        for token in self.allowed:
            bitmask[row, token // 32] |= 1 << (token % 32)


def test_the_guide_masks_its_row_and_wins_over_bans():
    matcher = FakeMatcher([2])  # only the end token: the grammar is complete
    params = SamplingParams(max_tokens=8, min_tokens=5)
    features = {"g": RequestFeatures(1, params, {2}, matcher)}
    scores = torch.randn(2, VOCAB)
    got = plan_for(features, [state("x", [1], []), state("g", [1], [5])]).constrain(scores.clone())
    assert torch.equal(got[0], scores[0])
    assert got[1, 2] == scores[1, 2] and torch.isinf(got[1]).sum() == VOCAB - 1  # min_tokens lost to the guide
    assert matcher.accepted == [5]


def test_a_token_outside_the_guide_is_an_error_of_its_request():
    features = RequestFeatures(1, SamplingParams(max_tokens=8), {2}, FakeMatcher([3]))
    plan_for({"g": features}, [state("g", [1], [4])])
    assert "token 4 is outside the guide" in features.error


def test_log_probs_of_the_chosen_tokens_and_the_top_ones():
    logged = RequestFeatures(1, SamplingParams(max_tokens=8, return_log_probs=True, top_logprobs=2), {2})
    plain = RequestFeatures(1, SamplingParams(max_tokens=8, return_log_probs=True), {2})
    scores = torch.tensor([[0.0, 1.0, 2.0, -math.inf], [3.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    step = plan_for({"a": logged, "c": plain}, [state("a", [1], []), state("b", [1], []), state("c", [1], [])])
    step.measure(scores)
    step.record(scores + torch.tensor([[0.0, 5.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4]))  # noise picked token 1
    expected = torch.log_softmax(scores[0], -1)
    assert logged.log_probs == [pytest.approx(expected[1].item())]
    assert logged.top_log_probs == [[(2, pytest.approx(expected[2].item())), (1, pytest.approx(expected[1].item()))]]
    assert plain.log_probs == [pytest.approx(torch.log_softmax(scores[2], -1)[0].item())]
    assert plain.top_log_probs == []


def test_no_features_no_plan():
    assert plan_for({}, [state("a", [1], [])]) is None
    assert plan_for({"other": RequestFeatures(1, SamplingParams(max_tokens=2, min_tokens=1), {2})},
                    [state("a", [1], [])]) is None
    assert not RequestFeatures.wanted(SamplingParams(max_tokens=4, temperature=0.5, top_k=3, random_seed=1))


def packed(values, dtype):
    return torch.tensor(values, dtype=dtype).view(torch.int32)


def test_top_k_keeps_what_transformers_keeps():
    from transformers.generation.logits_process import TopKLogitsWarper

    torch.manual_seed(1)
    scores = torch.randn(4, 1000) * 3
    ks = [5, 0, 1, 1000]
    got = TopK()(scores, packed(ks, torch.int32))
    for row, k in enumerate(ks):
        expected = TopKLogitsWarper(k)(None, scores[row:row + 1])[0] if k else scores[row]
        assert torch.equal(got[row], expected)


@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])  # 0.1: flat rows, whose nucleus is past the first candidates
def test_top_p_keeps_what_transformers_keeps(scale):
    from transformers.generation.logits_process import TopPLogitsWarper

    torch.manual_seed(2)
    scores = torch.randn(5, 5000) * scale
    ps = [0.9, 1.0, 0.5, 0.99, 0.05]
    got = TopP()(scores, packed(ps, torch.float32))
    for row, p in enumerate(ps):
        expected = TopPLogitsWarper(p)(None, scores[row:row + 1])[0] if p < 1 else scores[row]
        assert torch.equal(torch.isfinite(got[row]), torch.isfinite(expected)), (scale, p)
        assert torch.equal(got[row][torch.isfinite(got[row])], scores[row][torch.isfinite(got[row])])


def test_noise_on_the_remaining_candidates_equals_noise_on_the_whole_row():
    torch.manual_seed(3)
    scores = torch.randn(3, 4000)
    scores[0, 10:] = -math.inf  # truncated: the sparse path
    keys = [as_int32(noise_key(5, 9)), as_int32(noise_key(6, 9)), 0]
    got = GumbelNoise()(scores, packed(keys, torch.int32))
    full = scores + gumbel_noise(torch.tensor(keys, dtype=torch.int64) & 0xFFFFFFFF, 4000)
    assert torch.equal(got[:2], full[:2]) and torch.equal(got[2], scores[2])


def test_gumbel_max_draws_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    keys = torch.tensor([noise_key(7, position) for position in range(20000)], dtype=torch.int64)
    draws = torch.argmax(logits + gumbel_noise(keys, len(logits)), dim=-1)
    frequencies = torch.bincount(draws, minlength=len(logits)).float() / len(keys)
    expected = torch.softmax(logits, -1)
    assert torch.allclose(frequencies, expected, atol=0.015), (frequencies, expected)
    assert torch.equal(gumbel_noise(keys[:3], 5), gumbel_noise(keys[:3], 5))  # a pure function of the key


def test_top_k_and_top_p_keep_what_they_should():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    kept_k = torch.isfinite(TopK()(scores, packed([2, 0, 9], torch.int32)))
    assert kept_k.tolist() == [[True, True, False, False], [True] * 4, [True] * 4]
    kept_p = torch.isfinite(TopP()(scores, packed([0.7, 0.85, 1.0], torch.float32)))
    assert kept_p.tolist() == [[True, True, False, False], [True, True, True, False], [True] * 4]


def test_rows_without_a_seed_get_no_noise():
    scores = torch.randn(2, 50)
    out = GumbelNoise()(scores, packed([0, as_int32(noise_key(1, 5))], torch.int32))
    assert torch.equal(out[0], scores[0]) and not torch.equal(out[1], scores[1])
    assert math.isfinite(out[1].sum().item())

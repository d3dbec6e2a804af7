"""The transformers engine on the bundled SmolLM2: greedy equals `generate`, seeded sampling is
reproducible whatever shares the batch, and the per-request samplers do what they say."""
import math
import time

import pytest
import torch

from tritonfront import model_sources
from tritonfront.engines import EngineConfig, SamplingParams, create_engine
from tritonfront.engines.hf import GumbelNoise, TopK, TopP, as_int32, gumbel_noise, noise_key

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,",
           "The best way to learn a language is", "Water boils at"]


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(2)
    engine = create_engine("hf", model_sources.llm_model_dir(), "cpu", EngineConfig(kv_cache_tokens=4096))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


def run(engine, requests: dict, timeout: float = 120) -> dict:
    """request id -> (prompt ids, params); returns request id -> generated ids."""
    results = {rid: [] for rid in requests}
    for rid, (ids, params) in requests.items():
        engine.add(rid, ids, params)
    done, deadline = set(), time.monotonic() + timeout
    while len(done) < len(requests):
        assert time.monotonic() < deadline, f"unfinished: {set(requests) - done}"
        for output in engine.outputs(0.05):
            assert output.error is None
            results[output.request_id] += output.token_ids
            done |= {output.request_id} if output.finished else set()
    return results


def test_context_is_bounded_by_the_kv_cache(engine):
    assert 4096 <= engine.context_length <= 8192
    assert engine.eos_token_ids == {2} and engine.vocab_size == 49152


def test_greedy_in_flight_batch_equals_generate(engine, tokenizer):
    from transformers import AutoModelForCausalLM

    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    got = run(engine, {f"g{i}": (ids, SamplingParams(max_tokens=12)) for i, ids in enumerate(prompts)})
    model = AutoModelForCausalLM.from_pretrained(model_sources.llm_model_dir(), dtype=torch.float32).eval()
    for i, ids in enumerate(prompts):
        expected = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert got[f"g{i}"] == expected, PROMPTS[i]


def test_seeded_sampling_does_not_depend_on_the_batch(engine, tokenizer):
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    sampled = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, random_seed=1234)
    alone = run(engine, {"alone": (prompts[0], sampled)})["alone"]
    crowd = {f"c{i}": (ids, SamplingParams(max_tokens=10, temperature=0.8, random_seed=i))
             for i, ids in enumerate(prompts)}
    crowd["seeded"] = (prompts[0], sampled)
    together = run(engine, crowd)
    assert together["seeded"] == alone
    other_seed = run(engine, {"other": (prompts[0], SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95,
                                                                    random_seed=99))})["other"]
    assert other_seed != alone


def test_top_k_one_and_end_id(engine, tokenizer):
    ids = tokenizer(PROMPTS[1]).input_ids
    greedy = run(engine, {"g": (ids, SamplingParams(max_tokens=8))})["g"]
    top1 = run(engine, {"k": (ids, SamplingParams(max_tokens=8, temperature=1.5, top_k=1))})["k"]
    assert top1 == greedy
    end = greedy[3]
    stopped = run(engine, {"e": (ids, SamplingParams(max_tokens=8, end_id=end))})["e"]
    assert stopped == greedy[: greedy.index(end) + 1]


def test_cancelled_request_stops_and_others_go_on(engine, tokenizer):
    ids = tokenizer(PROMPTS[2]).input_ids
    engine.add("long", ids, SamplingParams(max_tokens=400))
    got = []
    while len(got) < 3:
        got += [t for o in engine.outputs(0.05) if o.request_id == "long" for t in o.token_ids]
    engine.cancel("long")
    after = run(engine, {"next": (ids, SamplingParams(max_tokens=6))})
    assert len(after["next"]) == 6
    assert not [o for o in engine.outputs(0.2) if o.request_id == "long"]


def test_gumbel_max_draws_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    keys = torch.tensor([noise_key(7, position) for position in range(20000)], dtype=torch.int64)
    draws = torch.argmax(logits + gumbel_noise(keys, len(logits)), dim=-1)
    frequencies = torch.bincount(draws, minlength=len(logits)).float() / len(keys)
    expected = torch.softmax(logits, -1)
    assert torch.allclose(frequencies, expected, atol=0.015), (frequencies, expected)
    assert torch.equal(gumbel_noise(keys[:3], 5), gumbel_noise(keys[:3], 5))  # a pure function of the key


def packed(values, dtype):
    return torch.tensor(values, dtype=dtype).view(torch.int32)


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

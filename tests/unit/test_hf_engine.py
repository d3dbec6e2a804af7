"""The transformers engine on the bundled SmolLM2: greedy equals `generate`, seeded sampling is
reproducible whatever shares the batch, and the per-request samplers do what they say. Its
per-request features against transformers' own `generate` with the equivalent logits processors:
penalties, min_tokens, bad words and log probs give what transformers gives, requests without
features in the same batch stay exactly greedy, seeded sampling with penalties is reproducible, and
guided output always parses against its guide. The samplers alone: tests/unit/test_sampling.py."""
import json
import math
import re

import pydantic
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

from harness.engine_runs import generated, run
from tritonfront.core import model_sources
from tritonfront.engines import EngineConfig, SamplingParams, create_engine
from tritonfront.engines.base import GuidedDecoding
from tritonfront.errors import InvalidInput

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,",
           "The best way to learn a language is", "Water boils at"]
EOS = 2


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(2)
    engine = create_engine("hf", model_sources.llm_model_dir(), "cpu", EngineConfig(kv_cache_tokens=4096))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(model_sources.llm_model_dir(), dtype=torch.float32).eval()


def chat(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_dict=True)["input_ids"]



def test_context_is_bounded_by_the_kv_cache(engine):
    assert 4096 <= engine.context_length <= 8192
    assert engine.eos_token_ids == {2} and engine.vocab_size == 49152


def test_greedy_in_flight_batch_equals_generate(engine, tokenizer, model):
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    got = generated(engine, {f"g{i}": (ids, SamplingParams(max_tokens=12)) for i, ids in enumerate(prompts)})
    for i, ids in enumerate(prompts):
        expected = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert got[f"g{i}"] == expected, PROMPTS[i]


def test_seeded_sampling_does_not_depend_on_the_batch(engine, tokenizer):
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    sampled = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, random_seed=1234)
    alone = generated(engine, {"alone": (prompts[0], sampled)})["alone"]
    crowd = {f"c{i}": (ids, SamplingParams(max_tokens=10, temperature=0.8, random_seed=i))
             for i, ids in enumerate(prompts)}
    crowd["seeded"] = (prompts[0], sampled)
    together = generated(engine, crowd)
    assert together["seeded"] == alone
    other_seed = generated(engine, {"other": (prompts[0], SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95,
                                                                    random_seed=99))})["other"]
    assert other_seed != alone


def test_top_k_one_and_end_id(engine, tokenizer):
    ids = tokenizer(PROMPTS[1]).input_ids
    greedy = generated(engine, {"g": (ids, SamplingParams(max_tokens=8))})["g"]
    top1 = generated(engine, {"k": (ids, SamplingParams(max_tokens=8, temperature=1.5, top_k=1))})["k"]
    assert top1 == greedy
    end = greedy[3]
    stopped = generated(engine, {"e": (ids, SamplingParams(max_tokens=8, end_id=end))})["e"]
    assert stopped == greedy[: greedy.index(end) + 1]


def test_cancelled_request_stops_and_others_go_on(engine, tokenizer):
    ids = tokenizer(PROMPTS[2]).input_ids
    engine.add("long", ids, SamplingParams(max_tokens=400))
    got = []
    while len(got) < 3:
        got += [t for o in engine.outputs(0.05) if o.request_id == "long" for t in o.token_ids]
    engine.cancel("long")
    after = generated(engine, {"next": (ids, SamplingParams(max_tokens=6))})
    assert len(after["next"]) == 6
    assert not [o for o in engine.outputs(0.2) if o.request_id == "long"]


class PresenceFrequencyPenalty(LogitsProcessor):
    """TensorRT-LLM's presence and frequency penalties over the whole sequence, as a transformers
    processor (transformers has none)."""

    def __init__(self, presence: float, frequency: float):
        self.presence, self.frequency = presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores).scatter_add_(1, input_ids, torch.ones_like(input_ids, dtype=scores.dtype))
        return scores - self.presence * (counts > 0) - self.frequency * counts


def reference(model, ids: list[int], max_tokens: int, processors=(), **generate_kwargs):
    """transformers' greedy tokens and, per token, its log-probability under the processed scores."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=EOS,
                         pad_token_id=EOS, logits_processor=LogitsProcessorList(processors), output_scores=True,
                         return_dict_in_generate=True, **generate_kwargs)
    tokens = out.sequences[0, len(ids):].tolist()
    log_probs = [torch.log_softmax(score[0].float(), -1)[token].item() for score, token in zip(out.scores, tokens)]
    return tokens, log_probs


@pytest.mark.parametrize("penalties", [
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.8},
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.7},
    {"repetition_penalty": 1.2, "presence_penalty": 0.4, "frequency_penalty": -0.3},
])
def test_penalties_and_log_probs_equal_transformers(engine, tokenizer, model, penalties):
    prompts = [tokenizer(p).input_ids for p in PROMPTS[:3]]
    params = SamplingParams(max_tokens=24, return_log_probs=True, **penalties)
    got = run(engine, {f"p{i}": (ids, params) for i, ids in enumerate(prompts)})
    plain = run(engine, {"plain": (prompts[0], SamplingParams(max_tokens=24))})["plain"].token_ids
    changed = False
    for i, ids in enumerate(prompts):
        presence = PresenceFrequencyPenalty(penalties.get("presence_penalty", 0.0), penalties.get("frequency_penalty", 0.0))
        tokens, log_probs = reference(model, ids, 24, [presence], repetition_penalty=penalties.get("repetition_penalty"))
        assert got[f"p{i}"].token_ids == tokens, PROMPTS[i]
        assert len(got[f"p{i}"].log_probs) == len(tokens)
        assert max(abs(a - b) for a, b in zip(got[f"p{i}"].log_probs, log_probs)) < 1e-4
        changed |= i == 0 and tokens != plain
    assert changed, "the penalty did not change the greedy text: the comparison proves nothing"


def test_greedy_log_probs_equal_the_models_own(engine, tokenizer, model):
    ids = tokenizer(PROMPTS[4]).input_ids
    got = run(engine, {"g": (ids, SamplingParams(max_tokens=16, return_log_probs=True, top_logprobs=3))})["g"]
    tokens, log_probs = reference(model, ids, 16)
    assert got.token_ids == tokens
    assert max(abs(a - b) for a, b in zip(got.log_probs, log_probs)) < 1e-4
    assert all(lp <= 0 for lp in got.log_probs)
    for token, log_prob, top in zip(got.token_ids, got.log_probs, got.top_log_probs):
        assert len(top) == 3 and top[0] == (token, log_prob)  # greedy: the chosen token is the most likely
        assert top[0][1] >= top[1][1] >= top[2][1]


def test_top_alternatives_under_penalties_equal_transformers_processed_scores(engine, tokenizer, model):
    """With a penalty the processed distribution differs from the model's own: the alternatives and
    their log probs are those of transformers' `scores` (after the penalty), the chosen token first."""
    ids = tokenizer(PROMPTS[3]).input_ids
    got = run(engine, {"t": (ids, SamplingParams(max_tokens=12, repetition_penalty=1.3, top_logprobs=4))})["t"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=EOS, pad_token_id=EOS,
                         repetition_penalty=1.3, output_scores=True, output_logits=True, return_dict_in_generate=True)
    assert got.token_ids == out.sequences[0, len(ids):].tolist()
    moved = 0.0
    for token, log_prob, top, score, logits in zip(got.token_ids, got.log_probs, got.top_log_probs, out.scores,
                                                    out.logits):
        values, expected_ids = torch.log_softmax(score[0].float(), -1).topk(4)
        assert [t for t, _ in top][0] == token == expected_ids[0].item() and top[0][1] == log_prob
        assert max(abs(p - v) for (_, p), v in zip(top, values.tolist())) < 1e-4
        moved = max(moved, abs(torch.log_softmax(logits[0].float(), -1)[token].item() - log_prob))
    assert moved > 0.05, "the penalty did not move the distribution: the comparison proves nothing"


def test_sampled_log_probs_are_those_of_the_truncated_distribution(engine, tokenizer):
    ids = tokenizer(PROMPTS[2]).input_ids
    params = SamplingParams(max_tokens=12, temperature=0.9, top_k=3, random_seed=5, return_log_probs=True,
                            top_logprobs=5)
    got = run(engine, {"s": (ids, params)})["s"]
    for token, log_prob, top in zip(got.token_ids, got.log_probs, got.top_log_probs):
        kept = [(t, p) for t, p in top if p > -math.inf]
        assert 1 <= len(kept) <= 3 and token in dict(kept) and dict(kept)[token] == log_prob
        assert abs(sum(math.exp(p) for _, p in kept) - 1) < 1e-4  # top-k renormalized


def test_min_tokens_holds_the_end_token_back(engine, tokenizer, model):
    ids = chat(tokenizer, "What is the capital of France?")
    greedy = run(engine, {"g": (ids, SamplingParams(max_tokens=40))})["g"].token_ids
    assert greedy[-1] == EOS and len(greedy) < 12, "the prompt must end early for this test to mean anything"
    got = run(engine, {"m": (ids, SamplingParams(max_tokens=40, min_tokens=20))})["m"].token_ids
    assert EOS not in got[:20] and len(got) >= 20
    tokens, _ = reference(model, ids, 40, min_new_tokens=20)
    assert got == tokens


def test_bad_words_never_appear(engine, tokenizer, model):
    ids = chat(tokenizer, "What is the capital of France?")
    greedy = run(engine, {"g": (ids, SamplingParams(max_tokens=40))})["g"].token_ids
    single, pair = greedy[4], tuple(greedy[1:3])  # a token it wants, and a two-token sequence it wants
    bad = ((single,), pair)
    got = run(engine, {"b": (ids, SamplingParams(max_tokens=40, bad_words=bad))})["b"].token_ids
    assert single not in got
    assert all(tuple(got[i:i + 2]) != pair for i in range(len(got) - 1))
    assert got != greedy
    tokens, _ = reference(model, ids, 40, bad_words_ids=[list(word) for word in bad])
    assert got == tokens


def test_a_bad_word_continues_the_prompt(engine, tokenizer):
    ids = tokenizer(PROMPTS[0]).input_ids  # "The capital of France is"
    greedy = run(engine, {"g": (ids, SamplingParams(max_tokens=4))})["g"].token_ids
    banned = (ids[-1], greedy[0])  # the prompt's last token followed by the first generated one
    got = run(engine, {"b": (ids, SamplingParams(max_tokens=4, bad_words=(banned,)))})["b"].token_ids
    assert got[0] != greedy[0]


def test_requests_without_features_stay_greedy_beside_those_with(engine, tokenizer, model):
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    mixed = {f"g{i}": (ids, SamplingParams(max_tokens=12)) for i, ids in enumerate(prompts)}
    mixed.update({
        "pen": (prompts[0], SamplingParams(max_tokens=12, repetition_penalty=1.5, presence_penalty=1.0)),
        "ban": (prompts[1], SamplingParams(max_tokens=12, bad_words=((13,), (1, 2, 3)), min_tokens=12)),
        "lp": (prompts[2], SamplingParams(max_tokens=12, return_log_probs=True, top_logprobs=2)),
        "json": (prompts[3], SamplingParams(max_tokens=12, guided_decoding=GuidedDecoding("json"))),
        "hot": (prompts[4], SamplingParams(max_tokens=12, temperature=1.2, top_p=0.9, random_seed=3,
                                           frequency_penalty=0.5)),
    })
    got = run(engine, mixed)
    for i, ids in enumerate(prompts):
        expected = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert got[f"g{i}"].token_ids == expected, PROMPTS[i]
        assert got[f"g{i}"].log_probs == [] and got[f"g{i}"].top_log_probs == []


def test_seeded_sampling_with_penalties_is_reproducible(engine, tokenizer):
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, random_seed=77, repetition_penalty=1.3,
                            presence_penalty=0.5, frequency_penalty=0.2, bad_words=((28,),), min_tokens=16)
    alone = run(engine, {"alone": (prompts[2], params)})["alone"].token_ids
    crowd = {f"c{i}": (ids, SamplingParams(max_tokens=16, temperature=0.8, top_k=50, random_seed=i,
                                           repetition_penalty=1.1)) for i, ids in enumerate(prompts)}
    crowd["seeded"] = (prompts[2], params)
    assert run(engine, crowd)["seeded"].token_ids == alone
    unpenalized = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, random_seed=77)
    assert run(engine, {"u": (prompts[2], unpenalized)})["u"].token_ids != alone


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    name: str
    age: int
    languages: list[str] = pydantic.Field(max_length=3)  # maxItems: a small model would list forever


def until_end(tokens: list[int]) -> list[int]:
    assert tokens[-1] == EOS, "the guided request ran out of tokens before its guide was complete"
    return tokens[:-1]


def test_guided_json_schema_output_validates(engine, tokenizer):
    schema = json.dumps(Person.model_json_schema())
    requests = {
        "greedy": (chat(tokenizer, "Describe a programmer as JSON."),
                   SamplingParams(max_tokens=96, guided_decoding=GuidedDecoding("json_schema", schema))),
        "sampled": (chat(tokenizer, "Tell me about a person."),
                    SamplingParams(max_tokens=96, temperature=1.0, top_p=0.9, random_seed=11,
                                   guided_decoding=GuidedDecoding("json_schema", schema))),
    }
    for rid, output in run(engine, requests).items():
        text = tokenizer.decode(until_end(output.token_ids))
        Person.model_validate_json(text)  # raises unless the text parses and has exactly the schema's fields


def test_guided_regex_output_fullmatches(engine, tokenizer):
    pattern = r"(\+33|0)[1-9]( [0-9]{2}){4}"
    params = SamplingParams(max_tokens=40, guided_decoding=GuidedDecoding("regex", pattern))
    requests = {"greedy": (chat(tokenizer, "Give me a French phone number."), params),
                "sampled": (chat(tokenizer, "Call me!"), SamplingParams(
                    max_tokens=40, temperature=1.5, top_k=20, random_seed=2,
                    guided_decoding=GuidedDecoding("regex", pattern)))}
    for rid, output in run(engine, requests).items():
        text = tokenizer.decode(until_end(output.token_ids))
        assert re.fullmatch(pattern, text), (rid, text)


def test_guided_json_and_grammar(engine, tokenizer):
    grammar = 'root ::= ("yes" | "no") " because " [a-z ]+ "."'
    requests = {
        "json": (chat(tokenizer, "Give a JSON object with a fruit name and its color."),
                 SamplingParams(max_tokens=64, guided_decoding=GuidedDecoding("json"))),
        "ebnf": (chat(tokenizer, "Is the sky blue?"),
                 SamplingParams(max_tokens=40, guided_decoding=GuidedDecoding("ebnf_grammar", grammar))),
        # The guide ends the answer when min_tokens would still hold the end token back.
        "short": (chat(tokenizer, "Is water wet?"),
                  SamplingParams(max_tokens=40, min_tokens=40, guided_decoding=GuidedDecoding("regex", "(yes|no)"))),
    }
    got = run(engine, requests)
    assert isinstance(json.loads(tokenizer.decode(until_end(got["json"].token_ids))), (dict, list))
    assert re.fullmatch(r"(yes|no) because [a-z ]+\.", tokenizer.decode(until_end(got["ebnf"].token_ids)))
    assert tokenizer.decode(until_end(got["short"].token_ids)) in ("yes", "no")


@pytest.mark.parametrize("guide_type, guide, message", [
    ("json_schema", '{"type": "objec', "Failed to parse JSON"),
    ("json_schema", '{"type": 3}', "json_schema does not compile"),
    ("regex", "[a-", "Unclosed '['"),
    ("ebnf_grammar", 'root ::= "a', "string literal"),
    ("ebnf_grammar", 'start ::= "a"', "root"),
])
def test_a_guide_that_does_not_compile_is_the_clients_error(engine, guide_type, guide, message):
    with pytest.raises(InvalidInput) as error:
        engine.check_params(SamplingParams(max_tokens=4, guided_decoding=GuidedDecoding(guide_type, guide)))
    assert error.value.field == "guided_decoding_guide"
    assert message in str(error.value) and ".cc:" not in str(error.value)


def test_features_end_with_their_request(engine, tokenizer):
    ids = tokenizer(PROMPTS[0]).input_ids
    params = SamplingParams(max_tokens=200, repetition_penalty=1.2, return_log_probs=True,
                            guided_decoding=GuidedDecoding("regex", "[a-z ]+"))
    engine.add("cancelled", ids, params)
    generated = 0
    while generated < 2:
        generated += sum(len(o.token_ids) for o in engine.outputs(0.05) if o.request_id == "cancelled")
    engine.cancel("cancelled")
    run(engine, {"done": (ids, SamplingParams(max_tokens=3, presence_penalty=0.5))})
    assert engine._features == {}

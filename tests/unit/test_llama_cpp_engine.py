"""The llama.cpp engine on the bundled GGUF, against llama-cpp-python's own single-sequence
generation (Llama.generate, greedy) and the logits its context computes: greedy ids equal alone and in a batch of
concurrent sequences, log probs are the log-softmax of the logits llama.cpp computes,
seeded sampling does not depend on the batch (with a cache per sequence; in the unified cache while
no other sequence ends), the sampling features do what they say, a cancelled or
finished sequence's KV cells go back (asked of llama.cpp's memory itself; an ended prompt stays on its
seq_id for the next request there, prompt_cache), and what the engine
cannot do or a request that does not fit is refused by name. Prompts are not the tests' fixtures
(harness.corpora.PROMPTS)."""
import dataclasses
import json
import math
import time

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (scripts/setup.sh builds it)")

from harness.engine_runs import generated, run  # noqa: E402
from harness.references import llama_cpp_greedy_reference, llama_cpp_reference  # noqa: E402
from tritonfront.core import model_sources  # noqa: E402
from tritonfront.engines import EngineConfig, SamplingParams, create_engine  # noqa: E402
from tritonfront.engines.base import GuidedDecoding  # noqa: E402
from tritonfront.errors import InvalidInput  # noqa: E402

PROMPTS = ["The chemical symbol for gold is", "A good recipe for pancakes needs", "def is_prime(n):\n",
           "In 1969, the first person to walk on the moon was", "My favourite season is autumn because",
           "Ten green bottles hanging on the wall,"]
KV_CELLS = 4096


@pytest.fixture(scope="module")
def gguf():
    return model_sources.llm_gguf_file()


@pytest.fixture(scope="module")
def engine(gguf):
    engine = create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu",
                           EngineConfig(kv_cache_tokens=KV_CELLS, max_num_seqs=16, num_threads=2,
                                        gguf_file=str(gguf)))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def reference():
    return llama_cpp_reference()


def tokens(reference, text: str) -> list[int]:
    return reference.tokenize(text.encode(), add_bos=False, special=True)


def reference_greedy(prompt: list[int], max_tokens: int) -> list[int]:
    return llama_cpp_greedy_reference([prompt], max_tokens)[0]



def wait_until_empty(engine, timeout: float = 30) -> None:
    """Until no sequence runs and llama.cpp's memory holds only the prompts free seq_ids keep."""
    deadline = time.monotonic() + timeout
    while engine.kv_cache_blocks() or engine.memory_cells() != engine.kept_prompt_cells():
        assert time.monotonic() < deadline, (engine.kv_cache_blocks(), engine.memory_cells(), engine.kept_prompt_cells())
        engine.outputs(0.05)


def test_the_engine_reports_the_models_facts(engine, reference):
    assert engine.vocab_size == reference.n_vocab() == 49152
    assert engine.context_length == KV_CELLS  # below the model's training context of 8192
    assert engine.kv_cache_capacity_blocks() == KV_CELLS
    assert 2 in engine.eos_token_ids  # <|im_end|>, the chat template's end


def test_greedy_alone_and_in_a_batch_equals_llama_cpp_pythons_generate(engine, reference):
    prompts = [tokens(reference, p) for p in PROMPTS]
    expected = [reference_greedy(ids, 24) for ids in prompts]
    alone = [generated(engine, {"a": (ids, SamplingParams(max_tokens=24))})["a"] for ids in prompts]
    assert alone == expected
    together = generated(engine, {f"b{i}": (ids, SamplingParams(max_tokens=24)) for i, ids in enumerate(prompts)})
    assert [together[f"b{i}"] for i in range(len(prompts))] == expected
    wait_until_empty(engine)


def test_a_prompt_longer_than_a_batch_is_fed_in_chunks(engine, reference):
    # 512 tokens per step by default: a ~1400-token prompt takes three steps beside the others (and
    # fits the reference's context of 2048).
    long_prompt = tokens(reference, " ".join(f"item {i}," for i in range(250)))
    assert 1024 < len(long_prompt) < 2048 - 8
    expected = reference_greedy(long_prompt, 8)
    got = generated(engine, {"long": (long_prompt, SamplingParams(max_tokens=8)),
                             "short": (tokens(reference, PROMPTS[0]), SamplingParams(max_tokens=30))})
    assert got["long"] == expected


def test_greedy_log_probs_are_the_log_softmax_of_llama_cpps_logits(engine, reference):
    prompt = tokens(reference, PROMPTS[1])
    out = run(engine, {"lp": (prompt, SamplingParams(max_tokens=6, return_log_probs=True, top_logprobs=3))})["lp"]
    reference.reset()
    rows = []
    for fed in (prompt, *([t] for t in out.token_ids[:-1])):  # the logits before each generated token
        reference.eval(fed)
        rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(reference.ctx, -1),
                                          shape=(reference.n_vocab(),)).copy())
    logits = np.array(rows, dtype=np.float64)
    log_softmax = logits - logits.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    for step, token in enumerate(out.token_ids):
        assert out.log_probs[step] == pytest.approx(log_softmax[step, token], abs=2e-3)
        top = out.top_log_probs[step]
        assert [t for t, _ in top] == list(np.argsort(-log_softmax[step])[:3])
        assert top[0] == (token, pytest.approx(out.log_probs[step]))


def test_sampled_log_probs_are_those_of_the_truncated_distribution(engine, reference):
    prompt = tokens(reference, PROMPTS[4])
    out = run(engine, {"s": (prompt, SamplingParams(max_tokens=8, temperature=0.7, top_k=5, random_seed=3,
                                                      return_log_probs=True, top_logprobs=5))})["s"]
    for step, token in enumerate(out.token_ids):
        top = out.top_log_probs[step]
        assert len(top) == 5 and math.fsum(math.exp(lp) for _, lp in top) == pytest.approx(1.0, abs=1e-4)
        assert token in dict(top) and dict(top)[token] == pytest.approx(out.log_probs[step])


@pytest.fixture(scope="module")
def split_engine(gguf):
    """kv_unified false: each of 8 sequences its own 512 cells (llama-server's -np layout)."""
    engine = create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu",
                           EngineConfig(kv_cache_tokens=8 * 512, max_num_seqs=8, num_threads=2,
                                        gguf_file=str(gguf), kv_unified=False))
    yield engine
    engine.shutdown()


def test_each_step_is_in_seq_id_order_and_new_sequences_take_the_lowest_free_ids(split_engine, reference,
                                                                                    monkeypatch):
    """With a cache per sequence, llama.cpp runs a batch as one forward pass per run of consecutive
    seq_ids in batch order (llama_batch_allocr::split_equal): the batch must list the sequences in
    seq_id order, and the ids must stay compact as sequences end and others start (with the prompts
    that finished ones keep on their ids, prompt_cache's default)."""
    from tritonfront.engines import llama_cpp as engine_module

    steps = []
    decode = engine_module.llama.llama_decode

    def recording(ctx, batch):
        n = batch.n_tokens
        steps.append([batch.seq_id[i][0] for i in range(n)])
        return decode(ctx, batch)

    monkeypatch.setattr(engine_module.llama, "llama_decode", recording)
    prompts = [tokens(reference, p) for p in PROMPTS]
    # Ten requests on 8 seq_ids, the first six ending after 2..7 tokens: the last two start on the
    # ids the first ones gave back, while the others run on.
    requests = {f"a{i}": (ids, SamplingParams(max_tokens=2 + i)) for i, ids in enumerate(prompts)}
    requests.update({f"b{i}": (prompts[i % len(prompts)], SamplingParams(max_tokens=6)) for i in range(4)})
    generated(split_engine, requests)
    assert steps and all(ids == sorted(ids) for ids in steps), steps
    used = sorted({i for ids in steps for i in ids})
    assert used == list(range(len(used))) and len(used) <= 8, used


def test_an_ended_prompt_stays_on_its_seq_id_for_the_next_request_there(gguf, reference, monkeypatch):
    """With a cache per sequence a finished sequence's prompt keeps its cells on its seq_id; the
    next request given that seq_id is fed only what follows the prefix the two share, and
    generates what llama-cpp-python generates from the whole prompt. A cancelled sequence keeps
    its prompt the same way and frees what it generated; with prompt_cache false nothing stays."""
    from tritonfront.engines import llama_cpp as engine_module

    config = EngineConfig(kv_cache_tokens=4 * 512, max_num_seqs=4, num_threads=2, gguf_file=str(gguf),
                          kv_unified=False)
    split_engine = create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu", config)
    try:
        check_prompt_reuse(split_engine, reference, monkeypatch, engine_module)
    finally:
        split_engine.shutdown()
    uncached = create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu",
                             dataclasses.replace(config, prompt_cache=False))
    try:
        prompt = tokens(reference, PROMPTS[4])
        assert generated(uncached, {"first": (prompt, SamplingParams(max_tokens=5))})["first"] == \
            reference_greedy(prompt, 5)
        wait_until_empty(uncached)
        assert uncached.kept_prompt_cells() == 0 == uncached.memory_cells()
    finally:
        uncached.shutdown()


def check_prompt_reuse(split_engine, reference, monkeypatch, engine_module) -> None:
    fed = []
    decode = engine_module.llama.llama_decode

    def recording(ctx, batch):
        fed.append([(batch.seq_id[i][0], batch.pos[i]) for i in range(batch.n_tokens)])
        return decode(ctx, batch)

    monkeypatch.setattr(engine_module.llama, "llama_decode", recording)
    base = tokens(reference, PROMPTS[4])
    longer = base + tokens(reference, " the leaves turn red and gold")
    assert generated(split_engine, {"first": (base, SamplingParams(max_tokens=5))})["first"] == reference_greedy(base, 5)
    seq_id = fed[0][0][0]
    assert split_engine.kept_prompt_cells() == len(base) == split_engine.memory_cells()
    fed.clear()
    assert generated(split_engine, {"second": (longer, SamplingParams(max_tokens=8))})["second"] == \
        reference_greedy(longer, 8)
    assert fed[0] == [(seq_id, position) for position in range(len(base), len(longer))]  # only the new tokens
    assert split_engine.kept_prompt_cells() == len(longer) == split_engine.memory_cells()
    split_engine.add("cancelled", longer, SamplingParams(max_tokens=400))
    seen = 0
    while seen < 3:
        seen += sum(len(o.token_ids) for o in split_engine.outputs(0.05) if o.request_id == "cancelled")
    split_engine.cancel("cancelled")
    wait_until_empty(split_engine)
    assert split_engine.kept_prompt_cells() == len(longer) == split_engine.memory_cells()


def test_requests_admitted_together_take_the_lowest_free_ids_each_the_one_keeping_most_of_its_prompt():
    from tritonfront.engines.llama_cpp import assign_seq_ids

    kept = {0: [1, 2, 3], 1: [7, 8, 9, 10], 2: [7, 8], 5: [7, 8, 9, 10, 11]}
    # Id 5 keeps the longest prefix of the second prompt but is not among the two lowest free ids.
    assert assign_seq_ids([[1, 2, 4], [7, 8, 9, 10, 11, 12]], [0, 1], kept) == [0, 1]
    assert assign_seq_ids([[7, 8, 9, 5], [1, 2, 3, 4]], [0, 1, 2], kept) == [1, 0]
    assert assign_seq_ids([[7, 8, 0], [7, 8, 0], [9]], [0, 1, 2], kept) == [1, 2, 0]  # ties: the lowest
    assert assign_seq_ids([[4], [5]], [3, 4], {}) == [3, 4]


SEEDED = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, random_seed=2**40 + 7)


def crowd(prompts: list, seeded: SamplingParams, ends_early: bool) -> dict:
    """The seeded request beside six sampled ones, each with its own seed; with `ends_early` they
    stop after 3..8 tokens, so their cells go back while the seeded one runs."""
    requests = {f"c{i}": (ids, SamplingParams(max_tokens=3 + i if ends_early else 12, temperature=0.8,
                                              random_seed=i, min_tokens=0 if ends_early else 12))
                for i, ids in enumerate(prompts)}
    requests["seeded"] = (prompts[0], seeded)
    return requests


def test_seeded_sampling_does_not_depend_on_the_batch_with_a_cache_per_sequence(split_engine, reference):
    prompts = [tokens(reference, p) for p in PROMPTS]
    alone = generated(split_engine, {"alone": (prompts[0], SEEDED)})["alone"]
    assert generated(split_engine, crowd(prompts, SEEDED, ends_early=True))["seeded"] == alone
    other = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, random_seed=99)
    assert generated(split_engine, {"other": (prompts[0], other)})["other"] != alone


def test_seeded_sampling_in_the_unified_cache_does_not_depend_on_sequences_that_run_on(engine, reference):
    """The unified cache's guarantee is narrower (docs/configuration.md): when another sequence
    ends and its cells are freed while this one runs, llama.cpp's logits for this one change
    (measured up to 0.25 in a log probability, from the 7th token), so its draws may too. While
    the others run on, the seeded request's tokens are those it gets alone: its own RNG, not one
    the batch shares (the crowd draws with other seeds every step)."""
    prompts = [tokens(reference, p) for p in PROMPTS]
    alone = generated(engine, {"alone": (prompts[0], SEEDED)})["alone"]
    assert generated(engine, crowd(prompts, SEEDED, ends_early=False))["seeded"] == alone
    assert generated(engine, {"again": (prompts[0], SEEDED)})["again"] == alone


def test_top_k_one_is_greedy_and_end_id_ends(engine, reference):
    prompt = tokens(reference, PROMPTS[2])
    greedy = generated(engine, {"g": (prompt, SamplingParams(max_tokens=10))})["g"]
    assert generated(engine, {"k": (prompt, SamplingParams(max_tokens=10, temperature=1.5, top_k=1))})["k"] == greedy
    end = greedy[4]
    stopped = generated(engine, {"e": (prompt, SamplingParams(max_tokens=10, end_id=end))})["e"]
    assert stopped == greedy[: greedy.index(end) + 1]


def test_repetition_penalty_changes_greedy_output_as_llama_cpp_does(engine, reference):
    prompt = tokens(reference, PROMPTS[5])
    penalized = SamplingParams(max_tokens=16, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3)
    got = generated(engine, {"p": (prompt, penalized)})["p"]
    # The same samplers one sequence at a time in llama-cpp-python: penalties over prompt and output.
    reference.reset()
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_penalties(
        reference.n_vocab(), 4096, 1.5, 0.3, 0.5))
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
    for token in prompt:
        llama_cpp.llama_sampler_accept(sampler, token)
    reference.eval(prompt)
    expected = []
    for _ in range(16):
        token = llama_cpp.llama_sampler_sample(sampler, reference.ctx, -1)
        expected.append(token)
        if llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(reference.model), token):
            break
        reference.eval([token])
    llama_cpp.llama_sampler_free(sampler)
    assert got == expected
    assert got != generated(engine, {"g": (prompt, SamplingParams(max_tokens=16))})["g"]


def test_min_tokens_and_bad_words(engine, reference):
    prompt = tokens(reference, "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n")
    short = generated(engine, {"s": (prompt, SamplingParams(max_tokens=40))})["s"]
    assert short[-1] in engine.eos_token_ids and len(short) < 20
    held = generated(engine, {"m": (prompt, SamplingParams(max_tokens=40, min_tokens=len(short) + 5))})["m"]
    assert len(held) >= len(short) + 5 and not set(held[: len(short) + 4]) & engine.eos_token_ids
    first, second = short[0], short[1]
    banned = generated(engine, {"b": (prompt, SamplingParams(max_tokens=12, bad_words=((first,),)))})["b"]
    assert first not in banned
    pair = generated(engine, {"p": (prompt, SamplingParams(max_tokens=12, bad_words=((first, second),)))})["p"]
    assert pair[0] == first and pair[1] != second


def test_guided_json_output_parses(engine, reference):
    prompt = tokens(reference, "<|im_start|>user\nDescribe a cat as JSON.<|im_end|>\n<|im_start|>assistant\n")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    params = SamplingParams(max_tokens=60, guided_decoding=GuidedDecoding("json_schema", json.dumps(schema)))
    engine.check_params(params)
    out = generated(engine, {"j": (prompt, params)})["j"]
    assert out[-1] in engine.eos_token_ids
    value = json.loads(reference.detokenize(out[:-1]).decode())
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


def test_a_guide_that_does_not_compile_is_refused_by_name(engine):
    with pytest.raises(InvalidInput, match="guided_decoding_guide: regex does not compile"):
        engine.check_params(SamplingParams(max_tokens=4, guided_decoding=GuidedDecoding("regex", "(unclosed")))


def test_cancelling_frees_the_sequences_kv_cells_and_others_go_on(engine, reference):
    prompt = tokens(reference, PROMPTS[5])
    engine.add("long", prompt, SamplingParams(max_tokens=1000))
    seen = 0
    while seen < 5:
        seen += sum(len(o.token_ids) for o in engine.outputs(0.05) if o.request_id == "long")
    held = engine.kv_cache_blocks()
    assert held >= len(prompt) + 4 and engine.memory_cells() >= len(prompt) + 4
    engine.cancel("long")
    after = generated(engine, {"next": (prompt, SamplingParams(max_tokens=6))})
    assert len(after["next"]) == 6
    wait_until_empty(engine)  # llama.cpp's memory holds no cell of either
    assert not [o for o in engine.outputs(0.2) if o.request_id == "long"]


def test_requests_added_together_start_together_while_running_ones_go_on(engine, reference):
    """Inside adding_together the engine takes no new request (without it, the first add would
    start a step alone and the rest would wait that step out), what already runs keeps generating,
    and a request cancelled inside the block never starts; on leaving the block the others start
    in one step."""
    prompts = [tokens(reference, p) for p in PROMPTS[:4]]
    engine.add("running", prompts[0], SamplingParams(max_tokens=1000, min_tokens=1000))
    try:
        while not any(o.request_id == "running" and o.token_ids for o in engine.outputs(0.05)):
            pass
        with engine.adding_together():
            engine.add("first", prompts[1], SamplingParams(max_tokens=4))
            engine.add("cancelled", prompts[3], SamplingParams(max_tokens=1000, min_tokens=1000))
            engine.cancel("cancelled")
            seen, running_tokens = [], 0
            opened, deadline = time.monotonic(), time.monotonic() + 30
            # Open long enough for a short prompt's prefill (~30 ms here) and 3 steps of the running one.
            while running_tokens < 3 or time.monotonic() - opened < 0.5:
                assert time.monotonic() < deadline, running_tokens
                outputs = engine.outputs(0.05)
                seen += outputs
                running_tokens += sum(len(o.token_ids) for o in outputs if o.request_id == "running")
            engine.add("second", prompts[2], SamplingParams(max_tokens=4))
        assert not [o for o in seen if o.request_id == "first"]
        firsts = {}  # request -> the outputs() call that brought its first token
        call, deadline = 0, time.monotonic() + 30
        while len(firsts) < 2:
            assert time.monotonic() < deadline, firsts
            call += 1
            for output in engine.outputs(0.01):
                if output.request_id in ("first", "second") and output.token_ids:
                    firsts.setdefault(output.request_id, call)
        assert firsts["first"] == firsts["second"]
    finally:
        engine.cancel("running")
    # Had the cancelled request started, its 1000 tokens would hold cells for many seconds.
    wait_until_empty(engine, timeout=3)


def test_requests_beyond_the_cache_wait_for_cells_instead_of_failing(engine, reference):
    # Each reserves prompt + max_tokens = half the cells: the third waits until one of the first two ends.
    prompt = tokens(reference, " ".join(f"item {i}," for i in range(330)))
    params = SamplingParams(max_tokens=KV_CELLS // 2 - len(prompt), min_tokens=KV_CELLS // 2 - len(prompt))
    assert 2 * len(prompt) < KV_CELLS < 3 * len(prompt)
    for rid in ("r0", "r1", "r2"):
        engine.add(rid, prompt, params)
    counts, started_before_an_end = {"r0": 0, "r1": 0, "r2": 0}, None
    deadline = time.monotonic() + 300
    while any(count < params.max_tokens for count in counts.values()):
        assert time.monotonic() < deadline, counts
        for output in engine.outputs(0.05):
            assert output.error is None, output.error
            counts[output.request_id] += len(output.token_ids)
            if output.finished and started_before_an_end is None:
                started_before_an_end = {rid for rid, count in counts.items() if count}
    assert len(started_before_an_end) == 2  # the third was admitted only when cells came back
    wait_until_empty(engine)


def test_a_prompt_longer_than_the_context_is_refused_naming_the_limit(engine):
    with pytest.raises(InvalidInput, match=f"input_ids: {KV_CELLS + 10} prompt tokens leave no room .* context of "
                                           f"{KV_CELLS} tokens"):
        engine.add("too-long", [100] * (KV_CELLS + 10), SamplingParams(max_tokens=1))
    with pytest.raises(InvalidInput, match=r"max_tokens: 5000 is outside 1\.\.4086"):
        engine.add("too-many", [100] * 10, SamplingParams(max_tokens=5000))
    with pytest.raises(InvalidInput, match="input_ids: is empty"):
        engine.add("empty", [], SamplingParams(max_tokens=1))


def test_what_the_engine_cannot_do_is_refused_by_name(gguf):
    with pytest.raises(ValueError, match="dtype: the llama_cpp engine computes in the GGUF's own types"):
        create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu",
                      EngineConfig(dtype="bfloat16", gguf_file=str(gguf)))
    with pytest.raises(ValueError, match="max_num_seqs: 100000 is more than llama.cpp's limit"):
        create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu",
                      EngineConfig(max_num_seqs=100000, gguf_file=str(gguf)))
    with pytest.raises(ValueError, match="runs on CPU instances"):
        create_engine("llama_cpp", model_sources.llm_model_dir(), "cuda:0", EngineConfig(gguf_file=str(gguf)))


def test_the_engine_is_built_on_a_thread_that_has_ended(gguf, monkeypatch):
    """Its warm-up decode starts an OpenMP pool on the thread that builds it; that thread must be
    gone before the engine computes, or each decode on the engine thread runs beside a second pool
    (2-3x slower on 2 cores: engines/__init__.py)."""
    import threading

    from tritonfront.engines.llama_cpp import LlamaCppEngine

    warmed_on = []
    original = LlamaCppEngine._warm_up
    monkeypatch.setattr(LlamaCppEngine, "_warm_up", lambda self: (warmed_on.append(threading.current_thread()),
                                                                  original(self)))
    built = create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu",
                          EngineConfig(kv_cache_tokens=1024, max_num_seqs=2, num_threads=2, gguf_file=str(gguf)))
    try:
        (builder,) = warmed_on
        assert builder is not threading.current_thread() and not builder.is_alive()
        assert len(generated(built, {"after": ([100, 200, 300], SamplingParams(max_tokens=3))})["after"]) >= 1
    finally:
        built.shutdown()

"""The llama.cpp engine on the bundled GGUF, against llama-cpp-python's own single-sequence
generation (greedy) and the logits its context computes.

In the slots (each sequence attending over its own cells, as llama-cpp-python's one sequence
does) greedy ids equal the reference's alone and in a batch, log probs are the log-softmax of the
logits llama.cpp computes, and seeded sampling does not depend on the batch. In the pool (one
unified cache) llama.cpp's floating point depends on what shares the cache and the batch
(docs/design.md, "The llama_cpp engine's floating point, and the tests' tolerance"): there a greedy run is compared with the
reference within a stated tolerance, equal token for token until the reference itself had a near
tie (NEAR_TIE), its log probs within LOG_PROB_TOLERANCE. The pool serves a 6,000-token prompt,
serves requests that together exceed it (they wait or are preempted, none is cut short), reuses a
kept prefix (counted) and evicts kept prefixes least recently used first; every ended or
cancelled sequence's KV cells go back but those kept (asked of llama.cpp's memory itself). What
the engine cannot do, or a request that does not fit the context, is refused by name. Prompts are
not the tests' fixtures (harness.corpora.PROMPTS)."""
import json
import math
import time

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (scripts/setup.sh builds it)")

from harness.engine_runs import generated, run  # noqa: E402
from harness.references import (assert_greedy_within_tolerance, llama_cpp_greedy_reference,  # noqa: E402
                                llama_cpp_reference, llama_cpp_scored_greedy)
from tritonfront.core import model_sources  # noqa: E402
from tritonfront.engines import EngineConfig, EngineOutput, SamplingParams, create_engine  # noqa: E402
from tritonfront.engines.base import GuidedDecoding  # noqa: E402
from tritonfront.errors import InvalidInput  # noqa: E402

PROMPTS = ["The chemical symbol for gold is", "A good recipe for pancakes needs", "def is_prime(n):\n",
           "In 1969, the first person to walk on the moon was", "My favourite season is autumn because",
           "Ten green bottles hanging on the wall,"]
POOL_CELLS = 4096
SLOT_CELLS = 256
SLOTS = 8
# A system prompt of ~330 tokens: past a slot, so requests that start with it run in the pool.
SYSTEM = " ".join(f"Rule {i}: answer briefly and politely." for i in range(40))


@pytest.fixture(scope="module")
def gguf():
    return model_sources.llm_gguf_file()


def make_engine(gguf, **settings):
    config = dict(kv_cache_tokens=POOL_CELLS, kv_slot_tokens=SLOT_CELLS, max_num_seqs=SLOTS, num_threads=2,
                  gguf_file=str(gguf))
    config.update(settings)
    return create_engine("llama_cpp", model_sources.llm_model_dir(), "cpu", EngineConfig(**config))


@pytest.fixture(scope="module")
def engine(gguf):
    """Slots and a pool, as deployed (scripts/configure.py), smaller."""
    engine = make_engine(gguf)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def pool_engine(gguf):
    """No slots: every request in a pool of 2,048 cells."""
    engine = make_engine(gguf, kv_cache_tokens=2048, kv_slot_tokens=0)
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
    """Until no sequence runs and llama.cpp's memory holds only the prefixes kept for reuse."""
    deadline = time.monotonic() + timeout
    while engine.kv_cache_blocks() or engine.memory_cells() != engine.cached_cells():
        assert time.monotonic() < deadline, (engine.kv_cache_blocks(), engine.memory_cells(), engine.cached_cells())
        engine.outputs(0.05)


def test_the_engine_reports_the_models_facts(engine, reference):
    assert engine.vocab_size == reference.n_vocab() == 49152
    assert engine.context_length == POOL_CELLS  # the pool's, below the model's training context of 8192
    assert engine.slot_tokens == SLOT_CELLS
    assert engine.kv_cache_capacity_blocks() == POOL_CELLS + SLOTS * SLOT_CELLS
    assert 2 in engine.eos_token_ids  # <|im_end|>, the chat template's end


def test_greedy_in_slots_alone_and_in_a_batch_equals_llama_cpp_pythons_generate(engine, reference):
    prompts = [tokens(reference, p) for p in PROMPTS]
    expected = [reference_greedy(ids, 24) for ids in prompts]
    alone = [generated(engine, {"a": (ids, SamplingParams(max_tokens=24))})["a"] for ids in prompts]
    assert alone == expected
    together = generated(engine, {f"b{i}": (ids, SamplingParams(max_tokens=24)) for i, ids in enumerate(prompts)})
    assert [together[f"b{i}"] for i in range(len(prompts))] == expected
    wait_until_empty(engine)


def test_a_prompt_longer_than_a_batch_is_fed_in_chunks_in_the_pool(engine, reference):
    # 512 tokens per step by default: a ~1400-token prompt takes three steps (and fits the
    # reference's context of 2048) in the pool, while a short request runs in a slot beside it.
    long_prompt = tokens(reference, " ".join(f"item {i}," for i in range(250)))
    assert 1024 < len(long_prompt) < 2048 - 8
    got = run(engine, {"long": (long_prompt, SamplingParams(max_tokens=8, return_log_probs=True)),
                       "short": (tokens(reference, PROMPTS[0]), SamplingParams(max_tokens=30))})
    assert_greedy_within_tolerance(got["long"], llama_cpp_scored_greedy(long_prompt, 8))
    wait_until_empty(engine)


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


def recording_decodes(monkeypatch):
    """Each llama_decode's (seq_id, position) pairs, and the context it ran on."""
    from tritonfront.engines import llama_cpp as engine_module

    steps = []
    decode = engine_module.llama.llama_decode

    def recording(ctx, batch):
        steps.append((ctx.value if hasattr(ctx, "value") else ctx,
                      [(batch.seq_id[i][0], batch.pos[i]) for i in range(batch.n_tokens)]))
        return decode(ctx, batch)

    monkeypatch.setattr(engine_module.llama, "llama_decode", recording)
    return steps


def slot_steps(engine, steps) -> list[list[tuple[int, int]]]:
    context = engine._slot_context.ctx
    key = context.value if hasattr(context, "value") else context
    return [fed for ctx, fed in steps if ctx == key]


def test_slots_are_fed_in_seq_id_order_and_new_sequences_take_the_lowest_free_ones(gguf, reference, monkeypatch):
    """In the slots llama.cpp runs a batch as one forward pass per run of consecutive seq_ids in
    batch order (llama_batch_allocr::split_equal): the batch must list the sequences in seq_id
    order, and the ids must stay compact as sequences end and others start, whatever the ended
    ones keep."""
    slotted = make_engine(gguf)
    try:
        steps = recording_decodes(monkeypatch)
        prompts = [tokens(reference, p) for p in PROMPTS]
        # Ten requests on 8 slots, the first six ending after 2..7 tokens: the last two start on the
        # slots the first ones gave back, while the others run on.
        requests = {f"a{i}": (ids, SamplingParams(max_tokens=2 + i)) for i, ids in enumerate(prompts)}
        requests.update({f"b{i}": (prompts[i % len(prompts)], SamplingParams(max_tokens=6)) for i in range(4)})
        generated(slotted, requests)
        fed = [[seq_id for seq_id, _ in step] for step in slot_steps(slotted, steps)]
        assert fed and all(ids == sorted(ids) for ids in fed), fed
        used = sorted({i for ids in fed for i in ids})
        assert used == list(range(len(used))) and len(used) <= SLOTS, used
    finally:
        slotted.shutdown()


def test_a_slot_keeps_an_ended_prompt_for_the_next_request_there_and_another_slot_copies_it(gguf, reference,
                                                                                           monkeypatch):
    """A finished sequence's slot keeps what it held; the next request on that slot is fed only
    what follows the prefix they share, and one on another slot gets it copied (a whole slot is
    copied, then trimmed). Both generate what llama-cpp-python generates from the whole prompt,
    within tolerance: the rest of the prompt is fed apart from its prefix. A cancelled sequence
    keeps what it was fed the same way; with prompt_cache false nothing stays."""
    slotted = make_engine(gguf, max_num_seqs=2)
    try:
        steps = recording_decodes(monkeypatch)
        base = tokens(reference, PROMPTS[4] + " the leaves turn red and gold and the air smells of rain")
        longer = base + tokens(reference, " and the days grow short")
        assert 16 < len(base) < len(longer) < SLOT_CELLS - 16
        first = generated(slotted, {"first": (base, SamplingParams(max_tokens=5))})["first"]
        assert first == reference_greedy(base, 5)
        held = len(base) + len(first) - 1  # the last generated token is never fed
        assert slotted.cached_cells() == held == slotted.memory_cells()
        queries, hits = slotted.prefix_cache_tokens()
        steps.clear()
        second = run(slotted, {"second": (longer, SamplingParams(max_tokens=8, return_log_probs=True))})["second"]
        assert slot_steps(slotted, steps)[0] == [(0, p) for p in range(len(base), len(longer))]  # the rest only
        assert_greedy_within_tolerance(second, llama_cpp_scored_greedy(longer, 8))
        assert slotted.prefix_cache_tokens() == (queries + len(longer), hits + len(base))
        # Slot 0 keeps `longer` now. A request that extends it runs there (in place); the next one
        # goes to slot 1 and gets the prefix copied from slot 0, which runs on.
        slotted.add("running", longer + [7], SamplingParams(max_tokens=400, min_tokens=400))
        while not any(o.request_id == "running" and o.token_ids for o in slotted.outputs(0.05)):
            pass
        steps.clear()
        slotted.add("third", longer + [13], SamplingParams(max_tokens=4, return_log_probs=True))
        third = EngineOutput("third")
        while not third.finished:
            for output in slotted.outputs(0.05):
                if output.request_id == "third":
                    third.token_ids += output.token_ids
                    third.log_probs += output.log_probs
                    third.finished = output.finished
        assert [position for seq_id, position in slot_steps(slotted, steps)[0] if seq_id == 1] == [len(longer)]
        assert_greedy_within_tolerance(third, llama_cpp_scored_greedy(longer + [13], 4))
        slotted.cancel("running")
        wait_until_empty(slotted)
    finally:
        slotted.shutdown()
    uncached = make_engine(gguf, max_num_seqs=2, prompt_cache=False)
    try:
        assert generated(uncached, {"first": (base, SamplingParams(max_tokens=5))})["first"] == first
        wait_until_empty(uncached)
        assert uncached.cached_cells() == 0 == uncached.memory_cells()
        assert uncached.prefix_cache_tokens() == (0, 0)
    finally:
        uncached.shutdown()


SEEDED = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, random_seed=2**40 + 7)


def test_seeded_sampling_in_slots_does_not_depend_on_the_batch(engine, reference):
    """Six sampled requests beside it, each with its own seed, stopping after 3..8 tokens: the
    seeded request's tokens are those it gets alone (its own RNG, and its own cells)."""
    prompts = [tokens(reference, p) for p in PROMPTS]
    alone = generated(engine, {"alone": (prompts[0], SEEDED)})["alone"]
    crowd = {f"c{i}": (ids, SamplingParams(max_tokens=3 + i, temperature=0.8, random_seed=i))
             for i, ids in enumerate(prompts)}
    crowd["seeded"] = (prompts[0], SEEDED)
    assert generated(engine, crowd)["seeded"] == alone
    other = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, random_seed=99)
    assert generated(engine, {"other": (prompts[0], other)})["other"] != alone


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


@pytest.mark.parametrize("where", ["slot", "pool"])
def test_cancelling_frees_the_sequences_kv_cells_and_others_go_on(engine, reference, where):
    prompt = tokens(reference, PROMPTS[5] if where == "slot" else SYSTEM + PROMPTS[5])
    assert (len(prompt) < SLOT_CELLS) == (where == "slot")
    engine.add("long", prompt, SamplingParams(max_tokens=1000))
    seen = 0
    while seen < 5:
        seen += sum(len(o.token_ids) for o in engine.outputs(0.05) if o.request_id == "long")
    held = engine.kv_cache_blocks()
    assert held >= len(prompt) + 4 and engine.memory_cells() >= len(prompt) + 4
    engine.cancel("long")
    after = generated(engine, {"next": (prompt, SamplingParams(max_tokens=6))})
    assert len(after["next"]) == 6
    wait_until_empty(engine)  # llama.cpp's memory holds no cell of either but those kept
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


def test_the_pool_takes_a_prompt_of_most_of_the_context_beside_a_slot_request(gguf, reference):
    """The pool is the model's whole context (8192) with kv_cache_tokens 0: a 6000-token prompt is
    admitted and starts its prefill in chunks while a short request runs whole in a slot beside
    it; cancelled mid-prefill, its cells are freed; max_tokens past the context is refused naming
    it. (tests/integration/test_llama_cpp.py serves a 6000-token prompt whole through the server:
    its prefill alone took 40-80 s here, and one run of it is enough.)"""
    big = make_engine(gguf, kv_cache_tokens=0, max_num_seqs=2)
    try:
        assert big.context_length == 8192
        prompt = tokens(reference, " ".join(f"line {i}: the quick brown fox." for i in range(800)))[:6000]
        assert len(prompt) == 6000
        with pytest.raises(InvalidInput, match=r"max_tokens: 2200 is outside 1\.\.2192 \(context of 8192 tokens"):
            big.add("over", prompt, SamplingParams(max_tokens=2200))
        big.add("big", prompt, SamplingParams(max_tokens=8, min_tokens=8))
        # One token a step beside a 512-token chunk of the prefill: 2 tokens end it well before the
        # prefill does.
        big.add("small", tokens(reference, PROMPTS[3]), SamplingParams(max_tokens=2))
        small, big_outputs, deadline = [], [], time.monotonic() + 180
        while not small or not small[-1].finished:
            assert time.monotonic() < deadline, "the slot request did not finish beside the prefill"
            for output in big.outputs(0.05):
                assert output.error is None, output.error
                (small if output.request_id == "small" else big_outputs).append(output)
        assert sum(len(output.token_ids) for output in small) == 2
        assert not big_outputs  # still in its prefill
        assert big.kv_cache_blocks() > 0  # the big prompt holds cells
        big.cancel("big")
        wait_until_empty(big)
    finally:
        big.shutdown()


@pytest.mark.timeout(1800)  # 1,200 tokens and the recomputed ones
def test_requests_that_together_exceed_the_pool_all_complete_whole(pool_engine, reference):
    """Eight requests of ~200 prompt tokens and 150 generated in a pool of 2,048 cells: they need
    2,800. Admission waits for cells and the pool preempts the newest when a step does not fit;
    every request gets all its tokens, each greedy run equal to the reference's within tolerance
    (preempted ones are fed their prompt and tokens again)."""
    prompts = [tokens(reference, f"{SYSTEM[:800]} Question {i}: what is {i} times {i + 3}?") for i in range(8)]
    assert all(180 < len(p) < 260 for p in prompts)
    preempted_before = pool_engine.preemptions
    out = run(pool_engine, {f"r{i}": (p, SamplingParams(max_tokens=150, min_tokens=150, return_log_probs=True))
                            for i, p in enumerate(prompts)}, timeout=900)
    assert [len(out[f"r{i}"].token_ids) for i in range(8)] == [150] * 8
    assert pool_engine.preemptions > preempted_before
    for i in (0, 7):  # the first admitted, and the last
        assert_greedy_within_tolerance(out[f"r{i}"], llama_cpp_scored_greedy(prompts[i], 150, min_tokens=150))
    wait_until_empty(pool_engine)


def test_a_kept_prefix_is_shared_counted_and_gives_the_fresh_text(gguf, reference):
    """A request's cells stay in the pool when it ends; a later request that starts with the same
    system prompt shares them (one copy of the prefix), is fed only its own question, counts the
    shared tokens as hits, and generates what llama-cpp-python generates from the whole prompt,
    within tolerance."""
    pooled = make_engine(gguf, kv_cache_tokens=2048, kv_slot_tokens=0, max_num_seqs=2)
    try:
        system = tokens(reference, SYSTEM)
        first = system + tokens(reference, " Question: name a red fruit.")
        second = system + tokens(reference, " Question: name a yellow fruit.")
        run(pooled, {"first": (first, SamplingParams(max_tokens=6))})
        wait_until_empty(pooled)
        cells_before = pooled.memory_cells()
        queries, hits = pooled.prefix_cache_tokens()
        out = run(pooled, {"second": (second, SamplingParams(max_tokens=12, return_log_probs=True))})["second"]
        new_queries, new_hits = pooled.prefix_cache_tokens()
        shared = new_hits - hits
        assert new_queries - queries == len(second)
        assert len(system) <= shared < len(second)
        assert_greedy_within_tolerance(out, llama_cpp_scored_greedy(second, 12))
        wait_until_empty(pooled)
        # Both kept, the system prompt's cells once: the second added only what it computed itself
        # (the last generated token is never fed).
        fed = len(second) + len(out.token_ids) - 1
        assert pooled.memory_cells() - cells_before == fed - shared
    finally:
        pooled.shutdown()


def test_kept_prefixes_are_evicted_least_recently_used_first(gguf, reference):
    """Four ended requests' prompts of ~400 tokens fill most of a pool of 2,048 cells; the first is
    used again (refreshed); a request of ~1,000 tokens needs room and evicts the least recently
    used: the refreshed prompt still hits, the oldest unused one no longer does."""
    small = make_engine(gguf, kv_cache_tokens=2048, kv_slot_tokens=0, max_num_seqs=2)
    try:
        prompts = [tokens(reference, f"Topic {i}. {SYSTEM}") for i in range(4)]
        assert all(350 < len(p) < 450 for p in prompts)
        for i, prompt in enumerate(prompts):
            generated(small, {f"p{i}": (prompt, SamplingParams(max_tokens=2))})
        generated(small, {"again": (prompts[0], SamplingParams(max_tokens=2))})  # refreshes prompt 0

        def hit(prompt) -> int:
            before = small.prefix_cache_tokens()[1]
            generated(small, {"probe": (prompt, SamplingParams(max_tokens=1))})
            return small.prefix_cache_tokens()[1] - before

        big = tokens(reference, " ".join(f"entry {i} of a long list" for i in range(120)))
        assert 900 < len(big) < 1100
        generated(small, {"big": (big, SamplingParams(max_tokens=2))})  # needs room: two prompts must go
        assert hit(prompts[0]) >= len(prompts[0]) - 1  # refreshed: kept
        assert hit(prompts[1]) < 32  # the least recently used: evicted (the words "Topic 1." alone differ)
        wait_until_empty(small)
    finally:
        small.shutdown()


def test_a_sequence_that_outgrows_its_slot_moves_to_the_pool(engine, reference):
    prompt = tokens(reference, PROMPTS[3])
    moved_before = engine.preemptions
    out = run(engine, {"grows": (prompt, SamplingParams(max_tokens=SLOT_CELLS, min_tokens=SLOT_CELLS,
                                                        return_log_probs=True))})["grows"]
    assert len(out.token_ids) == SLOT_CELLS and engine.preemptions == moved_before + 1
    # Fed again in the pool from its tokens: what follows equals the reference within tolerance.
    assert_greedy_within_tolerance(out, llama_cpp_scored_greedy(prompt, SLOT_CELLS, min_tokens=SLOT_CELLS))
    wait_until_empty(engine)


def test_a_prompt_longer_than_the_context_is_refused_naming_the_limit(engine):
    with pytest.raises(InvalidInput, match=f"input_ids: {POOL_CELLS + 10} prompt tokens leave no room .* context of "
                                           f"{POOL_CELLS} tokens"):
        engine.add("too-long", [100] * (POOL_CELLS + 10), SamplingParams(max_tokens=1))
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
    with pytest.raises(ValueError, match="kv_slot_tokens: 4096 is more than the pool's 1024 cells"):
        make_engine(gguf, kv_cache_tokens=1024, kv_slot_tokens=4096)
    with pytest.raises(ValueError, match="runs on CPU instances"):
        create_engine("llama_cpp", model_sources.llm_model_dir(), "cuda:0", EngineConfig(gguf_file=str(gguf)))


def test_the_engine_is_built_on_a_thread_that_has_ended(gguf, monkeypatch):
    """Its warm-up decodes start an OpenMP pool on the thread that builds it; that thread must be
    gone before the engine computes, or each decode on the engine thread runs beside a second pool
    (2-3x slower on 2 cores: engines/__init__.py)."""
    import threading

    from tritonfront.engines.llama_cpp import _Context

    warmed_on = []
    original = _Context.warm_up
    monkeypatch.setattr(_Context, "warm_up", lambda self, token: (warmed_on.append(threading.current_thread()),
                                                                  original(self, token)))
    built = make_engine(gguf, kv_cache_tokens=1024, kv_slot_tokens=256, max_num_seqs=2)
    try:
        assert len(warmed_on) == 2 and len(set(warmed_on)) == 1  # the pool and the slots
        (builder,) = set(warmed_on)
        assert builder is not threading.current_thread() and not builder.is_alive()
        assert len(generated(built, {"after": ([100, 200, 300], SamplingParams(max_tokens=3))})["after"]) >= 1
    finally:
        built.shutdown()



def test_a_single_token_step_leaves_a_core_unless_told_otherwise(engine, gguf, reference):
    """single_token_threads is llama.cpp's n_threads (a ubatch of one token: a lone sequence
    generating), num_threads its n_threads_batch (every larger ubatch). 0 leaves one core to the
    front end; the greedy tests above run on that split (alone: one thread; together: two)."""
    from tritonfront.engines import llama_cpp as engine_module

    def split(built):
        llama = engine_module.llama
        return [(llama.llama_n_threads(context.ctx), llama.llama_n_threads_batch(context.ctx))
                for context in built._contexts]

    assert split(engine) == [(1, 2), (1, 2)]  # the pool and the slots, num_threads 2
    built = make_engine(gguf, kv_cache_tokens=1024, kv_slot_tokens=0, max_num_seqs=2, single_token_threads=2)
    try:
        assert split(built) == [(2, 2)]
        ids = tokens(reference, PROMPTS[0])
        assert generated(built, {"a": (ids, SamplingParams(max_tokens=8))})["a"] == reference_greedy(ids, 8)
    finally:
        built.shutdown()

"""The synthetic engine on the bundled LLM's tokenizer: its ids are real vocabulary (text that decodes,
multi-byte characters whole and split over tokens), a deterministic function of the request (prompt,
seed) and the position, alone or beside others; steps keep their configured cadence while the engine
thread sleeps; max_tokens, min_tokens, end ids, EOS emission, bad words, log probs, cancellation,
waiting beyond max_num_seqs and the KV reservation do what they say; what it cannot honour and bad
parameters are refused by name."""
import dataclasses
import math
import threading
import time

import numpy as np
import pytest

from harness.engine_runs import generated, run
from harness.model_tokenizers import llm_tokenizer
from tritonfront.core import model_sources
from tritonfront.core.model_config import ConfigError, parse
from tritonfront.engines import EngineConfig, SamplingParams, create_engine
from tritonfront.engines.base import GuidedDecoding
from tritonfront.engines.synthetic import SyntheticEngine, SyntheticVocabulary
from tritonfront.errors import InvalidInput

FAST = EngineConfig(max_num_seqs=64, kv_cache_tokens=0, synthetic_step_ms=1)
SAMPLED = dict(temperature=1.0, top_p=0.9)


@pytest.fixture(scope="module")
def vocabulary():
    return SyntheticVocabulary.from_folder(model_sources.llm_model_dir())


@pytest.fixture
def start(vocabulary):
    """Engines on the shared vocabulary, shut down after the test."""
    engines = []

    def started(config: EngineConfig = FAST) -> SyntheticEngine:
        engines.append(SyntheticEngine(vocabulary, config))
        return engines[-1]

    yield started
    for engine in engines:
        engine.shutdown()


@pytest.fixture
def engine(start):
    return start()


def prompt(text: str) -> list[int]:
    return llm_tokenizer()(text).input_ids


def events(engine, requests: dict, timeout: float = 60) -> list:
    """(request id, token ids, finished) of every output in the order the engine gave them."""
    for rid, (ids, params) in requests.items():
        engine.add(rid, ids, params)
    seen, done, deadline = [], set(), time.monotonic() + timeout
    while len(done) < len(requests):
        assert time.monotonic() < deadline, f"unfinished: {set(requests) - done}"
        for output in engine.outputs(0.05):
            assert output.error is None, output.error
            seen.append((output.request_id, output.token_ids, output.finished))
            done |= {output.request_id} if output.finished else set()
    return seen


def test_the_engine_reports_the_tokenizers_facts(engine, vocabulary):
    tokenizer = llm_tokenizer()
    assert engine.vocab_size == len(tokenizer) == 49152
    assert tokenizer.eos_token_id in engine.eos_token_ids and 2 in engine.eos_token_ids
    assert engine.context_length == 8192  # the model's positions; kv_cache_tokens 0 does not cap them
    assert engine.kv_cache_capacity_blocks() == 64 * 8192 and engine.kv_cache_blocks() == 0
    capped = create_engine("synthetic", model_sources.llm_model_dir(), "cuda", EngineConfig(kv_cache_tokens=4096))
    try:
        assert (capped.context_length, capped.kv_cache_capacity_blocks()) == (4096, 4096)
    finally:
        capped.shutdown()


def test_every_unit_is_text_and_multi_byte_characters_come_whole_and_split(vocabulary):
    fast = llm_tokenizer().backend_tokenizer
    units = [[i for i in row if i >= 0] for row in vocabulary.units.tolist()]
    texts = fast.decode_batch(units, skip_special_tokens=True)
    assert all(text and "\ufffd" not in text for text in texts)
    special = set(llm_tokenizer().all_special_ids) | vocabulary.eos_token_ids
    assert not special & {i for unit in units for i in unit}
    whole = [text for unit, text in zip(units, texts) if len(unit) == 1 and len(text.encode()) > len(text)]
    split = [(unit, text) for unit, text in zip(units, texts) if len(unit) > 1]
    assert len(whole) > 100 and len(split) > 100, (len(whole), len(split))
    # A split character's tokens are not text on their own: the detokenizer must hold them back.
    assert all(any("\ufffd" in fast.decode([i]) for i in unit) for unit, _ in split)
    assert {len(text) for _, text in split} == {1}


def test_long_outputs_decode_to_valid_text_with_split_characters(engine, vocabulary):
    ids = generated(engine, {"long": (prompt("Write a long story."), SamplingParams(max_tokens=3000))})["long"]
    assert len(ids) == 3000
    text = llm_tokenizer().decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in text
    split_starts = {int(row[0]) for row in vocabulary.units if row[1] >= 0}
    assert sum(i in split_starts for i in ids) >= 5
    assert sum(len(c.encode()) > 1 for c in text) >= 20


def test_ids_depend_on_the_request_alone(engine):
    p = prompt("The synthetic engine emits")
    greedy = SamplingParams(max_tokens=40)
    seeded = SamplingParams(max_tokens=40, random_seed=2**63 + 5, **SAMPLED)
    alone = generated(engine, {"g": (p, greedy), "s": (p, seeded)})
    assert alone["g"] != alone["s"]
    # Beside 40 others (other prompts, seeds, lengths, some ending early), admitted before and after.
    crowd = {f"c{i}": (prompt(f"Request number {i}"), SamplingParams(max_tokens=5 + i, random_seed=i, **SAMPLED))
             for i in range(40)}
    together = generated(engine, {**dict(list(crowd.items())[:20]), "g": (p, greedy), "s": (p, seeded),
                                  **dict(list(crowd.items())[20:])})
    assert together["g"] == alone["g"] and together["s"] == alone["s"]
    # Greedy: the prompt decides (a seed or temperature 0 changes nothing); another prompt differs.
    assert generated(engine, {"t": (p, SamplingParams(max_tokens=40, temperature=0.0, random_seed=9))})["t"] == alone["g"]
    assert generated(engine, {"o": (p + [p[-1]], greedy)})["o"] != alone["g"]
    # Sampled: the seed decides; another seed, or none, differs.
    other_seed = dataclasses.replace(seeded, random_seed=7)
    unseeded = dataclasses.replace(seeded, random_seed=None)
    again = generated(engine, {"s": (p, seeded), "o": (p, other_seed), "u1": (p, unseeded), "u2": (p, unseeded)})
    assert again["s"] == alone["s"] and len({tuple(again[k]) for k in ("s", "o", "u1", "u2")}) == 4


def test_a_stream_is_one_token_per_step_on_a_steady_cadence(start):
    engine = start(dataclasses.replace(FAST, synthetic_step_ms=10))
    times = {}
    requests = {f"r{i}": (prompt(f"cadence {i}"), SamplingParams(max_tokens=40)) for i in range(4)}
    for rid, (ids, params) in requests.items():
        engine.add(rid, ids, params)
    started = time.monotonic()
    while len(times.get("r0", [])) < 40:
        for output in engine.outputs(0.5):
            assert len(output.token_ids) == 1
            times.setdefault(output.request_id, []).append(time.monotonic())
        assert time.monotonic() - started < 10
    # Never faster than the step, and on a busy shared machine not much slower on average.
    elapsed = times["r0"][-1] - started
    assert 0.39 <= elapsed < 0.40 * 1.5 + 0.1, elapsed
    gaps = np.diff(times["r0"])
    assert np.median(gaps) == pytest.approx(0.010, abs=0.003), gaps


def test_steps_last_longer_per_sequence_and_per_prompt_token(start):
    # 20 sequences at 1 ms + 2 ms each: 41 ms a step.
    engine = start(dataclasses.replace(FAST, synthetic_step_ms=1, synthetic_step_us_per_seq=2000))
    began = time.monotonic()
    generated(engine, {f"r{i}": (prompt("per sequence"), SamplingParams(max_tokens=10)) for i in range(20)})
    assert 0.41 <= time.monotonic() - began < 0.41 * 1.5 + 0.1
    # A 200-token prompt at 1 ms per token: its first token (and its neighbour's) 201 ms in.
    engine = start(dataclasses.replace(FAST, synthetic_step_ms=1, synthetic_prefill_us_per_token=1000))
    with engine.adding_together():
        engine.add("short", [100], SamplingParams(max_tokens=1))
        engine.add("long", [100] * 200, SamplingParams(max_tokens=1))
    began, outputs = time.monotonic(), []
    while len(outputs) < 2:
        outputs += engine.outputs(1)
    assert 0.2 <= time.monotonic() - began < 0.2 * 1.5 + 0.1


def thread_cpu_seconds(thread: threading.Thread) -> float:
    """CPU time the kernel counted for a thread of this process (/proc schedstat, nanoseconds)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
        return int(stat.read().split()[0]) / 1e9


def test_the_engine_thread_sleeps_between_steps(start):
    # 256 sequences at 20 ms steps: 12,800 tokens a second. At 5 ms steps the work of a step (~0.75
    # ms) was 15% of a core on a quiet machine and 41% on a busy one, too near a spinning engine's
    # bound to tell them apart.
    engine = start(dataclasses.replace(FAST, max_num_seqs=256, synthetic_step_ms=20))
    before = thread_cpu_seconds(engine._thread)
    time.sleep(0.3)
    assert thread_cpu_seconds(engine._thread) - before < 0.005  # idle: asleep on its condition
    requests = {f"r{i}": (prompt(f"sleeping {i % 16}"), SamplingParams(max_tokens=60, random_seed=i, **SAMPLED))
                for i in range(256)}
    before, began = thread_cpu_seconds(engine._thread), time.monotonic()
    got = generated(engine, requests)
    wall = time.monotonic() - began
    cpu = thread_cpu_seconds(engine._thread) - before
    assert sum(map(len, got.values())) == 256 * 60 and wall >= 1.0
    # About 4% of a core at this step; spinning would be 100%.
    assert cpu / wall < 0.4, (cpu, wall)


def test_max_tokens_ends_with_length_and_end_ids_end_where_drawn(engine):
    p = prompt("Where does it end?")
    out = run(engine, {"m": (p, SamplingParams(max_tokens=25))})["m"]
    assert len(out.token_ids) == 25 and out.finish_reason is None  # the loop calls that "length"
    reference = out.token_ids
    end = reference[6]
    assert generated(engine, {"e": (p, SamplingParams(max_tokens=25, end_id=end))})["e"] == \
        reference[:reference.index(end) + 1]
    # min_tokens: the end id is not drawn before it (drawn again there), and ends the request after.
    held = generated(engine, {"h": (p, SamplingParams(max_tokens=25, end_id=end, min_tokens=10))})["h"]
    assert end not in held[:10] and held[:reference.index(end)] == reference[:reference.index(end)]
    assert held[-1] == end or len(held) == 25


def test_eos_every_gives_geometric_lengths_never_below_min_tokens(start, vocabulary):
    engine = start(dataclasses.replace(FAST, max_num_seqs=256, synthetic_eos_every=20))
    got = generated(engine, {f"r{i}": (prompt(f"eos {i}"), SamplingParams(max_tokens=1000)) for i in range(300)})
    lengths = np.array([len(ids) for ids in got.values()])
    assert all(ids[-1] == vocabulary.eos_id and vocabulary.eos_id not in ids[:-1] for ids in got.values())
    assert 15 < lengths.mean() < 27 and lengths.min() < 5, lengths.mean()
    held = generated(engine, {f"m{i}": (prompt(f"eos {i}"), SamplingParams(max_tokens=1000, min_tokens=12))
                              for i in range(100)})
    assert min(len(ids) for ids in held.values()) >= 13


def test_bad_words_are_drawn_again(engine):
    p = prompt("Say no bad words.")
    reference = generated(engine, {"r": (p, SamplingParams(max_tokens=60))})["r"]
    banned_token = reference[10]
    pair = (reference[20], reference[21])
    params = SamplingParams(max_tokens=60, bad_words=((banned_token,), pair))
    got = generated(engine, {"b": (p, params)})["b"]
    assert banned_token not in got
    assert all((a, b) != pair for a, b in zip(got, got[1:]))
    assert got[:10] == reference[:10] and got[10] != reference[10]


def test_log_probs_are_those_of_the_draw(engine, vocabulary):
    out = run(engine, {"l": (prompt("Log probs"), SamplingParams(max_tokens=400, return_log_probs=True))})["l"]
    drawn = -math.log(len(vocabulary.units))
    assert len(out.log_probs) == 400 and set(np.round(out.log_probs, 9)) == {round(drawn, 9), 0.0}
    assert out.top_log_probs == []


def test_a_cancelled_request_frees_its_slot_and_gets_nothing_more(start):
    engine = start(dataclasses.replace(FAST, max_num_seqs=1, synthetic_step_ms=2))
    engine.add("long", prompt("cancel me"), SamplingParams(max_tokens=5000))
    engine.add("next", prompt("then me"), SamplingParams(max_tokens=5))
    seen = []
    while len(seen) < 5:
        seen += [o.request_id for o in engine.outputs(1)]
    assert set(seen) == {"long"} and engine.kv_cache_blocks() > 0
    engine.cancel("long")
    after = []
    deadline = time.monotonic() + 10
    while "next" not in after or not after[-1] == "next!":
        assert time.monotonic() < deadline
        after += [o.request_id + ("!" if o.finished else "") for o in engine.outputs(0.1)]
    assert "long" not in after and "long!" not in after
    deadline = time.monotonic() + 5
    while engine.kv_cache_blocks() or engine.running():
        assert time.monotonic() < deadline, engine.kv_cache_blocks()
        time.sleep(0.01)


def test_requests_beyond_max_num_seqs_wait_first_come_first_served(start):
    engine = start(dataclasses.replace(FAST, max_num_seqs=2))
    seen = events(engine, {f"r{i}": (prompt(f"queue {i}"), SamplingParams(max_tokens=5)) for i in range(5)})
    first, last, open_, most = {}, {}, set(), 0
    for index, (rid, _, finished) in enumerate(seen):
        first.setdefault(rid, index)
        open_.add(rid)
        most = max(most, len(open_))
        if finished:
            last[rid] = index
            open_.discard(rid)
    assert most == 2
    # They start in the order they came, each waiting for a place: r<k> (k >= 2) once k - 1 have
    # ended. (r1 may be added a step after r0 started, so r0 and r1 need not end together; of two
    # started in one step, either's output may come first.)
    order = sorted(first, key=first.get)
    assert set(order[:2]) == {"r0", "r1"} and order[-1] == "r4", order
    for k in range(2, 5):
        assert sum(end < first[f"r{k}"] for end in last.values()) >= k - 1, (k, first, last)


def test_the_kv_cache_admits_what_its_reservations_fit(start):
    # 100 cells, 10-token prompts with max_tokens 40: two at a time though 8 slots are free.
    engine = start(dataclasses.replace(FAST, max_num_seqs=8, kv_cache_tokens=100))
    ten = prompt("one two three four five six seven eight nine ten")[:10]
    held = []
    engine.add("a", ten, SamplingParams(max_tokens=40))
    engine.add("b", ten, SamplingParams(max_tokens=40))
    engine.add("c", ten, SamplingParams(max_tokens=40))
    done = set()
    while len(done) < 3:
        for output in engine.outputs(0.05):
            done |= {output.request_id} if output.finished else set()
        held.append((engine.running(), engine.kv_cache_blocks()))
    assert max(r for r, _ in held) == 2 and max(c for _, c in held) <= 100
    with pytest.raises(InvalidInput, match="max_tokens: 91 is outside 1..90"):
        engine.add("too long", ten, SamplingParams(max_tokens=91))


def test_requests_added_together_start_in_one_step(engine):
    with engine.adding_together():
        for i in range(16):
            engine.add(f"r{i}", prompt(f"together {i}"), SamplingParams(max_tokens=3))
        time.sleep(0.05)  # the engine thread would have taken the first ones by now
    seen = events(engine, {})
    while len({rid for rid, _, finished in seen if finished}) < 16:
        seen += [(o.request_id, o.token_ids, o.finished) for o in engine.outputs(0.1)]
    firsts = {}
    for index, (rid, _, _) in enumerate(seen):
        firsts.setdefault(rid, index)
    assert max(firsts.values()) < 16  # every first token before any second one


@pytest.mark.parametrize("params, named", [
    (SamplingParams(max_tokens=4, guided_decoding=GuidedDecoding("json")), "guided_decoding_guide_type: the synthetic"),
    (SamplingParams(max_tokens=4, top_logprobs=2), "top_logprobs: 2: the SyntheticEngine engine gives no top"),
    (SamplingParams(max_tokens=4, repetition_penalty=1.2), "repetition_penalty: 1.2: the synthetic engine draws"),
    (SamplingParams(max_tokens=4, presence_penalty=0.5), "presence_penalty: 0.5: the synthetic engine draws"),
    (SamplingParams(max_tokens=4, frequency_penalty=-1.0), "frequency_penalty: -1.0: the synthetic engine draws"),
    (SamplingParams(max_tokens=9000), "max_tokens: 9000 is outside 1..8191"),
])
def test_what_it_cannot_honour_is_refused_by_name(engine, params, named):
    with pytest.raises(InvalidInput) as error:
        engine.check_request(params)
        engine.add("x", [1], params)
    assert str(error.value).startswith(named)


@pytest.mark.parametrize("name, value, allowed", [
    ("synthetic_step_ms", "0", "an integer >= 1 (default 20)"),
    ("synthetic_step_us_per_seq", "-1", "an integer >= 0 (default 0)"),
    ("synthetic_prefill_us_per_token", "fast", "an integer >= 0 (default 0)"),
    ("synthetic_eos_every", "0.5", "an integer >= 0 (default 0)"),
])
def test_bad_parameters_fail_loading_naming_them(name, value, allowed):
    with pytest.raises(ConfigError) as error:
        parse("llm", {"engine": "synthetic", name: value})
    assert str(error.value) == f"parameter {name}: {value!r} is not allowed; it must be {allowed}"


def test_parameters_reach_the_engine(vocabulary):
    config = parse("llm", {"engine": "synthetic", "synthetic_step_ms": "7", "synthetic_step_us_per_seq": "3",
                           "synthetic_prefill_us_per_token": "11", "synthetic_eos_every": "50",
                           "max_num_seqs": "1024", "kv_cache_tokens": "0"}).engine_config()
    assert (config.synthetic_step_ms, config.synthetic_step_us_per_seq, config.synthetic_prefill_us_per_token,
            config.synthetic_eos_every, config.max_num_seqs) == (7, 3, 11, 50, 1024)
    engine = SyntheticEngine(vocabulary, config)
    try:
        assert engine.kv_cache_capacity_blocks() == 1024 * 8192
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="synthetic_step_ms: 0 must be >= 1"):
        SyntheticEngine(vocabulary, dataclasses.replace(config, synthetic_step_ms=0))


def test_shutdown_ends_the_thread_mid_step_and_refuses_more(start):
    engine = start(dataclasses.replace(FAST, synthetic_step_ms=5000))
    engine.add("r", [1, 2, 3], SamplingParams(max_tokens=3))
    time.sleep(0.05)
    began = time.monotonic()
    engine.shutdown()
    assert not engine._thread.is_alive() and time.monotonic() - began < 1
    with pytest.raises(RuntimeError, match="not accepting requests"):
        engine.add("late", [1], SamplingParams(max_tokens=1))


def test_the_engine_thread_is_named_for_cpu_accounting(engine):
    with open(f"/proc/self/task/{engine._thread.native_id}/comm") as comm:
        assert comm.read().strip() == "tf-engine"

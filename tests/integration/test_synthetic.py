"""The `generate` ensemble with the synthetic engine (scripts/configure.py --engine synthetic --dp 2)
on a real tritonserver over gRPC: its text is the tokenizer's decode of the ids the same engine gives
in this process (greedy and seeded, concurrent, multi-byte characters split over tokens included), and
streams join to it; stop words, end_id and max_tokens end it as they say; a stream its client cancels
leaves the engine (the llm's gauges go back to 0); and both DP ranks serve."""
import time

import pytest

from harness.clients.kserve import generate_inputs
from harness.clients.streams import Streams, run_requests as run
from harness.deploy import write_deployment
from harness.engine_runs import generated
from harness.model_tokenizers import llm_tokenizer
from harness.references import prompt_ids
from harness.server import triton_server
from harness.triton_metrics import llm_gauges, rank_values
from tritonfront.core import model_sources
from tritonfront.engines import EngineConfig, SamplingParams, create_engine

STEP_MS = 2
MAX_TOKENS = 120
# (text, chat template, seed): no seed is greedy, keyed by the prompt; a seed samples (top_p 0.9).
CASES = [("Describe the sea at night.", False, None), ("List five colours.", True, None),
         ("Write a haiku about snow.", True, 11), ("Explain tides to a child.", False, 2**64 - 1),
         ("Why is the sky blue?", True, 123456789), ("A synthetic engine is", False, None)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Two ranks, each its own synthetic engine at 2 ms a step; a stream whose chunks are not
    acknowledged is freed after 2 s instead of 6."""
    out = tmp_path_factory.mktemp("synthetic")
    repositories = write_deployment(out, "--engine", "synthetic", "--dp", "2", "--detokenizers", "2",
                                    "--set", f"llm.synthetic_step_ms={STEP_MS}",
                                    "--set", "llm.abandoned_stream_timeout_ms=2000")
    with triton_server(out / "server.log", repositories=repositories) as running:
        yield running


@pytest.fixture(scope="module")
def engine():
    """The synthetic engine in this process, on the folder the server's llm reads: the ids it gives."""
    engine = create_engine("synthetic", model_sources.llm_model_dir(), "cpu",
                           EngineConfig(kv_cache_tokens=0, synthetic_step_ms=1))
    yield engine
    engine.shutdown()


def params(seed, max_tokens: int = MAX_TOKENS, **more) -> SamplingParams:
    if seed is None:
        return SamplingParams(max_tokens=max_tokens, **more)
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=0.9, random_seed=seed, **more)


def inputs(case, stream: bool, max_tokens: int = MAX_TOKENS, **optional) -> list:
    text, chat, seed = case
    sampling = {} if seed is None else {"temperature": 1.0, "top_p": 0.9, "random_seed": seed}
    return generate_inputs(text, max_tokens, stream=stream, apply_chat_template=chat, **sampling, **optional)


@pytest.fixture(scope="module")
def expected_ids(engine):
    return generated(engine, {str(i): (prompt_ids(text, chat), params(seed)) for i, (text, chat, seed)
                              in enumerate(CASES)})


def decode(ids) -> str:
    return llm_tokenizer().decode(ids, skip_special_tokens=True)


def test_text_is_the_decode_of_the_engines_ids_streamed_or_whole(server, expected_ids):
    requests = {f"{kind}{i}": inputs(case, stream=kind == "s") for i, case in enumerate(CASES) for kind in "sw"}
    got = run(server.grpc_url, requests, connections=3)
    for i in range(len(CASES)):
        chunks, finish_reason, _, completion_tokens = got[f"s{i}"]
        whole = got[f"w{i}"]
        assert (whole[0][0], whole[1], whole[3]) == (decode(expected_ids[str(i)]), "length", MAX_TOKENS), i
        assert ("".join(chunks), finish_reason, completion_tokens) == (whole[0][0], "length", MAX_TOKENS), i
        assert len(chunks) > 2 and not any("\ufffd" in chunk for chunk in chunks), i
    # Real text with multi-byte characters, some of them split over two or three tokens.
    texts = "".join(decode(ids) for ids in expected_ids.values())
    assert sum(len(c.encode()) > 1 for c in texts) >= 5
    split = [ids for ids in expected_ids.values() if any("\ufffd" in decode([t]) for t in ids)]
    assert split, "no character split over tokens in these answers"


def test_stop_words_end_the_text_before_them(server, expected_ids):
    ids = expected_ids["0"]
    # A generated token whose text encodes back to itself alone: the stop word's ids are that token.
    position, token = next((p, t) for p, t in enumerate(ids) if p >= 3 and
                           llm_tokenizer()(decode([t]), add_special_tokens=False).input_ids == [t])
    first = ids.index(token)
    got = run(server.grpc_url, {"s": inputs(CASES[0], stream=True, stop_words=[decode([token]), "never \u2603"]),
                                "w": inputs(CASES[0], stream=False, stop_words=[decode([token])])})
    for name in "sw":
        chunks, finish_reason, _, completion_tokens = got[name]
        assert ("".join(chunks), finish_reason, completion_tokens) == (decode(ids[:first]), "stop", first), name
    assert first <= position


def test_end_id_ends_the_answer_where_the_engine_draws_it(server, expected_ids):
    ids = expected_ids["2"]
    end = ids[7]
    first = ids.index(end)
    got = run(server.grpc_url, {"s": inputs(CASES[2], stream=True, end_id=end),
                                "w": inputs(CASES[2], stream=False, end_id=end),
                                "short": inputs(CASES[2], stream=False, max_tokens=5)})
    for name in "sw":
        chunks, finish_reason, _, completion_tokens = got[name]
        assert ("".join(chunks), finish_reason, completion_tokens) == (decode(ids[:first]), "stop", first), name
    assert got["short"][1:] == ("length", got["short"][2], 5) and got["short"][0][0] == decode(ids[:5])


def test_a_cancelled_stream_leaves_the_engine(server):
    """Triton does not cancel the ensemble's running llm step: the llm frees the stream when its
    chunks stop being acknowledged (abandoned_stream_timeout_ms, 2 s here), long before its 8,000
    tokens (16 s at 2 ms a step) would end it."""
    def gauges() -> dict:
        return llm_gauges(server.metrics())

    before = gauges()["cancelled_requests_total"] or 0
    streams = Streams(server.grpc_url)
    streams.send("long", inputs(CASES[5], stream=True, max_tokens=8000))
    deadline = time.monotonic() + 30
    while len(streams.responses["long"]) < 5 or not gauges()["kv_cache_blocks"]:
        assert time.monotonic() < deadline and not streams.errors, streams.errors
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    streams.close(cancel=True)
    while (now := gauges())["active_sequences"] or now["kv_cache_blocks"] or now["cancelled_requests_total"] == before:
        assert time.monotonic() - cancelled_at < 12, now
        time.sleep(0.1)


def test_both_ranks_serve(server, engine):
    """A burst spreads over the two ranks (balancing by tokens), and the answers are the engine's
    whichever rank runs them."""
    cases = {f"r{i}": CASES[i % len(CASES)] for i in range(12)}
    expected = generated(engine, {rid: (prompt_ids(text, chat), params(seed, 400))
                                  for rid, (text, chat, seed) in cases.items()})
    busy = {}
    streams = Streams(server.grpc_url)
    try:
        for i, (rid, case) in enumerate(cases.items()):
            streams.send(rid, inputs(case, stream=i % 2 == 0, max_tokens=400))
        deadline = time.monotonic() + 60
        while not all(streams.done[rid].is_set() for rid in cases):
            assert time.monotonic() < deadline and not streams.errors, streams.errors
            for rank, value in rank_values(server.metrics(), "tritonfront_llm_active_sequences").items():
                busy[rank] = max(busy.get(rank, 0), value)
            time.sleep(0.05)
        texts = {rid: "".join(streams.texts(rid)) for rid in cases}
    finally:
        streams.close()
    assert busy.get("llm/0", 0) > 0 and busy.get("llm/1", 0) > 0, busy
    assert texts == {rid: decode(ids) for rid, ids in expected.items()}

"""The `generate` ensemble (llm_tokenizer -> llm -> detokenizer) on real tritonservers: greedy
text equals the engine's own reference run alone (harness.references) + decode, streams join to
the non-streamed text, HTTP generate and generate_stream, stop words, bad inputs, cancellation,
and DP balancing."""
import json
import threading
import time
from typing import Optional

import numpy as np
import pytest

from harness.chunks import streamed_in_intervals
from harness.clients.http import post, sse_events
from harness.clients.kserve import generate_inputs, tensor, tensors
from harness.clients.streams import Streams, run_requests as run, single_error
from harness.corpora import PROMPTS
from harness.deploy import committed_llm_engine, engine_under_test, write_deployment
from harness.model_tokenizers import llm_tokenizer as tokenizer
from harness.references import greedy_reference, prompt_ids, sent_ids
from harness.server import triton_server
from harness.triton_metrics import rank_values as metric_values
from tritonfront.core.model_config import LLMConfig

MAX_TOKENS = 16
STREAM_INTERVAL = LLMConfig().stream_interval  # the committed llm's too (tests/unit/test_model_config.py)
EOS = 2
# Raw text like TensorRT-LLM clients send, and chat-templated (the model's chat template).
CASES = [(prompt, False) for prompt in PROMPTS[:8]] + [(prompt, True) for prompt in PROMPTS[8:]]


def expected(ids: list[int], max_tokens: int) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) for a reference's greedy ids: a run that ended on an
    end token ends with "stop", the end token unsent."""
    ids, ended = sent_ids(ids, max_tokens, EOS)
    return tokenizer().decode(ids, skip_special_tokens=True), "stop" if ended else "length", len(ids)


def reference_answers(engine: str) -> list:
    prompts = [prompt_ids(text, chat) for text, chat in CASES]
    return [(ids, expected(generated, MAX_TOKENS))
            for ids, generated in zip(prompts, greedy_reference(prompts, MAX_TOKENS, engine=engine))]


@pytest.fixture(scope="module")
def references():
    """The answers of the engine the `server` fixture runs (TRITONFRONT_TEST_ENGINE or the committed one)."""
    return reference_answers(engine_under_test())


@pytest.fixture(scope="module")
def dp_references():
    """The answers of the committed engine, which this module's own deployments run."""
    return reference_answers(committed_llm_engine())


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory):
    """DP 2 (llm balanced by tokens; perf/bench_dp_balancing.py compares Triton's own placement)
    and 4 detokenizers, one torch thread per llm instance on this 2-core machine; room for a burst
    of 64 streams, so that placement, not the admission limit, decides where requests go. A
    request without max_tokens gets MAX_TOKENS (llm.default_max_tokens)."""
    out = tmp_path_factory.mktemp("dp2")
    repositories = write_deployment(out, "--dp", "2", "--detokenizers", "4", "--set", "llm.num_threads=1",
                                    "--set", f"llm.default_max_tokens={MAX_TOKENS}",
                                    "--set", "llm.kv_cache_tokens=8192", "--set", "llm.max_active_requests=64",
                                    "--queue", "llm=64")
    with triton_server(out / "server.log", repositories=repositories) as running:
        yield running


def case_inputs(case, stream: bool, max_tokens: Optional[int] = MAX_TOKENS, **optional):
    text, chat = case
    return generate_inputs(text, max_tokens, stream=stream, apply_chat_template=chat, **optional)


def test_greedy_text_equals_the_reference(server, references):
    results = run(server.grpc_url, {str(i): case_inputs(case, stream=False) for i, case in enumerate(CASES)})
    finish_reasons = set()
    for i, (ids, (text, finish_reason, completion_tokens)) in enumerate(references):
        chunks, got_reason, prompt_tokens, got_tokens = results[str(i)]
        assert chunks == [text], CASES[i]
        assert (got_reason, prompt_tokens, got_tokens) == (finish_reason, len(ids), completion_tokens), CASES[i]
        finish_reasons.add(got_reason)
    assert finish_reasons == {"stop", "length"}  # the cases cover EOS and max_tokens


def test_streamed_chunks_join_to_the_whole_text(server, references):
    results = run(server.grpc_url, {str(i): case_inputs(case, stream=True) for i, case in enumerate(CASES)},
                  counts=True)
    for i, (ids, (text, finish_reason, completion_tokens)) in enumerate(references):
        chunks, got_reason, _, got_tokens, sent_counts = results[str(i)]
        assert "".join(chunks) == text and (got_reason, got_tokens) == (finish_reason, completion_tokens), CASES[i]
        assert streamed_in_intervals(sent_counts, completion_tokens, STREAM_INTERVAL), (CASES[i], sent_counts)


def test_http_generate_and_generate_stream(server, references):
    for case, (ids, (text, finish_reason, completion_tokens)) in list(zip(CASES, references))[:3]:
        body = {"text_input": case[0], "max_tokens": MAX_TOKENS, "apply_chat_template": case[1]}
        status, whole = post(f"http://{server.http_url}/v2/models/generate/generate", body)
        assert status == 200, whole
        whole = json.loads(whole)
        assert (whole["text_output"], whole["finish_reason"], whole["completion_tokens"]) == (
            text, finish_reason, completion_tokens)
        status, stream = post(f"http://{server.http_url}/v2/models/generate/generate_stream", {**body, "stream": True})
        events = sse_events(stream)
        assert status == 200, stream
        sent_counts = [e["completion_tokens"] for e in events]
        assert streamed_in_intervals(sent_counts, completion_tokens, STREAM_INTERVAL), sent_counts
        assert "".join(e["text_output"] for e in events) == text
        assert [e["finish_reason"] for e in events] == [""] * (len(events) - 1) + [finish_reason]


def test_stop_words_end_the_text_before_them(server, references):
    ids, (text, _, _) = references[0]
    generated = tokenizer()(text, add_special_tokens=False).input_ids
    # A generated token whose text encodes back to itself alone, so the stop word's ids are
    # the ids the model generates.
    token = next(t for p, t in enumerate(generated) if p >= 2 and
                 tokenizer()(tokenizer().decode([t]), add_special_tokens=False).input_ids == [t])
    stop_word = tokenizer().decode([token])
    results = run(server.grpc_url, {
        "stream": case_inputs(CASES[0], stream=True, stop_words=[stop_word, "never generated \u2603"]),
        "whole": case_inputs(CASES[0], stream=False, stop_words=[stop_word]),
    })
    prefix = tokenizer().decode(generated[: generated.index(token)])
    for name in ("stream", "whole"):
        chunks, finish_reason, _, completion_tokens = results[name]
        assert ("".join(chunks), finish_reason) == (prefix, "stop"), name
        assert completion_tokens == generated.index(token)


BAD_REQUESTS = [
    ({"text_input": ""}, "text_input", "is empty"),
    ({"max_tokens": 0}, "max_tokens", "outside 1.."),
    ({"max_tokens": -5}, "max_tokens", "outside 1.."),
    ({"max_tokens": 9000}, "max_tokens", "outside 1.."),
    ({"text_input": "hello " * 8200}, "text_input", "at most 8191"),
    ({"temperature": -0.5}, "temperature", ">= 0"),
    ({"top_p": 0.0}, "top_p", "(0, 1]"),
    ({"top_p": 1.5}, "top_p", "(0, 1]"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"stop_words": [f"w{i}" for i in range(17)]}, "stop_words", "limit of 16"),
    # Over the generate extension a key that is not an input arrives as a request parameter.
    ({"max_new_tokens": 8}, "max_new_tokens", "(did you mean max_tokens?)"),
    # ... and a number is converted to INT32 without a range check.
    ({"max_tokens": 3000000000}, "max_tokens", "arrives wrapped around"),
]


def test_bad_inputs_are_rejected_by_name_and_others_go_on(server, references):
    ids, (text, finish_reason, _) = references[1]
    good = Streams(server.grpc_url)
    good.send("good", case_inputs(CASES[1], stream=True))
    try:
        for fields, field, limit in BAD_REQUESTS:
            body = {"text_input": "The sky is", "max_tokens": 8, **fields}
            status, reply = post(f"http://{server.http_url}/v2/models/generate/generate", body)
            assert status == 400, (fields, reply)  # Triton's HTTP status for INVALID_ARG
            assert f"{field}:" in reply and limit in reply, (fields, reply)
        # Invalid UTF-8 cannot travel in JSON: over gRPC.
        message = single_error(server.grpc_url, generate_inputs("The sky is", 8, stop_words=[b"ok", b"\xff\xfe"]))
        assert "stop_words[1]" in message and "UTF-8" in message
        # No text_input (every input is optional to Triton, which counts them only): named.
        message = single_error(server.grpc_url, tensors(max_tokens=8, apply_chat_template=True))
        assert "text_input: is required" in message
        good.wait(["good"])
        assert "".join(good.texts("good")) == text and good.last("good", "finish_reason").decode() == finish_reason
        assert not good.errors
    finally:
        good.close()
    assert server.is_ready()


def test_http_generate_extension_answers_as_readme_says(server):
    """What Triton 2.51's generate extension answers before the model sees a request (README,
    Known limits): tests that fail here mean Triton changed and README must follow."""
    url = f"http://{server.http_url}/v2/models/generate"
    for endpoint in ("generate", "generate_stream"):
        # No text_input: the llm_tokenizer, which takes every input, names it; with no input at all
        # Triton says so itself.
        status, reply = post(f"{url}/{endpoint}", {"max_tokens": 2, "apply_chat_template": True})
        assert status == 400 and "text_input: is required" in reply, (endpoint, reply)
        status, reply = post(f"{url}/{endpoint}", {"max_tokens": 2})
        assert status == 400 and "text_input: is required" in reply, (endpoint, reply)
        status, reply = post(f"{url}/{endpoint}", {})
        assert status == 400 and "request has 0 inputs" in reply, (endpoint, reply)
        status, reply = post(f"{url}/{endpoint}", {"text_input": "Hi", "max_tokens": 2, "max_new_tokens": 2})
        assert status == 400 and "max_new_tokens: generate has no input or parameter" in reply, (endpoint, reply)
    # Values of the wrong JSON type and malformed JSON: 500, from Triton's parser.
    for body in ({"text_input": "Hi", "max_tokens": "8"}, {"text_input": 42, "max_tokens": 2},
                 {"text_input": "Hi", "max_tokens": 2, "temperature": "0.5"}, b"{not json"):
        status, reply = post(f"{url}/generate", body)
        assert status == 500 and "parse" in reply, (body, reply)
    # "stream": true on /generate: the whole generation runs, then 200 with an error in the body.
    status, reply = post(f"{url}/generate", {"text_input": "Hi", "max_tokens": 2, "stream": True})
    assert status == 200 and "use generate stream" in json.loads(reply)["error"], reply


def test_without_max_tokens_a_chat_answer_runs_to_its_end(server):
    """The committed llm (default_max_tokens 0) lets a request that sends no max_tokens generate
    what the context leaves after its prompt (OpenAI's default): a greedy chat answer that ends on
    its own well past MAX_TOKENS comes whole, as the reference gives it (this question's greedy
    answer: 32 tokens, with either CPU engine)."""
    case = ("Explain gravity in one sentence.", True)
    ids = prompt_ids(*case)
    text, finish_reason, completion_tokens = expected(greedy_reference([ids], 96)[0], 96)
    assert finish_reason == "stop" and completion_tokens > MAX_TOKENS  # the case is what the test needs
    for stream in (False, True):
        chunks, got_reason, prompt_tokens, got_tokens = run(
            server.grpc_url, {"r": case_inputs(case, stream=stream, max_tokens=None)})["r"]
        assert ("".join(chunks), got_reason, prompt_tokens, got_tokens) == (text, "stop", len(ids), completion_tokens)


def test_the_llms_default_max_tokens_caps_only_requests_without_max_tokens(dp_server, dp_references):
    """dp_server's llm has default_max_tokens MAX_TOKENS: a request without max_tokens gets the
    reference's MAX_TOKENS-token answer; one that asks for more gets more."""
    i = next(i for i, (_, (_, reason, _)) in enumerate(dp_references) if reason == "length")
    ids, (text, _, _) = dp_references[i]
    longer = MAX_TOKENS + 8
    longer_text, longer_reason, longer_tokens = expected(
        greedy_reference([ids], longer, engine=committed_llm_engine())[0], longer)
    results = run(dp_server.grpc_url, {"default": case_inputs(CASES[i], stream=True, max_tokens=None),
                                       "given": case_inputs(CASES[i], stream=False, max_tokens=longer)})
    chunks, reason, prompt_tokens, tokens = results["default"]
    assert ("".join(chunks), reason, prompt_tokens, tokens) == (text, "length", len(ids), MAX_TOKENS)
    chunks, reason, prompt_tokens, tokens = results["given"]
    assert (chunks, reason, tokens) == ([longer_text], longer_reason, longer_tokens) and tokens > MAX_TOKENS


def test_64_concurrent_streams_join_to_the_non_streamed_text(dp_server):
    requests = {f"r{i}": (PROMPTS[i % len(PROMPTS)], 6 + i % 7) for i in range(64)}
    whole = run(dp_server.grpc_url, {rid: generate_inputs(text, n, stream=False)
                                     for rid, (text, n) in requests.items()}, connections=8)
    streamed = run(dp_server.grpc_url, {rid: generate_inputs(text, n, stream=True)
                                        for rid, (text, n) in requests.items()}, connections=8)
    for rid in requests:
        assert "".join(streamed[rid][0]) == whole[rid][0][0], rid
        assert streamed[rid][1:] == whole[rid][1:], rid
    ranks = metric_values(dp_server.metrics(), "tritonfront_llm_outstanding_tokens")
    assert {"llm/0", "llm/1"} <= set(ranks)


def test_cancelled_stream_stops_generating_others_finish(dp_server):
    """A stream to the llm model cancelled by its client leaves the engine within half a second and a
    step (the loop's cancel_check_s). (Through
    the ensemble Triton cancels only the steps it has not started yet, so an llm request already
    generating never learns of it: core's ensemble scheduler calls Cancel() on new step requests
    only.)"""
    def cancelled_total():
        values = metric_values(dp_server.metrics(), "tritonfront_llm_cancelled_requests_total")
        return sum(v for k, v in values.items() if k.startswith("llm/"))

    before = cancelled_total()
    long, others = Streams(dp_server.grpc_url, model="llm", final_output="is_final"), Streams(dp_server.grpc_url)
    counting = np.array([prompt_ids("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", chat=False)], dtype=np.int32)
    long.send("long", [tensor("input_ids", counting), tensor("input_lengths", counting.shape[1]),
                       tensor("max_tokens", 2000), tensor("stream", True)])
    for i in range(3):
        others.send(f"o{i}", generate_inputs(PROMPTS[i], 24, stream=True))
    deadline = time.monotonic() + 120
    while len(long.responses["long"]) < 3:
        assert time.monotonic() < deadline and not long.errors, long.errors
        time.sleep(0.05)
    long.close(cancel=True)
    others.wait([f"o{i}" for i in range(3)])
    assert [others.last(f"o{i}", "finish_reason") for i in range(3)] == [b"length"] * 3
    assert [others.last(f"o{i}", "completion_tokens") for i in range(3)] == [24] * 3
    others.close()
    deadline = time.monotonic() + 30
    while True:  # counted, and nothing stays active: the 2000-token request is gone
        active = metric_values(dp_server.metrics(), "tritonfront_llm_active_sequences")
        if cancelled_total() == before + 1 and sum(v for k, v in active.items() if k.startswith("llm/")) == 0:
            break
        assert time.monotonic() < deadline, (cancelled_total(), active)
        time.sleep(0.1)


def token_load_ratio(server, model: str, requests: int = 32, seed: int = 0) -> float:
    """A burst of mixed prompt lengths and output lengths sent to `model` directly; returns the
    max/min ratio of the ranks' mean outstanding tokens while work is in flight."""
    rng = np.random.default_rng(seed)
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            loads = metric_values(server.metrics(), "tritonfront_llm_outstanding_tokens")
            row = [loads.get(f"{model}/0", 0.0), loads.get(f"{model}/1", 0.0)]
            if sum(row):
                samples.append(row)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    streams = Streams(server.grpc_url, model=model, final_output="is_final")
    try:
        for i in range(requests):
            length = int(rng.choice([8, 16, 32, 400]))
            ids = rng.integers(100, 40000, size=(1, length)).astype(np.int32)
            streams.send(str(i), [tensor("input_ids", ids), tensor("input_lengths", length),
                                  tensor("max_tokens", int(rng.integers(2, 24)))])
        streams.wait([str(i) for i in range(requests)])
        assert not streams.errors
    finally:
        stop.set()
        sampler.join()
        streams.close()
    means = np.array(samples).mean(axis=0)
    return float(means.max() / means.min())


def test_dp_ranks_stay_balanced_by_tokens(dp_server, record_property):
    balanced = token_load_ratio(dp_server, "llm")
    record_property("token_load_max_min_ratio_balanced", balanced)
    print(f"per-rank outstanding tokens max/min: balancing=tokens {balanced:.2f}")
    assert balanced <= 2.0

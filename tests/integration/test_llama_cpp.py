"""The committed `generate` ensemble, whose llm runs the llama.cpp engine (the CPU default: 64
sequences, slots of 512 cells, a pool of 32,768, prefix reuse on), on a real tritonserver: greedy text of concurrent requests equals llama-cpp-python's own generation on the
GGUF, one sequence at a time, decoded by the ensemble's tokenizer; 16 concurrent streams join to
their whole answers; bad parameters are refused naming the input; a 6,000-token prompt is served
(in the pool) while a prompt longer than the model's context is refused naming the limit; a
shared prefix is reused and counted on Triton's metrics port; a cancelled stream's KV cells go
back (the llm's KV cache gauge, which the engine keeps from its sequences' cells, returns to 0).

These prompts fit the slots, where a request's tokens do not depend on what shares its batches
(each sequence attends over its own cells, as llama-cpp-python's one sequence does): that is what
exact comparisons under concurrency need. The pool's floating point does depend on them, and
tests/unit/test_llama_cpp_engine.py compares it within a tolerance (docs/design.md)."""
import time

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (scripts/setup.sh builds it)")

from harness.clients.kserve import generate_inputs, tensor  # noqa: E402
from harness.clients.streams import Streams, run_requests as run, single_error  # noqa: E402
from harness.deploy import GENERATE_MODELS, committed_llm_engine  # noqa: E402
from harness.model_tokenizers import llm_tokenizer  # noqa: E402
from harness.references import llama_cpp_greedy_reference, prompt_ids  # noqa: E402
from harness.server import triton_server  # noqa: E402
from harness.triton_metrics import rank_values  # noqa: E402

CONTEXT = 8192  # SmolLM2's: the pool (32,768 cells) holds that much for one request
CAPACITY = 64 * 512 + 32768  # the slots and the pool
MAX_TOKENS = 20
# Not the tests' fixture prompts (harness.corpora.PROMPTS).
CASES = [("The tallest mountain on Earth is", False), ("def reverse_string(s):", False),
         ("Roses are red, violets are", False), ("Name three fruits that are yellow.", True),
         ("What is 12 times 12?", True)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The committed repositories themselves (their generate models), not a deployment written
    from them: the 6,000-token prompt is served on what a user serves."""
    assert committed_llm_engine() == "llama_cpp"
    out = tmp_path_factory.mktemp("llama_cpp")
    with triton_server(out / "server.log", models=GENERATE_MODELS) as running:
        yield running


def llm_metric(server, name: str) -> float:
    return sum(rank_values(server.metrics(), name).values())


def test_greedy_text_equals_llama_cpp_pythons_generation(server):
    prompts = [prompt_ids(text, chat) for text, chat in CASES]
    expected = []
    for ids in llama_cpp_greedy_reference(prompts, MAX_TOKENS):
        ended = ids[-1] == 2  # <|im_end|>: "stop", not sent
        kept = ids[:-1] if ended else ids
        expected.append((llm_tokenizer().decode(kept, skip_special_tokens=True), "stop" if ended else "length",
                         len(kept)))
    got = run(server.grpc_url, {str(i): generate_inputs(text, MAX_TOKENS, stream=False, apply_chat_template=chat)
                                for i, (text, chat) in enumerate(CASES)})
    assert [(texts[0], reason, tokens) for texts, reason, _, tokens in (got[str(i)] for i in range(len(CASES)))] \
        == expected


def test_16_concurrent_streams_join_to_the_whole_text(server):
    requests = {f"r{i}": (CASES[i % len(CASES)], 8 + i % 9) for i in range(16)}
    whole = run(server.grpc_url, {rid: generate_inputs(text, n, stream=False, apply_chat_template=chat)
                                  for rid, ((text, chat), n) in requests.items()}, connections=4)
    streamed = run(server.grpc_url, {rid: generate_inputs(text, n, stream=True, apply_chat_template=chat)
                                     for rid, ((text, chat), n) in requests.items()}, connections=4)
    for rid in requests:
        assert "".join(streamed[rid][0]) == whole[rid][0][0], rid
        assert streamed[rid][1:] == whole[rid][1:], rid


@pytest.mark.parametrize("inputs, named", [
    ({"repetition_penalty": -1.0}, "repetition_penalty: -1.0 must be a finite number > 0"),
    ({"top_p": 1.5}, "top_p: 1.5 must be in (0, 1]"),
    ({"top_logprobs": 21}, "top_logprobs: 21 is outside 0..20"),
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[a-"}, "guided_decoding_guide: regex does not compile"),
    ({"max_tokens": 9000}, "max_tokens: 9000 is outside 1..{room} (context of {context} tokens"),
])
def test_bad_parameters_are_refused_naming_the_input(server, inputs, named):
    text = "Count to three:"
    inputs = {"max_tokens": 8, **inputs}
    named = named.format(room=CONTEXT - len(prompt_ids(text, chat=False)), context=CONTEXT)
    message = single_error(server.grpc_url, generate_inputs(text, **inputs))
    assert named in message, message


@pytest.mark.timeout(1800)  # the prefill takes minutes on 2 busy cores
def test_a_6000_token_prompt_is_served_and_a_longer_one_than_the_context_refused_naming_the_limit(server):
    words = " ".join(f"note {i}: keep it short." for i in range(900))
    ids = prompt_ids(words, chat=False)
    assert len(ids) > 6000
    text = llm_tokenizer().decode(ids[:6000])
    assert 5950 <= len(prompt_ids(text, chat=False)) <= 6050
    streams = Streams(server.grpc_url)
    try:
        # Its prefill takes minutes on 2 busy cores.
        responses, error = streams.request("big", generate_inputs(text, 4, stream=False), timeout=1500)
        assert error is None, error
        final = responses[-1]
        assert 5950 <= int(final.as_numpy("prompt_tokens").reshape(-1)[0]) <= 6050
        assert int(final.as_numpy("completion_tokens").reshape(-1)[0]) >= 1
        assert final.as_numpy("text_output").reshape(-1)[0]
    finally:
        streams.close()
    good = Streams(server.grpc_url)
    good.send("good", generate_inputs(CASES[0][0], 8, stream=True))
    try:
        # Over the context in tokens (about 4.8 a word), under the llm_tokenizer's max_text_bytes
        # (65,536), which would refuse it first.
        long_text = " ".join(f"word{i}" for i in range(CONTEXT // 4))
        assert len(prompt_ids(long_text, chat=False)) > CONTEXT and len(long_text.encode()) < 65536
        message = single_error(server.grpc_url, generate_inputs(long_text, 8))
        # The llm_tokenizer knows the context and refuses it before the llm would.
        assert "text_input:" in message and f"context of {CONTEXT} tokens" in message, message
        good.wait(["good"])
        assert not good.errors and good.last("good", "completion_tokens") == 8
    finally:
        good.close()


def test_a_shared_prefix_is_reused_and_counted_on_the_metrics_port(server):
    """Two requests that share a system prompt longer than a slot: the second reuses the first's
    cells in the pool; the llm's prefix cache counters (prompt tokens, vLLM's way) show it, beside
    the KV cache's size in tokens."""
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in one short sentence." for i in range(70))
    assert len(prompt_ids(system, chat=False)) > 512

    def counted(prompt: str, tag: str) -> tuple[float, int]:
        """The prefix cache's hits while `prompt` was served (the first request may reuse a few
        cells of earlier tests' prompts too), and its prompt tokens."""
        queries, hits = (llm_metric(server, "tritonfront_llm_prefix_cache_queries_total"),
                         llm_metric(server, "tritonfront_llm_prefix_cache_hits_total"))
        prompt_tokens = run(server.grpc_url, {tag: generate_inputs(prompt, 4, stream=False)})[tag][2]
        deadline = time.monotonic() + 10  # the gauges thread publishes every 0.25 s
        while llm_metric(server, "tritonfront_llm_prefix_cache_queries_total") < queries + prompt_tokens:
            assert time.monotonic() < deadline, llm_metric(server, "tritonfront_llm_prefix_cache_queries_total")
            time.sleep(0.1)
        return llm_metric(server, "tritonfront_llm_prefix_cache_hits_total") - hits, prompt_tokens

    first_hits, _ = counted(system + " Name a red fruit.", "a")
    second_hits, second_tokens = counted(system + " Name a green fruit.", "b")
    assert first_hits < 64, first_hits
    assert len(prompt_ids(system, chat=False)) - 16 <= second_hits < second_tokens
    assert llm_metric(server, "tritonfront_llm_kv_cache_capacity_tokens") == CAPACITY


def test_a_cancelled_stream_gives_its_kv_cells_back(server):
    def kv_cells() -> float:
        return llm_metric(server, "tritonfront_llm_kv_cache_blocks")

    long = Streams(server.grpc_url, model="llm", final_output="is_final")
    counting = np.array([prompt_ids("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", chat=False)], dtype=np.int32)
    long.send("long", [tensor("input_ids", counting), tensor("input_lengths", counting.shape[1]),
                       tensor("max_tokens", 400), tensor("stream", True)])
    deadline = time.monotonic() + 120
    while len(long.responses["long"]) < 5 or kv_cells() < counting.shape[1] + 4:
        assert time.monotonic() < deadline and not long.errors, (long.errors, kv_cells())
        time.sleep(0.1)
    long.close(cancel=True)
    deadline = time.monotonic() + 30
    while kv_cells() != 0:
        assert time.monotonic() < deadline, kv_cells()
        time.sleep(0.1)

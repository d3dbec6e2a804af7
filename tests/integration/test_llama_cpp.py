"""The `generate` ensemble with the llama.cpp engine (scripts/configure.py --engine llama_cpp) on a
real tritonserver: greedy text of concurrent requests equals llama-cpp-python's own generation on
the GGUF, one sequence at a time, decoded by the ensemble's tokenizer; 16 concurrent streams join to
their whole answers; bad parameters are refused naming the input; a prompt longer than the context
is refused naming the limit while others go on; a cancelled stream's KV cells go back (the llm's KV
cache gauge, which the engine keeps from its sequences' cells, returns to 0).

The deployment gives each sequence its own cells (kv_unified false, llama-server's -np layout):
there a request's tokens do not depend on what shares its batches, which exact comparisons under
concurrency need; in the unified cache they can (docs/configuration.md, "What a seed (and greedy)
guarantees"), and tests/unit/test_llama_cpp_engine.py covers that layout."""
import time

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (scripts/setup.sh builds it)")

from harness.clients.kserve import generate_inputs, tensor  # noqa: E402
from harness.clients.streams import Streams, run_requests as run, single_error  # noqa: E402
from harness.deploy import write_deployment  # noqa: E402
from harness.model_tokenizers import llm_tokenizer  # noqa: E402
from harness.references import llama_cpp_greedy_reference, prompt_ids  # noqa: E402
from harness.server import triton_server  # noqa: E402
from harness.triton_metrics import rank_values  # noqa: E402

SEQUENCES = 16
CONTEXT = 1024  # each sequence's cells
MAX_TOKENS = 20
# Not the tests' fixture prompts (harness.corpora.PROMPTS).
CASES = [("The tallest mountain on Earth is", False), ("def reverse_string(s):", False),
         ("Roses are red, violets are", False), ("Name three fruits that are yellow.", True),
         ("What is 12 times 12?", True)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama_cpp")
    repositories = write_deployment(out, "--engine", "llama_cpp", "--detokenizers", "2",
                                    "--set", f"llm.kv_cache_tokens={SEQUENCES * CONTEXT}",
                                    "--set", f"llm.max_num_seqs={SEQUENCES}", "--set", "llm.kv_unified=false")
    with triton_server(out / "server.log", repositories=repositories) as running:
        yield running


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
    ({"max_tokens": 5000}, "max_tokens: 5000 is outside 1..{room} (context of {context} tokens"),
])
def test_bad_parameters_are_refused_naming_the_input(server, inputs, named):
    text = "Count to three:"
    inputs = {"max_tokens": 8, **inputs}
    named = named.format(room=CONTEXT - len(prompt_ids(text, chat=False)), context=CONTEXT)
    message = single_error(server.grpc_url, generate_inputs(text, **inputs))
    assert named in message, message


def test_a_prompt_longer_than_the_context_is_refused_naming_the_limit(server):
    good = Streams(server.grpc_url)
    good.send("good", generate_inputs(CASES[0][0], 8, stream=True))
    try:
        long_text = " ".join(f"word{i}" for i in range(CONTEXT))  # several tokens each
        message = single_error(server.grpc_url, generate_inputs(long_text, 8))
        assert "input_ids:" in message and f"in the context of {CONTEXT} tokens" in message, message
        good.wait(["good"])
        assert not good.errors and good.last("good", "completion_tokens") == 8
    finally:
        good.close()


def test_a_cancelled_stream_gives_its_kv_cells_back(server):
    def kv_cells() -> float:
        return sum(rank_values(server.metrics(), "tritonfront_llm_kv_cache_blocks").values())

    long = Streams(server.grpc_url, model="llm", final_output="is_final")
    counting = np.array([prompt_ids("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", chat=False)], dtype=np.int32)
    long.send("long", [tensor("input_ids", counting), tensor("input_lengths", counting.shape[1]),
                       tensor("max_tokens", CONTEXT - 64), tensor("stream", True)])
    deadline = time.monotonic() + 120
    while len(long.responses["long"]) < 5 or kv_cells() < counting.shape[1] + 4:
        assert time.monotonic() < deadline and not long.errors, (long.errors, kv_cells())
        time.sleep(0.1)
    long.close(cancel=True)
    deadline = time.monotonic() + 30
    while kv_cells() != 0:
        assert time.monotonic() < deadline, kv_cells()
        time.sleep(0.1)

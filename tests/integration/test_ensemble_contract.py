"""TensorRT-LLM's `ensemble` contract on a real tritonserver, sent as TensorRT-LLM's clients send
it ([1, 1] scalars, [1, N] word lists, [N, 1] batched prompts, gRPC streams, streamed and whole):
`ensemble` and `generate` are one model; whole answers include the prompt unless
exclude_input_in_output; batched prompts and num_return_sequences answer per sequence with their
indices; greedy text, log probs (top_logprobs: after penalties) and penalised text equal the
engine's own reference run alone (harness.references: transformers for hf, llama-cpp-python for
llama_cpp); per-token texts (tritonfront's extension) as documented; bad words, min_tokens and
guided JSON do what they say; every input no engine honours, and every bad value, is INVALID_ARG
naming it. Runs on the committed deployment, or the engine TRITONFRONT_TEST_ENGINE names."""
import json
import math
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from harness.chunks import streamed_in_intervals
from harness.clients.http import post
from harness.model_tokenizers import llm_tokenizer as tokenizer
from harness.references import greedy_reference, prompt_ids, scored_greedy, sent_ids
from tritonfront.core.model_config import LLMConfig
from tritonfront.core.trtllm_contract import EXTRA_INPUTS, EXTRA_OUTPUTS, INPUTS, OUTPUTS, UNSUPPORTED

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "def fibonacci(n):"]
MAX_TOKENS = 12


def as_tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def trtllm_inputs(prompts, max_tokens=MAX_TOKENS, stream=False, **more) -> dict[str, np.ndarray]:
    """What TensorRT-LLM's end_to_end_grpc_client sends by default, one row per prompt (its
    --batch-inputs stacks the rows), plus `more`: scalars as [rows, 1], lists as [rows, N] words."""
    rows = len(prompts)
    arrays = {"text_input": np.array([[p.encode()] for p in prompts], dtype=object),
              "max_tokens": np.full((rows, 1), max_tokens, dtype=np.int32),
              "stream": np.full((rows, 1), stream), "beam_width": np.ones((rows, 1), dtype=np.int32),
              "temperature": np.ones((rows, 1), dtype=np.float32),
              "exclude_input_in_output": np.zeros((rows, 1), dtype=bool)}
    types = {"seed": np.uint64, "random_seed": np.uint64, "top_p": np.float32, "repetition_penalty": np.float32,
             "presence_penalty": np.float32, "frequency_penalty": np.float32, "length_penalty": np.float32,
             "temperature": np.float32, "lora_task_id": np.uint64, "prompt_table_extra_id": np.uint64}
    for name, value in more.items():
        if isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, (list, tuple)):
            arrays[name] = np.array([[w.encode() for w in value]] * rows, dtype=object)
        elif isinstance(value, str):
            arrays[name] = np.array([[value.encode()]] * rows, dtype=object)
        elif isinstance(value, bool):
            arrays[name] = np.full((rows, 1), value)
        else:
            arrays[name] = np.full((rows, 1), value, dtype=types.get(name, np.int32))
    return arrays


class Request:
    """One request on a gRPC stream of its own, until Triton's final flag; its responses."""

    def __init__(self, url: str, model: str, arrays: dict, outputs=None):
        self.responses, self.errors, self.done = [], [], threading.Event()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=self._on_response)
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
        self.client.async_stream_infer(model, [as_tensor(n, a) for n, a in arrays.items()], outputs=requested,
                                       enable_empty_final_response=True)

    def _on_response(self, result, error):
        if error is not None:
            self.errors.append(error)
            self.done.set()
            return
        response = result.get_response()
        if response.outputs:
            self.responses.append(result)
        if response.parameters["triton_final_response"].bool_param:
            self.done.set()

    def wait(self, timeout: float = 300) -> "Request":
        try:
            assert self.done.wait(timeout), "no final response"
        finally:
            self.client.stop_stream()
            self.client.close()
        return self

    def texts(self) -> dict[tuple[int, int], str]:
        """(batch_index, sequence_index) -> the text of that sequence, its chunks joined."""
        texts: dict[tuple[int, int], str] = {}
        for r in self.responses:
            key = indexes(r)
            texts[key] = texts.get(key, "") + r.as_numpy("text_output")[0].decode()
        return texts

    def finals(self) -> dict[tuple[int, int], object]:
        return {indexes(r): r for r in self.responses if r.as_numpy("finish_reason")[0, 0]}


def indexes(response) -> tuple[int, int]:
    """(batch_index, sequence_index) of a response: sent, as by TensorRT-LLM, only for requests of
    several sequences; a request of one is (0, 0)."""
    batch, sequence = response.as_numpy("batch_index"), response.as_numpy("sequence_index")
    if batch is None:
        assert sequence is None
        return 0, 0
    return int(batch[0, 0]), int(sequence[0, 0])


def generate(server, model="ensemble", prompts=PROMPTS[:1], outputs=None, **inputs) -> Request:
    return Request(server.grpc_url, model, trtllm_inputs(prompts, **inputs), outputs).wait()


def error_of(server, **inputs) -> str:
    """The message of the error a gRPC stream gets (a stream error carries no status code)."""
    request = Request(server.grpc_url, "ensemble", trtllm_inputs(PROMPTS[:1], max_tokens=4, **inputs)).wait()
    assert request.errors and not request.responses, f"expected an error, got {request.texts()}"
    return str(request.errors[0])


def http_error_of(server, **inputs) -> tuple[int, str]:
    """Status and message of the same request through HTTP generate (scalars and word lists only)."""
    body = {"text_input": PROMPTS[0], "max_tokens": 4, **{k: v.tolist() if isinstance(v, np.ndarray) else v
                                                          for k, v in inputs.items()}}
    status, reply = post(f"http://{server.http_url}/v2/models/ensemble/generate", body)
    return status, json.loads(reply).get("error", reply)


@pytest.fixture(scope="module")
def greedy():
    """The reference's greedy continuation of each prompt: (ids, text up to EOS)."""
    prompts = [prompt_ids(p, chat=False) for p in PROMPTS]
    eos = tokenizer().eos_token_id
    results = {}
    for prompt, ids in zip(PROMPTS, greedy_reference(prompts, MAX_TOKENS)):
        ids, _ = sent_ids(ids, MAX_TOKENS, eos)
        results[prompt] = (ids, tokenizer().decode(ids, skip_special_tokens=True))
    return results


def test_ensemble_and_generate_serve_the_whole_contract(server):
    for model in ("ensemble", "generate"):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        metadata = client.get_model_metadata(model, as_json=True)
        client.close()
        inputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in metadata["inputs"]}
        outputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in metadata["outputs"]}
        triton_type = {"TYPE_STRING": "BYTES", "TYPE_FP16": "FP16", "TYPE_FP32": "FP32", "TYPE_INT32": "INT32",
                       "TYPE_INT64": "INT64", "TYPE_UINT64": "UINT64", "TYPE_BOOL": "BOOL"}
        assert inputs == {s.name: (triton_type[s.dtype], [-1, *s.dims]) for s in (*INPUTS, *EXTRA_INPUTS)}
        assert outputs == {s.name: (triton_type[s.dtype], [-1, *s.dims]) for s in (*OUTPUTS, *EXTRA_OUTPUTS)}


def test_whole_answers_include_the_prompt_streamed_chunks_never(server, greedy):
    prompt = PROMPTS[0]
    ids, text = greedy[prompt]
    whole = generate(server, prompts=[prompt])  # temperature 1.0 alone, as the client sends: greedy
    streamed = generate(server, "generate", prompts=[prompt], stream=True)
    excluded = generate(server, prompts=[prompt], exclude_input_in_output=True)
    assert whole.texts() == {(0, 0): tokenizer().decode(prompt_ids(prompt, False) + ids, skip_special_tokens=True)}
    assert whole.texts()[(0, 0)] == prompt + text  # what the client's --check-outputs compares
    sent_counts = [int(r.as_numpy("completion_tokens")[0, 0]) for r in streamed.responses]
    assert streamed_in_intervals(sent_counts, len(ids), LLMConfig().stream_interval), sent_counts
    assert streamed.texts() == excluded.texts() == {(0, 0): text}
    # TensorRT-LLM's client reads text_output as output[0]: one string, no second dimension.
    assert whole.responses[0].as_numpy("text_output").shape == (1,)
    status, body = post(f"http://{server.http_url}/v2/models/ensemble/generate",
                        {"text_input": prompt, "max_tokens": MAX_TOKENS, "exclude_input_in_output": False})
    assert status == 200 and json.loads(body)["text_output"] == prompt + text


@pytest.mark.parametrize("stream", [False, True])
def test_batched_prompts_answer_per_prompt_as_alone(server, greedy, stream):
    batched = generate(server, prompts=PROMPTS, stream=stream, exclude_input_in_output=True,
                       stop_words=np.array([[b"\n\n", b""], [b" 7", b" 8"], [b"", b""]], dtype=object))
    assert not batched.errors
    alone = {row: generate(server, prompts=[p], stream=stream, exclude_input_in_output=True,
                           stop_words=[w for w in words if w]).texts()[(0, 0)]
             for row, (p, words) in enumerate(zip(PROMPTS, [["\n\n"], [" 7", " 8"], []]))}
    assert batched.texts() == {(row, 0): text for row, text in alone.items()}
    assert alone[1] == greedy[PROMPTS[1]][1].split(" 7")[0]  # the stop word ended it before its ids
    final_flags = [r.get_response().parameters["triton_final_response"].bool_param for r in batched.responses]
    assert final_flags.count(True) == 1 and final_flags[-1]


def test_n_greedy_sequences_are_identical(server, greedy):
    request = generate(server, num_return_sequences=3, exclude_input_in_output=True, stream=True)
    texts = request.texts()
    assert sorted(texts) == [(0, 0), (0, 1), (0, 2)]
    assert set(texts.values()) == {greedy[PROMPTS[0]][1]}


def test_n_sampled_sequences_are_reproducible_by_seed(server):
    sampling = dict(num_return_sequences=4, exclude_input_in_output=True, top_k=50, top_p=0.95, temperature=1.2,
                    max_tokens=10)
    first, again = generate(server, seed=1234, **sampling).texts(), generate(server, seed=1234, **sampling).texts()
    by_old_name = generate(server, random_seed=1234, **sampling).texts()
    other = generate(server, seed=99, **sampling).texts()
    one = generate(server, seed=1234, **{**sampling, "num_return_sequences": 1}).texts()
    assert first == again == by_old_name and len(first) == 4
    assert len(set(first.values())) > 1 and first != other
    assert one[(0, 0)] == first[(0, 0)]  # the first sequence is the request's own seed


def test_counts_and_perf_metrics_on_request(server, greedy):
    before = time.time_ns()
    whole = generate(server, return_num_input_tokens=True, return_num_output_tokens=True, return_perf_metrics=True,
                     exclude_input_in_output=True)
    streamed = generate(server, stream=True, return_num_output_tokens=True)
    final = whole.responses[-1]
    ids = greedy[PROMPTS[0]][0]
    assert final.as_numpy("num_input_tokens")[0, 0] == len(prompt_ids(PROMPTS[0], False))
    assert final.as_numpy("num_output_tokens")[0, 0] == len(ids)
    assert sum(int(r.as_numpy("num_output_tokens")[0, 0]) for r in streamed.responses) == len(ids)
    arrival, first, last = (int(final.as_numpy(n)[0, 0]) for n in
                            ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"))
    assert before < arrival <= first <= last < time.time_ns()
    assert final.as_numpy("kv_cache_reused_blocks")[0, 0] == 0 and final.as_numpy("total_draft_tokens")[0, 0] == 0
    assert streamed.responses[0].as_numpy("arrival_time_ns") is None  # not asked for


def test_log_probs_equal_the_reference_scores(server, greedy):
    request = generate(server, stream=True, return_log_probs=True, exclude_input_in_output=True)
    log_probs = np.concatenate([r.as_numpy("output_log_probs").reshape(-1) for r in request.responses])
    cumulative = request.responses[-1].as_numpy("cum_log_probs")[0, 0]
    reference = scored_greedy(prompt_ids(PROMPTS[0], False), MAX_TOKENS)
    expected = [float(row[token]) for row, token in zip(reference.raw, reference.ids)]
    count = len(greedy[PROMPTS[0]][0])
    np.testing.assert_allclose(log_probs, expected[:count], atol=2e-3)
    assert cumulative == pytest.approx(math.fsum(expected[:count]), abs=1e-2)


def top_arrays(request: Request, name: str) -> np.ndarray:
    """A sequence's [tokens, k] alternatives (or [tokens] per-token values) over its responses."""
    return np.concatenate([r.as_numpy(name)[0, 0] for r in request.responses])


def test_top_logprobs_equal_the_reference_processed_scores(server):
    """The alternatives come from the distribution the token was chosen from: after a repetition
    penalty (transformers' `scores` or llama.cpp's penalties sampler, not the raw logits), so the
    chosen token heads them (greedy)."""
    prompt = "1, 2, 3, 1, 2, 3, 1, 2, 3,"
    asked = dict(prompts=[prompt], max_tokens=16, exclude_input_in_output=True, repetition_penalty=1.3,
                 top_logprobs=5)
    whole, streamed = generate(server, **asked), generate(server, stream=True, **asked)
    generated, raw, processed = scored_greedy(prompt_ids(prompt, False), 16, repetition_penalty=1.3)
    top_ids, top_log_probs = top_arrays(whole, "output_top_ids"), top_arrays(whole, "output_top_log_probs")
    log_probs = top_arrays(whole, "output_log_probs")
    count = len(log_probs)
    assert top_ids.shape == top_log_probs.shape == (count, 5) and count >= 8
    for i in range(count):
        expected_ids = np.argsort(-processed[i], kind="stable")[:5]
        np.testing.assert_allclose(top_log_probs[i], processed[i][expected_ids], atol=2e-3)
        assert top_ids[i, 0] == generated[i] == expected_ids[0] and top_log_probs[i, 0] == log_probs[i]
        assert all(top_log_probs[i][j] >= top_log_probs[i][j + 1] for j in range(4))
    # The penalty moved the distribution: raw log-softmax would differ from what was reported.
    assert max(abs(raw[i][generated[i]] - log_probs[i]) for i in range(count)) > 0.05
    # Streamed == whole, token by token.
    for name in ("output_top_ids", "output_top_log_probs", "output_log_probs"):
        np.testing.assert_array_equal(top_arrays(streamed, name), top_arrays(whole, name), err_msg=name)
    # Texts of the alternatives: the greedy choice's own share heads them.
    whole_texts = generate(server, return_token_texts=True, **asked)
    np.testing.assert_array_equal(top_arrays(whole_texts, "output_top_texts")[:, 0],
                                  top_arrays(whole_texts, "output_token_texts"))


def test_sampled_tokens_are_among_their_alternatives_or_below_them(server):
    """OpenAI's definition: top_logprobs lists the most likely tokens; the sampled one is one of them
    or less likely than all of them. Seeded: streamed equals whole."""
    asked = dict(prompts=[PROMPTS[2]], max_tokens=24, exclude_input_in_output=True, temperature=1.3, top_p=0.98,
                 seed=11, top_logprobs=2)
    whole, streamed = generate(server, **asked), generate(server, stream=True, **asked)
    top_ids, top_log_probs = top_arrays(whole, "output_top_ids"), top_arrays(whole, "output_top_log_probs")
    log_probs = top_arrays(whole, "output_log_probs")
    outside = 0
    for i, log_prob in enumerate(log_probs):
        if log_prob in top_log_probs[i]:
            continue
        outside += 1
        assert log_prob <= top_log_probs[i, -1] + 1e-6
    assert outside >= 1, "every sampled token was among the top 2: the other case went untested"
    assert top_ids.shape == (len(log_probs), 2) and len(log_probs) >= 8
    for name in ("output_top_ids", "output_top_log_probs", "output_log_probs"):
        np.testing.assert_array_equal(top_arrays(streamed, name), top_arrays(whole, name), err_msg=name)


@pytest.mark.parametrize("prompt", ["The capital of France is", "日本の首都は東京です。中国の首都は"])
def test_token_texts_join_to_the_text_streamed_as_whole(server, prompt):
    asked = dict(prompts=[prompt], max_tokens=24, return_token_texts=True, return_log_probs=True)
    whole = generate(server, exclude_input_in_output=True, **asked)
    streamed = generate(server, stream=True, **asked)
    echoed = generate(server, **asked)  # the prompt decoded with the answer: texts still per generated token
    shares = list(top_arrays(whole, "output_token_texts"))
    text = whole.texts()[(0, 0)]
    assert len(shares) == len(top_arrays(whole, "output_log_probs")) == int(whole.finals()[(0, 0)].as_numpy(
        "completion_tokens")[0, 0])
    assert b"".join(shares).decode("utf-8", "replace") == text
    assert list(top_arrays(streamed, "output_token_texts")) == shares
    assert b"".join(top_arrays(streamed, "output_token_texts")).decode("utf-8", "replace") == streamed.texts()[(0, 0)]
    assert list(top_arrays(echoed, "output_token_texts")) == shares and echoed.texts()[(0, 0)].endswith(text)
    if prompt.isascii():
        assert text.isascii()
    else:  # the multi-byte case is exercised: some token holds only part of a character
        assert not text.isascii() and any(_not_utf8(share) for share in shares), text
    plain = generate(server, exclude_input_in_output=True, prompts=[prompt], max_tokens=4)
    assert plain.responses[-1].as_numpy("output_token_texts") is None  # not asked for


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_penalties_change_the_text_as_the_reference_does(server):
    prompt = "1, 2, 3, 1, 2, 3, 1, 2, 3,"
    plain = generate(server, prompts=[prompt], exclude_input_in_output=True, max_tokens=16).texts()[(0, 0)]
    penalised = generate(server, prompts=[prompt], exclude_input_in_output=True, max_tokens=16,
                         repetition_penalty=1.8).texts()[(0, 0)]
    reference = scored_greedy(prompt_ids(prompt, False), 16, repetition_penalty=1.8)
    expected = tokenizer().decode(reference.ids, skip_special_tokens=True)
    assert penalised == expected and penalised != plain


def test_bad_words_are_never_generated_and_min_tokens_holds_the_end(server, greedy):
    ids, text = greedy[PROMPTS[0]]
    first_word = tokenizer().decode(ids[:1])
    avoided = generate(server, exclude_input_in_output=True, bad_words=[first_word]).texts()[(0, 0)]
    assert not avoided.startswith(first_word) and avoided
    chat = dict(prompts=["Say OK."], max_tokens=40, exclude_input_in_output=True, apply_chat_template=True)
    short, held = generate(server, **chat), generate(server, min_tokens=30, **chat)
    assert held.responses[-1].as_numpy("completion_tokens")[0, 0] >= 30
    assert short.responses[-1].as_numpy("completion_tokens")[0, 0] < 30


def test_guided_json_parses_and_validates(server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    request = generate(server, prompts=["Give the largest city of France as JSON:"], max_tokens=48,
                       exclude_input_in_output=True, guided_decoding_guide_type="json_schema",
                       guided_decoding_guide=json.dumps(schema))
    final = request.finals()[(0, 0)]
    assert final.as_numpy("finish_reason")[0, 0] == b"stop"  # the grammar ended it, not max_tokens
    answer = json.loads(request.texts()[(0, 0)])
    # The schema's every rule: an object, exactly these keys, a string and an integer.
    assert set(answer) == {"city", "population"}
    assert isinstance(answer["city"], str) and type(answer["population"]) is int


UNSUPPORTED_VALUES = {
    "decoder_text_input": "Bonjour", "beam_width": 4, "return_context_logits": True, "return_generation_logits": True,
    "prompt_embedding_table": np.zeros((1, 2, 8), dtype=np.float16), "prompt_table_extra_id": 1,
    "prompt_vocab_size": 2, "embedding_bias_words": ["Paris"],
    "embedding_bias_weights": np.array([[1.0]], dtype=np.float32), "lora_task_id": 3,
    "lora_weights": np.zeros((1, 2, 8), dtype=np.float16), "lora_config": np.zeros((1, 2, 3), dtype=np.int32),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_what_no_engine_honours_is_invalid_arg_naming_it(server, name):
    value = UNSUPPORTED_VALUES[name]
    message = error_of(server, **{name: value})
    assert f"{name}: " in message and UNSUPPORTED[name] in message, message
    if not isinstance(value, np.ndarray):  # JSON carries it: HTTP shows the status, INVALID_ARG is 400
        status, message = http_error_of(server, **{name: value})
        assert status == 400 and f"{name}: " in message, message


@pytest.mark.parametrize("inputs, named", [
    ({"num_return_sequences": 0}, "num_return_sequences: 0 is outside 1..16"),
    ({"repetition_penalty": -1.0}, "repetition_penalty: -1.0 must be a finite number > 0"),
    ({"presence_penalty": float("nan")}, "presence_penalty: nan must be a finite number"),
    ({"min_tokens": -2}, "min_tokens: -2 is outside 0..max_tokens (4)"),
    ({"min_length": 9}, "min_tokens: 9 is outside 0..max_tokens (4)"),
    ({"seed": 1, "random_seed": 2}, "seed: random_seed and seed are the same input and differ"),
    ({"top_p": 1.5}, "top_p: 1.5 must be in (0, 1]"),
    ({"pad_id": -1}, "pad_id: -1 is outside the vocabulary"),
    ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": "object",'},
     "guided_decoding_guide: json_schema does not compile"),
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[a-"}, "guided_decoding_guide: regex does not compile"),
    ({"guided_decoding_guide_type": "xml", "guided_decoding_guide": "<a/>"}, "guided_decoding_guide_type: 'xml' must be one of"),
    ({"bad_words": ["w"] * 17}, "bad_words: 17 words is over the limit of 16"),
    ({"top_logprobs": 21}, "top_logprobs: 21 is outside 0..20"),
    ({"top_logprobs": -1}, "top_logprobs: -1 is outside 0..20"),
])
def test_bad_values_get_an_error_naming_the_input_and_limit(server, inputs, named):
    message = error_of(server, **inputs)
    assert named in message, message
    if not any(isinstance(v, float) and math.isnan(v) for v in inputs.values()):  # JSON has no NaN
        status, message = http_error_of(server, **inputs)
        assert status == 400 and named in message, message

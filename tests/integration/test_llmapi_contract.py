"""TensorRT-LLM's LLM-API contract (tritonfront.core.llmapi_contract) on a real tritonserver, with
requests shaped as that model's clients send them (triton_backend/tools/llmapi_client.py and
tools/inflight_batcher_llm/end_to_end_test.py --test-llmapi): one prompt as text_input [1], scalars
as [1], no batch dimension; whole answers over unary gRPC (with llmapi_client's `Streaming`
parameter), HTTP infer and HTTP generate to `tensorrt_llm`, streams over gRPC to
`tensorrt_llm_decoupled`. Greedy text equals the generate ensemble's for the same prompt; a stream's
text_output is the text so far and ends as the whole answer; each sampling parameter does what the
generate input it maps to does there, or is refused by name; stop strings end the text and name
themselves; a stop request ends the requests of its id; LoRA and image inputs are refused by name.
Runs on the committed deployment, or the engine TRITONFRONT_TEST_ENGINE names (the `server`
fixture: marker contract)."""
import json
import math
import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from harness.clients.http import post, sse_events
from harness.load.threads import poll
from harness.triton_metrics import llm_gauges
from tritonfront.core.llmapi_contract import DECOUPLED_MODEL_NAME, INPUTS, MODEL_NAME, OUTPUTS, UNSUPPORTED

PROMPT = "The capital of France is"
COUNTING = "1, 2, 3, 4, 5, 6,"  # goes on counting: long answers for max_tokens and stop tests
STOPPED_MAX_TOKENS = 4000  # 25 s or more on either CPU engine: only a stop ends such a request in 20 s
MAX_TOKENS = 12
NUMPY = {"TYPE_STRING": np.object_, "TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_FP32": np.float32,
         "TYPE_UINT64": np.uint64}
TRITON = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_FP32": "FP32",
          "TYPE_UINT64": "UINT64", "TYPE_INT64": "INT64"}
SPECS = {spec.name: spec for spec in INPUTS}


def llmapi_inputs(module, prompt: str = PROMPT, **values) -> list:
    """As NVIDIA's clients build them: text_input np.array([prompt], object), every other input a
    [1] array of its declared type (sampling_param_stop: [words])."""
    arrays = {"text_input": np.array([prompt.encode()], dtype=object)}
    for name, value in values.items():
        dtype = NUMPY[SPECS[name].dtype]
        items = value if isinstance(value, list) else [value]
        arrays[name] = np.array([v.encode() if isinstance(v, str) else v for v in items], dtype=dtype)
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def unary(server, prompt=PROMPT, request_id="", **values):
    """llmapi_client.py's call: gRPC ModelInfer with the request id and {"Streaming": False}."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return client.infer(MODEL_NAME, llmapi_inputs(grpcclient, prompt, **values), request_id=request_id,
                            parameters={"Streaming": False})
    finally:
        client.close()


def unary_error(server, **values) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as error:
        unary(server, **values)
    return error.value


def text(result) -> str:
    return result.as_numpy("text_output")[0].decode()


def outputs(result) -> dict:
    return {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}


def stream(server, prompt=PROMPT, request_id="", on_response=None, **values) -> list:
    """end_to_end_test.py --streaming's call: a gRPC stream to the decoupled model, `streaming`
    true; every response until Triton's final flag (`on_response(count)` after each)."""
    client, responses = grpcclient.InferenceServerClient(server.grpc_url), queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(DECOUPLED_MODEL_NAME, llmapi_inputs(grpcclient, prompt, streaming=True, **values),
                                  request_id=request_id, enable_empty_final_response=True)
        results = []
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                raise error
            if result.get_response().outputs:
                results.append(result)
                if on_response is not None:
                    on_response(len(results))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return results
    finally:
        client.stop_stream()
        client.close()


def generate_answer(server, prompt=PROMPT, max_tokens=MAX_TOKENS, **values):
    """The generate ensemble's whole answer to the same prompt (text only), for comparison."""
    client, responses = grpcclient.InferenceServerClient(server.grpc_url), queue.Queue()
    arrays = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32),
              "exclude_input_in_output": np.array([[True]])}
    types = {"seed": np.uint64, "temperature": np.float32, "top_p": np.float32, "presence_penalty": np.float32,
             "frequency_penalty": np.float32, "top_k": np.int32, "return_log_probs": np.bool_}
    arrays.update({name: np.array([[value]], dtype=types[name]) for name, value in values.items()})
    tensors = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("generate", tensors, enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                raise error
            if result.get_response().outputs:
                return result
    finally:
        client.stop_stream()
        client.close()


@pytest.fixture(scope="module")
def greedy(server) -> str:
    return text(generate_answer(server))


@pytest.mark.parametrize("model", [MODEL_NAME, DECOUPLED_MODEL_NAME])
def test_both_models_declare_nvidias_tensors_without_a_batch_dimension(server, model):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    metadata = client.get_model_metadata(model, as_json=True)
    config = client.get_model_config(model, as_json=True)["config"]
    client.close()
    shapes = lambda tensors: {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in tensors}
    assert shapes(metadata["inputs"]) == {s.name: (TRITON[s.dtype], list(s.dims)) for s in INPUTS}
    assert shapes(metadata["outputs"]) == {s.name: (TRITON[s.dtype], list(s.dims)) for s in OUTPUTS}
    assert int(config.get("max_batch_size", 0)) == 0


def test_whole_answers_over_unary_grpc_http_infer_and_generate_are_generates_greedy_text(server, greedy):
    result = unary(server, request_id="1", sampling_param_max_tokens=MAX_TOKENS)
    # NVIDIA's default (exclude_input_from_output false): the prompt, then the answer; nothing else
    # unless asked for; one string, as its clients read it (output[0]).
    assert text(result) == PROMPT + greedy and list(outputs(result)) == ["text_output"]
    assert result.as_numpy("text_output").shape == (1,)
    excluded = dict(sampling_param_max_tokens=MAX_TOKENS, sampling_param_exclude_input_from_output=True)
    assert text(unary(server, **excluded)) == greedy
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        assert text(http.infer(MODEL_NAME, llmapi_inputs(httpclient, **excluded), request_id="2")) == greedy
    finally:
        http.close()
    status, body = post(f"http://{server.http_url}/v2/models/{MODEL_NAME}/generate",
                        {"text_input": PROMPT, **excluded})
    assert status == 200 and json.loads(body)["text_output"] == greedy


def test_a_stream_sends_the_text_so_far_and_ends_as_the_whole_answer(server, greedy):
    responses = stream(server, sampling_param_max_tokens=MAX_TOKENS, return_finish_reason=True)
    texts = [text(r) for r in responses]
    assert len(texts) > 1 and texts[-1] == PROMPT + greedy
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:])), texts
    reasons = [r.as_numpy("finish_reason")[0] for r in responses]
    assert reasons[:-1] == [b"None"] * (len(reasons) - 1) and reasons[-1] in (b"length", b"stop")
    excluded = stream(server, sampling_param_max_tokens=MAX_TOKENS, sampling_param_exclude_input_from_output=True)
    assert text(excluded[-1]) == greedy and text(excluded[0]) != ""
    # Over HTTP's generate_stream the texts so far arrive as events (cut where that run's chunks were).
    status, body = post(f"http://{server.http_url}/v2/models/{DECOUPLED_MODEL_NAME}/generate_stream",
                        {"text_input": PROMPT, "streaming": True, "sampling_param_max_tokens": MAX_TOKENS})
    events = [event["text_output"] for event in sse_events(body)]
    assert status == 200 and events[-1] == texts[-1]
    assert all(later.startswith(earlier) for earlier, later in zip(events, events[1:])), events


def test_the_model_that_is_not_decoupled_refuses_to_stream_as_nvidias_does(server):
    error = unary_error(server, streaming=True, sampling_param_max_tokens=4)
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "streaming: true needs a decoupled model" in str(error)


def test_without_max_tokens_tensorrt_llms_default_of_32_tokens(server):
    answer = text(unary(server, prompt=COUNTING, sampling_param_exclude_input_from_output=True))
    assert answer == text(generate_answer(server, prompt=COUNTING, max_tokens=32))


def test_temperature_alone_samples_top_k_1_or_top_p_0_is_greedy(server, greedy):
    base = dict(sampling_param_max_tokens=MAX_TOKENS, sampling_param_exclude_input_from_output=True)
    hot = dict(sampling_param_temperature=1.8, sampling_param_seed=7, **base)
    sampled = text(unary(server, **hot))
    # TensorRT-LLM's SamplingParams: a temperature alone samples from every token at it; the same
    # seed draws the same (generate's sampling with those settings gives the same text).
    assert sampled == text(unary(server, **hot)) != greedy
    assert sampled == text(generate_answer(server, temperature=1.8, top_p=1.0, seed=7))
    assert text(unary(server, sampling_param_top_k=1, **{**hot, "sampling_param_seed": 8})) == greedy
    assert text(unary(server, sampling_param_top_p=0.0, **hot)) == greedy
    assert text(unary(server, sampling_param_temperature=0.0, sampling_param_top_k=40, **base)) == greedy


def test_top_k_top_p_and_penalties_are_those_of_generate(server, greedy):
    base = dict(sampling_param_max_tokens=MAX_TOKENS, sampling_param_exclude_input_from_output=True,
                sampling_param_seed=11)
    nucleus = text(unary(server, sampling_param_top_k=5, sampling_param_top_p=0.9, **base))
    assert nucleus == text(generate_answer(server, top_k=5, top_p=0.9, temperature=1.0, seed=11))
    penalised = dict(prompt=COUNTING, sampling_param_max_tokens=MAX_TOKENS,
                     sampling_param_exclude_input_from_output=True, sampling_param_presence_penalty=1.5,
                     sampling_param_frequency_penalty=0.5)
    try:
        answer = text(unary(server, **penalised))
    except InferenceServerException as error:  # an engine that applies no penalties refuses them by name
        assert "sampling_param_presence_penalty: " in str(error), str(error)
        return
    assert answer == text(generate_answer(server, prompt=COUNTING, presence_penalty=1.5, frequency_penalty=0.5))
    assert answer != text(generate_answer(server, prompt=COUNTING))


def test_stop_strings_end_the_text_and_stop_reason_names_them(server):
    asked = dict(prompt=COUNTING, sampling_param_max_tokens=24, sampling_param_exclude_input_from_output=True,
                 return_finish_reason=True, return_stop_reason=True)
    stopped = unary(server, sampling_param_stop=[" 9", "never"], **asked)
    plain = unary(server, **asked)
    assert text(plain).startswith(text(stopped)) and " 9" in text(plain) and " 9" not in text(stopped)
    assert outputs(stopped)["finish_reason"].tolist() == [b"stop"]
    assert outputs(stopped)["stop_reason"].tolist() == [b" 9"]
    assert outputs(plain)["finish_reason"].tolist() == [b"length"]
    assert outputs(plain)["stop_reason"].tolist() == [b"None"]  # NVIDIA's str(None)


def test_cumulative_logprob_and_perf_metrics_on_request(server):
    before = time.time_ns()
    result = unary(server, sampling_param_max_tokens=MAX_TOKENS, sampling_param_exclude_input_from_output=True,
                   return_cumulative_logprob=True, sampling_param_return_perf_metrics=True)
    reference = generate_answer(server, return_log_probs=True)
    got = outputs(result)
    assert got["cumulative_logprob"].dtype == np.float32 and got["cumulative_logprob"].shape == (1,)
    assert got["cumulative_logprob"][0] == pytest.approx(float(reference.as_numpy("cum_log_probs").reshape(-1)[0]),
                                                         abs=1e-3)
    assert got["cumulative_logprob"][0] < 0 and math.isfinite(got["cumulative_logprob"][0])
    times = [int(got[name][0]) for name in ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns")]
    assert before < times[0] <= times[1] <= times[2] < time.time_ns()
    assert {name: got[name].dtype for name in ("arrival_time_ns", "kv_cache_reused_block", "kv_cache_hit_rate")} == {
        "arrival_time_ns": np.int64, "kv_cache_reused_block": np.int32, "kv_cache_hit_rate": np.float32}
    unmeasured = ("kv_cache_reused_block", "kv_cache_missed_block", "kv_cache_alloc_new_blocks",
                  "kv_cache_alloc_total_blocks", "kv_cache_hit_rate", "first_scheduled_time_ns", "acceptance_rate",
                  "total_accepted_draft_tokens", "total_draft_tokens")
    assert [float(got[name][0]) for name in unmeasured] == [0.0] * len(unmeasured)  # documented as not measured


def stop_signal(server, request_id: str):
    """llmapi_client.py's prepare_stop_signals: an empty text_input and stop true, same request id."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stop", [1], "BOOL")]
    inputs[0].set_data_from_numpy(np.empty([1], dtype=np.bytes_))
    inputs[1].set_data_from_numpy(np.array([True], dtype="bool"))
    try:
        with pytest.raises(InferenceServerException) as answer:
            client.infer(MODEL_NAME, inputs, request_id=request_id, parameters={"Streaming": False})
        return answer.value
    finally:
        client.close()


def test_a_stop_request_ends_a_stream_and_a_whole_answer_of_its_id(server):
    # The stream: stopped once it has sent something.
    stopped = threading.Event()

    def stop_after_first(count):
        if count == 1:
            answer = stop_signal(server, "story-1")
            assert answer.status() == "StatusCode.CANCELLED", str(answer)
            stopped.set()

    started = time.monotonic()
    responses = stream(server, prompt=COUNTING, request_id="story-1", on_response=stop_after_first,
                       sampling_param_max_tokens=STOPPED_MAX_TOKENS, return_finish_reason=True)
    assert stopped.is_set() and responses[-1].as_numpy("finish_reason").tolist() == [b"cancelled"]
    assert time.monotonic() - started < 20
    # The whole answer: stopped while the llm runs it, so the llm first lets the stopped stream go
    # (a stop counts for requests that arrived before it, and the sequence seen running was the
    # stream's now and then); it answers with what it had.
    assert poll(lambda: not llm_gauges(server.metrics())["active_sequences"], 60, every=0.05), \
        "the stopped stream still runs in the llm"
    result = {}
    whole = threading.Thread(target=lambda: result.setdefault("r", unary(
        server, prompt=COUNTING, request_id="story-2", sampling_param_max_tokens=STOPPED_MAX_TOKENS,
        return_finish_reason=True)))
    whole.start()
    assert poll(lambda: not whole.is_alive() or llm_gauges(server.metrics())["active_sequences"], 60, every=0.05) \
        and whole.is_alive(), "the whole request never ran in the llm"
    assert stop_signal(server, "story-2").status() == "StatusCode.CANCELLED"
    whole.join(timeout=60)
    assert outputs(result["r"])["finish_reason"].tolist() == [b"cancelled"]
    # As NVIDIA's: a stop for an id nobody sent is answered the same, and a later request of that id
    # is not stopped by it; a stop without an id is refused by name.
    assert stop_signal(server, "story-3").status() == "StatusCode.CANCELLED"
    assert outputs(unary(server, request_id="story-3", sampling_param_max_tokens=4,
                         return_finish_reason=True))["finish_reason"].tolist() in ([b"length"], [b"stop"])
    anonymous = stop_signal(server, "")
    assert anonymous.status() == "StatusCode.INVALID_ARGUMENT" and "stop: needs the request id" in str(anonymous)


UNSUPPORTED_VALUES = {"image_url": "https://example.com/cat.png", "lora_id": 3, "lora_name": "adapter",
                      "lora_path": "/models/lora", "lora_ckpt_source": "hf"}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_lora_and_image_inputs_are_refused_by_name(server, name):
    error = unary_error(server, sampling_param_max_tokens=4, **{name: UNSUPPORTED_VALUES[name]})
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and f"{name}: {UNSUPPORTED[name]}" in str(error)
    status, body = post(f"http://{server.http_url}/v2/models/{MODEL_NAME}/generate",
                        {"text_input": PROMPT, "sampling_param_max_tokens": 4, name: UNSUPPORTED_VALUES[name]})
    assert status == 400 and f"{name}: " in json.loads(body)["error"]


@pytest.mark.parametrize("values, named", [
    ({"sampling_param_best_of": 2}, "sampling_param_best_of: 2: only 1 is served"),
    ({"sampling_param_top_p": 1.5}, "sampling_param_top_p: 1.5 must be in [0, 1]"),
    ({"sampling_param_temperature": -1.0}, "sampling_param_temperature: -1.0 must be a finite number >= 0"),
    ({"sampling_param_top_k": -1}, "sampling_param_top_k: -1 must be >= 0"),
    ({"sampling_param_max_tokens": 0}, "sampling_param_max_tokens: 0 is outside 1.."),
    ({"sampling_param_presence_penalty": float("nan")}, "sampling_param_presence_penalty: nan must be a finite number"),
    ({"sampling_param_stop": ["w"] * 17}, "sampling_param_stop: 17 words is over the limit of 16"),
])
def test_bad_values_are_invalid_arg_naming_the_input(server, values, named):
    error = unary_error(server, **{"sampling_param_max_tokens": 4, **values})
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and named in str(error), str(error)


def test_over_http_a_key_that_is_no_input_is_refused_with_the_input_meant(server):
    # NVIDIA's own curl example for this model sends max_tokens, which its model ignores.
    status, body = post(f"http://{server.http_url}/v2/models/{MODEL_NAME}/generate",
                        {"text_input": PROMPT, "max_tokens": 4})
    assert status == 400 and "max_tokens: tensorrt_llm has no input or parameter of this name (did you mean " \
                             "sampling_param_max_tokens?)" in json.loads(body)["error"]

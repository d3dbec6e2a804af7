"""The model.py adapters and src/tritonfront/stubs/glue.py against a fake Triton Python backend
(fake_pb_utils.py installed as triton_python_backend_utils), as Triton's stub drives them: the
committed config.pbtxt as initialize's args, requests in, responses or decoupled sends out.
Tokenizers, encoder and pooling head are the bundled models; the llm's engine is a small fake."""
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from google.protobuf import json_format

from harness.chunks import detokenizer_request
from harness.deploy import load_module, read_model_config
from harness.load.threads import poll
from tritonfront.core import model_sources
from tritonfront.core.delivery import NO_SLOT, SLOTS, Acknowledger, ack_table_path, model_key
from tritonfront.engines import Engine, EngineOutput
from tritonfront.core.shared_tables import open_rows, table_path
from tritonfront import stubs
from tritonfront.core.tokenization import BatchTokenizer, TextRequest
from tritonfront.errors import ConfigError
from tritonfront.watchdog import running

ROOT = Path(__file__).resolve().parents[2]
GLUE = "tritonfront.stubs.glue"
LLM_NAMES = itertools.count()


def fake_pb_utils():
    return load_module(Path(__file__).with_name("fake_pb_utils.py"), "triton_python_backend_utils")


@contextlib.contextmanager
def installed(fake):
    """`fake` as triton_python_backend_utils, with the glue imported afresh on top of it."""
    saved = {name: sys.modules.pop(name, None) for name in ("triton_python_backend_utils", GLUE)}
    # `from tritonfront.stubs import glue` returns the package's attribute when it has one.
    saved_attribute = vars(stubs).pop("glue", None)
    sys.modules["triton_python_backend_utils"] = fake
    try:
        yield fake
    finally:
        for name, module in saved.items():
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module
        vars(stubs).pop("glue", None)
        if saved_attribute is not None:
            stubs.glue = saved_attribute


@pytest.fixture(scope="module")
def pb_utils():
    with installed(fake_pb_utils()) as fake:
        yield fake


@pytest.mark.parametrize("model", ["tokenizer", "llm_tokenizer", "encoder", "pooler", "detokenizer", "llm",
                                   "tensorrt_llm"])
def test_the_glue_and_adapters_import_before_the_stub_adds_its_classes(model):
    fake = fake_pb_utils()
    for name in fake.STUB_PROVIDED:
        delattr(fake, name)
    with installed(fake):
        load_adapter(fake, model)


def triton_args(model: str, name: str = "", parameters: dict = {}, **config_changes) -> dict:
    """initialize's args for the committed config of `model` (as Triton's JSON, with the instance
    group names Triton fills in), served as `name`, with these parameters and fields changed."""
    name = name or model
    config = read_model_config(ROOT / "model_repository" / model)
    config.name = name
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    as_dict = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for i, group in enumerate(as_dict.get("instance_group", [])):
        group.setdefault("name", f"{name}_{i}")
    for key, value in config_changes.items():
        if value is None:
            as_dict.pop(key, None)
        else:
            as_dict[key] = value
    return {"model_config": json.dumps(as_dict), "model_name": name, "model_instance_name": f"{name}_0_0",
            "model_instance_kind": "CPU", "model_instance_device_id": "0", "model_version": "1"}


def load_adapter(pb_utils, model: str):
    return load_module(ROOT / "model_repository" / model / "1" / "model.py", f"adapter_{model}")


def started(pb_utils, model: str, **args):
    adapter = load_adapter(pb_utils, model).TritonPythonModel()
    adapter.initialize(triton_args(model, **args))
    return adapter


def texts(*items: bytes) -> np.ndarray:
    return np.array([[item] for item in items], dtype=np.object_)


def error_of(response) -> tuple[int, str]:
    assert response.has_error(), f"expected an error, got outputs {list(response.outputs())}"
    return response.error().code(), response.error().message()


# --- non-decoupled models: one response per request, in order -------------------------------------


@pytest.fixture(scope="module")
def tokenizer(pb_utils):
    return started(pb_utils, "tokenizer")


def test_tokenizer_answers_each_request_of_a_batch_on_its_own(pb_utils, tokenizer):
    good = pb_utils.FakeRequest({"text_input": texts(b"Triton serves sentence embeddings", b"two")})
    not_utf8 = pb_utils.FakeRequest({"text_input": texts(b"fine", b"\xff\xfe")})
    missing = pb_utils.FakeRequest({"truncate": np.array([[True]])})
    too_long = pb_utils.FakeRequest({"text_input": texts(b"word " * 400), "truncate": np.array([[False]])})
    responses = tokenizer.execute([good, not_utf8, missing, too_long])
    assert len(responses) == 4
    reference = BatchTokenizer.from_folder(model_sources.embed_model_dir()).encode_requests(
        [TextRequest(["Triton serves sentence embeddings", "two"])])[0]
    outputs = responses[0].outputs()
    assert set(outputs) == {"input_ids", "input_lengths"}
    assert outputs["input_ids"].tolist() == reference.input_ids.tolist()
    assert outputs["input_lengths"].tolist() == reference.input_lengths.tolist()
    INVALID = pb_utils.TritonError.INVALID_ARG
    assert error_of(responses[1]) == (INVALID, "text_input[1]: is not valid UTF-8 (byte 0: invalid start byte)")
    assert error_of(responses[2]) == (INVALID, "text_input: is required")
    code, message = error_of(responses[3])
    assert code == INVALID and message == "text_input[0]: 402 tokens is over the model limit of 256 (truncate is false)"


def test_a_failing_compute_fails_its_batch_with_type_and_message_only(pb_utils, tokenizer, monkeypatch):
    def broken(requests):
        raise ValueError("the tokenizer broke")

    monkeypatch.setattr(tokenizer.tokenizer, "respond", broken)
    responses = tokenizer.execute([pb_utils.FakeRequest({"text_input": texts(b"a")}),
                                   pb_utils.FakeRequest({"text_input": texts(b"\xff")}),
                                   pb_utils.FakeRequest({"text_input": texts(b"b")})])
    assert [error_of(r) for r in responses] == [
        (pb_utils.TritonError.INTERNAL, "ValueError: the tokenizer broke"),
        (pb_utils.TritonError.INVALID_ARG, "text_input[0]: is not valid UTF-8 (byte 0: invalid start byte)"),
        (pb_utils.TritonError.INTERNAL, "ValueError: the tokenizer broke"),
    ]


def test_an_unexpected_error_in_parsing_is_internal_for_that_request_only(pb_utils, tokenizer):
    # A tensor whose items are neither bytes nor anything str() fails on: the parse's own bug path.
    class Unprintable:
        def __str__(self):
            raise RuntimeError("cannot print")

    odd = pb_utils.FakeRequest({"text_input": np.array([[Unprintable()]], dtype=np.object_)})
    responses = tokenizer.execute([odd, pb_utils.FakeRequest({"text_input": texts(b"fine")})])
    assert error_of(responses[0]) == (pb_utils.TritonError.INTERNAL, "RuntimeError: cannot print")
    assert not responses[1].has_error()


def test_llm_tokenizer_outputs_and_errors(pb_utils):
    model = started(pb_utils, "llm_tokenizer")
    prompt = pb_utils.FakeRequest({"text_input": texts(b"What is the capital of France?"),
                                   "apply_chat_template": np.array([[True]]),
                                   "stop_words": np.array([[b"\n", b" Paris"]], dtype=np.object_)})
    plain = pb_utils.FakeRequest({"text_input": texts(b"Hello")})
    two = pb_utils.FakeRequest({"text_input": texts(b"one", b"two")})
    empty = pb_utils.FakeRequest({"text_input": texts(b"")})
    responses = model.execute([prompt, plain, two, empty])
    outputs = responses[0].outputs()
    assert set(outputs) == {"input_ids", "input_lengths", "stop_words_ids", "delivery_acknowledged"}
    assert outputs["input_ids"].shape == (1, int(outputs["input_lengths"][0, 0])) and outputs["input_ids"].shape[1] > 10
    assert outputs["stop_words_ids"].shape[:2] == (1, 2) and outputs["delivery_acknowledged"].tolist() == [[True]]
    assert responses[1].outputs()["stop_words_ids"].tolist() == [[[-1]]]
    batched = responses[2].outputs()  # one row per prompt, as TensorRT-LLM's batched requests
    assert batched["input_ids"].shape[0] == 2 and batched["input_lengths"].shape == (2, 1)
    assert batched["stop_words_ids"].tolist() == [[[-1]], [[-1]]]
    assert batched["delivery_acknowledged"].tolist() == [[True], [True]]
    INVALID = pb_utils.TritonError.INVALID_ARG
    assert error_of(responses[3]) == (INVALID, "text_input: is empty")


def test_llm_tokenizer_refuses_a_parameter_generate_does_not_define(pb_utils):
    """Over HTTP's generate extension a misspelled input arrives as a request parameter."""
    model = started(pb_utils, "llm_tokenizer")
    misspelled = pb_utils.FakeRequest({"text_input": texts(b"Hello")}, parameters={"max_new_tokens": 8})
    tritons_own = pb_utils.FakeRequest({"text_input": texts(b"Hello")},
                                       parameters={"timeout": 5000000, "priority": 0, "triton_enable_empty_final_response": True})
    responses = model.execute([misspelled, tritons_own])
    code, message = error_of(responses[0])
    assert code == pb_utils.TritonError.INVALID_ARG
    assert message.startswith("max_new_tokens: generate has no input or parameter of this name (did you mean max_tokens?)")
    assert not responses[1].has_error()


def test_llm_tokenizer_checks_an_llmapi_request_against_that_contract(pb_utils):
    """NVIDIA's llmapi_client.py sends the parameter Streaming with every request; generate refuses it."""
    model = started(pb_utils, "llm_tokenizer")
    llmapi = {"llmapi_text_input": texts(b"Hello")}
    nvidia_client = pb_utils.FakeRequest(llmapi, parameters={"Streaming": False})
    curl_example = pb_utils.FakeRequest(llmapi, parameters={"max_tokens": 10})
    generate = pb_utils.FakeRequest({"text_input": texts(b"Hello")}, parameters={"Streaming": False})
    responses = model.execute([nvidia_client, curl_example, generate])
    assert responses[0].outputs()["llmapi_request"].tolist() == [[True]]
    assert error_of(responses[1])[1].startswith("max_tokens: tensorrt_llm has no input or parameter of this name "
                                                "(did you mean sampling_param_max_tokens?)")
    assert error_of(responses[2])[1].startswith("Streaming: generate has no input or parameter of this name")


def test_encoder_outputs_padded_states_and_names_bad_ids(pb_utils):
    model = started(pb_utils, "encoder")
    ids = np.array([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=np.int32)
    good = pb_utils.FakeRequest({"input_ids": ids, "input_lengths": np.array([[4], [3]], dtype=np.int32)})
    out_of_vocabulary = pb_utils.FakeRequest({"input_ids": np.array([[101, 999999]], dtype=np.int32),
                                              "input_lengths": np.array([[2]], dtype=np.int32)})
    too_long = pb_utils.FakeRequest({"input_ids": ids[:1], "input_lengths": np.array([[5]], dtype=np.int32)})
    responses = model.execute([good, out_of_vocabulary, too_long])
    states = responses[0].outputs()["token_states"]
    assert states.shape == (2, 4, model.encoder.hidden_size) and np.all(states[1, 3] == 0)
    solo = model.execute([pb_utils.FakeRequest({"input_ids": ids[1:, :3], "input_lengths": np.array([[3]], dtype=np.int32)})])
    np.testing.assert_allclose(solo[0].outputs()["token_states"][0], states[1, :3], atol=1e-4)
    INVALID = pb_utils.TritonError.INVALID_ARG
    assert error_of(responses[1]) == (INVALID, f"input_ids[0]: token ids must be in 0..{model.encoder.vocab_size - 1}")
    assert error_of(responses[2]) == (INVALID, "input_lengths: each length must be in 1..4")
    # Two batches computed: the good request (lengths 4 and 3: one pad position), then the solo one.
    made = pb_utils.MetricFamily.made
    assert made["tritonfront_encoder_batch_texts"][-1].observations == [2, 1]
    assert made["tritonfront_encoder_batch_tokens"][-1].observations == [7, 3]
    assert made["tritonfront_encoder_tokens_total"][-1].value == 10
    assert made["tritonfront_encoder_padding_tokens_total"][-1].value == 1


def test_pooler_computes_what_each_request_asked_for(pb_utils):
    model = started(pb_utils, "pooler")
    rng = np.random.default_rng(0)
    states = rng.normal(size=(2, 5, 384)).astype(np.float32)
    lengths = np.array([[5], [2]], dtype=np.int32)
    sentence = pb_utils.FakeRequest({"token_states": states, "input_lengths": lengths})
    tokens = pb_utils.FakeRequest({"token_states": states, "input_lengths": lengths}, ["token_embeddings"])
    short = pb_utils.FakeRequest({"token_states": states, "input_lengths": lengths,
                                  "dimensions": np.array([[8], [8]], dtype=np.int32)}, ["embedding"])
    too_many = pb_utils.FakeRequest({"token_states": states, "input_lengths": lengths,
                                     "dimensions": np.array([[385], [385]], dtype=np.int32)})
    wrong_width = pb_utils.FakeRequest({"token_states": states[:, :, :10], "input_lengths": lengths})
    responses = model.execute([sentence, tokens, short, too_many, wrong_width])
    embedding = responses[0].outputs()
    assert list(embedding) == ["embedding"] and embedding["embedding"].shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding["embedding"], axis=1), 1, atol=1e-5)  # MiniLM normalizes
    token_outputs = responses[1].outputs()
    assert list(token_outputs) == ["token_embeddings"] and token_outputs["token_embeddings"].shape == (2, 5, 384)
    assert np.all(token_outputs["token_embeddings"][1, 2:] == 0)  # padding past the second text's 2 tokens
    cut = responses[2].outputs()["embedding"]
    assert cut.shape == (2, 8)
    expected = embedding["embedding"][:, :8] / np.linalg.norm(embedding["embedding"][:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-5)
    INVALID = pb_utils.TritonError.INVALID_ARG
    assert error_of(responses[3]) == (INVALID, "dimensions: 385 is outside 1..384 for this model")
    assert error_of(responses[4]) == (INVALID, "token_states: shape [2, 5, 10] must be [texts, tokens, 384]")


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


def chunk_inputs(output_ids, context_ids=(), final=True, delivery=(0, 0, NO_SLOT, 0)) -> dict:
    return detokenizer_request(output_ids, context_ids, final, "stop" if final else "", prompt_tokens=7,
                               delivery=delivery)


def test_detokenizer_decodes_passes_through_and_acknowledges_what_it_decoded(pb_utils, smollm_tokenizer, tmp_path):
    model = started(pb_utils, "detokenizer")
    key = model_key("llm")
    model.acknowledger = Acknowledger(server_pid=1, directory=tmp_path)
    acks = open_rows(ack_table_path(key, 1, tmp_path), 1, SLOTS)
    ids = smollm_tokenizer("Hello world, ünïcode", add_special_tokens=False).input_ids
    first = pb_utils.FakeRequest(chunk_inputs(ids[:2], final=False, delivery=(key, 0, 3, 41)))
    rest = pb_utils.FakeRequest(chunk_inputs(ids[2:], context_ids=ids[:2], delivery=(key, 0, 4, 42)))
    bad = pb_utils.FakeRequest(chunk_inputs([10**6], delivery=(key, 0, 5, 43)))
    # What the llm could read when each response left the stub: nothing acknowledged yet, so it
    # cannot send a stream's next chunk (to another instance) before this one's text is out.
    acks_at_send = []
    for request in (first, rest, bad):
        send = request.sender.send
        request.sender.send = lambda response, flags=0, send=send: (acks_at_send.append(acks[0, 3:6].tolist()),
                                                                    send(response, flags))
    assert model.execute([first, rest, bad]) is None
    assert acks_at_send == [[0, 0, 0]] * 3
    responses = []
    for request in (first, rest, bad):
        [(response, flags)] = request.sender.sent
        assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        responses.append(response)
    texts_out = [r.outputs()["text_output"][0].decode() for r in responses[:2]]
    assert "".join(texts_out) == "Hello world, ünïcode"
    assert responses[1].outputs()["finish_reason"].tolist() == [[b"stop"]]
    assert responses[1].outputs()["prompt_tokens"].tolist() == [[7]]
    code, message = error_of(responses[2])
    assert code == pb_utils.TritonError.INVALID_ARG and message.startswith("output_ids: token id 1000000 is outside")
    assert acks[0, 3:6].tolist() == [41, 42, 0]  # the failed chunk is never acknowledged


# --- config errors fail initialize --------------------------------------------------------------


@pytest.mark.parametrize("model, args, message", [
    ("detokenizer", {"dynamic_batching": {"preserve_ordering": True}},
     "model detokenizer: dynamic_batching must not be set"),
    ("tokenizer", {"model_transaction_policy": {"decoupled": True}},
     "model tokenizer: model_transaction_policy { decoupled: false } is required"),
    ("encoder", {"parameters": {"max_batch_tokens": "lots"}},
     "model encoder: parameter max_batch_tokens: 'lots' is not allowed; it must be an integer >= 1 (default 8192)"),
    ("pooler", {"parameters": {"model_source": "/tmp/model"}},
     "model pooler: parameter model_source: '/tmp/model' is not allowed; it must be one of embed, llm"),
    ("llm_tokenizer", {"max_batch_size": 0}, "model llm_tokenizer: max_batch_size must be >= 1"),
    ("tensorrt_llm", {"max_batch_size": 8}, "model tensorrt_llm: max_batch_size must be 0"),
    ("tensorrt_llm", {"model_transaction_policy": {"decoupled": True}},
     "model tensorrt_llm: model_transaction_policy { decoupled: false } is required"),
])
def test_config_errors_fail_loading_with_the_parameter_named(pb_utils, model, args, message):
    with pytest.raises(ConfigError) as error:
        started(pb_utils, model, **args)
    assert str(error.value).startswith(message)


# --- the decoupled llm ---------------------------------------------------------------------------


class CountingEngine(Engine):
    """Generates 101, 102, ... for each request, one token per step of `step_s` seconds."""

    context_length, vocab_size, eos_token_ids = 64, 1000, frozenset({2})

    def __init__(self, step_s: float = 0.0):
        self.step_s = step_s
        self.live: dict[str, list[int]] = {}  # request id -> [max_tokens, generated]
        self.cancelled: list[str] = []
        self.refuse = False
        self.events: list[str] = []  # check, open, add, close: what the adapter called, in order
        self._lock = threading.Lock()

    def check_params(self, params):
        self.events.append("check")
        super().check_params(params)

    @contextlib.contextmanager
    def adding_together(self):
        self.events.append("open")
        yield
        self.events.append("close")

    def add(self, request_id, prompt_ids, params):
        self.events.append("add")
        if self.refuse:
            raise RuntimeError("the engine is not accepting requests")
        with self._lock:
            self.live[request_id] = [params.max_tokens, 0]

    def cancel(self, request_id):
        with self._lock:
            self.live.pop(request_id, None)
            self.cancelled.append(request_id)

    def outputs(self, timeout):
        time.sleep(self.step_s or timeout)
        outputs = []
        with self._lock:
            for request_id, state in list(self.live.items()):
                state[1] += 1
                finished = state[1] >= state[0]
                outputs.append(EngineOutput(request_id, [100 + state[1]], finished))
                if finished:
                    del self.live[request_id]
        return outputs

    def shutdown(self):
        pass


@pytest.fixture
def llm(pb_utils, request):
    """The llm adapter on a CountingEngine, as a model named for this test process (its load and
    acknowledgement tables in /dev/shm are removed afterwards)."""
    name = f"llm-adapter-test-{os.getpid()}-{next(LLM_NAMES)}"
    engine = CountingEngine(**getattr(request, "param", {}))
    module = load_adapter(pb_utils, "llm")
    module.create_engine = lambda kind, folder, device, config: engine
    model = module.TritonPythonModel()
    model.initialize(triton_args("llm", name, parameters={"max_active_requests": "4"}))
    yield model, engine, name
    model.finalize()
    table_path(name, os.getppid()).unlink(missing_ok=True)
    ack_table_path(model_key(name), os.getppid()).unlink(missing_ok=True)


def generation(pb_utils, max_tokens: int, stream: bool = True, **more) -> "pb_utils.FakeRequest":
    return pb_utils.FakeRequest({"input_ids": np.array([[5, 6, 7]], dtype=np.int32),
                                 "input_lengths": np.array([[3]], dtype=np.int32),
                                 "max_tokens": np.array([[max_tokens]], dtype=np.int32),
                                 "stream": np.array([[stream]]), **more})


def finished(request, timeout: float = 10) -> list[tuple]:
    assert request.sender.finished.wait(timeout), f"no final response after {timeout} s: {request.sender.sent}"
    return request.sender.sent


def test_llm_streams_chunks_then_a_final_flag(pb_utils, llm):
    model, engine, _ = llm
    streamed, whole = generation(pb_utils, 3), generation(pb_utils, 3, stream=False)
    assert model.execute([streamed, whole]) is None  # decoupled: responses come from the loop thread
    sent = finished(streamed)
    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    # The committed chunking with one stream: every token as it comes, the last with the final flag.
    assert [flags for _, flags in sent] == [0, 0, FINAL]
    chunks = [response.outputs() for response, _ in sent]
    assert [c["output_ids"].tolist() for c in chunks] == [[[101]], [[102]], [[103]]]
    assert [c["finish_reason"].tolist() for c in chunks] == [[[b""]], [[b""]], [[b"length"]]]
    assert [c["completion_tokens"].tolist() for c in chunks] == [[[1]], [[2]], [[3]]]
    assert chunks[2]["context_ids"].tolist() == [[101, 102]] and chunks[0]["prompt_tokens"].tolist() == [[3]]
    (response, flags), = finished(whole)
    assert flags == FINAL and response.outputs()["output_ids"].tolist() == [[101, 102, 103]]


def test_llm_bad_requests_get_one_final_error_each(pb_utils, llm):
    model, engine, _ = llm
    zero, good = generation(pb_utils, 0), generation(pb_utils, 2)
    no_lengths = pb_utils.FakeRequest({"input_ids": np.array([[5]], dtype=np.int32), "max_tokens": np.array([[2]], dtype=np.int32)})
    model.execute([zero, good, no_lengths])
    FINAL, INVALID = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, pb_utils.TritonError.INVALID_ARG
    (response, flags), = finished(zero)
    assert flags == FINAL
    assert error_of(response) == (INVALID, "max_tokens: 0 is outside 1..61 (context of 64 tokens minus 3 prompt tokens)")
    (response, flags), = finished(no_lengths)
    assert flags == FINAL and error_of(response) == (INVALID, "input_lengths: is required")
    assert not finished(good)[-1][0].has_error()


def test_llm_answers_an_llmapi_stop_request_cancelled_and_stops_the_requests_of_its_id(pb_utils, llm):
    model, engine, _ = llm
    flag = {"llmapi_request": np.array([[True]]), "return_finish_reason": np.array([[True]])}
    prompt = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32)}
    running = pb_utils.FakeRequest({**prompt, "stream": np.array([[True]]), **flag}, request_id="story-1")
    model.execute([running])
    deadline = time.monotonic() + 10
    while not running.sender.sent:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stop_inputs = {"input_ids": np.zeros((1, 0), dtype=np.int32), "input_lengths": np.array([[0]], dtype=np.int32),
                   "stop": np.array([[True]]), **flag}
    stop, anonymous = pb_utils.FakeRequest(stop_inputs, request_id="story-1"), pb_utils.FakeRequest(stop_inputs)
    model.execute([stop, anonymous])
    (answer, _), = finished(stop)
    code, message = error_of(answer)
    assert code == pb_utils.TritonError.CANCELLED and message.startswith("Request cancelled by client")
    (answer, _), = finished(anonymous)
    assert error_of(answer) == (pb_utils.TritonError.INVALID_ARG, error_of(answer)[1])
    assert error_of(answer)[1].startswith("stop: needs the request id")
    last, flags = finished(running)[-1]
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert last.outputs()["finish_reason"].tolist() == [[b"cancelled"]] and engine.cancelled


def test_llm_checks_a_whole_batch_then_adds_it_in_one_block(pb_utils, llm):
    """The engine takes a batch's requests in together (adding_together), and checking them, which
    may compile a grammar, happens before the block opens; a bad request is answered on its own."""
    model, engine, _ = llm
    first, bad, second = generation(pb_utils, 2), generation(pb_utils, 0), generation(pb_utils, 2)
    model.execute([first, bad, second])
    assert engine.events == ["check", "check", "open", "add", "add", "close"]
    assert finished(bad)[-1][0].has_error()
    assert not finished(first)[-1][0].has_error() and not finished(second)[-1][0].has_error()


def test_llm_engine_refusal_is_internal_and_final(pb_utils, llm):
    model, engine, _ = llm
    engine.refuse = True
    request = generation(pb_utils, 2)
    model.execute([request])
    (response, flags), = finished(request)
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert error_of(response) == (pb_utils.TritonError.INTERNAL, "RuntimeError: the engine is not accepting requests")


# 50 steps of 50 ms: a direct request is asked about cancellation every 0.5 s, so it must outlast
# that by far (50 steps of 10 ms once finished first on a clean-clone run).
@pytest.mark.parametrize("llm", [{"step_s": 0.05}], indirect=True)
def test_llm_cancellation_ends_the_request_and_is_counted(pb_utils, llm):
    model, engine, name = llm
    request = generation(pb_utils, 50)
    model.execute([request])
    deadline = time.monotonic() + 10
    while not request.sender.sent and time.monotonic() < deadline:
        time.sleep(0.005)
    request.cancelled = True
    sent = finished(request)
    assert sent[-1][0].outputs()["finish_reason"].tolist() == [[b"cancelled"]] and len(sent) < 50
    assert len(engine.cancelled) == 1 and not engine.live
    # The loop publishes its load just after sending the final chunk.
    deadline = time.monotonic() + 10
    while model.latest_load.cancelled_requests != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    model.gauges.update()  # the gauge thread's turn, now rather than within 0.25 s
    mine = {spec: [m for m in pb_utils.MetricFamily.made[spec] if m.labels["model"] == name]
            for spec in ("tritonfront_llm_cancelled_requests_total", "tritonfront_llm_active_sequences",
                         "tritonfront_num_requests_running")}
    assert [m.labels for m in mine["tritonfront_llm_active_sequences"]] == [{"model": name, "rank": "0"}]
    assert mine["tritonfront_llm_cancelled_requests_total"][0].value == 1
    assert mine["tritonfront_llm_active_sequences"][0].value == 0
    # Rank 0 also sets the model's totals, labelled by model only.
    assert [m.labels for m in mine["tritonfront_num_requests_running"]] == [{"model": name}]
    assert mine["tritonfront_num_requests_running"][0].value == 0


@pytest.mark.parametrize("llm", [{"step_s": 0.005}], indirect=True)
def test_llm_execute_returns_only_once_the_rank_has_room(pb_utils, llm):
    model, engine, _ = llm  # max_active_requests 4
    requests = [generation(pb_utils, tokens) for tokens in (5, 20, 20, 20)]
    model.execute(requests)
    assert len(engine.live) == 3  # the short one had finished before execute returned
    for request in requests:
        finished(request)


@pytest.mark.parametrize("args, message", [
    ({"model_transaction_policy": None},
     "model llm: model_transaction_policy { decoupled: true } is required (its engine thread sends each request's "
     "responses), the config says decoupled: false"),
    ({"parameters": {"prepare_requests_in": "engine_loop"}},
     "model llm: llm has no parameter 'prepare_requests_in'; its parameters are model_source, engine, balancing"),
    ({"parameters": {"balancing": "fast"}},
     "model llm: parameter balancing: 'fast' is not allowed; it must be one of tokens, none (default 'tokens')"),
    ({"parameters": {"stream_interval": "0"}},
     "model llm: parameter stream_interval: '0' is not allowed; it must be an integer >= 1 (default 1)"),
])
def test_llm_config_errors_fail_loading_before_the_engine_starts(pb_utils, args, message):
    module = load_adapter(pb_utils, "llm")
    module.create_engine = lambda *args: pytest.fail("the engine must not start")
    with pytest.raises(ConfigError) as error:
        module.TritonPythonModel().initialize(triton_args("llm", **args))
    assert str(error.value).startswith(message)


def test_a_stubs_watcher_outlives_a_group_sigterm_and_kills_the_stub_once_its_server_is_gone(pb_utils):
    """glue.exit_with_server's shell loop on a stand-in server (a Python process) and stub (its
    `sleep` child): a SIGTERM to the watcher (serve.sh's whole group gets one) leaves it watching;
    the server's death gets the stub killed."""
    from tritonfront.stubs import glue
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "stub = subprocess.Popen(['sleep', '120'])\n"
                               "print(stub.pid, flush=True)\ntime.sleep(120)"], stdout=subprocess.PIPE, text=True)
    stub = psutil.Process(int(server.stdout.readline()))
    watcher = subprocess.Popen(["sh", "-c", glue._WATCH, "sh", str(server.pid), str(stub.pid), "0.1"],
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(watcher.pid).children():  # in its loop, past the trap
            assert time.monotonic() < deadline
            time.sleep(0.01)
        watcher.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert watcher.poll() is None and stub.is_running()
        server.kill()
        server.wait()
        assert watcher.wait(timeout=10) == 0
        assert "is gone" in watcher.stderr.read()
        # kill -9 returns before the stub dies (it dies when next scheduled): a loaded runner saw it
        # still 'running' at once (CI, 2026-12-07). A zombie is dead, waiting on its new parent.
        assert poll(lambda: not running(stub.pid), timeout=10), stub.status()
    finally:
        for process in (server, watcher):
            process.kill()
        with contextlib.suppress(psutil.NoSuchProcess):
            stub.kill()

"""An llm request of the LLM-API contract (tritonfront.core.llmapi_request) as the tensorrt_llm
models hand it over ([1, ...] tensors, the flag from the llm_tokenizer): TensorRT-LLM's greedy rule
and defaults, refusals and errors named as the client named its inputs, stop requests; and the
shared stop table every llm rank reads (tritonfront.core.stop_requests)."""
import numpy as np
import pytest

from tritonfront.core import llmapi_request
from tritonfront.core.llmapi_contract import DEFAULT_MAX_TOKENS, LLMAPI_FLAG, STOP_ANSWER, UNSUPPORTED
from tritonfront.core.stop_requests import StopBoard, id_hash
from tritonfront.core.shared_tables import open_rows
from tritonfront.engines import SamplingParams
from tritonfront.errors import Cancelled, InvalidInput

VOCAB, CONTEXT = 1000, 100
TYPES = {"sampling_param_temperature": np.float32, "sampling_param_top_p": np.float32,
         "sampling_param_top_k": np.int32, "sampling_param_max_tokens": np.int32, "sampling_param_best_of": np.int32,
         "seed": np.uint64, "presence_penalty": np.float32, "lora_id": np.uint64}


def inputs(**values) -> dict:
    """What the llm gets from tensorrt_llm_decoupled: a 3-token prompt, the flag, and `values`."""
    arrays = {"input_ids": np.array([[5, 6, 7]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
              "stop_words_ids": np.full((1, 1, 1), -1, dtype=np.int32), LLMAPI_FLAG: np.array([[True]])}
    for name, value in values.items():
        if isinstance(value, bool):
            arrays[name] = np.array([[value]])
        elif isinstance(value, str):
            arrays[name] = np.array([[value.encode()]], dtype=object)
        else:
            arrays[name] = np.array([[value]], dtype=TYPES[name])
    return arrays


def parse(request_id="r-1", check=lambda params: None, stops=None, **values):
    (sequence,) = llmapi_request.parse(inputs(**values), request_id, VOCAB, CONTEXT, check, stops)
    return sequence


def test_the_flag_marks_the_contract():
    assert llmapi_request.follows_contract(inputs())
    assert not llmapi_request.follows_contract({"input_ids": np.zeros((1, 1), dtype=np.int32)})


def test_defaults_are_tensorrt_llms_greedy_32_tokens_and_the_prompt_first():
    sequence = parse()
    assert sequence.params.greedy and sequence.params.max_tokens == DEFAULT_MAX_TOKENS == 32
    assert not sequence.options.exclude_input and not sequence.options.log_probs and not sequence.stream
    assert sequence.options.llmapi is not None and not sequence.options.llmapi.finish_reason


@pytest.mark.parametrize("values, greedy, expected", [
    ({}, True, {}),
    ({"sampling_param_temperature": 0.7}, False, {"temperature": 0.7, "top_k": 0, "top_p": 1.0}),  # alone, it samples
    ({"sampling_param_top_k": 0}, False, {"temperature": 1.0, "top_k": 0, "top_p": 1.0}),
    ({"sampling_param_top_p": 0.9}, False, {"temperature": 1.0, "top_k": 0, "top_p": 0.9}),
    ({"sampling_param_top_k": 40, "sampling_param_temperature": 0.5}, False, {"temperature": 0.5, "top_k": 40}),
    ({"sampling_param_temperature": 0.0, "sampling_param_top_p": 0.9}, True, {}),
    ({"sampling_param_top_k": 1, "sampling_param_temperature": 1.3}, True, {}),
    ({"sampling_param_top_p": 0.0, "sampling_param_temperature": 1.3}, True, {}),
])
def test_tensorrt_llms_greedy_rule(values, greedy, expected):
    params = parse(**values).params
    assert params.greedy == greedy
    for name, value in expected.items():
        assert getattr(params, name) == pytest.approx(value), name


@pytest.mark.parametrize("values, named", [
    ({"sampling_param_temperature": -1.0}, "sampling_param_temperature: -1.0 must be a finite number >= 0"),
    ({"sampling_param_top_k": -2}, "sampling_param_top_k: -2 must be >= 0"),
    ({"sampling_param_top_p": 1.5}, "sampling_param_top_p: 1.5 must be in [0, 1]"),
    ({"sampling_param_max_tokens": 0}, "sampling_param_max_tokens: 0 is outside 1..97"),
    ({"presence_penalty": float("nan")}, "sampling_param_presence_penalty: nan must be a finite number"),
    ({"sampling_param_best_of": 2}, "sampling_param_best_of: 2: only 1 is served"),
    ({"sampling_param_best_of": 0}, "sampling_param_best_of: 0: only 1 is served"),
    *[({name: "x" if name != "lora_id" else 7}, f"{name}: {UNSUPPORTED[name]}") for name in UNSUPPORTED],
])
def test_what_is_refused_is_named_as_the_client_named_it(values, named):
    with pytest.raises(InvalidInput) as error:
        parse(**values)
    assert str(error.value).startswith(named), str(error.value)


def test_empty_strings_ask_for_nothing():
    assert parse(image_url="", lora_name="", sampling_param_best_of=1).params.greedy


def test_the_default_max_tokens_says_it_was_not_sent():
    long_prompt = inputs()
    long_prompt["input_ids"] = np.ones((1, CONTEXT - 10), dtype=np.int32)
    long_prompt["input_lengths"] = np.array([[CONTEXT - 10]], dtype=np.int32)
    with pytest.raises(InvalidInput, match=r"^sampling_param_max_tokens: not sent, so TensorRT-LLM's default of 32: "
                                           r"32 is outside 1..10"):
        llmapi_request.parse(long_prompt, "r", VOCAB, CONTEXT, lambda params: None, None)


def test_the_engines_refusals_are_renamed_too():
    def check(params: SamplingParams):
        if params.return_log_probs:
            raise InvalidInput("return_log_probs", "this engine cannot")
    with pytest.raises(InvalidInput, match=r"^return_cumulative_logprob: this engine cannot"):
        parse(check=check, return_cumulative_logprob=True)


def test_output_switches():
    sequence = parse(return_finish_reason=True, return_stop_reason=True, return_cumulative_logprob=True,
                     sampling_param_exclude_input_from_output=True, stream=True)
    assert sequence.options.llmapi.finish_reason and sequence.options.llmapi.stop_reason
    assert sequence.options.log_probs and sequence.options.exclude_input and sequence.stream


@pytest.fixture
def board(tmp_path):
    rows = open_rows(tmp_path / "stops", 2, 1 + 2 * 256)
    return StopBoard(rows, 0), StopBoard(rows, 1)


def test_a_stop_request_is_posted_and_answered_cancelled(board):
    mine, other_rank = board
    with pytest.raises(Cancelled, match=rf"^{STOP_ANSWER}: .*'story-1'"):
        parse(request_id="story-1", stops=mine, stop=True)
    # Every rank reads it: a request of that id that arrived before it is stopped, a later one not.
    assert other_rank.stopped(id_hash("story-1"), arrived_ns=1)
    assert not other_rank.stopped(id_hash("story-2"), arrived_ns=1)
    assert not other_rank.stopped(id_hash("story-1"), arrived_ns=2 ** 62)


def test_a_stop_request_needs_an_id():
    with pytest.raises(InvalidInput, match=r"^stop: needs the request id"):
        parse(request_id="", stop=True)


def test_the_table_keeps_the_latest_stops_of_each_rank(board):
    mine, _ = board
    for i in range(300):  # more than a rank's 256 slots: the oldest are overwritten
        mine.post(f"id-{i}", now_ns=1000 + i)
    assert mine.stopped(id_hash("id-299"), 1000) and mine.stopped(id_hash("id-44"), 1000)
    assert not mine.stopped(id_hash("id-43"), 1000)

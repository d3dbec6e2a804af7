"""A request's sequences fanned out to the generation loop and joined back into one response
stream (tritonfront.core.fanout): batch and sequence indices, one final flag after the last sequence,
one error for a failed request, what each request asked for beside text; and the log probs and
times the loop's chunks carry for it."""
import math

import numpy as np
import pytest

from tritonfront.engines import Engine, EngineOutput, SamplingParams
from tritonfront.core.fanout import GroupResponder, submit_group
from tritonfront.core.generation_loop import Completion, GenerationLoop
from tritonfront.core.generation_request import SequenceRequest, ResponseOptions
from tritonfront.core.trtllm_contract import PERF_METRIC_OUTPUTS, UNMEASURED_PERF_METRICS

EOS = 2


class Engine3(Engine):
    """Records what it is given; a test emits its outputs."""

    context_length, vocab_size, eos_token_ids = 100, 1000, frozenset({EOS})

    def __init__(self):
        self.added, self.cancelled, self.pending, self.refuse_after = {}, [], [], None

    def add(self, request_id, prompt_ids, params):
        if self.refuse_after is not None and len(self.added) >= self.refuse_after:
            raise RuntimeError("the engine is full")
        self.added[request_id] = (list(prompt_ids), params)

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def outputs(self, timeout):
        outputs, self.pending = self.pending, []
        return outputs

    def shutdown(self):
        pass


class TritonSide:
    """Responses of Triton requests as the glue's StreamResponder would send them."""

    def __init__(self):
        self.sent, self.errors, self.cancelled, self.asked = [], [], set(), []

    def send(self, handle, reply):
        self.sent.append((handle, reply.tensors(), reply.final))

    def fail(self, handle, error):
        self.errors.append((handle, str(error)))

    def is_cancelled(self, handle, ask_client=True):
        if ask_client:
            self.asked.append(handle)
        return ask_client and handle in self.cancelled


@pytest.fixture
def setup():
    engine, triton = Engine3(), TritonSide()
    loop = GenerationLoop(engine, GroupResponder(triton), stream_interval=1, context_window=8, poll_s=0,
                          cancel_check_s=0)
    return engine, triton, loop


def sequences(prompts=((5, 6, 7),), count=1, stream=False, options=ResponseOptions(), max_tokens=4,
              behind_ensemble=False):
    return [SequenceRequest(list(prompt), SamplingParams(max_tokens=max_tokens), (), stream, behind_ensemble, b, s,
                            options)
            for b, prompt in enumerate(prompts) for s in range(count)]


def run(engine, loop, script):
    """script: per step, a list of (engine request number, tokens, finished[, log probs])."""
    ids = list(engine.added)
    for step in script:
        for number, tokens, finished, *log_probs in step:
            engine.pending.append(EngineOutput(ids[number], tokens, finished))
            if log_probs:
                engine.pending[-1].log_probs = log_probs[0]
        loop.step()


def column(outputs, name):
    return outputs[name].reshape(-1).tolist()


def test_every_sequence_answers_its_request_tagged_and_only_the_last_end_is_final(setup):
    engine, triton, loop = setup
    submit_group(loop, "req", sequences(prompts=((5, 6), (7,)), count=2, stream=True))
    assert [prompt for prompt, _ in engine.added.values()] == [[5, 6], [5, 6], [7], [7]]
    run(engine, loop, [[(0, [100], False), (1, [110], False), (2, [120], True), (3, [130], False)],
                       [(0, [101], True), (1, [111], True)],
                       [(3, [131], True)]])
    tags = [(column(out, "batch_index")[0], column(out, "sequence_index")[0], column(out, "output_ids"), final)
            for handle, out, final in triton.sent]
    assert {handle for handle, _, _ in triton.sent} == {"req"}
    assert tags == [(0, 0, [100], False), (0, 1, [110], False), (1, 0, [120], False), (1, 1, [130], False),
                    (0, 0, [101], False), (0, 1, [111], False), (1, 1, [131], True)]
    # Each sequence's own end still reaches the detokenizer, which flushes that stream.
    assert [column(out, "is_final")[0] for _, out, _ in triton.sent] == [False, False, True, False, True, True, True]


def test_a_whole_answer_that_includes_its_prompt_carries_the_prompt_ids(setup):
    engine, triton, loop = setup
    submit_group(loop, "whole", sequences())
    submit_group(loop, "excluded", sequences(options=ResponseOptions(exclude_input=True)))
    submit_group(loop, "streamed", sequences(stream=True))
    run(engine, loop, [[(0, [100, 101], True), (1, [100], True), (2, [100], False)], [(2, [101], True)]])
    echoes = {handle: column(out, "echo_ids") for handle, out, _ in triton.sent if "echo_ids" in out}
    assert echoes == {"whole": [5, 6, 7]}  # streamed chunks and excluded answers never start with the prompt
    whole, = [out for handle, out, _ in triton.sent if handle == "whole"]
    assert column(whole, "output_ids") == [100, 101] and column(whole, "completion_tokens") == [2]


def test_log_probs_counts_and_times_on_request(setup):
    engine, triton, loop = setup
    options = ResponseOptions(True, log_probs=True, perf_metrics=True, num_input_tokens=True, num_output_tokens=True)
    submit_group(loop, "asked", sequences(stream=True, options=options))
    submit_group(loop, "plain", sequences(stream=True))
    run(engine, loop, [[(0, [100, 101], False, [-0.5, -1.0]), (1, [100], False, [-0.5])],
                       [(0, [102], True, [-0.25]), (1, [101], True, [-1.0])]])
    asked = [out for handle, out, _ in triton.sent if handle == "asked"]
    assert [out["output_log_probs"].shape for out in asked] == [(1, 1, 2), (1, 1, 1)]
    assert [column(out, "output_log_probs") for out in asked] == [[-0.5, -1.0], [-0.25]]
    assert [column(out, "cum_log_probs") for out in asked] == [[-1.5], [-1.75]]  # over everything sent so far
    assert [column(out, "num_output_tokens") for out in asked] == [[2], [1]]  # this response's tokens
    assert [column(out, "num_input_tokens") for out in asked] == [[3], [3]]
    first, last = asked
    assert 0 < first["arrival_time_ns"][0, 0] <= first["first_token_time_ns"][0, 0] == last["first_token_time_ns"][0, 0]
    assert first["last_token_time_ns"][0, 0] <= last["last_token_time_ns"][0, 0]
    assert all(last[name][0, 0] == 0 for name in UNMEASURED_PERF_METRICS)
    assert set(PERF_METRIC_OUTPUTS) <= set(last)
    plain = [out for handle, out, _ in triton.sent if handle == "plain"]
    assert not {"cum_log_probs", "output_log_probs", "num_input_tokens", "arrival_time_ns"} & set(plain[0])


@pytest.mark.parametrize("behind_ensemble", [False, True])
def test_a_failed_sequence_fails_its_request_once_and_cancels_the_others(setup, behind_ensemble):
    """Behind the ensemble Triton is asked once per sequence, yet a failed sibling still cancels the others."""
    engine, triton, loop = setup
    submit_group(loop, "req", sequences(count=3, stream=True, behind_ensemble=behind_ensemble))
    submit_group(loop, "other", sequences(stream=True, behind_ensemble=behind_ensemble))
    run(engine, loop, [[(0, [100], False)]])
    assert len(triton.asked) == 4
    engine.pending.append(EngineOutput(list(engine.added)[1], [], True, error="out of memory"))
    loop.step()
    run(engine, loop, [[(0, [101], False), (2, [100], False), (3, [100], False)], []])
    assert triton.errors == [("req", "out of memory")]
    assert [handle for handle, _, _ in triton.sent] == ["req", "other"]  # nothing of req after its error
    ids = list(engine.added)
    assert {ids[0], ids[2]} <= set(engine.cancelled) and ids[3] not in engine.cancelled
    assert (len(triton.asked) == 4) == behind_ensemble


def test_a_cancelled_request_cancels_every_sequence(setup):
    engine, triton, loop = setup
    submit_group(loop, "req", sequences(prompts=((5,), (6,)), count=2, stream=True))
    run(engine, loop, [[(0, [100], False)]])
    triton.cancelled.add("req")
    loop.step()
    assert sorted(engine.cancelled) == sorted(engine.added)
    finals = [final for _, _, final in triton.sent]
    assert finals.count(True) == 1 and finals[-1]  # Triton's final flag comes once, last
    assert [column(out, "finish_reason") for _, out, _ in triton.sent[1:]] == [[b"cancelled"]] * 4


def test_a_sequence_the_engine_refuses_fails_the_request_and_frees_the_others(setup):
    engine, triton, loop = setup
    engine.refuse_after = 1
    with pytest.raises(RuntimeError, match="the engine is full"):
        submit_group(loop, "req", sequences(count=2))
    loop.step()
    assert engine.cancelled == list(engine.added) and not triton.sent  # the caller sends the error


def test_log_probs_travel_with_their_ids_through_stop_word_hold_back():
    completion = Completion(3, stop_sequences=[[7, 8, 9]], eos_ids=frozenset({EOS}), stream=True)
    chunks = completion.on_tokens([5, 7, 8], log_probs=[-0.1, -0.2, -0.3])  # 7, 8 held: they may start [7, 8, 9]
    chunks += completion.on_tokens([6], log_probs=[-0.4])  # no: released with their own log probs
    chunks += completion.on_tokens([7, 8, 9, 4], log_probs=[-0.5, -0.6, -0.7, -0.8])  # a stop word: dropped
    assert [(c.output_ids, c.log_probs) for c in chunks] == [([5], [-0.1]), ([7, 8, 6], [-0.2, -0.3, -0.4]),
                                                             ([], [])]
    assert chunks[-1].finish_reason == "stop"


def test_held_ids_released_at_the_end_keep_their_log_probs():
    completion = Completion(3, stop_sequences=[[7, 8, 9]], eos_ids=frozenset({EOS}))
    chunks = completion.on_tokens([5, 7, 8, EOS], log_probs=[-0.1, -0.2, -0.3, -0.9])
    assert [(c.output_ids, c.log_probs) for c in chunks] == [([5, 7, 8], [-0.1, -0.2, -0.3])]


def test_without_engine_log_probs_each_id_has_nan():
    chunk, = Completion(3, stream=True).on_tokens([5, 6])
    assert chunk.output_ids == [5, 6] and all(math.isnan(p) for p in chunk.log_probs)
    assert chunk.first_token_ns == chunk.last_token_ns > 0


def test_top_alternatives_travel_with_their_ids_through_stop_word_hold_back():
    completion = Completion(3, stop_sequences=[[7, 8, 9]], eos_ids=frozenset({EOS}), stream=True)
    top = {token: [(token, -0.1), (token + 1, -2.5)] for token in range(20)}
    chunks = completion.on_tokens([5, 7, 8], log_probs=[-0.1] * 3, top_log_probs=[top[5], top[7], top[8]])
    chunks += completion.on_tokens([6], log_probs=[-0.1], top_log_probs=[top[6]])
    chunks += completion.on_tokens([7, 8, 9], log_probs=[-0.1] * 3, top_log_probs=[top[7], top[8], top[9]])
    assert [(c.output_ids, c.top_log_probs) for c in chunks] == [([5], [top[5]]), ([7, 8, 6], [top[7], top[8], top[6]]),
                                                                 ([], [])]
    # An engine that gave none: an empty list per id.
    chunk, = Completion(3, stream=True).on_tokens([5, 6], log_probs=[-0.1, -0.2])
    assert chunk.top_log_probs == [(), ()]


def test_top_logprobs_and_token_texts_on_request(setup):
    engine, triton, loop = setup
    options = ResponseOptions(True, log_probs=True, top_logprobs=3, token_texts=True)
    submit_group(loop, "asked", sequences(stream=True, options=options))
    submit_group(loop, "plain", sequences(stream=True))
    ids = list(engine.added)
    first = EngineOutput(ids[0], [100, 101], False, log_probs=[-0.5, -1.0],
                         top_log_probs=[[(100, -0.5), (7, -1.5), (8, -2.0)], [(9, -0.75), (101, -1.0)]])
    engine.pending = [first, EngineOutput(ids[1], [100], True)]
    loop.step()
    engine.pending = [EngineOutput(ids[0], [102], True, log_probs=[-0.25], top_log_probs=[[(102, -0.25), (3, -3.0),
                                                                                          (4, -4.0)]])]
    loop.step()
    asked = [out for handle, out, _ in triton.sent if handle == "asked"]
    assert [out["output_top_ids"].shape for out in asked] == [(1, 1, 2, 3), (1, 1, 1, 3)]
    assert asked[0]["output_top_ids"].tolist() == [[[[100, 7, 8], [9, 101, -1]]]]  # padded where fewer came
    assert asked[0]["output_top_log_probs"][0, 0, 1].tolist() == [-0.75, -1.0, -math.inf]
    assert asked[1]["output_top_log_probs"].tolist() == [[[[-0.25, -3.0, -4.0]]]]
    assert all(out["return_token_texts"].tolist() == [[True]] for out in asked)
    assert [column(out, "output_log_probs") for out in asked] == [[-0.5, -1.0], [-0.25]]
    plain = [out for handle, out, _ in triton.sent if handle == "plain"]
    assert not {"output_top_ids", "output_top_log_probs", "return_token_texts"} & set(plain[0])


def test_an_llmapi_stream_carries_the_ids_so_far_with_its_prompt_and_finish_reason_only_when_asked(setup):
    from tritonfront.core.generation_request import LLMAPIOutputs

    engine, triton, loop = setup
    asked = ResponseOptions(perf_metrics=True, llmapi=LLMAPIOutputs(finish_reason=True, stop_reason=True))
    submit_group(loop, "asked", sequences(stream=True, options=asked))
    submit_group(loop, "plain", sequences(stream=True, options=ResponseOptions(exclude_input=True,
                                                                               llmapi=LLMAPIOutputs())))
    run(engine, loop, [[(0, [100], False), (1, [100], False)], [(0, [101], True), (1, [101], True)]])
    asked_out = [out for handle, out, _ in triton.sent if handle == "asked"]
    plain_out = [out for handle, out, _ in triton.sent if handle == "plain"]
    # The detokenizer decodes each chunk alone: all ids so far, no context, the prompt first.
    assert [column(out, "output_ids") for out in asked_out] == [[100], [100, 101]]
    assert [out["context_ids"].shape for out in asked_out] == [(1, 0), (1, 0)]
    assert [column(out, "echo_ids") for out in asked_out] == [[5, 6, 7], [5, 6, 7]]
    assert [column(out, "finish_reason") for out in asked_out] == [[b"None"], [b"length"]]
    assert [column(out, "stop_reason_ids") for out in asked_out] == [[], []]
    assert column(asked_out[-1], "kv_cache_missed_block") == [0] and column(asked_out[-1], "kv_cache_hit_rate") == [0]
    assert [column(out, "output_ids") for out in plain_out] == [[100], [100, 101]]
    assert not {"finish_reason", "echo_ids", "stop_reason_ids", "kv_cache_hit_rate"} & {
        name for out in plain_out for name in out}


def test_an_llmapi_sequence_ended_by_a_stop_word_names_its_ids():
    from tritonfront.core.fanout import SequenceHandle, chunk_outputs, RequestGroup
    from tritonfront.core.generation_request import LLMAPIOutputs

    completion = Completion(3, stop_sequences=[[7, 8]])
    (chunk,) = completion.on_tokens([100, 7, 8])
    request = sequences(options=ResponseOptions(llmapi=LLMAPIOutputs(stop_reason=True)))[0]
    outputs = chunk_outputs(SequenceHandle(RequestGroup("h", 1, 0), request), chunk)
    assert column(outputs, "output_ids") == [100] and column(outputs, "stop_reason_ids") == [7, 8]


def test_a_stop_request_posted_by_any_rank_cancels_the_llmapi_requests_of_its_id(tmp_path):
    from tritonfront.core.generation_request import LLMAPIOutputs
    from tritonfront.core.shared_tables import open_rows
    from tritonfront.core.stop_requests import StopBoard

    rows = open_rows(tmp_path / "stops", 2, 1 + 2 * 256)
    engine, triton = Engine3(), TritonSide()
    loop = GenerationLoop(engine, GroupResponder(triton, StopBoard(rows, 0)), stream_interval=1, poll_s=0,
                          cancel_check_s=0)
    llmapi = ResponseOptions(llmapi=LLMAPIOutputs(finish_reason=True))
    submit_group(loop, "target", sequences(stream=True, options=llmapi), request_id="id-1")
    submit_group(loop, "same id, generate contract", sequences(stream=True), request_id="id-1")
    submit_group(loop, "other id", sequences(stream=True, options=llmapi), request_id="id-2")
    run(engine, loop, [[(0, [100], False), (1, [100], False), (2, [100], False)]])
    StopBoard(rows, 1).post("id-1")  # another rank took the stop request
    loop.step()
    finals = {handle: column(out, "finish_reason") for handle, out, final in triton.sent if final}
    assert finals == {"target": [b"cancelled"]}
    assert list(engine.cancelled) == [list(engine.added)[0]]
    # A request of that id sent after the stop is not stopped by it.
    submit_group(loop, "later", sequences(stream=True, options=llmapi), request_id="id-1")
    run(engine, loop, [[(3, [100], False)]])
    assert len(engine.cancelled) == 1

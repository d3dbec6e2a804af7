"""Stop sequences on token ids with hold-back, and how a completion becomes response chunks."""
import numpy as np
import pytest

from tritonfront.errors import InvalidInput
from tritonfront.core.generation_loop import FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, Completion
from tritonfront.core.stopping import StopMatcher, stop_sequences_from_tensor

EOS = 2


def feed(matcher: StopMatcher, tokens):
    """(released tokens, whether a stop sequence matched), feeding until a match."""
    released = []
    for token in tokens:
        out, matched = matcher.push(token)
        released += out
        if matched:
            return released, True
    return released, False


@pytest.mark.parametrize("stops, tokens, released, matched, held", [
    ([], [5, 6, 7], [5, 6, 7], False, []),
    ([[7]], [5, 6, 7, 8], [5, 6], True, []),
    ([[6, 7]], [5, 6, 7], [5], True, []),
    ([[6, 7]], [5, 6], [5], False, [6]),  # 6 may start the stop sequence: held
    ([[6, 7]], [5, 6, 8], [5, 6, 8], False, []),  # released on mismatch
    ([[6, 6, 7]], [6, 6, 6, 7], [6], True, []),  # the tail re-aligns after a partial match
    ([[1, 2, 3], [2, 4]], [1, 2, 4], [1], True, []),  # a shorter stop inside a held prefix
    ([[1, 2, 3], [2, 4]], [1, 2, 5], [1, 2, 5], False, []),
    ([[1, 2], [2]], [1, 2], [], True, []),  # the longest stop ending here is dropped whole
    ([[9, 9, 9]], [9, 9], [], False, [9, 9]),
])
def test_stop_matcher(stops, tokens, released, matched, held):
    matcher = StopMatcher(stops)
    assert feed(matcher, tokens) == (released, matched)
    assert matcher.held == held


def test_held_tokens_come_back_on_flush():
    matcher = StopMatcher([[4, 5, 6]])
    assert feed(matcher, [1, 4, 5]) == ([1], False)
    assert matcher.flush() == [4, 5]
    assert matcher.held == []


def test_stop_words_tensor_rows():
    ids = np.array([[[198, -1, -1], [7042, 30, -1], [-1, -1, -1]]], dtype=np.int32)
    assert stop_sequences_from_tensor(ids, 49152) == [[198], [7042, 30]]
    assert stop_sequences_from_tensor(np.full((1, 1, 1), -1, np.int32), 49152) == []
    assert stop_sequences_from_tensor(None, 49152) == []
    with pytest.raises(InvalidInput, match=r"stop_words_ids\[0\]: token ids must be in 0..49151"):
        stop_sequences_from_tensor(np.array([[[5, -3, 7]]], np.int32), 49152)
    with pytest.raises(InvalidInput, match=r"stop_words_ids\[1\]"):
        stop_sequences_from_tensor(np.array([[[5], [49152]]], np.int32), 49152)
    with pytest.raises(InvalidInput, match=r"must be \[1, words, longest\]"):
        stop_sequences_from_tensor(np.array([[[5]], [[6]]], np.int32), 49152)


def chunks_of(completion: Completion, steps):
    """Feeds engine steps (token lists; the last one marked finished) and collects the chunks."""
    chunks = []
    for i, tokens in enumerate(steps):
        chunks += completion.on_tokens(tokens, engine_finished=i == len(steps) - 1)
        if completion.finished:
            break
    return chunks


def test_non_streamed_completion_is_one_final_chunk_with_every_id():
    chunks = chunks_of(Completion(7, eos_ids=frozenset({EOS})), [[10], [11, 12], [13]])
    assert len(chunks) == 1
    chunk = chunks[0]
    assert (chunk.output_ids, chunk.context_ids, chunk.final) == ([10, 11, 12, 13], [], True)
    assert (chunk.finish_reason, chunk.prompt_tokens, chunk.completion_tokens) == (FINISH_LENGTH, 7, 4)


def test_eos_finishes_with_stop_and_is_not_sent():
    completion = Completion(3, eos_ids=frozenset({EOS}), stream=True, context_window=8)
    chunks = chunks_of(completion, [[10], [11], [EOS], [12]])
    assert [c.output_ids for c in chunks] == [[10], [11], []]
    assert chunks[-1].final and chunks[-1].finish_reason == FINISH_STOP
    assert chunks[-1].completion_tokens == 2
    assert completion.generated == 3  # the EOS went through the KV cache all the same


def test_stream_interval_and_context_window():
    completion = Completion(5, stream=True, stream_interval=2, context_window=3)
    # The first id goes out alone (a client's first token waits for no other), then every 2.
    chunks = chunks_of(completion, [[1], [2], [3], [4, 5, 6], [7]])
    assert [(c.context_ids, c.output_ids, c.final) for c in chunks] == [
        ([], [1], False), ([1], [2, 3], False), ([1, 2, 3], [4, 5, 6], False), ([4, 5, 6], [7], True)]
    assert [c.completion_tokens for c in chunks] == [1, 3, 6, 7]
    assert [c.finish_reason for c in chunks] == ["", "", "", FINISH_LENGTH]


def test_stop_sequence_is_held_then_dropped():
    completion = Completion(4, stop_sequences=[[20, 21]], stream=True, context_window=8)
    chunks = chunks_of(completion, [[10], [20], [21], [30]])
    assert [c.output_ids for c in chunks] == [[10], []]
    assert chunks[-1].final and chunks[-1].finish_reason == FINISH_STOP
    assert sum(len(c.output_ids) for c in chunks) == chunks[-1].completion_tokens == 1


def test_held_prefix_is_released_on_mismatch_and_at_the_end():
    completion = Completion(4, stop_sequences=[[20, 21]], stream=True, context_window=8)
    chunks = chunks_of(completion, [[10], [20], [22], [20]])
    assert [c.output_ids for c in chunks] == [[10], [20, 22], [20]]
    assert chunks[-1].finish_reason == FINISH_LENGTH
    assert chunks[-1].context_ids == [10, 20, 22]


def test_cancel_sends_a_final_empty_chunk():
    completion = Completion(4, stream=True, context_window=8)
    first = completion.on_tokens([10, 11])
    cancelled = completion.cancel()
    assert first[0].output_ids == [10, 11]
    assert (cancelled.output_ids, cancelled.final, cancelled.finish_reason) == ([], True, FINISH_CANCELLED)
    assert cancelled.completion_tokens == 2


def test_chunk_tensors_have_the_batch_dimension():
    chunk = Completion(3, stream=True, context_window=8).on_tokens([5, 6], engine_finished=True)[0]
    tensors = chunk.tensors()
    assert tensors["output_ids"].shape == (1, 2) and tensors["output_ids"].dtype == np.int32
    assert tensors["context_ids"].shape == (1, 0)
    assert tensors["is_final"].tolist() == [[True]]
    assert tensors["finish_reason"].tolist() == [[b"length"]]
    assert tensors["prompt_tokens"].tolist() == [[3]] and tensors["completion_tokens"].tolist() == [[2]]

"""The llm model's serving loop against a scripted engine and a recording client side."""
import threading

import numpy as np
import pytest

from harness.chunks import acknowledge
from tritonfront.core.delivery import SLOTS, Acknowledger, DeliveryTracker, ack_table_path
from tritonfront.engines import Engine, EngineOutput, SamplingParams
from tritonfront.core.generation_loop import FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, GenerationLoop, TurnHooks
from tritonfront.core.generation_request import SequenceRequest
from tritonfront.core.rank_load import Load
from tritonfront.core.shared_tables import open_rows

EOS = 2


class ScriptedEngine(Engine):
    context_length, vocab_size, eos_token_ids = 100, 1000, frozenset({EOS})

    def __init__(self):
        self.added, self.cancelled, self.pending, self.broken = {}, [], [], None

    def add(self, request_id, prompt_ids, params):
        self.added[request_id] = (list(prompt_ids), params)

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def outputs(self, timeout):
        if self.broken:
            raise self.broken
        outputs, self.pending = self.pending, []
        return outputs

    def shutdown(self):
        pass

    def emit(self, request_id, tokens, finished=False, error=None):
        self.pending.append(EngineOutput(request_id, tokens, finished, error))


class Client:
    def __init__(self):
        self.chunks, self.errors, self.gone, self.broken_pipe = {}, {}, set(), set()

    def send(self, handle, chunk):
        if handle in self.broken_pipe:
            raise ConnectionError("client went away")
        self.chunks.setdefault(handle, []).append(chunk)

    def fail(self, handle, error):
        self.errors[handle] = error

    def is_cancelled(self, handle, ask_client=True):
        return ask_client and handle in self.gone


@pytest.fixture
def setup():
    engine, client, loads = ScriptedEngine(), Client(), []
    loop = GenerationLoop(engine, client, stream_interval=1, context_window=8, on_load=loads.append, poll_s=0,
                          cancel_check_s=0)
    return engine, client, loop, loads


def submit(loop, engine, handle, prompt_tokens=5, stream=True, stop=(), **params):
    loop.submit(handle, SequenceRequest(list(range(10, 10 + prompt_tokens)), SamplingParams(max_tokens=8, **params),
                                        stop, stream))
    return list(engine.added)[-1]


def test_tokens_reach_their_own_clients(setup):
    engine, client, loop, _ = setup
    a, b = submit(loop, engine, "a"), submit(loop, engine, "b", stream=False)
    engine.emit(a, [100])
    engine.emit(b, [200])
    loop.step()
    engine.emit(a, [101], finished=True)
    engine.emit(b, [201], finished=True)
    loop.step()
    assert [c.output_ids for c in client.chunks["a"]] == [[100], [101]]
    assert [(c.output_ids, c.finish_reason) for c in client.chunks["b"]] == [([200, 201], FINISH_LENGTH)]
    assert engine.cancelled == []
    assert loop.load() == Load(0, 0, 0, 0)


def test_stop_word_ends_the_request_in_the_engine_too(setup):
    engine, client, loop, _ = setup
    a = submit(loop, engine, "a", stop=[[300, 301]])
    engine.emit(a, [100, 300])
    loop.step()
    engine.emit(a, [301])
    loop.step()
    engine.emit(a, [400])  # what the engine's last step still produced is ignored
    loop.step()
    assert [(c.output_ids, c.finish_reason) for c in client.chunks["a"]] == [([100], ""), ([], FINISH_STOP)]
    assert engine.cancelled == [a]


def test_end_id_finishes_like_eos(setup):
    engine, client, loop, _ = setup
    a = submit(loop, engine, "a", end_id=77)
    engine.emit(a, [100, 77])
    loop.step()
    assert [(c.output_ids, c.finish_reason) for c in client.chunks["a"]] == [([100], FINISH_STOP)]
    assert engine.cancelled == [a]  # the engine was asked to stop at 77 too, but need not have


def test_cancelled_client_is_dropped_within_a_step_and_counted(setup):
    engine, client, loop, loads = setup
    a, b = submit(loop, engine, "a"), submit(loop, engine, "b")
    engine.emit(a, [100])
    engine.emit(b, [200])
    loop.step()
    client.gone.add("a")
    engine.emit(b, [201])
    loop.step()
    assert engine.cancelled == [a]
    assert client.chunks["a"][-1].final and client.chunks["a"][-1].finish_reason == FINISH_CANCELLED
    assert loads[-1] == Load(outstanding_tokens=5 + 2, waiting_requests=0, active_sequences=1, cancelled_requests=1)
    engine.emit(b, [202], finished=True)
    loop.step()
    assert [c.output_ids for c in client.chunks["b"]] == [[200], [201], [202]]


def test_load_counts_prompt_and_generated_tokens(setup):
    engine, client, loop, loads = setup
    a = submit(loop, engine, "a", prompt_tokens=5)
    submit(loop, engine, "b", prompt_tokens=7)
    assert loads[-1] == Load(12, 2, 2, 0)  # published at submit, before any engine step
    engine.emit(a, [100, 101, 102])
    loop.step()
    assert loads[-1] == Load(15, 1, 2, 0)


def test_unreachable_client_is_cancelled_others_go_on(setup):
    engine, client, loop, _ = setup
    a, b = submit(loop, engine, "a"), submit(loop, engine, "b")
    client.broken_pipe.add("a")
    engine.emit(a, [100])
    engine.emit(b, [200])
    loop.step()
    assert engine.cancelled == [a]
    assert [c.output_ids for c in client.chunks["b"]] == [[200]]
    assert loop.load().active_sequences == 1


def test_engine_errors_fail_requests(setup):
    engine, client, loop, _ = setup
    a = submit(loop, engine, "a")
    submit(loop, engine, "b")
    engine.emit(a, [], finished=True, error="out of memory")
    loop.step()
    assert "out of memory" in str(client.errors["a"])
    engine.broken = RuntimeError("generation thread died")
    loop.step()
    assert "generation thread died" in str(client.errors["b"])
    assert loop.load() == Load(0, 0, 0, 0)


def test_a_request_the_engine_refuses_is_not_kept(setup):
    engine, client, loop, _ = setup

    def refuse(*args):
        raise RuntimeError("not accepting requests")

    engine.add = refuse
    with pytest.raises(RuntimeError):
        submit(loop, engine, "a")
    assert loop.load() == Load(0, 0, 0, 0)


def test_a_waiting_request_is_cancelled_without_engine_output(setup):
    engine, client, loop, _ = setup
    a = submit(loop, engine, "a")
    client.gone.add("a")
    loop.step()  # the engine is still prefilling: no output, yet the check runs
    assert engine.cancelled == [a]
    assert client.chunks["a"][-1].finish_reason == FINISH_CANCELLED


def test_each_client_is_asked_about_cancellation_at_most_once_per_interval():
    now = [0.0]
    engine, client, asked = ScriptedEngine(), Client(), []
    client.is_cancelled = lambda handle, ask_client=True: asked.append(handle) or handle in client.gone
    loop = GenerationLoop(engine, client, poll_s=0, cancel_check_s=0.5, clock=lambda: now[0])
    a = submit(loop, engine, "a")
    for _ in range(3):  # steps within the interval: no round trip to Triton
        now[0] += 0.1
        engine.emit(a, [100])
        loop.step()
    assert asked == []
    now[0] += 0.2
    submit(loop, engine, "b")  # new: first asked one interval after it arrived
    client.gone.add("a")
    loop.step()
    assert asked == ["a"] and engine.cancelled == [a]
    now[0] += 0.5
    loop.step()
    assert asked == ["a", "b"]


def test_cancellation_asks_share_their_rate_among_the_live_requests(tmp_path):
    """max_cancel_check_rate: with more live requests than the rate allows every cancel_check_s,
    each is asked every live requests / rate seconds, directly or through its chunks."""
    now = [0.0]
    engine, client, asked = ScriptedEngine(), Client(), []
    client.is_cancelled = lambda handle, ask_client=True: ask_client and (asked.append(handle) or handle in client.gone)
    rows = open_rows(ack_table_path(7, 1, tmp_path), 1, SLOTS)
    loop = GenerationLoop(engine, client, poll_s=0, cancel_check_s=0.5, max_cancel_check_rate=2, clock=lambda: now[0],
                          delivery=DeliveryTracker(rows[0], 7, 0, timeout_s=600.0, clock=lambda: now[0]))
    direct = [submit(loop, engine, name) for name in ("a", "b")]
    loop.submit("s", SequenceRequest([10, 11], SamplingParams(max_tokens=50), stream=True,
                                     delivery_acknowledged=True))
    behind = list(engine.added)[-1]
    acknowledger = Acknowledger(1, tmp_path)
    for _ in range(3):  # 3 live requests at 2 asks a second: each asked every 1.5 s, not every 0.5 s
        now[0] += 0.5
        for request_id in (*direct, behind):
            engine.emit(request_id, [100])
        loop.step()
        acknowledge(acknowledger, np.array([c.delivery for c in client.chunks["s"]]))
    assert sorted(asked) == ["a", "b", "s"]  # "s" once, on the loop's first turn (behind the ensemble)
    assert [c.check_cancelled for c in client.chunks["s"]] == [True, False, False]
    now[0] += 0.5
    engine.emit(behind, [100])
    loop.step()
    assert client.chunks["s"][-1].check_cancelled  # 1.5 s after the first chunk that asked
    assert sorted(asked) == ["a", "b", "s"]  # the direct ones were last asked 0.5 s ago
    loop.max_cancel_check_rate = 0  # no limit: every cancel_check_s
    for _ in range(2):
        now[0] += 0.5
        loop.step()
    assert sorted(asked) == ["a"] * 3 + ["b"] * 3 + ["s"]


def test_a_request_behind_the_ensemble_is_asked_about_cancellation_once():
    """Triton cancels an ensemble's llm step only before it starts: it is asked on the first turn and
    never again (what the responder knows without asking still counts on every check)."""
    engine, client, asked, known = ScriptedEngine(), Client(), [], []
    client.is_cancelled = lambda handle, ask_client=True: (asked.append(handle) if ask_client else known.append(handle)) \
        or ask_client and handle in client.gone
    now = [0.0]
    loop = GenerationLoop(engine, client, poll_s=0, cancel_check_s=0.5, clock=lambda: now[0])
    for handle in ("ensemble", "direct", "left early"):
        loop.submit(handle, SequenceRequest([10, 11], SamplingParams(max_tokens=8), stream=False,
                                            delivery_acknowledged=handle != "direct"))
    behind, direct, left_early = list(engine.added)
    client.gone.add("left early")
    loop.step()  # at once behind the ensemble; a direct request one interval after it arrived
    assert asked == ["ensemble", "left early"] and engine.cancelled == [left_early]
    client.gone.add("ensemble")
    for _ in range(2):
        now[0] += 0.5
        loop.step()
    assert asked == ["ensemble", "left early", "direct", "direct"] and known == ["ensemble", "ensemble"]
    assert engine.cancelled == [left_early]
    engine.emit(behind, [100, EOS], finished=True)
    loop.step()
    assert client.chunks["ensemble"][-1].finish_reason == FINISH_STOP


def test_a_stream_whose_chunks_are_not_acknowledged_is_freed(tmp_path):
    """Behind the ensemble nobody tells the llm of a cancelled stream: its unacknowledged chunks do."""
    now = [0.0]
    rows = open_rows(ack_table_path(7, 1, tmp_path), 1, SLOTS)
    tracker = DeliveryTracker(rows[0], 7, 0, timeout_s=5.0, clock=lambda: now[0])
    engine, client = ScriptedEngine(), Client()
    loop = GenerationLoop(engine, client, poll_s=0, cancel_check_s=0, delivery=tracker)
    loop.submit("gone", SequenceRequest([10, 11], SamplingParams(max_tokens=50), stream=True,
                                        delivery_acknowledged=True))
    loop.submit("direct", SequenceRequest([10, 11], SamplingParams(max_tokens=50), stream=True))
    gone, direct = list(engine.added)
    for step in range(3):
        engine.emit(gone, [100])
        engine.emit(direct, [100])
        loop.step()
        if step == 0:  # the detokenizer took the first chunk; the second stays unacknowledged
            acknowledge(Acknowledger(1, tmp_path), np.array([c.delivery for c in client.chunks["gone"][:1]]))
    assert len(client.chunks["gone"]) == 2  # the third token waits behind the second chunk
    now[0] += 5.1
    loop.step()
    assert engine.cancelled == [gone]
    assert client.chunks["gone"][-1].finish_reason == FINISH_CANCELLED
    assert all(c.delivery[2] == -1 for c in client.chunks["direct"])  # not tracked: its client is reached directly
    assert loop.load().active_sequences == 1 and loop.load().cancelled_requests == 1


def test_wait_for_room_holds_until_a_request_leaves(setup):
    engine, client, loop, _ = setup
    a = submit(loop, engine, "a")
    submit(loop, engine, "b")
    released = threading.Event()
    waiter = threading.Thread(target=lambda: (loop.wait_for_room(2), released.set()))
    waiter.start()
    assert not released.wait(0.2)
    engine.emit(a, [100], finished=True)
    loop.step()
    assert released.wait(5)
    waiter.join()


def test_tokens_wait_behind_an_unacknowledged_chunk_and_leave_together(tmp_path):
    """One detokenizer request per token while the detokenizer keeps up; fewer, larger ones when it
    does not."""
    rows = open_rows(ack_table_path(7, 1, tmp_path), 1, SLOTS)
    engine, client = ScriptedEngine(), Client()
    loop = GenerationLoop(engine, client, context_window=8, poll_s=0,
                          delivery=DeliveryTracker(rows[0], 7, 0, timeout_s=60.0))
    detokenizer = Acknowledger(1, tmp_path)
    loop.submit("s", SequenceRequest([10, 11], SamplingParams(max_tokens=50), stream=True,
                                     delivery_acknowledged=True))
    (request_id,) = engine.added
    acknowledge_all = lambda: acknowledge(detokenizer, np.array([c.delivery for c in client.chunks["s"]]))

    engine.emit(request_id, [100])
    loop.step()
    acknowledge_all()
    engine.emit(request_id, [101])
    loop.step()  # acknowledged in time: the next token goes out at once
    assert [c.output_ids for c in client.chunks["s"]] == [[100], [101]]

    for token in (102, 103, 104):  # [101] is still in the detokenizer's queue
        engine.emit(request_id, [token])
        loop.step()
    assert [c.output_ids for c in client.chunks["s"]] == [[100], [101]]
    acknowledge_all()
    loop.step()  # no new token: the held ones leave as soon as the acknowledgement is seen
    assert [c.output_ids for c in client.chunks["s"]] == [[100], [101], [102, 103, 104]]
    assert client.chunks["s"][-1].context_ids == [100, 101]

    engine.emit(request_id, [105])
    loop.step()  # [102, 103, 104] not acknowledged yet
    engine.emit(request_id, [106], finished=True)
    loop.step()
    # The end waits too: two chunks of a stream in the detokenizer at once could change places.
    assert len(client.chunks["s"]) == 3 and loop.load().active_sequences == 1
    engine.emit(request_id, [107])  # the engine's late output for an ended request is ignored
    acknowledge_all()
    loop.step()
    assert [c.output_ids for c in client.chunks["s"][3:]] == [[105, 106]]
    assert client.chunks["s"][-1].finish_reason == FINISH_LENGTH and client.chunks["s"][-1].final
    assert loop.load().active_sequences == 0 and engine.cancelled == []


def test_the_loop_waits_for_the_engine_as_long_as_its_own_work_allows(tmp_path):
    """Short waits only while a chunk waits for its acknowledgement; longer ones while requests are
    live (cancellation checks) and longest with none (heartbeat): each timed-out wait costs CPU."""
    rows = open_rows(ack_table_path(7, 1, tmp_path), 1, SLOTS)
    engine, client, waits = ScriptedEngine(), Client(), []
    outputs = engine.outputs
    engine.outputs = lambda timeout: waits.append(timeout) or outputs(timeout)
    loop = GenerationLoop(engine, client, poll_s=0.02, cancel_check_s=1.0, idle_poll_s=0.5,
                          delivery=DeliveryTracker(rows[0], 7, 0, timeout_s=60.0))
    loop.step()
    loop.submit("s", SequenceRequest([10, 11], SamplingParams(max_tokens=3), stream=True,
                                     delivery_acknowledged=True))
    (request_id,) = engine.added
    engine.emit(request_id, [100])
    loop.step()  # sent; nothing waits behind it
    engine.emit(request_id, [101])
    loop.step()  # held behind [100]
    engine.emit(request_id, [102], finished=True)
    loop.step()  # the end waits behind [100] too
    acknowledge(Acknowledger(1, tmp_path), np.array([c.delivery for c in client.chunks["s"]]))
    loop.step()  # [101, 102] out: the request ended
    loop.step()
    assert waits == [0.5, 0.2, 0.2, 0.02, 0.02, 0.5]
    assert [c.output_ids for c in client.chunks["s"]] == [[100], [101, 102]]
    loop.hooks = TurnHooks()
    loop.step()
    assert waits[-1] == 0.5  # hooks that only time turns change nothing
    loop.hooks.works_every_turn = True
    loop.step()
    assert waits[-1] == 0.02  # hooks that take requests over need every turn


def stream_behind_ensemble(tmp_path, timeout_s: float, now: list):
    """A loop holding one stream, "s", behind the ensemble (a detokenizer acknowledges its chunks;
    unacknowledged for timeout_s on the clock `now[0]`, it is abandoned), cancellation checked on
    every turn; and the stream's id in the engine."""
    rows = open_rows(ack_table_path(7, 1, tmp_path), 1, SLOTS)
    engine, client = ScriptedEngine(), Client()
    loop = GenerationLoop(engine, client, poll_s=0, cancel_check_s=0,
                          delivery=DeliveryTracker(rows[0], 7, 0, timeout_s=timeout_s, clock=lambda: now[0]))
    loop.submit("s", SequenceRequest([10, 11], SamplingParams(max_tokens=50), stream=True,
                                     delivery_acknowledged=True))
    (request_id,) = engine.added
    return engine, client, loop, request_id


def test_a_final_chunk_behind_a_chunk_never_acknowledged_ends_as_cancelled(tmp_path):
    now = [0.0]
    engine, client, loop, request_id = stream_behind_ensemble(tmp_path, 5.0, now)
    engine.emit(request_id, [100])
    loop.step()
    engine.emit(request_id, [101, EOS], finished=True)
    loop.step()
    assert len(client.chunks["s"]) == 1
    now[0] += 5.1  # [100] was dropped: the stream is abandoned
    loop.step()
    assert [c.finish_reason for c in client.chunks["s"]] == ["", FINISH_CANCELLED]
    assert client.chunks["s"][-1].final and engine.cancelled == []  # it had left the engine
    assert loop.load().active_sequences == 0 and loop.load().cancelled_requests == 1


def test_a_stream_stopped_while_the_detokenizer_holds_a_chunk_ends_after_that_chunk(tmp_path):
    """A stop request (read without asking Triton) leaves the engine at once; its final chunk waits
    for the chunk the detokenizer holds, or a second detokenizer instance could overtake it."""
    engine, client, loop, request_id = stream_behind_ensemble(tmp_path, 60.0, [0.0])
    client.is_cancelled = lambda handle, ask_client=True: handle in client.gone
    engine.emit(request_id, [100])
    loop.step()
    client.gone.add("s")
    loop.step()
    assert engine.cancelled == [request_id] and len(client.chunks["s"]) == 1
    assert loop.load().active_sequences == 1 and loop.load().cancelled_requests == 1
    engine.emit(request_id, [101])  # the engine's late output for a stopped request is ignored
    loop.step()
    assert len(client.chunks["s"]) == 1
    acknowledge(Acknowledger(1, tmp_path), np.array([c.delivery for c in client.chunks["s"]]))
    loop.step()
    assert [(c.output_ids, c.finish_reason, c.final) for c in client.chunks["s"]] == [
        ([100], "", False), ([], FINISH_CANCELLED, True)]
    assert loop.load().active_sequences == 0 and engine.cancelled == [request_id]


def test_a_stopped_stream_whose_held_chunk_is_never_acknowledged_ends_once_and_counts_once(tmp_path):
    now = [0.0]
    engine, client, loop, request_id = stream_behind_ensemble(tmp_path, 5.0, now)
    client.is_cancelled = lambda handle, ask_client=True: handle in client.gone
    engine.emit(request_id, [100])
    loop.step()
    client.gone.add("s")
    loop.step()  # parked behind [100], which the detokenizer dropped
    assert len(client.chunks["s"]) == 1 and loop.load().cancelled_requests == 1
    now[0] += 5.1
    loop.step()
    loop.step()
    assert [(c.finish_reason, c.final) for c in client.chunks["s"]] == [("", False), (FINISH_CANCELLED, True)]
    assert loop.load().cancelled_requests == 1 and loop.load().active_sequences == 0
    assert engine.cancelled == [request_id]


def test_a_stop_request_is_seen_every_interval_whatever_the_ask_rate():
    """The rate caps round trips to Triton; what the Responder knows without one (an LLM-API stop
    request, read from shared memory) is looked at every cancel_check_s."""
    now = [0.0]
    engine, client, stopped = ScriptedEngine(), Client(), set()
    client.is_cancelled = lambda handle, ask_client=True: handle in stopped
    loop = GenerationLoop(engine, client, poll_s=0, cancel_check_s=0.5, max_cancel_check_rate=1, clock=lambda: now[0])
    for handle in ("x", "y", "z"):
        loop.submit(handle, SequenceRequest([10, 11], SamplingParams(max_tokens=8), stream=False,
                                            delivery_acknowledged=True))
    x = list(engine.added)[0]
    loop.step()  # behind the ensemble: asked once, now
    stopped.add("x")
    now[0] += 0.5  # 3 live requests at 1 ask a second would wait 3 s for a round trip
    loop.step()
    assert engine.cancelled == [x] and client.chunks["x"][-1].finish_reason == FINISH_CANCELLED


class RecordingHooks(TurnHooks):
    """Hands one request over per turn from a queue, as a benchmark variant would."""

    def __init__(self):
        self.queued, self.turns, self.failures = [], [], []

    def before_turn(self, loop):
        handled = 0
        while self.queued:
            loop.submit(*self.queued.pop(0))
            handled += 1
        return handled

    def after_turn(self, seconds):
        self.turns.append(seconds)

    def on_fail_all(self, error):
        self.failures.append(error)


def test_hooks_see_busy_turns_only_and_the_loop_failing_everything(setup):
    engine, client, loop, _ = setup
    loop.hooks = hooks = RecordingHooks()
    loop.step()
    assert hooks.turns == []  # nothing to do: not a busy turn
    hooks.queued.append(("a", SequenceRequest([5, 6], SamplingParams(max_tokens=4), (), True)))
    loop.step()
    assert list(engine.added) == ["req-0"] and len(hooks.turns) == 1 and hooks.turns[0] >= 0
    engine.emit("req-0", [7])
    loop.step()
    assert len(hooks.turns) == 2 and [c.output_ids for c in client.chunks["a"]] == [[7]]
    engine.broken = RuntimeError("engine died")
    loop.step()
    assert [str(e) for e in hooks.failures] == ["engine died"] and "a" in client.errors


def test_a_stopping_server_refuses_new_requests_and_ends_the_running_ones_after_the_grace(monkeypatch):
    """serve.sh's SIGTERM (core/server_stop.py): new requests get Unavailable at once, running ones
    go on for stop_grace_s, then end with what they generated (held stop-word ids included)."""
    import tritonfront.core.generation_loop as generation_loop
    from tritonfront.errors import Unavailable

    monkeypatch.setattr(generation_loop, "STOP_CHECK_S", 0)
    now, stopping = [0.0], [False]
    engine, client = ScriptedEngine(), Client()
    loop = GenerationLoop(engine, client, poll_s=0, clock=lambda: now[0], stopping=lambda: stopping[0],
                          stop_grace_s=4.0)
    a = submit(loop, engine, "a", stop=[[300, 301]])
    b = submit(loop, engine, "b", stream=False)
    engine.emit(a, [100])
    engine.emit(b, [200])
    loop.step()
    stopping[0] = True
    engine.emit(a, [101, 300])  # 300 is held: it may start the stop word
    loop.step()
    with pytest.raises(Unavailable, match="stopping"):
        submit(loop, engine, "late")
    now[0] = 3.9
    engine.emit(b, [201])
    loop.step()
    assert not client.chunks["a"][-1].final and "b" not in client.chunks  # within the grace
    now[0] = 4.0
    loop.step()
    assert [(c.output_ids, c.final, c.finish_reason) for c in client.chunks["a"]] == [
        ([100], False, ""), ([101], False, ""), ([300], True, FINISH_CANCELLED)]
    assert [(c.output_ids, c.finish_reason) for c in client.chunks["b"]] == [([200, 201], FINISH_CANCELLED)]
    assert sorted(engine.cancelled) == sorted([a, b]) and loop.load().active_sequences == 0


def test_streams_share_the_chunk_rate(monkeypatch):
    """max_chunk_rate: a stream's next chunk waits live streams / rate seconds after its previous
    one and carries every id generated meanwhile; the first goes at once."""
    import tritonfront.core.generation_loop as generation_loop

    now = [100.0]
    monkeypatch.setattr(generation_loop.time, "monotonic", lambda: now[0])
    engine, client = ScriptedEngine(), Client()
    loop = GenerationLoop(engine, client, poll_s=0, max_chunk_rate=20, clock=lambda: now[0])
    a, b = submit(loop, engine, "a"), submit(loop, engine, "b")  # 2 streams: a chunk each per 0.1 s
    for step in range(7):
        engine.emit(a, [100 + step])
        engine.emit(b, [200 + step])
        loop.step()
        now[0] += 0.04
    assert [c.output_ids for c in client.chunks["a"]] == [[100], [101, 102, 103], [104, 105, 106]]

"""Abandoned-stream detection from the detokenizer's acknowledgements, with the llm rank and the
detokenizer in separate processes as Triton's stubs are."""
import multiprocessing
import os

import numpy as np
import pytest

from harness.chunks import acknowledge, refuse
from tritonfront.core.delivery import NO_SLOT, SLOTS, Acknowledger, DeliveryTracker, ack_table_path, model_key
from tritonfront.core.shared_tables import open_rows


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def tracker(tmp_path):
    clock = Clock()
    rows = open_rows(ack_table_path(model_key("llm"), os.getpid(), tmp_path), 2, SLOTS)
    tracker = DeliveryTracker(rows[1], model_key("llm"), 1, timeout_s=5.0, clock=clock)
    return tracker, Acknowledger(os.getpid(), tmp_path), clock


def test_acknowledged_streams_are_never_abandoned(tracker):
    tracker, detokenizer, clock = tracker
    for rid in ("a", "b"):
        tracker.track(rid)
    for _ in range(20):
        stamps = np.array([tracker.stamp("a"), tracker.stamp("b")])
        clock.now += 1.0
        acknowledge(detokenizer, stamps)
        assert tracker.abandoned() == []
    clock.now += 60  # idle with nothing unacknowledged
    assert tracker.abandoned() == []


def test_a_refused_chunk_ends_its_stream_at_once(tracker):
    tracker, detokenizer, clock = tracker
    for rid in ("gone", "live"):
        tracker.track(rid)
    acknowledge(detokenizer, np.array([tracker.stamp("gone"), tracker.stamp("live")]))
    lost = tracker.stamp("gone")  # sent, then the client cancelled: Triton says so to the detokenizer
    refuse(detokenizer, np.array([lost]))
    assert tracker.abandoned() == ["gone"]
    assert lost[2] != NO_SLOT


def test_a_chunk_one_instance_still_decodes_is_not_abandoned_while_another_goes_on(tracker):
    """The detokenizer's instances keep no order: chunks sent later, for other streams, may be
    answered first. Only a refusal or the timeout ends a stream."""
    tracker, detokenizer, clock = tracker
    for rid in ("slow", "live"):
        tracker.track(rid)
    tracker.stamp("slow")
    for _ in range(4):
        clock.now += 1.0
        acknowledge(detokenizer, np.array([tracker.stamp("live")]))
        assert tracker.abandoned() == []


def test_a_refusal_never_overwrites_a_later_answer(tracker):
    tracker, detokenizer, clock = tracker
    tracker.track("s")
    first, second = tracker.stamp("s"), tracker.stamp("s")
    acknowledge(detokenizer, np.array([second]))
    refuse(detokenizer, np.array([first]))  # a slower instance on the earlier chunk, which Triton cancelled
    assert tracker.abandoned() == []


def test_with_no_other_stream_the_timeout_decides(tracker):
    tracker, detokenizer, clock = tracker
    tracker.track("only")
    tracker.stamp("only")
    clock.now += 4.9
    assert tracker.abandoned() == []
    clock.now += 0.2
    assert tracker.abandoned() == ["only"]


def test_untracked_and_released_streams_are_never_reported(tracker):
    tracker, detokenizer, clock = tracker
    assert tracker.stamp("direct")[2] == NO_SLOT
    tracker.track("done")
    tracker.stamp("done")
    tracker.release("done")
    clock.now += 60
    assert tracker.abandoned() == []


def test_a_reused_slot_does_not_inherit_old_acknowledgements(tracker):
    tracker, detokenizer, clock = tracker
    tracker.track("first")
    acknowledge(detokenizer, np.array([tracker.stamp("first") for _ in range(3)]))
    tracker.release("first")
    tracker.track("second")  # gets the slot "first" had
    assert tracker.stamp("second")[2] == tracker._slots["second"]
    clock.now += 5.1
    assert tracker.abandoned() == ["second"]


def test_acknowledgements_keep_the_highest_serial(tracker):
    tracker, detokenizer, clock = tracker
    tracker.track("s")
    first, second = tracker.stamp("s"), tracker.stamp("s")
    acknowledge(detokenizer, np.array([second]))
    acknowledge(detokenizer, np.array([first]))  # a slower instance finishing the earlier chunk
    clock.now += 10
    assert tracker.abandoned() == []


def test_slots_run_out_gracefully(tmp_path):
    rows = open_rows(ack_table_path(1, os.getpid(), tmp_path), 1, 2)
    tracker = DeliveryTracker(rows[0], 1, 0, timeout_s=1.0)
    assert [tracker.track(r) for r in "abc"] == [True, True, False]
    assert tracker.stamp("c")[2] == NO_SLOT


def test_acknowledger_ignores_tables_it_cannot_find(tmp_path):
    acknowledge(Acknowledger(os.getpid(), tmp_path), np.array([[model_key("missing"), 0, 3, 7]]))
    assert not list(tmp_path.iterdir())


def acknowledge_in_another_process(directory, stamps):
    acknowledge(Acknowledger(os.getppid(), directory), np.array(stamps))


def test_acknowledgements_cross_processes(tmp_path):
    clock = Clock()
    rows = open_rows(ack_table_path(model_key("llm"), os.getpid(), tmp_path), 1, SLOTS)
    tracker = DeliveryTracker(rows[0], model_key("llm"), 0, timeout_s=5.0, clock=clock)
    tracker.track("a")
    stamps = [tracker.stamp("a") for _ in range(3)]
    process = multiprocessing.get_context("fork").Process(target=acknowledge_in_another_process,
                                                          args=(tmp_path, stamps))
    process.start()
    process.join(30)
    clock.now += 10
    assert process.exitcode == 0 and tracker.abandoned() == []

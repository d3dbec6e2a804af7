"""When a fault run may stop its load: the recovery rule of harness.faults on recorded timelines
(times in seconds after the kill)."""
from harness.faults import recovered_quietly
from harness.load.outcomes import FAILED, SERVED, Outcome

UNHEALTHY = "in ensemble 'generate', Stub process 'llm_tokenizer_0_0' is not healthy."


def served(scheduled: float, ended: float) -> Outcome:
    outcome = Outcome(scheduled).end(ended, SERVED)
    outcome.correct = True
    return outcome


def test_a_request_still_in_flight_to_the_dead_instance_holds_the_quiet_period_open():
    # CI, 2026-11-28: a request sent at +5.5 to the killed instance failed at +6.5; the load had
    # stopped at +6.0, counting the quiet seconds from the kill, and no answer came after the failure.
    in_flight = Outcome(5.5)
    outcomes = [served(0.0, 6.0), in_flight]
    assert not recovered_quietly(outcomes, killed=0.0, now=11.0, quiet_s=5.0)
    in_flight.end(6.5, FAILED, UNHEALTHY)
    outcomes += [served(6.6, 10.0), Outcome(10.5)]
    assert not recovered_quietly(outcomes, killed=0.0, now=11.0, quiet_s=5.0)  # the failure was 4.5 s ago
    assert recovered_quietly(outcomes, killed=0.0, now=11.6, quiet_s=5.0)


def test_no_correct_answer_after_the_last_failure_is_no_recovery():
    outcomes = [served(0.5, 2.0), Outcome(2.0).end(3.0, FAILED, UNHEALTHY)]
    assert not recovered_quietly(outcomes, killed=0.0, now=60.0, quiet_s=5.0)


def test_requests_sent_before_the_kill_do_not_hold_it():
    # An in-flight request of a dead decoupled stub may hang for the client's whole deadline.
    outcomes = [Outcome(-1.0), served(0.5, 4.0)]
    assert recovered_quietly(outcomes, killed=0.0, now=10.0, quiet_s=5.0)

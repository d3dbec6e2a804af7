"""One outcome taxonomy for every load: errors as tritonclient raises them, with the messages a
real tritonserver 2.51 sent (recorded from a model with a queue of 1 and a 2 ms queue timeout,
over gRPC, a gRPC stream and HTTP), and the client-side errors of a real client."""
import asyncio
import socket

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc._utils import get_cancelled_error
from tritonclient.utils import InferenceServerException

from harness.clients.kserve import text_inputs
from harness.load.outcomes import (CANCELLED, FAILED, INVALID, NO_ANSWER, REJECTED, SERVED, TIMED_OUT, UNREACHABLE,
                                   NoAnswer, Outcome, Tally, classify, count, latency_ms)
from harness.server import free_ports

QUEUE_FULL = "[request id: <id_unknown>] Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
SERVER_ERRORS = [  # (status as tritonclient gives it, message) -> kind
    (("StatusCode.UNAVAILABLE", QUEUE_FULL), REJECTED),
    ((None, QUEUE_FULL), REJECTED),  # on a gRPC stream: a message, no status
    (("503", QUEUE_FULL), REJECTED),
    (("StatusCode.UNAVAILABLE", QUEUE_TIMEOUT), TIMED_OUT),
    ((None, QUEUE_TIMEOUT), TIMED_OUT),
    (("503", QUEUE_TIMEOUT), TIMED_OUT),
    (("StatusCode.INVALID_ARGUMENT", "[request id: <id_unknown>] inference request batch-size must be <= 64 for "
                                     "'tiny_queue'"), INVALID),
    (("400", "[request id: <id_unknown>] inference input 'text_input' data-type is 'INT32', but model 'tiny_queue' "
             "expects 'BYTES'"), INVALID),
    (("StatusCode.INVALID_ARGUMENT", "text_input[1]: 65537 bytes, above the limit of 65536 bytes"), INVALID),
    (("StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found"), FAILED),
    (("404", "Request for unknown model: 'nope' is not found"), FAILED),
    (("StatusCode.INTERNAL", "in ensemble 'embed', Stub process 'encoder_0_0' is not healthy."), FAILED),
    ((None, "in ensemble 'generate', Stub process 'llm_0_0' is not healthy."), FAILED),
    (("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded"), NO_ANSWER),
    (("StatusCode.UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed "
                                "to connect to remote host: Connection refused"), UNREACHABLE),
    (("StatusCode.UNAVAILABLE", "Socket closed"), UNREACHABLE),
]


@pytest.mark.parametrize("error, kind", SERVER_ERRORS, ids=[f"{k}: {m[:40]}" for (_, m), k in SERVER_ERRORS])
def test_server_errors_as_tritonclient_raises_them(error, kind):
    status, message = error
    assert classify(InferenceServerException(msg=message, status=status)) == kind
    if status is None:  # a stream's error is also handled as the bare message
        assert classify(message) == kind


def test_cancellation_as_tritonclient_reports_it():
    assert classify(get_cancelled_error()) == CANCELLED  # what stop_stream(cancel_requests=True) gives callbacks
    assert classify(asyncio.CancelledError()) == CANCELLED


def test_a_refused_connection_from_real_clients():
    port, = free_ports(1)
    with pytest.raises(InferenceServerException) as grpc_error:
        grpcclient.InferenceServerClient(f"127.0.0.1:{port}").infer("m", text_inputs(["a"]), client_timeout=10)
    assert classify(grpc_error.value) == UNREACHABLE
    with pytest.raises(ConnectionRefusedError) as http_error:
        httpclient.InferenceServerClient(f"127.0.0.1:{port}").infer("m", text_inputs(["a"], httpclient))
    assert classify(http_error.value) == UNREACHABLE


def test_a_server_that_never_answers_from_a_real_client():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(InferenceServerException) as error:
            client.infer("m", text_inputs(["a"]), client_timeout=0.3)
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED" and classify(error.value) == NO_ANSWER
    assert classify(NoAnswer("no final response in 60 s")) == classify(asyncio.TimeoutError()) == NO_ANSWER


def test_outcome_latency_error_and_hung():
    served = Outcome(10.0).end(10.25, SERVED, result=[1])
    assert served.latency_s == 0.25 and served.error is None and not served.hung
    waiting = Outcome(10.0)
    assert waiting.kind is None and waiting.error is None and waiting.latency_s != waiting.latency_s  # NaN
    rejected = Outcome(10.0).fail(10.01, InferenceServerException(QUEUE_FULL, "StatusCode.UNAVAILABLE"))
    assert rejected.kind == REJECTED and rejected.error == f"[StatusCode.UNAVAILABLE] {QUEUE_FULL}"
    assert Outcome(1.0).fail(61.0, NoAnswer("no final response in 60 s")).hung
    outcomes = [served, rejected, Outcome(0.0).end(0.5, REJECTED), waiting]
    assert count(outcomes)[REJECTED] == 2 and count(outcomes)[SERVED] == 1 and count(outcomes)[FAILED] == 0
    assert latency_ms(outcomes, REJECTED, 100) == pytest.approx(500) and latency_ms(outcomes, TIMED_OUT, 50) != 0


def test_tally_separates_expected_outcomes_from_unexpected_ones():
    tally = Tally()
    tally.record("embed", SERVED, 0.1)
    tally.record("embed", REJECTED, 0.01, QUEUE_FULL)  # overload: fine, no latency kept
    tally.record("embed", FAILED, 0.2, "embedding norms 0.5..1.0, expected 1", expected=False)
    tally.record("bad", INVALID, 0.005, "dimensions: 0 is outside 1..384")
    tally.record("bad", SERVED, 0.1, "accepted", expected=False)
    assert tally.counts["embed"] == {"sent": 3, SERVED: 1, REJECTED: 1, FAILED: 1, "unexpected": 1}
    assert tally.unexpected() == 2 and tally.total()["sent"] == 5
    assert tally.latencies == {"embed": [0.1], "bad": [0.005]}
    assert tally.messages[REJECTED] == {QUEUE_FULL: 1}
    assert tally.unexpected_messages["bad"] == {"accepted": 1} and len(tally.first_unexpected) == 2

"""What became of a request: the one taxonomy of every load, test and report.

    served       answered (whether the answer is right is `correct`, checked by the caller)
    rejected     turned away at the door because a queue was full: UNAVAILABLE
                 "Exceeds maximum queue size" (HTTP 503); the overload policy working
    timed out    accepted, then dropped by the queue policy's timeout: "Request timeout expired"
    invalid      refused as bad input: INVALID_ARG (HTTP 400)
    cancelled    cancelled by this client
    no answer    the client's deadline passed first: DEADLINE_EXCEEDED, or no final response
                 of a stream within the time the caller allowed
    unreachable  no connection: refused, reset, the server gone
    failed       anything else (INTERNAL, a dead stub, a stream that ended without its end)

Classification reads the gRPC status (tritonclient's InferenceServerException.status(), e.g.
"StatusCode.UNAVAILABLE", or the HTTP status, "503") and Triton's message. On a gRPC stream an
error carries a message only, so there the message decides, and an INVALID_ARG on a stream is
not told apart from other failures (`failed`)."""
import asyncio
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Optional

from tritonclient.utils import InferenceServerException

from ..stats import percentile

SERVED, REJECTED, TIMED_OUT, INVALID = "served", "rejected", "timed out", "invalid"
CANCELLED, NO_ANSWER, UNREACHABLE, FAILED = "cancelled", "no answer", "unreachable", "failed"
KINDS = (SERVED, REJECTED, TIMED_OUT, INVALID, CANCELLED, NO_ANSWER, UNREACHABLE, FAILED)

QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
# gRPC reports a lost or refused connection as UNAVAILABLE too; these texts tell it from overload.
CONNECTION_LOST = ("failed to connect", "connection refused", "socket closed", "connection reset",
                   "broken pipe", "connection aborted")


class NoAnswer(TimeoutError):
    """No (final) response within the time the client allowed."""


def classify(error: BaseException | str) -> str:
    """The kind of a failed request from its error (an exception, or a stream's message)."""
    if isinstance(error, (NoAnswer, TimeoutError, asyncio.TimeoutError)):
        return NO_ANSWER
    if isinstance(error, asyncio.CancelledError):
        return CANCELLED
    if isinstance(error, ConnectionError):
        return UNREACHABLE
    if isinstance(error, InferenceServerException):
        status, message = error.status() or "", error.message() or str(error)
    else:
        status, message = "", str(error)
    if QUEUE_FULL in message:
        return REJECTED
    if QUEUE_TIMEOUT in message:
        return TIMED_OUT
    if status in ("StatusCode.INVALID_ARGUMENT", "400"):
        return INVALID
    if status == "StatusCode.DEADLINE_EXCEEDED" or "Deadline Exceeded" in message:
        return NO_ANSWER
    if status == "StatusCode.CANCELLED":
        return CANCELLED
    if any(text in message.lower() for text in CONNECTION_LOST):
        return UNREACHABLE
    return FAILED


@dataclass
class Outcome:
    scheduled: float  # when it was due to be sent (latency counts from there)
    kind: Optional[str] = None  # None while it waits for its answer
    ended: Optional[float] = None
    message: str = ""  # the error, for anything but served
    result: object = None  # what a served request returned
    correct: Optional[bool] = None  # served: equal to the expected answer (None: not checked)

    @property
    def latency_s(self) -> float:
        return self.ended - self.scheduled if self.ended is not None else float("nan")

    @property
    def error(self) -> Optional[str]:
        """The error message, None for a served (or still waiting) request."""
        return None if self.kind in (None, SERVED) else self.message

    @property
    def hung(self) -> bool:
        return self.kind == NO_ANSWER

    def end(self, when: float, kind: str, message: str = "", result: object = None) -> "Outcome":
        self.ended, self.kind, self.message, self.result = when, kind, message, result
        return self

    def fail(self, when: float, error: BaseException | str) -> "Outcome":
        return self.end(when, classify(error), str(error))


def count(outcomes) -> Counter:
    """kind -> requests, every kind present (0 where none)."""
    kinds = Counter({kind: 0 for kind in KINDS})
    kinds.update(o.kind for o in outcomes if o.kind is not None)
    return kinds


def latency_ms(outcomes, kind: str, q: float) -> float:
    """The q-th percentile latency (ms) of the outcomes of one kind; NaN when there is none."""
    return percentile([o.latency_s * 1000 for o in outcomes if o.kind == kind], q)


class Tally:
    """Outcomes of several kinds of request ("embed http", "generate stream=true" ...) from many
    threads: per request kind, how many of each outcome and how many were unexpected, the
    latencies of the answered ones, and the distinct messages of the others."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: dict[str, Counter] = defaultdict(Counter)  # request kind -> outcome -> requests
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.messages: dict[str, Counter] = defaultdict(Counter)  # outcome -> message -> requests
        self.unexpected_messages: dict[str, Counter] = defaultdict(Counter)  # request kind -> message -> requests
        self.first_unexpected: list[dict] = []  # the first 50, message in full

    def record(self, request: str, outcome: str, seconds: float, message: str = "", expected: bool = True) -> None:
        """`expected`: whether this outcome is right for this request (an `invalid` answer to a
        bad request is, and `cancelled` to one the client drops on purpose; a served one that
        fails its check is recorded as `failed`). Overload outcomes may be expected, but their
        latency is not the request's."""
        with self.lock:
            counts = self.counts[request]
            counts["sent"] += 1
            counts[outcome] += 1
            if message:
                self.messages[outcome][message[:300]] += 1
            if not expected:
                counts["unexpected"] += 1
                self.unexpected_messages[request][message[:300]] += 1
                if len(self.first_unexpected) < 50:
                    self.first_unexpected.append({"request": request, "outcome": outcome, "message": message[:2000]})
            elif outcome not in (REJECTED, TIMED_OUT):  # the answer it should get: its latency counts
                self.latencies[request].append(seconds)

    def unexpected(self) -> int:
        with self.lock:
            return sum(c["unexpected"] for c in self.counts.values())

    def total(self) -> Counter:
        with self.lock:
            return sum(self.counts.values(), Counter())

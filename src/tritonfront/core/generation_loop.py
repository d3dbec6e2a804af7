"""The `llm` model's serving loop: requests in, engine steps, response chunks out.

The model's `execute` (Triton's thread) parses and validates each request and submits it here,
which queues it into the engine; then, before returning for the next request, it blocks while
this instance holds max_active_requests unfinished requests (`wait_for_room`) and, with token
balancing, while another rank has fewer outstanding tokens (tritonfront.core.balancing), so waiting
requests stay in Triton's queue. One thread per model instance owns the rest: it waits for the
engine's new tokens, turns them into chunks per request (EOS and end_id, stop words,
max_tokens, stream_interval), sends them, and asks each direct request's client whether it
cancelled every cancel_check_s, or every live requests / max_cancel_check_rate seconds when that
is longer (a round trip to Triton each; a request behind the ensemble once: _Live says why, and
its stream's chunks ask the detokenizer's request at the same cadence), so a cancelled request
leaves the batch (and frees its KV cache) within that time and a step. Streams
abandoned behind the ensemble, which Triton does not cancel, are found through a
DeliveryTracker (tritonfront.core.delivery) and leave the same way. Sending and the cancellation
check are a Responder's job, so this runs and is tested without Triton.

A stream behind the ensemble gets one detokenizer request per chunk. While its previous chunk is
not acknowledged yet (still queued in the detokenizer, or being decoded), new tokens are held and
go out together in one chunk once it is: an idle server streams every token as it comes, and a
detokenizer that falls behind gets fewer, larger chunks instead of a growing queue. The final
chunk waits the same way (or until the stream is found abandoned), so a stream never has two
chunks in the detokenizer, whose instances do not keep order between them.
"""
import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from .delivery import NO_SLOT, DeliveryTracker
from ..engines.base import Engine, EngineOutput
from ..errors import Unavailable
from .generation_request import SequenceRequest
from .rank_load import Load
from .stopping import StopMatcher

FINISH_LENGTH, FINISH_STOP, FINISH_CANCELLED = "length", "stop", "cancelled"
STOP_CHECK_S = 0.25  # how often the loop looks whether the server is stopping
logger = logging.getLogger(__name__)


@dataclass
class LLMChunk:
    """One response of the `llm` model for one sequence: the ids since its previous one."""

    output_ids: list[int]  # new ids of this chunk
    context_ids: list[int]  # ids sent just before them, for a stateless detokenizer
    final: bool
    finish_reason: str  # "" until the final chunk
    prompt_tokens: int
    completion_tokens: int  # ids sent so far, this chunk included
    delivery: tuple[int, int, int, int] = (0, 0, NO_SLOT, 0)  # DeliveryTracker.stamp()
    # Whether the acknowledging step asks Triton if this chunk's request was cancelled (a round
    # trip it then pays): the loop asks for it on a stream's chunks at GenerationLoop._ask_interval.
    check_cancelled: bool = True
    log_probs: list[float] = field(default_factory=list)  # one per output id; NaN where the engine gave none
    # One per output id when the request asked for top_logprobs: (token id, log prob) pairs, most
    # likely first; empty where the engine gave none.
    top_log_probs: list[Sequence[tuple[int, float]]] = field(default_factory=list)
    first_token_ns: int = 0  # time.time_ns() when the request's first token came from the engine; 0: none yet
    last_token_ns: int = 0  # ... and its latest
    stop_sequence: tuple = ()  # on the final chunk: the ids of the stop sequence that ended it, if one did

    def tensors(self) -> dict[str, np.ndarray]:
        """The `llm` model's outputs for this chunk to a client that calls it directly, with the
        batch dimension of one request (behind the ensemble it goes packed: fanout.chunk_outputs)."""
        return {
            "output_ids": np.array([self.output_ids], dtype=np.int32).reshape(1, -1),
            "context_ids": np.array([self.context_ids], dtype=np.int32).reshape(1, -1),
            "is_final": np.array([[self.final]], dtype=bool),
            "finish_reason": np.array([[self.finish_reason.encode()]], dtype=np.object_),
            "prompt_tokens": np.array([[self.prompt_tokens]], dtype=np.int32),
            "completion_tokens": np.array([[self.completion_tokens]], dtype=np.int32),
        }


class Completion:
    """One request's generated ids, turned into the chunks its client gets."""

    def __init__(self, prompt_tokens: int, stop_sequences: Sequence[Sequence[int]] = (),
                 eos_ids: frozenset = frozenset(), stream: bool = False, stream_interval: int = 1,
                 context_window: int = 0, wants_log_probs: bool = False):
        self.prompt_tokens = prompt_tokens
        self.generated = 0  # ids the engine produced, sent or held: what this request keeps in the KV cache
        self.finish_reason: Optional[str] = None
        self.stream = stream
        self.stream_interval = stream_interval
        self.context_window = context_window
        self._eos = eos_ids
        self._matcher = StopMatcher(stop_sequences)
        # Most requests have no stop words and want no log probs: their ids then go straight to
        # the pending list, without the per-id bookkeeping (a step of 1,024 streams, each with an
        # id, costs the loop thread that work once per id).
        self._plain = not stop_sequences and not wants_log_probs
        # A streamed chunk waits until then (time.monotonic()): the loop spaces each stream's
        # chunks by its share of the rank's chunk rate (GenerationLoop's max_chunk_rate).
        self.not_before = 0.0
        self._pending: list[int] = []
        self._recent: list[int] = []
        self._sent = 0
        # Log probs (with the top alternatives) travel with their ids: through the stop matcher's
        # hold-back, out with the chunk; one (log prob, alternatives) pair per id.
        self._pending_log_probs: list[tuple[float, Sequence]] = []
        self._held_log_probs: list[tuple[float, Sequence]] = []
        self.first_token_ns = self.last_token_ns = 0
        self.stop_sequence: tuple = ()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_tokens(self, token_ids: Sequence[int], engine_finished: bool = False,
                  engine_reason: Optional[str] = None, hold: bool = False,
                  log_probs: Optional[Sequence[float]] = None,
                  top_log_probs: Optional[Sequence[Sequence[tuple[int, float]]]] = None) -> list[LLMChunk]:
        """The chunks these new ids complete: the final one when the request ends, otherwise a
        streamed one every stream_interval ids unless `hold` (the ids then wait for `release`).
        `log_probs` and `top_log_probs`, one per id where the engine gives them, travel with their ids."""
        if token_ids:
            self.last_token_ns = time.time_ns()
            self.first_token_ns = self.first_token_ns or self.last_token_ns
        if self._plain and not log_probs and not top_log_probs:
            self._take_plain(token_ids)
        else:
            self._take_each(token_ids, log_probs, top_log_probs)
        if engine_finished and not self.finished:
            self._end(engine_reason or FINISH_LENGTH)
        if self.finished:
            return [self._chunk(final=True)]
        if not hold and self.holding:
            return [self._chunk(final=False)]
        return []

    def _take_plain(self, token_ids: Sequence[int]) -> None:
        if self.finished or not token_ids:
            return
        ids = token_ids if isinstance(token_ids, list) else [int(t) for t in token_ids]
        if not self._eos.isdisjoint(ids):
            end = next(i for i, token in enumerate(ids) if token in self._eos)
            self.generated += end + 1
            self._pending.extend(ids[:end])
            self._end(FINISH_STOP)
            return
        self.generated += len(ids)
        self._pending.extend(ids)

    def _take_each(self, token_ids: Sequence[int], log_probs: Optional[Sequence[float]],
                   top_log_probs: Optional[Sequence[Sequence[tuple[int, float]]]]) -> None:
        if log_probs is None or len(log_probs) != len(token_ids):
            log_probs = [math.nan] * len(token_ids)
        if top_log_probs is None or len(top_log_probs) != len(token_ids):
            top_log_probs = [()] * len(token_ids)
        for token, log_prob, top in zip(token_ids, log_probs, top_log_probs):
            if self.finished:
                break
            self.generated += 1
            if token in self._eos:
                self._end(FINISH_STOP)
                break
            released, matched = self._matcher.push(int(token))
            self._pending.extend(released)
            held = self._held_log_probs + [(float(log_prob), top)]
            self._pending_log_probs.extend(held[:len(released)])
            self._held_log_probs = held[len(released):] if not matched else []
            if matched:
                self.finish_reason = FINISH_STOP
                self.stop_sequence = self._matcher.matched

    @property
    def holding(self) -> bool:
        """A streamed chunk's worth of ids is ready and not sent: any id before the first chunk,
        so a stream's first token never waits for the next ones (TTFT); later, stream_interval ids
        once the stream's turn has come (`not_before`)."""
        if not self.stream or self.finished or not self._pending:
            return False
        return self._sent == 0 or (len(self._pending) >= self.stream_interval
                                   and time.monotonic() >= self.not_before)

    def release(self) -> Optional[LLMChunk]:
        return self._chunk(final=False) if self.holding else None

    def end_now(self, reason: str) -> LLMChunk:
        """The final chunk of a request the server ends before the engine would have: the ids
        generated so far (held ones included) and `reason`."""
        if not self.finished:
            self._end(reason)
        return self._chunk(final=True)

    def cancel(self) -> LLMChunk:
        self._pending, self._pending_log_probs, self._held_log_probs = [], [], []
        self._matcher.flush()
        self.finish_reason = FINISH_CANCELLED
        return self._chunk(final=True)

    def _end(self, reason: str) -> None:
        # Held tokens whose stop sequence never completed belong to the text.
        self._pending.extend(self._matcher.flush())
        self._pending_log_probs.extend(self._held_log_probs)
        self._held_log_probs = []
        self.finish_reason = reason

    def _chunk(self, final: bool) -> LLMChunk:
        ids, self._pending = self._pending, []
        scores, self._pending_log_probs = self._pending_log_probs, []
        context = self._recent[-self.context_window:] if self.context_window else []
        self._recent = (self._recent + ids)[-self.context_window:] if self.context_window else []
        self._sent += len(ids)
        return LLMChunk(ids, context, final, self.finish_reason if final else "", self.prompt_tokens, self._sent,
                        log_probs=[log_prob for log_prob, _ in scores], top_log_probs=[top for _, top in scores],
                        first_token_ns=self.first_token_ns, last_token_ns=self.last_token_ns,
                        stop_sequence=self.stop_sequence if final else ())


class Responder(Protocol):
    def send(self, handle: Any, chunk: LLMChunk) -> None: ...

    def fail(self, handle: Any, error: Exception) -> None: ...

    def is_cancelled(self, handle: Any, ask_client: bool = True) -> bool:
        """Whether the request was cancelled or can no longer be answered; `ask_client` False: only
        what is known without a round trip to Triton."""


@dataclass
class _Live:
    request_id: str
    handle: Any
    completion: Completion
    cancel_checked: float  # when its client was last asked whether it cancelled
    # Behind an ensemble (the request says a downstream step acknowledges its chunks) Triton is
    # asked once, on the loop's first turn: it cancels an ensemble's llm step only if the client
    # left before the step started, never the running step (server#6739; docs/verification.md).
    # The DeliveryTracker finds abandoned streams instead, and asking every cancel_check_s cost a
    # round trip per request for nothing (more than the llm stub spent sending chunks, py-spy, 64
    # streams). What the Responder knows without asking (a stop request, a failed sibling
    # sequence) is still checked every cancel_check_s, whatever max_cancel_check_rate.
    behind_ensemble: bool = False
    asked_client: bool = False
    delivery_checked: float = -math.inf  # when a chunk of it last asked the detokenizer to check


class TurnHooks:
    """What a variant of the loop adds to each turn; the served llm sets none. Benchmarks attach one
    (`loop.hooks = ...`, before requests arrive) to time turns or to move work into the loop thread
    (perf/baseline_repository/), so the loop itself keeps no benchmark code."""

    # Whether before_turn has work to do on every turn (requests handed to it wait for the next
    # one): the loop then turns every poll_s, as it does while a chunk awaits its acknowledgement.
    works_every_turn = False

    def before_turn(self, loop: "GenerationLoop") -> int:
        """Runs on the loop thread at the start of a turn; returns how many requests it handled
        (a turn that handled any counts as busy)."""
        return 0

    def after_turn(self, seconds: float) -> None:
        """Runs after a busy turn with the seconds of its work once the engine's outputs were in hand."""

    def on_fail_all(self, error: Exception) -> None:
        """Runs when the loop fails every live request (the engine failed, or the model unloads)."""


class GenerationLoop:
    def __init__(self, engine: Engine, responder: Responder, stream_interval: int = 1, context_window: int = 0,
                 on_load: Callable[[Load], None] = lambda load: None, poll_s: float = 0.02,
                 cancel_check_s: float = 0.5, delivery: Optional[DeliveryTracker] = None,
                 clock: Callable[[], float] = time.monotonic, idle_poll_s: float = 0.5,
                 max_chunk_rate: float = 0.0, stopping: Callable[[], bool] = lambda: False,
                 stop_grace_s: float = 20.0, max_cancel_check_rate: float = 0.0):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        if max_chunk_rate < 0:
            raise ValueError(f"max_chunk_rate must be >= 0, got {max_chunk_rate}")
        if max_cancel_check_rate < 0:
            raise ValueError(f"max_cancel_check_rate must be >= 0, got {max_cancel_check_rate}")
        self.engine = engine
        self.responder = responder
        self.stream_interval = stream_interval
        # Streamed chunks this loop sends a second at most (0: no limit): each stream's next chunk
        # waits for its share, live streams / max_chunk_rate seconds after its previous one, and
        # takes every id generated meanwhile. Every chunk costs the front end the same (a response
        # and its hops through Triton and the detokenizer) whatever it carries, so a few streams
        # get every id as it comes and many get fewer, larger chunks at the same CPU.
        self.max_chunk_rate = max_chunk_rate
        self._streams = 0  # live streamed requests
        # Whether the server is stopping (core/server_stop.py: serve.sh got SIGTERM), looked at
        # every STOP_CHECK_S. From then on no request is taken (Unavailable), and stop_grace_s
        # later every request still here ends with what it has: the server's stop must not wait
        # for a generation without max_tokens.
        self.stopping = stopping
        self.stop_grace_s = stop_grace_s
        self._stop_checked = -math.inf
        self._stop_at: Optional[float] = None  # when the requests still here are ended
        self.context_window = context_window
        self.on_load = on_load
        # How long a turn waits for the engine's output before doing the loop's own work anyway.
        # Each timed-out wait costs the stub 40-400 us of CPU, taken from the engine's cores
        # (19 CPU ms per second in an idle llama_cpp stub at 50 wakes a second), so the loop wakes
        # only as often as that work needs (_wait_s): every poll_s while a chunk waits for its
        # acknowledgement or a TurnHooks works every turn; every cancel_check_s / 5 (at least
        # poll_s) while requests are live, for their cancellation checks; every idle_poll_s with
        # none, for the load table's heartbeat (within balancing's stale_s) and to notice stop().
        # Engine output ends any wait.
        self.poll_s = poll_s
        self.idle_poll_s = idle_poll_s
        # Asking Triton whether a client cancelled is a round trip per request (as costly as sending
        # a chunk, by py-spy in the llm stub at 16 streams): each live request is asked at most once
        # per cancel_check_s (one behind an ensemble once: _Live says why), so a cancelled request
        # runs on for at most that long plus a turn.
        self.cancel_check_s = cancel_check_s
        # Asks a second at most (0: no limit): each request is asked every cancel_check_s, or every
        # live requests / max_cancel_check_rate seconds when that is longer. An ask is a round trip
        # through a stub and tritonserver: with the synthetic engine at 256 streams, asking every
        # 0.5 s cost the server 71 microseconds per token against 67 at 50 asks a second (medians
        # of 6 interleaved rounds, 2026-11-28).
        self.max_cancel_check_rate = max_cancel_check_rate
        self.delivery = delivery
        self.clock = clock
        self.hooks: Optional[TurnHooks] = None
        self._live: dict[str, _Live] = {}
        self._held: set[str] = set()  # streams whose ready ids wait for their previous chunk's acknowledgement
        self._finishing: dict[str, list[LLMChunk]] = {}  # ended streams whose final chunk waits the same way
        self._parked_cancels: set[str] = set()  # those of them cancelled (already counted as such)
        self._cancelled = 0
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified whenever a request leaves
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritonfront-generation", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, handle: Any, request: SequenceRequest) -> None:
        if self._stop_at is not None:
            raise Unavailable("the server is stopping: this replica takes no new request (send it to another, or "
                              "again once this one is back)")
        params = request.params
        end_ids = self.engine.eos_token_ids | ({params.end_id} if params.end_id is not None else set())
        completion = Completion(len(request.prompt_ids), request.stop_sequences, frozenset(end_ids), request.stream,
                                self.stream_interval, self.context_window if request.stream else 0,
                                wants_log_probs=params.wants_log_probs or request.options.log_probs
                                or request.options.top_logprobs > 0)
        request_id = f"req-{next(self._ids)}"
        # Registered and added as one step, so a cancellation check cannot fall in between and
        # cancel in the engine a request it does not have yet.
        with self._lock:
            behind_ensemble = request.delivery_acknowledged
            self._live[request_id] = _Live(request_id, handle, completion,
                                           -math.inf if behind_ensemble else self.clock(), behind_ensemble)
            try:
                self.engine.add(request_id, request.prompt_ids, params)
            except Exception:
                del self._live[request_id]
                raise
            self._streams += request.stream
            # Only a stream's chunks come before its end; a whole response has nothing to watch.
            if request.stream and request.delivery_acknowledged and self.delivery is not None:
                self.delivery.track(request_id)
        self.publish_load()

    def load(self) -> Load:
        capacity = self.engine.kv_cache_capacity_blocks()
        queries, hits = self.engine.prefix_cache_tokens()
        with self._lock:
            completions = [live.completion for live in self._live.values()]
            return Load(sum(c.prompt_tokens + c.generated for c in completions),
                        sum(c.generated == 0 for c in completions), len(completions), self._cancelled,
                        self.engine.kv_cache_blocks(), capacity, capacity * self.engine.kv_cache_block_tokens(),
                        queries, hits)

    def publish_load(self) -> None:
        self.on_load(self.load())

    def wait_for_room(self, max_active: int) -> None:
        """Blocks while this instance holds `max_active` unfinished requests (or more), so that
        Triton's queue, with its size limit and timeouts, keeps the rest."""
        with self._room:
            self._room.wait_for(lambda: len(self._live) < max_active or self._stopping.is_set()
                                or self._stop_at is not None)

    def stop(self, timeout: float = 30) -> None:
        self._stopping.set()
        with self._room:
            self._room.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.engine.shutdown()
        self._fail_all(RuntimeError("the model is being unloaded"))

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.step()

    def step(self) -> None:
        """One turn of the loop: waits up to _wait_s() for the engine's new tokens, then processes them."""
        try:
            outputs = self.engine.outputs(self._wait_s())
        except Exception as error:  # the engine cannot generate: no request may wait forever
            logger.exception("engine failed")
            self._fail_all(error)
            self._stopping.wait(self.poll_s)
            return
        hooks = self.hooks
        if hooks is None:
            self.process(outputs)
            return
        started = time.perf_counter()
        handled = hooks.before_turn(self)
        self.process(outputs)
        if outputs or handled:
            hooks.after_turn(time.perf_counter() - started)

    def _wait_s(self) -> float:
        # Read without the lock: a stale answer costs one wait of the wrong length, and a request
        # submitted meanwhile ends the wait with its first output.
        if self._held or self._finishing or self.hooks is not None and self.hooks.works_every_turn:
            return self.poll_s
        if self._stop_at is not None and self._live:
            return max(self.poll_s, min(STOP_CHECK_S, self._stop_at - self.clock()))
        if self._live:
            return max(self.poll_s, self.cancel_check_s / 5)
        return self.idle_poll_s

    def process(self, outputs: Sequence[EngineOutput]) -> None:
        """A turn's work once the engine's outputs are in hand: new tokens out to their clients,
        then cancellations, then the new load."""
        if self.delivery is not None:
            with self._lock:
                self.delivery.refresh()
        for output in outputs:
            self._deliver(output)
        self._release_held()
        self._check_cancellations()
        self._check_stop()
        self.publish_load()

    def _deliver(self, output: EngineOutput) -> None:
        with self._lock:
            live = self._live.get(output.request_id)
        if live is None or output.request_id in self._finishing:
            return
        if output.error:
            self._retire(output.request_id, cancel_engine=False)
            self._fail(live.handle, RuntimeError(output.error))
            return
        awaiting = self._awaiting_acknowledgement(output.request_id)
        chunks = live.completion.on_tokens(output.token_ids, output.finished, output.finish_reason,
                                           hold=awaiting, log_probs=output.log_probs,
                                           top_log_probs=output.top_log_probs)
        if live.completion.finished:
            if not output.finished:  # a stop sequence ends the request before the engine would have
                self.engine.cancel(output.request_id)
            if awaiting:
                self._finishing[output.request_id] = chunks
                return
            self._retire(output.request_id, cancel_engine=False)
        elif live.completion.holding:
            self._held.add(output.request_id)
        for chunk in chunks:
            self._send_or_cancel(live, chunk)

    def _awaiting_acknowledgement(self, request_id: str) -> bool:
        if self.delivery is None:
            return False
        with self._lock:
            return self.delivery.in_flight(request_id)

    def _release_held(self) -> None:
        for request_id in list(self._finishing):
            if not self._awaiting_acknowledgement(request_id):
                with self._lock:
                    live = self._live.get(request_id)
                chunks = self._finishing.pop(request_id)
                self._parked_cancels.discard(request_id)
                self._retire(request_id, cancel_engine=False)
                for chunk in chunks:
                    self._send_or_cancel(live, chunk)
        for request_id in list(self._held):
            with self._lock:
                live = self._live.get(request_id)
            if live is None or not live.completion.holding:
                self._held.discard(request_id)
            elif not self._awaiting_acknowledgement(request_id):
                self._held.discard(request_id)
                self._send_or_cancel(live, live.completion.release())

    def _send_or_cancel(self, live: _Live, chunk: LLMChunk) -> None:
        if not self._send(live, chunk) and not chunk.final:
            self._retire(live.request_id, cancel_engine=True)
            self._send(live, live.completion.cancel())  # Triton holds the request until a final flag

    def _check_cancellations(self) -> None:
        with self._lock:
            live_items = list(self._live.items())
            abandoned = set(self.delivery.abandoned()) if self.delivery is not None else set()
        now = self.clock()
        for request_id, live in live_items:
            if request_id in abandoned:
                # The detokenizer will not acknowledge: the final chunk goes now. An ended stream
                # waiting to send its final chunk has left the engine already.
                self._retire(request_id, cancel_engine=self._finishing.pop(request_id, None) is None)
                if request_id not in self._parked_cancels:  # counted when it was parked
                    with self._lock:
                        self._cancelled += 1
                self._parked_cancels.discard(request_id)
                self._send(live, live.completion.cancel())
            elif request_id not in self._finishing and self._cancel_check_due(live, now) and self._is_cancelled(live):
                with self._lock:
                    self._cancelled += 1
                self.engine.cancel(request_id)  # its KV cache is freed now, whatever the detokenizer holds
                if self._end_in_order(request_id, live, live.completion.cancel()):
                    self._parked_cancels.add(request_id)

    def _check_stop(self) -> None:
        now = self.clock()
        if self._stop_at is None:
            if now - self._stop_checked < STOP_CHECK_S:
                return
            self._stop_checked = now
            if not self.stopping():
                return
            self._stop_at = now + self.stop_grace_s
            with self._room:
                self._room.notify_all()  # execute calls waiting for room answer Unavailable now
            logger.warning("the server is stopping: no new request; the %d running end in %.1f s",
                           len(self._live), self.stop_grace_s)
        if now < self._stop_at:
            return
        with self._lock:
            live_items = [(rid, live) for rid, live in self._live.items() if rid not in self._finishing]
        for request_id, live in live_items:
            chunk = live.completion.end_now(FINISH_CANCELLED)
            self.engine.cancel(request_id)
            self._end_in_order(request_id, live, chunk)

    def _end_in_order(self, request_id: str, live: _Live, final_chunk: LLMChunk) -> bool:
        """Sends the final chunk of a request that has left the engine, or parks it until the chunk
        the detokenizer holds is acknowledged (sent at once, it could be decoded by another
        detokenizer instance and reach the client first); returns whether it was parked."""
        if self._awaiting_acknowledgement(request_id):
            self._finishing[request_id] = [final_chunk]
            return True
        self._retire(request_id, cancel_engine=False)
        self._send(live, final_chunk)
        return False

    def _ask_interval(self) -> float:
        """How often one request's client may be asked whether it cancelled (a round trip to Triton)."""
        if not self.max_cancel_check_rate:
            return self.cancel_check_s
        return max(self.cancel_check_s, len(self._live) / self.max_cancel_check_rate)

    def _cancel_check_due(self, live: _Live, now: float) -> bool:
        # Behind the ensemble only the first check asks Triton; the later ones read what the
        # Responder knows (a stop request, a failed sibling) for free, every cancel_check_s.
        asks = not (live.behind_ensemble and live.asked_client)
        if now - live.cancel_checked < (self._ask_interval() if asks else self.cancel_check_s):
            return False
        live.cancel_checked = now
        return True

    def _retire(self, request_id: str, cancel_engine: bool) -> None:
        with self._lock:
            live = self._live.pop(request_id, None)
            if live is not None:
                self._streams -= live.completion.stream
            if self.delivery is not None:
                self.delivery.release(request_id)
            self._room.notify_all()
        if cancel_engine:
            self.engine.cancel(request_id)

    def _fail_all(self, error: Exception) -> None:
        if self.hooks is not None:
            self.hooks.on_fail_all(error)
        with self._lock:
            if self.delivery is not None:
                for request_id in self._live:
                    self.delivery.release(request_id)
            lost, self._live = [live.handle for live in self._live.values()], {}
            self._streams = 0
            self._finishing.clear()
            self._parked_cancels.clear()
            self._room.notify_all()
        for handle in lost:
            self._fail(handle, error)

    # A client that went away must not stop the loop serving the others: responder errors are
    # logged, and a request whose client cannot be reached is treated as cancelled.
    def _send(self, live: _Live, chunk: LLMChunk) -> bool:
        if self.delivery is not None and not chunk.final:
            with self._lock:
                chunk.delivery = self.delivery.stamp(live.request_id)
            now = self.clock()
            chunk.check_cancelled = now - live.delivery_checked >= self._ask_interval()
            if chunk.check_cancelled:
                live.delivery_checked = now
        if self.max_chunk_rate and not chunk.final:
            live.completion.not_before = time.monotonic() + self._streams / self.max_chunk_rate
        try:
            self.responder.send(live.handle, chunk)
            return True
        except Exception:
            logger.exception("sending a response failed")
            return False

    def _fail(self, handle: Any, error: Exception) -> None:
        try:
            self.responder.fail(handle, error)
        except Exception:
            logger.exception("sending an error response failed")

    def _is_cancelled(self, live: _Live) -> bool:
        try:
            ask_client = not (live.behind_ensemble and live.asked_client)
            live.asked_client = True
            return bool(self.responder.is_cancelled(live.handle, ask_client=ask_client))
        except Exception:
            logger.exception("checking for cancellation failed")
            return True

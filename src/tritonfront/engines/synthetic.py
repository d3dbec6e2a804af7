"""A synthetic engine: real vocabulary ids at a configured step time and batch size, no model
compute (the `llm` model's parameter engine: "synthetic").

It is for capacity planning of a deployment and for measuring the front end (tokenizers,
Triton, detokenizers, the OpenAI front) at GPU-like token rates on any machine, as vLLM's dummy
weights or TensorRT-LLM's benchmarks are for theirs: everything above the engine runs as it does
with a real model, and the engine costs what its configured step costs in time, not in CPU.

What it emits. The llm model folder's tokenizer (the one the llm_tokenizer and the detokenizer
read) gives the vocabulary, the end ids and the context. A draw picks a unit uniformly from the
table SyntheticVocabulary builds: every non-special token that decodes to text on its own
(multi-byte characters that are one token among them), and characters whose UTF-8 bytes the
tokenizer splits over several tokens (CJK, emoji), emitted one token per step, so streams carry
characters cut between chunks as a real model's do, and the text stays valid UTF-8 unless a
request ends inside such a character (as a real one can). The draw for a sequence's n-th
token is a hash of (its key, n): the key is a hash of the prompt ids for greedy requests, and of
the prompt and the seed for sampled ones (a fresh seed when none is given), so a request's ids
do not depend on what shares its batch, how it is streamed, or on which rank it runs.
End tokens: none by default (every request runs to max_tokens, the fixed output length capacity
runs want); with `synthetic_eos_every` N each token drawn at a character boundary is EOS with
chance 1/N (geometric output lengths, mean about N), never before min_tokens. A request's
end_id ends it when drawn (it is an ordinary token of the table unless special).

Steps. Every running sequence gets one token per step; a step lasts `synthetic_step_ms`, plus
`synthetic_step_us_per_seq` per running sequence, plus `synthetic_prefill_us_per_token` per
prompt token of the requests it admits (whole prompts, no chunking: the step that admits a
request prefills it and gives its first token, and every sequence waits for it, as in an engine
without chunked prefill). The engine thread sleeps until each step's deadline on a steady grid
(a late wake-up does not shift later steps; more than a whole step late, the debt is dropped
rather than paid in a burst). At most `max_num_seqs` run; the rest wait, first come first
served, and a request is admitted only while its prompt plus max_tokens fit in the KV cells the
running ones have not reserved (`kv_cache_tokens`; 0: room for max_num_seqs whole contexts, so
only max_num_seqs limits), as TensorRT-LLM's default GUARANTEED_NO_EVICT scheduler reserves.
The KV gauges count prompt + generated tokens of the running sequences against that capacity.

Per step the work is a few numpy operations over the running sequences' arrays and one
EngineOutput per sequence; requests with bad words or an end_id they may not emit yet
(min_tokens) are checked one by one in Python (they are rare).

Honoured: max_tokens, min_tokens, end ids, bad words (a banned token is drawn again), seeds,
return_log_probs (the log probability of the token under the draw: uniform over the units,
EOS with 1/N, a character's continuation tokens 0), cancellation. Refused by name: guided
decoding and top_logprobs (no logits to constrain or rank), repetition, presence and frequency
penalties (no distribution to penalize). Temperature, top_k and top_p only decide whether a
request is greedy or sampled.
"""
import contextlib
import json
import logging
import math
import queue
import secrets
import threading
import time
import unicodedata
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .. import threads
from ..errors import InvalidInput
from .base import ENGINE_THREAD_NAME, Engine, EngineConfig, EngineOutput, SamplingParams

UNIT_IDS = 4  # the most tokens one character's UTF-8 bytes can take (a byte each)
# Characters tried as multi-token units: those the tokenizer splits over several tokens are kept.
# Scripts and symbols a byte-level English vocabulary seldom holds whole (CJK, kana, Hangul, emoji),
# and accented Latin, Greek, Cyrillic and punctuation, which it often does (then they are singles).
SPLIT_CHARACTER_RANGES = ((0x00C0, 0x0100), (0x0391, 0x03CA), (0x0410, 0x0450), (0x2010, 0x2028),
                          (0x3041, 0x3097), (0x4E00, 0x5000), (0xAC00, 0xAD00), (0x1F600, 0x1F650))

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_ATTEMPT = _U64(0xD1B54A32D192ED03)
_EOS_SALT = _U64(0x2545F4914F6CDD1D)
_SEED_SALT = _U64(0x8CB92BA72F3D8DD7)


def mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array (wrapping arithmetic): well-spread bits from
    neighbouring inputs."""
    x = values.astype(_U64, copy=True)
    x ^= x >> _U64(30)
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


def _mix_one(value: int) -> int:
    return int(mix(np.array([value & 0xFFFFFFFFFFFFFFFF], dtype=_U64))[0])


def prompt_key(prompt_ids: Sequence[int]) -> int:
    """A 64-bit hash of the prompt ids, order included."""
    ids = np.asarray(prompt_ids, dtype=np.int64).astype(_U64)
    positions = mix(np.arange(1, len(ids) + 1, dtype=_U64) * _GOLDEN)
    folded = int(np.bitwise_xor.reduce(mix(ids ^ positions))) if len(ids) else 0
    return _mix_one(folded ^ len(ids))


def request_key(prompt_ids: Sequence[int], params: SamplingParams) -> int:
    """What a request's ids are drawn from: its prompt for a greedy request, its prompt and its
    seed (a fresh one when none is given) for a sampled one."""
    key = prompt_key(prompt_ids)
    if params.greedy:
        return key
    seed = params.random_seed if params.random_seed is not None else secrets.randbits(64)
    return _mix_one(key ^ _mix_one(seed ^ int(_SEED_SALT)))


def draw_hashes(keys: np.ndarray, positions: np.ndarray, attempt: int = 0) -> np.ndarray:
    """The hash of each (key, position) draw; attempt > 0: the draw that replaces a banned one."""
    return mix(keys.astype(_U64) + (positions.astype(_U64) + _U64(1)) * _GOLDEN + _U64(attempt) * _ATTEMPT)


def _printable(text: str) -> bool:
    return all(c in "\n\t" or unicodedata.category(c)[0] != "C" for c in text)


@dataclass(frozen=True)
class SyntheticVocabulary:
    """What the synthetic engine emits, from a model folder's tokenizer."""

    vocab_size: int  # the tokenizer's ids, added tokens included (what the detokenizer decodes)
    eos_token_ids: frozenset
    eos_id: int  # the end token emitted with synthetic_eos_every (the tokenizer's EOS where it is one of them)
    positions: Optional[int]  # the model's position limit (config.json), None when it names none
    units: np.ndarray  # [units, UNIT_IDS] int64: a draw's ids, -1 after the unit's length
    lengths: np.ndarray  # [units] int64
    first_id_units: np.ndarray  # [vocab_size] int64: how many units start with each id (for log probs under bans)

    @classmethod
    def from_folder(cls, model_dir: Path) -> "SyntheticVocabulary":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"{model_dir}: a fast tokenizer (tokenizer.json) is required")
        fast = tokenizer.backend_tokenizer
        vocab_size = len(tokenizer)
        special = set(tokenizer.all_special_ids)
        special.update(i for i, token in fast.get_added_tokens_decoder().items() if token.special)
        config = _json(model_dir / "config.json")
        eos = set()
        for source in (_json(model_dir / "generation_config.json"), config.get("text_config", config)):
            value = source.get("eos_token_id")
            eos.update([value] if isinstance(value, int) else (value or []))
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        eos = {int(i) for i in eos if i is not None and 0 <= i < vocab_size}
        if not eos:
            raise ValueError(f"{model_dir}: no end-of-sequence token in config.json, generation_config.json "
                             "or the tokenizer")
        eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id in eos else min(eos)
        positions = config.get("text_config", config).get("max_position_embeddings")

        excluded = special | eos
        texts = fast.decode_batch([[i] for i in range(vocab_size)], skip_special_tokens=True)
        singles = [i for i, text in enumerate(texts)
                   if i not in excluded and text and "\ufffd" not in text and _printable(text)]
        if not singles:
            raise ValueError(f"{model_dir}: no token of the vocabulary decodes to text on its own")
        chars = [chr(c) for start, end in SPLIT_CHARACTER_RANGES for c in range(start, end)]
        encoded = [encoding.ids for encoding in fast.encode_batch(chars, add_special_tokens=False)]
        candidates = [(char, ids) for char, ids in zip(chars, encoded)
                      if 2 <= len(ids) <= UNIT_IDS and not excluded.intersection(ids)
                      and any("\ufffd" in texts[i] for i in ids)]
        decoded = fast.decode_batch([ids for _, ids in candidates], skip_special_tokens=True) if candidates else []
        split = [ids for (char, ids), text in zip(candidates, decoded) if char in text and "\ufffd" not in text]

        units = np.full((len(singles) + len(split), UNIT_IDS), -1, dtype=np.int64)
        units[:len(singles), 0] = singles
        for row, ids in enumerate(split, start=len(singles)):
            units[row, :len(ids)] = ids
        lengths = (units >= 0).sum(axis=1)
        return cls(vocab_size, frozenset(eos), int(eos_id), int(positions) if positions else None, units, lengths,
                   np.bincount(units[:, 0], minlength=vocab_size))


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


class _SyntheticRequest:
    """A request from `add` to its end; its per-step state lives in the engine's slot arrays."""

    __slots__ = ("request_id", "prompt_tokens", "params", "key", "end_id", "reserved", "slot", "checked",
                 "always_banned", "banned_after", "recent")

    def __init__(self, request_id: str, prompt: Sequence[int], params: SamplingParams, key: int):
        self.request_id = request_id
        self.prompt_tokens = len(prompt)
        self.params = params
        self.key = key
        self.end_id = -1 if params.end_id is None else int(params.end_id)
        self.reserved = len(prompt) + params.max_tokens  # KV cells it may come to hold
        self.slot = -1
        self.always_banned = frozenset(word[0] for word in params.bad_words if len(word) == 1)
        self.banned_after = [(list(word[:-1]), word[-1]) for word in params.bad_words if len(word) > 1]
        # The newest tokens of prompt and output, as many as the longest bad word's prefix needs.
        longest = max((len(prefix) for prefix, _ in self.banned_after), default=0)
        self.recent: Optional[deque] = deque(prompt[-longest:], maxlen=longest) if longest else None
        # Checked one by one each step: bans, or an end_id it may not emit yet.
        self.checked = bool(params.bad_words) or (params.min_tokens > 0 and params.end_id is not None)

    def banned(self, generated: int, eos_ids: frozenset) -> set:
        """Tokens this request may not emit as its next (generated-th) token."""
        banned = set(self.always_banned)
        if generated < self.params.min_tokens:
            banned.update(eos_ids)
            if self.end_id >= 0:
                banned.add(self.end_id)
        if self.recent is not None:
            recent = list(self.recent)
            for prefix, token in self.banned_after:
                if len(recent) >= len(prefix) and recent[len(recent) - len(prefix):] == prefix:
                    banned.add(token)
        return banned


class SyntheticEngine(Engine):
    def __init__(self, vocabulary: SyntheticVocabulary, config: EngineConfig):
        if config.synthetic_step_ms < 1:
            raise ValueError(f"synthetic_step_ms: {config.synthetic_step_ms} must be >= 1 (the engine sleeps a "
                             "step, it does not spin)")
        for name in ("synthetic_step_us_per_seq", "synthetic_prefill_us_per_token", "synthetic_eos_every"):
            if getattr(config, name) < 0:
                raise ValueError(f"{name}: {getattr(config, name)} must be >= 0")
        self.vocabulary = vocabulary
        self.vocab_size = vocabulary.vocab_size
        self.eos_token_ids = vocabulary.eos_token_ids
        limits = [n for n in (vocabulary.positions, config.kv_cache_tokens) if n]
        if not limits:
            raise ValueError("the model folder's config.json names no max_position_embeddings: set kv_cache_tokens "
                             "for the synthetic engine's context")
        self.context_length = min(limits)
        self.max_num_seqs = config.max_num_seqs
        self.kv_cells = config.kv_cache_tokens or config.max_num_seqs * self.context_length
        self._step_s = config.synthetic_step_ms / 1e3
        self._per_seq_s = config.synthetic_step_us_per_seq / 1e6
        self._prefill_s = config.synthetic_prefill_us_per_token / 1e6
        self._eos_every = config.synthetic_eos_every
        self._units = vocabulary.units
        self._lengths = vocabulary.lengths
        self._n_units = len(vocabulary.units)

        # Between threads: requests and cancellations in, outputs out.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._incoming: deque = deque()
        self._cancelled: set[str] = set()
        self._adders = 0  # adding_together blocks open
        self._live: set[str] = set()  # added, not finished, not cancelled
        self._results: queue.Queue = queue.Queue()
        self._failure: Optional[BaseException] = None
        self._stopping = False
        self._stopped = threading.Event()  # ends a step's sleep at shutdown
        self.cells_held = 0  # prompt + generated tokens of running sequences (written by the engine thread only)

        # The engine thread's own state: waiting requests, and per slot (one per running sequence).
        self._waiting: deque = deque()
        self._running: dict[str, _SyntheticRequest] = {}
        self._reserved = 0
        slots = config.max_num_seqs
        self._free_slots = list(range(slots - 1, -1, -1))
        self._slot_requests: list[Optional[_SyntheticRequest]] = [None] * slots
        self._active = np.zeros(slots, dtype=bool)
        self._keys = np.zeros(slots, dtype=_U64)
        self._generated = np.zeros(slots, dtype=np.int64)
        self._max_tokens = np.zeros(slots, dtype=np.int64)
        self._min_tokens = np.zeros(slots, dtype=np.int64)
        self._end_id = np.full(slots, -1, dtype=np.int64)
        self._unit = np.zeros(slots, dtype=np.int64)  # the unit being emitted
        self._offset = np.zeros(slots, dtype=np.int64)  # its next id; >= its length: draw a new unit
        self._checked = np.zeros(slots, dtype=bool)
        self._extra = np.zeros(slots, dtype=bool)  # wants log probs or keeps its recent tokens for bad words
        self._named = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritonfront-synthetic", daemon=True)
        self._thread.start()
        # CPU accounting reads the OS name from the first step on: the engine is not handed out before.
        self._named.wait(5)

    @classmethod
    def from_folder(cls, model_dir: Path, config: EngineConfig) -> "SyntheticEngine":
        return cls(SyntheticVocabulary.from_folder(model_dir), config)

    # --- the Engine interface (any thread) ---

    def check_params(self, params: SamplingParams) -> None:
        if params.guided_decoding is not None:
            raise InvalidInput("guided_decoding_guide_type", "the synthetic engine has no guided decoding: it computes "
                                                             "no logits to constrain")
        for name, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
            if getattr(params, name) != off:
                raise InvalidInput(name, f"{getattr(params, name)}: the synthetic engine draws uniformly, with no "
                                         f"distribution to penalize; use {off:g}")

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise InvalidInput("input_ids", "is empty")
        # The engine's own limits, whatever the caller validated against.
        params.validate(len(prompt), self.context_length, self.vocab_size)
        self.check_request(params)
        request = _SyntheticRequest(request_id, prompt, params, request_key(prompt, params))
        with self._work:
            if self._failure is not None or self._stopping:
                raise RuntimeError("the synthetic engine is not accepting requests (stopped or failed)")
            self._live.add(request_id)
            self._incoming.append(request)
            if not self._adders:  # otherwise the block's end wakes the engine thread
                self._work.notify()

    @contextlib.contextmanager
    def adding_together(self):
        # The engine thread takes no incoming request while a block is open, so a burst starts in one step.
        with self._work:
            self._adders += 1
        try:
            yield
        finally:
            with self._work:
                self._adders -= 1
                self._work.notify()

    def cancel(self, request_id: str) -> None:
        with self._work:
            if request_id not in self._live:
                return
            self._live.discard(request_id)
            self._cancelled.add(request_id)
            self._work.notify()

    def outputs(self, timeout: float) -> list[EngineOutput]:
        if self._failure is not None:
            raise RuntimeError(f"the synthetic engine failed: {self._failure}")
        steps = []
        try:
            steps.append(self._results.get(timeout=timeout))
            while True:
                steps.append(self._results.get_nowait())
        except queue.Empty:
            pass
        outputs = []
        with self._lock:
            for step in steps:
                for output in step:
                    if output.request_id not in self._live:  # cancelled meanwhile: nothing follows
                        continue
                    if output.finished:
                        self._live.discard(output.request_id)
                    outputs.append(output)
        return outputs

    def kv_cache_blocks(self) -> int:
        return self.cells_held

    def kv_cache_capacity_blocks(self) -> int:
        return self.kv_cells

    def running(self) -> int:
        """Sequences in the running batch (the engine thread's count; for tests and metrics)."""
        return len(self._running)

    def shutdown(self) -> None:
        with self._work:
            self._stopping = True
            self._work.notify()
        self._stopped.set()
        self._thread.join(30)

    # --- the engine thread ---

    def _run(self) -> None:
        threads.name_native({threading.get_native_id()}, ENGINE_THREAD_NAME)
        self._named.set()
        try:
            last_end: Optional[float] = None  # the previous step's deadline while sequences run
            while True:
                with self._work:
                    # Waiting requests alone never wait here: with nothing running, the first of
                    # them fits (its reservation is within the context, which is within the cache).
                    self._work.wait_for(lambda: self._stopping or self._incoming and not self._adders
                                        or self._cancelled or self._running or self._waiting)
                    if self._stopping:
                        return
                    cancelled, self._cancelled = self._cancelled, set()
                    incoming = []
                    if not self._adders:
                        incoming, self._incoming = list(self._incoming), deque()
                    elif cancelled:  # left in _incoming, out of _drop's reach
                        self._incoming = deque(r for r in self._incoming if r.request_id not in cancelled)
                self._waiting.extend(incoming)
                if cancelled:
                    self._drop(cancelled)
                prompt_tokens = self._admit()
                if not self._running:
                    last_end = None
                    continue
                duration = self._step_s + len(self._running) * self._per_seq_s + prompt_tokens * self._prefill_s
                now = time.monotonic()
                # On the grid of the previous steps unless more than a whole step behind it.
                start = last_end if last_end is not None and now - last_end < duration else now
                end = start + duration
                outputs, finished = self._step()
                if self._stopped.wait(max(0.0, end - time.monotonic())):
                    return
                self._results.put(outputs)
                for request in finished:
                    self._release(request)
                last_end = end if self._running else None
        except BaseException as error:  # no request may wait forever on a dead engine
            logging.getLogger(__name__).exception("synthetic engine failed")
            self._failure = error

    def _drop(self, request_ids: set[str]) -> None:
        self._waiting = deque(r for r in self._waiting if r.request_id not in request_ids)
        for request_id in request_ids:
            request = self._running.get(request_id)
            if request is not None:
                self._release(request)

    def _admit(self) -> int:
        """Waiting requests start, first come first, while a slot is free and their prompt plus
        max_tokens fit in the cells not reserved; returns the prompt tokens admitted."""
        prompt_tokens = 0
        while self._waiting and self._free_slots and self._reserved + self._waiting[0].reserved <= self.kv_cells:
            request = self._waiting.popleft()
            slot = request.slot = self._free_slots.pop()
            self._slot_requests[slot] = request
            self._active[slot] = True
            self._keys[slot] = request.key
            self._generated[slot] = 0
            self._max_tokens[slot] = request.params.max_tokens
            self._min_tokens[slot] = request.params.min_tokens
            self._end_id[slot] = request.end_id
            self._offset[slot] = UNIT_IDS  # past any unit: the first token draws one
            self._checked[slot] = request.checked
            self._extra[slot] = request.params.return_log_probs or request.recent is not None
            self._running[request.request_id] = request
            self._reserved += request.reserved
            self.cells_held += request.prompt_tokens
            prompt_tokens += request.prompt_tokens
        return prompt_tokens

    def _release(self, request: _SyntheticRequest) -> None:
        slot = request.slot
        del self._running[request.request_id]
        self._active[slot] = False
        self._checked[slot] = self._extra[slot] = False
        self._slot_requests[slot] = None
        self._free_slots.append(slot)
        self._reserved -= request.reserved
        self.cells_held -= request.prompt_tokens + int(self._generated[slot])

    def _step(self) -> tuple[list[EngineOutput], list[_SyntheticRequest]]:
        """One token for every running sequence, vectorized over their slots; returns the step's
        outputs and the requests it finishes."""
        rows = np.flatnonzero(self._active)
        keys, generated = self._keys[rows], self._generated[rows]
        unit, offset = self._unit[rows], self._offset[rows]
        boundary = offset >= self._lengths[unit]
        hashes = draw_hashes(keys[boundary], generated[boundary])
        unit[boundary] = (hashes % _U64(self._n_units)).astype(np.int64)
        offset[boundary] = 0
        ids = self._units[unit, offset]
        offset += 1
        ended = ids == self._end_id[rows]
        eos = np.zeros(len(rows), dtype=bool)
        # Each token's draw, for log probs: EOS's chance and the units chosen among otherwise.
        eos_share = np.zeros(len(rows))
        choices = np.full(len(rows), float(self._n_units))
        if self._eos_every:
            eligible = boundary & (generated >= self._min_tokens[rows])
            eos[boundary] = mix(hashes ^ _EOS_SALT) % _U64(self._eos_every) == 0
            eos &= eligible
            eos_share[eligible] = 1.0 / self._eos_every
            ids[eos] = self.vocabulary.eos_id
            ended |= eos
        for i in np.flatnonzero(self._checked[rows]).tolist():
            self._check(i, self._slot_requests[rows[i]], ids, unit, offset, generated, ended, eos, boundary,
                        eos_share, choices)
        generated += 1
        self._unit[rows], self._offset[rows], self._generated[rows] = unit, offset, generated
        self.cells_held += len(rows)
        finished = ended | (generated >= self._max_tokens[rows])

        requests = [self._slot_requests[slot] for slot in rows.tolist()]
        outputs = [EngineOutput(request.request_id, [token], done)
                   for request, token, done in zip(requests, ids.tolist(), finished.tolist())]
        for i in np.flatnonzero(self._extra[rows]).tolist():
            request = requests[i]
            if request.params.return_log_probs:
                outputs[i].log_probs = [self._log_prob(bool(boundary[i]), bool(eos[i]), eos_share[i], choices[i])]
            if request.recent is not None:
                request.recent.append(outputs[i].token_ids[0])
        return outputs, [request for request, done in zip(requests, finished.tolist()) if done]

    def _check(self, i: int, request: _SyntheticRequest, ids: np.ndarray, unit: np.ndarray, offset: np.ndarray,
               generated: np.ndarray, ended: np.ndarray, eos: np.ndarray, boundary: np.ndarray,
               eos_share: np.ndarray, choices: np.ndarray) -> None:
        """Row i's token against its request's bans: a banned one is replaced by a fresh draw of a
        unit (a banned continuation of a character abandons the character)."""
        banned = request.banned(int(generated[i]), self.eos_token_ids)
        if not banned or int(ids[i]) not in banned:
            return
        first_ids = self._units[:, 0]
        key, position = np.array([request.key], dtype=_U64), generated[i:i + 1]
        for attempt in range(1, 257):
            choice = int(draw_hashes(key, position, attempt)[0] % _U64(self._n_units))
            if int(first_ids[choice]) not in banned:
                break
        else:  # bans this dense are beyond reason, but the draw must still end
            allowed = np.flatnonzero(~np.isin(first_ids, list(banned)))
            if not len(allowed):
                raise RuntimeError(f"request {request.request_id}: its bans leave no token to emit")
            choice = int(allowed[0])
        unit[i], offset[i] = choice, 1
        ids[i] = first_ids[choice]
        boundary[i], eos[i] = True, False
        ended[i] = ids[i] == request.end_id
        if self.eos_token_ids & banned:
            eos_share[i] = 0.0
        choices[i] = self._n_units - int(self.vocabulary.first_id_units[list(banned)].sum())

    @staticmethod
    def _log_prob(drawn: bool, emitted_eos: bool, eos_share: float, choices: float) -> float:
        """The token's log probability under the synthetic draw: EOS with its share, else a unit
        uniformly among `choices`; a character's continuation token for certain."""
        if emitted_eos:
            return math.log(eos_share)
        if not drawn:
            return 0.0
        return math.log((1.0 - eos_share) / choices)

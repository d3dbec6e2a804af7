"""llama.cpp through llama-cpp-python's low-level bindings, on a GGUF file as it ships (no
conversion, the quantized weights run as they are): the `llm` model's parameter engine: "llama_cpp".

Continuous batching is done here, as llama.cpp's own server does it: one llama_decode per step
over a llama_batch holding every running sequence (each its own seq_id, in one KV cache unified or split per sequence: kv_unified),
its next token for a sequence that is generating and a chunk of its prompt for one that is not
yet, decode tokens first and prompt chunks in the budget left (max_batch_tokens). A request is
admitted between steps when a seq_id is free and its prompt plus max_tokens fit in the cells not
reserved by the running ones, so a running sequence never runs out of cache; a finished or
cancelled one gives its cells back with llama_memory_seq_rm (but those of the prompt it keeps for
reuse, below).

With a cache per sequence (kv_unified false) and prompt_cache, an ended sequence's prompt stays
in its seq_id's cells, as llama-server keeps each slot's prompt (cache_prompt), whether it
finished or was cancelled (then what of the prompt it was fed): a later request given that seq_id
keeps the prefix the two prompts share and is fed only the rest. Requests admitted together take
the lowest free seq_ids, as without reuse (the running ids must stay compact: _step says why; a
gap would cost a forward pass every step of the request's life, a shared prefix saves its prefill
once), each the one among them that keeps the longest prefix of its prompt. Those cells are the
seq_id's own, so keeping them takes none from other sequences; in one unified cache they would,
so there every end frees its cells.

Sampling uses llama.cpp's samplers, one chain per request that needs one: temperature, then the
penalties (over prompt and generated tokens, TensorRT-LLM's order and counting), top-k, top-p,
and the seeded `dist` sampler, whose own RNG makes a seeded request's tokens independent of what
shares its batch. Bans (bad words, end tokens before min_tokens) and guides (xgrammar, as the
other engines) set logits to -inf before the chain, which commutes with everything in it. Greedy
requests without features take the argmax of their logits rows together. Log probs come from the
candidates the chain leaves, just before the final pick: the processed distribution the contract
promises.

The engine thread is the only one that touches the llama.cpp context; `add` and `cancel` queue
work for it and `outputs` reads what it produced. ctypes releases the GIL during llama_decode, so
Triton's threads and the serving loop run meanwhile.
"""
import contextlib
import ctypes
import heapq
import logging
import math
import os
import queue
import secrets
import threading
from collections import deque
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .. import threads
from ..errors import InvalidInput
from .base import ENGINE_THREAD_NAME, Engine, EngineConfig, EngineOutput, SamplingParams
from .guided import GuideCompiler, allocate_bitmask, apply_bitmask, check_guide

# The bindings print llama.cpp's log (its model dump at WARN level) unless this logger says otherwise.
logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_BACKEND = threading.Lock()
# The bindings, imported when the first engine starts (_init_backend): this module imports where
# llama-cpp-python is not installed (it is built from source; the other engines do not need it).
llama = None


def _init_backend() -> None:
    global llama
    with _BACKEND:
        if llama is None:
            try:
                import llama_cpp
            except ImportError as error:
                raise RuntimeError("the llama_cpp engine needs llama-cpp-python, which is not installed: "
                                   "scripts/setup.sh builds it (a C++ compiler is needed)") from error
            llama_cpp.llama_backend_init()
            llama = llama_cpp


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def assign_seq_ids(prompts: list[list[int]], seq_ids: list[int], kept: dict[int, list[int]]) -> list[int]:
    """Gives each prompt, in order, one of `seq_ids` (ascending): the one whose kept prompt shares
    the longest prefix with it, the lowest on a tie. Requests admitted together take the lowest
    free ids whatever this order, so the running ids stay as compact as before."""
    free = list(seq_ids)
    assigned = []
    for prompt in prompts:
        best, shared = free[0], -1
        for seq_id in free:
            common = _common_prefix(kept[seq_id], prompt) if seq_id in kept else 0
            if common > shared:
                best, shared = seq_id, common
        free.remove(best)
        assigned.append(best)
    return assigned


def seed32(seed: int) -> int:
    """The 32-bit seed llama.cpp's `dist` sampler takes, from a 64-bit request seed (both halves
    count). 0xFFFFFFFF would mean "random" to llama.cpp, so it maps elsewhere."""
    folded = (seed ^ (seed >> 32)) & 0xFFFFFFFF
    return folded if folded != llama.LLAMA_DEFAULT_SEED else 0


class _Sampler:
    """One request's llama.cpp sampler chain: `chain` transforms the candidates (temperature,
    penalties, top-k, top-p; None when nothing does), `pick` draws from them (None: argmax)."""

    def __init__(self, params: SamplingParams, vocab_size: int, history: int):
        self.chain = None
        self.pick = None
        samplers = []
        if not params.greedy and params.effective_temperature != 1.0:
            samplers.append(llama.llama_sampler_init_temp(params.effective_temperature))
        if params.penalized:
            samplers.append(llama.llama_sampler_init_penalties(
                vocab_size, history, params.repetition_penalty, params.frequency_penalty, params.presence_penalty))
        if not params.greedy:
            if params.top_k > 0:
                samplers.append(llama.llama_sampler_init_top_k(int(params.top_k)))
            if params.top_p < 1.0:
                samplers.append(llama.llama_sampler_init_top_p(float(params.top_p), 1))
            seed = params.random_seed if params.random_seed is not None else secrets.randbits(64)
            self.pick = llama.llama_sampler_init_dist(seed32(seed))
        if samplers:
            chain_params = llama.llama_sampler_chain_default_params()
            chain_params.no_perf = True
            self.chain = llama.llama_sampler_chain_init(chain_params)
            for sampler in samplers:  # the chain owns them from here on
                llama.llama_sampler_chain_add(self.chain, sampler)

    def accept(self, tokens: Sequence[int]) -> None:
        """Tokens of the sequence, for the penalties' counts."""
        if self.chain is not None:
            for token in tokens:
                llama.llama_sampler_accept(self.chain, int(token))

    def free(self) -> None:
        for sampler in (self.chain, self.pick):
            if sampler is not None:
                llama.llama_sampler_free(sampler)
        self.chain = self.pick = None


class _Sequence:
    """A request from admission to its end, on the engine thread."""

    def __init__(self, request_id: str, prompt: list[int], params: SamplingParams, end_ids: frozenset,
                 matcher=None):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.end_ids = end_ids
        self.reserved = len(prompt) + params.max_tokens  # cells it may come to hold
        self.seq_id = -1
        self.fed = 0  # tokens in the KV cache (prompt, then generated)
        self.generated = 0
        self.last_token = -1  # the newest generated token, fed next step
        self.sampler: Optional[_Sampler] = None
        self.always_banned = sorted({word[0] for word in params.bad_words if len(word) == 1})
        self.banned_after = [(list(word[:-1]), word[-1]) for word in params.bad_words if len(word) > 1]
        # The whole sequence, only where a bad word's prefix must be matched against it.
        self.tokens: Optional[list[int]] = list(prompt) if self.banned_after else None
        self.matcher = matcher
        self.plain = (params.greedy and not params.penalized and not params.bad_words and not params.min_tokens
                      and matcher is None and not params.wants_log_probs)

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt)

    def bans(self) -> list[int]:
        """Tokens this sequence may not generate next."""
        banned = list(self.always_banned)
        if self.generated < self.params.min_tokens:
            banned += self.end_ids
        for prefix, token in self.banned_after:
            if len(self.tokens) >= len(prefix) and self.tokens[len(self.tokens) - len(prefix):] == prefix:
                banned.append(token)
        return banned


class LlamaCppEngine(Engine):
    gives_top_log_probs = True  # _pick takes them from the candidates the chain leaves, as log_probs
    def __init__(self, gguf_file: Path, config: EngineConfig, tokenizer_dir: Optional[Path] = None):
        _init_backend()
        if config.max_num_seqs > llama.llama_max_parallel_sequences():
            raise ValueError(f"max_num_seqs: {config.max_num_seqs} is more than llama.cpp's limit of "
                             f"{llama.llama_max_parallel_sequences()} sequences")
        model_params = llama.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = llama.llama_model_load_from_file(str(gguf_file).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf_file}")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.vocab_size = int(llama.llama_vocab_n_tokens(self._vocab))
        self.eos_token_ids = frozenset(t for t in range(self.vocab_size) if llama.llama_vocab_is_eog(self._vocab, t))
        n_threads = config.num_threads or os.cpu_count() or 1
        # Every step's tokens go in one llama_decode: the decode tokens of all sequences at least.
        self._n_batch = max(config.max_batch_tokens, config.max_num_seqs)
        context_params = llama.llama_context_default_params()
        context_params.n_ctx = config.kv_cache_tokens  # 0: the model's training context
        context_params.n_batch = self._n_batch
        context_params.n_ubatch = self._n_batch
        context_params.n_seq_max = config.max_num_seqs
        # One cache shared by all sequences, or each its own n_ctx / n_seq_max cells (EngineConfig says why).
        context_params.kv_unified = config.kv_unified
        context_params.n_threads = n_threads
        context_params.n_threads_batch = n_threads
        context_params.no_perf = True
        self._ctx = llama.llama_init_from_model(self._model, context_params)
        if not self._ctx:
            llama.llama_model_free(self._model)
            raise RuntimeError(f"llama.cpp could not create a context of {config.kv_cache_tokens} tokens")
        self._memory = llama.llama_get_memory(self._ctx)
        self.kv_cells = int(llama.llama_n_ctx(self._ctx))
        self.context_length = min(int(llama.llama_n_ctx_seq(self._ctx)), int(llama.llama_model_n_ctx_train(self._model)))
        self.max_num_seqs = config.max_num_seqs
        self._guides = (GuideCompiler(tokenizer_dir, self.vocab_size, self.eos_token_ids)
                        if tokenizer_dir is not None else None)

        self._batch = llama.llama_batch_init(self._n_batch, 0, 1)
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(self._n_batch,))
        self._positions = np.ctypeslib.as_array(self._batch.pos, shape=(self._n_batch,))
        self._wants_logits = np.ctypeslib.as_array(self._batch.logits, shape=(self._n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self._n_batch,))[:] = 1
        self._seq_slots = [self._batch.seq_id[i] for i in range(self._n_batch)]
        self._candidates = np.zeros(self.vocab_size, dtype=_TOKEN_DATA)
        self._token_ids = np.arange(self.vocab_size, dtype=np.int32)
        self._candidates_pointer = self._candidates.ctypes.data_as(llama.llama_token_data_p)
        self._bitmask = None

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
        self.cells_held = 0  # KV cells of running sequences, for metrics (written by the engine thread only)
        # The engine thread's own state.
        self._waiting: deque = deque()
        self._running: dict[str, _Sequence] = {}
        # A heap: the lowest free seq_id goes first, so running sequences keep to a compact range (_step says why).
        self._free_seq_ids = list(range(config.max_num_seqs))
        # Free seq_id -> the prompt its cells still hold (a cache per sequence only: module docstring).
        self._kept_prompts: dict[int, list[int]] = {}
        self._reuse_prompts = config.prompt_cache and not config.kv_unified
        self._kept_cells = 0
        self._reserved = 0
        # The context is used by the engine thread, and by memory_cells() from others, under this lock.
        self._context_lock = threading.RLock()
        self._warm_up()
        self._thread = threading.Thread(target=self._run, name="tritonfront-llama-cpp", daemon=True)
        self._thread.start()

    @classmethod
    def from_gguf(cls, gguf_file: Path, device: str, config: EngineConfig,
                  tokenizer_dir: Optional[Path] = None) -> "LlamaCppEngine":
        """Loads the model and starts the engine. The threads that appear meanwhile (llama.cpp's
        OpenMP workers, the engine thread) get the engine's OS thread name, for CPU accounting."""
        if config.dtype != "auto":
            raise ValueError(f"dtype: the llama_cpp engine computes in the GGUF's own types; {config.dtype!r} "
                             f"needs dtype auto or another engine")
        if device != "cpu":
            raise ValueError(f"the llama_cpp engine runs on CPU instances (setup.sh builds llama-cpp-python "
                             f"for the CPU); this instance is on {device}")
        threads_before = threads.native_ids()
        engine = cls(gguf_file, config, tokenizer_dir)
        threads.name_native(threads.native_ids() - threads_before, ENGINE_THREAD_NAME)
        return engine

    def _warm_up(self) -> None:
        """One decode before serving: llama.cpp sizes its compute buffers and starts its threads."""
        bos = llama.llama_vocab_bos(self._vocab)
        self._fill(0, bos if bos >= 0 else 0, 0, 0, True)
        self._batch.n_tokens = 1
        if llama.llama_decode(self._ctx, self._batch) != 0:
            raise RuntimeError("llama.cpp failed to decode one token")
        llama.llama_memory_seq_rm(self._memory, 0, -1, -1)

    def _fill(self, index: int, token: int, position: int, seq_id: int, logits: bool) -> None:
        self._tokens[index] = token
        self._positions[index] = position
        self._seq_slots[index][0] = seq_id
        self._wants_logits[index] = logits

    # --- the Engine interface (any thread) ---

    def check_params(self, params: SamplingParams) -> None:
        check_guide(self._guides, params.guided_decoding)

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise InvalidInput("input_ids", "is empty")
        # The engine's own limit, whatever the caller validated against.
        params.validate(len(prompt), self.context_length, self.vocab_size)
        matcher = None
        if params.guided_decoding is not None:
            self.check_params(params)
            matcher = self._guides.matcher(params.guided_decoding)
        end_ids = self.eos_token_ids | ({params.end_id} if params.end_id is not None else frozenset())
        sequence = _Sequence(request_id, prompt, params, frozenset(end_ids), matcher)
        with self._work:
            if self._failure is not None or self._stopping:
                raise RuntimeError("the llama.cpp engine is not accepting requests (stopped or failed)")
            self._live.add(request_id)
            self._incoming.append(sequence)
            if not self._adders:  # otherwise the block's end wakes the engine thread
                self._work.notify()

    @contextlib.contextmanager
    def adding_together(self):
        # The engine thread takes no incoming request while a block is open: it would wake at the
        # first add and start a step with the requests added so far, and the rest of a burst
        # would wait out that step (a prefill of a few prompts, ~100 ms) before their own.
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
            raise RuntimeError(f"the llama.cpp engine failed: {self._failure}")
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

    def kept_prompt_cells(self) -> int:
        """Cells that free seq_ids keep for a later prompt with the same prefix (the engine's count)."""
        return self._kept_cells

    def memory_cells(self) -> int:
        """KV cells that llama.cpp's memory holds for any sequence, asked of llama.cpp itself (for
        leak checks: the engine's own count is kv_cache_blocks plus kept_prompt_cells)."""
        with self._context_lock:
            cells = 0
            for seq_id in range(self.max_num_seqs):
                last = llama.llama_memory_seq_pos_max(self._memory, seq_id)
                if last >= 0:
                    cells += last - llama.llama_memory_seq_pos_min(self._memory, seq_id) + 1
            return cells

    def shutdown(self) -> None:
        with self._work:
            self._stopping = True
            self._work.notify()
        self._thread.join(30)
        if self._thread.is_alive():  # a decode still runs: freeing the context under it would crash
            return
        for sequence in list(self._running.values()) + list(self._waiting):
            if sequence.sampler is not None:
                sequence.sampler.free()
        self._running.clear()
        self._waiting.clear()
        llama.llama_batch_free(self._batch)
        llama.llama_free(self._ctx)
        llama.llama_model_free(self._model)

    # --- the engine thread ---

    def _run(self) -> None:
        try:
            while True:
                with self._work:
                    self._work.wait_for(lambda: self._stopping or self._incoming and not self._adders
                                        or self._cancelled or self._running or self._waiting)
                    if self._stopping:
                        return
                    cancelled, self._cancelled = self._cancelled, set()
                    incoming = []
                    if not self._adders:
                        incoming, self._incoming = list(self._incoming), deque()
                    elif cancelled:  # left in _incoming, out of _drop's reach
                        self._incoming = deque(s for s in self._incoming if s.request_id not in cancelled)
                self._waiting.extend(incoming)
                if cancelled:
                    self._drop(cancelled)
                self._admit()
                if self._running:
                    self._step()
        except BaseException as error:  # no request may wait forever on a dead engine
            logging.getLogger(__name__).exception("llama.cpp engine failed")
            self._failure = error

    def _drop(self, request_ids: set[str]) -> None:
        self._waiting = deque(s for s in self._waiting if s.request_id not in request_ids)
        for request_id in request_ids:
            sequence = self._running.get(request_id)
            if sequence is not None:
                self._release(sequence, keep_prompt=True)

    def _admit(self) -> None:
        """Waiting requests become running, first come first, while a seq_id is free and the cells
        they may need are not reserved. Those admitted together take the lowest free seq_ids, each
        the one among them that keeps the longest prefix of its prompt (assign_seq_ids)."""
        admitted, reserved = [], self._reserved
        for sequence in self._waiting:
            if len(admitted) == len(self._free_seq_ids) or reserved + sequence.reserved > self.kv_cells:
                break
            admitted.append(sequence)
            reserved += sequence.reserved
        if not admitted:
            return
        lowest = [heapq.heappop(self._free_seq_ids) for _ in admitted]
        seq_ids = assign_seq_ids([s.prompt for s in admitted], lowest, self._kept_prompts)
        for sequence, seq_id in zip(admitted, seq_ids):
            self._waiting.popleft()
            self._start(sequence, seq_id)

    def _start(self, sequence: _Sequence, seq_id: int) -> None:
        """The prefix that seq_id's kept prompt shares with this one stays in its cells (at least
        the last prompt token is fed, for its logits); the rest of them are removed."""
        kept = self._kept_prompts.pop(seq_id, None)
        shared = 0
        if kept is not None:
            self._kept_cells -= len(kept)
            shared = min(_common_prefix(kept, sequence.prompt), len(sequence.prompt) - 1)
            if shared < len(kept):
                with self._context_lock:
                    llama.llama_memory_seq_rm(self._memory, seq_id, shared, -1)
        sequence.seq_id, sequence.fed = seq_id, shared
        self.cells_held += shared
        self._reserved += sequence.reserved
        if not sequence.plain:
            sequence.sampler = _Sampler(sequence.params, self.vocab_size, sequence.reserved)
            if sequence.params.penalized:
                sequence.sampler.accept(sequence.prompt)
        self._running[sequence.request_id] = sequence

    def _release(self, sequence: _Sequence, keep_prompt: bool = False) -> None:
        """Ends a running sequence: its cells, seq_id, reservation and sampler go back; with
        `keep_prompt` (and prompt reuse on) the cells of the prompt tokens it was fed stay."""
        del self._running[sequence.request_id]
        kept = sequence.prompt[:min(sequence.fed, len(sequence.prompt))] if keep_prompt and self._reuse_prompts else []
        with self._context_lock:
            llama.llama_memory_seq_rm(self._memory, sequence.seq_id, len(kept), -1)
        if kept:
            self._kept_prompts[sequence.seq_id] = kept
            self._kept_cells += len(kept)
        self.cells_held -= sequence.fed
        heapq.heappush(self._free_seq_ids, sequence.seq_id)
        self._reserved -= sequence.reserved
        if sequence.sampler is not None:
            sequence.sampler.free()
            sequence.sampler = None

    def _step(self) -> None:
        """One llama_decode over every running sequence, then one token for each that has its
        prompt in the cache.

        The batch holds the sequences in seq_id order, each one's tokens together. With a cache
        per sequence (kv_unified false), llama.cpp splits a batch into micro-batches of sequences
        whose seq_ids run consecutively in batch order, one forward pass (all weights read) each:
        in admission order, with ids reused as they free up, a step of 16 decode tokens could be
        16 passes. Sorted, and with the lowest free id taken first, it is one pass, plus one per
        gap in the ids and per prompt's remaining chunk."""
        n = 0
        sampled: list[_Sequence] = []  # in the order of their logits rows
        chunks: list[tuple[_Sequence, int]] = []
        ordered = sorted(self._running.values(), key=lambda s: s.seq_id)
        # Every decode token goes in (n_batch >= max_num_seqs); prompt chunks share what is left.
        prompt_budget = self._n_batch - sum(1 for s in ordered if not s.prefilling)
        for sequence in ordered:
            if not sequence.prefilling:
                self._fill(n, sequence.last_token, sequence.fed, sequence.seq_id, True)
                n += 1
                sampled.append(sequence)
            elif prompt_budget:
                take = min(len(sequence.prompt) - sequence.fed, prompt_budget)
                prompt_budget -= take
                completes = sequence.fed + take == len(sequence.prompt)
                for i in range(take):
                    position = sequence.fed + i
                    self._fill(n, sequence.prompt[position], position, sequence.seq_id,
                               completes and i == take - 1)
                    n += 1
                chunks.append((sequence, take))
                if completes:
                    sampled.append(sequence)
        self._batch.n_tokens = n
        with self._context_lock:
            status = llama.llama_decode(self._ctx, self._batch)
            if status != 0:
                self._fail_step(sampled + [s for s, _ in chunks], status)
                return
            for sequence in sampled:
                if not sequence.prefilling:
                    sequence.fed += 1
                    self.cells_held += 1
            for sequence, take in chunks:
                sequence.fed += take
                self.cells_held += take
            outputs = []
            if sampled:  # a step of prompt chunks alone has no logits
                logits = np.ctypeslib.as_array(llama.llama_get_logits(self._ctx),
                                               shape=(len(sampled), self.vocab_size))
                outputs = self._sample(sampled, logits)
        for output in outputs:
            if output.finished:
                sequence = self._running.get(output.request_id)
                if sequence is not None:
                    self._release(sequence, keep_prompt=True)
        self._results.put(outputs)

    def _fail_step(self, sequences: list[_Sequence], status: int) -> None:
        error = f"llama.cpp failed to decode (llama_decode returned {status})"
        outputs = []
        for sequence in dict.fromkeys(sequences):
            if sequence.request_id in self._running:
                outputs.append(EngineOutput(sequence.request_id, [], True, error))
        self._results.put(outputs)
        for output in outputs:
            self._release(self._running[output.request_id])

    def _sample(self, sequences: list[_Sequence], logits: np.ndarray) -> list[EngineOutput]:
        tokens = [0] * len(sequences)
        outputs: list[Optional[EngineOutput]] = [None] * len(sequences)
        plain = [row for row, sequence in enumerate(sequences) if sequence.plain]
        if plain:
            chosen = logits[plain].argmax(axis=-1) if len(plain) < len(sequences) else logits.argmax(axis=-1)
            for row, token in zip(plain, chosen.tolist()):
                tokens[row] = token
        featured = [row for row, sequence in enumerate(sequences) if not sequence.plain]
        if featured:
            self._constrain(sequences, logits, featured)
            for row in featured:
                sequence = sequences[row]
                token, log_probs, top = self._pick(sequence, logits[row])
                tokens[row] = token
                if sequence.matcher is not None and not sequence.matcher.is_terminated():
                    if not sequence.matcher.accept_token(token):
                        outputs[row] = EngineOutput(sequence.request_id, [], True,
                                                    f"guided decoding: token {token} is outside the guide")
                        continue
                if sequence.params.wants_log_probs:
                    outputs[row] = EngineOutput(sequence.request_id, [token], log_probs=[log_probs],
                                                top_log_probs=[top] if top is not None else [])
        for row, sequence in enumerate(sequences):
            token = tokens[row]
            output = outputs[row]
            if output is None:
                output = outputs[row] = EngineOutput(sequence.request_id, [token])
            elif output.error is not None:
                continue
            sequence.last_token = token
            sequence.generated += 1
            if sequence.tokens is not None:
                sequence.tokens.append(token)
            output.finished = token in sequence.end_ids or sequence.generated >= sequence.params.max_tokens
        return outputs

    def _constrain(self, sequences: list[_Sequence], logits: np.ndarray, rows: list[int]) -> None:
        """Bans and guides, as -inf in the logits rows, in place."""
        guided = [row for row in rows if sequences[row].matcher is not None
                  and not sequences[row].matcher.is_terminated()]
        before_bans = {}
        for row in rows:
            banned = sequences[row].bans()
            if banned:
                if row in guided:
                    before_bans[row] = logits[row].copy()
                logits[row, banned] = -np.inf
        if guided:
            import torch

            if self._bitmask is None or self._bitmask.size(0) < len(sequences):
                self._bitmask = allocate_bitmask(max(len(sequences), self.max_num_seqs), self.vocab_size)
            for row in guided:
                sequences[row].matcher.fill_next_token_bitmask(self._bitmask, row)
            scores = torch.from_numpy(logits)
            apply_bitmask(scores, self._bitmask, guided, self.vocab_size)
            # A ban can leave a guided row no token at all (min_tokens forbidding the end token when
            # the grammar allows only that): then the guide alone decides, since its output must parse.
            for row, original in before_bans.items():
                if not np.isfinite(logits[row]).any():
                    logits[row] = original
                    apply_bitmask(scores, self._bitmask, [row], self.vocab_size)

    def _pick(self, sequence: _Sequence, row: np.ndarray):
        """The next token of a sequence with features, through its sampler chain; with its log
        probability and top alternatives under the distribution it was drawn from, when asked."""
        candidates = self._candidates
        candidates["id"] = self._token_ids
        candidates["logit"] = row
        array = llama.llama_token_data_array(self._candidates_pointer, self.vocab_size, -1, False)
        sampler = sequence.sampler
        if sampler.chain is not None:
            llama.llama_sampler_apply(sampler.chain, ctypes.byref(array))
        kept = candidates[:array.size]
        log_probs = top = None
        if sequence.params.wants_log_probs:
            values = kept["logit"].astype(np.float64)
            peak = values.max()
            normalized = values - (peak + math.log(np.exp(values - peak).sum()))
        if sampler.pick is not None:
            llama.llama_sampler_apply(sampler.pick, ctypes.byref(array))
            index = int(array.selected)
        else:
            index = int(kept["logit"].argmax())
        token = int(kept["id"][index])
        if sampler.chain is not None:
            llama.llama_sampler_accept(sampler.chain, token)
        if sequence.params.wants_log_probs:
            log_probs = float(normalized[index])
            k = min(sequence.params.top_logprobs, len(kept))
            if k:
                best = np.argpartition(-normalized, k - 1)[:k]
                best = best[np.argsort(-normalized[best], kind="stable")]
                top = [(int(kept["id"][i]), float(normalized[i])) for i in best]
        return token, log_probs, top

"""llama.cpp through llama-cpp-python's low-level bindings, on a GGUF file as it ships (no
conversion, the quantized weights run as they are): the `llm` model's parameter engine: "llama_cpp".

Continuous batching is done here, as llama.cpp's own server does it: one llama_decode per step
and KV cache over a llama_batch holding every running sequence there (each its own seq_id), its
next token for a sequence that is generating and a chunk of what it must still feed for one that
is not yet, decode tokens first and chunks in the budget left (max_batch_tokens).

Two KV caches, two llama.cpp contexts on one model (kv_pool.py counts their cells):
- The pool (kv_cache_tokens cells, llama.cpp's unified cache) that any request may fill up to
  the model's context. A request is admitted there, first come first, while the cells of what it
  must feed fit beside what runs there, with one step's decode tokens and 1% of the pool to spare;
  its output can then grow until the pool is full. When a step's tokens do not fit, the least
  recently used kept prefixes go first, then the most recently admitted sequence is preempted
  (vLLM's recompute preemption): its cells go back, it keeps its generated tokens and its
  sampler, and it waits at the head of the queue to be fed its prompt and those tokens again. So
  the oldest sequence always runs, and a request that fits the context is served however full
  the pool is.
- The slots (kv_slot_tokens each, llama.cpp's cache split per seq_id, llama-server's -np
  layout): a request whose tokens fit a slot runs there, and moves to the pool (recomputed, as
  after a preemption) if it outgrows it. llama.cpp's CPU flash attention reads the mask of every
  cell in use, for every query row, head and layer: in the pool a step of 64 short sequences
  costs 1.3-1.6x what it costs in slots, where each sequence attends over its own cells only
  (docs/configuration.md, The llama.cpp engine). Slots keep the many-short-requests case as fast as llama-server; the pool
  serves what does not fit them.

Prefix reuse (prompt_cache): a new request starts from the longest prefix of its tokens that a
seq_id holds, a running request's or a kept one's, and is fed only the rest (at least its last
token, for its logits). In the pool the cells are shared (llama_memory_seq_cp: a cell may belong
to several sequences); an ended request keeps its cells there under its seq_id, on the ids beyond
max_num_seqs (llama.cpp's limit is 256), least recently used first out when cells or ids are
needed. In the slots a prefix is copied from another slot (llama.cpp copies a slot whole) or kept
in place, and an ended request's slot keeps what it held until a new request takes the slot.
Queries and hits are counted in prompt tokens at a request's first admission, as vLLM counts
its prefix cache's.

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
import itertools
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
from .kv_pool import CellPool, Holder, SlotTable

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


class _Context:
    """One llama.cpp context on the engine's model: its KV cache (one pool of `cells`, or split
    into `seq_ids` slots), its batch and its logits."""

    def __init__(self, model, cells: int, n_batch: int, seq_ids: int, unified: bool, threads: int,
                 single_token_threads: int):
        params = llama.llama_context_default_params()
        params.n_ctx = cells  # 0: the model's training context
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = seq_ids
        params.kv_unified = unified
        # llama.cpp computes a ubatch of one token on n_threads and any larger one on n_threads_batch.
        params.n_threads, params.n_threads_batch = single_token_threads, threads
        params.no_perf = True
        self.ctx = llama.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {cells} tokens")
        self.memory = llama.llama_get_memory(self.ctx)
        self.unified = unified
        self.cells = int(llama.llama_n_ctx(self.ctx))
        self.seq_cells = int(llama.llama_n_ctx_seq(self.ctx))  # what one seq_id may hold
        self.seq_ids = seq_ids
        self.n_batch = n_batch
        self.batch = llama.llama_batch_init(n_batch, 0, 1)
        self.tokens = np.ctypeslib.as_array(self.batch.token, shape=(n_batch,))
        self.positions = np.ctypeslib.as_array(self.batch.pos, shape=(n_batch,))
        self.wants_logits = np.ctypeslib.as_array(self.batch.logits, shape=(n_batch,))
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=(n_batch,))[:] = 1
        self.seq_slots = [self.batch.seq_id[i] for i in range(n_batch)]
        self.n = 0  # tokens in the batch being filled
        self.state_cell_bytes = self.state_base_bytes = 0

    def warm_up(self, token: int) -> None:
        """A decode before serving: llama.cpp sizes its compute buffers and starts its threads.
        Its two cells also measure llama.cpp's saved state, which used_cells reads."""
        self.fill(token, 0, 0, False)
        self.fill(token, 1, 0, True)
        if self.decode() != 0:
            raise RuntimeError("llama.cpp failed to decode two tokens")
        two = llama.llama_state_seq_get_size(self.ctx, -1)
        llama.llama_memory_seq_rm(self.memory, 0, 1, -1)
        one = llama.llama_state_seq_get_size(self.ctx, -1)
        llama.llama_memory_seq_rm(self.memory, 0, -1, -1)
        # A used cell adds its keys, values and position, and 4 bytes per sequence it belongs to.
        self.state_cell_bytes = two - one - 4
        self.state_base_bytes = one - self.state_cell_bytes - 4

    def fill(self, token: int, position: int, seq_id: int, logits: bool) -> None:
        n = self.n
        self.tokens[n] = token
        self.positions[n] = position
        self.seq_slots[n][0] = seq_id
        self.wants_logits[n] = logits
        self.n = n + 1

    def decode(self) -> int:
        self.batch.n_tokens, self.n = self.n, 0
        return llama.llama_decode(self.ctx, self.batch)

    def logits(self, rows: int, vocab_size: int) -> np.ndarray:
        return np.ctypeslib.as_array(llama.llama_get_logits(self.ctx), shape=(rows, vocab_size))

    def share(self, source: int, target: int, count: int) -> None:
        """Unified: seq_id target shares source's positions [0, count) (no copy)."""
        llama.llama_memory_seq_cp(self.memory, source, target, 0, count)

    def copy(self, source: int, target: int, count: int) -> None:
        """Split: slot target gets slot source's positions [0, count), copied (llama.cpp copies a
        slot whole, at the next decode) and trimmed."""
        llama.llama_memory_seq_cp(self.memory, source, target, -1, -1)
        llama.llama_memory_seq_rm(self.memory, target, count, -1)

    def trim(self, seq_id: int, count: int) -> None:
        """Keeps a seq_id's positions [0, count)."""
        llama.llama_memory_seq_rm(self.memory, seq_id, count, -1)

    def clear(self, seq_id: int) -> None:
        llama.llama_memory_seq_rm(self.memory, seq_id, -1, -1)

    def used_cells(self) -> int:
        """KV cells that llama.cpp holds for any sequence, asked of llama.cpp itself. It has no
        call that counts them; in the unified cache the size of its saved state does: a fixed size
        per used cell plus 4 bytes per sequence each cell belongs to (measured at warm-up), and a
        sequence belongs to the cells of its positions pos_min..pos_max. Split, no cell is shared."""
        memberships = 0
        for seq_id in range(self.seq_ids):
            last = llama.llama_memory_seq_pos_max(self.memory, seq_id)
            if last >= 0:
                memberships += last - llama.llama_memory_seq_pos_min(self.memory, seq_id) + 1
        if not self.unified or not memberships:
            return memberships
        size = llama.llama_state_seq_get_size(self.ctx, -1)
        return (size - self.state_base_bytes - 4 * memberships) // self.state_cell_bytes

    def free(self) -> None:
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)


class _Sequence:
    """A request from its first admission to its end, on the engine thread."""

    def __init__(self, request_id: str, prompt: list[int], params: SamplingParams, end_ids: frozenset,
                 matcher=None):
        self.request_id = request_id
        self.prompt_length = len(prompt)
        self.params = params
        self.end_ids = end_ids
        # The prompt, then each generated token as it comes: what a kept prefix holds and what a
        # preempted sequence is fed again.
        self.tokens = list(prompt)
        self.holder: Optional[Holder] = None  # its seq_id and cells while it runs
        self.in_slot = False  # running in a slot of its own (else in the pool)
        self.fed = 0  # tokens in the KV cache
        self.target = 0  # tokens to feed before the next sampling: all it had when (re)admitted
        self.admitted = 0  # admission order: the most recent is preempted first
        self.queried = False  # counted in the prefix cache's queries (at its first admission)
        self.generated = 0
        self.sampler: Optional[_Sampler] = None
        self.always_banned = sorted({word[0] for word in params.bad_words if len(word) == 1})
        self.banned_after = [(list(word[:-1]), word[-1]) for word in params.bad_words if len(word) > 1]
        self.matcher = matcher
        self.plain = (params.greedy and not params.penalized and not params.bad_words and not params.min_tokens
                      and matcher is None and not params.wants_log_probs)

    @property
    def seq_id(self) -> int:
        return self.holder.seq_id

    @property
    def prefilling(self) -> bool:
        return self.fed < self.target

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
        seq_id_limit = llama.llama_max_parallel_sequences()
        if config.max_num_seqs > seq_id_limit:
            raise ValueError(f"max_num_seqs: {config.max_num_seqs} is more than llama.cpp's limit of "
                             f"{seq_id_limit} sequences")
        model_params = llama.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = llama.llama_model_load_from_file(str(gguf_file).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf_file}")
        # The contexts are used by the engine thread, and by memory_cells() from others, under this lock.
        self._context_lock = threading.RLock()
        self._contexts: list[_Context] = []
        try:
            self._init_contexts(config)
        except BaseException:
            for context in self._contexts:
                context.free()
            llama.llama_model_free(self._model)
            raise
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.vocab_size = int(llama.llama_vocab_n_tokens(self._vocab))
        self.eos_token_ids = frozenset(t for t in range(self.vocab_size) if llama.llama_vocab_is_eog(self._vocab, t))
        self.max_num_seqs = config.max_num_seqs
        self._guides = (GuideCompiler(tokenizer_dir, self.vocab_size, self.eos_token_ids)
                        if tokenizer_dir is not None else None)
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
        # For metrics (written by the engine thread only): cells the running sequences hold (a
        # shared cell once per sequence); prompt tokens looked up among the kept prefixes and
        # found there; preemptions.
        self.cells_held = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0
        # The engine thread's own state.
        self._waiting: deque = deque()
        self._running: dict[str, _Sequence] = {}  # in admission order
        self._admissions = itertools.count(1)
        bos = llama.llama_vocab_bos(self._vocab)
        for context in self._contexts:
            context.warm_up(bos if bos >= 0 else 0)
        self._thread = threading.Thread(target=self._run, name="tritonfront-llama-cpp", daemon=True)
        self._thread.start()

    def _init_contexts(self, config: EngineConfig) -> None:
        """The pool (unified) and, with kv_slot_tokens, the slots (split), on one model."""
        threads = config.num_threads or os.cpu_count() or 1
        # A lone sequence's step leaves a core to Triton and the stubs, which carry each of its
        # tokens as a chunk of its own: llama.cpp's threads wait for each other at every op, so one
        # of them preempted stalls the step. On 2 cores (2026-12-07, generate at 1 stream, 3
        # alternating rounds): 1 thread there carried 1.11-1.26x the tokens/s of 2, ITL P50 6.3
        # against 7.4 ms; at 16 streams (steps of 16 tokens, on num_threads) 0.95-1.01x, median 1.0.
        single = config.single_token_threads or max(1, threads - 1)
        reuse = config.prompt_cache
        # Every step's tokens go in one llama_decode per context: the decode tokens of all
        # sequences at least.
        n_batch = max(config.max_batch_tokens, config.max_num_seqs)
        # Cache entries take the seq_ids beyond the running ones (the unified cache's ids cost no memory).
        pool_ids = llama.llama_max_parallel_sequences() if reuse else config.max_num_seqs
        self._pool_context = _Context(self._model, config.kv_cache_tokens, n_batch, pool_ids, True, threads, single)
        self._contexts.append(self._pool_context)
        self._pool = CellPool(self._pool_context.cells, pool_ids, self._locked(self._pool_context.share),
                              self._locked(self._pool_context.clear), reuse)
        self.context_length = min(self._pool_context.cells, int(llama.llama_model_n_ctx_train(self._model)))
        # What admission to the pool leaves free beside a step's decode tokens, as vLLM's 1%
        # watermark: a sequence admitted at the edge would be preempted within a few steps.
        self._watermark = self._pool_context.cells // 100
        self._slot_context: Optional[_Context] = None
        self._slots: Optional[SlotTable] = None
        self.slot_tokens = 0
        if config.kv_slot_tokens:
            if config.kv_slot_tokens > self._pool_context.cells:
                raise ValueError(f"kv_slot_tokens: {config.kv_slot_tokens} is more than the pool's "
                                 f"{self._pool_context.cells} cells (kv_cache_tokens): a request that outgrows its "
                                 f"slot moves to the pool")
            self._slot_context = _Context(self._model, config.max_num_seqs * config.kv_slot_tokens, n_batch,
                                          config.max_num_seqs, False, threads, single)
            self._contexts.append(self._slot_context)
            self.slot_tokens = self._slot_context.seq_cells  # llama.cpp rounds it up to 256
            self._slots = SlotTable(config.max_num_seqs, self._locked(self._slot_context.copy),
                                    self._locked(self._slot_context.trim), reuse)

    def _locked(self, call):
        def locked(*args):
            with self._context_lock:
                call(*args)
        return locked

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
        return sum(context.cells for context in self._contexts)

    def kv_cache_block_tokens(self) -> int:
        return 1  # a block is a cell: one token

    def prefix_cache_tokens(self) -> tuple[int, int]:
        return self.prefix_queries, self.prefix_hits

    def cached_cells(self) -> int:
        """Cells that only kept prefixes hold, in the pool and the slots (the engine's count; read
        with the engine idle)."""
        return self._pool.entry_cells() + (self._slots.kept_cells() if self._slots is not None else 0)

    def memory_cells(self) -> int:
        """KV cells that llama.cpp holds for any sequence in either cache, asked of llama.cpp itself
        (for leak checks: the engine's own count is the running sequences' cells plus cached_cells)."""
        with self._context_lock:
            return sum(context.used_cells() for context in self._contexts)

    def shutdown(self) -> None:
        with self._work:
            self._stopping = True
            self._work.notify()
        self._thread.join(30)
        if self._thread.is_alive():  # a decode still runs: freeing the context under it would crash
            return
        for sequence in list(self._running.values()) + list(self._waiting):
            self._free_sampler(sequence)
        self._running.clear()
        self._waiting.clear()
        for context in self._contexts:
            context.free()
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
        for sequence in self._waiting:
            if sequence.request_id in request_ids:
                self._free_sampler(sequence)  # a preempted sequence's
        self._waiting = deque(s for s in self._waiting if s.request_id not in request_ids)
        for request_id in request_ids:
            sequence = self._running.get(request_id)
            if sequence is not None:
                self._release(sequence, keep=True)

    def _admit(self) -> None:
        """Waiting requests become running, first come first, while fewer than max_num_seqs run: in
        a slot while its tokens fit one, else in the pool while what it must feed fits beside what
        runs there (module docstring). A request that waits for the pool lets those behind it
        take slots, but no other pool request pass it."""
        pool = self._pool
        # Cells that admitted pool sequences have still to feed: theirs, not free for the next one.
        unfed = sum(s.target - s.fed for s in self._running.values() if s.prefilling and not s.in_slot)
        in_pool = sum(1 for s in self._running.values() if not s.in_slot)
        pool_blocked = False
        for sequence in list(self._waiting):
            if len(self._running) >= self.max_num_seqs:
                return
            tokens = sequence.tokens
            if self._slots is not None and len(tokens) < self.slot_tokens:
                self._waiting.remove(sequence)
                holder = self._slots.start(tokens)
                self._start(sequence, holder, True)
                continue
            if pool_blocked:
                continue
            source, shared = pool.find_prefix(tokens, len(tokens) - 1)
            need = len(tokens) - shared
            if in_pool:
                need += unfed + in_pool + 1 + self._watermark
            if not pool.make_room(need, keep=source):
                if in_pool:
                    pool_blocked = True  # it waits for cells to come back
                    continue
                # Alone, it fits once every entry is gone: `add` refused what exceeds the context.
                source, shared = None, 0
                pool.make_room(len(tokens))
            if not pool.take_seq_id(keep=source):
                source, shared = None, 0  # the only id left carries the entry it would share from
                pool.take_seq_id()
            self._waiting.remove(sequence)
            self._start(sequence, pool.start(tokens, source, shared), False)
            unfed += len(tokens) - shared
            in_pool += 1

    def _start(self, sequence: _Sequence, holder: Holder, in_slot: bool) -> None:
        sequence.holder, sequence.in_slot = holder, in_slot
        sequence.fed = holder.held
        sequence.target = len(sequence.tokens)
        sequence.admitted = next(self._admissions)
        self.cells_held += holder.held
        if not sequence.queried and self._pool.reuse:
            sequence.queried = True
            self.prefix_queries += sequence.prompt_length
            self.prefix_hits += min(holder.held, sequence.prompt_length)
        if not sequence.plain and sequence.sampler is None:  # a preempted one keeps its own
            sequence.sampler = _Sampler(sequence.params, self.vocab_size,
                                        sequence.prompt_length + sequence.params.max_tokens)
            if sequence.params.penalized:
                sequence.sampler.accept(sequence.tokens)
        self._running[sequence.request_id] = sequence

    def _end(self, sequence: _Sequence, keep: bool) -> None:
        """Takes a running sequence off its seq_id: its cells go back, or with `keep` (and prefix
        reuse on) stay for later requests."""
        del self._running[sequence.request_id]
        if sequence.in_slot:
            self._slots.release(sequence.holder, keep)
        else:
            self._pool.release(sequence.holder, keep)
        self.cells_held -= sequence.fed
        sequence.holder = None

    def _release(self, sequence: _Sequence, keep: bool) -> None:
        """A running sequence ends (finished, cancelled or failed)."""
        self._end(sequence, keep)
        self._free_sampler(sequence)

    def _preempt(self, sequence: _Sequence, keep: bool = False) -> None:
        """Puts a running sequence back at the head of the queue with its generated tokens and
        sampler: readmitted, it is fed all its tokens again (or what no kept prefix holds)."""
        self._end(sequence, keep)
        sequence.fed = 0
        self._waiting.appendleft(sequence)
        self.preemptions += 1

    @staticmethod
    def _free_sampler(sequence: _Sequence) -> None:
        if sequence.sampler is not None:
            sequence.sampler.free()
            sequence.sampler = None

    def _plan(self) -> tuple[list[tuple[_Sequence, int]], list[tuple[_Sequence, int]]]:
        """How many tokens each running sequence feeds this step, in the slots and in the pool:
        its next one if it is generating, otherwise a chunk of what it must feed, in the budget
        that the generating ones leave (oldest first) and, in the pool, in the free cells.

        A sequence whose slot is full goes to the pool (recomputed there: llama.cpp moves no
        cells between caches). In the pool, while the generating ones' tokens do not fit after
        evicting kept prefixes, or nothing at all could be fed, the most recently admitted
        sequence is preempted."""
        slotted, pooled = [], []
        for sequence in list(self._running.values()):
            if not sequence.in_slot:
                pooled.append(sequence)
            elif sequence.fed >= self.slot_tokens:
                self._preempt(sequence, keep=True)  # its slot keeps what it held, for other requests
            else:
                slotted.append(sequence)
        if slotted:
            slotted.sort(key=lambda s: s.seq_id)  # _step says why
        pool = self._pool
        while True:
            decoding = sum(1 for s in pooled if not s.prefilling)
            budget = self._pool_context.n_batch - decoding
            wanted = min(budget, sum(s.target - s.fed for s in pooled if s.prefilling))
            pool.make_room(decoding + wanted)
            budget = min(budget, pool.free - decoding)
            pool_plan = self._chunks(pooled, budget)
            if not pooled or pool_plan and budget >= 0:
                break
            victim = max(pooled, key=lambda s: s.admitted)
            pooled.remove(victim)
            self._preempt(victim)
        return self._chunks(slotted, self._n_slot_batch() - sum(1 for s in slotted if not s.prefilling)), pool_plan

    def _n_slot_batch(self) -> int:
        return self._slot_context.n_batch if self._slot_context is not None else 0

    @staticmethod
    def _chunks(sequences: list[_Sequence], budget: int) -> list[tuple[_Sequence, int]]:
        plan = []
        for sequence in sequences:
            if not sequence.prefilling:
                plan.append((sequence, 1))
            elif budget > 0:
                take = min(sequence.target - sequence.fed, budget)
                budget -= take
                plan.append((sequence, take))
        return plan

    def _step(self) -> None:
        """One llama_decode per cache over its planned tokens, then one token for each sequence
        that has all it must feed in the cache.

        In the slots (llama.cpp's cache split per seq_id), llama.cpp splits a batch into
        micro-batches of sequences whose seq_ids run consecutively in batch order, one forward pass
        (all weights read) each: in admission order, with ids reused as they free up, a step of 16
        decode tokens could be 16 passes. Sorted, and with the lowest free slot taken first, it is
        one pass, plus one per gap in the ids and per prompt's remaining chunk. The pool (one
        unified cache) takes a batch whole, in any order."""
        slot_plan, pool_plan = self._plan()
        outputs = []
        for context, plan in ((self._slot_context, slot_plan), (self._pool_context, pool_plan)):
            if plan:
                outputs += self._decode(context, plan)
        for output in outputs:
            if output.finished:
                sequence = self._running.get(output.request_id)
                if sequence is not None:
                    self._release(sequence, keep=True)
        if outputs:
            self._results.put(outputs)

    def _decode(self, context: _Context, plan: list[tuple[_Sequence, int]]) -> list[EngineOutput]:
        sampled: list[_Sequence] = []  # in the order of their logits rows
        for sequence, take in plan:
            seq_id, fed, tokens = sequence.seq_id, sequence.fed, sequence.tokens
            completes = fed + take >= sequence.target
            for position in range(fed, fed + take - 1):
                context.fill(tokens[position], position, seq_id, False)
            context.fill(tokens[fed + take - 1], fed + take - 1, seq_id, completes)
            if completes:
                sampled.append(sequence)
        with self._context_lock:
            status = context.decode()
            if status == 1 and context.unified and len(plan) > 1:
                # No cells for the batch, which the pool's count rules out: take the newest out and retry.
                logging.getLogger(__name__).warning("llama.cpp found no KV cells for a step of %d sequences "
                                                    "(%d free by the engine's count); preempting", len(plan),
                                                    self._pool.free)
                self._preempt(max((s for s, _ in plan), key=lambda s: s.admitted))
                return []
            if status != 0:
                return self._fail_step([sequence for sequence, _ in plan], status)
            grow = self._pool.grow if context.unified else self._slots.grow
            for sequence, take in plan:
                sequence.fed += take
                self.cells_held += take
                grow(sequence.holder, take)
            if not sampled:  # a step of prompt chunks alone has no logits
                return []
            return self._sample(sampled, context.logits(len(sampled), self.vocab_size))

    def _fail_step(self, sequences: list[_Sequence], status: int) -> list[EngineOutput]:
        error = f"llama.cpp failed to decode (llama_decode returned {status})"
        outputs = [EngineOutput(sequence.request_id, [], True, error) for sequence in sequences]
        for sequence in sequences:
            self._release(sequence, keep=False)
        return outputs

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
            sequence.generated += 1
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

"""What the `llm` model needs from an in-flight batching engine, whichever library runs it.

An engine takes token ids in and gives new token ids out, per request, as they are generated.
Stop words, chunking and responses live above it (tritonfront.core.generation_loop), so every engine
behaves the same towards clients.
"""
import contextlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ContextManager, Optional, Sequence

from ..errors import InvalidInput

UINT64_MAX = 2**64 - 1
# The OS name (/proc/<pid>/task/<tid>/comm) of the threads that run an engine's model.
ENGINE_THREAD_NAME = "tf-engine"
# Weight and activation types an engine is asked for by name; "auto": float32 on CPU, bfloat16 on GPU.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Attention of the transformers engine: "varlen", per request over the paged cache on the CPU
# (engines/hf/varlen_attention.py; GPUs keep transformers' choice); "sdpa", transformers' own packed
# attention, quadratic in the batch (the stock engine, kept for comparison).
ATTENTIONS = ("varlen", "sdpa")


# TensorRT-LLM's `guided_decoding_guide_type` values: "json" is any JSON object or array (no guide
# text), "json_schema" a JSON Schema, "regex" a regular expression, "ebnf_grammar" an EBNF grammar
# in xgrammar's (GBNF-like) dialect.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs
MAX_BAD_WORDS = 256  # sequences per request, so one request cannot make every step slow


@dataclass(frozen=True)
class GuidedDecoding:
    """Output constrained to a guide. `validate` checks its shape only; whether the guide text
    compiles is the engine's check (Engine.check_params), since compiling needs its vocabulary."""
    guide_type: str
    guide: Optional[str] = None  # not read for "json"

    def validate(self) -> None:
        if self.guide_type not in GUIDE_TYPES:
            raise InvalidInput("guided_decoding_guide_type", f"{self.guide_type!r} must be one of {GUIDE_TYPES}")
        if self.guide_type != "json" and not (self.guide or "").strip():
            raise InvalidInput("guided_decoding_guide", f"is required for guide type {self.guide_type!r}")


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation settings, with TensorRT-LLM's meanings and defaults (its executor
    SamplingConfig and penalty kernel, which its Triton `tensorrt_llm` model drives)."""
    max_tokens: int
    # None: greedy unless top_k or top_p ask for sampling, then 1.0. (TensorRT-LLM's rule that a
    # temperature without top_k or top_p is greedy belongs to its contract: the request parser
    # turns such a temperature into 0.)
    temperature: Optional[float] = None
    top_k: int = 0  # 0: no top-k limit
    top_p: float = 1.0
    random_seed: Optional[int] = None  # None: a fresh seed per request
    end_id: Optional[int] = None  # finishes like the model's EOS, in addition to it
    # TensorRT-LLM's min_length: the end tokens (EOS and end_id) cannot be generated before this many
    # tokens. Stop words are not affected (TensorRT-LLM checks them apart from min_length).
    min_tokens: int = 0
    # Penalties over every token of the sequence, prompt and generated, as TensorRT-LLM's penalty
    # kernel counts them (OpenAI's presence/frequency count generated tokens only), applied after
    # temperature: a seen token's logit is divided by repetition_penalty when positive and
    # multiplied when negative, then presence_penalty is subtracted once, and frequency_penalty
    # once per occurrence.
    repetition_penalty: float = 1.0  # > 0; 1 is off; > 1 discourages repetition
    presence_penalty: float = 0.0  # any finite value; 0 is off; > 0 discourages repetition
    frequency_penalty: float = 0.0  # any finite value; 0 is off
    # Token-id sequences never generated: the last token of a sequence is banned whenever the
    # tokens before it end the sequence so far (prompt included); a one-token sequence always.
    bad_words: tuple[tuple[int, ...], ...] = ()
    guided_decoding: Optional[GuidedDecoding] = None
    # Log-probabilities of the chosen tokens (EngineOutput.log_probs); top_logprobs > 0 also gives
    # the top alternatives per token (EngineOutput.top_log_probs).
    return_log_probs: bool = False
    top_logprobs: int = 0

    @property
    def greedy(self) -> bool:
        if self.temperature is not None:
            return self.temperature == 0 or self.top_k == 1
        return self.top_k in (0, 1) and self.top_p == 1.0

    @property
    def effective_temperature(self) -> float:
        return 1.0 if self.temperature is None else float(self.temperature)

    @property
    def wants_log_probs(self) -> bool:
        return self.return_log_probs or self.top_logprobs > 0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self, prompt_tokens: int, context_length: int, vocab_size: int) -> "SamplingParams":
        """Raises InvalidInput naming the first field outside its limit (by the TensorRT-LLM input
        name where one exists). A guide's text is checked by Engine.check_params."""
        room = context_length - prompt_tokens
        if room < 1:
            raise InvalidInput("input_ids", f"{prompt_tokens} prompt tokens leave no room for generation "
                                            f"in the context of {context_length} tokens (at most {context_length - 1})")
        if not 1 <= self.max_tokens <= room:
            # Triton's HTTP generate extension converts a JSON number to INT32 without a range
            # check: 3000000000 arrives as -1294967296.
            wrapped = " (over HTTP, a number above 2147483647 arrives wrapped around)" if self.max_tokens < 0 else ""
            raise InvalidInput("max_tokens", f"{self.max_tokens} is outside 1..{room} (context of {context_length} "
                                             f"tokens minus {prompt_tokens} prompt tokens){wrapped}")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidInput("temperature", f"{self.temperature} must be a finite number >= 0 (0 is greedy)")
        if self.top_k < 0:
            raise InvalidInput("top_k", f"{self.top_k} must be >= 0 (0 is no limit)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise InvalidInput("top_p", f"{self.top_p} must be in (0, 1]")
        if self.random_seed is not None and not 0 <= self.random_seed <= UINT64_MAX:
            raise InvalidInput("random_seed", f"{self.random_seed} is outside 0..{UINT64_MAX}")
        if self.end_id is not None and not 0 <= self.end_id < vocab_size:
            raise InvalidInput("end_id", f"{self.end_id} is outside the vocabulary 0..{vocab_size - 1}")
        if self.min_tokens < 0:
            raise InvalidInput("min_length", f"{self.min_tokens} must be >= 0 (0 is no minimum)")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise InvalidInput("repetition_penalty", f"{self.repetition_penalty} must be a finite number > 0 "
                                                     f"(1 is no penalty)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise InvalidInput(name, f"{getattr(self, name)} must be a finite number (0 is no penalty)")
        if len(self.bad_words) > MAX_BAD_WORDS:
            raise InvalidInput("bad_words", f"{len(self.bad_words)} sequences is more than {MAX_BAD_WORDS}")
        for i, word in enumerate(self.bad_words):
            if not word:
                raise InvalidInput(f"bad_words[{i}]", "is empty")
            if min(word) < 0 or max(word) >= vocab_size:
                raise InvalidInput(f"bad_words[{i}]", f"token ids must be in 0..{vocab_size - 1}")
        if self.guided_decoding is not None:
            self.guided_decoding.validate()
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidInput("top_logprobs", f"{self.top_logprobs} is outside 0..{MAX_TOP_LOGPROBS}")
        return self


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256  # sequences in one forward pass
    kv_cache_tokens: int = 32768  # 0: let the engine size its KV cache from free memory
    max_batch_tokens: int = 512  # prefill chunk budget of one forward pass
    dtype: str = "auto"  # one of DTYPES
    attention: str = "varlen"  # one of ATTENTIONS; only the transformers engine reads it
    num_threads: int = 0  # the llama.cpp engine's compute threads; 0: one per core (torch's are set by the model)
    # The llama.cpp engine's threads for a step that feeds a single token (llama.cpp's n_threads;
    # every larger step uses num_threads, its n_threads_batch); 0: one fewer than num_threads, at
    # least 1 (engines/llama_cpp.py says why).
    single_token_threads: int = 0
    gguf_file: Optional[str] = None  # the weights the llama.cpp engine loads, as they ship
    # llama.cpp engine: cells of each running sequence's own slot (a second KV cache split into
    # max_num_seqs slots, llama-server's -np layout), where a request runs while its tokens fit,
    # its attention over its own cells only; 0: every request in the pool of kv_cache_tokens.
    kv_slot_tokens: int = 0
    # llama.cpp engine: a new request reuses the KV of the longest prefix of its prompt that a
    # running or ended request holds, and is fed only the rest (llama-server's cache_prompt).
    prompt_cache: bool = True
    # Synthetic engine (engines/synthetic.py): a step lasts step_ms, plus step_us_per_seq per running
    # sequence, plus prefill_us_per_token per prompt token it admits; with eos_every N > 0 a token is
    # EOS with chance 1/N, 0 never.
    synthetic_step_ms: int = 20
    synthetic_step_us_per_seq: int = 0
    synthetic_prefill_us_per_token: int = 0
    synthetic_eos_every: int = 0


# Slots: an engine makes one per running sequence per step (1,024 a step at GPU-like rates).
@dataclass(slots=True)
class EngineOutput:
    request_id: str
    token_ids: list[int] = field(default_factory=list)  # new since this request's previous output
    finished: bool = False  # nothing more will come for this request
    error: Optional[str] = None
    # When an engine ends a request by its own rule without the end token in token_ids ("stop"),
    # or "length"; None lets the caller infer it.
    finish_reason: Optional[str] = None
    # Only when the request asked (SamplingParams.wants_log_probs), one per token in token_ids: the
    # natural log of the chosen token's probability under the distribution it was drawn from, that
    # is the softmax of the logits after penalties, bans, guide, temperature, top-k and top-p (what
    # transformers' `generate` reports as `scores`; for greedy requests without penalties, the
    # model's own log-softmax).
    log_probs: list[float] = field(default_factory=list)
    # Only when the request asked for top_logprobs = k > 0, one per token in token_ids: the k most
    # likely (token id, log probability) pairs of the same distribution, most likely first.
    top_log_probs: list[list[tuple[int, float]]] = field(default_factory=list)


class Engine(ABC):
    context_length: int  # prompt + generated tokens one request may reach
    vocab_size: int
    eos_token_ids: frozenset
    # Whether EngineOutput.top_log_probs comes filled, from the distribution log_probs come from
    # (the processed one): an engine that sets this has a test against transformers' scores.
    gives_top_log_probs: bool = False

    def check_request(self, params: SamplingParams) -> None:
        """Everything this engine cannot honour, as InvalidInput naming the input: what no
        subclass may let through (top alternatives it does not give), then its own check_params."""
        if params.top_logprobs and not self.gives_top_log_probs:
            raise InvalidInput("top_logprobs", f"{params.top_logprobs}: the {type(self).__name__} engine gives no "
                                               "top alternatives per token; use 0 (return_log_probs still gives the "
                                               "chosen tokens' log probs)")
        self.check_params(params)

    def check_params(self, params: SamplingParams) -> None:
        """What this engine cannot honour or a guide that does not compile, as InvalidInput naming the
        input; call after SamplingParams.validate and before `add`, off the engine's thread (compiling
        a grammar can take a while)."""
        if params.guided_decoding is not None:
            raise InvalidInput("guided_decoding_guide_type", "this engine has no guided decoding")

    @abstractmethod
    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Queues a request; returns at once."""

    def adding_together(self) -> ContextManager:
        """A block whose `add`s the engine takes in at once, for a step: requests that arrive
        together (one Triton batch) start together. The default takes each as it comes."""
        return contextlib.nullcontext()

    @abstractmethod
    def cancel(self, request_id: str) -> None:
        """Stops generating for the request and frees its KV cache; no outputs follow."""

    @abstractmethod
    def outputs(self, timeout: float) -> list[EngineOutput]:
        """Everything generated since the previous call, waiting up to `timeout` seconds for
        something. Raises if the engine can no longer generate."""

    def kv_cache_blocks(self) -> int:
        """KV cache blocks held by unfinished requests (0 where the engine does not tell), read
        from another thread than the engine's: for metrics and leak checks, not for scheduling."""
        return 0

    def kv_cache_capacity_blocks(self) -> int:
        """Blocks in the whole KV cache, in the unit of kv_cache_blocks (0 where the engine does
        not tell): with it, the cache's utilization."""
        return 0

    def kv_cache_block_tokens(self) -> int:
        """Tokens one block of kv_cache_blocks holds: 1 for an engine that counts cells (llama.cpp,
        synthetic); a paged engine says its page size."""
        return 1

    def prefix_cache_tokens(self) -> tuple[int, int]:
        """(queried, hit) since the engine started: prompt tokens looked up in its prefix cache
        and those found there, whose KV was reused instead of computed (vLLM's
        prefix_cache_queries and prefix_cache_hits); (0, 0) where the engine has none."""
        return 0, 0

    @abstractmethod
    def shutdown(self) -> None:
        """Stops the engine; unfinished requests get no further outputs."""

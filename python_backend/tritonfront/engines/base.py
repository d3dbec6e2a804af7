"""What the `llm` model needs from an in-flight batching engine, whichever library runs it.

An engine takes token ids in and gives new token ids out, per request, as they are generated.
Stop words, chunking and responses live above it (tritonfront.generation), so every engine
behaves the same towards clients.
"""
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..errors import InvalidInput

UINT64_MAX = 2**64 - 1
# The OS name (/proc/<pid>/task/<tid>/comm) of the threads that run an engine's model.
ENGINE_THREAD_NAME = "tf-engine"
# Weight and activation types an engine is asked for by name; "auto": float32 on CPU, bfloat16 on GPU.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Attention of the transformers engine: "varlen", per request over the paged cache on the CPU
# (engines/varlen_attention.py; GPUs keep transformers' choice); "sdpa", transformers' own packed
# attention, quadratic in the batch (the stock engine, kept for comparison).
ATTENTIONS = ("varlen", "sdpa")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    # None follows TensorRT-LLM: greedy unless top_k or top_p ask for sampling, then 1.0.
    temperature: Optional[float] = None
    top_k: int = 0  # 0: no top-k limit
    top_p: float = 1.0
    random_seed: Optional[int] = None  # None: a fresh seed per request
    end_id: Optional[int] = None  # finishes like the model's EOS, in addition to it

    @property
    def greedy(self) -> bool:
        if self.temperature is not None:
            return self.temperature == 0 or self.top_k == 1
        return self.top_k in (0, 1) and self.top_p == 1.0

    @property
    def effective_temperature(self) -> float:
        return 1.0 if self.temperature is None else float(self.temperature)

    def validate(self, prompt_tokens: int, context_length: int, vocab_size: int) -> "SamplingParams":
        """Raises InvalidInput naming the first field outside its limit."""
        room = context_length - prompt_tokens
        if room < 1:
            raise InvalidInput("input_ids", f"{prompt_tokens} prompt tokens leave no room for generation "
                                            f"in the context of {context_length} tokens (at most {context_length - 1})")
        if not 1 <= self.max_tokens <= room:
            raise InvalidInput("max_tokens", f"{self.max_tokens} is outside 1..{room} (context of {context_length} "
                                             f"tokens minus {prompt_tokens} prompt tokens)")
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
        return self


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256  # sequences in one forward pass
    kv_cache_tokens: int = 32768  # 0: let the engine size its KV cache from free memory
    max_batch_tokens: int = 512  # prefill chunk budget of one forward pass
    dtype: str = "auto"  # one of DTYPES
    attention: str = "varlen"  # one of ATTENTIONS; only the transformers engine reads it


@dataclass
class EngineOutput:
    request_id: str
    token_ids: list[int] = field(default_factory=list)  # new since this request's previous output
    finished: bool = False  # nothing more will come for this request
    error: Optional[str] = None
    # When an engine ends a request by its own rule without the end token in token_ids ("stop"),
    # or "length"; None lets the caller infer it.
    finish_reason: Optional[str] = None


class Engine(ABC):
    context_length: int  # prompt + generated tokens one request may reach
    vocab_size: int
    eos_token_ids: frozenset

    @abstractmethod
    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Queues a request; returns at once."""

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

    @abstractmethod
    def shutdown(self) -> None:
        """Stops the engine; unfinished requests get no further outputs."""

"""The embedded default engine: transformers' continuous batching (paged KV cache, in-flight
batching, chunked prefill) running in a background thread of this model instance.

Sampling is per request inside the shared batch. transformers' own sampler chooses greedy or
sampling for the whole manager and draws from one global torch generator, so a request's seed
could not mean anything. Instead the manager always takes the argmax, and every row of logits
first goes through that request's temperature, top-k and top-p, then gets Gumbel noise computed
from a counter-based hash of (request seed, token position): argmax(logits / T + Gumbel) is a draw
from softmax(logits / T) (the Gumbel-max trick). Greedy rows are left untouched, so they match
`generate` exactly, and a seeded request gets the same tokens whatever shares its batches.
"""
import math
import secrets
import threading
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.continuous_batching.model_runner import infer_max_single_request_tokens
from transformers.generation.logits_process import LogitsProcessorList

from .. import threads
from . import varlen_attention
from .base import ATTENTIONS, DTYPES, ENGINE_THREAD_NAME, Engine, EngineConfig, EngineOutput, SamplingParams

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PAGE_TOKENS = 256  # KV cache page: kv_cache_tokens is rounded up to whole pages


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32, on int64 tensors holding values below 2**32 (products wrap; the mask keeps the
    low 32 bits, which wrapping does not change)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def noise_key(seed: int, position: int) -> int:
    """A nonzero 32-bit key for the token at `position` of a request seeded with `seed`
    (splitmix64); zero is kept for rows that get no noise."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 32) or 1


def as_int32(key: int) -> int:
    """A 32-bit key as the int32 with the same bits."""
    return key - (1 << 32) if key >= 1 << 31 else key


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] standard Gumbel noise, each row a pure function of its key, on the keys'
    device."""
    columns = _hash32(torch.arange(vocab, device=keys.device, dtype=torch.int64))
    bits = _hash32(keys[:, None] ^ columns[None, :])
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits, never 0 or 1
    return -torch.log(-torch.log(uniform))


def _nothing_to_do(scores: torch.Tensor, active_rows: torch.Tensor) -> bool:
    # Only on CPU: on an accelerator the check would wait for the device, and a captured graph
    # would freeze whichever branch it saw, so there the full computation always runs.
    return scores.device.type == "cpu" and not bool(active_rows.any())


class _PerRequestValue(ContinuousBatchingLogitsProcessor):
    """One value per request for each row of logits. Continuous batching gives every processor
    one int32 row of argument storage, so float values travel bit-cast to int32."""

    key: str
    dtype: torch.dtype
    neutral: float
    ignored_kwargs: tuple = ()

    def value(self, state):
        return state.logit_processor_kwargs.get(self.key, self.neutral)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(torch.full(int32_tensor.shape, self.neutral, dtype=self.dtype).view(torch.int32))

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        return torch.tensor([self.value(r.state) for r in requests_with_new_token], dtype=self.dtype).view(torch.int32)

    def values(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        return tensor_arg[: scores.size(0)].view(self.dtype)


class Temperature(_PerRequestValue):
    key, dtype, neutral = "temperature", torch.float32, 0.0
    supported_kwargs = {"temperature": float}

    def __call__(self, scores, tensor_arg):
        temperature = self.values(scores, tensor_arg)
        # Greedy rows (0) are divided by exactly 1.0, which leaves them bit-identical.
        return scores / torch.where(temperature > 0, temperature, torch.ones_like(temperature))[:, None]


class TopK(_PerRequestValue):
    key, dtype, neutral = "top_k", torch.int32, 0
    supported_kwargs = {"top_k": int}

    def __call__(self, scores, tensor_arg):
        k = self.values(scores, tensor_arg).long()
        if _nothing_to_do(scores, k > 0):
            return scores
        vocab = scores.size(-1)
        k = torch.where(k > 0, k.clamp(max=vocab), torch.full_like(k, vocab))
        kth = torch.sort(scores, dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
        return scores.masked_fill(scores < kth, -math.inf)


class TopP(_PerRequestValue):
    key, dtype, neutral = "top_p", torch.float32, 1.0
    supported_kwargs = {"top_p": float}

    def __call__(self, scores, tensor_arg):
        top_p = self.values(scores, tensor_arg)
        active = top_p < 1
        if _nothing_to_do(scores, active):
            return scores
        ascending, order = torch.sort(scores, dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = (cumulative <= (1 - top_p)[:, None]) & active[:, None]
        drop[:, -1] = False  # the most likely token always stays
        return scores.masked_fill(drop.scatter(-1, order, drop), -math.inf)


class GumbelNoise(_PerRequestValue):
    key, dtype, neutral = "random_seed", torch.int32, 0
    supported_kwargs = {"random_seed": int}

    def value(self, state):
        seed = state.logit_processor_kwargs.get(self.key)
        if seed is None:
            return 0
        # position_offset is already past the token this row samples: a distinct key per token.
        return as_int32(noise_key(seed, state.position_offset))

    def __call__(self, scores, tensor_arg):
        keys = self.values(scores, tensor_arg).long() & _MASK32
        active = keys != 0
        if _nothing_to_do(scores, active):
            return scores
        return torch.where(active[:, None], scores + gumbel_noise(keys, scores.size(-1)), scores)


class PerRequestSampling(ContinuousBatchingLogitsProcessorList):
    def __init__(self):
        super().__init__(LogitsProcessorList([Temperature(), TopK(), TopP(), GumbelNoise()]),
                         per_request_processors=False)
        # The base class reserves argument rows only for processors it converted itself.
        self.tensors_required = len(self.logits_processor)


def sampling_kwargs(params: SamplingParams) -> dict:
    if params.greedy:
        return {}
    seed = params.random_seed if params.random_seed is not None else secrets.randbits(64)
    return {"temperature": params.effective_temperature, "top_k": int(params.top_k),
            "top_p": float(params.top_p), "random_seed": int(seed)}


def eos_token_ids(model) -> set[int]:
    ids = set()
    for source in (model.generation_config, model.config.get_text_config()):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return {int(i) for i in ids if i is not None and i >= 0}


class HFEngine(Engine):
    def __init__(self, model, config: EngineConfig):
        if config.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {config.attention!r}")
        # On a GPU transformers picks its own varlen (flash) kernels when installed.
        varlen = config.attention == "varlen" and model.device.type == "cpu"
        if varlen:
            varlen_attention.enable(model)
        text_config = model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        self.eos_token_ids = frozenset(eos_token_ids(model))
        cb_config = ContinuousBatchingConfig(
            page_size=PAGE_TOKENS,
            num_blocks=math.ceil(config.kv_cache_tokens / PAGE_TOKENS) if config.kv_cache_tokens else None,
            max_batch_tokens=config.max_batch_tokens,
            max_requests_per_batch=config.max_num_seqs,
            # The block-table decode path needs a kernel that reads cache pages itself.
            max_blocks_per_request=0 if varlen else None,
            # Headroom for the vocabulary-sized tensors of per-request sampling (transformers picks
            # this itself only when it knows of logits processors, which it does not of ours).
            max_memory_percent=None if model.device.type == "cpu" else 0.8,
        )
        self._manager = model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, eos_token_id=sorted(self.eos_token_ids)),
            continuous_batching_config=cb_config,
        )
        self._manager.logit_processor = PerRequestSampling()
        # Builds the paged cache now, so the context a request may use is known before the first one.
        self._manager.warmup()
        capacity = infer_max_single_request_tokens(self._manager.batch_processor.cache)
        positions = getattr(text_config, "max_position_embeddings", None)
        self.context_length = min(capacity, int(positions)) if positions else capacity
        self._delivered: dict[str, int] = {}  # tokens already handed out, per live request
        self._lock = threading.Lock()
        # transformers runs its loop in a non-daemon thread, which keeps a process alive at exit
        # until the manager is stopped: a stub whose server died without calling finalize would
        # never exit. Threads inherit their creator's daemon flag, so a daemon thread starts it.
        starter = threading.Thread(target=self._manager.start, daemon=True)
        starter.start()
        starter.join()

    @classmethod
    def from_folder(cls, model_dir: Path, device: str, config: EngineConfig) -> "HFEngine":
        """Loads the model and starts the engine. The threads that appear meanwhile (torch's intra-op
        workers, transformers' generation thread) get the engine's OS thread name, so that CPU
        accounting can tell the engine from the serving code around it."""
        threads_before = threads.native_ids()
        engine = cls(cls._load(model_dir, device, config), config)
        threads.name_native(threads.native_ids() - threads_before, ENGINE_THREAD_NAME)
        return engine

    @staticmethod
    def _load(model_dir: Path, device: str, config: EngineConfig):
        if config.dtype == "auto":
            dtype = torch.float32 if device == "cpu" else torch.bfloat16
        elif config.dtype in TORCH_DTYPES:
            dtype = TORCH_DTYPES[config.dtype]
        else:
            raise ValueError(f"dtype must be one of {DTYPES}, got {config.dtype!r}")
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        eos = set(self.eos_token_ids) | ({params.end_id} if params.end_id is not None else set())
        with self._lock:
            self._delivered[request_id] = 0
        added = self._manager.add_request([int(i) for i in prompt_ids], request_id=request_id,
                                          max_new_tokens=params.max_tokens, streaming=True,
                                          eos_token_id=sorted(eos), **sampling_kwargs(params))
        if added is None:
            with self._lock:
                self._delivered.pop(request_id, None)
            raise RuntimeError("the transformers engine is not accepting requests (stopped or failed)")

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if self._delivered.pop(request_id, None) is None:
                return
        self._manager.cancel_request(request_id)

    def outputs(self, timeout: float) -> list[EngineOutput]:
        if not self._manager.is_running():
            raise RuntimeError("the transformers generation thread is not running")
        results = []
        result = self._manager.get_result(timeout=timeout)
        while result is not None:
            results.append(result)
            result = self._manager.get_result(timeout=0)
        outputs = []
        with self._lock:
            for result in results:
                delivered = self._delivered.get(result.request_id)
                if delivered is None:  # cancelled: what the last step still produced is dropped
                    continue
                finished = result.is_finished()
                if finished:
                    del self._delivered[result.request_id]
                else:
                    self._delivered[result.request_id] = len(result.generated_tokens)
                outputs.append(EngineOutput(result.request_id, list(result.generated_tokens[delivered:]),
                                            finished, result.error))
        return outputs

    def kv_cache_blocks(self) -> int:
        allocators = self._manager.batch_processor.cache.cache_allocators.values()
        for _ in range(3):  # the generation thread may change a block table while it is read
            try:
                return sum(len(blocks) for allocator in allocators for blocks in list(allocator.block_table.values()))
            except RuntimeError:
                continue
        return 0

    def kv_cache_capacity_blocks(self) -> int:
        return sum(allocator.num_blocks for allocator in self._manager.batch_processor.cache.cache_allocators.values())

    def shutdown(self) -> None:
        self._manager.stop(block=True, timeout=30)

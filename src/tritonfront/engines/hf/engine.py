"""The hf engine: transformers' continuous batching (paged KV cache, in-flight
batching, chunked prefill) running in a background thread of this model instance.

Sampling is per request inside the shared batch, by the logits processors of engines/hf/sampling.py
(seeded Gumbel-max draws, penalties, bans, guides, log probs); this module runs the manager, feeds
it requests and hands out what it generates.
"""
import math
import threading
from pathlib import Path
from typing import Optional, Sequence

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.model_runner import infer_max_single_request_tokens

from ... import threads
from . import varlen_attention
from ..base import ATTENTIONS, DTYPES, ENGINE_THREAD_NAME, Engine, EngineConfig, EngineOutput, SamplingParams
from ..guided import GuideCompiler, check_guide
from .sampling import PerRequestSampling, RequestFeatures, sampling_kwargs

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PAGE_TOKENS = 256  # KV cache page: kv_cache_tokens is rounded up to whole pages


def eos_token_ids(model) -> set[int]:
    ids = set()
    for source in (model.generation_config, model.config.get_text_config()):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return {int(i) for i in ids if i is not None and i >= 0}


class HFEngine(Engine):
    gives_top_log_probs = True  # RequestFeatures records them from the processed scores

    def __init__(self, model, config: EngineConfig, tokenizer_dir: Optional[Path] = None):
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
            # Requests with features are prepared from their tokens before each step and record the
            # chosen token after it, in Python: a replayed CUDA graph would skip that work, and
            # asynchronous batching prepares a step before the previous one's tokens are known.
            use_cuda_graph=False,
            use_async_batching=False,
        )
        self._manager = model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, eos_token_id=sorted(self.eos_token_ids)),
            continuous_batching_config=cb_config,
        )
        # Requests that need more than temperature, top-k, top-p and noise: request id -> RequestFeatures.
        self._features: dict[str, RequestFeatures] = {}
        self._manager.logit_processor = PerRequestSampling(self._features, self.vocab_size, config.max_num_seqs)
        self._guides = GuideCompiler(tokenizer_dir, self.vocab_size, self.eos_token_ids) if tokenizer_dir else None
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
        engine = cls(cls._load(model_dir, device, config), config, tokenizer_dir=model_dir)
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

    def check_params(self, params: SamplingParams) -> None:
        check_guide(self._guides, params.guided_decoding)

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        eos = set(self.eos_token_ids) | ({params.end_id} if params.end_id is not None else set())
        features = None
        if RequestFeatures.wanted(params):
            if params.guided_decoding is not None:
                self.check_params(params)
                matcher = self._guides.matcher(params.guided_decoding)
            else:
                matcher = None
            features = RequestFeatures(len(prompt_ids), params, eos, matcher)
        with self._lock:
            self._delivered[request_id] = 0
            if features is not None:
                self._features[request_id] = features
        added = self._manager.add_request([int(i) for i in prompt_ids], request_id=request_id,
                                          max_new_tokens=params.max_tokens, streaming=True,
                                          eos_token_id=sorted(eos), **sampling_kwargs(params))
        if added is None:
            with self._lock:
                self._delivered.pop(request_id, None)
                self._features.pop(request_id, None)
            raise RuntimeError("the transformers engine is not accepting requests (stopped or failed)")

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._features.pop(request_id, None)
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
        outputs, broken = [], []
        with self._lock:
            for result in results:
                delivered = self._delivered.get(result.request_id)
                if delivered is None:  # cancelled: what the last step still produced is dropped
                    continue
                finished = result.is_finished()
                new = list(result.generated_tokens[delivered:])
                output = EngineOutput(result.request_id, new, finished, result.error)
                features = self._features.get(result.request_id)
                if features is not None:
                    if features.error is not None and not finished:
                        output = EngineOutput(result.request_id, [], True, features.error)
                        broken.append(result.request_id)
                    elif features.log_probs is not None:
                        end = delivered + len(new)
                        output.log_probs = features.log_probs[delivered:end]
                        if features.top_logprobs:
                            output.top_log_probs = features.top_log_probs[delivered:end]
                if output.finished:
                    del self._delivered[result.request_id]
                    self._features.pop(result.request_id, None)
                else:
                    self._delivered[result.request_id] = len(result.generated_tokens)
                outputs.append(output)
        for request_id in broken:
            self._manager.cancel_request(request_id)
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

    def kv_cache_block_tokens(self) -> int:
        return PAGE_TOKENS

    def shutdown(self) -> None:
        self._manager.stop(block=True, timeout=30)

"""TensorRT-LLM through its LLM API (in-flight batching, paged KV cache, its own kernels) for
GPU deployments: the `llm` model's parameter engine: "tensorrt_llm", on KIND_GPU instances.

NOT VERIFIED: TensorRT-LLM cannot be installed or run where this project is built and tested.
This follows the documented API: tensorrt_llm.LLM(model=..., skip_tokenizer_init=True, ...),
tensorrt_llm.SamplingParams, LLM.generate_async(token_ids, sampling_params, streaming=True)
returning a result that is async-iterable, whose outputs[0].token_ids_diff holds the new ids and
outputs[0].finish_reason the end reason, and result.abort(). The results are consumed on an
asyncio loop in a thread of their own, as generate_async expects to run inside an event loop.
"""
import asyncio
import json
import os
import queue
import threading
from pathlib import Path
from typing import Sequence

from .base import Engine, EngineConfig, EngineOutput, SamplingParams


def _model_facts(model_dir: Path) -> tuple[int, int, set[int]]:
    """(context length, vocabulary size, EOS ids) from a Hugging Face folder."""
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    eos = set()
    for source in (model_dir / "generation_config.json", model_dir / "config.json"):
        if source.exists():
            value = json.loads(source.read_text()).get("eos_token_id")
            eos.update([value] if isinstance(value, int) else (value or []))
    return int(config["max_position_embeddings"]), int(config["vocab_size"]), {int(i) for i in eos if i >= 0}


class TensorRTLLMEngine(Engine):
    def __init__(self, llm, context_length: int, vocab_size: int, eos_token_ids: set[int]):
        self._llm = llm
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self._outputs: queue.Queue = queue.Queue()
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._results: dict = {}  # request id -> running result; touched only on the loop's thread
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tensorrt-llm-results", daemon=True)
        self._thread.start()

    @classmethod
    def from_folder(cls, model_dir: Path, device: str, config: EngineConfig) -> "TensorRTLLMEngine":
        if not device.startswith("cuda"):
            raise ValueError("engine tensorrt_llm needs a GPU instance (instance_group kind: KIND_GPU)")
        # Each Triton instance is a process with its own engine: show it only its own GPU, before
        # TensorRT-LLM (or its worker processes) initialise CUDA.
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi import KvCacheConfig

        context_length, vocab_size, eos = _model_facts(model_dir)
        kv_cache = KvCacheConfig(max_tokens=config.kv_cache_tokens or None)
        llm = LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=config.dtype,
                  max_batch_size=config.max_num_seqs, max_num_tokens=config.max_batch_tokens,
                  max_seq_len=context_length, kv_cache_config=kv_cache)
        if config.kv_cache_tokens:
            context_length = min(context_length, config.kv_cache_tokens)
        return cls(llm, context_length, vocab_size, eos)

    def _sampling(self, params: SamplingParams):
        from tensorrt_llm import SamplingParams as TRTSamplingParams

        eos = sorted(self.eos_token_ids)
        end_id = params.end_id if params.end_id is not None else (eos[0] if eos else None)
        options = dict(max_tokens=params.max_tokens, end_id=end_id, pad_id=end_id, detokenize=False,
                       stop_token_ids=[i for i in eos if i != end_id] or None)
        if not params.greedy:  # all of temperature, top_k and top_p unset is TensorRT-LLM's greedy
            options.update(temperature=params.effective_temperature, top_k=params.top_k or None,
                           top_p=params.top_p, seed=params.random_seed)
        return TRTSamplingParams(**options)

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        sampling = self._sampling(params)
        with self._lock:
            self._live.add(request_id)
        asyncio.run_coroutine_threadsafe(self._generate(request_id, [int(i) for i in prompt_ids], sampling), self._loop)

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling) -> None:
        with self._lock:
            if request_id not in self._live:  # cancelled before it started
                return
        try:
            result = self._llm.generate_async(prompt_ids, sampling_params=sampling, streaming=True)
            self._results[request_id] = result
            async for output in result:
                completion = output.outputs[0]
                self._outputs.put(EngineOutput(request_id, list(completion.token_ids_diff), output.finished,
                                               finish_reason=completion.finish_reason if output.finished else None))
        except Exception as error:
            self._outputs.put(EngineOutput(request_id, [], True, error=f"{type(error).__name__}: {error}"))
        finally:
            self._results.pop(request_id, None)

    def _abort(self, request_id: str) -> None:
        # Runs on the loop after _generate registered the result (registration happens before
        # its first await), or after the request already ended.
        result = self._results.get(request_id)
        if result is not None:
            result.abort()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id not in self._live:
                return
            self._live.discard(request_id)
        self._loop.call_soon_threadsafe(self._abort, request_id)

    def outputs(self, timeout: float) -> list[EngineOutput]:
        if not self._thread.is_alive():
            raise RuntimeError("the TensorRT-LLM result thread is not running")
        try:
            pending = [self._outputs.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                pending.append(self._outputs.get_nowait())
            except queue.Empty:
                break
        outputs = []
        with self._lock:
            for output in pending:
                if output.request_id in self._live:  # an aborted request's last outputs are dropped
                    outputs.append(output)
                    if output.finished:
                        self._live.discard(output.request_id)
        return outputs

    def shutdown(self) -> None:
        self._llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

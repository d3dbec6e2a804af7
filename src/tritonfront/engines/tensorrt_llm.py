"""TensorRT-LLM through its LLM API (in-flight batching, paged KV cache, its own kernels) for
GPU deployments: the `llm` model's parameter engine: "tensorrt_llm", on KIND_GPU instances.

NOT VERIFIED: TensorRT-LLM cannot be installed or run where this project is built and tested.
This follows the documented API: tensorrt_llm.LLM(model=..., guided_decoding_backend="xgrammar", ...),
tensorrt_llm.SamplingParams (min_tokens, repetition/presence/frequency_penalty, bad_token_ids,
logprobs, guided_decoding=tensorrt_llm.sampling_params.GuidedDecodingParams), LLM.generate_async(
token_ids, sampling_params, streaming=True) returning a result that is async-iterable, whose
outputs[0].token_ids_diff holds the new ids, outputs[0].logprobs_diff their log probs (floats, or
{token id: Logprob} per token in newer releases) and outputs[0].finish_reason the end reason, and
result.abort(). The results are consumed on an asyncio loop in a thread of their own, as
generate_async expects to run inside an event loop.

TensorRT-LLM applies the sampling features itself; this adapter only maps them. What its LLM API
cannot take is refused by check_params: bad words longer than one token (the API bans sequences
only as text, which it would tokenize itself). Guides are compiled here too, with xgrammar as
TensorRT-LLM does, so a malformed one is the client's INVALID_ARG before it reaches the engine.
"""
import asyncio
import json
import os
import queue
import threading
from pathlib import Path
from typing import Optional, Sequence

from ..errors import InvalidInput
from .base import Engine, EngineConfig, EngineOutput, SamplingParams
from .guided import GuideCompiler


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


def _guided_decoding_params(guided):
    from tensorrt_llm.sampling_params import GuidedDecodingParams

    if guided.guide_type == "json":
        return GuidedDecodingParams(json_object=True)
    if guided.guide_type == "json_schema":
        return GuidedDecodingParams(json=guided.guide)
    if guided.guide_type == "regex":
        return GuidedDecodingParams(regex=guided.guide)
    return GuidedDecodingParams(grammar=guided.guide)


def _attach_log_probs(output: EngineOutput, per_token: Sequence, top_logprobs: int) -> None:
    """TensorRT-LLM's log probs of the new tokens into the output: a float per token, or (newer
    releases) a {token id: Logprob(logprob, rank)} per token holding the chosen token and the top
    alternatives."""
    for token, entry in zip(output.token_ids, per_token):
        if isinstance(entry, dict):
            output.log_probs.append(float(entry[token].logprob))
            if top_logprobs:
                ranked = sorted(entry.items(), key=lambda item: -item[1].logprob)[:top_logprobs]
                output.top_log_probs.append([(int(t), float(p.logprob)) for t, p in ranked])
        else:
            output.log_probs.append(float(entry))


class TensorRTLLMEngine(Engine):
    def __init__(self, llm, context_length: int, vocab_size: int, eos_token_ids: set[int],
                 tokenizer_dir: Optional[Path] = None):
        self._llm = llm
        self._guides = GuideCompiler(tokenizer_dir, vocab_size, eos_token_ids) if tokenizer_dir else None
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
        # The tokenizer is loaded (prompts still arrive as ids, outputs leave as ids) because
        # TensorRT-LLM builds its xgrammar vocabulary for guided decoding from it.
        llm = LLM(model=str(model_dir), dtype=config.dtype, guided_decoding_backend="xgrammar",
                  max_batch_size=config.max_num_seqs, max_num_tokens=config.max_batch_tokens,
                  max_seq_len=context_length, kv_cache_config=kv_cache)
        if config.kv_cache_tokens:
            context_length = min(context_length, config.kv_cache_tokens)
        return cls(llm, context_length, vocab_size, eos, tokenizer_dir=model_dir)

    def check_params(self, params: SamplingParams) -> None:
        longer = [i for i, word in enumerate(params.bad_words) if len(word) > 1]
        if longer:
            raise InvalidInput(f"bad_words[{longer[0]}]", "the tensorrt_llm engine bans single tokens only: "
                                                          "TensorRT-LLM's LLM API takes longer bad words as text")
        if params.guided_decoding is not None:
            if self._guides is None:
                raise InvalidInput("guided_decoding_guide_type", "this engine was started without a tokenizer "
                                                                 "folder, which guided decoding needs")
            self._guides.compile(params.guided_decoding)

    def _sampling(self, params: SamplingParams):
        from tensorrt_llm import SamplingParams as TRTSamplingParams

        eos = sorted(self.eos_token_ids)
        end_id = params.end_id if params.end_id is not None else (eos[0] if eos else None)
        options = dict(max_tokens=params.max_tokens, end_id=end_id, pad_id=end_id, detokenize=False,
                       stop_token_ids=[i for i in eos if i != end_id] or None)
        if not params.greedy:  # all of temperature, top_k and top_p unset is TensorRT-LLM's greedy
            options.update(temperature=params.effective_temperature, top_k=params.top_k or None,
                           top_p=params.top_p, seed=params.random_seed)
        # Unset fields stay None: TensorRT-LLM's own defaults are the neutral values.
        if params.min_tokens:
            options["min_tokens"] = params.min_tokens
        if params.repetition_penalty != 1.0:
            options["repetition_penalty"] = params.repetition_penalty
        if params.presence_penalty:
            options["presence_penalty"] = params.presence_penalty
        if params.frequency_penalty:
            options["frequency_penalty"] = params.frequency_penalty
        if params.bad_words:
            options["bad_token_ids"] = [word[0] for word in params.bad_words]
        if params.wants_log_probs:
            options["logprobs"] = max(1, params.top_logprobs)
        if params.guided_decoding is not None:
            options["guided_decoding"] = _guided_decoding_params(params.guided_decoding)
        return TRTSamplingParams(**options)

    def add(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        sampling = self._sampling(params)
        with self._lock:
            self._live.add(request_id)
        asyncio.run_coroutine_threadsafe(self._generate(request_id, [int(i) for i in prompt_ids], sampling,
                                                        params.wants_log_probs, params.top_logprobs), self._loop)

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling, log_probs: bool = False,
                        top_logprobs: int = 0) -> None:
        with self._lock:
            if request_id not in self._live:  # cancelled before it started
                return
        try:
            result = self._llm.generate_async(prompt_ids, sampling_params=sampling, streaming=True)
            self._results[request_id] = result
            async for output in result:
                completion = output.outputs[0]
                engine_output = EngineOutput(request_id, list(completion.token_ids_diff), output.finished,
                                             finish_reason=completion.finish_reason if output.finished else None)
                if log_probs:
                    _attach_log_probs(engine_output, completion.logprobs_diff, top_logprobs)
                self._outputs.put(engine_output)
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

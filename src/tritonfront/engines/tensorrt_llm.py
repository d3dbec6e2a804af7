"""TensorRT-LLM through its LLM API (in-flight batching, paged KV cache, its own kernels) for
GPU deployments: the `llm` model's parameter engine: "tensorrt_llm", on KIND_GPU instances.

NOT RUN HERE: TensorRT-LLM cannot be installed or run where this project is built and tested. Every
name used below is in tensorrt_llm_api.json, transcribed from TensorRT-LLM's sources
(tests/unit/test_tensorrt_llm_api.py fails on a name outside it; scripts/verify_gpu.sh checks the
manifest against an installed TensorRT-LLM). What a release line does with a request is in
tensorrt_llm_releases.py, read once at start-up from tensorrt_llm.__version__; what changed inside a
line (processed log probs, a cap on log probs) is detected in the installed package itself
(tensorrt_llm_releases.detect_features), and every SamplingParams field this adapter passes is
checked there before the engine starts.

The LLM takes prompts as ids and a Hugging Face folder; prefill is chunked (enable_chunked_prefill)
with max_num_tokens as the chunk budget of one forward pass, so a prompt longer than that budget is
prefilled over several steps instead of refused. generate_async(ids, sampling_params=...,
streaming=True) returns a result that is async-iterable; outputs[0].token_ids_diff holds the new ids,
outputs[0].logprobs_diff one {token id: Logprob} per new token and outputs[0].finish_reason the end
reason; result.abort() cancels. The results are consumed on an asyncio loop in a thread of their
own, as generate_async expects to run inside an event loop.

TensorRT-LLM applies the sampling features itself; this adapter only maps them, and refuses by name
(check_params) what the release line's sampler would not apply. Guides are compiled here too, with
xgrammar as TensorRT-LLM does, so a malformed one is the client's INVALID_ARG before it reaches
the engine.
"""
import asyncio
import dataclasses
import json
import os
import queue
import threading
from pathlib import Path
from typing import Optional, Sequence

from ..errors import InvalidInput
from .base import Engine, EngineConfig, EngineOutput, SamplingParams
from .guided import GuideCompiler, check_guide
from .tensorrt_llm_releases import (PROCESSED_LOGPROBS, RAW_LOGPROBS, Features, ReleaseLine, detect_features,
                                    release_line)

# Every SamplingParams field _sampling may pass, but logprobs_mode (passed where the release has it:
# Features.logprobs_mode). Checked against the installed SamplingParams before the engine starts, so a
# release candidate without one fails loading, naming it, instead of failing each request using it.
SAMPLING_FIELDS = ("max_tokens", "end_id", "pad_id", "detokenize", "stop_token_ids", "temperature", "top_k", "top_p",
                   "min_tokens", "logprobs", "guided_decoding")


def check_sampling_fields(sampling_params_class, version: str) -> None:
    """Raises RuntimeError naming the fields this adapter passes that the installed SamplingParams lacks."""
    fields = {field.name for field in dataclasses.fields(sampling_params_class) if field.init}
    missing = [name for name in SAMPLING_FIELDS if name not in fields]
    if missing:
        raise RuntimeError(f"engine tensorrt_llm: TensorRT-LLM {version}'s SamplingParams has no {', '.join(missing)}, "
                           f"which this adapter passes (docs/tensorrt_llm.md)")


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


def _attach_log_probs(engine_output: EngineOutput, per_token: Sequence[dict], top_logprobs: int) -> None:
    """TensorRT-LLM's log probs of the new tokens into the output: one {token id: Logprob} per token,
    holding the top tokens of the step. The sampled token can be missing from it (the adapter asks
    for enough of them that it should not be, see _sampling): then this raises instead of reporting
    a wrong number."""
    for token, entry in zip(engine_output.token_ids, per_token):
        chosen = entry.get(token)
        if chosen is None:
            raise RuntimeError(f"TensorRT-LLM returned no log probability for the generated token {token} "
                               f"(it returned {len(entry)} of the step's most likely tokens)")
        engine_output.log_probs.append(float(chosen.logprob))
        if top_logprobs:
            ranked = sorted(((logprob.logprob, t) for t, logprob in entry.items()), reverse=True)[:top_logprobs]
            engine_output.top_log_probs.append([(int(t), float(value)) for value, t in ranked])


# Whether a request asks for a feature, by the project's input name (ReleaseLine.unapplied's keys).
_ASKS_FOR = {
    "repetition_penalty": lambda params: params.repetition_penalty != 1.0,
    "presence_penalty": lambda params: params.presence_penalty != 0.0,
    "frequency_penalty": lambda params: params.frequency_penalty != 0.0,
    "bad_words": lambda params: bool(params.bad_words),
    # A greedy request draws nothing at random: its seed changes nothing, whichever sampler runs it.
    "random_seed": lambda params: params.random_seed is not None and not params.greedy,
}


class TensorRTLLMEngine(Engine):
    def __init__(self, llm, release: ReleaseLine, features: Features, logprob_modes: dict, context_length: int,
                 vocab_size: int, eos_token_ids: set[int], tokenizer_dir: Optional[Path] = None, version: str = ""):
        self._llm = llm
        self._release = release
        self._features = features
        # tensorrt_llm's LogprobMode members by name (RAW_LOGPROBS, PROCESSED_LOGPROBS); empty where the
        # release has none (features.logprobs_mode).
        self._logprob_modes = logprob_modes
        self._version = version or release.checked_against
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
        import tensorrt_llm
        from tensorrt_llm import LLM, sampling_params
        from tensorrt_llm.llmapi import KvCacheConfig

        version = tensorrt_llm.__version__
        release = release_line(version)
        features = detect_features(sampling_params)
        check_sampling_fields(sampling_params.SamplingParams, version)
        modes = {}
        if features.logprobs_mode:
            modes = {name: sampling_params.LogprobMode[name] for name in (RAW_LOGPROBS, PROCESSED_LOGPROBS)}
        context_length, vocab_size, eos = _model_facts(model_dir)
        kv_cache = KvCacheConfig(max_tokens=config.kv_cache_tokens or None)
        # The tokenizer is loaded (prompts still arrive as ids, outputs leave as ids) because
        # TensorRT-LLM builds its xgrammar vocabulary for guided decoding from it.
        llm = LLM(model=str(model_dir), dtype=config.dtype, guided_decoding_backend="xgrammar",
                  max_batch_size=config.max_num_seqs, max_num_tokens=config.max_batch_tokens,
                  enable_chunked_prefill=True, max_seq_len=context_length, kv_cache_config=kv_cache,
                  sampler_type=release.sampler_type)
        if config.kv_cache_tokens:
            context_length = min(context_length, config.kv_cache_tokens)
        return cls(llm, release, features, modes, context_length, vocab_size, eos, tokenizer_dir=model_dir,
                   version=version)

    def check_params(self, params: SamplingParams) -> None:
        for name, reason in self._release.unapplied.items():
            if _ASKS_FOR[name](params):
                raise InvalidInput(name, f"the tensorrt_llm engine cannot honour it: {reason} "
                                         f"(TensorRT-LLM {self._version}; docs/tensorrt_llm.md)")
        log_probs_field = "return_log_probs" if params.return_log_probs else "top_logprobs"
        limit = self._features.logprobs_limit
        if params.wants_log_probs and not params.greedy:
            if not self._features.logprobs_mode:
                raise InvalidInput(log_probs_field, f"with sampling, the tensorrt_llm engine cannot give them: "
                                                    f"TensorRT-LLM {self._version} has no processed log probs "
                                                    f"(LogprobMode, NVIDIA/TensorRT-LLM#9675), only those of the "
                                                    f"model's raw distribution, not the one the token was drawn from")
            # A sampled token ranks within top_k, so asking for top_k log probs always includes it;
            # without top_k it can rank anywhere in the vocabulary.
            if self._release.sampled_logprob_in_top_k_only and not 1 <= params.top_k <= limit:
                raise InvalidInput(log_probs_field, f"with sampling, the tensorrt_llm engine needs top_k in 1..{limit} "
                                                    f"(got {params.top_k}): TensorRT-LLM {self._version} returns log "
                                                    f"probs of the step's most likely tokens only (at most {limit}), "
                                                    f"which must include the sampled one")
        if params.top_logprobs > limit:
            raise InvalidInput("top_logprobs", f"{params.top_logprobs} is over {limit}, the most TensorRT-LLM "
                                               f"{self._version} gives")
        if params.wants_log_probs and params.greedy and params.min_tokens:
            # A greedy request's log probs are the raw log-softmax (see _sampling), which is not shown to
            # include min_tokens' hold-back of end_id: the token chosen under it would get a wrong number.
            raise InvalidInput(log_probs_field, "with min_tokens, the tensorrt_llm engine cannot give a greedy "
                                                "request's log probs: TensorRT-LLM's raw log probs are not known to "
                                                "hold back end_id as min_tokens does (docs/tensorrt_llm.md)")
        if params.min_tokens and self._release.min_tokens_holds_end_id_only:
            others = sorted(self.eos_token_ids - {self._end_id(params)})
            if others:
                raise InvalidInput("min_tokens", f"the tensorrt_llm engine cannot honour it with end tokens {others} "
                                                 f"besides end_id: TensorRT-LLM {self._version} "
                                                 f"holds back only end_id before min_tokens")
        check_guide(self._guides, params.guided_decoding)

    def _end_id(self, params: SamplingParams) -> Optional[int]:
        """TensorRT-LLM's end_id of a request: the request's, else the model's first EOS id (the other
        EOS ids go as stop_token_ids)."""
        return params.end_id if params.end_id is not None else min(self.eos_token_ids, default=None)

    def _sampling(self, params: SamplingParams):
        """TensorRT-LLM's SamplingParams of a request that passed check_params."""
        from tensorrt_llm import SamplingParams as TRTSamplingParams

        end_id = self._end_id(params)
        options = dict(max_tokens=params.max_tokens, end_id=end_id, pad_id=end_id, detokenize=False,
                       stop_token_ids=sorted(self.eos_token_ids - {end_id}) or None)
        if not params.greedy:  # all of temperature, top_k and top_p unset is TensorRT-LLM's greedy
            options.update(temperature=params.effective_temperature, top_k=params.top_k or None,
                           top_p=params.top_p)
        # Unset fields stay None: TensorRT-LLM's own defaults are the neutral values.
        if params.min_tokens:
            options["min_tokens"] = params.min_tokens
        if params.wants_log_probs:
            # Greedy: the chosen token is the step's most likely. Sampled: it ranks within top_k.
            options["logprobs"] = max(1, params.top_logprobs, 0 if params.greedy else params.top_k)
            if self._logprob_modes:
                # Named, never left to a default. Greedy: RAW, the model's log-softmax (PROCESSED is
                # one-hot after greedy: 0.0 for the chosen token). Sampled: PROCESSED, the distribution
                # the token was drawn from. Without modes (a release before #9675) log probs are raw,
                # which check_params allows for greedy requests only.
                mode = RAW_LOGPROBS if params.greedy else PROCESSED_LOGPROBS
                options["logprobs_mode"] = self._logprob_modes[mode]
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
            async for step in result:  # the same result, updated in place each step
                completion = step.outputs[0]
                engine_output = EngineOutput(request_id, list(completion.token_ids_diff), step.finished,
                                             finish_reason=completion.finish_reason if step.finished else None)
                if log_probs:
                    _attach_log_probs(engine_output, completion.logprobs_diff, top_logprobs)
                self._outputs.put(engine_output)
        except Exception as error:
            result = self._results.get(request_id)
            if result is not None and not result.finished:  # the request fails here: stop generating it
                result.abort()
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

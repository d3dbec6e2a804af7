"""A fake `tensorrt_llm` package built from the adapter's API manifest
(src/tritonfront/engines/tensorrt_llm_api.json), for unit tests of the TensorRT-LLM adapter
where TensorRT-LLM cannot be installed.

It accepts exactly the names the manifest lists (a keyword or attribute outside it raises, as the
real API would) and behaves as TensorRT-LLM 1.2 does where the adapter depends on it:
- without enable_chunked_prefill, generate_async refuses a prompt longer than max_num_tokens
  (TorchLlmArgs.enable_chunked_prefill; llm.py's prompt length check);
- each generated token's log probs are a {token id: Logprob} of the step's top `logprobs` tokens
  only, so the sampled token is missing when it ranks lower; their values are the raw distribution
  unless logprobs_mode is LogprobMode.PROCESSED;
- the release line's TorchSampler would silently ignore what tensorrt_llm_releases.py lists as
  unapplied: the fake raises instead, so a test catches the adapter passing one on.
"""
import asyncio
import enum
import json
import types
from dataclasses import dataclass, field
from pathlib import Path

from tritonfront.engines.tensorrt_llm_releases import RELEASE_LINES

MANIFEST = json.loads((Path(__file__).resolve().parents[2] / "src" / "tritonfront" / "engines"
                       / "tensorrt_llm_api.json").read_text())
OBJECTS = MANIFEST["objects"]
VERSION = MANIFEST["release"]

# SamplingParams fields behind the project's inputs that 1.2's TorchSampler ignores (the keys of
# ReleaseLine.unapplied are the project's names).
_SAMPLER_FIELDS = {"repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                   "frequency_penalty": "frequency_penalty", "bad_words": "bad_token_ids", "random_seed": "seed"}


class IgnoredBySampler(AssertionError):
    """The adapter passed a field the release line's sampler would silently ignore."""


def _check_keywords(object_name: str, kwargs: dict) -> None:
    spec = OBJECTS[object_name]
    unknown = sorted(set(kwargs) - set(spec["init"]))
    if unknown:
        raise TypeError(f"{object_name}.__init__() got an unexpected keyword argument {unknown[0]!r}")
    for name, allowed in spec.get("values", {}).items():
        if kwargs.get(name) is not None and kwargs[name] not in allowed:
            raise ValueError(f"{object_name}.{name}={kwargs[name]!r} is not one of {allowed}")


class _Params:
    """A parameter class of the manifest: keyword arguments only, fields default to None."""
    object_name = ""

    def __init__(self, **kwargs):
        _check_keywords(self.object_name, kwargs)
        self.kwargs = kwargs

    def __getattr__(self, name):
        if name in OBJECTS[self.object_name]["init"]:
            return self.kwargs.get(name)
        raise AttributeError(f"{self.object_name} has no attribute {name!r}")


class SamplingParams(_Params):
    object_name = "SamplingParams"


class GuidedDecodingParams(_Params):
    object_name = "GuidedDecodingParams"


class KvCacheConfig(_Params):
    object_name = "KvCacheConfig"


# Values made up: the adapter must use the members by name (their values were not in the sources read).
LogprobMode = enum.Enum("LogprobMode", {name: f"fake-{name.lower()}" for name in OBJECTS["LogprobMode"]["members"]})


def _restricted(object_name: str):
    """A class whose instances have exactly the manifest's attributes of `object_name`."""
    return type(object_name, (), {"__slots__": tuple(f"_{a}" for a in OBJECTS[object_name]["attributes"]),
                                  "__getattr__": _manifest_getattr, "_object_name": object_name})


def _manifest_getattr(self, name):
    if name in OBJECTS[self._object_name]["attributes"]:
        return object.__getattribute__(self, f"_{name}")
    raise AttributeError(f"{self._object_name} has no attribute {name!r}")


class Logprob(_restricted("Logprob")):
    def __init__(self, logprob: float, rank: int):
        self._logprob, self._rank = logprob, rank


@dataclass
class Token:
    """One generated token of a script: its id and the step's distribution as {token id: log prob},
    processed (what the token was drawn from) and raw (the model's own; default: processed - 1, so
    the two cannot be confused)."""
    token_id: int
    processed: dict = field(default_factory=dict)
    raw: dict = None

    def logprobs(self, mode) -> dict:
        if mode == LogprobMode.PROCESSED:
            return self.processed
        return self.raw if self.raw is not None else {t: v - 1.0 for t, v in self.processed.items()}


class CompletionOutput(_restricted("CompletionOutput")):
    def __init__(self):
        self._token_ids, self._logprobs, self._finish_reason = [], [], None
        self._seen_tokens = self._seen_logprobs = 0

    __slots__ = ("_seen_tokens", "_seen_logprobs")

    @property
    def token_ids_diff(self):
        return self._token_ids[self._seen_tokens:]

    @property
    def logprobs_diff(self):
        return self._logprobs[self._seen_logprobs:]


class GenerationResult(_restricted("GenerationResult")):
    __slots__ = ("_script", "_sampling", "_step_seconds")

    def __init__(self, script: list, sampling: SamplingParams, step_seconds: float = 0.0):
        self._script, self._sampling, self._step_seconds = script, sampling, step_seconds
        self._outputs, self._finished, self._aborted = [CompletionOutput()], False, False

    def abort(self):
        self._aborted = True

    def aborted(self):
        return self._aborted

    def __aiter__(self):
        return self._steps()

    async def _steps(self):
        """Updates this result in place per scripted step (a list of Token, the last one ending the
        request with its finish reason), as TensorRT-LLM's result does, and yields it."""
        completion = self._outputs[0]
        for index, (tokens, finish_reason) in enumerate(self._script):
            await asyncio.sleep(self._step_seconds)
            if self._aborted:
                return
            completion._seen_tokens, completion._seen_logprobs = len(completion._token_ids), len(completion._logprobs)
            completion._token_ids.extend(token.token_id for token in tokens)
            if self._sampling.logprobs is not None:
                for token in tokens:
                    ranked = sorted(token.logprobs(self._sampling.logprobs_mode).items(), key=lambda item: -item[1])
                    completion._logprobs.append({t: Logprob(v, rank) for rank, (t, v)
                                                 in enumerate(ranked[:self._sampling.logprobs], start=1)})
            self._finished = index == len(self._script) - 1
            completion._finish_reason = finish_reason if self._finished else None
            yield self


class LLM:
    """Records its arguments; `script` is what each request generates (see GenerationResult), one
    step per `step_seconds` (a test that must catch a request in flight paces it)."""
    __slots__ = ("kwargs", "requests", "script", "results", "closed", "step_seconds")

    def __init__(self, **kwargs):
        _check_keywords("LLM", kwargs)
        self.kwargs, self.requests, self.results, self.closed = kwargs, [], [], False
        self.script = [([Token(5)], "length")]
        self.step_seconds = 0.0

    def generate_async(self, inputs, sampling_params=None, streaming=False, **kwargs):
        unknown = set(kwargs) - set(OBJECTS["LLM"]["calls"]["generate_async"])
        if unknown:
            raise TypeError(f"generate_async() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        max_num_tokens = self.kwargs.get("max_num_tokens")
        if max_num_tokens and len(inputs) > max_num_tokens and not self.kwargs.get("enable_chunked_prefill"):
            raise ValueError(f"The sum of prompt length ({len(inputs)}) should not exceed max_num_tokens "
                             f"({max_num_tokens})")
        max_seq_len = self.kwargs.get("max_seq_len")
        if max_seq_len and len(inputs) + sampling_params.max_tokens > max_seq_len:
            raise ValueError(f"prompt ({len(inputs)}) + max_tokens ({sampling_params.max_tokens}) exceeds "
                             f"max_seq_len ({max_seq_len})")
        if self.kwargs.get("sampler_type") == "TorchSampler":
            unapplied = RELEASE_LINES[".".join(VERSION.split(".")[:2])].unapplied
            for name in unapplied:
                if getattr(sampling_params, _SAMPLER_FIELDS[name]) is not None:
                    raise IgnoredBySampler(f"TorchSampler would ignore {_SAMPLER_FIELDS[name]}: {unapplied[name]}")
        if sampling_params.logprobs is not None and not isinstance(sampling_params.logprobs_mode, LogprobMode):
            raise TypeError(f"logprobs_mode must be a LogprobMode, got {sampling_params.logprobs_mode!r}")
        self.requests.append((list(inputs), sampling_params, streaming))
        result = GenerationResult(self.script, sampling_params, self.step_seconds)
        self.results.append(result)
        return result

    def shutdown(self):
        self.closed = True

    def __getattr__(self, name):
        raise AttributeError(f"LLM has no attribute {name!r} in the manifest")


def modules(version: str = VERSION) -> dict:
    """{module name: module} of the fake package, for sys.modules."""
    package = types.ModuleType("tensorrt_llm")
    package.__version__, package.LLM, package.SamplingParams = version, LLM, SamplingParams
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.LLM, llmapi.KvCacheConfig, llmapi.SamplingParams = LLM, KvCacheConfig, SamplingParams
    sampling_params = types.ModuleType("tensorrt_llm.sampling_params")
    sampling_params.SamplingParams, sampling_params.GuidedDecodingParams = SamplingParams, GuidedDecodingParams
    sampling_params.LogprobMode = LogprobMode
    built = {"tensorrt_llm": package, "tensorrt_llm.llmapi": llmapi, "tensorrt_llm.sampling_params": sampling_params}
    for name, module in built.items():
        missing = set(vars(module)) - {"__name__", "__doc__", "__package__", "__loader__", "__spec__"} \
            - set(MANIFEST["modules"][name]["names"])
        if missing:
            raise RuntimeError(f"the fake {name} holds names the manifest lacks: {sorted(missing)}")
    return built

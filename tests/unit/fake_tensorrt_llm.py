"""A fake `tensorrt_llm` package built from the adapter's API manifest
(src/tritonfront/engines/tensorrt_llm_api.json), for unit tests of the TensorRT-LLM adapter
where TensorRT-LLM cannot be installed.

It accepts exactly the names the manifest lists (a keyword or attribute outside it raises, as the
real API would) and behaves as TensorRT-LLM 1.2 does where the adapter depends on it:
- without enable_chunked_prefill, generate_async refuses a prompt longer than max_num_tokens
  (TorchLlmArgs.enable_chunked_prefill; llm.py's prompt length check);
- each generated token's log probs are a {token id: Logprob} of the step's top `logprobs` tokens
  only, so the sampled token is missing when it ranks lower;
- the release line's TorchSampler would silently ignore what tensorrt_llm_releases.py lists as
  unapplied: the fake raises instead, so a test catches the adapter passing one on.
And it presents each branch of what changed inside the line (`modules(...)`, the manifest's
`optional` names):
- logprobs_mode (NVIDIA/TensorRT-LLM#9675): without it there is no LogprobMode and no such field, and
  log probs are the raw distribution; with it RAW (the default) is the raw one and PROCESSED the one
  the token was drawn from, which for a greedy request is one-hot (0.0 for the chosen token);
- max_top_logprobs (#13520): SamplingParams refuses logprobs above sampling_params.MAX_TOP_LOGPROBS.
`write_sources` writes such a package as source files, for the manifest checker
(tritonfront.engines.tensorrt_llm_api), which reads it from its sources or imports it.
"""
import asyncio
import dataclasses
import enum
import json
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

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


def sampling_params_class(logprobs_mode: bool = True, max_top_logprobs: Optional[int] = None) -> type:
    """SamplingParams as a branch has it: a keyword-only dataclass of the manifest's fields (plus
    logprobs_mode with #9675), refusing logprobs above max_top_logprobs (#13520); `kwargs` records
    what was passed."""
    names = OBJECTS["SamplingParams"]["init"] + (["logprobs_mode"] if logprobs_mode else [])
    base = dataclasses.make_dataclass("SamplingParams", [(name, object, dataclasses.field(default=None))
                                                         for name in names], kw_only=True)

    class SamplingParams(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)  # an unknown keyword: TypeError, as the real dataclass raises
            self.kwargs = kwargs
            if max_top_logprobs is not None and (self.logprobs or 0) > max_top_logprobs:
                raise ValueError(f"logprobs ({self.logprobs}) must be less than or equal to {max_top_logprobs}")

    return SamplingParams


SamplingParams = sampling_params_class()


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

    def logprobs(self, mode, greedy: bool) -> dict:
        if mode is not None and mode.name == "PROCESSED":
            if greedy:  # the distribution after greedy selection: one-hot
                return {t: 0.0 if t == self.token_id else float("-inf") for t in (self.processed or {self.token_id: 0})}
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
                sampling = self._sampling
                greedy = sampling.temperature is None and sampling.top_k is None and sampling.top_p is None
                for token in tokens:
                    mode = getattr(sampling, "logprobs_mode", None)
                    ranked = sorted(token.logprobs(mode, greedy).items(), key=lambda item: -item[1])
                    completion._logprobs.append({t: Logprob(v, rank) for rank, (t, v)
                                                 in enumerate(ranked[:self._sampling.logprobs], start=1)})
            self._finished = index == len(self._script) - 1
            completion._finish_reason = finish_reason if self._finished else None
            yield self


class LLM:
    """Records its arguments; `script` is what each request generates (see GenerationResult), one
    step per `step_seconds` (a test that must catch a request in flight paces it)."""
    __slots__ = ("kwargs", "requests", "script", "results", "closed", "step_seconds", "modes")
    logprob_modes = True  # whether the branch has LogprobMode (modules() sets it per branch)

    def __init__(self, **kwargs):
        _check_keywords("LLM", kwargs)
        self.kwargs, self.requests, self.results, self.closed = kwargs, [], [], False
        self.modes = type(self).logprob_modes
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
        if self.modes and sampling_params.logprobs is not None and not isinstance(sampling_params.logprobs_mode,
                                                                                   LogprobMode):
            # The adapter names the mode it wants where the release has modes, never its default.
            raise TypeError(f"logprobs_mode must be a LogprobMode, got {sampling_params.logprobs_mode!r}")
        self.requests.append((list(inputs), sampling_params, streaming))
        result = GenerationResult(self.script, sampling_params, self.step_seconds)
        self.results.append(result)
        return result

    def shutdown(self):
        self.closed = True

    def __getattr__(self, name):
        raise AttributeError(f"LLM has no attribute {name!r} in the manifest")


# The branches of the release line the tests run the adapter on: (logprobs_mode, max_top_logprobs).
BRANCHES = {"before #9675": (False, None), "#9675": (True, None), "#9675 and #13520": (True, 20)}


def modules(version: str = VERSION, logprobs_mode: bool = True, max_top_logprobs: Optional[int] = None) -> dict:
    """{module name: module} of the fake package as a branch has it (BRANCHES), for sys.modules."""
    sampling_class = sampling_params_class(logprobs_mode, max_top_logprobs)
    llm_class = type("LLM", (LLM,), {"__slots__": (), "logprob_modes": logprobs_mode})
    package = types.ModuleType("tensorrt_llm")
    package.__version__, package.LLM, package.SamplingParams = version, llm_class, sampling_class
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.LLM, llmapi.KvCacheConfig, llmapi.SamplingParams = llm_class, KvCacheConfig, sampling_class
    sampling_params = types.ModuleType("tensorrt_llm.sampling_params")
    sampling_params.SamplingParams, sampling_params.GuidedDecodingParams = sampling_class, GuidedDecodingParams
    if logprobs_mode:
        sampling_params.LogprobMode = LogprobMode
    if max_top_logprobs is not None:
        sampling_params.MAX_TOP_LOGPROBS = max_top_logprobs
    package.sampling_params = sampling_params
    built = {"tensorrt_llm": package, "tensorrt_llm.llmapi": llmapi, "tensorrt_llm.sampling_params": sampling_params}
    for name, module in built.items():
        spec = MANIFEST["modules"][name]
        missing = set(vars(module)) - {"__name__", "__doc__", "__package__", "__loader__", "__spec__"} \
            - set(spec["names"]) - set(spec.get("optional", {}))
        if missing:
            raise RuntimeError(f"the fake {name} holds names the manifest lacks: {sorted(missing)}")
    return built


def write_sources(root: Path, logprobs_mode: bool = True, max_top_logprobs: Optional[int] = None,
                  drop: tuple = (), version: str = VERSION) -> Path:
    """A tensorrt_llm package as source files under `root` (what site-packages holds), laid out as
    TensorRT-LLM's: LLM in llmapi/llm.py with generate_async on a base class, TorchLlmArgs (pydantic)
    in llmapi/llm_args.py with most fields on its base, SamplingParams a dataclass in
    sampling_params.py, results in executor/result.py. `drop`: manifest names left out ("object.name",
    e.g. "SamplingParams.max_tokens"; "LLM.generate_async.streaming"; a literal value,
    "LLM.sampler_type=TorchSampler"), as a renamed keyword would be. Importable (pydantic is
    installed)."""
    def kept(object_name: str, names) -> list:
        return [name for name in names if f"{object_name}.{name}" not in drop]

    package = root / "tensorrt_llm"
    for folder in (package / "llmapi", package / "executor"):
        folder.mkdir(parents=True, exist_ok=True)
    files = {
        "__init__.py": """
            from .version import __version__
            from .llmapi import LLM
            from .sampling_params import SamplingParams
            from . import sampling_params
            """,
        "version.py": f"__version__ = {version!r}\n",
        "llmapi/__init__.py": """
            from .llm import LLM
            from .llm_args import KvCacheConfig
            from ..sampling_params import SamplingParams
            """,
    }
    llm = OBJECTS["LLM"]
    parameters = ", ".join(f"{name}=None" for name in kept("LLM.generate_async", llm["calls"]["generate_async"]))
    methods = "".join(f"    def {name}(self, *args, **kwargs):\n        pass\n\n"
                      for name in kept("LLM", llm["attributes"]) if name != "generate_async")
    files["llmapi/llm.py"] = "class BaseLLM:\n" + (
        f"    def generate_async(self, {parameters}):\n        pass\n\n" if "LLM.generate_async" not in drop else "") \
        + methods + "\nclass LLM(BaseLLM):\n    pass\n"
    values = llm.get("values", {})
    fields = kept("LLM", llm["init"])
    torch_only = [name for name in fields if name in values]
    def field_line(name: str) -> str:
        if name in values and name != "dtype":
            admitted = [repr(value) for value in values[name] if f"LLM.{name}={value}" not in drop]
            return f"    {name}: Optional[Literal[{', '.join(admitted)}]] = None"
        return f"    {name}: Any = None"
    files["llmapi/llm_args.py"] = "\n".join([
        "from typing import Any, Literal, Optional", "from pydantic import BaseModel", "",
        "class StrictBaseModel(BaseModel):", "    pass", "",
        "class KvCacheConfig(StrictBaseModel):",
        *[f"    {name}: Any = None" for name in kept("KvCacheConfig", OBJECTS["KvCacheConfig"]["init"])], "",
        "class BaseLlmArgs(StrictBaseModel):", *[field_line(name) for name in fields if name not in torch_only], "",
        "class TorchLlmArgs(BaseLlmArgs):", *[field_line(name) for name in torch_only], ""])
    sampling = ["import enum", "from dataclasses import dataclass, field", "from typing import Any, Optional", ""]
    if max_top_logprobs is not None:
        sampling += [f"MAX_TOP_LOGPROBS = {max_top_logprobs}", ""]
    if logprobs_mode:
        sampling += ["class LogprobMode(str, enum.Enum):",
                     *[f"    {member} = {member.lower()!r}" for member in kept("LogprobMode", OBJECTS["LogprobMode"]["members"])],
                     ""]
    sampling += ["@dataclass(slots=True, kw_only=True)", "class GuidedDecodingParams:",
                 *[f"    {name}: Any = None" for name in kept("GuidedDecodingParams", OBJECTS["GuidedDecodingParams"]["init"])],
                 "", "@dataclass(slots=True, kw_only=True)", "class SamplingParams:",
                 "    _bad_word_ids: Optional[list] = field(default=None, init=False, repr=False)",
                 *[f"    {name}: Any = None" for name in kept("SamplingParams", OBJECTS["SamplingParams"]["init"])],
                 *(["    logprobs_mode: Any = None"] if logprobs_mode else []), ""]
    files["sampling_params.py"] = "\n".join(sampling)
    completion = kept("CompletionOutput", OBJECTS["CompletionOutput"]["attributes"])
    properties = [name for name in completion if name.endswith("_diff") or name == "length"]
    result_attributes = kept("GenerationResult", OBJECTS["GenerationResult"]["attributes"])
    files["executor/result.py"] = "\n".join([
        "from dataclasses import dataclass", "from typing import Any, NamedTuple, Optional", "",
        "class Logprob(NamedTuple):", *[f"    {name}: Any = None" for name in kept("Logprob", OBJECTS["Logprob"]["attributes"])],
        "", "@dataclass(slots=True)", "class CompletionOutput:",
        *[f"    {name}: Any = None" for name in completion if name not in properties],
        *[f"    @property\n    def {name}(self):\n        return None" for name in properties], "",
        "class GenerationResultBase:", "    def __init__(self):",
        *[f"        self.{name} = None" for name in result_attributes if name in ("id", "outputs", "context_logits")],
        "        pass", "",
        "class GenerationResult(GenerationResultBase):",
        *[f"    def {name}(self):\n        return None" for name in result_attributes
          if name not in ("id", "outputs", "context_logits")], "    pass", ""])
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    return root

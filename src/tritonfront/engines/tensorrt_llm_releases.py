"""What each TensorRT-LLM release line the `tensorrt_llm` engine supports does with what the adapter
asks of it, written down once. The adapter (engines/tensorrt_llm.py) takes its decisions from here;
the names it uses are in tensorrt_llm_api.json; docs/tensorrt_llm.md explains both and says what
a GPU still has to confirm (scripts/verify_gpu.sh).

How these facts were read (no release of TensorRT-LLM can be installed or run where the project is
built): the 1.2 line's pin is the one NVIDIA's own Triton build uses, triton-inference-server/
tensorrtllm_backend commit 8addf2fdc58ac63cc6bfceded34e0960d241791f ("Update Dockerfile", #853:
TENSORRTLLM_REPO_TAG=release/1.2.1, TENSORRTLLM_VER=1.2.1) whose `tensorrt_llm` submodule is NVIDIA/
TensorRT-LLM 2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d. The TensorRT-LLM repository is too large to
mirror here (2.5 GB), so the text at that commit was not read line by line; each fact below names
where it was read instead.
"""
import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping, Optional

# The most log probabilities asked of TensorRT-LLM per generated token. A sampled request's log
# probs need `logprobs` >= its top_k (see ReleaseLine.sampled_logprob_in_top_k_only), so this also
# bounds top_k for such requests: it keeps each streamed {token id: Logprob} dict small. A release
# that refuses more (Features.max_logprobs) lowers it.
MAX_LOGPROBS_PER_TOKEN = 100


@dataclass(frozen=True)
class ReleaseLine:
    line: str  # "major.minor", matched against tensorrt_llm.__version__
    checked_against: str  # the release these facts were read for
    # LLM(sampler_type=...): one sampler for every request of an engine (an LLM argument, not a
    # request's). Named explicitly so that a changed default cannot change what a request gets.
    # (1.2's TRTLLMSampler would apply penalties, bad ids and seeds through the C++ decoder, but gives
    # each token's log prob alone, {sampled token: Logprob(rank=1)}: no top_logprobs; 1.3 deprecates it.)
    sampler_type: str
    # Request features (the project's input names) that sampler does not apply, with why. The
    # adapter refuses a request asking for one (Engine.check_params) instead of passing it on to be
    # silently ignored.
    unapplied: Mapping[str, str]
    # Each generated token's {token id: Logprob} holds the top `logprobs` tokens of the step only: the
    # sampled token is in it only when it ranks among them.
    sampled_logprob_in_top_k_only: bool
    # min_tokens holds back end_id only: any other stop token id (a model's second EOS) still ends the
    # request before min_tokens.
    min_tokens_holds_end_id_only: bool
    sources: tuple[str, ...]


RELEASE_LINES = {
    "1.2": ReleaseLine(
        line="1.2",
        checked_against="1.2.1",
        sampler_type="TorchSampler",
        unapplied={
            "repetition_penalty": "TensorRT-LLM 1.2's TorchSampler applies no penalties",
            "presence_penalty": "TensorRT-LLM 1.2's TorchSampler applies no penalties",
            "frequency_penalty": "TensorRT-LLM 1.2's TorchSampler applies no penalties",
            "bad_words": "TensorRT-LLM 1.2's TorchSampler does not ban token ids (bad_token_ids)",
            "random_seed": "TensorRT-LLM 1.2's TorchSampler does not seed a request's sampling",
        },
        sampled_logprob_in_top_k_only=True,
        min_tokens_holds_end_id_only=True,
        sources=(
            # TorchSampler._process_requests: embedding bias, _apply_min_length_penalty (end_id only),
            # top-k log probs of log_softmax(logits) with k = logprobs (the sampled token not added),
            # then sampling by strategy from temperature, top_k, top_p alone
            # (_request_get_sampling_params) with one generator for every request: no penalties, no
            # bad token ids, no per-request seed. Read at this commit of main from late 2025, before
            # #9675 below; the feature tables of the docs agree for 1.2 (penalties appear in 1.3).
            "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/sampler.py @ 00026bd121addd9ee5650a7da9fee6b57db79a6f",
            # sampler_type "auto" = TorchSampler unless beam search.
            "https://nvidia.github.io/TensorRT-LLM/features/sampling.html (1.2 text, PR NVIDIA/TensorRT-LLM#10083) "
            "and https://nvidia.github.io/TensorRT-LLM/1.3.0rc24/features/sampling.html",
            # What varies inside the line is detected, not read from here: detect_features.
            # {token id: Logprob} built from the top-k; 'always include sampled logprob' not merged for 1.2.
            "NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py @ 005bc848893f575ec14b45d6b13139360d67c790 "
            "(LogprobResults = list[dict[int, Logprob]]); NVIDIA/TensorRT-LLM#9374 (closed unmerged)",
            # enable_chunked_prefill=False by default: a prompt over max_num_tokens is refused.
            "https://nvidia.github.io/TensorRT-LLM/llm-api/reference/TorchLlmArgs.html",
            "triton-inference-server/tensorrtllm_backend@8addf2fdc58ac63cc6bfceded34e0960d241791f "
            "(release/1.2.1 -> NVIDIA/TensorRT-LLM@2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d)",
        ),
    ),
}


# A release, or a release candidate of one: major.minor.patch[rcN], then an optional local part
# (+...). Development builds (.devN, snapshots of main) are not placed in a line: what they hold of
# it cannot be told from their version.
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?(?:\.post\d+)?(?:\+[\w.]+)?$")


def release_line(version: str) -> ReleaseLine:
    """The supported line of an installed TensorRT-LLM (`tensorrt_llm.__version__`), or ValueError
    naming the version and the supported lines.

    Release candidates of a line (1.2.0rc2 ... rc8) are accepted on purpose: the facts above hold
    for the whole line (TorchSampler applied penalties, bad ids and seeds only after 1.2 was cut), and
    what changed between its candidates is detected at start (detect_features), not assumed, while
    every other name the adapter passes is checked against the installed package before the engine
    starts (tensorrt_llm_api.check_imported), so a candidate that lacks one fails loading, naming it."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"engine tensorrt_llm: TensorRT-LLM {version} is not a release or release candidate "
                         f"(a development build cannot be placed in a release line; docs/tensorrt_llm.md)")
    line = f"{match.group(1)}.{match.group(2)}"
    if line not in RELEASE_LINES:
        supported = ", ".join(f"{name}.x" for name in RELEASE_LINES)
        raise ValueError(f"engine tensorrt_llm: TensorRT-LLM {version} is not a release line this engine was "
                         f"checked against ({supported}; docs/tensorrt_llm.md)")
    return RELEASE_LINES[line]


@dataclass(frozen=True)
class Features:
    """What an installed TensorRT-LLM has of what changed inside a release line, found in the package
    itself (names and fields, not its version), each named by the change that brought it."""

    # NVIDIA/TensorRT-LLM#9675 (main, January 2026): SamplingParams(logprobs_mode=LogprobMode...),
    # RAW (the default: log-softmax of the model's logits) or PROCESSED (of the distribution the token
    # was drawn from). Without it TorchSampler's log probs are the raw ones.
    logprobs_mode: bool
    # NVIDIA/TensorRT-LLM#13520 (main, April 2026): SamplingParams refuses logprobs above
    # sampling_params.MAX_TOP_LOGPROBS (20 there; #16851 raised it to 100). None: no such limit.
    max_logprobs: Optional[int]

    @property
    def logprobs_limit(self) -> int:
        """The most log probs per token this adapter asks for: its own bound, or the release's if lower."""
        return min(MAX_LOGPROBS_PER_TOKEN, self.max_logprobs or MAX_LOGPROBS_PER_TOKEN)


# The LogprobMode members by name (their values were not in the sources read). RAW for greedy
# requests: after #9675 PROCESSED turns greedy's distribution one-hot (log prob 0.0 for the chosen
# token), while RAW is the model's log-softmax, which for greedy without penalties (TorchSampler
# applies none in this line) is the distribution the token was chosen from.
RAW_LOGPROBS, PROCESSED_LOGPROBS = "RAW", "PROCESSED"


def detect_features(sampling_params_module) -> Features:
    """Features of the installed `tensorrt_llm.sampling_params` module."""
    mode = getattr(sampling_params_module, "LogprobMode", None)
    fields = {field.name for field in dataclasses.fields(sampling_params_module.SamplingParams) if field.init}
    has_mode = (mode is not None and "logprobs_mode" in fields
                and {RAW_LOGPROBS, PROCESSED_LOGPROBS} <= set(getattr(mode, "__members__", {})))
    limit = getattr(sampling_params_module, "MAX_TOP_LOGPROBS", None)
    return Features(logprobs_mode=has_mode, max_logprobs=limit if isinstance(limit, int) else None)

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
from dataclasses import dataclass
from typing import Mapping

# The most log probabilities asked of TensorRT-LLM per generated token. A sampled request's log
# probs need `logprobs` >= its top_k (see ReleaseLine.sampled_logprob_in_top_k_only), so this also
# bounds top_k for such requests: it keeps each streamed {token id: Logprob} dict small.
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
    # The LogprobMode member (by name) for SamplingParams(logprobs_mode=...) that gives log probs of the
    # distribution the token was drawn from (after temperature, top-k, top-p), the project's promise
    # (EngineOutput.log_probs); TensorRT-LLM's default is the raw model distribution.
    processed_logprobs_mode: str
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
        processed_logprobs_mode="PROCESSED",
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
            # logprobs_mode (LogprobMode RAW default, PROCESSED) on TorchSampler.
            "NVIDIA/TensorRT-LLM#9675 [TRTLLM-9735] Add processed logprobs functionality to TorchSampler "
            "(merged January 2026, before release/1.2 at 1.2.0rc8)",
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


def release_line(version: str) -> ReleaseLine:
    """The supported line of an installed TensorRT-LLM (`tensorrt_llm.__version__`, e.g. "1.2.1" or
    "1.2.0rc8"); ValueError naming the version and the supported lines otherwise."""
    line = ".".join(version.split(".")[:2])
    if line not in RELEASE_LINES:
        supported = ", ".join(f"{name}.x" for name in RELEASE_LINES)
        raise ValueError(f"engine tensorrt_llm: TensorRT-LLM {version} is not a release line this engine was "
                         f"checked against ({supported}; docs/tensorrt_llm.md)")
    return RELEASE_LINES[line]

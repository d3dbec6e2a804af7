"""The adapter's API manifest (engines/tensorrt_llm_api.json) against the installed TensorRT-LLM: every
name it lists is there, read as the adapter meets it (imported: pydantic fields, dataclass fields,
signatures, enum members) and as the image build reads it (its sources); and what the adapter
detects of the release (processed log probs, the log-prob cap) is what the package has. Runs where
TensorRT-LLM is installed (the -trtllm-python-py3 image, scripts/verify_gpu.sh); skipped elsewhere.
Importing tensorrt_llm needs its CUDA libraries, not a free GPU."""
import pytest

tensorrt_llm = pytest.importorskip("tensorrt_llm")

from tritonfront.engines import tensorrt_llm_api  # noqa: E402
from tritonfront.engines.tensorrt_llm import SAMPLING_FIELDS, check_sampling_fields  # noqa: E402
from tritonfront.engines.tensorrt_llm_releases import detect_features, release_line  # noqa: E402


def test_the_installed_release_is_a_supported_line():
    line = release_line(tensorrt_llm.__version__)
    print(f"TensorRT-LLM {tensorrt_llm.__version__}: line {line.line}, facts read for {line.checked_against}")


def test_every_manifest_name_is_there_imported():
    findings = tensorrt_llm_api.check_imported()
    print(findings.report())
    assert findings.missing == []


def test_every_manifest_name_is_there_in_the_sources_as_the_image_build_reads_them():
    findings = tensorrt_llm_api.check_sources(tensorrt_llm_api.installed_root())
    print(findings.report())
    assert findings.missing == []


def test_the_detected_features_agree_with_the_manifests_optional_names():
    from tensorrt_llm import sampling_params

    features = detect_features(sampling_params)
    optional = tensorrt_llm_api.check_imported().optional
    print(f"logprobs_mode (#9675): {features.logprobs_mode}; MAX_TOP_LOGPROBS (#13520): {features.max_logprobs}")
    assert features.logprobs_mode == (optional["tensorrt_llm.sampling_params.LogprobMode"]
                                      and optional["SamplingParams(logprobs_mode=...)"])
    assert (features.max_logprobs is not None) == optional["tensorrt_llm.sampling_params.MAX_TOP_LOGPROBS"]
    check_sampling_fields(sampling_params.SamplingParams, tensorrt_llm.__version__)
    assert SAMPLING_FIELDS

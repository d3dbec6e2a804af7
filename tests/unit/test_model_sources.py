"""A model by name: TRITONFRONT_EMBED_MODEL / TRITONFRONT_LLM_MODEL name a local folder, or a Hugging
Face model id fetched through huggingface_hub; when the hub cannot serve it the error says what to
do. The hub itself is not reachable here: an unreachable endpoint is a closed loopback port, and the
fetch of a reachable hub is not exercised (snapshot_download is what would run)."""
import subprocess
import sys

import pytest

from tritonfront.core import model_sources
from tritonfront.core.model_sources import EMBED_MODEL_ENV, LLM_MODEL_ENV, ModelSourceError


def resolve_in_subprocess(tmp_path, **env) -> subprocess.CompletedProcess:
    """huggingface_hub reads HF_HUB_OFFLINE and HF_ENDPOINT at import: a fresh interpreter each time."""
    environment = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf home"), **env}
    return subprocess.run([sys.executable, "-c", "from tritonfront.core import model_sources\n"
                                                 "print(model_sources.embed_model_dir())"],
                          capture_output=True, text=True, env=environment, timeout=120)


def test_a_local_folder_is_used_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv(EMBED_MODEL_ENV, str(tmp_path))
    assert model_sources.embed_model_dir() == tmp_path


def test_a_value_that_is_neither_a_path_nor_an_id_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(LLM_MODEL_ENV, str(tmp_path / "missing"))
    with pytest.raises(ModelSourceError, match=f"{LLM_MODEL_ENV}=.*missing is neither an existing file or folder "
                                               "nor a Hugging Face model id"):
        model_sources.llm_model_dir()


@pytest.mark.parametrize("value, repo_id, revision", [
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct", None),
    ("sentence-transformers/all-MiniLM-L6-v2@main", "sentence-transformers/all-MiniLM-L6-v2", "main"),
])
def test_a_hub_id_is_fetched_with_huggingface_hub(tmp_path, monkeypatch, value, repo_id, revision):
    calls = []

    def snapshot_download(repo, revision=None, ignore_patterns=None):
        calls.append((repo, revision))
        assert "*.onnx" in ignore_patterns
        return str(tmp_path)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    monkeypatch.setenv(EMBED_MODEL_ENV, value)
    assert model_sources.embed_model_dir() == tmp_path
    assert calls == [(repo_id, revision)]


def test_an_unreachable_hub_names_the_fix(tmp_path):
    result = resolve_in_subprocess(tmp_path, **{EMBED_MODEL_ENV: "HuggingFaceTB/SmolLM2-360M-Instruct",
                                                "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "ModelSourceError: TRITONFRONT_EMBED_MODEL=HuggingFaceTB/SmolLM2-360M-Instruct" in message
    assert "the Hugging Face Hub (http://127.0.0.1:9) cannot be reached from here" in message
    assert "hf download HuggingFaceTB/SmolLM2-360M-Instruct --local-dir DIR" in message


def test_offline_mode_set_by_the_user_names_the_fix(tmp_path):
    result = resolve_in_subprocess(tmp_path, **{EMBED_MODEL_ENV: "HuggingFaceTB/SmolLM2-360M-Instruct",
                                                "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0
    assert "HF_HUB_OFFLINE is set and the Hugging Face cache has no copy. To serve it, unset HF_HUB_OFFLINE" \
           in result.stderr

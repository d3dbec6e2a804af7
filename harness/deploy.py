"""Deployments to serve beside the committed one: scripts/configure.py output cut to the models a
run needs, renamed copies of a model with other parameters (two variants in one server), config
variants edited by regex, and a repository holding only the embed pipeline."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable, Optional

from .paths import BASELINES, ENSEMBLES, MODEL_REPOSITORY, ROOT

GENERATE_MODELS = ("llm_tokenizer", "llm", "detokenizer", "generate")
EMBED_MODELS = ("tokenizer", "encoder", "pooler", "embed", "embed_tokens", "embed_ids")
ALL_MODELS = ("tokenizer", "encoder", "pooler", "embed", "llm_tokenizer", "llm", "detokenizer", "generate")
# An engine name: the tests' `server` runs scripts/configure.py --engine NAME instead of the
# committed deployment (.ci/run's second pass of the contract tests).
TEST_ENGINE_VARIABLE = "TRITONFRONT_TEST_ENGINE"
# What that deployment sets beyond --engine. llama_cpp: no prefix reuse, since the contract tests
# compare requests of the same prompt (streamed with whole, against the reference) token for
# token, and a request fed after a reused prefix can part from a fresh one on a near tie (llama.cpp's
# flash attention computes a prompt of 64 tokens or more fed whole differently from its rest fed
# alone: docs/design.md). Their prompts fit the slots, where a request's logits do not depend on
# what else runs.
TEST_ENGINE_SETTINGS = {"llama_cpp": ("--set", "llm.prompt_cache=false")}


def read_model_config(model_dir: Path):
    """A model folder's config.pbtxt as Triton's ModelConfig message."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def committed_llm_engine() -> str:
    """The `engine` parameter of the committed llm config."""
    config = read_model_config(MODEL_REPOSITORY / "llm")
    if "engine" not in config.parameters:
        raise ValueError(f"{MODEL_REPOSITORY / 'llm' / 'config.pbtxt'} has no `engine` parameter")
    return config.parameters["engine"].string_value


def engine_under_test() -> str:
    """The engine the tests' `server` runs (TRITONFRONT_TEST_ENGINE, else the committed one)."""
    return os.environ.get(TEST_ENGINE_VARIABLE) or committed_llm_engine()


def deployment_under_test(out: Path) -> Optional[list[Path]]:
    """The repositories the tests' `server` serves: None (serve.sh's, the committed ones) unless
    TRITONFRONT_TEST_ENGINE names an engine, then configure.py's deployment with it, whole."""
    engine = os.environ.get(TEST_ENGINE_VARIABLE)
    if not engine:
        return None
    names = [model.name for repository in (MODEL_REPOSITORY, ENSEMBLES) for model in repository.iterdir()]
    return write_deployment(out, "--engine", engine, *TEST_ENGINE_SETTINGS.get(engine, ()), keep=names)


def write_deployment(out: Path, *configure_args: str, keep: Iterable[str] = GENERATE_MODELS,
                     llm_copies: dict[str, dict] = {}, llm_baselines: Iterable[str] = ()) -> list[Path]:
    """scripts/configure.py's deployment in `out`, cut to the models in `keep` (a second server
    beside another has to start on a small machine); `llm_copies`: name -> parameters of extra
    copies of `llm` (same code and instance groups), for an A/B in one server; `llm_baselines`:
    models of perf/baseline_repository served with the deployment's llm config and their own code.
    Returns the repositories to serve."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "configure.py"), "--out", str(out), *configure_args],
                   check=True, capture_output=True)
    keep = set(keep)
    for model in [*(out / "model_repository").iterdir(), *(out / "ensembles").iterdir()]:
        if model.name not in keep:
            shutil.rmtree(model)
    for name, parameters in llm_copies.items():
        copy_model(out, "llm", name, **parameters)
    for name in llm_baselines:
        copy_model(out, "llm", name, code=BASELINES / name / "1")
    return [out / "model_repository", out / "ensembles"]


def copy_model(out: Path, source: str, name: str, code: Optional[Path] = None, **parameters: str) -> None:
    """A model `name` in a deployment's model_repository: `source`'s config with these parameters
    changed and the same code (or the version folder `code`), so two variants can be compared in
    one server."""
    from google.protobuf import text_format

    source_dir = out / "model_repository" / source
    config = read_model_config(source_dir)
    config.name = name
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    target = out / "model_repository" / name
    target.mkdir()
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))
    (target / "1").symlink_to((code or source_dir / "1").resolve())


def write_variant(model: str, name: str, target: Path, replacements: list[tuple[str, str]],
                  source: Path = MODEL_REPOSITORY) -> Path:
    """A copy of <source>/<model> as `name` under `target`, its config.pbtxt edited by regex
    (pattern, replacement) pairs that must each match; 1/model.py (when the model has one) is
    a link to the original, so the variant differs in configuration only."""
    config = (source / model / "config.pbtxt").read_text()
    for pattern, replacement in [(rf'^name: "{model}"', f'name: "{name}"'), *replacements]:
        config, found = re.subn(pattern, replacement, config, flags=re.M)
        if not found:
            raise ValueError(f"{model}/config.pbtxt: nothing matches {pattern!r}")
    folder = target / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    code = source / model / "1" / "model.py"
    if code.exists():
        (folder / "1" / "model.py").symlink_to(code)
    return folder


def copy_embed_repository(target: Path) -> Path:
    """Only the embed models and ensembles of this checkout, for a server that serves nothing else."""
    for name in EMBED_MODELS:
        repository = ENSEMBLES if (ENSEMBLES / name).exists() else MODEL_REPOSITORY
        shutil.copytree(repository / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def load_module(path: Path, module_name: str) -> ModuleType:
    """A Python file outside any package as a module named `module_name`: a model.py for a
    benchmark-only model that builds on another model's adapter (perf/baseline_repository/; Triton
    loads each model.py under one name, so importing it is no option), or a script the tests load
    (scripts/, perf/)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""The adapter's API manifest (engines/tensorrt_llm_api.json) against an installed TensorRT-LLM: every
name it lists exists there. Runs where TensorRT-LLM is installed (the -trtllm-python-py3 image,
scripts/verify_gpu.sh); skipped elsewhere. Importing tensorrt_llm needs its CUDA libraries, not a
free GPU."""
import ast
import dataclasses
import enum
import importlib
import inspect
import json
import textwrap
import typing
from pathlib import Path

import pytest

tensorrt_llm = pytest.importorskip("tensorrt_llm")

from tritonfront.engines.tensorrt_llm_releases import release_line  # noqa: E402

MANIFEST = json.loads((Path(__file__).resolve().parents[2] / "src" / "tritonfront" / "engines"
                       / "tensorrt_llm_api.json").read_text())
OBJECTS = MANIFEST["objects"]


def literal_values(annotation) -> set:
    """The strings an annotation admits: Literal members and enum values, through Optional/Union."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {member.value for member in annotation}
    found = {arg for arg in typing.get_args(annotation) if isinstance(arg, str)}
    for arg in typing.get_args(annotation):
        if not isinstance(arg, str):
            found |= literal_values(arg)
    return found


def assigned_attributes(cls) -> set:
    """Attributes a class or its bases set on self (`self.name = ...`), besides class attributes."""
    names = set()
    for base in cls.__mro__[:-1]:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            names |= {target.attr for target in targets if isinstance(target, ast.Attribute)
                      and isinstance(target.value, ast.Name) and target.value.id == "self"}
    return names


def test_the_installed_release_is_a_supported_line():
    line = release_line(tensorrt_llm.__version__)
    assert line.checked_against == MANIFEST["release"], (
        f"installed {tensorrt_llm.__version__}; the manifest was transcribed for {MANIFEST['release']}")


@pytest.mark.parametrize("module", sorted(MANIFEST["modules"]))
def test_modules_hold_the_names(module):
    loaded = importlib.import_module(module)
    assert [name for name in MANIFEST["modules"][module]["names"] if not hasattr(loaded, name)] == []


def test_llm_arguments_and_their_values():
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    fields = TorchLlmArgs.model_fields
    assert [name for name in OBJECTS["LLM"]["init"] if name not in fields] == []
    for name, values in OBJECTS["LLM"]["values"].items():
        admitted = literal_values(fields[name].annotation)
        if name != "dtype":  # dtype is a plain str, checked by TensorRT-LLM when it loads the model
            assert set(values) <= admitted, (name, admitted)


def test_generate_async_parameters():
    parameters = inspect.signature(tensorrt_llm.LLM.generate_async).parameters
    assert [name for name in OBJECTS["LLM"]["calls"]["generate_async"] if name not in parameters] == []
    assert [name for name in OBJECTS["LLM"]["attributes"] if not hasattr(tensorrt_llm.LLM, name)] == []


def test_kv_cache_config_fields():
    from tensorrt_llm.llmapi import KvCacheConfig

    assert [name for name in OBJECTS["KvCacheConfig"]["init"] if name not in KvCacheConfig.model_fields] == []


@pytest.mark.parametrize("name", ["SamplingParams", "GuidedDecodingParams"])
def test_dataclass_fields(name):
    cls = getattr(importlib.import_module("tensorrt_llm.sampling_params"), name)
    fields = {field.name for field in dataclasses.fields(cls) if field.init}
    assert [field for field in OBJECTS[name]["init"] if field not in fields] == []


def test_logprob_modes():
    from tensorrt_llm.sampling_params import LogprobMode

    assert set(OBJECTS["LogprobMode"]["members"]) <= set(LogprobMode.__members__)


@pytest.mark.parametrize("name", ["GenerationResult", "CompletionOutput", "Logprob"])
def test_result_attributes(name):
    cls = getattr(importlib.import_module("tensorrt_llm.executor.result"), name)
    present = set(dir(cls)) | assigned_attributes(cls)
    if dataclasses.is_dataclass(cls):
        present |= {field.name for field in dataclasses.fields(cls)}
    assert [attribute for attribute in OBJECTS[name]["attributes"] if attribute not in present] == []

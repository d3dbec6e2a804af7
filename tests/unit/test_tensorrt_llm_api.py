"""Every name the TensorRT-LLM adapter uses is in its API manifest (engines/tensorrt_llm_api.json),
read from the adapter's own source: the modules and names it imports, the keywords it passes to
LLM, KvCacheConfig, GuidedDecodingParams, SamplingParams and generate_async, the constant values it
gives them, the release table's values, and the attributes it reads on TensorRT-LLM's objects."""
import ast
import json
from pathlib import Path

import pytest

from tritonfront.engines import tensorrt_llm_releases

ENGINES = Path(__file__).resolve().parents[2] / "src" / "tritonfront" / "engines"
MANIFEST = json.loads((ENGINES / "tensorrt_llm_api.json").read_text())
OBJECTS = MANIFEST["objects"]
SOURCE = (ENGINES / "tensorrt_llm.py").read_text()

# The adapter's names for TensorRT-LLM's objects (expression -> manifest object). Attributes read on
# them are checked; a name dropped from the adapter fails test_every_typed_name_is_in_the_adapter,
# so renaming a variable cannot silently skip the check.
TYPED_NAMES = {
    "self._llm": "LLM",
    "result": "GenerationResult",
    "step": "GenerationResult",
    "completion": "CompletionOutput",
    "chosen": "Logprob",
    "logprob": "Logprob",
}
# The adapter's local names of TensorRT-LLM's classes (imported as, or bound to, these names).
CONSTRUCTORS = {"LLM": "LLM", "KvCacheConfig": "KvCacheConfig", "GuidedDecodingParams": "GuidedDecodingParams",
                "TRTSamplingParams": "SamplingParams"}
# The dict the adapter builds SamplingParams' keywords in (_sampling: `options`, passed as **options).
SAMPLING_OPTIONS = "options"


def adapter_uses(source: str) -> dict:
    """{"imports": {(module, name)}, "keywords": {(object, keyword)}, "values": {(object, keyword, value)},
    "attributes": {(object, attribute)}, "typed": {expression}} of the adapter's source."""
    uses = {"imports": set(), "keywords": set(), "values": set(), "attributes": set(), "typed": set()}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tensorrt_llm"):
            uses["imports"] |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            uses["imports"] |= {(alias.name, None) for alias in node.names if alias.name.startswith("tensorrt_llm")}
        elif isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if owner in TYPED_NAMES:
                uses["typed"].add(owner)
                uses["attributes"].add((TYPED_NAMES[owner], node.attr))
            elif owner == "tensorrt_llm":
                uses["imports"].add(("tensorrt_llm", node.attr))
        elif isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            target = CONSTRUCTORS.get(callee)
            if callee.endswith(".generate_async"):
                target = "LLM.generate_async"
            elif callee == SAMPLING_OPTIONS + ".update" or (
                    callee == "dict" and _assigned_to(tree, node) == SAMPLING_OPTIONS):
                target = "SamplingParams"
            if target is None:
                continue
            for keyword in node.keywords:
                if keyword.arg is None:  # **options: its keys are collected where options is built
                    continue
                uses["keywords"].add((target, keyword.arg))
                if isinstance(keyword.value, ast.Constant):
                    uses["values"].add((target, keyword.arg, keyword.value.value))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and ast.unparse(target.value) == SAMPLING_OPTIONS
                        and isinstance(target.slice, ast.Constant)):
                    uses["keywords"].add(("SamplingParams", target.slice.value))
    return uses


def _assigned_to(tree, call) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.value is call and len(node.targets) == 1:
            return ast.unparse(node.targets[0])
    return ""


def allowed_keywords(target: str) -> set:
    if target == "LLM.generate_async":
        return set(OBJECTS["LLM"]["calls"]["generate_async"])
    return set(OBJECTS[target]["init"])


def unknown_names(uses: dict) -> list[str]:
    problems = []
    for module, name in sorted(uses["imports"], key=str):
        if module not in MANIFEST["modules"] or (name is not None and name not in MANIFEST["modules"][module]["names"]):
            problems.append(f"import {module}.{name}")
    for target, keyword in sorted(uses["keywords"]):
        if keyword not in allowed_keywords(target):
            problems.append(f"{target}({keyword}=...)")
    for target, keyword, value in sorted(uses["values"], key=str):
        allowed = OBJECTS.get(target, {}).get("values", {}).get(keyword)
        if allowed is not None and value not in allowed:
            problems.append(f"{target}({keyword}={value!r})")
    for target, attribute in sorted(uses["attributes"]):
        if attribute not in OBJECTS[target]["attributes"]:
            problems.append(f"{target}.{attribute}")
    return problems


def test_every_name_the_adapter_uses_is_in_the_manifest():
    uses = adapter_uses(SOURCE)
    assert unknown_names(uses) == []
    # The collection found what the adapter is known to use (a broken collector finds nothing).
    assert ("LLM", "enable_chunked_prefill") in uses["keywords"]
    assert ("SamplingParams", "logprobs_mode") in uses["keywords"]
    assert ("SamplingParams", "max_tokens") in uses["keywords"]
    assert ("LLM.generate_async", "streaming") in uses["keywords"]
    assert ("CompletionOutput", "logprobs_diff") in uses["attributes"]
    assert ("tensorrt_llm", "__version__") in uses["imports"]


def test_every_typed_name_is_in_the_adapter():
    assert adapter_uses(SOURCE)["typed"] == set(TYPED_NAMES)


@pytest.mark.parametrize("original, misspelled, expected", [
    ("enable_chunked_prefill=True", "enable_chunked_prefil=True", "LLM(enable_chunked_prefil=...)"),
    ('options["logprobs_mode"]', 'options["logprob_mode"]', "SamplingParams(logprob_mode=...)"),
    ("pad_id=end_id", "pad_token_id=end_id", "SamplingParams(pad_token_id=...)"),
    ("completion.token_ids_diff", "completion.new_token_ids", "CompletionOutput.new_token_ids"),
    ("chosen.logprob", "chosen.log_prob", "Logprob.log_prob"),
    ('guided_decoding_backend="xgrammar"', 'guided_decoding_backend="xgrammer"',
     "LLM(guided_decoding_backend='xgrammer')"),
    ("from tensorrt_llm.llmapi import KvCacheConfig", "from tensorrt_llm.llmapi import KVCacheConfig",
     "import tensorrt_llm.llmapi.KVCacheConfig"),
])
def test_a_name_outside_the_manifest_is_caught(original, misspelled, expected):
    assert original in SOURCE
    assert expected in unknown_names(adapter_uses(SOURCE.replace(original, misspelled, 1)))


def test_the_release_tables_values_are_in_the_manifest():
    for line in tensorrt_llm_releases.RELEASE_LINES.values():
        assert line.sampler_type in OBJECTS["LLM"]["values"]["sampler_type"]
        assert line.processed_logprobs_mode in OBJECTS["LogprobMode"]["members"]
        assert line.checked_against == MANIFEST["release"]


def test_the_manifest_cites_its_sources():
    assert "2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d" in MANIFEST["pin"]["tensorrt_llm"]
    for name, spec in {**MANIFEST["modules"], **OBJECTS}.items():
        assert spec["source"].strip(), name

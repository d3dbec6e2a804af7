"""Every name the TensorRT-LLM adapter uses is in its API manifest (engines/tensorrt_llm_api.json),
read from the adapter's own source: the modules and names it imports, the keywords it passes to
LLM, KvCacheConfig, GuidedDecodingParams, SamplingParams and generate_async, the constant values it
gives them, the release table's values, and the attributes it reads on TensorRT-LLM's objects. And
the manifest's checker (engines/tensorrt_llm_api.py) against fake installed packages of each branch
of the release line, read from their sources (the image build's check) and imported (the GPU's)."""
import ast
import json
import sys
from pathlib import Path

import pytest

import fake_tensorrt_llm as fake
from tritonfront.engines import tensorrt_llm_api, tensorrt_llm_releases
from tritonfront.engines.tensorrt_llm import SAMPLING_FIELDS

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
# The adapter's names for TensorRT-LLM's modules: the names it reads on them are checked.
MODULES = {"sampling_params": "tensorrt_llm.sampling_params"}


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
            elif owner in MODULES:
                uses["imports"].add((MODULES[owner], node.attr))
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
    return set(OBJECTS[target]["init"]) | set(OBJECTS[target].get("optional", {}))


def unknown_names(uses: dict) -> list[str]:
    problems = []
    for module, name in sorted(uses["imports"], key=str):
        spec = MANIFEST["modules"].get(module)
        if spec is None or (name is not None and name not in spec["names"] and name not in spec.get("optional", {})):
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
    assert ("tensorrt_llm.sampling_params", "LogprobMode") in uses["imports"]


def test_the_fields_checked_at_start_are_every_one_the_adapter_passes():
    """What the engine checks before it starts (SAMPLING_FIELDS) covers what _sampling passes, but
    logprobs_mode, which it passes only where the release has it."""
    passed = {keyword for target, keyword in adapter_uses(SOURCE)["keywords"] if target == "SamplingParams"}
    assert passed - set(SAMPLING_FIELDS) == set(OBJECTS["SamplingParams"]["optional"])
    assert set(SAMPLING_FIELDS) <= set(OBJECTS["SamplingParams"]["init"])


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
        assert line.checked_against == MANIFEST["release"]
    assert [tensorrt_llm_releases.RAW_LOGPROBS, tensorrt_llm_releases.PROCESSED_LOGPROBS] == \
        OBJECTS["LogprobMode"]["members"]


def test_the_manifest_cites_its_sources():
    assert "2fdb9e66302b15db9a9b5e71d3ac45d5921ea45d" in MANIFEST["pin"]["tensorrt_llm"]
    for name, spec in {**MANIFEST["modules"], **OBJECTS}.items():
        assert spec["source"].strip(), name


# --- the checker against installed packages ------------------------------------------------------


@pytest.fixture
def imported_from(monkeypatch):
    """Puts a fake package's folder first on sys.path, its modules forgotten before and after."""
    def forget():
        for name in [name for name in sys.modules if name == "tensorrt_llm" or name.startswith("tensorrt_llm.")]:
            monkeypatch.delitem(sys.modules, name)

    def use(root: Path) -> None:
        forget()
        monkeypatch.syspath_prepend(str(root))

    yield use
    forget()


@pytest.mark.parametrize("branch", list(fake.BRANCHES))
def test_each_branch_has_every_name_and_its_optional_ones_are_reported(tmp_path, imported_from, branch):
    logprobs_mode, cap = fake.BRANCHES[branch]
    fake.write_sources(tmp_path, logprobs_mode, cap)
    imported_from(tmp_path)
    expected = {"tensorrt_llm.sampling_params.LogprobMode": logprobs_mode,
                "tensorrt_llm.sampling_params.MAX_TOP_LOGPROBS": cap is not None,
                "SamplingParams(logprobs_mode=...)": logprobs_mode}
    for findings in (tensorrt_llm_api.check_sources(tmp_path), tensorrt_llm_api.check_imported()):
        assert (findings.missing, findings.unresolved, findings.optional) == ([], [], expected)


@pytest.mark.parametrize("drop, reported", [
    ("SamplingParams.max_tokens", "SamplingParams(max_tokens=...)"),  # a renamed keyword
    ("LLM.enable_chunked_prefill", "LLM(enable_chunked_prefill=...)"),  # on TorchLlmArgs' base class
    ("LLM.sampler_type=TorchSampler", "LLM(sampler_type='TorchSampler')"),  # a literal value gone
    ("LLM.generate_async.streaming", "LLM.generate_async(streaming=...)"),
    ("CompletionOutput.logprobs_diff", "CompletionOutput.logprobs_diff"),
    ("GenerationResult.abort", "GenerationResult.abort"),
    ("LogprobMode.PROCESSED", "LogprobMode.PROCESSED"),
])
def test_a_name_the_installed_package_lacks_is_reported_by_both_reads(tmp_path, imported_from, drop, reported):
    fake.write_sources(tmp_path, drop=(drop,))
    imported_from(tmp_path)
    assert tensorrt_llm_api.check_sources(tmp_path).missing == [reported]
    assert tensorrt_llm_api.check_imported().missing == [reported]


def test_a_base_the_sources_cannot_read_leaves_a_name_unresolved_not_missing(tmp_path):
    fake.write_sources(tmp_path, drop=("CompletionOutput.logprobs_diff",))
    result = tmp_path / "tensorrt_llm" / "executor" / "result.py"
    result.write_text(result.read_text().replace("class CompletionOutput:", "class CompletionOutput(Mirrored):"))
    findings = tensorrt_llm_api.check_sources(tmp_path)
    assert findings.missing == [] and findings.unresolved == ["CompletionOutput.logprobs_diff"]


def test_the_image_builds_check_fails_on_a_missing_name(tmp_path, capsys):
    fake.write_sources(tmp_path)
    assert tensorrt_llm_api.main(["--root", str(tmp_path)]) == 0
    fake.write_sources(tmp_path, drop=("SamplingParams.logprobs",))
    assert tensorrt_llm_api.main(["--root", str(tmp_path)]) == 1
    assert "missing: SamplingParams(logprobs=...)" in capsys.readouterr().out

"""The configs GENERATE_PIPELINE writes (tritonfront.core.trtllm_contract; the committed files carry
them, tests/unit/test_config_tensors.py) serve TensorRT-LLM's ensemble contract exactly, as
Triton's parser reads them: names, types, shapes and optional flags of the `generate` / `ensemble`
model, every input reaching the step that reads it, every output coming from the last step."""
import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from harness.deploy import read_model_config
from tritonfront.core import trtllm_contract as contract
from tritonfront.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[2]
DTYPE = model_config_pb2.DataType


def generated(model: str) -> model_config_pb2.ModelConfig:
    """The inputs, outputs and steps the declaration writes into this model's config."""
    return text_format.Parse(contract.GENERATE_PIPELINE.models[model].text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def ensemble():
    return generated(contract.ENSEMBLE)


def declared(tensors) -> dict:
    return {t.name: (DTYPE.Name(t.data_type), tuple(t.dims), getattr(t, "optional", False)) for t in tensors}


def expected(specs) -> dict:
    return {s.name: (s.dtype, s.dims, s.optional) for s in specs}


def test_ensemble_and_generate_are_one_config_named_by_their_folders():
    link = ROOT / "ensembles" / "ensemble"
    assert link.is_symlink() and os.readlink(link) == contract.ENSEMBLE
    committed = read_model_config(ROOT / "ensembles" / contract.ENSEMBLE)
    assert committed.name == ""  # Triton takes each name from its folder
    assert committed.platform == "ensemble"


def test_the_ensemble_declares_exactly_the_contract(ensemble):
    assert declared(ensemble.input) == expected([*contract.INPUTS, *contract.EXTRA_INPUTS])
    assert declared(ensemble.output) == expected([*contract.OUTPUTS, *contract.EXTRA_OUTPUTS])
    # TensorRT-LLM's order first, ours after: a reader can compare the two files side by side.
    assert [t.name for t in ensemble.input][:len(contract.INPUTS)] == [s.name for s in contract.INPUTS]


def test_every_input_reaches_a_step_that_declares_it_with_the_same_type(ensemble):
    steps = {step.model_name: step for step in ensemble.ensemble_scheduling.step}
    assert list(steps) == ["llm_tokenizer", "llm", "detokenizer"]
    ensemble_inputs = {t.name: t for t in ensemble.input}
    read = set()
    for name, step in steps.items():
        model = {t.name: t for t in generated(name).input}
        for key, value in step.input_map.items():
            assert key in model, f"{name} does not declare {key}"
            if value in ensemble_inputs:
                read.add(value)
                assert (model[key].data_type, list(model[key].dims)) == (
                    ensemble_inputs[value].data_type, list(ensemble_inputs[value].dims)), (name, key)
                assert model[key].optional or not ensemble_inputs[value].optional, (name, key)
    assert read == set(ensemble_inputs)


def test_every_output_comes_from_the_detokenizer_which_declares_it(ensemble):
    last = ensemble.ensemble_scheduling.step[-1]
    detokenizer = {t.name: t for t in generated(contract.DETOKENIZER).output}
    assert {value: key for key, value in last.output_map.items()} == {t.name: t.name for t in ensemble.output}
    for output in ensemble.output:
        assert (detokenizer[output.name].data_type, list(detokenizer[output.name].dims)) == (
            output.data_type, list(output.dims)), output.name


def test_what_the_llm_sends_the_detokenizer_passes_on():
    llm = {t.name for t in generated(contract.LLM).output}
    detokenizer = generated(contract.DETOKENIZER)
    optional_inputs = {t.name for t in detokenizer.input if t.optional}
    for name in (*contract.REQUESTED_PASSED, *contract.TOP_LOG_PROB_OUTPUTS):
        assert name in llm and name in optional_inputs and name in {t.name for t in detokenizer.output}
    assert contract.TOKEN_TEXTS_FLAG in llm and contract.TOKEN_TEXTS_FLAG in optional_inputs
    # The fields every chunk has travel packed; the detokenizer sends the client those it shows.
    required = {t.name for t in detokenizer.input if not t.optional}
    assert "chunk" in llm and required == {"chunk"}
    assert {"finish_reason", "prompt_tokens", "completion_tokens", "batch_index", "sequence_index"} <= {
        t.name for t in detokenizer.output}


def test_contract_tables_name_only_contract_inputs():
    names = {s.name for s in (*contract.INPUTS, *contract.EXTRA_INPUTS)}
    assert set(contract.UNSUPPORTED) <= names
    assert set(contract.ALIASES) | set(contract.ALIASES.values()) <= names
    outputs = {s.name for s in contract.OUTPUTS}
    assert set(contract.REQUESTED_PASSED) <= outputs
    assert set(contract.TOP_LOG_PROB_OUTPUTS) <= {s.name for s in contract.EXTRA_OUTPUTS}
    assert set(contract.UNMEASURED_PERF_METRICS) <= set(contract.PERF_METRIC_OUTPUTS)


def test_a_deployment_serves_both_names_from_the_one_config(tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, str(ROOT / "scripts" / "configure.py"), "--out", str(tmp_path), "--dp", "2"],
                   check=True, capture_output=True)
    written = {name: read_model_config(tmp_path / "ensembles" / name) for name in ("generate", "ensemble")}
    assert written["generate"] == written["ensemble"] and written["generate"].name == ""
    assert (tmp_path / "ensembles" / "ensemble" / "1").resolve() == (ROOT / "ensembles" / "generate" / "1").resolve()


def test_request_parameters_are_refused_by_name_except_tritons_own():
    contract.check_request_parameters(["timeout", "priority", "sequence_id", "triton_enable_empty_final_response"])
    with pytest.raises(InvalidInput, match=r"^temprature: .*\(did you mean temperature\?\)"):
        contract.check_request_parameters(["timeout", "temprature"])
    with pytest.raises(InvalidInput, match=r"^foo: generate has no input or parameter of this name;"):
        contract.check_request_parameters(["foo"])


def comment_above(text: str, name: str) -> str:
    """The comment of the tensor `name` in a generated input or output list, unwrapped."""
    block = next(block for block in text.split("  {\n") if f'    name: "{name}"\n' in block)
    return " ".join(line.strip()[2:] for line in block.splitlines() if line.strip().startswith("#"))


def test_the_llm_config_says_why_it_refuses_an_input_and_which_name_is_older():
    llm = contract.GENERATE_PIPELINE.models[contract.LLM].text()
    inputs = llm[:llm.index("\noutput [")]
    for name, reason in contract.UNSUPPORTED.items():
        assert f'"{name}: {reason}"' in comment_above(inputs, name)
    for older, current in contract.ALIASES.items():
        assert comment_above(inputs, current) == f"{older} is its older name; either, or both if equal."

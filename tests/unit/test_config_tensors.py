"""The committed configs' generated tensors are what their declarations write
(tritonfront.core.config_tensors, scripts/configure.py --write-committed), and the generator writes
configs Triton's own parser reads as declared, between markers, leaving every other line alone."""
import difflib
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from harness.deploy import load_module
from harness.paths import ROOT
from tritonfront.core import config_tensors
from tritonfront.core.config_tensors import (BEGIN_MARKER, COMMAND, END_MARKER, REQUEST, RESPONSE, WIDTH, Pipeline,
                                             PipelineTensor)

configure = load_module(ROOT / "scripts" / "configure.py", "configure")


def test_the_committed_configs_are_what_their_declarations_write():
    generated = config_tensors.generated_files(ROOT, configure.REPOSITORIES, configure.DECLARATIONS)
    stale = {path: text for path, text in generated.items() if path.read_text() != text}
    diff = "".join(line for path, text in stale.items() for line in difflib.unified_diff(
        path.read_text().splitlines(True), text.splitlines(True), str(path.relative_to(ROOT)), "declared"))
    if stale:
        pytest.fail(f"committed configs that differ from their declarations: "
                    f"{', '.join(str(path.relative_to(ROOT)) for path in stale)}; run `{COMMAND}` and commit what it "
                    f"writes\n{diff[:4000]}", pytrace=False)
    names = {path.relative_to(ROOT).as_posix() for path in generated}
    assert {"model_repository/llm_tokenizer/config.pbtxt", "model_repository/llm/config.pbtxt",
            "model_repository/detokenizer/config.pbtxt", "ensembles/generate/config.pbtxt"} <= names


def parsed(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def entries(tensors) -> dict:
    """name -> (type, dims, optional, allow_ragged_batch); an output has neither flag."""
    return {t.name: (model_config_pb2.DataType.Name(t.data_type), tuple(t.dims), getattr(t, "optional", False),
                     getattr(t, "allow_ragged_batch", False)) for t in tensors}


# A small pipeline: a prompt is split into ids, which a second step turns into a text.
SPLIT = Pipeline(declared_in="tests/unit/test_config_tensors.py", ensemble="whole", steps=("split", "join"), tensors=(
    PipelineTensor("prompt", "TYPE_STRING", (1,), REQUEST, "split", optional=True, source_note="The text to split.",
           sink_note="Absent: the empty text."),
    PipelineTensor("limit", "TYPE_INT32", (1,), REQUEST, "join", optional=True),
    PipelineTensor("ids", "TYPE_INT32", (-1,), "split", "join"),
    PipelineTensor("text", "TYPE_STRING", (-1,), "join", RESPONSE, source_note="The ids joined. " * 12),
))


def test_each_model_gets_its_inputs_and_outputs_as_triton_parses_them():
    split, join, whole = (parsed(SPLIT.models[name].text()) for name in ("split", "join", "whole"))
    assert entries(split.input) == {"prompt": ("TYPE_STRING", (1,), True, False)}
    assert entries(split.output) == {"ids": ("TYPE_INT32", (-1,), False, False)}
    # A step's input with a variable dimension takes a ragged batch; what earlier steps send comes first.
    assert list(entries(join.input).items()) == [("ids", ("TYPE_INT32", (-1,), False, True)),
                                                 ("limit", ("TYPE_INT32", (1,), True, False))]
    assert entries(whole.input) == {"prompt": ("TYPE_STRING", (1,), True, False),
                                    "limit": ("TYPE_INT32", (1,), True, False)}
    assert entries(whole.output) == {"text": ("TYPE_STRING", (-1,), False, False)}
    steps = [(step.model_name, step.model_version, dict(step.input_map), dict(step.output_map))
             for step in whole.ensemble_scheduling.step]
    assert steps == [("split", -1, {"prompt": "prompt"}, {"ids": "_ids"}),
                     ("join", -1, {"ids": "_ids", "limit": "limit"}, {"text": "text"})]


def test_notes_are_comments_above_their_tensor_at_each_end():
    split, whole = SPLIT.models["split"].text(), SPLIT.models["whole"].text()
    assert '    # Absent: the empty text.\n    name: "prompt"' in split
    assert '    # The text to split.\n    name: "prompt"' in whole and "Absent" not in whole
    join = SPLIT.models["join"].text()
    comment = [line for line in join.splitlines() if line.lstrip().startswith("#")]
    assert len(comment) > 1 and all(len(line) <= WIDTH for line in comment)
    assert " ".join(line.strip()[2:] for line in comment) == ("The ids joined. " * 12).strip()


def test_one_model_without_an_ensemble_takes_the_request_and_sends_the_response():
    """The shape of a contract one model serves alone (TensorRT-LLM's LLM-API tensorrt_llm model)."""
    alone = Pipeline(declared_in="here", ensemble=None, steps=("model",), ragged_batches=False, tensors=(
        PipelineTensor("text_input", "TYPE_STRING", (-1,), REQUEST, "model"),
        PipelineTensor("text_output", "TYPE_STRING", (-1,), "model", RESPONSE)))
    assert list(alone.models) == ["model"]
    model = parsed(alone.models["model"].text())
    assert entries(model.input) == {"text_input": ("TYPE_STRING", (-1,), False, False)}
    assert entries(model.output) == {"text_output": ("TYPE_STRING", (-1,), False, False)}
    assert not model.ensemble_scheduling.step


@pytest.mark.parametrize("tensors, message", [
    ((PipelineTensor("x", "TYPE_INT32", (1,), REQUEST, "nowhere"),), "its sink is none of ['a', 'b', 'response']"),
    ((PipelineTensor("x", "TYPE_INT32", (1,), "b", "a"),), "a step must take it after its source sends it"),
    ((PipelineTensor("x", "TYPE_INT32", (1,), REQUEST, RESPONSE),), "no model takes or sends it"),
    ((PipelineTensor("x", "TYPE_INT32", (1,), "a", RESPONSE, optional=True),), "only an input can be optional"),
    ((PipelineTensor("x", "TYPE_INT32", (1,), "a", "b"), PipelineTensor("x", "TYPE_INT32", (1,), REQUEST, "b")),
     "declared twice among the inputs of b"),
    ((PipelineTensor("x", "TYPE_INT32", (1,), REQUEST, "a"), PipelineTensor("x", "TYPE_INT32", (1,), REQUEST, "b")),
     "declared twice among the request's tensors"),
    ((PipelineTensor("x", "TYPE_INT32", (1,), "a", "b"), PipelineTensor("x", "TYPE_FP32", (1,), "a", RESPONSE)),
     "declared twice among the outputs of a"),
])
def test_a_declaration_that_cannot_be_served_is_refused_naming_the_tensor(tensors, message):
    with pytest.raises(ValueError, match="tensor 'x'") as error:
        Pipeline(declared_in="here", ensemble="e", steps=("a", "b"), tensors=tensors)
    assert message in str(error.value)


def test_a_pipeline_without_an_ensemble_is_one_model():
    with pytest.raises(ValueError, match=r"a pipeline without an ensemble is one model, not \['a', 'b'\]"):
        Pipeline(declared_in="here", ensemble=None, steps=("a", "b"), tensors=())


HEAD = '# Why the batcher waits.\nname: "split"\nbackend: "python"\n\n'
TAIL = '\n# Why two.\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n'


def repository(tmp_path: Path, region: str) -> Path:
    for name in ("split", "join", "whole"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.pbtxt").write_text(HEAD + region + TAIL)
    (tmp_path / "models" / "alias").symlink_to("whole")  # as ensembles/ensemble -> generate
    return tmp_path


def test_only_the_lines_between_the_markers_are_rewritten(tmp_path):
    stale = f"{BEGIN_MARKER} long ago\ninput [ ]\n{END_MARKER}\n"
    root = repository(tmp_path, stale)
    assert sorted(p.parent.name for p in config_tensors.write_committed(root, ["models"], [SPLIT])) == \
        ["join", "split", "whole"]
    text = (root / "models" / "split" / "config.pbtxt").read_text()
    assert text == HEAD + SPLIT.region("split") + TAIL
    assert SPLIT.region("split").replace("\n# ", " ").startswith(
        f"{BEGIN_MARKER} by `{COMMAND}` from tests/unit/test_config_tensors.py: edit it there")
    assert parsed(text).instance_group[0].count == 2 and entries(parsed(text).output) == {
        "ids": ("TYPE_INT32", (-1,), False, False)}
    assert config_tensors.write_committed(root, ["models"], [SPLIT]) == []


@pytest.mark.parametrize("region", ["input [ ]\n", f"{BEGIN_MARKER}\ninput [ ]\n",
                                    f"{END_MARKER}\n{BEGIN_MARKER}\n", f"{BEGIN_MARKER}\n{END_MARKER}\n" * 2])
def test_a_file_without_one_marked_region_is_named_and_nothing_is_written(tmp_path, region):
    root = repository(tmp_path, f"{BEGIN_MARKER}\n{END_MARKER}\n")
    broken = root / "models" / "whole" / "config.pbtxt"
    broken.write_text(HEAD + region + TAIL)
    with pytest.raises(ValueError, match=rf"{broken}: needs one line starting '{BEGIN_MARKER}'"):
        config_tensors.write_committed(root, ["models"], [SPLIT])
    assert (root / "models" / "split" / "config.pbtxt").read_text() == HEAD + f"{BEGIN_MARKER}\n{END_MARKER}\n" + TAIL


def test_a_model_the_repositories_lack_is_named(tmp_path):
    (tmp_path / "models").mkdir()
    with pytest.raises(ValueError, match=r"model 'split': expected one config.pbtxt under models, found \[\]"):
        config_tensors.generated_files(tmp_path, ["models"], [SPLIT])


def test_configure_write_committed_restores_the_generated_lines_alone(tmp_path, monkeypatch, capsys):
    """configure.py --write-committed on a copy of the committed repositories, one generated line
    edited by hand and the hand-written lines changed: the first is restored, the others kept."""
    for repository in configure.REPOSITORIES:
        shutil.copytree(ROOT / repository, tmp_path / repository, symlinks=True,
                        ignore=shutil.ignore_patterns("1", "__pycache__"))
    monkeypatch.setattr(configure, "ROOT", tmp_path)
    llm = tmp_path / "model_repository" / "llm" / "config.pbtxt"
    committed = llm.read_text()
    by_hand = ('parameters: { key: "stream_interval" value: { string_value: "1" } }',
               'parameters: { key: "stream_interval" value: { string_value: "8" } }')
    edited = committed.replace('name: "stream"', 'name: "streaming"').replace(*by_hand)
    assert edited.count('name: "streaming"') == 1 and by_hand[1] in edited
    llm.write_text(edited)
    configure.main(["--write-committed"])
    assert capsys.readouterr().out == "rewrote model_repository/llm/config.pbtxt\n"
    assert llm.read_text() == committed.replace(*by_hand)
    configure.main(["--write-committed"])
    assert capsys.readouterr().out == "the committed configs are as declared\n"


def test_configure_write_committed_takes_no_deployment_options(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        configure.main(["--write-committed", "--dp", "2"])
    assert exit_.value.code == 2 and "--write-committed rewrites the committed files only; it takes no --dp" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        configure.main([])
    assert "the following arguments are required: --out (or --write-committed)" in capsys.readouterr().err

"""The tensors of committed config.pbtxt files, written from a declaration: a pipeline of models
(an ensemble's steps, or one model alone) and every tensor that flows through it, from the
client's request or a step's outputs to a step's inputs or the client's response.

From it come each model's `input` and `output` lists and, for an ensemble, its steps' input_map
and output_map. They are written between two marker lines of each model's committed config.pbtxt
(BEGIN_MARKER ... END_MARKER); the lines around them (name, backend, batching, instance groups,
parameters and the comments that say why) stay as written by hand, byte for byte. Triton loads
the committed files as they are, so they stay complete configs; `python scripts/configure.py
--write-committed` rewrites the generated lines, and a unit test fails while they differ.

The text is written here rather than by protobuf's text_format, which drops comments.
"""
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

# Where a tensor comes from and goes to when no model of the pipeline sends or takes it.
REQUEST = "request"  # the client's request: an input of the ensemble (or of the one model)
RESPONSE = "response"  # the client's response: an output of the ensemble (or of the one model)
# A step's output for the clients that call that model directly: the ensemble neither maps nor
# returns it (the llm's per-field chunk outputs, which the ensemble gets packed).
DIRECT = "direct"

BEGIN_MARKER = "# BEGIN GENERATED"
END_MARKER = "# END GENERATED"
COMMAND = "python scripts/configure.py --write-committed"
WIDTH = 100  # the committed configs' line length, for the comments written here


@dataclass(frozen=True)
class PipelineTensor:
    """One tensor of a pipeline, declared once for both of its ends."""
    name: str
    dtype: str  # Triton's config type
    dims: tuple[int, ...]  # after the batch dimension
    source: str = REQUEST  # the model whose output it is
    sink: str = RESPONSE  # the model whose input it is
    optional: bool = False  # the sink may go without it (from the request: the ensemble too)
    source_note: str = ""  # the comment above it in the source's outputs (the ensemble's inputs)
    sink_note: str = ""  # the comment above it in the sink's inputs (the ensemble's outputs)


def _wrapped(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)


@dataclass(frozen=True)
class ConfigTensor:
    """One entry of a config's `input` or `output` list."""
    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False
    allow_ragged_batch: bool = False
    note: str = ""

    def text(self) -> str:
        lines = [f"# {line}" for line in _wrapped(self.note, WIDTH - 6)]
        lines += [f'name: "{self.name}"', f"data_type: {self.dtype}",
                  f"dims: [ {', '.join(str(dim) for dim in self.dims)} ]"]
        lines += ["allow_ragged_batch: true"] * self.allow_ragged_batch + ["optional: true"] * self.optional
        return "  {\n" + "".join(f"    {line}\n" for line in lines) + "  }"


@dataclass(frozen=True)
class EnsembleStep:
    model_name: str
    input_map: tuple[tuple[str, str], ...]  # (the model's input, the ensemble's tensor)
    output_map: tuple[tuple[str, str], ...]  # (the model's output, the ensemble's tensor)

    def text(self) -> str:
        lines = [f'model_name: "{self.model_name}"', "model_version: -1"]
        lines += [f'input_map {{ key: "{key}" value: "{value}" }}' for key, value in self.input_map]
        lines += [f'output_map {{ key: "{key}" value: "{value}" }}' for key, value in self.output_map]
        return "    {\n" + "".join(f"      {line}\n" for line in lines) + "    }"


@dataclass(frozen=True)
class ModelTensors:
    """What the generator writes into one model's config: its inputs and outputs, and an
    ensemble's steps."""
    inputs: tuple[ConfigTensor, ...]
    outputs: tuple[ConfigTensor, ...]
    steps: tuple[EnsembleStep, ...] = ()

    def text(self) -> str:
        parts = [_listed("input", self.inputs), _listed("output", self.outputs)]
        if self.steps:
            steps = ",\n".join(step.text() for step in self.steps)
            parts.append(f"\nensemble_scheduling {{\n  step [\n{steps}\n  ]\n}}\n")
        return "".join(parts)


def _listed(key: str, tensors: tuple[ConfigTensor, ...]) -> str:
    return f"{key} [\n" + ",\n".join(tensor.text() for tensor in tensors) + "\n]\n" if tensors else ""


@dataclass(frozen=True)
class Pipeline:
    """The models that serve one contract and the tensors between them. With an ensemble, each
    tensor between two steps is the ensemble's `_<name>`; without one, `steps` is the one model
    and the request's and response's tensors are its own inputs and outputs."""
    declared_in: str  # where it is declared, as the generated lines name it
    ensemble: Optional[str]  # the ensemble's folder name
    steps: tuple[str, ...]  # the models, each named by its folder, in the order the ensemble runs them
    tensors: tuple[PipelineTensor, ...]
    # Whether the steps take requests of different lengths in one batch: then each input with a
    # variable dimension is declared allow_ragged_batch (the ensemble's own inputs never are:
    # Triton hands them on request by request).
    ragged_batches: bool = True
    models: dict[str, ModelTensors] = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        self._check()
        models = {step: self._model(step) for step in self.steps}
        if self.ensemble:
            models[self.ensemble] = self._ensemble()
        object.__setattr__(self, "models", models)

    def _check(self) -> None:
        if not self.ensemble and len(self.steps) != 1:
            raise ValueError(f"{self.declared_in}: a pipeline without an ensemble is one model, not {list(self.steps)}")
        ends = {REQUEST: -1, **{step: index for index, step in enumerate(self.steps)}, RESPONSE: len(self.steps),
                DIRECT: len(self.steps)}
        seen = set()
        for tensor in self.tensors:
            where = f"{self.declared_in}: tensor {tensor.name!r} ({tensor.source} -> {tensor.sink})"
            if tensor.source not in ends or tensor.source in (RESPONSE, DIRECT):
                raise ValueError(f"{where}: its source is none of {[REQUEST, *self.steps]}")
            if tensor.sink not in ends or tensor.sink == REQUEST:
                raise ValueError(f"{where}: its sink is none of {[*self.steps, RESPONSE]}")
            if tensor.source == REQUEST and tensor.sink in (RESPONSE, DIRECT):
                raise ValueError(f"{where}: no model takes or sends it")
            if ends[tensor.source] >= ends[tensor.sink]:
                raise ValueError(f"{where}: a step must take it after its source sends it")
            if tensor.optional and tensor.sink in (RESPONSE, DIRECT):
                raise ValueError(f"{where}: only an input can be optional")
            # A model has one output and one input of each name; the tensors between the ensemble's
            # steps (`_<name>`) are one of each name too.
            keys = ["the request's tensors" if tensor.source == REQUEST else f"the outputs of {tensor.source}"]
            if tensor.sink != DIRECT:
                keys.append("the response's tensors" if tensor.sink == RESPONSE else f"the inputs of {tensor.sink}")
            if _between_steps(tensor):
                keys.append("the tensors between the ensemble's steps")
            for key in keys:
                if (key, tensor.name) in seen:
                    raise ValueError(f"{where}: declared twice among {key}")
                seen.add((key, tensor.name))

    def _ragged(self, tensor: PipelineTensor) -> bool:
        return self.ragged_batches and -1 in tensor.dims

    def _model(self, step: str) -> ModelTensors:
        """A step's inputs, what earlier steps send it first (in their order), then the request's;
        its outputs in the order declared."""
        order = {REQUEST: len(self.steps), **{name: index for index, name in enumerate(self.steps)}}
        taken = sorted((t for t in self.tensors if t.sink == step), key=lambda t: order[t.source])
        return ModelTensors(
            inputs=tuple(ConfigTensor(t.name, t.dtype, t.dims, t.optional, self._ragged(t), t.sink_note)
                         for t in taken),
            outputs=tuple(ConfigTensor(t.name, t.dtype, t.dims, note=t.source_note)
                          for t in self.tensors if t.source == step))

    def _ensemble(self) -> ModelTensors:
        """The request's tensors as its inputs, the response's as its outputs, and each step's
        maps, in the order of the step's inputs and outputs."""
        steps = []
        for step in self.steps:
            model = self._model(step)
            sinks = {t.name: _ensemble_name(t) for t in self.tensors if t.sink == step}
            sources = {t.name: _ensemble_name(t) for t in self.tensors if t.source == step and t.sink != DIRECT}
            steps.append(EnsembleStep(step, tuple((i.name, sinks[i.name]) for i in model.inputs),
                                      tuple((o.name, sources[o.name]) for o in model.outputs if o.name in sources)))
        return ModelTensors(
            inputs=tuple(ConfigTensor(t.name, t.dtype, t.dims, t.optional, note=t.source_note)
                         for t in self.tensors if t.source == REQUEST),
            outputs=tuple(ConfigTensor(t.name, t.dtype, t.dims, note=t.sink_note)
                          for t in self.tensors if t.sink == RESPONSE),
            steps=tuple(steps))

    def region(self, model: str) -> str:
        """The lines written into `model`'s config.pbtxt, markers included."""
        head = (f"{BEGIN_MARKER[2:]} by `{COMMAND}` from {self.declared_in}: edit it there, not the lines up to "
                "END GENERATED (a unit test compares them).")
        marker = "".join(f"# {line}\n" for line in _wrapped(head, WIDTH - 2))
        return marker + self.models[model].text() + f"{END_MARKER}\n"


def _between_steps(tensor: PipelineTensor) -> bool:
    return tensor.source != REQUEST and tensor.sink not in (RESPONSE, DIRECT)


def _ensemble_name(tensor: PipelineTensor) -> str:
    """The ensemble's name for the tensor: its own for the request's and the response's."""
    return f"_{tensor.name}" if _between_steps(tensor) else tensor.name


def splice(path: Path, text: str, region: str) -> str:
    """`text` (the file at `path`) with its lines from BEGIN_MARKER to END_MARKER replaced by
    `region`; every other line as it was."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.startswith(BEGIN_MARKER)]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\n") == END_MARKER]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise ValueError(f"{path}: needs one line starting {BEGIN_MARKER!r} and, after it, one line {END_MARKER!r} "
                         f"around its generated tensors (found {len(begins)} and {len(ends)})")
    return "".join(lines[:begins[0]]) + region + "".join(lines[ends[0] + 1:])


def config_file(root: Path, repositories: Iterable[str], model: str) -> Path:
    """The committed config.pbtxt of the model folder `model` (a link to another folder, as
    ensembles/ensemble is, is not a model of its own)."""
    found = [root / repository / model / "config.pbtxt" for repository in repositories
             if (root / repository / model / "config.pbtxt").exists() and not (root / repository / model).is_symlink()]
    if len(found) != 1:
        raise ValueError(f"model {model!r}: expected one config.pbtxt under {', '.join(repositories)}, found {found}")
    return found[0]


def generated_files(root: Path, repositories: Iterable[str], pipelines: Iterable[Pipeline]) -> dict[Path, str]:
    """Each committed config.pbtxt the pipelines write, and its text as they write it."""
    repositories = tuple(repositories)
    files = {}
    for pipeline in pipelines:
        for model in pipeline.models:
            path = config_file(root, repositories, model)
            if path in files:
                raise ValueError(f"{path}: written by two declarations")
            files[path] = splice(path, path.read_text(), pipeline.region(model))
    return files


def write_committed(root: Path, repositories: Iterable[str], pipelines: Iterable[Pipeline]) -> list[Path]:
    """Rewrites the generated lines of every committed config.pbtxt the pipelines write; returns
    the files that changed. Every file is checked before any is written."""
    changed = {path: text for path, text in generated_files(root, repositories, pipelines).items()
               if path.read_text() != text}
    for path, text in changed.items():
        path.write_text(text)
    return list(changed)

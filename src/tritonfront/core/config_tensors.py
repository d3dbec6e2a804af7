"""The tensors of committed config.pbtxt files, written from a declaration: a pipeline of models
(an ensemble's steps, or one model alone) and every tensor that flows through it, from the
client's request or a step's outputs to a step's inputs or the client's response.

From it come each model's `input` and `output` lists and, for an ensemble, its steps' input_map
and output_map. Two ensembles may run the same steps for two contracts (generate and
tensorrt_llm_decoupled): such a step's config carries the tensors of both pipelines, each
declared alike wherever both name it (merged_model). They are written between two marker lines of each model's committed config.pbtxt
(BEGIN_MARKER ... END_MARKER); the lines around them (name, backend, batching, instance groups,
parameters and the comments that say why) stay as written by hand, byte for byte. Triton loads
the committed files as they are, so they stay complete configs; `python scripts/configure.py
--write-committed` rewrites the generated lines, and a unit test fails while they differ.

The text is written here rather than by protobuf's text_format, which drops comments.
"""
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Optional, Sequence

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
    # A request's or a response's tensor whose ensemble (its client) names or shapes it otherwise
    # than the step that takes or sends it: the ensemble's name and dims (empty: the step's). A
    # contract whose names are not the steps' own (tritonfront.core.llmapi_contract) routes its
    # tensors so; the steps read one name for one meaning.
    ensemble_name: str = ""
    ensemble_dims: Optional[tuple[int, ...]] = None

    @property
    def outer_name(self) -> str:
        """The ensemble's name for it: its own for the request's and the response's tensors."""
        return self.ensemble_name or self.name


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
    # A step that takes every input of the request besides its own, as optional inputs it leaves
    # unread (EVERY_INPUT_NOTE says why), or None.
    every_input_to: Optional[str] = None
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
        if self.every_input_to is not None and self.every_input_to not in self.steps:
            raise ValueError(f"{self.declared_in}: every_input_to {self.every_input_to!r} is none of {list(self.steps)}")
        ends = {REQUEST: -1, **{step: index for index, step in enumerate(self.steps)}, RESPONSE: len(self.steps),
                DIRECT: len(self.steps)}
        seen = set()
        requested = {}  # the ensemble's input of each name, as the first tensor from the request declared it
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
            renamed = tensor.ensemble_name or tensor.ensemble_dims is not None
            if renamed and (not self.ensemble or _between_steps(tensor) or tensor.sink == DIRECT):
                raise ValueError(f"{where}: only an ensemble's request and response tensors have an ensemble name or "
                                 "dims of their own")
            # A model has one output and one input of each name; the tensors between the ensemble's
            # steps (`_<name>`) are one of each name too. One input of the ensemble may go to
            # several steps, declared alike for each.
            keys = [] if tensor.source == REQUEST else [(f"the outputs of {tensor.source}", tensor.name)]
            if tensor.source == REQUEST:
                outer = replace(self._outer(tensor), note="")
                if requested.setdefault(outer.name, outer) != outer:
                    raise ValueError(f"{where}: declared twice among the request's tensors, with another type, shape "
                                     "or optional flag")
            if tensor.sink == RESPONSE:
                keys.append(("the response's tensors", tensor.outer_name))
            elif tensor.sink != DIRECT:
                keys.append((f"the inputs of {tensor.sink}", tensor.name))
            if _between_steps(tensor):
                keys.append(("the tensors between the ensemble's steps", tensor.name))
            for key in keys:
                if key in seen:
                    raise ValueError(f"{where}: declared twice among {key[0]}")
                seen.add(key)

    @staticmethod
    def _outer(tensor: PipelineTensor) -> ConfigTensor:
        """The tensor as the ensemble lists it: a request's as its input, a response's as its output."""
        dims = tensor.dims if tensor.ensemble_dims is None else tensor.ensemble_dims
        if tensor.source == REQUEST:
            return ConfigTensor(tensor.outer_name, tensor.dtype, dims, tensor.optional, note=tensor.source_note)
        return ConfigTensor(tensor.outer_name, tensor.dtype, dims, note=tensor.sink_note)

    def _ragged(self, tensor: PipelineTensor) -> bool:
        return self.ragged_batches and -1 in tensor.dims

    def _model(self, step: str) -> ModelTensors:
        """A step's inputs, what earlier steps send it first (in their order), then the request's
        (then, for every_input_to, the rest of the request's); its outputs in the order declared."""
        order = {REQUEST: len(self.steps), **{name: index for index, name in enumerate(self.steps)}}
        taken = sorted((t for t in self.tensors if t.sink == step), key=lambda t: order[t.source])
        inputs = [ConfigTensor(t.name, t.dtype, t.dims, t.optional, self._ragged(t), t.sink_note) for t in taken]
        inputs += [ConfigTensor(t.name, t.dtype, t.dims, True, self._ragged(t), EVERY_INPUT_NOTE if i == 0 else "")
                   for i, t in enumerate(self._passed_by(step))]
        return ModelTensors(
            inputs=tuple(inputs),
            outputs=tuple(ConfigTensor(t.name, t.dtype, t.dims, note=t.source_note)
                          for t in self.tensors if t.source == step))

    def _passed_by(self, step: str) -> list[PipelineTensor]:
        """The request's tensors `step` takes only as every_input_to."""
        if step != self.every_input_to:
            return []
        return [t for t in self.tensors if t.source == REQUEST and t.sink != step]

    def _ensemble(self) -> ModelTensors:
        """The request's tensors as its inputs, the response's as its outputs, and each step's
        maps, in the order of the step's inputs and outputs."""
        steps = []
        for step in self.steps:
            model = self._model(step)
            sinks = {t.name: _ensemble_name(t) for t in self.tensors if t.sink == step}
            sinks.update({t.name: t.name for t in self._passed_by(step)})
            sources = {t.name: _ensemble_name(t) for t in self.tensors if t.source == step and t.sink != DIRECT}
            steps.append(EnsembleStep(step, tuple((i.name, sinks[i.name]) for i in model.inputs),
                                      tuple((o.name, sources[o.name]) for o in model.outputs if o.name in sources)))
        inputs = {}
        for tensor in self.tensors:
            if tensor.source == REQUEST:
                inputs.setdefault(tensor.outer_name, self._outer(tensor))  # once, however many steps take it
        return ModelTensors(
            inputs=tuple(inputs.values()),
            outputs=tuple(self._outer(t) for t in self.tensors if t.sink == RESPONSE),
            steps=tuple(steps))

    def region(self, model: str) -> str:
        """The lines written into `model`'s config.pbtxt, markers included."""
        return marked_region([self.declared_in], self.models[model])


def marked_region(declared_in: Sequence[str], tensors: ModelTensors) -> str:
    """A model's generated lines, markers included, naming the declarations they come from."""
    head = (f"{BEGIN_MARKER[2:]} by `{COMMAND}` from {' and '.join(declared_in)}: edit it there, not the lines up "
            "to END GENERATED (a unit test compares them).")
    marker = "".join(f"# {line}\n" for line in _wrapped(head, WIDTH - 2))
    return marker + tensors.text() + f"{END_MARKER}\n"


def merged_model(model: str, pipelines: Sequence[Pipeline]) -> ModelTensors:
    """The tensors of a step that several pipelines run: its inputs and outputs in the first
    pipeline's order, then what each later one adds. A tensor both name must be declared alike
    (type, shape, optional, ragged; a comment from either), and an input one of them requires must
    be one every ensemble that runs the step sends it."""
    where = f"model {model!r} (a step of {' and '.join(p.declared_in for p in pipelines)})"
    if any(p.ensemble == model for p in pipelines):
        raise ValueError(f"{where}: an ensemble is written by one declaration")
    views = [p.models[model] for p in pipelines]

    def merge(kind: str, lists: list[tuple[ConfigTensor, ...]]) -> tuple[ConfigTensor, ...]:
        merged: dict[str, ConfigTensor] = {}
        for tensors in lists:
            for tensor in tensors:
                first = merged.setdefault(tensor.name, tensor)
                if replace(first, note="") != replace(tensor, note=""):
                    raise ValueError(f"{where}: {kind} {tensor.name!r} is declared differently: {first} and {tensor}")
                if not first.note and tensor.note:
                    merged[tensor.name] = tensor
        return tuple(merged.values())

    inputs = merge("input", [view.inputs for view in views])
    for tensor in inputs:
        lacking = [p.declared_in for p, view in zip(pipelines, views) if tensor.name not in {i.name for i in view.inputs}]
        if not tensor.optional and lacking:
            raise ValueError(f"{where}: input {tensor.name!r} is required, and {' and '.join(lacking)} never sends it")
    return ModelTensors(inputs, merge("output", [view.outputs for view in views]))


# Why every_input_to's step takes the whole request: Triton 2.51 checks only how many inputs a
# request has, and runs an ensemble step even when the request holds none of that step's inputs;
# the Python backend then fails the step's input-less request before its model sees it ("out of
# bounds index 0: request has 0 inputs", reading the batch size off input 0), so the client is
# never told which input it left out. A first step that takes every input of the request runs its
# model whenever the request holds any input, and the model names the one that is missing.
EVERY_INPUT_NOTE = ("Every input of the request from here on, left unread: a request without this model's own "
                    "inputs still reaches it, and it names the one missing (Triton 2.51 would hand it a request of "
                    "no inputs, which the Python backend refuses unnamed: src/tritonfront/core/config_tensors.py).")


def _between_steps(tensor: PipelineTensor) -> bool:
    return tensor.source != REQUEST and tensor.sink not in (RESPONSE, DIRECT)


def _ensemble_name(tensor: PipelineTensor) -> str:
    """The ensemble's name for the tensor: `_<name>` between steps, the ensemble's own for the
    request's and the response's."""
    return f"_{tensor.name}" if _between_steps(tensor) else tensor.outer_name


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
    """Each committed config.pbtxt the pipelines write, and its text as they write it (a step that
    several pipelines run: merged_model)."""
    repositories = tuple(repositories)
    writers: dict[str, list[Pipeline]] = {}
    for pipeline in pipelines:
        for model in pipeline.models:
            writers.setdefault(model, []).append(pipeline)
    files = {}
    for model, declared_by in writers.items():
        path = config_file(root, repositories, model)
        if path in files:
            raise ValueError(f"{path}: written for two models")
        tensors = declared_by[0].models[model] if len(declared_by) == 1 else merged_model(model, declared_by)
        files[path] = splice(path, path.read_text(), marked_region([p.declared_in for p in declared_by], tensors))
    return files


def write_committed(root: Path, repositories: Iterable[str], pipelines: Iterable[Pipeline]) -> list[Path]:
    """Rewrites the generated lines of every committed config.pbtxt the pipelines write; returns
    the files that changed. Every file is checked before any is written."""
    changed = {path: text for path, text in generated_files(root, repositories, pipelines).items()
               if path.read_text() != text}
    for path, text in changed.items():
        path.write_text(text)
    return list(changed)

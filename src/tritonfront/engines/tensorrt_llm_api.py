"""The adapter's API manifest (tensorrt_llm_api.json) against an installed TensorRT-LLM: every name it
lists is there, with the values it lists, and which optional names (what changed inside the release
line) the installed package has.

Two ways to read the package, one list of findings:
- imported (`check_imported`): pydantic fields, dataclass fields, signatures, enum members, as the
  adapter meets them; where TensorRT-LLM imports (its CUDA libraries load: tests/gpu, run by
  scripts/verify_gpu.sh on a GPU machine);
- from its sources (`check_sources`, ast only, nothing imported): where importing needs a GPU driver
  that is not there (the image build: Dockerfile.trtllm runs `python3 -m
  tritonfront.engines.tensorrt_llm_api`). A class's fields are its annotated names and those of its
  bases that the package defines; a name found nowhere while some base could not be read is
  reported as unresolved, not missing.

NOT RUN HERE against a real package: TensorRT-LLM cannot be installed where this project is built;
the unit tests read fake packages that present each release branch.
"""
import argparse
import ast
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import json
import sys
import textwrap
import typing
from pathlib import Path
from typing import Optional

MANIFEST = json.loads((Path(__file__).with_name("tensorrt_llm_api.json")).read_text())
OBJECTS = MANIFEST["objects"]


@dataclasses.dataclass
class Findings:
    missing: list = dataclasses.field(default_factory=list)  # manifest names the package lacks
    unresolved: list = dataclasses.field(default_factory=list)  # names the sources alone could not settle
    optional: dict = dataclasses.field(default_factory=dict)  # optional name -> present

    def report(self) -> str:
        lines = [f"missing: {name}" for name in dict.fromkeys(self.missing)]
        lines += [f"unresolved (a base class could not be read): {name}" for name in self.unresolved]
        lines += [f"optional {name}: {'present' if present else 'absent'}" for name, present in self.optional.items()]
        return "\n".join(lines)


def _required(spec: dict, key: str) -> list:
    return list(spec.get(key, []))


# --- imported -----------------------------------------------------------------------------------


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def literal_values(annotation) -> set:
    """The strings an annotation admits: Literal members and enum values, through Optional/Union."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {member.value for member in annotation}
    found = {arg for arg in typing.get_args(annotation) if isinstance(arg, str)}
    for arg in typing.get_args(annotation):
        if not isinstance(arg, str):
            found |= literal_values(arg)
    return found


def _assigned_attributes(cls) -> set:
    """Attributes a class or its bases set on self (`self.name = ...`)."""
    names = set()
    for base in cls.__mro__[:-1]:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        except (OSError, TypeError):
            continue
        names |= _self_assignments(tree)
    return names


def _init_fields(cls) -> dict:
    """{field name: annotation} a class takes: pydantic model fields or dataclass init fields."""
    if hasattr(cls, "model_fields"):
        return {name: field.annotation for name, field in cls.model_fields.items()}
    if dataclasses.is_dataclass(cls):
        return {field.name: field.type for field in dataclasses.fields(cls) if field.init}
    return {name: None for name in inspect.signature(cls).parameters}


def check_imported() -> Findings:
    """The manifest against the imported package (ImportError where TensorRT-LLM is not installed)."""
    findings = Findings()
    for module_name, spec in MANIFEST["modules"].items():
        module = importlib.import_module(module_name)
        findings.missing += [f"{module_name}.{name}" for name in spec["names"] if not hasattr(module, name)]
        findings.optional.update({f"{module_name}.{name}": hasattr(module, name) for name in spec.get("optional", {})})
    for name, spec in OBJECTS.items():
        where = spec["where"]
        try:
            cls = _resolve(where["class"])
        except (ImportError, AttributeError):
            if "optional_object" in spec:
                continue
            findings.missing.append(where["class"])
            continue
        if spec["kind"] == "enum":
            findings.missing += [f"{name}.{member}" for member in spec["members"] if member not in cls.__members__]
            continue
        if "init" in spec:
            fields = _init_fields(_resolve(where["fields"]) if "fields" in where else cls)
            findings.missing += [f"{name}({field}=...)" for field in spec["init"] if field not in fields]
            findings.optional.update({f"{name}({field}=...)": field in fields for field in spec.get("optional", {})})
            for field, values in spec.get("values", {}).items():
                admitted = literal_values(fields.get(field))
                if admitted:  # a plain str (dtype) admits anything: TensorRT-LLM checks it when loading
                    findings.missing += [f"{name}({field}={value!r})" for value in values if value not in admitted]
        for method, parameters in spec.get("calls", {}).items():
            if not hasattr(cls, method):
                findings.missing.append(f"{name}.{method}")
                continue
            present = inspect.signature(getattr(cls, method)).parameters
            findings.missing += [f"{name}.{method}({parameter}=...)" for parameter in parameters
                                 if parameter not in present]
        if "attributes" in spec:
            present = set(dir(cls)) | _assigned_attributes(cls)
            if dataclasses.is_dataclass(cls):
                present |= {field.name for field in dataclasses.fields(cls)}
            findings.missing += [f"{name}.{attribute}" for attribute in spec["attributes"] if attribute not in present]
    return findings


# --- from the sources ---------------------------------------------------------------------------


def _self_assignments(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        names |= {target.attr for target in targets if isinstance(target, ast.Attribute)
                  and isinstance(target.value, ast.Name) and target.value.id == "self"}
    return names


class Sources:
    """A package's modules read with ast, classes found by name through the imports of the module
    that uses them."""

    def __init__(self, root: Path):
        self.root = root  # the folder that holds the package folder (site-packages)
        self._trees: dict = {}

    def tree(self, module: str) -> Optional[ast.Module]:
        if module not in self._trees:
            parts = module.split(".")
            candidates = [self.root.joinpath(*parts).with_suffix(".py"), self.root.joinpath(*parts, "__init__.py")]
            path = next((path for path in candidates if path.exists()), None)
            self._trees[module] = ast.parse(path.read_text()) if path else None
        return self._trees[module]

    def top_level_names(self, module: str) -> set:
        names = set()
        for node in self.tree(module).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {target.id for target in targets if isinstance(target, ast.Name)}
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        return names

    def find_class(self, module: str, name: str, depth: int = 0) -> Optional[tuple]:
        """(module, ClassDef) of class `name` as `module` knows it: defined there or imported."""
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, node)
                        if source is not None:
                            return self.find_class(source, alias.name, depth + 1)
        return None

    def _absolute(self, module: str, node: ast.ImportFrom) -> Optional[str]:
        if node.level == 0:
            return node.module if (node.module or "").startswith(module.split(".")[0]) else None
        package = module.split(".")
        is_package = self.root.joinpath(*package, "__init__.py").exists()
        base = package if is_package else package[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def class_members(self, module: str, node: ast.ClassDef) -> tuple[dict, set, bool]:
        """({annotated field: annotation node}, every other name defined or set on self, whether every
        base of the package's own was read), through the bases the package defines."""
        fields, names, complete = {}, set(), True
        for base in node.bases:
            base_name = ast.unparse(base).split("[")[0].split(".")[-1]
            found = self.find_class(module, base_name)
            if found is None:
                if base_name not in _EXTERNAL_BASES:
                    complete = False
                continue
            base_fields, base_names, base_complete = self.class_members(*found)
            fields.update(base_fields)
            names |= base_names
            complete &= base_complete
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                init = not (isinstance(item.value, ast.Call) and any(
                    keyword.arg == "init" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False
                    for keyword in item.value.keywords))
                if init and not item.target.id.startswith("_"):
                    fields[item.target.id] = item.annotation
                else:
                    names.add(item.target.id)
            elif isinstance(item, ast.Assign):
                names |= {target.id for target in item.targets if isinstance(target, ast.Name)}
            elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(item.name)
        names |= _self_assignments(node)
        return fields, names, complete

    def method_parameters(self, module: str, node: ast.ClassDef, method: str) -> Optional[list]:
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                arguments = item.args
                return [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
        for base in node.bases:
            found = self.find_class(module, ast.unparse(base).split("[")[0].split(".")[-1])
            if found is not None:
                parameters = self.method_parameters(*found, method)
                if parameters is not None:
                    return parameters
        return None


# Bases from outside the package that give a class none of the manifest's names.
_EXTERNAL_BASES = {"object", "BaseModel", "Enum", "IntEnum", "StrEnum", "str", "int", "ABC", "NamedTuple",
                   "Generic", "StrictBaseModel"}


def _strings(annotation) -> set:
    return {node.value for node in ast.walk(annotation) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def check_sources(root: Path) -> Findings:
    """The manifest against the sources of the package installed under `root` (site-packages)."""
    sources, findings = Sources(root), Findings()
    for module_name, spec in MANIFEST["modules"].items():
        if sources.tree(module_name) is None:
            findings.missing.append(module_name)
            continue
        present = sources.top_level_names(module_name)
        # A submodule is a name of its package once imported.
        present |= {path.stem for path in root.joinpath(*module_name.split(".")).glob("*.py")}
        present |= {path.parent.name for path in root.joinpath(*module_name.split(".")).glob("*/__init__.py")}
        findings.missing += [f"{module_name}.{name}" for name in spec["names"] if name not in present]
        findings.optional.update({f"{module_name}.{name}": name in present for name in spec.get("optional", {})})
    for name, spec in OBJECTS.items():
        where = spec["where"]
        module, _, class_name = where["class"].rpartition(".")
        found = sources.find_class(module, class_name)
        if found is None:
            if "optional_object" not in spec:
                findings.missing.append(where["class"])
            continue
        fields, names, complete = sources.class_members(*found)
        # Found nowhere: missing, unless a base class of the package's own could not be read.
        absent = findings.missing.append if complete else findings.unresolved.append
        if spec["kind"] == "enum":
            for member in spec["members"]:
                if member not in names:
                    absent(f"{name}.{member}")
            continue
        if "init" in spec:
            field_class = found
            if "fields" in where:
                field_module, _, field_name = where["fields"].rpartition(".")
                field_class = sources.find_class(field_module, field_name)
            if field_class is None:
                findings.missing.append(where["fields"])
                continue
            init_fields, _, init_complete = sources.class_members(*field_class)
            for field in spec["init"]:
                if field not in init_fields:
                    (findings.missing if init_complete else findings.unresolved).append(f"{name}({field}=...)")
            findings.optional.update({f"{name}({field}=...)": field in init_fields for field in spec.get("optional", {})})
            for field, values in spec.get("values", {}).items():
                admitted = _strings(init_fields[field]) if field in init_fields else set()
                if admitted:
                    findings.missing += [f"{name}({field}={value!r})" for value in values if value not in admitted]
        for method, parameters in spec.get("calls", {}).items():
            present = sources.method_parameters(*found, method)
            if present is None:
                absent(f"{name}.{method}")
                continue
            findings.missing += [f"{name}.{method}({parameter}=...)" for parameter in parameters
                                 if parameter not in present]
        for attribute in spec.get("attributes", []):
            if attribute not in names and attribute not in fields:
                absent(f"{name}.{attribute}")
    return findings


def installed_root() -> Path:
    """The folder holding the installed tensorrt_llm package, found without importing it."""
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("tensorrt_llm is not installed here")
    return Path(list(spec.submodule_search_locations)[0]).parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Check tensorrt_llm_api.json against the installed TensorRT-LLM's "
                                                 "sources (no import: no GPU needed). Exit status 1 when a name is "
                                                 "missing.")
    parser.add_argument("--root", type=Path, help="the folder holding the tensorrt_llm package (default: found "
                                                  "where Python would import it from)")
    args = parser.parse_args(argv)
    findings = check_sources(args.root or installed_root())
    print(findings.report() or "every name of the manifest is there")
    return 1 if findings.missing else 0


if __name__ == "__main__":
    sys.exit(main())

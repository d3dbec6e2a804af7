"""The library runs without Triton and its modules import downward only.

Rooms: Triton glue (model.py files, python_backend/triton_glue.py) -> the library
(python_backend/tritonfront) -> engines (tritonfront/engines). Inside the library each module may
import only modules of lower layers, so low-level modules never depend on what is built on them.
The OpenAI front (tritonfront/openai) is a process of its own, a gRPC client of Triton, on top.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tritonfront

LIBRARY = Path(tritonfront.__file__).parent
TRITON_ONLY = ("triton_python_backend_utils", "triton_glue")
# Lowest first. "engines" and "openai" stand for their whole packages, each of which may import itself.
PACKAGES = ("engines", "openai")
LAYERS = [
    {"errors", "threads"},
    {"engines"},
    {"inputs", "shared_tables", "ragged", "devices", "model_sources", "stopping", "load", "server_metrics",
     "trtllm_contract"},
    {"tokenization", "encoding", "detokenization", "delivery", "balancing", "generation_request", "core_sharing"},
    {"pooling", "generation"},
    {"fanout"},
    {"model_config"},
    {"watchdog"},
    {"openai"},
]
LAYER = {module: depth for depth, modules in enumerate(LAYERS) for module in modules}


def library_modules() -> dict[str, Path]:
    """The dotted name of every module below tritonfront ("engines.hf", "openai.router", "pooling")."""
    return {".".join(path.relative_to(LIBRARY).with_suffix("").parts): path
            for path in LIBRARY.rglob("*.py")}


def unit(module: str) -> str:
    """The package a module belongs to ("engines", "openai"), or the module itself."""
    return module.split(".")[0]


def imports(module: str, path: Path) -> set[str]:
    """Everything the file imports (at any depth, function bodies too), as absolute names."""
    package = ["tritonfront", *module.split(".")[:-1]]  # a package's __init__ is in the package too
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            names.add(target)
            if not node.module:  # from . import x: x is a module
                names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def test_every_library_module_has_a_layer():
    units = {unit(module) for module in library_modules() if module != "__init__"}
    assert units == set(LAYER)


def test_the_library_never_imports_triton():
    offenders = {module: sorted(name for name in imports(module, path) if name.split(".")[0] in TRITON_ONLY)
                 for module, path in library_modules().items()}
    assert {module: names for module, names in offenders.items() if names} == {}


@pytest.mark.parametrize("module", sorted(m for m in library_modules() if m != "__init__"))
def test_imports_go_downward(module):
    path = library_modules()[module]
    mine = LAYER[unit(module)]
    upward = []
    for name in imports(module, path):
        parts = name.split(".")
        if parts[0] != "tritonfront" or len(parts) == 1:
            continue
        target = unit(".".join(parts[1:]))
        if target == unit(module) in PACKAGES:
            continue
        if LAYER[target] >= mine:
            upward.append(f"{name} (layer {LAYER[target]} >= {mine})")
    assert upward == [], f"{module} imports sideways or upward"


def test_every_module_imports_where_triton_does_not_exist():
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in TRITON_ONLY)  # import raises ImportError
    modules = ", ".join(f"tritonfront.{m}" for m in sorted(library_modules()) if m != "__init__")
    result = subprocess.run([sys.executable, "-c", f"import sys; {blocked}; import {modules}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

"""The house imports downward only, one package per process or role.

Rooms, highest first (src/tritonfront/__init__.py says what runs where):
- processes and their glue, none importing another: `stubs` (inside Triton's Python-backend stubs,
  with the model.py adapters of model_repository/), `watchdog` (beside tritonserver), `openai` (the
  HTTP front);
- `core`, the library the stubs run: no Triton, no HTTP; inside it each module imports only
  modules of lower layers, so low-level modules never depend on what is built on them;
- `engines`, below the core;
- `errors` and `threads`, which every room shares.
Around the product: tests and benchmarks share harness/; the product imports neither of them nor
harness/, and harness/ imports neither tests/ nor perf/.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import harness
import tritonfront

PRODUCT = Path(tritonfront.__file__).parent
ROOT = PRODUCT.parents[1]
HARNESS = Path(harness.__file__).parent
TRITON_ONLY = ("triton_python_backend_utils", "tritonfront.stubs")
PROCESSES = {"stubs", "watchdog", "openai"}
ROOMS = {"errors": 0, "threads": 0, "engines": 1, "core": 2, **{process: 3 for process in PROCESSES}}
# The core's own layers, lowest first.
CORE_LAYERS = [
    {"inputs", "shared_tables", "ragged", "devices", "model_sources", "stopping", "rank_load", "trtllm_contract",
     "triton_flags"},
    {"encoding", "delivery", "balancing", "generation_request", "core_sharing", "llmapi_contract", "stop_requests"},
    {"tokenization", "detokenization", "pooling", "generation_loop", "llmapi_request"},
    {"fanout"},
    {"model_config"},
]
CORE_LAYER = {module: depth for depth, modules in enumerate(CORE_LAYERS) for module in modules}


def product_modules() -> dict[str, Path]:
    """The dotted name of every module below tritonfront ("engines.hf", "core.pooling", "openai.router", "errors")."""
    return {".".join(path.relative_to(PRODUCT).with_suffix("").parts): path
            for path in PRODUCT.rglob("*.py") if path.name != "__init__.py" or path.parent != PRODUCT}


def imports(path: Path, package: list[str]) -> set[str]:
    """Everything the file imports (at any depth, function bodies too), as absolute names;
    `package` is the file's package, for relative imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def module_imports(module: str) -> set[str]:
    path = product_modules()[module]
    package = ["tritonfront", *module.split(".")[:-1]]  # a package's __init__ is in the package too
    return imports(path, package)


def room(module: str) -> str:
    return module.split(".")[0]


def test_every_module_has_a_room_and_every_core_module_a_layer():
    assert {room(module) for module in product_modules()} == set(ROOMS)
    core = {module.split(".")[1] for module in product_modules() if room(module) == "core"} - {"__init__"}
    assert core == set(CORE_LAYER)


def test_only_the_stubs_room_imports_triton():
    offenders = {module: sorted(name for name in module_imports(module) if name.startswith(TRITON_ONLY))
                 for module in product_modules() if room(module) != "stubs"}
    assert {module: names for module, names in offenders.items() if names} == {}


@pytest.mark.parametrize("module", sorted(product_modules()))
def test_imports_go_downward(module):
    mine = room(module)
    upward = []
    for name in module_imports(module):
        parts = name.split(".")
        if parts[0] != "tritonfront" or len(parts) == 1 or parts[1] not in ROOMS:
            continue
        target = parts[1]
        if target == mine:
            if mine == "core" and len(parts) > 2 and parts[2] in CORE_LAYER and module.split(".")[1] in CORE_LAYER:
                if CORE_LAYER[parts[2]] >= CORE_LAYER[module.split(".")[1]] and parts[2] != module.split(".")[1]:
                    upward.append(f"{name} (core layer {CORE_LAYER[parts[2]]} >= {CORE_LAYER[module.split('.')[1]]})")
            continue
        if ROOMS[target] >= ROOMS[mine]:
            upward.append(f"{name} (room {target} is not below {mine})")
    assert upward == [], f"{module} imports sideways or upward"


def python_files(*folders: Path) -> list[Path]:
    return [path for folder in folders for path in folder.rglob("*.py")]


def top_level_imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imports(path, [])}


@pytest.mark.parametrize("folder", ["src", "model_repository", "ensembles"])
def test_the_product_imports_neither_harness_nor_tests_nor_perf(folder):
    offenders = {str(path.relative_to(ROOT)): sorted(top_level_imports(path) & {"harness", "tests", "perf"})
                 for path in python_files(ROOT / folder)}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_harness_imports_neither_tests_nor_perf():
    local = {path.stem for path in python_files(ROOT / "tests", ROOT / "perf")}
    offenders = {str(path.relative_to(ROOT)): sorted(top_level_imports(path) & ({"tests", "perf"} | local))
                 for path in python_files(HARNESS)}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_every_module_but_the_stubs_imports_where_triton_does_not_exist():
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in ("triton_python_backend_utils",))
    modules = ", ".join(f"tritonfront.{m}".removesuffix(".__init__") for m in sorted(product_modules())
                        if room(m) != "stubs" and not m.endswith("__main__"))
    result = subprocess.run([sys.executable, "-c", f"import sys; {blocked}; import {modules}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

"""The house imports downward only, one package per process or role.

Rooms, highest first (src/tritonfront/__init__.py says what runs where):
- processes and their glue, none importing another: `stubs` (inside Triton's Python-backend stubs,
  with the model.py adapters of model_repository/), `watchdog` (beside tritonserver), `openai` (the
  HTTP front, whose modules import no torch);
- `triton`, the Triton glue the stubs and the watchdog share (what Triton's model args and
  tritonserver's command line say), importing no Triton module;
- `core`, the library the stubs run: no Triton, no HTTP; inside it each module imports only
  modules of lower layers, so low-level modules never depend on what is built on them;
- `engines`, below the core;
- `errors` and `threads`, which every room shares.
No class name is defined in two modules, and no modules import each other in a circle (function
bodies included). Around the product: tests and benchmarks share harness/; the product imports
neither of them nor harness/, and harness/ imports neither tests/ nor perf/.
"""
import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

import pytest

import harness
from harness.fresh_python import last_line
import tritonfront

PRODUCT = Path(tritonfront.__file__).parent
ROOT = PRODUCT.parents[1]
HARNESS = Path(harness.__file__).parent
TRITON_ONLY = ("triton_python_backend_utils", "tritonfront.stubs")
PROCESSES = {"stubs", "watchdog", "openai"}
ROOMS = {"errors": 0, "threads": 0, "engines": 1, "core": 2, "triton": 3, **{process: 4 for process in PROCESSES}}
# The core's own layers, lowest first.
CORE_LAYERS = [
    {"config_tensors", "chat_template"},
    {"tokenizer_files", "inputs", "shared_tables", "padding", "chunk_packing", "ragged", "model_sources", "stopping", "rank_load", "trtllm_contract"},
    {"encoding", "delivery", "balancing", "generation_request", "core_sharing", "llmapi_contract", "stop_requests",
     "server_stop"},
    {"tokenization", "detokenization", "pooling", "generation_loop", "llmapi_request"},
    {"fanout"},
    {"model_config"},
]
CORE_LAYER = {module: depth for depth, modules in enumerate(CORE_LAYERS) for module in modules}


def product_modules() -> dict[str, Path]:
    """The dotted name of every module below tritonfront ("engines.base", "core.pooling", "openai.router", "errors")."""
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


def defined_classes(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}


def test_no_class_name_is_defined_in_two_modules():
    where = defaultdict(list)
    for module, path in product_modules().items():
        for name in defined_classes(path):
            where[name].append(module)
    assert {name: sorted(modules) for name, modules in where.items() if len(modules) > 1} == {}


def resolve(name: str, modules: dict[str, Path]) -> Optional[str]:
    """The product module an absolute import name loads: itself, its package's __init__, or for
    a name inside a module (a class, a function), that module; None outside the product."""
    parts = name.split(".")
    if parts[0] != "tritonfront":
        return None
    parts = parts[1:]
    while parts:
        dotted = ".".join(parts)
        for candidate in (dotted, f"{dotted}.__init__"):
            if candidate in modules:
                return candidate
        parts = parts[:-1]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports, at any depth (function bodies too). `from p import
    x` is an edge to p.x where x is a module, otherwise to p."""
    modules = product_modules()
    graph = {}
    for module, path in modules.items():
        package = ["tritonfront", *module.split(".")[:-1]]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, node.module] if node.module else base)
                for alias in node.names:
                    submodule = resolve(f"{source}.{alias.name}", modules)
                    targets.add(submodule if submodule != resolve(source, modules) else resolve(source, modules))
        graph[module] = targets - {None, module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"d"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other_in_a_cycle():
    graph = import_graph()
    assert graph["engines.__init__"] >= {"engines.base", "engines.hf.engine"}  # the graph sees function bodies
    assert import_cycles(graph) == []


def test_the_openai_front_imports_no_torch():
    """Every module of the front (its app, its entry point, what they import from the core and the
    engines), imported in a fresh interpreter: torch is not among the modules loaded."""
    modules = ", ".join(f"tritonfront.{m}".removesuffix(".__init__") for m in sorted(product_modules())
                        if room(m) == "openai")
    script = (f"import sys, json; import {modules}; "
              "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    assert json.loads(last_line(script)) == []

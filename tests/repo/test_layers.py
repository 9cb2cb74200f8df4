"""The package's layering, read from the source (module-level and function-level imports
alike): who may import whom, no arrow running back up the layers but the few listed with their
reasons, and no import cycle."""
from __future__ import annotations

import ast
import os
import re
from typing import Dict, List, Set, Tuple

import pytest

from support import REPO

ROOT = os.path.join(REPO, "hipmr_ctypes")


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> Set[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        if not is_package:
            parts = parts[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    if not base.startswith("hipmr_ctypes"):
        return set()
    # ``from . import x`` names a submodule when one exists; only a name that is not one is
    # an import of ``base`` itself
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.add(sub if sub in PATHS else base)
    return out


def _imports(top_level_only: bool) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for module, path in PATHS.items():
        is_package = path.endswith("__init__.py")
        tree = ast.parse(open(path).read())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        deps: Set[str] = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                deps |= _resolve(module, is_package, node)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("hipmr_ctypes")}
        graph[module] = {d for d in deps if d != module}
    return graph


#: module name -> file, for every module of the package
PATHS = {_module_name(os.path.join(d, f)): os.path.join(d, f)
         for d, _, files in os.walk(ROOT) for f in files if f.endswith(".py")}
#: module -> the package's modules it imports when it is imported
GRAPH = _imports(top_level_only=True)
#: module -> the package's modules it imports anywhere (also inside functions)
ALL_IMPORTS = _imports(top_level_only=False)


def _ancestors(module: str) -> Set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


#: The layers of docs/internals.md's table, from the bottom: a module may import its own layer
#: and the layers below it.  A module belongs to the layer of the longest name here that is
#: the module or a package holding it ("hipmr_ctypes" alone: the package's own __init__).
#: The binding and the model stand side by side (neither imports the other at import time);
#: here the model is below, so that each lazy reach of the binding from the model is an arrow
#: up that LAZY_EDGES_THAT_STAY must name.
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("leaves", ("_limits", "_locks", "_exit", "_sizes", "_log", "_rmm_names")),
    ("model", ("properties", "concepts", "resource_refs", "stream_refs", "cccl3", "_checks")),
    ("binding", ("_hip",)),
    ("device and stream", ("device", "stream", "_stream_order", "errors", "_thread_exit",
                           "_device_sizes", "_memory_query", "ipc")),
    ("resources", ("resources",)),
    ("adaptors", ("adaptors",)),
    ("buffer", ("buffer", "_buffer")),
    ("above the buffer", ("interop", "statistics", "initialization", "_config",
                          "logfile", "plot")),
    ("command line", ("__main__", "_selftest", "")),
]

#: Imports that run inside a function, from a layer up to a higher one, and must stay: each
#: is reached only when the call that needs it runs, and its reason is the layer's contract.
LAZY_EDGES_THAT_STAY: Dict[Tuple[str, str], str] = {
    # the model loads no library at import; stream_ref.wait() / ready() / priority() /
    # device() reach the binding on their first call
    ("hipmr_ctypes.stream_refs", "hipmr_ctypes._hip"): "stream_ref's calls need the runtime",
    ("hipmr_ctypes.stream_refs", "hipmr_ctypes._hip.exceptions"): "stream_ref's calls raise HipError",
    # cccl3 stands on the model alone, like resource_ref; its stream_ref.wait() reaches the
    # owning Stream's layer on its first call
    ("hipmr_ctypes.cccl3", "hipmr_ctypes.stream"): "cccl3's stream_ref.wait() synchronizes",
}

def _layer(module: str) -> int:
    """The index in LAYERS of ``module``'s layer (AssertionError for a module in none)."""
    best, found = -1, None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            full = f"hipmr_ctypes.{name}" if name else "hipmr_ctypes"
            if (module == full or module.startswith(full + ".")) and len(full) > best:
                best, found = len(full), index
    assert found is not None, f"{module} is in no layer of LAYERS: add it to its layer"
    return found


def _edges(graph: Dict[str, Set[str]]) -> Set[Tuple[str, str]]:
    """Every import edge of ``graph`` but those to a package holding the importer (its
    ``__init__`` runs first, so such an edge is neither a circle nor an arrow up)."""
    return {(m, d) for m, deps in graph.items() for d in deps if d not in _ancestors(m)}


def test_every_module_has_a_layer() -> None:
    for module in PATHS:
        _layer(module)


def _table_on_the_page() -> List[Tuple[str, Tuple[str, ...]]]:
    """docs/internals.md's one layer table: (layer, modules) per row, from the bottom
    (``__init__`` is the package's own, "" in LAYERS)."""
    text = (REPO / "docs" / "internals.md").read_text(encoding="utf-8")
    section = text.split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("layer", "---"):
            continue
        names = re.findall(r"`([\w.]+)`", cells[1])
        rows.append((cells[0], tuple("" if n == "__init__" else n for n in names)))
    return rows


def test_the_docs_layer_table_is_this_list() -> None:
    assert _table_on_the_page() == LAYERS


def test_every_name_in_the_layer_table_is_a_module() -> None:
    """No row names a module that does not exist (a package counts by its folder)."""
    missing = [name for _, names in LAYERS for name in names
               if name and f"hipmr_ctypes.{name}" not in PATHS]
    assert not missing, missing


def test_internals_has_one_layer_table() -> None:
    text = (REPO / "docs" / "internals.md").read_text(encoding="utf-8")
    assert len(re.findall(r"^\| layer \|", text, flags=re.M)) == 1


def test_no_import_runs_back_up_the_layers() -> None:
    """Module-level and function-level imports alike: an import of a higher layer is an error
    unless LAZY_EDGES_THAT_STAY names it, and then it must be function-level."""
    up = []
    for module, dep in sorted(_edges(ALL_IMPORTS)):
        if _layer(dep) <= _layer(module):
            continue
        where = "at import" if dep in GRAPH[module] else "inside a function"
        if (module, dep) in LAZY_EDGES_THAT_STAY and where == "inside a function":
            continue
        up.append(f"{module} (layer {LAYERS[_layer(module)][0]!r}) imports {dep} (layer "
                  f"{LAYERS[_layer(dep)][0]!r}, above it) {where}")
    assert not up, "arrows running back up the layers:\n" + "\n".join(up)


def test_the_allow_lists_name_edges_that_exist() -> None:
    """A stale entry would let the edge come back unnoticed."""
    edges = _edges(ALL_IMPORTS)
    for edge in LAZY_EDGES_THAT_STAY:
        assert edge in edges, f"LAZY_EDGES_THAT_STAY names {edge}, which is no import: remove it"
        assert _layer(edge[1]) > _layer(edge[0]), f"{edge} runs down: remove it from the list"


def test_no_import_cycle_with_function_level_imports() -> None:
    """A circle through any import, also one made inside a function (which works only
    because of the order modules happen to load in)."""
    graph: Dict[str, Set[str]] = {}
    for module, dep in _edges(ALL_IMPORTS):
        graph.setdefault(module, set()).add(dep)
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                pytest.fail("import cycle: " + " -> ".join(
                    f"{x} ({LAYERS[_layer(x)][0]})" for x in cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_import_cycle_at_module_level() -> None:
    # a package's __init__ runs before its submodules, so an edge to an ancestor package is
    # not a cycle of its own; every other edge is
    graph = {m: {d for d in deps if d not in _ancestors(m)} for m, deps in GRAPH.items()}
    state: Dict[str, int] = {}
    stack = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _binding_deps(module: str) -> Set[str]:
    return {d for d in ALL_IMPORTS[module] if d.startswith("hipmr_ctypes")}


def test_the_binding_imports_only_itself_and_leaves() -> None:
    leaves = {f"hipmr_ctypes.{name}" for name in LAYERS[0][1]}
    for module in ALL_IMPORTS:
        if module.startswith("hipmr_ctypes._hip"):
            bad = {d for d in _binding_deps(module)
                   if not d.startswith("hipmr_ctypes._hip") and d not in leaves}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_back_ends_import_no_other_back_end() -> None:
    back_ends = ("hipmr_ctypes._hip.amd", "hipmr_ctypes._hip.nvidia",
                 "hipmr_ctypes._hip.emulated")
    for module in ALL_IMPORTS:
        mine = [b for b in back_ends if module == b or module.startswith(b + ".")]
        if not module.startswith("hipmr_ctypes._hip") or module == "hipmr_ctypes._hip":
            continue
        for dep in ALL_IMPORTS[module]:
            theirs = [b for b in back_ends if dep == b or dep.startswith(b + ".")]
            assert not theirs or theirs == mine, f"{module} imports {dep}"
            assert dep != "hipmr_ctypes._hip", f"{module} imports the package that chooses"


def test_emulator_parts_stand_on_the_core_alone() -> None:
    from hipmr_ctypes._hip.emulated import Emulator, _core
    parts = {base.__module__ for base in Emulator.__bases__}
    assert len(parts) == len(Emulator.__bases__) >= 4   # one module per part
    for base in Emulator.__bases__:
        assert base.__bases__ == (_core.EmulatorCore,), base
    for part in parts:
        others = parts - {part}
        assert not ALL_IMPORTS[part] & others, f"{part} imports {ALL_IMPORTS[part] & others}"


def test_model_and_checks_load_no_binding_at_import() -> None:
    for module in ("hipmr_ctypes.properties", "hipmr_ctypes.concepts",
                   "hipmr_ctypes.resource_refs", "hipmr_ctypes.stream_refs",
                   "hipmr_ctypes.cccl3", "hipmr_ctypes._checks"):
        deps = GRAPH[module]
        allowed = {"hipmr_ctypes.properties", "hipmr_ctypes.concepts",
                   "hipmr_ctypes.resource_refs", "hipmr_ctypes.stream_refs", "hipmr_ctypes",
                   "hipmr_ctypes._limits"}
        assert deps <= allowed, f"{module} imports {sorted(deps - allowed)}"


def test_adaptors_and_buffer_use_no_private_module_of_another_layer() -> None:
    private_elsewhere = ("hipmr_ctypes._hip", "hipmr_ctypes.resources._common",
                         "hipmr_ctypes.adaptors._base", "hipmr_ctypes.adaptors._checked",
                         "hipmr_ctypes.adaptors._chunks")
    for module, deps in ALL_IMPORTS.items():
        if module.startswith("hipmr_ctypes.adaptors"):
            bad = {d for d in deps if d.startswith("hipmr_ctypes._hip")
                   or d.startswith("hipmr_ctypes.resources") or d == "hipmr_ctypes.device"
                   and module != "hipmr_ctypes.adaptors.prefetch"}
            assert not bad, f"{module} imports {sorted(bad)}"
        if module == "hipmr_ctypes.buffer":
            bad = {d for d in deps if d.startswith(private_elsewhere[1:])
                   or d.startswith("hipmr_ctypes.resources.")}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_c_functions_are_declared_in_the_binding_only() -> None:
    """HIP's functions in the one table (bound by the back ends), everything else in
    ``_hip/native.py``: no other module sets ``argtypes`` / ``restype`` or opens a library."""
    allowed = {"hipmr_ctypes._hip.amd", "hipmr_ctypes._hip.nvidia", "hipmr_ctypes._hip.native",
               "hipmr_ctypes._hip.loader", "hipmr_ctypes._hip.search"}
    for module, path in PATHS.items():
        if module in allowed:
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in ("argtypes", "restype")
                    and isinstance(node.ctx, (ast.Store, ast.Del))):
                pytest.fail(f"{module} declares a C function (line {node.lineno})")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("CDLL", "PyDLL", "LoadLibrary")):
                pytest.fail(f"{module} opens a library (line {node.lineno})")


def test_ipc_and_foreign_memory_sit_below_buffer_and_the_resources() -> None:
    """``ipc`` and ``_foreign`` work on plain values: none of their imports (lazy ones too)
    reaches ``buffer``, the resources, the adaptors or interop, which import them; the pool's
    module does not reach the resource that uses it."""
    above = ("hipmr_ctypes.buffer", "hipmr_ctypes.resources", "hipmr_ctypes.adaptors",
             "hipmr_ctypes.interop")
    for module in ("hipmr_ctypes.ipc", "hipmr_ctypes._buffer.foreign"):
        bad = {d for d in ALL_IMPORTS[module] if d.startswith(above)}
        assert not bad, f"{module} imports {sorted(bad)}"
    assert "hipmr_ctypes.resources.async_memory" not in \
        ALL_IMPORTS["hipmr_ctypes.resources.memory_pool"]

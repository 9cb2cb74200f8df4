"""The package's layering, read from the source: who may import whom, and no import cycle."""
from __future__ import annotations

import ast
import os
from typing import Dict, Set

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
    # ``from . import x`` names a submodule when one exists
    out = {base}
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in PATHS:
            out.add(sub)
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
    leaves = {"hipmr_ctypes._locks", "hipmr_ctypes._limits", "hipmr_ctypes._sizes"}
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
                   "hipmr_ctypes.resource_ref", "hipmr_ctypes.stream_ref",
                   "hipmr_ctypes.cccl3", "hipmr_ctypes._checks"):
        deps = GRAPH[module]
        allowed = {"hipmr_ctypes.properties", "hipmr_ctypes.concepts",
                   "hipmr_ctypes.resource_ref", "hipmr_ctypes.stream_ref", "hipmr_ctypes",
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
    for module in ("hipmr_ctypes.ipc", "hipmr_ctypes._foreign"):
        bad = {d for d in ALL_IMPORTS[module] if d.startswith(above)}
        assert not bad, f"{module} imports {sorted(bad)}"
    assert "hipmr_ctypes.resources.async_memory" not in \
        ALL_IMPORTS["hipmr_ctypes.resources.memory_pool"]

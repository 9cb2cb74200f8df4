"""The public surface: every exported name documented, and a light import."""
import inspect
import json
import os
import subprocess
import sys

import pytest

import hipmr_ctypes as hmr
from support import REPO


def test_every_public_name_and_member_has_a_docstring():
    missing = []
    for name in hmr.__all__:
        obj = getattr(hmr, name)
        if isinstance(obj, (int, str, tuple, frozenset)):
            continue
        if not (getattr(obj, "__doc__", None) or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and (callable(value) or isinstance(value, property)):
                    if not (getattr(value, "__doc__", None) or "").strip():
                        missing.append(f"{name}.{attr}")
    assert missing == []


def test_the_stub_lists_what_the_package_provides():
    """Type checkers read ``__init__.pyi``; the package provides its names lazily from
    ``__init__.py``'s table.  Both list the same names in ``__all__``, and each name the stub
    imports is, at run time, the very object of the module the stub names."""
    import ast
    import importlib
    path = os.path.join(os.path.dirname(hmr.__file__), "__init__.pyi")
    tree = ast.parse(open(path).read())
    imported = {}
    stub_all = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Assign) and node.targets[0].id == "__all__":
            stub_all = ast.literal_eval(node.value)
    assert stub_all is not None and len(stub_all) == len(set(stub_all))
    assert sorted(stub_all) == sorted(hmr.__all__)
    assert set(stub_all) <= set(imported)
    for name, (module, original) in imported.items():
        where = importlib.import_module(f"hipmr_ctypes.{module}" if module else "hipmr_ctypes")
        assert getattr(hmr, name) is getattr(where, original), name


def test_py_typed_ships():
    assert os.path.isfile(os.path.join(os.path.dirname(hmr.__file__), "py.typed"))


def test_import_is_light():
    """Importing the package loads no interop peer, numpy, or the interop modules."""
    code = ("import sys, json, hipmr_ctypes; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('cupy', 'torch', 'numba', 'numpy', 'cuda', 'rmm') or m.startswith('hipmr_ctypes.interop'))))")
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_works_from_a_copied_folder(tmp_path):
    """Vendoring: the package folder copied next to a script, no install step."""
    import shutil
    shutil.copytree(os.path.join(REPO, "hipmr_ctypes"), tmp_path / "hipmr_ctypes",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "job.py"
    script.write_text("import hipmr_ctypes as h\n"
                      "b = h.Buffer.from_host(b'vendored', resource=h.HostMemoryResource())\n"
                      "print(b.tobytes().decode(), h.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HIPMR_PLATFORM"] = "emulated"
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text, path = out.stdout.split()
    assert text == "vendored" and path.startswith(str(tmp_path))


def _fresh(code: str, platform: str = "emulated") -> str:
    env = dict(os.environ, HIPMR_PLATFORM=platform)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _maps_library(name: str) -> str:
    """Code that prints whether a library file named ``name*`` is mapped in the process."""
    return (f"mapped = any(l.rstrip().rsplit('/', 1)[-1].startswith({name!r}) "
            "for l in open('/proc/self/maps') if '/' in l)\n")


def test_import_opens_the_library_and_the_first_use_binds_it():
    """Import opens the library (libamdhip64) and loads nothing else of the package: the rest,
    the declaration table included, and the heavy standard modules load on first use.  The
    first use binds the table in the very handle import opened."""
    code = ("import sys, json\n"
            "before = set(sys.modules)\n"
            "import hipmr_ctypes\n"
            "from hipmr_ctypes import _hip\n"
            "from hipmr_ctypes._hip import search\n"
            "new = sorted(set(sys.modules) - before)\n"
            + _maps_library("libamdhip64.so") +
            "bound = _hip._runtime is not None\n"
            "opened = list(search._opened.values())\n"
            "error = _hip.load_error()\n"
            "rt = _hip._runtime\n"
            "same = rt is not None and len(opened) == 1 and rt.lib is opened[0]\n"
            "print(json.dumps([mapped, bound, same, type(error).__name__, new]))")
    mapped, bound, same, error, new = json.loads(_fresh(code, "amd"))
    if os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") == "1":
        assert mapped and same and error == "NoneType"
    else:
        assert (mapped and same) or error == "LibraryNotFoundError"
    assert not bound
    assert [m for m in new if m.startswith("hipmr_ctypes")] == \
        ["hipmr_ctypes", "hipmr_ctypes._hip", "hipmr_ctypes._hip.search"]
    for heavy in ("inspect", "dataclasses", "ctypes.util", "subprocess", "weakref", "atexit"):
        assert heavy not in new


def test_a_loaded_runtime_binds_the_lazy_names_of_the_binding():
    """Once the runtime is loaded, ``_hip`` holds every name it serves lazily and no longer
    has a ``__getattr__`` (CPython does not specialize attribute loads from a module that
    has one): the same objects as its modules define."""
    code = ("import json\n"
            "import hipmr_ctypes\n"
            "from hipmr_ctypes import _hip\n"
            "before = '__getattr__' in vars(_hip)\n"
            "_hip.get_runtime()\n"
            "from hipmr_ctypes._hip import exceptions as errors, runtime\n"
            "after = '__getattr__' in vars(_hip)\n"
            "same = _hip.Runtime is runtime.Runtime and all(\n"
            "    vars(_hip)[n] is getattr(errors, n) for n in _hip.__all__ if n.endswith('Error'))\n"
            "print(json.dumps([before, after, same]))")
    assert json.loads(_fresh(code, "emulated")) == [True, False, True]


def test_import_in_a_bare_interpreter_loads_no_heavy_standard_module():
    """Without site (nothing else imported first), ``import hipmr_ctypes`` brings in ctypes
    (the library needs it) and the library search, not typing, threading, glob, re and what they
    pull in: they are what made the import slow in a fresh process."""
    code = ("import sys, json\n"
            "before = set(sys.modules)\n"
            "import hipmr_ctypes\n"
            + _maps_library("libamdhip64.so") +
            "print(json.dumps([mapped, sorted(set(sys.modules) - before)]))")
    env = dict(os.environ, HIPMR_PLATFORM="amd")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    mapped, new = json.loads(out.stdout.splitlines()[-1])
    assert mapped or os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") != "1"
    assert "ctypes" in new and "hipmr_ctypes._hip.search" in new
    # what ctypes itself imports is not the package's doing: CPython 3.14's ctypes imports
    # threading (and what that needs); before 3.14 it imports none of these
    base = subprocess.run([sys.executable, "-S", "-c",
                           "import sys, json\nbefore = set(sys.modules)\nimport ctypes\n"
                           "print(json.dumps(sorted(set(sys.modules) - before)))"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert base.returncode == 0, base.stderr
    by_ctypes = set(json.loads(base.stdout.splitlines()[-1]))
    heavies = ("typing", "threading", "glob", "fnmatch", "re", "enum", "collections",
               "functools", "contextlib", "weakref", "inspect", "__future__", "types")
    if sys.version_info < (3, 14):
        assert not by_ctypes.intersection(heavies), by_ctypes
    for heavy in heavies:
        assert heavy not in new or heavy in by_ctypes, new


@pytest.mark.parametrize("platform", ["amd", "nvidia", "emulated"])
def test_import_compiles_only_the_library_search(platform):
    """From a folder without .pyc, every module imported is compiled: ``import hipmr_ctypes``
    compiles the package's ``__init__``, the binding's and the platform choice and library
    search (``search``), whatever the platform and whether its library opens; the back end, the
    declaration table, the error classes and the Runtime are compiled by the first use."""
    code = ("import sys, json\n"
            "before = set(sys.modules)\n"
            "import hipmr_ctypes\n"
            "print(json.dumps(sorted(m for m in set(sys.modules) - before\n"
            "                        if m.startswith('hipmr_ctypes'))))")
    assert json.loads(_fresh(code, platform)) == \
        ["hipmr_ctypes", "hipmr_ctypes._hip", "hipmr_ctypes._hip.search"]


def test_the_platform_is_the_one_chosen_at_import():
    """The runtime is built on first use, on the platform ``HIPMR_PLATFORM`` named at import;
    ``set_runtime(None)`` forgets that choice, and the next load reads the variable again."""
    code = ("import os, json\n"
            "import hipmr_ctypes as h\n"
            "from hipmr_ctypes import _hip\n"
            "os.environ['HIPMR_PLATFORM'] = 'no-such-platform'\n"
            "chosen = h.platform()\n"
            "first = _hip.get_runtime().platform\n"
            "_hip.set_runtime(None)\n"
            "error = type(_hip.load_error()).__name__\n"
            "print(json.dumps([chosen, first, error]))")
    assert json.loads(_fresh(code, "emulated")) == ["emulated", "emulated", "ValueError"]


def test_a_bad_platform_at_import_is_reported_by_the_first_use():
    code = ("import json\n"
            "import hipmr_ctypes as h\n"
            "try:\n"
            "    h.device_count()\n"
            "except ValueError as exc:\n"
            "    print(json.dumps(str(exc)))\n")
    assert "is not one of amd, nvidia, emulated" in json.loads(_fresh(code, "bogus"))


def test_import_without_the_library_still_works_and_is_lazy():
    code = ("import os, json, sys\n"
            "os.environ['HIPMR_LIBRARY'] = '/nonexistent/libamdhip64.so'\n"
            "import hipmr_ctypes as h\n"
            "print(json.dumps([h._hip.load_error() is not None, h.is_resource(object()),\n"
            "                  'hipmr_ctypes.buffer' in sys.modules]))")
    assert json.loads(_fresh(code, "amd")) == [True, False, False]


def test_dir_and_star_import_are_those_of_an_eager_import():
    code = ("import json, hipmr_ctypes as h\n"
            "first = dir(h)\n"
            "ns = {}\n"
            "exec('from hipmr_ctypes import *', ns)\n"
            "star = sorted(k for k in ns if k != '__builtins__')\n"
            "import hipmr_ctypes.stream_refs, hipmr_ctypes.resource_refs, hipmr_ctypes.buffer\n"
            "import hipmr_ctypes.adaptors, hipmr_ctypes.interop\n"
            "same = all(ns[k] is getattr(h, k) for k in h.__all__)\n"
            "print(json.dumps([first, dir(h), star, sorted(h.__all__), same]))")
    first, after, star, names, same = json.loads(_fresh(code))
    assert first == sorted(first)
    assert set(names) <= set(first)
    assert {"adaptors", "buffer", "resources", "device", "stream", "properties",
            "concepts", "stream_ref", "resource_ref"} <= set(first)
    assert set(after) - {"interop"} == set(first)   # interop: imported explicitly above
    assert not {n for n in first if n in ("_LAZY", "_Package", "__getattr__")}
    assert star == names and same


def test_no_module_is_named_like_a_public_name_or_like_another_layers_module():
    """A submodule named like a public name would replace it on the package when imported
    (``hmr.stream_ref`` must stay the class); two modules of one name in different layers
    read as one."""
    import os
    root = os.path.dirname(hmr.__file__)
    names = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and f != "__init__.py":
                names.setdefault(f[:-3], []).append(os.path.relpath(os.path.join(folder, f), root))
        if os.path.basename(folder) != "hipmr_ctypes" and os.path.exists(
                os.path.join(folder, "__init__.py")):
            names.setdefault(os.path.basename(folder), []).append(os.path.relpath(folder, root))
    public = set(hmr.__all__)
    assert not {n for n in names if n in public}
    same = {n: paths for n, paths in names.items() if len(paths) > 1}
    assert not same, same
    import hipmr_ctypes.resource_refs  # noqa: F401
    import hipmr_ctypes.stream_refs  # noqa: F401
    assert isinstance(hmr.stream_ref, type) and hmr.stream_ref.__name__ == "stream_ref"
    assert isinstance(hmr.resource_ref, type) and hmr.resource_ref.__name__ == "resource_ref"
    assert sys.modules["hipmr_ctypes.stream_refs"].stream_ref is hmr.stream_ref


def test_every_public_name_resolves_and_unknown_names_raise():
    for name in hmr.__all__:
        assert getattr(hmr, name) is not None, name
    assert hmr.Buffer is sys.modules["hipmr_ctypes.buffer"].Buffer
    assert hmr.adaptors is sys.modules["hipmr_ctypes.adaptors"]
    try:
        hmr.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("no AttributeError")
    assert not hasattr(hmr, "no_such_name")

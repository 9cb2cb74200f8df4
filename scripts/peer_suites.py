#!/usr/bin/env python3
"""Run other projects' own memory tests with and without hipmr_ctypes underneath, and print
the pass counts side by side (GPU machine, HIPMR_PLATFORM=nvidia).

numba-cuda: its driver / array / memory test modules (``numba.cuda.tests.cudadrv...``) twice:
with Numba's own memory manager, then with ours
(``NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba``).  They are unittest test cases,
imported by name through the normal import system (numba-cuda installs ``numba.cuda`` as a
redirect to its own package, which ``pytest --pyargs`` cannot collect: it derives the module
name ``cuda.tests...`` from the file's path and finds another ``cuda`` package), and run by a
small unittest driver that prints every test's result.  When that collects nothing, pytest runs
the modules' files with ``--import-mode=importlib`` instead; a run that collects nothing prints
its first error lines.  Every test that passes with Numba's manager must pass with ours: those
that do not are listed, and the exit status is 1; so is a run where nothing passes with Numba's
own manager (the comparison would then mean nothing).  The test modules need the ``filecheck`` package; when it is missing it is
installed from ``.whl/filecheck-*.whl`` into a scratch folder.

CuPy: its memory tests when a CuPy source tree is found (``--cupy-tests DIR`` or
``$CUPY_TESTS``; CuPy's wheels do not ship its tests), with and without
``cupy.cuda.set_allocator(hipmr_ctypes.interop.cupy.allocator())`` installed by a small pytest
plugin; otherwise our own CuPy interop tests (``tests/interop/test_interop.py -k cupy``) under
both.

    python3 scripts/peer_suites.py [--out DIR] [--suite numba|cupy|all] [--timeout S]
                                   [--modules m1,m2,...] [--cupy-tests DIR] [--xml-dir DIR]

Writes ``<out>/peer_suites.json`` (counts, and the tests passing with the library's own
memory management but not with ours); the JUnit files of the four runs go to a scratch
folder (``--xml-dir``).  Exit status 1 when some test passes only without hipmr_ctypes, or
when no numba-cuda test passes with Numba's own manager.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: numba-cuda's test modules that allocate, copy, free or describe device memory.
NUMBA_MODULES = [
    "numba.cuda.tests.cudadrv.test_cuda_memory",
    "numba.cuda.tests.cudadrv.test_cuda_ndarray",
    "numba.cuda.tests.cudadrv.test_cuda_array_slicing",
    "numba.cuda.tests.cudadrv.test_array_attr",
    "numba.cuda.tests.cudadrv.test_deallocations",
    "numba.cuda.tests.cudadrv.test_emm_plugins",
    "numba.cuda.tests.cudadrv.test_host_alloc",
    "numba.cuda.tests.cudadrv.test_managed_alloc",
    "numba.cuda.tests.cudadrv.test_pinned",
    "numba.cuda.tests.cudadrv.test_cuda_driver",
    "numba.cuda.tests.cudadrv.test_context_stack",
    "numba.cuda.tests.cudadrv.test_streams",
    "numba.cuda.tests.cudadrv.test_events",
    "numba.cuda.tests.cudadrv.test_reset_device",
    "numba.cuda.tests.cudapy.test_array",
    "numba.cuda.tests.cudapy.test_cuda_array_interface",
]
#: CuPy's memory test files, relative to a CuPy source tree.
CUPY_FILES = ["tests/cupy_tests/cuda_tests/test_memory.py",
              "tests/cupy_tests/cuda_tests/test_stream.py",
              "tests/cupy_tests/core_tests/test_ndarray_copy_and_view.py"]

_CUPY_PLUGIN = textwrap.dedent('''
    """pytest plugin: every CuPy allocation through hipmr_ctypes for the whole session."""
    import cupy
    from hipmr_ctypes.interop.cupy import allocator

    def pytest_configure(config):
        cupy.cuda.set_allocator(allocator())
''')


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:  # noqa: BLE001 - a parent package that fails to import: not available
        return False


def _ensure_filecheck(env: Dict[str, str]) -> str:
    if _available("filecheck"):
        return "installed"
    wheels = sorted(glob.glob(os.path.join(ROOT, ".whl", "filecheck-*.whl")))
    if not wheels:
        return "missing (no .whl/filecheck-*.whl)"
    target = os.path.join(tempfile.gettempdir(), "peer-site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--no-compile", "--target", target, wheels[-1]],
                          capture_output=True, text=True)
    if proc.returncode:
        return f"install failed: {proc.stderr.strip()[-300:]}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (target, env.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, target)   # for finding the test modules from here too
    importlib.invalidate_caches()
    return f"installed from {os.path.basename(wheels[-1])}"


def _outcomes(xml_path: str) -> Dict[str, str]:
    """``{test id: passed|failed|error|skipped}`` from a JUnit file (empty if unreadable)."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return {}
    result: Dict[str, str] = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                break
        result[name] = outcome
    return result


def _subprocess(cmd: List[str], env: Dict[str, str], cwd: str,
                timeout: float) -> Tuple[int, str, str]:
    """Run ``cmd``: its exit status, the head and the tail of its output."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
        text = proc.stdout + proc.stderr
        return proc.returncode, text[:3000], text[-1500:]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        return 124, text[:3000], f"timed out after {timeout:.0f} s\n" + text[-1500:]


def _say_why_empty(label: str, head: str) -> None:
    """A run that collected nothing: print its first error lines (or its first lines)."""
    lines = head.strip().splitlines()
    first = next((i for i, line in enumerate(lines)
                  if "Error" in line or "error" in line or "Traceback" in line), 0)
    print(f"!! {label} collected no test; its first error lines:", flush=True)
    shown = list(range(max(0, first - 2), min(len(lines), first + 14)))
    # the exception that ends this traceback (its last frame and the "XError: message" line),
    # however many frames and caret lines the Python version prints before it (3.13 prints
    # more than 3.11)
    tb = next((i for i in range(max(0, first - 2), len(lines))
               if lines[i].startswith("Traceback")), None)
    end = None if tb is None else next(
        (i for i in range(tb + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), None)
    if end is not None and end not in shown:
        shown = [i for i in shown if i <= tb + 2] + [-1] + list(range(max(tb + 3, end - 2),
                                                                      end + 1))
    for i in shown or [-2]:
        line = "..." if i == -1 else "(no output)" if i == -2 else lines[i]
        print(f"   {line}", flush=True)


def _run(label: str, args: List[str], env: Dict[str, str], xml_path: str, timeout: float,
         cwd: str) -> Tuple[Dict[str, str], int, str]:
    """pytest on ``args``: ``{test id: outcome}`` (from its JUnit file), rc, output tail."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN",
           f"--junitxml={xml_path}"] + args
    print(f"== {label}: {' '.join(cmd[3:])}", flush=True)
    rc, head, tail = _subprocess(cmd, env, cwd, timeout)
    print(tail.strip().splitlines()[-1] if tail.strip() else "(no output)", flush=True)
    outcomes = _outcomes(xml_path)
    if not any(o != "error" for o in outcomes.values()):
        _say_why_empty(label, head)
    return outcomes, rc, tail


#: the unittest driver: imports each module by name, runs its test cases, prints one line per
#: test (verbosity 2) and writes ``{test id: outcome}`` as JSON; a module that cannot be
#: imported is one error, ``<module>::import``, with its traceback printed.
_UNITTEST_DRIVER = textwrap.dedent('''
    import importlib, json, sys, traceback, unittest

    out_path, modules = sys.argv[1], sys.argv[2:]
    outcomes = {}

    class Result(unittest.TextTestResult):
        def _put(self, test, outcome):
            outcomes[f"{type(test).__module__}.{type(test).__qualname__}::"
                     f"{getattr(test, '_testMethodName', str(test))}"] = outcome
        def addSuccess(self, test):
            super().addSuccess(test); self._put(test, "passed")
        def addFailure(self, test, err):
            super().addFailure(test, err); self._put(test, "failed")
        def addError(self, test, err):
            super().addError(test, err); self._put(test, "error")
        def addSkip(self, test, reason):
            super().addSkip(test, reason); self._put(test, "skipped")
        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err); self._put(test, "skipped")
        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test); self._put(test, "failed")
        def addSubTest(self, test, subtest, err):
            # a failing subtest fails its test (which then gets no addSuccess)
            super().addSubTest(test, subtest, err)
            if err is not None:
                self._put(test, "failed" if issubclass(err[0], test.failureException)
                          else "error")

    suite = unittest.TestSuite()
    for name in modules:
        try:
            suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(
                importlib.import_module(name)))
        except Exception:
            print(f"cannot import {name}:", flush=True)
            traceback.print_exc(file=sys.stdout)
            outcomes[f"{name}::import"] = "error"
    print(f"collected {suite.countTestCases()} tests", flush=True)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result)
    try:
        runner.run(suite)
    finally:
        with open(out_path, "w") as f:
            json.dump(outcomes, f)
    sys.exit(1 if {"failed", "error"} & set(outcomes.values()) else 0)
''')


def _run_unittest(label: str, modules: List[str], env: Dict[str, str], json_path: str,
                  timeout: float, cwd: str) -> Tuple[Dict[str, str], int, str]:
    """The unittest driver on ``modules``: ``{test id: outcome}``, rc, output tail."""
    cmd = [sys.executable, "-c", _UNITTEST_DRIVER, json_path] + modules
    print(f"== {label}: unittest {' '.join(modules)}", flush=True)
    rc, head, tail = _subprocess(cmd, env, cwd, timeout)
    try:
        with open(json_path) as f:
            outcomes: Dict[str, str] = json.load(f)
    except (OSError, ValueError):
        outcomes = {}
    counts = _count(outcomes)
    print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" (rc={rc})", flush=True)
    if not any(o != "error" for o in outcomes.values()):
        _say_why_empty(label, head)
    return outcomes, rc, tail


def _module_file(module: str) -> Optional[str]:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _collected(outcomes: Dict[str, str]) -> bool:
    return any(o != "error" for o in outcomes.values())


def _count(outcomes: Dict[str, str]) -> Dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome in outcomes.values():
        counts[outcome] += 1
    return counts


def _compare(suite: str, theirs: Dict[str, str], ours: Dict[str, str],
             names: Tuple[str, str]) -> Dict[str, object]:
    a, b = _count(theirs), _count(ours)
    print(f"\n{suite:<8} {'':<10} {names[0]:>18} {names[1]:>18}")
    for key in ("passed", "failed", "error", "skipped"):
        print(f"{'':<8} {key:<10} {a[key]:>18} {b[key]:>18}")
    regressions = sorted(t for t, o in theirs.items() if o == "passed" and ours.get(t) != "passed")
    gains = sorted(t for t, o in ours.items() if o == "passed" and theirs.get(t) != "passed")
    if regressions:
        print(f"passing with {names[0]} but not with {names[1]} ({len(regressions)}):")
        for t in regressions:
            print(f"  {t}: {ours.get(t, 'not run')}")
    else:
        print(f"every test passing with {names[0]} passes with {names[1]}")
    if gains:
        print(f"passing only with {names[1]}: {len(gains)}")
    return {"counts": {names[0]: a, names[1]: b}, "regressions": regressions,
            "only_ours": gains}


def run_numba(out: str, timeout: float, modules: List[str], env: Dict[str, str]) -> Dict[str, object]:
    if not _available("numba.cuda"):
        print("numba-cuda: not installed, skipped")
        return {"skipped": "numba.cuda not importable"}
    filecheck = _ensure_filecheck(env)   # first: numba-cuda's test packages may import it
    print(f"filecheck: {filecheck}")
    found = [m for m in modules if _available(m)]
    missing = sorted(set(modules) - set(found))
    if missing:
        print("numba-cuda: modules not found (not in this version, or failing to import): "
              + ", ".join(missing))
    if not found:
        return {"skipped": "no numba-cuda test module found", "filecheck": filecheck}
    base = dict(env)
    base.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    ours = dict(base, NUMBA_CUDA_MEMORY_MANAGER="hipmr_ctypes.interop.numba")
    theirs_label, ours_label = ("numba-cuda, Numba's memory manager",
                                "numba-cuda, hipmr_ctypes as memory manager")
    runner = "unittest"
    theirs_out, rc1, _ = _run_unittest(theirs_label, found, base,
                                       os.path.join(out, "peer-numba-numba.json"), timeout, out)
    if not _collected(theirs_out):
        # pytest on the files themselves, imported by path (not as ``cuda.tests...``)
        files = [f for f in (_module_file(m) for m in found) if f]
        root = os.path.commonpath([os.path.dirname(f) for f in files]) if files else out
        runner = "pytest --import-mode=importlib"
        args = ["--import-mode=importlib", f"--rootdir={root}"] + files
        print("numba-cuda: falling back to " + runner, flush=True)
        theirs_out, rc1, _ = _run(theirs_label, args, base,
                                  os.path.join(out, "peer-numba-numba.xml"), timeout, root)
        ours_out, rc2, _ = _run(ours_label, args, ours,
                                os.path.join(out, "peer-numba-hipmr.xml"), timeout, root)
    else:
        ours_out, rc2, _ = _run_unittest(ours_label, found, ours,
                                         os.path.join(out, "peer-numba-hipmr.json"), timeout,
                                         out)
    result = _compare("numba", theirs_out, ours_out, ("numba's manager", "hipmr_ctypes"))
    baseline = _count(theirs_out)["passed"]
    print(f"numba-cuda ({runner}): {baseline} passed with Numba's own memory manager, "
          f"{_count(ours_out)['passed']} with hipmr_ctypes", flush=True)
    if not baseline:
        print("!! no test passed with Numba's own memory manager: the comparison means "
              "nothing (see the error lines above)", flush=True)
    result.update(modules=found, filecheck=filecheck, rc=[rc1, rc2], runner=runner,
                  baseline_passed=baseline)
    return result


def run_cupy(out: str, timeout: float, tests_dir: Optional[str],
             env: Dict[str, str]) -> Dict[str, object]:
    if not _available("cupy"):
        print("cupy: not installed, skipped")
        return {"skipped": "cupy not importable"}
    plugin_dir = tempfile.mkdtemp(prefix="hipmr-cupy-plugin-")
    with open(os.path.join(plugin_dir, "hipmr_cupy_plugin.py"), "w") as f:
        f.write(_CUPY_PLUGIN)
    files = [os.path.join(tests_dir, f) for f in CUPY_FILES] if tests_dir else []
    files = [f for f in files if os.path.exists(f)]
    if files:
        what, cwd = "CuPy's memory tests", tests_dir or out
        args = files
    else:
        print("cupy: CuPy's own tests not found (its wheels do not ship them; pass "
              "--cupy-tests DIR or set CUPY_TESTS to a CuPy source tree): running our CuPy "
              "interop tests under both allocators instead")
        what, cwd = "hipmr_ctypes' CuPy interop tests", ROOT
        args = [os.path.join(ROOT, "tests", "interop", "test_interop.py"), "-k", "cupy"]
    theirs_out, rc1, _ = _run(f"{what}, CuPy's memory pool", args, env,
                              os.path.join(out, "peer-cupy-cupy.xml"), timeout, cwd)
    ours_env = dict(env, PYTHONPATH=os.pathsep.join(
        p for p in (plugin_dir, env.get("PYTHONPATH", "")) if p))
    ours_out, rc2, _ = _run(f"{what}, hipmr_ctypes allocator", args + ["-p", "hipmr_cupy_plugin"],
                            ours_env, os.path.join(out, "peer-cupy-hipmr.xml"), timeout, cwd)
    result = _compare("cupy", theirs_out, ours_out, ("cupy's pool", "hipmr_ctypes"))
    result.update(what=what, rc=[rc1, rc2])
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--suite", choices=("numba", "cupy", "all"), default="all")
    parser.add_argument("--timeout", type=float, default=240.0,
                        help="seconds for each of the four pytest runs")
    parser.add_argument("--modules", default="",
                        help="comma-separated numba-cuda test modules (default: the memory set)")
    parser.add_argument("--cupy-tests", default=os.environ.get("CUPY_TESTS"),
                        help="a CuPy source tree whose tests/ to run")
    parser.add_argument("--xml-dir", default=None,
                        help="where the JUnit files go (default: a scratch folder)")
    args = parser.parse_args(argv)
    report_dir = os.path.abspath(args.out)
    os.makedirs(report_dir, exist_ok=True)
    out = os.path.abspath(args.xml_dir or tempfile.mkdtemp(prefix="peer-suites-"))
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("HIPMR_PLATFORM", "nvidia")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    report: Dict[str, object] = {}
    if args.suite in ("numba", "all"):
        modules = [m for m in args.modules.split(",") if m] or NUMBA_MODULES
        report["numba"] = run_numba(out, args.timeout, modules, env)
    if args.suite in ("cupy", "all"):
        report["cupy"] = run_cupy(out, args.timeout, args.cupy_tests, env)
    with open(os.path.join(report_dir, "peer_suites.json"), "w") as f:
        json.dump(report, f, indent=1)
    bad = any(isinstance(r, dict) and (r.get("regressions") or r.get("baseline_passed") == 0)
              for r in report.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

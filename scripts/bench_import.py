#!/usr/bin/env python3
"""The cost of ``import hipmr_ctypes`` and of its first use beyond loading the HIP library.

Each round starts fresh interpreters, taking turns: one times ``import ctypes`` plus
``ctypes.CDLL(<the library the package loads>)`` (the floor: what loading the library costs on
its own), one times ``import hipmr_ctypes``, one its first use (``import hipmr_ctypes`` and a
first ``Buffer`` of 64 KiB made, written and closed: the package's resources, the runtime and
the device's default resource loaded); the package with its ``.pyc`` files and without (a
fresh copy of the folder with no ``__pycache__``, nothing written: as from a read-only vendored
folder).  These times are taken inside the child, so interpreter start-up is not counted.
Beside them, whole processes, start to exit: ``python -c pass`` (the floor of any command) and
``python -c`` the first use, with ``.pyc`` files.

    python scripts/bench_import.py [--rounds 15] [--json out.json]

Prints the median ms of each and the package's cost beyond the floors.  The platform is the one
``HIPMR_PLATFORM`` selects (on the emulated platform the "library" is the emulator and the
floor is ``import ctypes`` alone).
"""
from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

from _timing import print_rows, save_json, take_turns

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

_FLOOR = ("import time; t = time.perf_counter(); import ctypes\n"
          "if {path!r}: ctypes.CDLL({path!r})\n"
          "print(time.perf_counter() - t)")
_PACKAGE = ("import time; t = time.perf_counter(); import hipmr_ctypes\n"
            "print(time.perf_counter() - t)")
_FIRST_USE_BODY = ("import hipmr_ctypes\n"
                   "b = hipmr_ctypes.Buffer(1 << 16)\n"
                   "b.copy_from_host(bytes(1 << 16))\n"
                   "b.close()\n")
_FIRST_USE = ("import time; t = time.perf_counter()\n" + _FIRST_USE_BODY
              + "print(time.perf_counter() - t)")


def _library_path() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import hipmr_ctypes._hip as h\n"
         "rt = h.get_runtime()\nprint(rt.library_path if rt.platform != 'emulated' else '')"],
        cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _run(code: str, where: str) -> float:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], cwd=where, env=env, capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1]) * 1000.0


def _process(code: str, where: str) -> float:
    """ms a whole ``python -c code`` takes, start to exit."""
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=where, env=env, capture_output=True,
                   check=True)
    return (time.perf_counter() - started) * 1000.0


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    path = _library_path()
    tmp = tempfile.mkdtemp(prefix="hipmr-import-")
    bare, compiled = os.path.join(tmp, "bare"), os.path.join(tmp, "compiled")
    for where in (bare, compiled):
        shutil.copytree(os.path.join(ROOT, "hipmr_ctypes"), os.path.join(where, "hipmr_ctypes"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(os.path.join(compiled, "hipmr_ctypes"), quiet=1)
    runs = {
        "floor (import ctypes + CDLL)": (_FLOOR.format(path=path), tmp),
        "import hipmr_ctypes": (_PACKAGE, compiled),
        "import hipmr_ctypes, no .pyc": (_PACKAGE, bare),
        "first use (import + a Buffer)": (_FIRST_USE, compiled),
        "first use, no .pyc": (_FIRST_USE, bare),
    }
    processes = {
        "process: python -c pass": ("pass", tmp),
        "process: python -c first use": (_FIRST_USE_BODY, compiled),
    }
    samplers = {name: (lambda code=code, where=where: _run(code, where))
                for name, (code, where) in runs.items()}
    samplers.update({name: (lambda code=code, where=where: _process(code, where))
                     for name, (code, where) in processes.items()})
    try:
        samples = take_turns(samplers, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {name: statistics.median(v) for name, v in samples.items()}
    result: Dict[str, Any] = {"library": path or "(emulated)", "rounds": args.rounds,
                              "median_ms": med,
                              "beyond_library_ms": med["import hipmr_ctypes"]
                              - med["floor (import ctypes + CDLL)"],
                              "beyond_library_no_pyc_ms": med["import hipmr_ctypes, no .pyc"]
                              - med["floor (import ctypes + CDLL)"],
                              "first_use_ms": med["first use (import + a Buffer)"],
                              "first_use_no_pyc_ms": med["first use, no .pyc"],
                              "first_use_process_beyond_pass_ms":
                                  med["process: python -c first use"]
                                  - med["process: python -c pass"]}
    rows = dict(med, **{"beyond the library": result["beyond_library_ms"],
                        "beyond the library, no .pyc": result["beyond_library_no_pyc_ms"],
                        "process: first use beyond pass":
                            result["first_use_process_beyond_pass_ms"]})
    print_rows(f"median ms over {args.rounds} interleaved rounds, Python "
               f"{sys.version.split()[0]}, library {result['library']}", rows, width=32,
               fmt="8.2f")
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The cost of ``import hipmr_ctypes`` beyond loading the HIP library itself.

Each round starts fresh interpreters, taking turns: one times ``import ctypes`` plus
``ctypes.CDLL(<the library the package loads>)`` (the floor: what loading the library costs on
its own), one times ``import hipmr_ctypes``; the package with its ``.pyc`` files and without
(a fresh copy of the folder with no ``__pycache__``, nothing written: as from a read-only
vendored folder).  The time is taken inside the child around the import, so interpreter start-up
is not counted.

    python scripts/bench_import.py [--rounds 15] [--json out.json]

Prints the median ms of each and the package's cost beyond the floor.  The platform is the one
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
from typing import Any, Dict

from _timing import print_rows, save_json, take_turns

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

_FLOOR = ("import time; t = time.perf_counter(); import ctypes\n"
          "if {path!r}: ctypes.CDLL({path!r})\n"
          "print(time.perf_counter() - t)")
_PACKAGE = ("import time; t = time.perf_counter(); import hipmr_ctypes\n"
            "print(time.perf_counter() - t)")


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
    }
    try:
        samples = take_turns({name: (lambda code=code, where=where: _run(code, where))
                              for name, (code, where) in runs.items()}, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {name: statistics.median(v) for name, v in samples.items()}
    result: Dict[str, Any] = {"library": path or "(emulated)", "rounds": args.rounds,
                              "median_ms": med,
                              "beyond_library_ms": med["import hipmr_ctypes"]
                              - med["floor (import ctypes + CDLL)"],
                              "beyond_library_no_pyc_ms": med["import hipmr_ctypes, no .pyc"]
                              - med["floor (import ctypes + CDLL)"]}
    rows = dict(med, **{"beyond the library": result["beyond_library_ms"],
                        "beyond the library, no .pyc": result["beyond_library_no_pyc_ms"]})
    print_rows(f"median ms over {args.rounds} interleaved rounds, Python "
               f"{sys.version.split()[0]}, library {result['library']}", rows, width=32,
               fmt="8.2f")
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

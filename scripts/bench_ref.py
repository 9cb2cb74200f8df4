#!/usr/bin/env python3
"""How much a resource_ref adds to an allocate + deallocate pair.

Times, in one run, the same pair called on a resource directly and through a ref (the two
taking turns over ``--repeat`` rounds, the median in ns per pair), for:

* ``trivial``: a user resource whose signature matches the ref's (the ref binds its methods),
* ``trivial-align16``: the same with a default alignment of 16 (the ref binds a copy of each
  method whose alignment defaults to 256),
* ``trivial-renamed``: other parameter names (the ref binds a wrapper: one more Python call),
* ``HostMemoryResource`` from hipmr_ctypes, when it can be imported and built here.

Usage: ``python scripts/bench_ref.py [--json out.json] [--number N] [--repeat R]``.
The goal is under 50 ns of overhead per pair.
"""
from __future__ import annotations

import argparse
import itertools
import pathlib
import platform
import sys
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from hipmr_ctypes.concepts import is_async_resource  # noqa: E402
from hipmr_ctypes.resource_refs import async_resource_ref, resource_ref  # noqa: E402
from hipmr_ctypes.stream_refs import stream_ref  # noqa: E402

from _timing import ns_per_op, save_json  # noqa: E402


class Trivial:
    """Does nothing; the signature a ref can bind directly."""

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        return 4096

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        pass

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        return 4096

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        pass


class TrivialAlign16(Trivial):
    """Default alignment 16: the ref must supply 256, through a wrapper."""

    def allocate(self, bytes: int, alignment: int = 16) -> int:
        return 4096

    def deallocate(self, ptr: int, bytes: int, alignment: int = 16) -> None:
        pass


class TrivialRenamed(Trivial):
    """Other parameter names: the ref binds a wrapper (one extra Python call)."""

    def allocate(self, size: int, align: int = 256) -> int:
        return 4096

    def deallocate(self, p: int, size: int, align: int = 256) -> None:
        pass


def _binding(ref: Any, res: Any) -> str:
    """How the ref binds ``allocate``: the resource's own method, a copy, or a wrapper."""
    if ref.allocate == res.allocate:
        return "direct"
    return "copy" if getattr(ref.allocate, "__self__", None) is res else "wrapper"


CASES: Tuple[Tuple[str, str, bool], ...] = (
    ("pair, explicit alignment", "r.deallocate(r.allocate(256, 256), 256, 256)", False),
    ("pair, default alignment", "r.deallocate(r.allocate(256), 256)", False),
    ("async pair", "r.deallocate_async(r.allocate_async(256, 256, s), 256, 256, s)", True),
)


def _loop(stmt: str, target: Any, stream: stream_ref) -> Callable[[int], None]:
    """``stmt`` ``n`` times, with ``r`` the target and ``s`` the stream (as timeit runs it)."""
    space: Dict[str, Any] = {}
    exec(f"def run(n):\n    for _ in repeat(None, n):\n        {stmt}\n",
         {"r": target, "s": stream, "repeat": itertools.repeat}, space)
    return space["run"]  # type: ignore[no-any-return]


def _resources() -> Tuple[List[Tuple[str, Any]], List[str]]:
    found: List[Tuple[str, Any]] = [("trivial", Trivial()), ("trivial-align16", TrivialAlign16()),
                                    ("trivial-renamed", TrivialRenamed())]
    notes: List[str] = []
    try:
        try:
            from hipmr_ctypes import HostMemoryResource  # type: ignore[attr-defined]
        except ImportError:  # not exported yet
            from hipmr_ctypes.resources import HostMemoryResource  # type: ignore
        found.append(("HostMemoryResource", HostMemoryResource()))
    except Exception as exc:  # noqa: BLE001  (not written yet, or no runtime here)
        notes.append(f"HostMemoryResource skipped: {type(exc).__name__}: {exc}")
    return found, notes


def run(number: int, repeat: int) -> Dict[str, Any]:
    """Measure every case; returns the JSON-able report."""
    stream = stream_ref()
    resources, notes = _resources()
    results = []
    for name, res in resources:
        is_async = is_async_resource(res)
        ref = async_resource_ref(res) if is_async else resource_ref(res)
        for case, stmt, needs_async in CASES:
            if needs_async and not is_async:
                continue
            try:  # the two take turns, to spread drift evenly over both sides
                got = ns_per_op({"direct": (_loop(stmt, res, stream), number),
                                 "ref": (_loop(stmt, ref, stream), number)}, repeat)
            except Exception as exc:  # noqa: BLE001  (a real resource may fail here)
                got = {"direct": f"failed: {type(exc).__name__}: {exc}"}
            failed = [v for v in got.values() if isinstance(v, str)]
            if failed:
                notes.append(f"{name} / {case} {failed[0]}")
                continue
            direct, through = got["direct"], got["ref"]
            results.append({"resource": name, "case": case, "direct_ns": round(direct, 1),
                            "ref_ns": round(through, 1),
                            "overhead_ns": round(through - direct, 1),
                            "binding": _binding(ref, res)})
    return {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "machine": platform.machine(), "number": number, "repeat": repeat,
            "goal_overhead_ns": 50, "results": results, "notes": notes}


def main(argv: Any = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--number", type=int, default=200_000, help="pairs per repeat")
    parser.add_argument("--repeat", type=int, default=7, help="repeats (median taken)")
    args = parser.parse_args(argv)
    report = run(args.number, args.repeat)
    print(f"{'resource':<20} {'case':<26} {'direct':>9} {'ref':>9} {'overhead':>9}  binding")
    for row in report["results"]:
        print(f"{row['resource']:<20} {row['case']:<26} {row['direct_ns']:>7.1f}ns "
              f"{row['ref_ns']:>7.1f}ns {row['overhead_ns']:>7.1f}ns  "
              f"{row['binding']}")
    for note in report["notes"]:
        print(note)
    save_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

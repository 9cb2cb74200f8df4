#!/usr/bin/env python3
"""Replay a LoggingResource (or RMM) CSV log against a resource and report its statistics.

    python scripts/replay_log.py run.csv                      # PoolResource(HostMemoryResource())
    python scripts/replay_log.py run.csv --resource host      # HostMemoryResource() itself
    python scripts/replay_log.py run.csv --resource mymod:make_resource   # make_resource()
    python scripts/replay_log.py run.csv --initial 64MiB --maximum 1GiB --json

Each ``allocate`` line allocates the same size from the target (through a
StatisticsResource), each ``free`` line frees what the matching ``allocate`` returned;
``allocate failure`` lines are counted, not replayed.  The replay is synchronous (the log's
stream handles belong to the process that wrote it).  The report gives the replayed
current / peak / total bytes and counts, the same figures computed from the log itself (they
must agree), and for a PoolResource target its peak pool size and the fragmentation figure
peak pool size / peak live bytes.  Allocations still live at the end of the log are freed
after the report's figures are taken.  A missing or bad log (the line named), or a resource
that cannot be made or cannot replay it (the line named), is one line on standard error and
exit status 2; a ``--resource module:callable`` module is found in the current directory
too.  The parser and the replay are ``hipmr_ctypes.logfile.read_log`` / ``replay``;
``python -m hipmr_ctypes plot`` draws a log.
"""
from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import sys
from dataclasses import asdict
from typing import Any, List, Optional, TextIO

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from hipmr_ctypes._sizes import parse_bytes as _parse_bytes  # noqa: E402
from hipmr_ctypes.adaptors import PoolResource  # noqa: E402
from hipmr_ctypes.errors import HipError  # noqa: E402
from hipmr_ctypes.logfile import ReplayReport, read_log, replay  # noqa: E402,F401  (its API)

def parse_bytes(text: str) -> int:
    """``"64MiB"``, ``"2kB"``, ``"4096"`` -> bytes: the package's one size grammar, without
    fractions (a replayed pool has no device to take a fraction of); ValueError otherwise."""
    return _parse_bytes(text)


def default_resource(initial: Optional[int] = None, maximum: Optional[int] = None) -> Any:
    """``PoolResource(HostMemoryResource(), initial, maximum)``."""
    from hipmr_ctypes.resources import HostMemoryResource
    return PoolResource(HostMemoryResource(), initial, maximum)


def resource_from_spec(spec: Optional[str], initial: Optional[int] = None,
                       maximum: Optional[int] = None) -> Any:
    """``None``/``"pool"``: the default; ``"host"``: HostMemoryResource();
    ``"module:callable"``: ``callable()``."""
    if spec in (None, "pool"):
        return default_resource(initial, maximum)
    if spec == "host":
        from hipmr_ctypes.resources import HostMemoryResource
        return HostMemoryResource()
    if ":" not in spec:
        raise ValueError(f"--resource {spec!r}: expected pool, host or module:callable")
    module, _, name = spec.partition(":")
    # as ``python -m`` and the interpreter's prompt do: a module in the current directory
    # can be named (this script's own directory is first on sys.path, not the caller's)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(1, os.getcwd())
    try:
        factory: Any = importlib.import_module(module)
        for part in name.split("."):
            factory = getattr(factory, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"--resource {spec!r}: {exc}") from None
    if not callable(factory):
        raise ValueError(f"--resource {spec!r}: {name} is not callable")
    return factory()


def format_report(report: ReplayReport) -> str:
    r, g = report.replayed, report.from_log
    lines = [f"events: {report.events} ({report.failures_in_log} allocation failures in the "
             f"log, {report.unmatched_frees} frees without an allocation, "
             f"{report.live_at_end} allocations live at the end)",
             f"{'':14}{'replayed':>16}{'log':>16}"]
    for name in ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes",
                 "total_count"):
        lines.append(f"{name:14}{getattr(r, name):>16}{getattr(g, name):>16}")
    if report.peak_pool_size is not None:
        lines.append(f"peak pool size: {report.peak_pool_size}")
        if report.fragmentation is not None:
            lines.append(f"fragmentation (peak pool / peak live): {report.fragmentation:.3f}")
    lines.append("statistics match" if r == g else "STATISTICS DIFFER")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None, out: Optional[TextIO] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="the CSV log (- for standard input)")
    parser.add_argument("--resource", default=None,
                        help="pool (default), host, or module:callable returning a resource")
    parser.add_argument("--initial", type=parse_bytes, default=None,
                        help="initial pool size of the default pool (e.g. 64MiB)")
    parser.add_argument("--maximum", type=parse_bytes, default=None,
                        help="maximum pool size of the default pool")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        resource = resource_from_spec(args.resource, args.initial, args.maximum)
        source = io.TextIOWrapper(sys.stdin.buffer, newline="", encoding="utf-8",
                                  errors="replace") if args.log == "-" else args.log
        events = read_log(source)
        done = [0]

        def count(event: Any) -> None:
            done[0] += 1

        try:
            report = replay(events, resource, on_event=count)
        except (ValueError, MemoryError, HipError) as exc:
            line = events[done[0]].line if done[0] < len(events) else 0
            raise ValueError(f"line {line}: cannot replay it against {resource!r}: "
                             f"{type(exc).__name__}: {exc}") from None
    except (OSError, ValueError, TypeError, MemoryError, HipError) as exc:
        # a missing or bad log, a resource that cannot be made or cannot replay it: one line
        # and status 2, as ``python -m hipmr_ctypes plot`` says it
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        print(f"replay_log.py: {first}", file=sys.stderr)
        return 2
    out = out if out is not None else sys.stdout
    if args.json:
        out.write(json.dumps(report.as_dict(), default=lambda o: asdict(o), indent=2) + "\n")
    else:
        out.write(format_report(report) + "\n")
    return 0 if report.replayed == report.from_log else 1


if __name__ == "__main__":
    sys.exit(main())

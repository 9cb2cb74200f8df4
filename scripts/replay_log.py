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
after the report's figures are taken.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import io
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, TextIO, Union

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from hipmr_ctypes.adaptors import (LOG_HEADER, PoolResource, Statistics,  # noqa: E402
                                   StatisticsResource)

_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "kib": 1 << 10,
          "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"64MiB"``, ``"2kb"``, ``"4096"`` -> bytes (ValueError otherwise)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"could not parse {text!r} as a size (e.g. 4096, 64MiB, 2kb)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


@dataclass
class ReplayReport:
    """What a replay found: the replayed statistics, the log's own, and some counts."""

    replayed: Statistics
    from_log: Statistics
    events: int = 0
    failures_in_log: int = 0
    unmatched_frees: int = 0
    live_at_end: int = 0
    peak_pool_size: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def fragmentation(self) -> Optional[float]:
        """Peak pool size / peak live bytes (None without a pool or live bytes)."""
        if self.peak_pool_size is None or not self.replayed.peak_bytes:
            return None
        return self.peak_pool_size / self.replayed.peak_bytes

    def as_dict(self) -> Dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra"}
        out["fragmentation"] = self.fragmentation
        out.update(self.extra)
        return out


class _LogCounter:
    """Statistics computed from the log alone (the same rules as StatisticsResource)."""

    def __init__(self) -> None:
        self.cur = self.peak = self.total = self.ncur = self.npeak = self.ntotal = 0

    def allocate(self, size: int) -> None:
        self.cur += size
        self.ncur += 1
        self.total += size
        self.ntotal += 1
        self.peak = max(self.peak, self.cur)
        self.npeak = max(self.npeak, self.ncur)

    def free(self, size: int) -> None:
        self.cur -= size
        self.ncur -= 1

    def statistics(self) -> Statistics:
        return Statistics(self.cur, self.ncur, self.peak, self.npeak, self.total, self.ntotal)


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
    factory = importlib.import_module(module)
    for part in name.split("."):
        factory = getattr(factory, part)
    return factory()


def replay(log: Union[str, os.PathLike, TextIO], resource: Any = None) -> ReplayReport:
    """Replay ``log`` (a path or an open text file) against ``resource`` (default:
    :func:`default_resource`)."""
    if resource is None:
        resource = default_resource()
    if isinstance(log, (str, os.PathLike)):
        with open(log, newline="") as f:
            return _replay(f, resource)
    return _replay(log, resource)


def _replay(f: TextIO, resource: Any) -> ReplayReport:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None or ",".join(h.strip() for h in header) != LOG_HEADER:
        raise ValueError(f"not a LoggingResource log: the first line must be {LOG_HEADER!r}, "
                         f"not {','.join(header or [])!r}")
    stats = StatisticsResource(resource)
    counter = _LogCounter()
    mapping: Dict[int, List[Any]] = {}    # logged pointer -> [(replayed ptr, size), ...]
    events = failures = unmatched = 0
    for lineno, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != 6:
            raise ValueError(f"line {lineno}: expected 6 fields, got {len(row)}: {row!r}")
        action = row[2].strip()
        try:
            ptr = 0 if row[3].strip() == "(nil)" else int(row[3], 0)
            size = int(row[4])
        except ValueError:
            raise ValueError(f"line {lineno}: bad pointer or size in {row!r}") from None
        events += 1
        if action == "allocate":
            counter.allocate(size)
            mapping.setdefault(ptr, []).append((stats.allocate(size), size))
        elif action == "free":
            entries = mapping.get(ptr)
            match = next((i for i, (_, s) in enumerate(entries or ()) if s == size), None)
            if match is None:
                unmatched += 1
                continue
            new, _ = entries.pop(match)
            if not entries:
                del mapping[ptr]
            counter.free(size)
            stats.deallocate(new, size)
        elif action == "allocate failure":
            failures += 1
        else:
            raise ValueError(f"line {lineno}: unknown action {action!r}")
    report = ReplayReport(stats.statistics, counter.statistics(), events, failures, unmatched,
                          sum(len(v) for v in mapping.values()))
    pool = resource if isinstance(resource, PoolResource) else None
    if pool is not None:
        report.peak_pool_size = pool.peak_pool_size
    for entries in mapping.values():
        for new, size in entries:
            stats.deallocate(new, size)
    return report


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
    resource = resource_from_spec(args.resource, args.initial, args.maximum)
    source = io.TextIOWrapper(sys.stdin.buffer, newline="") if args.log == "-" else args.log
    report = replay(source, resource)
    out = out if out is not None else sys.stdout
    if args.json:
        out.write(json.dumps(report.as_dict(), default=lambda o: asdict(o), indent=2) + "\n")
    else:
        out.write(format_report(report) + "\n")
    return 0 if report.replayed == report.from_log else 1


if __name__ == "__main__":
    sys.exit(main())

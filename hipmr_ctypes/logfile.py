"""Read and replay the CSV logs ``LoggingResource`` (and RMM's ``LoggingResourceAdaptor``) write.

    from hipmr_ctypes.logfile import read_log, replay

    events = read_log("run.csv")            # [LogEvent(line, thread, time, seconds, action, ...)]
    report = replay("run.csv", resource)    # the log replayed against a resource, with statistics

A log starts with the header ``Thread,Time,Action,Pointer,Size,Stream``; each line after it is
one event: the thread id (decimal), the local time ``HH:MM:SS.ffffff``, the action
(``allocate``, ``allocate failure`` or ``free``), the pointer (hex; RMM writes a failure's null
pointer as ``(nil)``), the size in bytes (decimal) and the stream handle (hex; ``0`` for the
null stream).  The format and its reader are ``hipmr_ctypes._log.format`` (no resource in it);
the replay, which runs a log against resources and adaptors, is here.
``scripts/replay_log.py`` and ``hipmr_ctypes.plot`` are built on this module.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Optional

from ._log.format import (ACTIONS, LOG_HEADER, LogColumns, LogEvent, LogSource, Pairing, iter_log,
                         read_columns, read_log)
from .adaptors.pool import PoolResource
from .adaptors.statistics_resource import Statistics, StatisticsResource

__all__ = ["LOG_HEADER", "ACTIONS", "LogEvent", "LogSource", "LogColumns", "read_log",
           "read_columns", "iter_log", "ReplayReport", "replay"]


class _LogCounter:
    """Statistics computed from the log alone (the same rules and counter names as
    StatisticsResource)."""

    def __init__(self) -> None:
        self.current_bytes = self.current_count = self.peak_bytes = self.peak_count = 0
        self.total_bytes = self.total_count = 0

    def allocate(self, size: int) -> None:
        self.current_bytes += size
        self.current_count += 1
        self.total_bytes += size
        self.total_count += 1
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
        if self.current_count > self.peak_count:
            self.peak_count = self.current_count

    def free(self, size: int) -> None:
        self.current_bytes -= size
        self.current_count -= 1

    def statistics(self) -> Statistics:
        return Statistics(self.current_bytes, self.current_count, self.peak_bytes,
                          self.peak_count, self.total_bytes, self.total_count)


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


def replay(log: LogSource, resource: Any = None,
           on_event: Optional[Callable[[LogEvent], None]] = None) -> ReplayReport:
    """Replay ``log`` synchronously against ``resource`` (default:
    ``PoolResource(HostMemoryResource())``) through a ``StatisticsResource``.

    Each ``allocate`` allocates the same size, each ``free`` frees what its ``allocate``
    returned (a free without one is counted, not replayed), ``allocate failure`` lines are
    counted.  ``on_event(event)``, when given, is called after each event is replayed (the
    plots read the pool's size there).  Allocations still live at the end are freed after the
    report's figures are taken, also when the replay stops with an error.
    """
    if resource is None:
        from .resources.host import HostMemoryResource
        resource = PoolResource(HostMemoryResource())
    stats = StatisticsResource(resource)
    counter = _LogCounter()
    pairs: Pairing[int] = Pairing()   # key: the pointer the replay allocated
    events = failures = unmatched = 0
    try:
        for event in iter_log(log):
            events += 1
            action = event.action
            if action == "allocate":
                pairs.allocate(stats.allocate(event.size), event.ptr, event.size)
                counter.allocate(event.size)
            elif action == "free":
                new = pairs.free(event.ptr, event.size)
                if new is None:
                    unmatched += 1
                else:
                    counter.free(event.size)
                    stats.deallocate(new, event.size)
            else:
                failures += 1
            if on_event is not None:
                on_event(event)
        live = list(pairs.remaining())
        report = ReplayReport(stats.statistics, counter.statistics(), events, failures,
                              unmatched, len(live))
        if isinstance(resource, PoolResource):
            report.peak_pool_size = resource.peak_pool_size
        return report
    finally:
        for new, size in list(pairs.remaining()):
            stats.deallocate(new, size)

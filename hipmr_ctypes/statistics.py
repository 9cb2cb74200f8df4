"""Allocation statistics of the current device's resource, as RMM's ``rmm.statistics``.

Statistics are *enabled* when the current device's resource is a
:class:`~hipmr_ctypes.StatisticsResource`: :func:`enable_statistics` wraps it once,
:func:`statistics` does so for a ``with`` block.  :func:`get_statistics`,
:func:`push_statistics` and :func:`pop_statistics` read and stack its counters, and return None
when statistics are not enabled.

:func:`profiler` records, per decorated function or named block, how many times it ran and
the bytes it allocated (total and peak) into a :class:`ProfilerRecords`.  When statistics are
not enabled it records nothing and a decorated function is called straight through, after one
look at the per-device resources (no native call, no lock).

Threads: every function here is thread-safe.  The counters belong to the resource, so a
frame (a profiled call or block) sees every allocation made while it is open, by any thread,
and frames open in several threads at once share one stack of counters: for exact per-frame
numbers, profile from one thread at a time.  Records are never lost or torn, every call is
counted, and the counter stack is left as it was found.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple, TypeVar, cast

from .adaptors.statistics_resource import Statistics, StatisticsResource
from .resources import per_device

__all__ = ["Statistics", "enable_statistics", "get_statistics", "push_statistics",
           "pop_statistics", "statistics", "ProfilerRecords", "default_profiler_records",
           "profiler", "get_descriptive_name_of_object"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _current() -> Optional[StatisticsResource]:
    mr = per_device.get_current_device_resource()
    return mr if isinstance(mr, StatisticsResource) else None


def enable_statistics() -> None:
    """Make the current device's resource a :class:`StatisticsResource` over the one it is
    now, unless it already is one (idempotent)."""
    with _switch_lock:
        mr = per_device.get_current_device_resource()
        if not isinstance(mr, StatisticsResource):
            per_device.set_current_device_resource(StatisticsResource(mr))


def get_statistics() -> Optional[Statistics]:
    """The current counters of the current device's resource; None when statistics are not
    enabled."""
    mr = _current()
    return None if mr is None else mr.statistics


def push_statistics() -> Optional[Statistics]:
    """Start a fresh set of counters; returns the statistics before the push (None, doing
    nothing, when statistics are not enabled)."""
    mr = _current()
    return None if mr is None else mr.push_counters()


def pop_statistics() -> Optional[Statistics]:
    """End the innermost set of counters and return it (None, doing nothing, when
    statistics are not enabled); ``IndexError`` when none was pushed."""
    mr = _current()
    return None if mr is None else mr.pop_counters()


_switch_lock = threading.RLock()
#: the wrappings that open ``statistics()`` blocks made: id(wrapper) -> [wrapper, the resource
#: it replaced, how many open blocks (in any thread) use it]; the last block to end puts the
#: replaced resource back, whichever thread opened the wrapping
_wrappings: Dict[int, List[Any]] = {}


@contextlib.contextmanager
def statistics() -> Generator[None, None, None]:
    """``with statistics():`` counts the allocations of the block.

    If statistics are enabled, a fresh set of counters is pushed on entry and popped on exit;
    otherwise the current device's resource is wrapped in a :class:`StatisticsResource` on
    entry and put back when the last block using that wrapping ends (blocks of several
    threads may overlap in any order).  The device is the one current at entry.
    ``ValueError`` on exit if that device's resource was replaced inside the block (the
    block's counters are then left where they are).
    """
    with _switch_lock:
        device, prior = per_device.current_device_and_resource()
        if isinstance(prior, StatisticsResource):
            prior.push_counters()
            pushed, inside = True, prior
            entry = _wrappings.get(id(prior))
            if entry is not None and entry[0] is prior:   # another block's wrapping
                entry[2] += 1
            else:
                entry = None
        else:
            inside = StatisticsResource(prior)
            per_device.set_per_device_resource(device, inside)
            pushed = False
            entry = _wrappings[id(inside)] = [inside, prior, 1]
    try:
        yield
    finally:
        with _switch_lock:
            replaced = per_device.get_per_device_resource(device) is not inside
            try:
                if pushed and not replaced:
                    inside.pop_counters()
            finally:
                if entry is not None:
                    entry[2] -= 1
                    if not entry[2]:
                        _wrappings.pop(id(inside), None)
                        if not replaced:
                            per_device.set_per_device_resource(device, entry[1])
        if replaced:
            raise ValueError("the current device resource was replaced inside the "
                             "statistics() block")


# ---- profiler ----------------------------------------------------------------------------------
class ProfilerRecords:
    """What :func:`profiler` recorded: ``records`` maps each name to a :class:`MemoryRecord`.
    Thread-safe."""

    @dataclass
    class MemoryRecord:
        """One function's or block's record: calls, total bytes allocated over all calls, and
        the largest peak of one call (bytes outstanding at once, counted from its start)."""

        num_calls: int = 0
        memory_total: int = 0
        memory_peak: int = 0

        def add(self, memory_total: int, memory_peak: int) -> None:
            """Count one more call."""
            self.num_calls += 1
            self.memory_total += memory_total
            self.memory_peak = max(self.memory_peak, memory_peak)

    #: RMM's earlier name for :class:`MemoryRecord`.
    Data = MemoryRecord

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: Dict[str, ProfilerRecords.MemoryRecord] = {}

    def add(self, name: str, data: Statistics) -> None:
        """Count one call of ``name`` that allocated ``data.total_bytes`` with a peak of
        ``data.peak_bytes``."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        with self._lock:
            record = self._records.get(name)
            if record is None:
                record = self._records[name] = ProfilerRecords.MemoryRecord()
            record.add(data.total_bytes, data.peak_bytes)

    @property
    def records(self) -> Dict[str, "ProfilerRecords.MemoryRecord"]:
        """A copy of ``{name: MemoryRecord}``."""
        with self._lock:
            return {name: ProfilerRecords.MemoryRecord(r.num_calls, r.memory_total,
                                                       r.memory_peak)
                    for name, r in self._records.items()}

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._records.clear()

    def report(self, ordered_by: str = "memory_peak") -> str:
        """A table of the records, largest ``ordered_by`` first (``"num_calls"``,
        ``"memory_peak"`` or ``"memory_total"``); says "No data" when nothing was recorded."""
        if ordered_by not in ("num_calls", "memory_peak", "memory_total"):
            raise ValueError(f"ordered_by={ordered_by!r}: expected 'num_calls', "
                             "'memory_peak' or 'memory_total'")
        rows = sorted(self.records.items(), key=lambda item: getattr(item[1], ordered_by),
                      reverse=True)
        lines = ["Memory Profiling", "================", ""]
        if not rows:
            lines.append("No data, maybe profiling wasn't enabled?")
            return "\n".join(lines)
        lines += [f"Ordered by:   {ordered_by}", "Memory units: bytes", "",
                  "ncalls     memory_peak    memory_total  filename:lineno(function)"]
        for name, r in rows:
            lines.append(f"{r.num_calls:6,d} {r.memory_peak:15,d} {r.memory_total:15,d}  {name}")
        return "\n".join(lines)

    #: RMM's name for :meth:`report`.
    pretty_print = report

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return f"ProfilerRecords({self.records})"


#: The records :func:`profiler` writes to when given none.
default_profiler_records: ProfilerRecords = ProfilerRecords()


def get_descriptive_name_of_object(obj: Any) -> str:
    """``file:line(qualified name)`` of a function (what a decorated function is recorded
    under); the qualified name alone when the function has no code object."""
    import inspect
    obj = inspect.unwrap(obj)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    code = getattr(obj, "__code__", None)
    if code is None:
        return str(qualname)
    return f"{code.co_filename}:{code.co_firstlineno}({qualname})"


_values = per_device._resources.values
_is_statistics: Dict[type, bool] = {}   # resource type -> is it a StatisticsResource


def _enabled() -> bool:
    """Cheap: is any per-device resource a StatisticsResource?  (No native call, no lock: one
    pass over the table, a dict lookup per resource.)"""
    try:
        for mr in _values():
            kind = type(mr)
            known = _is_statistics.get(kind)
            if known is None:
                known = _is_statistics[kind] = issubclass(kind, StatisticsResource)
            if known:
                return True
    except RuntimeError:  # the table changed under us (another thread): look again, copied
        return any(isinstance(mr, StatisticsResource) for mr in tuple(_values()))
    return False


class _Frame:
    """One profiled call or block: pushes counters on the current device's statistics
    resource at entry, pops and records them at exit."""

    __slots__ = ("_mr",)

    def __init__(self) -> None:
        self._mr: Optional[StatisticsResource] = None

    def enter(self) -> None:
        if _enabled():
            mr = _current()
            if mr is not None:
                mr.push_counters()
                self._mr = mr

    def exit(self, records: ProfilerRecords, name: str) -> None:
        mr, self._mr = self._mr, None
        if mr is None:
            return
        try:
            popped = mr.pop_counters()
        except IndexError:  # someone popped every set meanwhile: nothing left to record
            return
        records.add(name, popped)


class profiler:
    """``@profiler(records=..., name=...)`` on a function, or ``with profiler(name=...):``
    around a block: records the allocations of each call / run of the block into ``records``
    (default: :data:`default_profiler_records`) under ``name`` (for a function, default
    ``file:line(qualified name)``; a block needs a name).  Does nothing when statistics are
    not enabled.  Nested frames are counted in the frames around them too.
    """

    __slots__ = ("_records", "_name", "_frames", "_frames_lock")

    def __init__(self, *, records: ProfilerRecords = default_profiler_records,
                 name: str = "") -> None:
        if not isinstance(records, ProfilerRecords):
            raise TypeError(f"records must be a ProfilerRecords, not {type(records).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        self._records = records
        self._name = name
        #: the blocks open now, oldest first: (thread that entered, frame)
        self._frames: List[Tuple[int, _Frame]] = []
        self._frames_lock = threading.Lock()

    def __call__(self, func: _F) -> _F:
        if not callable(func):
            raise TypeError(f"profiler decorates a callable, not {type(func).__name__}")
        records = self._records
        name = self._name or get_descriptive_name_of_object(func)
        enabled = _enabled

        @functools.wraps(func)
        def profiled(*args: Any, **kwargs: Any) -> Any:
            if not enabled():
                return func(*args, **kwargs)
            frame = _Frame()
            frame.enter()
            try:
                return func(*args, **kwargs)
            finally:
                frame.exit(records, name)

        return cast(_F, profiled)

    def __enter__(self) -> "profiler":
        if not self._name:
            raise ValueError("profiler used as a context manager needs a name: "
                             "with profiler(name='...'):")
        frame = _Frame()
        frame.enter()
        item = (threading.get_ident(), frame)
        with self._frames_lock:
            self._frames.append(item)
        return self

    def __exit__(self, *exc: Any) -> None:
        """Ends the calling thread's innermost open block; a thread with none open ends the
        newest block of another thread (a block may be finished in another thread than the
        one that opened it)."""
        me = threading.get_ident()
        with self._frames_lock:
            frames = self._frames
            for i in range(len(frames) - 1, -1, -1):
                if frames[i][0] == me:
                    break
            else:
                i = len(frames) - 1
            if i < 0:
                raise RuntimeError(f"profiler(name={self._name!r}): __exit__ without a "
                                   "matching __enter__")
            frame = frames.pop(i)[1]
        frame.exit(self._records, self._name)

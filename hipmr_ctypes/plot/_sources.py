"""Turn what ``timeline`` is given (a log, a ``LoggingResource``, a recording, a tracking
resource) into a :class:`~hipmr_ctypes.plot._model.Source`: :func:`source_of` chooses, and
replays a log against a pool where asked; :func:`find_pool` finds the pool a recording samples."""
from __future__ import annotations

import io
import os
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import HipError
from .._log.format import LogColumns, read_columns
from ..logfile import replay
from ._model import Source

__all__ = ["source_of", "find_pool", "from_columns", "from_recording", "from_tracking",
           "Recording"]


class Recording(io.TextIOBase):
    """The file a recording ``LoggingResource`` writes to (see :func:`hipmr_ctypes.plot.record`):
    it keeps the lines in memory and, after each one, the size of ``pool`` (a ``PoolResource``
    or None).  ``LoggingResource`` writes under its lock, so lines and sizes stay in step."""

    def __init__(self, pool: Any = None) -> None:
        super().__init__()
        self._lines: List[str] = []
        self._sizes: List[int] = []
        self._pool_size = pool.pool_size if pool is not None else None
        self.pool = pool
        self.name = "<recording>"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.closed:
            raise ValueError("write to a closed recording")
        self._lines.append(text)
        if self._pool_size is not None:
            self._sizes.append(self._pool_size())
        return len(text)

    def getvalue(self) -> str:
        """The CSV log recorded so far."""
        return "".join(list(self._lines))

    def snapshot(self) -> "tuple[str, Optional[List[int]]]":
        """The text recorded so far and the pool's size after each event (None without a
        pool)."""
        lines, sizes = list(self._lines), list(self._sizes)
        n = min(len(lines), len(sizes)) if self._pool_size is not None else len(lines)
        return "".join(lines[:n]), (sizes[1:n] if self._pool_size is not None else None)


def _positions(axis: str, seconds: Sequence[float], width: float) -> List[float]:
    n = len(seconds)
    if axis == "event":
        scale = width / max(n - 1, 1)
        return [i * scale for i in range(n)]
    xs: List[float] = []
    if not n:
        return xs
    first = seconds[0]
    last = first
    clamped = []
    for s in seconds:                  # lines of several threads may be a little out of order
        if s > last:
            last = s
        clamped.append(last)
    span = (last - first) or 1.0
    # divided by the span first: a span of 1e-300 s would make width / span infinite
    return [(s - first) / span * width for s in clamped]


def from_columns(log: LogColumns, *, axis: str, width: float, kind: str = "log",
                 pool_sizes: Optional[List[int]] = None, description: str = "") -> Source:
    """A log as a Source: each ``free`` is paired with the live ``allocate`` of the same
    pointer and size, as ``replay`` pairs them."""
    xs = _positions(axis, log.seconds, width)
    actions, ptrs, sizes = log.action, log.ptr, log.size
    starts = [i for i, action in enumerate(actions) if action == "allocate"]
    a_ptr = [ptrs[i] for i in starts]
    a_size = [sizes[i] for i in starts]
    a_stream = [log.stream[i] for i in starts]
    a_thread = [log.thread[i] for i in starts]
    a_end = [-1] * len(starts)
    deltas: List[Tuple[int, int, int]] = []
    add = deltas.append
    # pointer -> its live allocation number, or a list of them when one pointer is live more
    # than once (a free is matched with the earliest of the same size, as Pairing does)
    live: Dict[int, Any] = {}
    get = live.get
    unmatched = 0
    a = 0
    code = {"allocate": 1, "free": -1}
    for i, (op, ptr, size) in enumerate(zip(map(code.get, actions), ptrs, sizes)):
        if op == 1:
            prev = get(ptr)
            if prev is None:
                live[ptr] = a
            elif type(prev) is int:
                live[ptr] = [prev, a]
            else:
                prev.append(a)
            add((i, a, 1))
            a += 1
        elif op == -1:
            prev = get(ptr)
            found = -1
            if type(prev) is int:
                if a_size[prev] == size:
                    found = prev
                    del live[ptr]
            elif prev is not None:
                for k, b in enumerate(prev):
                    if a_size[b] == size:
                        found = b
                        del prev[k]
                        if len(prev) == 1:
                            live[ptr] = prev[0]
                        break
            if found < 0:
                unmatched += 1
            else:
                a_end[found] = i
                add((i, found, -1))
    failures = [(i, sizes[i], log.stream[i], log.thread[i])
                for i, action in enumerate(actions) if action == "allocate failure"]
    return Source(kind, axis, width, xs, log.seconds, log.time, log.line, a_ptr, a_size,
                  a_stream, a_thread, starts, a_end, None, deltas, failures, unmatched,
                  pool_sizes, description)


def from_recording(recording: Recording, *, axis: str, width: float,
                   description: str = "") -> Source:
    text, sizes = recording.snapshot()
    return from_columns(read_columns(io.StringIO(text)), axis=axis, width=width,
                        kind="recording", pool_sizes=sizes, description=description)


def from_tracking(tracking: Any, *, width: float, description: str = "") -> Source:
    """The outstanding allocations of a ``TrackingResource``, in the order they were made
    (the x axis counts them: a tracking resource keeps no times), with their stacks."""
    outstanding = list(tracking.outstanding().values())
    n = len(outstanding)
    xs = [i * width / n for i in range(n)]      # each allocation one slot wide
    stacks: List[Optional[str]] = [
        "".join(traceback.format_list(a.stack)).rstrip() if a.stack is not None else None
        for a in outstanding]
    return Source("tracking", "event", width, xs, [float(i) for i in range(n)],
                  [f"#{i + 1}" for i in range(n)], [0] * n, [a.ptr for a in outstanding],
                  [a.size for a in outstanding], [a.stream or 0 for a in outstanding],
                  [0] * n, list(range(n)), [-1] * n, stacks, [(i, i, 1) for i in range(n)],
                  [], 0, None, description)


def describe_path(path: Any) -> str:
    return os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""


def find_pool(resource: Any) -> Any:
    """The first ``PoolResource`` down the chain of upstreams of ``resource`` (or None);
    ValueError for a stack with a cycle."""
    from ..adaptors.pool import PoolResource
    from ..resource_refs import upstream_chain
    for found in upstream_chain(resource, "hipmr_ctypes.plot.record"):
        if isinstance(found, PoolResource):
            return found
    return None


def source_of(source: Any, pool: Any, axis: str, width: float) -> Source:
    """What ``timeline`` draws for ``source`` (a log, a ``LoggingResource``, a recording or a
    ``TrackingResource``; ``pool``: a log's pool to replay it against, see ``timeline``)."""
    from ..adaptors.logging import LoggingResource
    from ..adaptors.pool import PoolResource
    from ..adaptors.tracking import TrackingResource
    if isinstance(source, TrackingResource):
        if pool is not None:
            raise ValueError("pool= applies to logs, not to a TrackingResource")
        return from_tracking(source, width=width,
                             description="the outstanding allocations of a TrackingResource, "
                                         "in the order they were made")
    if isinstance(source, PoolResource):
        raise TypeError("a PoolResource keeps no history: allocate through "
                        "hipmr_ctypes.plot.record(pool) and draw that recording, or draw a "
                        "log of the run with pool=")
    if isinstance(source, LoggingResource):
        file = source.file
        if isinstance(file, Recording):
            if pool is not None:
                raise ValueError("pool= applies to logs; a recording samples its own pool")
            what = "a recording" + (" of a PoolResource" if file.pool is not None else "")
            return from_recording(file, axis=axis, width=width, description=what)
        source.flush()
        name = source.get_file_name()
        getvalue = getattr(file, "getvalue", None)
        if callable(getvalue):
            source = io.StringIO(str(getvalue()))
        elif name and os.path.exists(name):
            source = name
        else:
            raise TypeError("this LoggingResource writes to a file that cannot be read back; "
                            "draw its log file instead")
    if isinstance(source, (str, bytes)) and not isinstance(source, str):
        raise TypeError("a log is a path, an open text file or LogEvents, not bytes")
    log = read_columns(source)
    description = describe_path(source)
    sizes: Optional[List[int]] = None
    if pool is not None:
        sizes, pool_name = _replay_pool(log.events(), pool)
        description += f"; replayed against {pool_name} for the pool's size"
    return from_columns(log, axis=axis, width=width, pool_sizes=sizes,
                        description=description)


def _replay_pool(events: List[Any], pool: Any) -> "tuple[List[int], str]":
    from ..adaptors.pool import PoolResource
    if pool is True:
        from ..resources.host import HostMemoryResource
        pool = PoolResource(HostMemoryResource())
    elif not callable(getattr(pool, "pool_size", None)):
        raise TypeError(f"pool must be True or a PoolResource, not {type(pool).__name__}")
    sizes: List[int] = []
    size_of = pool.pool_size
    try:
        replay(events, pool, on_event=lambda event: sizes.append(size_of()))
    except (MemoryError, ValueError, OverflowError, HipError) as exc:
        # an allocation of the log that this pool cannot give (larger than its maximum, or
        # than the memory there is): the line that asked for it, and why
        line = events[len(sizes)].line if len(sizes) < len(events) else 0
        where = f"line {line}: " if line else ""
        raise ValueError(f"{where}the log cannot be replayed against {pool!r}: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                         ) from exc
    return sizes, repr(pool)

"""Our memory in PyTorch's memory-snapshot format, for PyTorch's memory viewer.

:func:`memory_snapshot` turns what this package knows about memory into the dictionary that
``torch.cuda.memory._snapshot()`` returns (documented there): ``segments`` (memory an
allocator obtained, each split into ``blocks``) and ``device_traces`` (one list of events per
device: ``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
``oom``).  ``torch.cuda._memory_viz`` (``segsum``, ``trace``, ``trace_plot``,
``segment_plot``) and PyTorch's memory-viewer page read it like PyTorch's own, so what CuPy,
Numba and this package allocated can be looked at beside PyTorch's memory.

Pure data: this module needs no PyTorch (``hipmr_ctypes.interop.torch`` re-exports the
function).  What each source gives:

* a ``PoolResource``: its chunks as segments, split into its live blocks
  (``active_allocated``, with the size asked for) and its free blocks (``inactive``); no
  events (the pool keeps no history);
* a ``TrackingResource``: each outstanding allocation as a segment of one
  ``active_allocated`` block, with the stack it was made from when the resource captures
  stacks; no events;
* a log (``LoggingResource``'s CSV or RMM's: a path, an open text file, the events of
  ``hipmr_ctypes.logfile.read_log``, or the ``LoggingResource`` itself): every event in order,
  an allocation as ``segment_alloc`` + ``alloc``, a free as ``free_requested`` +
  ``free_completed`` + ``segment_free`` (the resource a log records hands out whole ranges:
  each allocation is its own segment), a failure as ``oom``; the segments are the allocations
  still live at the end of the log.  Times are the log's, in microseconds (``time_us``).

Any other resource: the first of those kinds found below it through its upstreams (a
``StatisticsResource`` over a pool gives the pool's).
"""
from __future__ import annotations

import io
import os
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from .._log.format import LogEvent, read_log
from .._memory_query import memory_device
from ..adaptors.logging import LoggingResource
from ..adaptors.pool import PoolResource, block_size
from ..adaptors.tracking import TrackingResource
from ..resource_refs import upstream_chain

__all__ = ["memory_snapshot"]

_GRAIN = 256                 # the pool's block sizes and starts are multiples of this
_LARGE = 1 << 20             # PyTorch's "large" segments are over 1 MiB
_NO_POOL = (0, 0)            # segment_pool_id: PyTorch's default pool

Snapshot = Dict[str, Any]


def memory_snapshot(source: Any, *, device: Optional[int] = None) -> Snapshot:
    """``source`` in PyTorch's memory-snapshot format (see the module docstring): a dict with
    ``segments`` and ``device_traces``, for ``torch.cuda._memory_viz`` and PyTorch's memory
    viewer (``pickle.dump`` it to a file the viewer opens).

    ``source``: a ``PoolResource``, a ``TrackingResource``, a ``LoggingResource`` (its log is
    read back: it must write to a named file or to an ``io.StringIO``), a log (a path, an open
    text file or an iterable of ``hipmr_ctypes.logfile.LogEvent``), or a resource with one of
    those below it.  ``device``: the device to file the memory under (default: the device of
    the resource's memory, else 0; a log names no device).

    TypeError for anything else (and for a device that is not an int), ValueError for a bad
    log line or a negative device; the source is only read, never changed."""
    if device is not None and (type(device) is not int or device < 0):
        raise (TypeError if type(device) is not int else ValueError)(
            f"device must be a non-negative int, not {device!r}")
    if isinstance(source, (str, os.PathLike, io.IOBase)):
        log: Any = source  # read_log names a bad file kind itself
        return _from_log(read_log(log), 0 if device is None else device)
    if isinstance(source, (Iterator, list, tuple)):
        return _from_log(_events(source), 0 if device is None else device)
    found = _find(source)
    where = device if device is not None else (memory_device(found) or 0)
    if isinstance(found, PoolResource):
        return _snapshot([_pool_segments(found, where)], where, [])
    if isinstance(found, TrackingResource):
        return _snapshot([_tracked_segments(found, where)], where, [])
    return _from_log(_log_of(found), where)


def _events(source: Iterable[Any]) -> List[LogEvent]:
    """``source``'s log events (TypeError naming the first thing that is not one)."""
    events = list(source)
    for e in events:
        if not isinstance(e, LogEvent):
            raise TypeError(f"memory_snapshot needs LogEvents in a list of events, not "
                            f"{type(e).__name__}")
    return events


def _find(source: Any) -> Any:
    """The first pool, tracking or logging resource of ``source``'s stack."""
    for found in upstream_chain(source, "memory_snapshot"):  # ValueError for a cycle
        if isinstance(found, (PoolResource, TrackingResource, LoggingResource)):
            return found
    raise TypeError(f"memory_snapshot needs a PoolResource, a TrackingResource, a "
                    f"LoggingResource or its log (a path, a text file, LogEvents), or a "
                    f"resource with one of those below it; not {type(source).__name__}")


def _snapshot(segments: List[List[Dict[str, Any]]], device: int,
              trace: List[Dict[str, Any]]) -> Snapshot:
    traces: List[List[Dict[str, Any]]] = [[] for _ in range(device + 1)]
    traces[device] = trace
    return {"segments": [seg for group in segments for seg in group],
            "device_traces": traces}


def _segment(device: int, address: int, total: int, stream: int,
             blocks: List[Dict[str, Any]]) -> Dict[str, Any]:
    active = [b for b in blocks if b["state"] == "active_allocated"]
    return {"device": device, "address": address, "total_size": total, "stream": stream,
            "segment_type": "large" if total > _LARGE else "small",
            "segment_pool_id": _NO_POOL, "is_expandable": False,
            "allocated_size": sum(b["size"] for b in active),
            "active_size": sum(b["size"] for b in active),
            "requested_size": sum(b["requested_size"] for b in active),
            "frames": [], "blocks": blocks}


def _block(address: int, size: int, requested: int, state: str,
           frames: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    return {"address": address, "size": size, "requested_size": requested, "state": state,
            "frames": frames or []}


# --------------------------------------------------------------------------------- pool
def _pool_segments(pool: PoolResource, device: int) -> List[Dict[str, Any]]:
    """The pool's chunks, each split into live and free blocks; any stretch of a chunk that
    is in neither (a block between two steps of a fast path) is shown as free."""
    arena = pool._arena
    with arena.lock:
        chunks = dict(arena.chunks)
        live = dict(arena.live)
        free: Dict[int, int] = dict(arena.fsize)
        for lists in list(arena.classes.values()):
            for key, lst in list(lists.items()):
                size = block_size(key)
                for ptr in list(lst):
                    free[ptr] = size
    used: Dict[int, Tuple[int, int]] = {}
    for ptr, recorded in live.items():
        requested = block_size(recorded)
        used[ptr] = (-(-requested // _GRAIN) * _GRAIN, requested)
    segments = []
    for start in sorted(chunks):
        end = start + chunks[start]
        blocks: List[Dict[str, Any]] = []
        cursor = start
        for ptr in sorted(p for p in list(used) + list(free) if start <= p < end):
            if ptr < cursor:
                continue  # cannot overlap in a consistent pool: shown once
            if ptr > cursor:
                blocks.append(_block(cursor, ptr - cursor, 0, "inactive"))
            if ptr in used:
                size, requested = used[ptr]
                size = min(size, end - ptr)
                blocks.append(_block(ptr, size, min(requested, size), "active_allocated"))
            else:
                size = min(free[ptr], end - ptr)
                blocks.append(_block(ptr, size, 0, "inactive"))
            cursor = ptr + size
        if cursor < end:
            blocks.append(_block(cursor, end - cursor, 0, "inactive"))
        segments.append(_segment(device, start, end - start, 0, blocks))
    return segments


# ----------------------------------------------------------------------------- tracking
def _frames(stack: Any) -> List[Dict[str, Any]]:
    """A captured stack as PyTorch's frames (innermost first)."""
    if stack is None:
        return []
    return [{"filename": f.filename, "line": f.lineno or 0, "name": f.name}
            for f in reversed(list(stack))]


def _tracked_segments(tracking: TrackingResource, device: int) -> List[Dict[str, Any]]:
    segments = []
    for ptr, record in sorted(tracking.outstanding().items()):
        frames = _frames(record.stack)
        stream = record.stream or 0
        segments.append(_segment(device, ptr, record.size, stream,
                                 [_block(ptr, record.size, record.size, "active_allocated",
                                         frames)]))
    return segments


# ---------------------------------------------------------------------------------- log
def _log_of(logger: LoggingResource) -> List[LogEvent]:
    """What ``logger`` wrote so far, read back."""
    logger.flush()
    name = logger.get_file_name()
    if name is not None:
        return read_log(name)
    getvalue = getattr(logger.file, "getvalue", None)
    text = getvalue() if callable(getvalue) else None
    if isinstance(text, str):
        return read_log(io.StringIO(text))
    raise TypeError("memory_snapshot reads a LoggingResource's log back: it needs one that "
                    "writes to a named file or to an io.StringIO")


def _from_log(events: Iterable[LogEvent], device: int) -> Snapshot:
    trace: List[Dict[str, Any]] = []
    live: Dict[int, Tuple[int, int]] = {}
    for e in events:
        common = {"size": e.size, "stream": e.stream, "frames": [],
                  "time_us": int(round(e.seconds * 1e6))}
        if e.action == "allocate":
            live[e.ptr] = (e.size, e.stream)
            trace.append(dict(common, action="segment_alloc", addr=e.ptr))
            trace.append(dict(common, action="alloc", addr=e.ptr))
        elif e.action == "free":
            live.pop(e.ptr, None)
            for action in ("free_requested", "free_completed", "segment_free"):
                trace.append(dict(common, action=action, addr=e.ptr))
        else:  # "allocate failure": the memory the device still had is not in the log
            trace.append(dict(common, action="oom", device_free=0))
    segments = [_segment(device, ptr, size, stream,
                         [_block(ptr, size, size, "active_allocated")])
                for ptr, (size, stream) in sorted(live.items())]
    return _snapshot([segments], device, trace)

"""Test doubles and checks the test suite shares (``from support import ...``; pytest puts
this folder on ``sys.path``).  ``scripts/fuzz_pool.py`` uses them too.

* :class:`AddressSpaceResource`: a user-written async upstream handing out addresses (no memory)
  that checks how it is used; :class:`HostBufferResource`: a user-written synchronous one over
  real host memory.
* :class:`StreamModel` (fake events with vector clocks) and :func:`recording_events` (fake
  events that log their calls) replace the events the sub-allocators order streams with.
* :func:`check_pool_tiles`: a PoolResource's blocks tile its chunks exactly.
* :class:`LiveRanges`: live allocations of many threads, checked for overlap.
* :func:`no_native_call`: a block that must make no HIP call and change no allocation.
* :func:`past_deadline`: whether long loops must stop (``scripts/reliability_report.py
  --budget`` sets ``HIPMR_TEST_DEADLINE``).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading
import time
from bisect import bisect_left, insort
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from hipmr_ctypes import device_accessible, host_accessible, stream_ref
from hipmr_ctypes._hip.decls import DECLS
from hipmr_ctypes import _stream_order
from hipmr_ctypes.adaptors import PoolResource
from hipmr_ctypes.errors import OutOfMemoryError

__all__ = ["HOST", "STREAMS", "StreamModel", "recording_events", "FreedRanges",
           "AddressSpaceResource", "HostBufferResource", "check_pool_tiles", "LiveRanges",
           "NATIVE", "no_native_call", "past_deadline", "process_runtime"]

HOST = None          # the "stream" of synchronous calls, in the models below
# created streams' handles: the special handles 0, 1 and 2 name one stream per device (and
# thread), which the pools ask the runtime about; tests/test_stream_identity.py covers them
STREAMS = (HOST, 3, 4, 5, 6)

#: seconds since the epoch at which the long loops of the thread tests stop early (and count
#: what they ran): ``HIPMR_TEST_DEADLINE``, set by ``scripts/reliability_report.py --budget``
#: so that a report sized to its budget still runs every test; unset: no deadline
DEADLINE = float(os.environ.get("HIPMR_TEST_DEADLINE") or "inf")


def past_deadline() -> bool:
    """True once :data:`DEADLINE` has passed (a long loop stops there)."""
    return time.time() > DEADLINE


# --------------------------------------------------------------------------- fake streams
class StreamModel:
    """Fake events for the adaptors' stream ordering, and vector clocks to check them with.

    Each stream counts the frees made on it.  Each stream (and the host) knows, for every
    stream, up to which free that stream's work is ordered before its own later work:
    ``Event.record(s)`` snapshots what s knows (and s's own count), ``wait_event(t, ev)``
    merges the snapshot into what t knows, ``ev.synchronize()`` into what the host knows
    (which every later operation inherits).  Ordering is transitive, as on a GPU.
    """

    def __init__(self) -> None:
        self.clock: Dict[Any, int] = {s: 0 for s in STREAMS}
        self.know: Dict[Any, Dict[Any, int]] = {s: {} for s in STREAMS}  # HOST included
        self.events_made = 0

    def tick(self, stream: Any) -> int:
        self.clock[stream] += 1
        return self.clock[stream]

    def snapshot(self, stream: Any) -> Dict[Any, int]:
        view = dict(self.know[HOST])
        for src, count in self.know[stream].items():
            view[src] = max(view.get(src, 0), count)
        view[stream] = self.clock[stream]
        return view

    def merge(self, who: Any, view: Dict[Any, int]) -> None:
        mine = self.know[who]
        for src, count in view.items():
            if count > mine.get(src, 0):
                mine[src] = count

    def safe(self, source: Any, count: int, user: Any) -> bool:
        """Is ``user`` (a stream or HOST) ordered after free number ``count`` on ``source``?"""
        if source is HOST or source == user or self.know[HOST].get(source, 0) >= count:
            return True
        return user is not HOST and self.know[user].get(source, 0) >= count

    def install(self) -> Tuple[Any, Any]:
        model = self

        class FakeEvent:
            def __init__(self) -> None:
                self.view: Dict[Any, int] = {}
                self.closed = False
                model.events_made += 1

            def record(self, stream: Any) -> None:
                if stream is HOST or stream not in model.clock:
                    raise AssertionError(f"event recorded on a non-stream {stream!r}")
                self.view = model.snapshot(stream)

            def synchronize(self) -> None:
                model.merge(HOST, self.view)

            def close(self) -> None:
                self.closed = True

        def wait_event(stream: Any, ev: FakeEvent) -> None:
            if stream is HOST or stream not in model.clock:
                raise AssertionError(f"wait_event on a non-stream {stream!r}")
            model.merge(stream, ev.view)

        # fake streams never reach the runtime: fake events stand for theirs
        saved = (_stream_order.event_for, _stream_order.wait_event, _stream_order.device_of)
        _stream_order.event_for = lambda stream, device=None: FakeEvent()
        _stream_order.wait_event = wait_event
        _stream_order.device_of = lambda handle: 0
        return saved

    @staticmethod
    def uninstall(saved: Tuple[Any, Any, Any]) -> None:
        _stream_order.event_for, _stream_order.wait_event, _stream_order.device_of = saved


def recording_events(setattr_: Any) -> List[Tuple[Any, ...]]:
    """Replace the adaptors' events by fakes that log every call as ``("record", stream)``,
    ``("wait", stream)``, ``("synchronize",)`` or ``("close",)``; ``setattr_(obj, name,
    value)`` does the replacing (pytest's ``monkeypatch.setattr`` undoes it afterwards).
    Returns the log."""
    calls: List[Tuple[Any, ...]] = []

    class RecordingEvent:
        def record(self, stream: Any) -> None:
            calls.append(("record", stream))

        def synchronize(self) -> None:
            calls.append(("synchronize",))

        def close(self) -> None:
            calls.append(("close",))

    setattr_(_stream_order, "event_for", lambda stream, device=None: RecordingEvent())
    setattr_(_stream_order, "device_of", lambda handle: 0)
    setattr_(_stream_order, "wait_event", lambda stream, ev: calls.append(("wait", stream)))
    return calls


class FreedRanges:
    """Address ranges not in use, each with the (stream, count) of the free that released it:
    whoever gets them next must be ordered after that free."""

    def __init__(self) -> None:
        self.starts: List[int] = []
        self.info: Dict[int, Tuple[int, Any, int]] = {}   # start -> (end, stream, count)

    def add(self, start: int, end: int, stream: Any, count: int) -> None:
        self.take(start, end)            # a newer free replaces older records
        insort(self.starts, start)
        self.info[start] = (end, stream, count)

    def overlapping(self, start: int, end: int) -> List[Tuple[int, int, Any, int]]:
        starts = self.starts
        i = max(bisect_left(starts, start) - 1, 0)
        found = []
        while i < len(starts) and starts[i] < end:
            s = starts[i]
            e, stream, count = self.info[s]
            if e > start:
                found.append((s, e, stream, count))
            i += 1
        return found

    def take(self, start: int, end: int) -> List[Tuple[int, int, Any, int]]:
        """Remove [start, end) from the records; returns the records it overlapped."""
        found = self.overlapping(start, end)
        for s, e, stream, count in found:
            del self.starts[bisect_left(self.starts, s)]
            del self.info[s]
            if s < start:
                insort(self.starts, s)
                self.info[s] = (start, stream, count)
            if e > end:
                insort(self.starts, end)
                self.info[end] = (e, stream, count)
        return found


# ---------------------------------------------------------------------- test upstreams
class AddressSpaceResource:
    """A user-written async resource handing out addresses (no memory behind them).

    Allocations are aligned as asked (any power of two) and never overlap; the resource checks
    that each deallocation matches an allocation (pointer, size, alignment) and, with a
    :class:`StreamModel`, that nothing is given back before the streams that freed it were
    waited for.  ``capacity`` (bytes outstanding) makes it raise ``OutOfMemoryError``.
    """

    def __init__(self, capacity: Optional[int] = None, base: int = 1 << 32,
                 properties: Tuple[type, ...] = (device_accessible,),
                 streams: Optional[StreamModel] = None,
                 freed: Optional[FreedRanges] = None) -> None:
        self.properties = properties
        self.capacity = capacity
        self.next = base
        self.live: Dict[int, Tuple[int, int]] = {}
        self.outstanding = 0
        self.calls = 0
        self.streams = streams
        self.freed = freed
        # a sub-allocator calls its upstream from several threads at once (it lets its own
        # lock go during the call): the bookkeeping below is a read-modify-write each
        self._lock = threading.Lock()

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        return self._allocate(bytes, alignment, HOST)

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        self._deallocate(ptr, bytes, alignment, HOST)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        self._check_stream(stream)
        return self._allocate(bytes, alignment, stream)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        self._check_stream(stream)
        self._deallocate(ptr, bytes, alignment, stream)

    @staticmethod
    def _check_stream(stream: Any) -> None:
        if not (type(stream) is int and stream >= 0):
            stream_ref(stream)  # TypeError / ValueError for anything that is not a stream

    def _allocate(self, nbytes: int, alignment: int, stream: Any) -> int:
        with self._lock:
            return self._allocate_locked(nbytes, alignment, stream)

    def _deallocate(self, ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
        with self._lock:
            self._deallocate_locked(ptr, nbytes, alignment, stream)

    def _allocate_locked(self, nbytes: int, alignment: int, stream: Any) -> int:
        if type(nbytes) is not int or nbytes < 0 or alignment & (alignment - 1):
            raise ValueError(f"bad arguments ({nbytes!r}, {alignment!r})")
        self.calls += 1
        if not nbytes:
            return 0
        if self.capacity is not None and self.outstanding + nbytes > self.capacity:
            raise OutOfMemoryError(size=nbytes, detail="AddressSpaceResource capacity")
        ptr = -(-self.next // max(alignment, 256)) * max(alignment, 256)
        self.next = ptr + nbytes + 4096      # a gap, so that chunks are never adjacent
        self.live[ptr] = (nbytes, alignment)
        self.outstanding += nbytes
        if self.freed is not None and self.streams is not None and stream is not HOST:
            # stream-ordered memory: usable on `stream` at once, elsewhere after a wait
            self.freed.add(ptr, ptr + nbytes, stream, self.streams.tick(stream))
        return ptr

    def _deallocate_locked(self, ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
        self.calls += 1
        if not ptr and not nbytes:
            return
        if self.live.get(ptr) != (nbytes, alignment):
            raise AssertionError(f"upstream: deallocate({ptr:#x}, {nbytes}, {alignment}) "
                                 f"does not match an allocation ({self.live.get(ptr)})")
        if self.freed is not None and self.streams is not None:
            for s, e, src, count in self.freed.take(ptr, ptr + nbytes):
                if not self.streams.safe(src, count, stream):
                    raise AssertionError(
                        f"upstream: [{s:#x}, {e:#x}) given back on {stream!r} before the "
                        f"free #{count} on stream {src!r} was waited for")
        del self.live[ptr]
        self.outstanding -= nbytes

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    __hash__ = object.__hash__


class HostBufferResource:
    """A user-written synchronous resource over real host memory (ctypes buffers), with the
    properties it is given.  Each allocation is a fresh buffer, so the bytes can be written
    and read back; outstanding buffers are kept alive in ``live``."""

    def __init__(self, properties: Tuple[type, ...] = (host_accessible,)) -> None:
        self.properties = properties
        self.live: Dict[int, Tuple[Any, int]] = {}

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        if type(bytes) is not int or bytes < 0:
            raise ValueError(f"bytes={bytes!r}")
        if not bytes:
            return 0
        buf = ctypes.create_string_buffer(bytes + alignment)
        ptr = -(-ctypes.addressof(buf) // alignment) * alignment
        self.live[ptr] = (buf, bytes)
        return ptr

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        if not ptr and not bytes:
            return
        buf, size = self.live.pop(ptr)
        if size != bytes:
            self.live[ptr] = (buf, size)
            raise ValueError(f"size {bytes} != {size}")

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    __hash__ = object.__hash__


# ------------------------------------------------------------------------- pool checks
def check_pool_tiles(pool: PoolResource) -> None:
    """The pool's best-fit blocks, free-list blocks and live blocks tile its chunks exactly."""
    arena = pool._arena
    pieces = []
    for start, size in arena.fsize.items():
        pieces.append((start, size, "free"))
    for key, classes in arena.classes.items():
        for size, lst in classes.items():
            pieces.extend((p, size, f"list {key!r}") for p in lst)
    for ptr, nbytes in arena.live.items():
        pieces.append((ptr, -(-nbytes // 256) * 256, "live"))
    pieces.sort()
    chunks = sorted(arena.chunks.items())
    if sum(s for _, s in chunks) != arena.pool_size:
        raise AssertionError("pool_size differs from the sum of the chunks")
    if len(arena.fsorted) != len(arena.fsize) or len(arena.fend) != len(arena.fsize):
        raise AssertionError("best-fit structure maps disagree")
    i = 0
    for start, size in chunks:
        pos = start
        while i < len(pieces) and pieces[i][0] < start + size:
            p, s, what = pieces[i]
            if p != pos:
                raise AssertionError(f"chunk {start:#x}: {what} block at {p:#x}, expected "
                                     f"{pos:#x}")
            pos += s
            i += 1
        if pos != start + size:
            raise AssertionError(f"chunk {start:#x}+{size}: blocks end at {pos:#x}")
    if i != len(pieces):
        raise AssertionError(f"block {pieces[i]} lies outside every chunk")
    for start, size in arena.fsize.items():  # coalesced: no two free neighbours in a chunk
        end = start + size
        if end in arena.fsize and end not in arena.chunks:
            raise AssertionError(f"free blocks at {start:#x} and {end:#x} were not merged")


# ------------------------------------------------------------------------ thread checks
class LiveRanges:
    """Every live allocation's [start, end) (an empty one counts as one byte), of any number of
    threads, checked for overlap under one lock; ``errors`` lists the overlaps found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: List[int] = []
        self.ends: Dict[int, int] = {}
        self.errors: List[str] = []

    def add(self, ptr: int, size: int) -> None:
        end = ptr + max(size, 1)
        with self.lock:
            i = bisect_left(self.starts, ptr)
            if i < len(self.starts) and self.starts[i] < end:
                self.errors.append(f"{ptr:#x}+{size} overlaps {self.starts[i]:#x}")
            if i and self.ends[self.starts[i - 1]] > ptr:
                self.errors.append(f"{ptr:#x}+{size} overlaps {self.starts[i - 1]:#x}")
            insort(self.starts, ptr)
            self.ends[ptr] = end

    def remove(self, ptr: int) -> None:
        with self.lock:
            del self.starts[bisect_left(self.starts, ptr)]
            del self.ends[ptr]


# ------------------------------------------------------------------------- native calls
#: The error queries, which report and never act: every other function of the table is native
#: work that :func:`no_native_call` forbids.
ERROR_QUERIES = frozenset({"hipGetErrorName", "hipGetErrorString", "hipGetLastError",
                           "hipPeekAtLastError", "hipExtGetLastError"})
NATIVE = [d.name for d in DECLS if d.name not in ERROR_QUERIES]


@contextlib.contextmanager
def no_native_call(emulator: Any) -> Iterator[None]:
    """Assert that the block makes no HIP call at all and changes no allocation (garbage
    collection is off meanwhile: earlier tests' garbage must not be freed inside it)."""
    enabled = gc.isenabled()
    gc.disable()
    before = emulator.live_allocations()
    emulator.inject_failure(code=999, count=1, calls=NATIVE)
    try:
        yield
    finally:
        pending = emulator.pending_faults()
        emulator.clear_faults()
        if enabled:
            gc.enable()
    assert pending == 1, "a native call was made"
    assert emulator.live_allocations() == before


@contextlib.contextmanager
def process_runtime(rt: Any = None) -> Iterator[Any]:
    """Make ``rt`` the process-wide runtime (``None``: keep the current one) with an empty
    per-device resource table for the block; the previous runtime and table come back after.
    Yields the runtime in use."""
    from hipmr_ctypes import _hip
    from hipmr_ctypes.resources import per_device
    saved = dict(per_device._resources)
    previous = _hip.set_runtime(rt) if rt is not None else None
    with per_device._lock:
        per_device._resources.clear()
        per_device._changed()
    try:
        yield _hip.get_runtime() if rt is None else rt
    finally:
        if rt is not None:
            _hip.set_runtime(previous)
        with per_device._lock:
            per_device._resources.clear()
            per_device._resources.update(saved)
            per_device._changed()


def run_in_thread(fn: Callable[[], Any]) -> Tuple[Optional[int], Any]:
    """Run ``fn`` in a new thread; return (the thread's ident, ``fn``'s result) once ``join``
    returned (a thread still running after 60 s fails the test)."""
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "thread hung"
    return t.ident, out[0]


# CPython 3.13t (free-threaded) can hang in finalization while daemon threads run Python code:
# a pure-Python script with four busy daemon threads hangs in about 1 of 6 runs under load,
# without this package; the GIL build never does.
DAEMON_EXIT_HANGS = sys.version_info[:2] == (3, 13) and "free-threading" in sys.version
DAEMON_EXIT_REASON = ("CPython 3.13t can hang at exit while daemon threads run Python code "
                      "(reproduced without this package)")

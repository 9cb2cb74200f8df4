"""The reference model the sub-allocators are checked against: ``scripts/fuzz_pool.py`` runs
on it, and the test suite imports it through ``tests/support.py``.

* :class:`AddressSpaceResource`: a user-written async upstream handing out addresses (no
  memory) that checks how it is used: matching frees, capacity, and (with a
  :class:`StreamModel` and :class:`FreedRanges`) that nothing freed on one stream is handed
  back before that stream was waited for.
* :class:`StreamModel`: fake events with vector clocks, installed in place of the events the
  sub-allocators order streams with; :data:`HOST` and :data:`STREAMS` are its streams.
* :class:`FreedRanges`: address ranges not in use, each with the free that released it.
* :func:`check_pool_tiles`: a PoolResource's blocks tile its chunks exactly.
* :class:`Corruption`: what all of them raise when the model is broken.

It lives here, beside the fuzzer, because a script must not reach into ``tests/``; the tests
depend on the scripts they exercise, not the other way round.
"""
from __future__ import annotations

import threading
from bisect import bisect_left, insort
from typing import Any, Dict, List, Optional, Tuple

from hipmr_ctypes import OutOfMemoryError, PoolResource, device_accessible, stream_ref
from hipmr_ctypes import _stream_order
from hipmr_ctypes.adaptors.pool import block_size

__all__ = ["HOST", "STREAMS", "Corruption", "StreamModel", "FreedRanges", "AddressSpaceResource",
           "check_pool_tiles"]


class Corruption(AssertionError):
    """A sub-allocator broke the model: overlapping or mis-tiled blocks, a free that matches no
    allocation, memory handed to another stream before a wait.  ``reliability_kind`` is how
    ``scripts/reliability_report.py`` counts it."""

    reliability_kind = "corruption"

HOST = None          # the "stream" of synchronous calls, in the models below
# created streams' handles: the special handles 0, 1 and 2 name one stream per device (and
# thread), which the pools ask the runtime about; tests/device/test_stream_identity.py covers them
STREAMS = (HOST, 3, 4, 5, 6)


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

    def install(self) -> Tuple[Any, Any, Any]:
        model = self

        class FakeEvent:
            def __init__(self) -> None:
                self.view: Dict[Any, int] = {}
                self.closed = False
                model.events_made += 1

            def record(self, stream: Any) -> None:
                if stream is HOST or stream not in model.clock:
                    raise Corruption(f"event recorded on a non-stream {stream!r}")
                self.view = model.snapshot(stream)

            def synchronize(self) -> None:
                model.merge(HOST, self.view)

            def close(self) -> None:
                self.closed = True

        def wait_event(stream: Any, ev: FakeEvent) -> None:
            if stream is HOST or stream not in model.clock:
                raise Corruption(f"wait_event on a non-stream {stream!r}")
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
            raise Corruption(f"upstream: deallocate({ptr:#x}, {nbytes}, {alignment}) "
                                 f"does not match an allocation ({self.live.get(ptr)})")
        if self.freed is not None and self.streams is not None:
            for s, e, src, count in self.freed.take(ptr, ptr + nbytes):
                if not self.streams.safe(src, count, stream):
                    raise Corruption(
                        f"upstream: [{s:#x}, {e:#x}) given back on {stream!r} before the "
                        f"free #{count} on stream {src!r} was waited for")
        del self.live[ptr]
        self.outstanding -= nbytes

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
            pieces.extend((p, block_size(size), f"list {key!r}") for p in lst)
    for ptr, nbytes in arena.live.items():
        pieces.append((ptr, -(-block_size(nbytes) // 256) * 256, "live"))
    pieces.sort()
    chunks = sorted(arena.chunks.items())
    if sum(s for _, s in chunks) != arena.pool_size:
        raise Corruption("pool_size differs from the sum of the chunks")
    if len(arena.fsorted) != len(arena.fsize) or len(arena.fend) != len(arena.fsize):
        raise Corruption("best-fit structure maps disagree")
    i = 0
    for start, size in chunks:
        pos = start
        while i < len(pieces) and pieces[i][0] < start + size:
            p, s, what = pieces[i]
            if p != pos:
                raise Corruption(f"chunk {start:#x}: {what} block at {p:#x}, expected "
                                     f"{pos:#x}")
            pos += s
            i += 1
        if pos != start + size:
            raise Corruption(f"chunk {start:#x}+{size}: blocks end at {pos:#x}")
    if i != len(pieces):
        raise Corruption(f"block {pieces[i]} lies outside every chunk")
    for start, size in arena.fsize.items():  # coalesced: no two free neighbours in a chunk
        end = start + size
        if end in arena.fsize and end not in arena.chunks:
            raise Corruption(f"free blocks at {start:#x} and {end:#x} were not merged")

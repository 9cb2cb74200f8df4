"""``PoolResource``: a coalescing best-fit sub-allocator over any resource, with an exact-fit
fast path.

Design (see docs/adaptors.md for the long version):

* Blocks are carved from *chunks* the pool gets from its upstream; every block size is a
  multiple of 256 (the *size class* of a request is its size rounded up to 256), and every
  block starts 256-aligned.
* **Fast path.**  A freed block goes to a free list for its (stream, size class); the pool
  keeps, per stream, a dict from each exact requested size seen to that class's list.  An
  allocation of a size seen before on the same stream is then: one lock, one dict lookup for
  the stream, one for the size, a ``list.pop`` and the store of ``ptr -> size`` in the dict of
  live blocks.  A deallocation pops ``ptr`` from the live dict (unknown pointer or wrong size:
  ``ValueError``, state unchanged) and appends it to the list.
* **Slow path** (a miss): the class list (other exact sizes of the class), then clean blocks
  freed synchronously, then the best-fit structure (free blocks sorted by size, with
  start/end maps so that neighbours coalesce in O(1)), then all free lists flushed into the
  best-fit structure (coalescing them), then growth from the upstream (doubling when short of free
  bytes, by an eighth when they are enough but fragmented; up to ``maximum_pool_size``), then giving fully free chunks back and growing again, then
  ``OutOfMemoryError``.
* **Stream order.**  Synchronous ``allocate`` / ``deallocate`` are host-synchronous: a block
  freed with ``deallocate`` is safe for every stream.  A block freed with
  ``deallocate_async(..., stream=S)`` is handed out again at once on S; a best-fit block
  carries the set of streams whose queued work may still use it, and before it goes to another
  stream T the pool records an event on each such stream and makes T wait for it
  (``wait_event``), or, for a synchronous allocation, waits for the event on the host.
  Chunks obtained with ``allocate_async(..., T)`` start tagged with T.
* **Graph capture.**  While the stream of a request takes part in a capture, the pool does
  nothing capture forbids: a block that another stream's work may still use (or that a
  capturing stream freed, for any other stream) is not ordered with events but passed over
  for one that needs no event; when none fits, an upstream with stream-ordered allocation
  serves the request itself (``allocate_async`` on the capturing stream: a graph memory node,
  given back to the upstream when freed, never counted in ``pool_size()``), and any other
  upstream grows the pool with its synchronous ``allocate`` in Relaxed capture mode.  No
  host wait involves a capturing stream.  The capture state is asked only where an event
  would otherwise be made (``StreamOrder.capture_safe``).
"""
from __future__ import annotations

import threading
from operator import attrgetter
from bisect import bisect_left, insort
from collections import deque
from typing import Any, Callable, Deque, Dict, FrozenSet, List, NamedTuple, Optional

from ..errors import ForkedChildError, OutOfMemoryError
from .._locks import DeferringLock
from .._device_sizes import config_size
from .._sizes import Size
from .._exit import finalize
from ..properties import DEFAULT_ALIGNMENT
from ..stream_refs import PER_THREAD_HANDLE, IntValue
from ._dead import ANY as _ANY, DEAD as _DEAD, let_go, rescue as _rescue
from .._checks import (FAST_ALIGNMENTS, MAX_SIZE, check_alignment, check_free, check_ptr,
                       check_size, check_stream)
from .._stream_order import (SYNC, Recorded, StreamOrder, handle_of, own_keys_below,
                             stream_keys, wait_all)
from ..stream import relaxed_capture_mode, track_streams
from ._base import BoundAdaptor, IdentityEqual
from ._chunks import (check_upstream_chunk, give_back_chunks, overlaps, refuse_in_forked_child,
                      return_chunks, round_up)

__all__ = ["PoolResource"]

_GRAIN = DEFAULT_ALIGNMENT          # block sizes and starts are multiples of this
_MIN_GROWTH = 1 << 20               # the smallest chunk the pool asks for when it grows
_MAX_SIZES_PER_STREAM = 4096        # exact sizes remembered per stream (then forgotten)
_CLEAN: FrozenSet[Any] = frozenset()
_NONE: Any = object()                    # "no such live block" (equal to no size)
# What the fast paths use off their usual path, as globals rather than closure cells (every
# cell is copied into every call's frame)
_MISS = (KeyError, IndexError, TypeError)  # no list / empty list / unhashable argument
# Free lists of blocks aligned to more than 256 (kept for frees with a larger alignment and
# for AlignedResource over the pool): keyed in the same maps as the others, by a negative int
# that cannot be a size, -((log2(alignment) - 8) << _SHIFT) - size, for sizes up to _SIZE_MASK
# and alignments up to _ALIGNED_MAX: then every key is a one-digit int (below 2**30 in
# magnitude), which CPython hashes and compares as fast as a small size
_SHIFT = 25
_SIZE_MASK = (1 << _SHIFT) - 1
_ALIGNED_MAX = 1 << 31
_SERVED_MAX = _SIZE_MASK + 1 - _GRAIN   # the largest size whose block size has such a key


def has_aligned_key(nbytes: int, alignment: int) -> bool:
    """Whether blocks of ``nbytes`` aligned to ``alignment`` have lists of their own."""
    return _GRAIN < alignment <= _ALIGNED_MAX and nbytes <= _SIZE_MASK


def aligned_key(nbytes: int, alignment: int) -> int:
    """The free-list key of ``nbytes`` (an exact size or a block size) for blocks aligned to
    ``alignment`` (a power of two), when :func:`has_aligned_key`."""
    return -((alignment.bit_length() - 9) << _SHIFT) - nbytes


def block_size(class_key: int) -> int:
    """The size a list's key names (see :func:`aligned_key`); also the requested size of a
    live block, recorded as its exact size's key when an aligned fast path handed it out."""
    return class_key if class_key >= 0 else -class_key & _SIZE_MASK


class PoolView(NamedTuple):
    """What an adaptor directly over a :class:`PoolResource` may use to serve the pool's
    blocks from fast paths of its own, as the pool's own fast paths do (see
    :meth:`PoolResource._bind`; ``AlignedResource`` builds its paths over the pool from this
    view alone).  Read when the adaptor builds its paths: every field stays the same object
    for the pool's life (in a forked child the lists and ``live`` are emptied, so such fast
    paths miss and reach the refusing slow paths).  The rules, which keep the pool's
    lock-free invariants:

    * ``free[handle][key]`` is the free list of a stream handle (or ``SYNC``) for a list key;
      a missing handle or key raises KeyError (take the slow path then).  A list is only ever
      ``pop``-ed (an allocation: the pop hands the block to one caller) or ``append``-ed to
      (a free, after the claim in ``live``); a free that appended checks ``_dead`` as the
      pool's own frees do.  Nothing else changes ``free`` or its maps.
    * ``live[ptr]`` is the requested size of a live block, or the list key it was handed out
      under.  A block popped from a list is recorded ``live[ptr] = key`` before it is
      returned; a free claims it with ``live.pop(ptr)`` and, when it does not append it, puts
      back exactly what it popped before it calls a slow path.
    * ``stream_key(handle)``: the key the slow paths take for a checked stream handle.
    * ``allocate_slow(nbytes, alignment, key)`` / ``deallocate_slow(ptr, nbytes, alignment,
      key)``: the pool's checked paths (``key`` is ``SYNC`` for the host); they take the
      lock themselves, and file a block freed with an alignment above 256 that it has on the
      list of such blocks.
    * ``aligned_key(nbytes, alignment)``: the list key of blocks of ``nbytes`` (a requested
      size or a block size) aligned to ``alignment``, for an alignment above 256 up to
      ``max_alignment`` and a requested size up to ``largest_aligned``.
    """

    free: Dict[Any, Dict[int, Deque[int]]]
    live: Dict[int, int]
    stream_key: Callable[[int], Any]
    allocate_slow: Callable[[Any, Any, Any], int]
    deallocate_slow: Callable[[Any, Any, Any, Any], None]
    aligned_key: Callable[[int, int], int]
    max_alignment: int
    largest_aligned: int


class _Keyed(dict):  # type: ignore[type-arg]
    """``free[handle]`` for the handles that are not their own stream keys when several
    devices are visible: the per-thread stream's, and the null and legacy streams'.  Always
    empty: a size looked up in it is looked up in the free lists of the calling thread's key
    instead.  The fast paths then index ``free`` by those handles as by any other, with no
    test of the handle.  Never a key of the arena's other maps: flushes and forgotten streams
    never touch it.  ``__getitem__`` rather than ``__missing__``: CPython 3.12 runs a Python
    ``__getitem__`` in the caller's frame loop, while ``__missing__`` is called from C."""

    __slots__ = ("lists", "key", "handle")

    def __init__(self, lists: Dict[Any, Any], key: Callable[[int], Any], handle: int) -> None:
        super().__init__()
        self.lists = lists    # the arena's free
        self.key = key
        self.handle = handle

    def __getitem__(self, nbytes: int) -> Deque[int]:
        found: Deque[int] = self.lists[self.key(self.handle)][nbytes]
        return found


class _OwnLists(threading.local):
    """``free[PER_THREAD_HANDLE]`` when one device is visible.  Each thread's per-thread
    stream then has one key for good, and its map of free lists (exact size -> list) is made
    once per thread and kept here: ``own[nbytes]`` is ``sizes[nbytes]`` of the calling
    thread, all in C (``__getitem__`` is a property whose getter reads the thread's bound
    ``sizes.__getitem__``), so the fast paths index it as any other handle's map with no
    Python frame, no key made and no tuple hashed.  ``free[key]`` is this same dict whenever
    the arena keeps the key; when the arena forgets the key the dict is emptied, not dropped
    (a fast path then misses, and the slow path puts it back).  ``threading.local`` runs
    ``__init__`` in each thread on its first use."""

    def __init__(self, keys: Callable[[int], Any]) -> None:
        self.key = keys(PER_THREAD_HANDLE)
        sizes: Dict[int, Deque[int]] = {}
        self.sizes = sizes
        self.get = sizes.__getitem__

    __getitem__ = property(attrgetter("get"))


class _Arena:
    """The pool's state and slow paths.  Every method but the ``*_slow`` entry points expects
    the caller to hold ``lock``."""

    def __init__(self, up: Any, is_async: bool, maximum: Optional[int]) -> None:
        self.lock = DeferringLock()  # see deallocate_slow
        self.up_alloc = up.allocate
        self.up_dealloc = up.deallocate
        self.up_alloc_async = up.allocate_async if is_async else None
        self.up_dealloc_async: Callable[..., None] = up.deallocate_async if is_async else \
            self.up_dealloc_sync_only
        # an upstream whose allocate_async on a capturing stream is a graph memory node
        # (``AsyncMemoryResource`` and its kin say so with ``_graph_allocations``)
        self.graph_upstream = is_async and bool(getattr(up.resource, "_graph_allocations",
                                                        False))
        # blocks the upstream allocated on a capturing stream (graph memory): ptr -> size
        self.graph_blocks: Dict[int, int] = {}
        self.maximum = maximum
        # fast path: key (stream handle, or SYNC) -> {exact size -> list of free ptrs};
        # classes: key -> {block size -> the same lists}
        # free lists are deques: a list that the pair pattern empties and refills would give
        # its storage back and take it again on every allocate + deallocate pair
        self.free: Dict[Any, Dict[int, Deque[int]]] = {SYNC: {}}
        self.classes: Dict[Any, Dict[int, Deque[int]]] = {SYNC: {}}
        self.live: Dict[int, int] = {}         # ptr -> requested size (or its aligned key)
        # best-fit structure: free block start -> size / tag, end -> start, sorted (size, start)
        self.fsize: Dict[int, int] = {}
        self.ftag: Dict[int, FrozenSet[Any]] = {}
        self.fend: Dict[int, int] = {}
        self.fsorted: List[Any] = []
        self.chunks: Dict[int, int] = {}       # upstream chunk start -> size
        self.returning: Dict[int, int] = {}    # chunks on their way back (return_chunks)
        self.pool_size = 0
        self.pending = 0                       # bytes being asked of the upstream right now
        self.peak_pool_size = 0
        self.streams = StreamOrder()           # events for cross-stream reuse
        self.own: Optional[_OwnLists] = None   # one device: each thread's per-thread map
        self.keys: Callable[[int], Any] = stream_keys()   # (set again by the fast paths' _bind)
        self.forked = False                    # in a forked child: every slow path refuses
        track_streams(self)  # stream_closed runs before a package Stream is destroyed

    def up_dealloc_sync_only(self, ptr: int, nbytes: int, alignment: int, stream: int) -> None:
        """``up_dealloc_async`` of a synchronous upstream: never called (graph blocks come
        only from a stream-ordered upstream)."""
        self.up_dealloc(ptr, nbytes, alignment)

    def refuse_in_child(self) -> None:
        """In a forked child (its only thread): every free list and the live table emptied,
        so every fast path bound before the fork misses, and the slow paths refuse."""
        self.forked = True
        for maps in (self.free, self.classes):   # (a thread's _OwnLists map is free[its key]
            for sizes in maps.values():          # or empty: see _OwnLists)
                if type(sizes) is dict:   # (not the special handles' entries)
                    for lst in sizes.values():
                        lst.clear()
        self.live.clear()

    # ----------------------------------------------------------------- best-fit structure
    def _add(self, start: int, size: int, tag: FrozenSet[Any]) -> None:
        self.fsize[start] = size
        self.ftag[start] = tag
        self.fend[start + size] = start
        insort(self.fsorted, (size, start))

    def _remove(self, start: int) -> int:
        size = self.fsize.pop(start)
        del self.ftag[start]
        del self.fend[start + size]
        fs = self.fsorted
        del fs[bisect_left(fs, (size, start))]
        return size

    def _insert(self, start: int, size: int, tag: FrozenSet[Any]) -> None:
        """Add a free block, merged with free neighbours inside the same chunk."""
        chunks = self.chunks
        end = start + size
        if end in self.fsize and end not in chunks:
            rtag = self.ftag[end]
            size += self._remove(end)
            tag = tag | rtag
        if start in self.fend and start not in chunks:
            left = self.fend[start]
            ltag = self.ftag[left]
            size += self._remove(left)
            start = left
            tag = tag | ltag
        self._add(start, size, tag)

    def _find(self, size: int, alignment: int) -> Optional[Any]:
        """(block start, block size, aligned start) of the best fit, or None."""
        fs = self.fsorted
        i = bisect_left(fs, (size, 0))
        if alignment <= _GRAIN:
            if i == len(fs):
                return None
            bsize, start = fs[i]
            return start, bsize, start
        for j in range(i, len(fs)):
            bsize, start = fs[j]
            aligned = round_up(start, alignment)
            if aligned + size <= start + bsize:
                return start, bsize, aligned
        return None

    def _find_own(self, size: int, alignment: int, key: Any) -> Optional[Any]:
        """Like :meth:`_find`, among the free blocks that ``key`` may take with no event:
        clean ones, and for a stream its own."""
        fs = self.fsorted
        ftag = self.ftag
        for j in range(bisect_left(fs, (size, 0)), len(fs)):
            bsize, start = fs[j]
            tag = ftag[start]
            if tag and (key is SYNC or not all(
                    s == key or (type(s) is Recorded and s.key == key) for s in tag)):
                continue
            aligned = round_up(start, alignment) if alignment > _GRAIN else start
            if aligned + size <= start + bsize:
                return start, bsize, aligned
        return None

    def _take_global(self, size: int, alignment: int, key: Any) -> Optional[Any]:
        """``(ptr, host_events, tag)`` for a best-fit block, or None.  For the host (``SYNC``)
        a block still used by streams comes with fresh events the caller must wait for, after
        letting go of the lock; for a stream, that stream is made to wait (no host wait)."""
        found = self._find(size, alignment)
        if found is None:
            return None
        start, bsize, aligned = found
        tag = self.ftag[start]
        if tag and not self.streams.capture_safe(tag, key):
            found = self._find_own(size, alignment, key)   # one that needs no event
            if found is None:
                return None
            start, bsize, aligned = found
            tag = self.ftag[start]
        events = None
        if tag:
            if key is SYNC:
                events = self.streams.record_for_host(tag)  # may raise: nothing changed yet
            else:
                self._order(tag, key)  # may raise: nothing changed yet
        self._remove(start)
        if aligned > start:
            self._add(start, aligned - start, tag)
        end = aligned + size
        if start + bsize > end:
            self._add(end, start + bsize - end, tag)
        return aligned, events, tag

    # -------------------------------------------------------------------- stream order
    def _order(self, tag: FrozenSet[Any], key: Any) -> None:
        """Make ``key``'s stream (or the host, for SYNC) wait for the work queued on every
        stream of ``tag`` other than itself."""
        waited = self.streams.order(tag, key)
        if waited and key is SYNC:  # idle up to now: every free block is clean of them
            self._forget_streams(set(waited))

    def _forget_streams(self, streams: Any) -> None:
        ftag = self.ftag
        for start, tag in ftag.items():
            if tag and not streams.isdisjoint(tag):
                ftag[start] = tag - streams

    # ---------------------------------------------------------------------- free lists
    def _flush(self, key: Any, tag: Optional[FrozenSet[Any]] = None) -> None:
        """Move the free lists of ``key`` into the best-fit structure.

        The lock-free fast paths may pop from or append to these lists at any moment, so they
        are drained with atomic ``pop`` calls and never replaced or dropped: a block appended
        concurrently stays on a list that later allocations and flushes still see."""
        lists = [(size, lst) for size, lst in self.classes[key].items() if lst]
        if not lists:
            return
        if tag is None:  # (the calling thread's own per-thread stream: up to an event)
            tag = _CLEAN if key is SYNC else self.streams.tag_of(key)
        for size, lst in lists:
            self._drain(lst, size, tag)

    def _drain(self, lst: Deque[int], size: int, tag: FrozenSet[Any]) -> None:
        """Move every block of the free list ``lst`` (blocks of ``size``) into the best-fit
        structure with ``tag``; ``pop`` is the claim, so a fast path appending meanwhile loses
        nothing."""
        insert = self._insert
        pop = lst.pop
        size = block_size(size)  # (an aligned list's key)
        while True:
            try:
                ptr = pop()
            except IndexError:
                return
            insert(ptr, size, tag)

    def _flush_all(self) -> None:
        """Flush every free list into the best-fit structure, and forget the streams (other
        than the host's): the state kept per stream is bounded by the streams that freed
        memory since the last flush, not by every stream ever seen."""
        for key in list(self.classes):
            self._flush(key)
            if key is not SYNC:
                self._forget_key(key)
        used = set(self.classes)  # bound the devices noted by the streams still used
        for tag in self.ftag.values():
            if tag:
                used.update(tag)
        self.streams.prune(used)

    def _forget_key(self, key: Any, tag: Optional[FrozenSet[Any]] = None) -> None:
        """Drop ``key``'s free-list maps (flushed, lock held) and its ordering event.  A fast
        path may have fetched one of its lists just before and append to it afterwards: each
        list is recorded as let go, then drained once more, and such a free rescues its block
        (see ``_dead``)."""
        sizes = self.free.pop(key, None)
        if sizes:
            sizes.clear()  # (a thread's _OwnLists map: its fast paths miss from now on)
        classes = self.classes.pop(key, None)
        if classes:
            tag = frozenset((key,)) if tag is None else tag
            for size, lst in classes.items():
                let_go(lst, self.rescue, (tag, size))  # first: a free appending from now
                self._drain(lst, size, tag)            # on rescues; then the last drain
        self.streams.forget(key)

    def rescue(self, lst: Deque[int], belongs: Any) -> None:
        """A lock-free free appended to ``lst`` after the arena let it go: move its blocks into
        the best-fit structure (with the tag the list died with).  Deferred until the lock is
        let go when the calling thread holds it (a finalizer run inside a slow path)."""
        lock = self.lock
        if lock.held_here():
            lock.defer(self.rescue, lst, belongs)
            return
        with lock:
            tag, size = belongs
            self._drain(lst, size, tag)

    # ------------------------------------------------------------ a stream is destroyed
    def holds_stream(self, handle: int) -> bool:
        """Whether blocks may be kept for the created stream ``handle`` (no lock needed)."""
        return self.streams.holds(handle)

    def stream_closed(self, handle: int) -> None:
        """The package is about to destroy stream ``handle``, whose work is complete: its
        blocks become clean (safe for every stream) and the pool forgets it."""
        with self.lock:
            clean = frozenset((handle,))
            if handle in self.classes:
                self._flush(handle, _CLEAN)
                self._forget_key(handle, _CLEAN)
            self._forget_streams(clean)
            self.streams.drop(handle)

    def _take_cached(self, nbytes: int, size: int, alignment: int, key: Any) -> Optional[int]:
        """A block of class ``size`` from the free lists of ``key`` or the clean sync lists."""
        for k in (key, SYNC) if key is not SYNC else (SYNC,):
            classes = self.classes.get(k)
            if classes is not None and has_aligned_key(size, alignment):
                lst = classes.get(aligned_key(size, alignment))  # blocks aligned for it
                if lst:
                    try:
                        ptr = lst.pop()  # the fast paths may empty it concurrently
                    except IndexError:
                        ptr = None
                    if ptr is not None:
                        if k is key:
                            self._remember(key, aligned_key(nbytes, alignment), lst)
                        return ptr
            lst = classes.get(size) if classes is not None else None
            if not lst:
                continue
            ptr = None
            if alignment <= _GRAIN:
                try:
                    ptr = lst.pop()  # the fast paths may empty it concurrently
                except IndexError:
                    continue
            else:
                for cand in reversed(list(lst)):
                    if not cand & (alignment - 1):
                        try:
                            lst.remove(cand)  # atomic: fails if a fast path took it
                        except ValueError:
                            continue
                        ptr = cand
                        break
                if ptr is None:
                    continue
            if k is key:
                self._remember(key, nbytes, lst)
            return ptr
        return None

    def _remember(self, key: Any, nbytes: int, lst: Deque[int]) -> None:
        sizes = self.free[key]
        if len(sizes) >= _MAX_SIZES_PER_STREAM:  # bound the map; it refills on misses
            sizes.clear()
        sizes[nbytes] = lst

    # ------------------------------------------------------------------------ growth
    def _grow(self, need: int, nbytes: int, key: Any, captured: bool = False) -> None:
        """Get a chunk of at least ``need`` bytes from the upstream, or raise OutOfMemoryError.
        ``captured``: for a capturing stream, so no chunk is given back meanwhile (the
        upstream's free may synchronize the device, which a capture forbids)."""
        maximum = self.maximum
        if maximum is not None and self.pool_size + self.pending + need > maximum:
            if not captured:
                self._release_free_chunks()
            if self.pool_size + self.pending + need > maximum:
                raise OutOfMemoryError(
                    call="PoolResource.allocate", size=nbytes,
                    detail=f"the pool would pass maximum_pool_size={maximum} "
                           f"(pool size {self.pool_size}, free blocks cannot fit it)")
        want = max(need, self.pool_size, _MIN_GROWTH)   # short of memory: double
        if sum(size for size, _ in self.fsorted) >= need:
            # enough free bytes, but no block fits them (the caller flushed and coalesced):
            # a fragmented pool grows by an eighth, not by doubling
            want = max(need, self.pool_size // 8, _MIN_GROWTH)
        if maximum is not None:
            want = max(need, min(want, maximum - self.pool_size - self.pending))
        error = None
        while True:
            try:
                self._add_chunk(want, key, captured)
                return
            except MemoryError as exc:
                error = exc
            if want > need:
                want = max(need, round_up(want // 2, _GRAIN))
                continue
            break
        if not captured and self._release_free_chunks():
            try:
                self._add_chunk(need, key, captured)
                return
            except MemoryError as exc:
                error = exc
        raise OutOfMemoryError(call="PoolResource.allocate", size=nbytes,
                               detail=f"the upstream could not grow the pool by {need} bytes "
                                      f"(pool size {self.pool_size}): {error}") from error

    def _add_chunk(self, size: int, key: Any, captured: bool = False) -> None:
        """Get a chunk from the upstream.  The lock (held by the caller) is let go during the
        upstream call, which may block (a ``hipMalloc``, a stream synchronization): other
        threads keep allocating meanwhile.  ``pending`` keeps concurrent growth within
        ``maximum_pool_size``."""
        lock = self.lock
        tag: Optional[FrozenSet[Any]]
        self.pending += size
        lock.release()
        try:
            if key is SYNC or self.up_alloc_async is None or captured:
                # (``captured``: the stream of ``key`` captures, and a chunk the upstream
                # allocated on it would be a graph's, not the pool's: the synchronous
                # allocation, in Relaxed capture mode)
                ptr = self.up_alloc(size, _GRAIN)
                tag = _CLEAN
            else:
                self.streams.note(key)
                ptr = self.up_alloc_async(size, _GRAIN, handle_of(key))
                tag = None
        finally:
            lock.acquire()
            self.pending -= size
        check_upstream_chunk(ptr, size, self.chunks, self.up_dealloc, "PoolResource",
                             self.returning)
        self.chunks[ptr] = size
        self.pool_size += size
        if self.pool_size > self.peak_pool_size:
            self.peak_pool_size = self.pool_size
        # queued on key's stream (for the calling thread's own per-thread stream: up to an
        # event recorded now, once the chunk is the pool's)
        self._add(ptr, size, self.streams.tag_of(key) if tag is None else tag)

    def _release_free_chunks(self) -> int:
        """Give every fully free chunk back to the upstream; returns the bytes given back.

        Called with the lock held, and returns with it held; the lock is let go while the
        host waits for the streams that freed into those chunks and while the upstream frees
        them (both may block).  The chunks leave the pool first; until the upstream has them
        back they count in ``pending``, so concurrent growth stays within the maximum."""
        self._flush_all()
        empty = [(start, size) for start, size in self.chunks.items()
                 if self.fsize.get(start) == size]
        if not empty:
            return 0
        tags = {start: self.ftag[start] for start, _ in empty}
        streams = frozenset().union(*tags.values())
        if streams:   # a capturing stream is never waited for: its chunks stay
            capturing = {s for s in streams if self.streams.key_capturing(s)}
            if capturing:
                empty = [(start, size) for start, size in empty
                         if capturing.isdisjoint(tags[start])]
                if not empty:
                    return 0
                streams = frozenset().union(*(tags[start] for start, _ in empty))
        events = self.streams.record_for_host(streams) if streams else []  # may raise: no change
        total = 0
        for start, size in empty:   # out of the pool before the lock is let go
            self._remove(start)
            del self.chunks[start]
            self.pool_size -= size
            total += size
        self.pending += total

        def keep(rest: List[Any], waited: bool) -> None:  # what the upstream did not take
            self.pending -= total
            for start, size in rest:
                if overlaps(self.chunks, start, size):  # handed out again meanwhile
                    continue
                self.chunks[start] = size
                self.pool_size += size
                self._add(start, size, _CLEAN if waited else tags[start])

        given = return_chunks(self.lock, empty, events, self.up_dealloc, keep, self.returning)
        self.pending -= total
        return given

    # ------------------------------------------------------------------- entry points
    def allocate_slow(self, nbytes: Any, alignment: Any, key: Any) -> int:
        if self.forked:
            raise ForkedChildError()
        nbytes = check_size(nbytes)
        alignment = check_alignment(alignment)
        if not nbytes:
            return 0
        size = round_up(nbytes, _GRAIN)
        extra = alignment - _GRAIN if alignment > _GRAIN else 0
        if size + extra > MAX_SIZE:  # a valid request no upstream can serve
            raise OutOfMemoryError(call="PoolResource.allocate", size=nbytes,
                                   detail=f"with alignment={alignment} the pool would need "
                                          "a block of more than 2**63 bytes")
        with self.lock:
            found = self._take(nbytes, size, alignment, key)
            capturing = found is None and self.streams.key_capturing(key)
            if capturing and self.graph_upstream:
                return self._graph_alloc(nbytes, alignment, key)
            tries = 0
            while found is None:  # grow; other threads may take the new chunk first (the
                tries += 1        # lock is let go during the upstream call): then again
                if tries > 8:
                    raise OutOfMemoryError(call="PoolResource.allocate", size=nbytes,
                                           detail="other threads kept taking the pool's growth")
                if capturing:   # a synchronous upstream's allocation, allowed in capture
                    with relaxed_capture_mode():
                        self._grow(size + extra, nbytes, key, True)
                else:
                    self._grow(size + extra, nbytes, key)
                found = self._take_global(size, alignment, key)
            ptr: int
            ptr, events, tag = found
            if not events:
                self.live[ptr] = nbytes
                return ptr
        try:  # the host waits for the streams that last used the block, lock not held
            wait_all(events)
        except BaseException:
            with self.lock:
                self._insert(ptr, size, tag)
            raise
        self.live[ptr] = nbytes
        return ptr

    def _graph_alloc(self, nbytes: int, alignment: int, key: Any) -> int:
        """The upstream's stream-ordered allocation on the capturing stream of ``key`` (lock
        held, let go during the call): a graph memory node, the driver's, whose address the
        graph keeps; the pool hands it back to the upstream when it is freed."""
        lock = self.lock
        lock.release()
        try:
            alloc_async: Callable[..., int] = self.up_alloc_async  # type: ignore[assignment]
            ptr = alloc_async(nbytes, alignment, handle_of(key))   # (graph_upstream: async)
        finally:
            lock.acquire()
        self.graph_blocks[ptr] = nbytes
        return ptr

    def _graph_free(self, ptr: int, nbytes: int, alignment: int, key: Any) -> bool:
        """Give a graph block back to the upstream (on ``key``'s stream, or synchronously);
        False when ``ptr`` is not one (no lock needed: ``dict.pop`` is the claim)."""
        graph = self.graph_blocks
        size = graph.pop(ptr, None)
        if size is None:
            return False
        if size != nbytes:
            graph[ptr] = size
            check_free(ptr, size, nbytes, "PoolResource")   # raises: the wrong size
        if key is SYNC:
            self.up_dealloc(ptr, nbytes, alignment)
        else:
            self.up_dealloc_async(ptr, nbytes, alignment, handle_of(key))
        return True

    def _take(self, nbytes: int, size: int, alignment: int, key: Any) -> Optional[Any]:
        """A block from the free lists, the best-fit structure, or both after coalescing."""
        ptr = self._take_cached(nbytes, size, alignment, key)
        if ptr is not None:
            return ptr, None, _CLEAN
        found = self._take_global(size, alignment, key)
        if found is None:
            self._flush_all()
            found = self._take_global(size, alignment, key)
        return found

    def deallocate_slow(self, ptr: Any, nbytes: Any, alignment: Any, key: Any) -> None:
        """Checked deallocation (the caller holds no lock)."""
        if self.forked:
            raise ForkedChildError()
        ptr = check_ptr(ptr)
        nbytes = check_size(nbytes)
        alignment = check_alignment(alignment)
        if not ptr and not nbytes:
            return
        if self.graph_blocks and ptr not in self.live and \
                self._graph_free(ptr, nbytes, alignment, key):
            return
        lock = self.lock
        if lock.held_here():
            # a finalizer run by the garbage collector inside this thread's slow path (a pool
            # over this one giving its chunks back): free once the lock is let go
            lock.defer(self.deallocate_slow, ptr, nbytes, alignment, key)
            return
        with lock:
            known = self.live.get(ptr)
            check_free(ptr, None if known is None else block_size(known), nbytes,
                       "PoolResource")
            del self.live[ptr]
            self.push_locked(ptr, nbytes, key, alignment)

    def push_locked(self, ptr: int, nbytes: int, key: Any, alignment: int = _GRAIN) -> None:
        """Put a freed block on the free list of ``key`` (lock held): for an alignment above
        256 that the block has, on the list of blocks aligned so."""
        aligned = has_aligned_key(round_up(nbytes, _GRAIN), alignment) and \
            not ptr & (alignment - 1)
        exact = aligned_key(nbytes, alignment) if aligned else nbytes
        sizes = self.free.get(key)
        if sizes is None:
            self.streams.note(key)
            own = self.own
            sizes = self.free[key] = own.sizes if own is not None and key == own.key else {}
            self.classes[key] = {}
        lst = sizes.get(exact)
        if lst is None:
            size = round_up(nbytes, _GRAIN)
            if aligned:
                size = aligned_key(size, alignment)
            classes = self.classes[key]
            lst = classes.get(size)
            if lst is None:
                lst = classes[size] = deque()
            self._remember(key, exact, lst)
        lst.append(ptr)


class PoolResource(IdentityEqual, BoundAdaptor):
    """A pool sub-allocator over ``upstream`` (any resource or ref):
    ``PoolResource(upstream, initial_pool_size=None, maximum_pool_size=None)``.

    ``initial_pool_size``: bytes taken from the upstream at once (default: none; the pool grows
    on demand).  ``maximum_pool_size``: the most the pool ever holds (default: no limit); an
    allocation that cannot be served within it raises ``OutOfMemoryError``.  Sizes are rounded
    up to 256.  Every pointer is aligned to 256 at least; larger power-of-two alignments are
    honoured too.  ``allocate(0)`` returns 0.

    Thread-safe (one lock).  An async resource when the upstream is one.  ``release()`` gives
    fully free chunks back; ``pool_size()`` / ``peak_pool_size`` report the bytes held.  A pool
    equals only itself.  When garbage-collected, the pool gives all its chunks back to the
    upstream: keep it alive while its memory is in use.
    """

    def __init__(self, upstream: Any, initial_pool_size: Optional[Size] = None,
                 maximum_pool_size: Optional[Size] = None) -> None:
        ref = self._set_upstream(upstream)
        initial = 0 if initial_pool_size is None else config_size(initial_pool_size,
                                                                   "initial_pool_size")
        maximum = None if maximum_pool_size is None else config_size(maximum_pool_size,
                                                                     "maximum_pool_size")
        initial = round_up(initial, _GRAIN)
        if maximum is not None:
            maximum -= maximum % _GRAIN
            if initial > maximum:
                raise ValueError(f"initial_pool_size={initial_pool_size} exceeds "
                                 f"maximum_pool_size={maximum_pool_size}")
        self._initial = initial
        self._maximum = maximum
        arena = self._arena = _Arena(ref, self._async, maximum)
        if initial:
            with arena.lock:
                arena._add_chunk(initial, SYNC)
        finalize(self, give_back_chunks, arena.up_dealloc, arena.chunks)
        self._bind(arena)
        refuse_in_forked_child(self, arena)

    def _bind(self, arena: _Arena) -> None:
        """Build the hot-path closures and store them on the instance.

        The fast paths take no lock: each step is one atomic operation on a built-in list or
        dict (``list.pop`` hands a block to exactly one caller, ``dict.pop`` lets exactly one
        caller free it), and the slow paths, under the lock, only ever drain the free lists
        with ``pop`` and never drop a list a fast path may hold.  A block between two steps
        (popped from a list, not yet recorded live; or popped from ``live``, not yet appended)
        is neither free nor live, so no slow path can give its chunk back meanwhile."""
        free = arena.free                # stream -> {exact size -> free list}
        sync_free = free[SYNC]
        live = arena.live
        live_pop = live.pop
        allocate_slow = arena.allocate_slow
        deallocate_slow = arena.deallocate_slow
        # the free lists are keyed by stream_key (only checked streams have an entry): a
        # created stream's key is its handle, and so are the null and legacy streams' with one
        # device visible; then the per-thread stream's entry is an _OwnLists (the calling
        # thread's map).  With several devices visible the special handles' entries are _Keyed
        # maps, which look the calling thread's key up.
        key = arena.keys = stream_keys()   # bound to the runtime: one call per special key
        below = own_keys_below(key)
        if below == PER_THREAD_HANDLE:
            own = arena.own = _OwnLists(key)
            free[PER_THREAD_HANDLE] = own  # type: ignore[assignment]  # (indexed as a map)
        else:
            for handle in range(below, PER_THREAD_HANDLE + 1):
                free[handle] = _Keyed(free, key, handle)

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if type(bytes) is int:
                try:
                    if FAST_ALIGNMENTS[alignment] is alignment:
                        ptr = sync_free[bytes].pop()
                        live[ptr] = bytes
                        return ptr
                except _MISS:
                    pass
            return allocate_slow(bytes, alignment, SYNC)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            known = live_pop(ptr, _NONE) if type(ptr) is int else _NONE
            try:
                if (known == bytes and type(bytes) is int
                        and FAST_ALIGNMENTS[alignment] is alignment):
                    sync_free[bytes].append(ptr)
                    return
            except _MISS:
                pass
            if known is not _NONE:  # put it back; the checked path decides
                live[ptr] = known
            deallocate_slow(ptr, bytes, alignment, SYNC)

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            try:
                if type(bytes) is int and (alignment is DEFAULT_ALIGNMENT
                                           or FAST_ALIGNMENTS[alignment] is alignment):
                    ptr = free[stream if type(stream) is int else
                               stream._hipmr_handle][bytes].pop()
                    live[ptr] = bytes
                    return ptr
            except _MISS:
                pass
            except AttributeError:  # a stream object of another kind: the same with its handle
                if type(stream) is not int:
                    return allocate_async(bytes, alignment, check_stream(stream))
            return allocate_slow(bytes, alignment, key(check_stream(stream)))

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            known = _NONE
            try:
                if type(ptr) is int is type(bytes) and (
                        alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS[alignment] is alignment):
                    lst = free[stream if type(stream) is int else stream._hipmr_handle][bytes]
                    known = live_pop(ptr)   # the pop is the claim: one caller wins
                    if known == bytes:  # KeyError: a new stream or size
                        lst.append(ptr)
                        if _ANY and id(lst) in _DEAD:   # the arena let the list go
                            _rescue(lst)                # meanwhile
                        return
            except _MISS:
                pass
            except AttributeError:  # read before the claim: nothing to put back
                if type(stream) is not int:
                    return deallocate_async(ptr, bytes, alignment, check_stream(stream))
            if known is not _NONE:  # put it back; the checked path decides
                live[ptr] = known
            deallocate_slow(ptr, bytes, alignment, key(check_stream(stream)))

        self._install(allocate, deallocate, allocate_async, deallocate_async)

    def _fast_view(self) -> PoolView:
        """The pool's :class:`PoolView`: what an adaptor directly over this pool may use to
        serve the pool's blocks from fast paths of its own (``AlignedResource`` does)."""
        arena = self._arena
        return PoolView(free=arena.free, live=arena.live, stream_key=arena.keys,
                        allocate_slow=arena.allocate_slow,
                        deallocate_slow=arena.deallocate_slow, aligned_key=aligned_key,
                        max_alignment=_ALIGNED_MAX, largest_aligned=_SERVED_MAX)

    # --------------------------------------------------------------------- inspection
    def pool_size(self) -> int:
        """Bytes currently held from the upstream."""
        return self._arena.pool_size

    @property
    def peak_pool_size(self) -> IntValue:
        """The most bytes the pool has held from the upstream at once (``peak_pool_size()``,
        like ``pool_size()``, reads the same value)."""
        return IntValue(self._arena.peak_pool_size)

    @property
    def initial_pool_size(self) -> int:
        """The initial pool size (rounded up to 256)."""
        return self._initial

    @property
    def maximum_pool_size(self) -> Optional[int]:
        """The maximum pool size (rounded down to 256), or None for no limit."""
        return self._maximum

    def get_allocated_bytes(self) -> int:
        """Bytes in live blocks (requested sizes rounded up to 256); the name the tracking,
        limiting and statistics adaptors use (RMM's)."""
        live = self._arena.live.copy()  # atomic snapshot: the fast paths take no lock
        return sum(round_up(block_size(n), _GRAIN) for n in live.values())

    def allocation_count(self) -> int:
        """Number of live allocations."""
        return len(self._arena.live)

    def free_bytes(self) -> int:
        """Bytes held from the upstream but not in live blocks."""
        arena = self._arena
        with arena.lock:
            live = arena.live.copy()
            return arena.pool_size - sum(round_up(block_size(n), _GRAIN)
                                         for n in live.values())

    def release(self) -> int:
        """Give every fully free chunk back to the upstream, after waiting on the host for
        the streams that freed into it; returns the bytes given back.  Afterwards the pool
        holds no events and refers to no stream (streams used with it may be destroyed)."""
        arena = self._arena
        lock = arena.lock
        # the runtime may block (event waits, the upstream's frees): the lock is let go for
        # those, so that other threads keep allocating meanwhile
        with lock:
            arena._flush_all()
            tagged = {start: tag for start, tag in arena.ftag.items() if tag}
            streams = frozenset().union(*tagged.values()) if tagged else _CLEAN
            # a capturing stream is never waited for: its blocks keep their tags
            streams = frozenset(s for s in streams if not arena.streams.key_capturing(s))
            events = arena.streams.record_for_host(streams) if streams else []
        wait_all(events)
        with lock:
            ftag = arena.ftag
            for start, tag in tagged.items():  # still free as when the events were recorded:
                if ftag.get(start) is tag:     # clean now
                    ftag[start] = tag - streams
            arena.streams.close()
            return arena._release_free_chunks()

    def __repr__(self) -> str:
        return (f"PoolResource({self._upstream.resource!r}, pool_size={self.pool_size()}, "
                f"maximum_pool_size={self._maximum})")

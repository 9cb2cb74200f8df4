"""``FixedSizeResource``: one block size, served from per-stream free lists."""
from __future__ import annotations

import operator
from collections import deque
from typing import Any, Deque, Dict, List

from .._device_sizes import config_size
from .._sizes import Size
from .._exit import finalize
from .._locks import DeferringLock
from ..errors import ForkedChildError
from ..properties import DEFAULT_ALIGNMENT
from .._checks import (FAST_ALIGNMENTS, MAX_SIZE, check_alignment, check_free, check_ptr,
                       check_size, check_stream)
from .._stream_order import SYNC, StreamOrder, handle_of, stream_keys, wait_all
from ..stream import relaxed_capture_mode, track_streams
from ._base import BoundAdaptor, IdentityEqual
from ._chunks import (check_upstream_chunk, give_back_chunks, overlaps, refuse_in_forked_child,
                      return_chunks, round_up)
from ._dead import ANY as _ANY, DEAD as _DEAD, let_go, rescue as _rescue

__all__ = ["FixedSizeResource"]

_GRAIN = DEFAULT_ALIGNMENT
_NONE: Any = object()


class FreeLists:
    """The named layout of a :class:`FixedSizeResource`'s free lists, for an adaptor that
    serves the resource's blocks from fast paths of its own as the resource's own fast paths
    do (see :meth:`FixedSizeResource._bind`; ``BinningResource`` does for its fixed-size
    bins).  Every field stays the same object for the resource's life (in a forked child the
    lists and ``live`` are emptied, so such fast paths miss and reach the refusing slow
    paths).  Fields, and the rules that keep the resource's lock-free invariants:

    * ``streams``: the free lists of the checked stream handles, read only with
      ``streams.get(handle)`` (None: a handle with no list of its own; take the resource's
      ``allocate_async`` / ``deallocate_async`` then).
    * ``live``: ptr -> requested size of every live block.
    * ``host``: the list of blocks freed synchronously (clean for every stream).

    A block is only ever taken with a list's ``pop`` (it hands the block to one caller) and
    recorded ``live[ptr] = bytes`` (at most the block size) before it is returned; a free
    claims it with ``live.pop(ptr, default)``, and either appends it to the list it
    freed on (then, for a stream's list, checks ``_dead`` as the resource's frees do) or puts
    back exactly what it popped before it calls the resource's methods."""

    __slots__ = ("streams", "live", "host")
    streams: Dict[Any, Deque[int]]
    live: Dict[int, int]
    host: Deque[int]

    def __init__(self, streams: Dict[Any, Deque[int]], live: Dict[int, int],
                 host: Deque[int]) -> None:
        self.streams = streams
        self.live = live
        self.host = host


class _Blocks:
    """The resource's state and slow paths.

    The fast paths take no lock, as the pool's: an allocation's ``pop`` hands a free block to
    exactly one caller, a free's ``live.pop(ptr)`` claims a block (one atomic dict operation,
    so two threads can never both free it) and ``append`` puts it on its stream's free list,
    so a finalizer run by the garbage collector inside any section of this resource can always
    free.  The slow paths take ``lock``; they only ever drain free lists with ``pop`` and never
    drop or replace a list a fast path may be using."""

    def __init__(self, up: Any, is_async: bool, block_size: int, per_chunk: int) -> None:
        self.lock = DeferringLock()
        self.up_alloc = up.allocate
        self.up_dealloc = up.deallocate
        self.up_alloc_async = up.allocate_async if is_async else None
        self.block_size = block_size
        self.per_chunk = per_chunk
        # SYNC or stream key -> free blocks (deques: see _dead)
        self.free: Dict[Any, Deque[int]] = {SYNC: deque()}
        self.live: Dict[int, int] = {}                  # ptr -> requested size
        self.chunks: Dict[int, int] = {}                # upstream chunk start -> size
        self.returning: Dict[int, int] = {}             # chunks on their way back
        self.streams = StreamOrder()
        self.forked = False   # in a forked child: every slow path refuses
        track_streams(self)  # stream_closed runs before a package Stream is destroyed

    def refuse_in_child(self) -> None:
        """In a forked child (its only thread): every free list and the live table emptied,
        so every fast path bound before the fork misses, and the slow paths refuse."""
        self.forked = True
        for lst in self.free.values():
            lst.clear()
        self.live.clear()

    def holds_stream(self, handle: int) -> bool:
        """Whether blocks may be kept for the created stream ``handle`` (no lock needed)."""
        return self.streams.holds(handle)

    def stream_closed(self, handle: int) -> None:
        """The package is about to destroy stream ``handle``, whose work is complete: its
        blocks go to the host's list (safe for every stream) and it is forgotten.  A free may
        have fetched its list just before: see ``_dead``."""
        with self.lock:
            lst = self.free.pop(handle, None)
            if lst is not None:
                let_go(lst, self.rescue, SYNC)  # first: a free appending from now on rescues
                self.free[SYNC].extend(self.drain(lst))
            self.streams.drop(handle)

    def rescue(self, lst: Deque[int], belongs: Any) -> None:
        """A lock-free free appended to ``lst`` after the resource let it go: move its blocks
        to the list of the key it died with.  Deferred until the lock is let go when the
        calling thread holds it (a finalizer run inside a locked section)."""
        lock = self.lock
        if lock.held_here():
            lock.defer(self.rescue, lst, belongs)
            return
        with lock:
            self.put_back(belongs, self.drain(lst))

    def put_back(self, key: Any, blocks: List[int]) -> None:
        """Put ``blocks`` on the free list of ``key``, made anew if it was forgotten (lock
        held)."""
        if blocks:
            lst = self.free.get(key)
            if lst is None:
                self.streams.note(key)
                lst = self.free[key] = deque()
            lst.extend(blocks)

    @staticmethod
    def drain(lst: Deque[int]) -> List[int]:
        """Every block of ``lst``, taken with atomic pops (frees may append meanwhile)."""
        out: List[int] = []
        pop = lst.pop
        while True:
            try:
                out.append(pop())
            except IndexError:
                return out

    def grow(self, key: Any) -> None:
        """A new chunk from the upstream (lock held by the caller).  The lock is let go during
        the upstream call, which may block (a ``hipMalloc``, a stream synchronization): other
        threads keep allocating and freeing meanwhile.  For a stream that takes part in a
        graph capture the chunk is the upstream's synchronous allocation, in Relaxed capture
        mode: one allocated on that stream would be the graph's memory, not the resource's."""
        size = self.block_size * self.per_chunk
        captured = key is not SYNC and self.up_alloc_async is not None and \
            self.streams.key_capturing(key)
        self.lock.release()
        try:
            if captured:
                with relaxed_capture_mode():
                    ptr = self.up_alloc(size, _GRAIN)
            elif key is SYNC or self.up_alloc_async is None:
                ptr = self.up_alloc(size, _GRAIN)
            else:
                ptr = self.up_alloc_async(size, _GRAIN, handle_of(key))
        finally:
            self.lock.acquire()
        check_upstream_chunk(ptr, size, self.chunks, self.up_dealloc, "FixedSizeResource",
                             self.returning)
        self.chunks[ptr] = size
        self.streams.note(key)
        self.put_back(key, list(range(ptr + size - self.block_size, ptr - 1,
                                      -self.block_size)))

    def take(self, key: Any) -> Any:
        """A free block for ``key`` (lock held): ``(ptr, None)``, or, for the host, ``(None,
        (events, source, blocks))`` when it must first wait for the stream ``source`` that freed
        ``blocks`` (taken out of the free lists): the caller waits without the lock."""
        free = self.free
        for k in (key, SYNC) if key is not SYNC else (SYNC,):
            lst = free.get(k)  # SYNC's: freed synchronously, safe for every stream
            if lst:
                try:
                    return lst.pop(), None
                except IndexError:
                    pass
        others = [k for k, blocks in list(free.items())
                  if blocks and k != key and k is not SYNC]
        if others:   # no event on or for a stream in a graph capture: those are passed over
            others = [k for k in others if self.streams.capture_safe((k,), key)]
        if others:  # wait for the stream holding most, then take all its blocks
            source = max(others, key=lambda k: len(free[k]))
            if key is SYNC:
                events = self.streams.record_for_host((source,))  # may raise: nothing changed
                blocks = self.drain(free[source])
                if blocks:
                    return None, (events, source, blocks)
                for ev in events:
                    ev.close()
                return self.take(key)
            self.streams.order((source,), key)
            self.put_back(key, self.drain(free[source]))
            mine = free.get(key)
            if mine:
                return mine.pop(), None
        self.grow(key)
        return free[key].pop(), None

    def allocate_slow(self, nbytes: Any, alignment: Any, key: Any) -> int:
        if self.forked:
            raise ForkedChildError()
        nbytes = check_size(nbytes)
        alignment = check_alignment(alignment)
        if nbytes > self.block_size:
            raise ValueError(f"bytes={nbytes} is larger than the block size {self.block_size}")
        if alignment > _GRAIN:
            raise ValueError(f"alignment={alignment} is larger than {_GRAIN}, the most "
                             "FixedSizeResource guarantees")
        if not nbytes:
            return 0
        with self.lock:
            ptr: int
            ptr, wait = self.take(key)
            if wait is None:
                self.live[ptr] = nbytes
                return ptr
        events, source, blocks = wait
        try:  # the host waits for the stream that freed the blocks, lock not held
            wait_all(events)
        except BaseException:
            with self.lock:
                self.put_back(source, blocks)
            raise
        host = self.free[SYNC]
        ptr = blocks.pop()
        host.extend(blocks)   # atomic: clean for every stream now
        self.live[ptr] = nbytes
        return ptr

    def deallocate_slow(self, ptr: Any, nbytes: Any, alignment: Any, key: Any) -> None:
        """Checked deallocation; takes no lock (see the class docstring)."""
        if self.forked:
            raise ForkedChildError()
        ptr = check_ptr(ptr)
        nbytes = check_size(nbytes)
        check_alignment(alignment, _GRAIN)  # no block was ever given out with a larger one
        if not ptr and not nbytes:
            return
        live = self.live
        known = live.pop(ptr, None)       # the claim
        if known == nbytes:
            lst = self.free.get(key)
            if lst is None:  # a new stream: its device first
                self.streams.note(key)
                lst = self.free.setdefault(key, deque())
            lst.append(ptr)  # atomic
            if _ANY and id(lst) in _DEAD:   # the resource let the list go meanwhile
                _rescue(lst)
            return
        if known is not None:
            live[ptr] = known
        check_free(ptr, known, nbytes, "FixedSizeResource")  # raises

    def forget_streams(self) -> None:
        """Forget the streams with nothing cached (lock held), so that the state kept is
        bounded by the streams in use.  A free may have fetched a list just before and append
        to it afterwards: see ``_dead``."""
        free = self.free
        for key in [k for k, lst in list(free.items()) if k is not SYNC and not lst]:
            lst = free.pop(key)
            let_go(lst, self.rescue, key)  # first: a free appending from now on rescues
            self.put_back(key, self.drain(lst))  # a block freed meanwhile: the key stays
        self.streams.prune(set(free))  # bound the devices noted by the streams still used

    def release(self) -> int:
        # the runtime may block (event waits, the upstream's frees): the lock is let go for
        # those, so that other threads keep allocating meanwhile
        free = self.free
        with self.lock:
            moved = {k: self.drain(lst) for k, lst in list(free.items()) if k is not SYNC}
            moved = {k: blocks for k, blocks in moved.items() if blocks}
            for k in [k for k in moved if self.streams.key_capturing(k)]:
                self.put_back(k, moved.pop(k))   # a capturing stream is never waited for
            try:
                events = self.streams.record_for_host(list(moved))
            except BaseException:
                for k, blocks in moved.items():
                    self.put_back(k, blocks)
                raise
        try:
            wait_all(events)
        except BaseException:
            with self.lock:
                for k, blocks in moved.items():
                    self.put_back(k, blocks)
            raise
        with self.lock:
            idle = self.drain(free[SYNC])
            for blocks in moved.values():
                idle.extend(blocks)
            self.streams.close()
            idle_set = set(idle)
            bs = self.block_size
            empty = []
            for start, size in list(self.chunks.items()):
                chunk_blocks = range(start, start + size, bs)
                if all(b in idle_set for b in chunk_blocks):
                    empty.append((start, size))
                    del self.chunks[start]         # out of the resource before the lock goes
                    idle_set.difference_update(chunk_blocks)
            free[SYNC].extend(sorted(idle_set, reverse=True))
            self.forget_streams()
        if not empty:
            return 0

        def keep(rest: List[Any], waited: bool) -> None:  # what the upstream did not take
            for start, size in rest:
                if overlaps(self.chunks, start, size):  # handed out again meanwhile
                    continue
                self.chunks[start] = size
                free[SYNC].extend(range(start + size - bs, start - 1, -bs))

        with self.lock:
            return return_chunks(self.lock, empty, [], self.up_dealloc, keep, self.returning)


class FixedSizeResource(IdentityEqual, BoundAdaptor):
    """``FixedSizeResource(upstream, block_size=1 MiB, blocks_to_preallocate=128)``.

    Every allocation of at most ``block_size`` bytes (rounded up to 256) gets one whole block;
    blocks come from upstream chunks of ``block_size * blocks_to_preallocate`` bytes (one
    chunk is taken at construction, more on demand).  Larger requests and alignments above
    256 raise ``ValueError``.  Free lists are kept per stream with the pool's stream-ordering
    rules: a block freed on stream S is reused at once on S, and handed to another stream only
    after an event wait.  Thread-safe; an async resource when the upstream is one; equal only
    to itself.  ``release()`` gives fully free chunks back; all chunks go back when the
    resource is garbage-collected.
    """

    def __init__(self, upstream: Any, block_size: Size = 1 << 20,
                 blocks_to_preallocate: int = 128) -> None:
        ref = self._set_upstream(upstream)
        block_size = config_size(block_size, "block_size", fraction=False)
        per_chunk = check_count(blocks_to_preallocate, "blocks_to_preallocate", "blocks")
        if not block_size:
            raise ValueError("block_size=0: a block must hold at least one byte")
        if not per_chunk:
            raise ValueError("blocks_to_preallocate=0: a chunk must hold at least one block")
        check_chunk(block_size, per_chunk)
        self._block_size = round_up(block_size, _GRAIN)
        self._per_chunk = per_chunk
        state = self._state = _Blocks(ref, self._async, self._block_size, per_chunk)
        with state.lock:
            state.grow(SYNC)
        finalize(self, give_back_chunks, state.up_dealloc, state.chunks)
        self._bind(state)
        refuse_in_forked_child(self, state)

    def _bind(self, state: _Blocks) -> None:
        """The fast paths take no lock (see :class:`_Blocks`): ``pop`` hands a free block to
        exactly one caller and ``live.pop(ptr)`` lets exactly one caller free it.  A block
        between two steps (popped, not yet recorded live; or claimed, not yet appended) is
        neither free nor live, so ``release()`` cannot give its chunk back meanwhile."""
        free = state.free
        free_get = free.get
        host = free[SYNC]
        host_append = host.append
        host_pop = host.pop
        live = state.live
        live_pop = live.pop
        aligned = FAST_ALIGNMENTS.get
        block_size = self._block_size
        allocate_slow = state.allocate_slow
        deallocate_slow = state.deallocate_slow
        # free lists are keyed by stream_key: a handle whose key is not itself (the per-thread
        # stream; the null streams with several devices) has no list of its own, so the fast
        # paths miss and the slow paths use its key
        key = stream_keys()   # bound to the runtime: one call per special handle's key

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if type(bytes) is int and 0 < bytes <= block_size and aligned(alignment) is alignment:
                try:
                    ptr = host_pop()   # the pop hands the block to exactly one caller
                    live[ptr] = bytes
                    return ptr
                except IndexError:
                    pass
            return allocate_slow(bytes, alignment, SYNC)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if type(ptr) is int is type(bytes) and aligned(alignment) is alignment:
                known = live_pop(ptr, _NONE)  # the claim: one caller wins
                if known == bytes:
                    host_append(ptr)
                    return
                if known is not _NONE:  # wrong size: put it back, report below
                    live[ptr] = known
            deallocate_slow(ptr, bytes, alignment, SYNC)

        # A stream object's handle: ``_hipmr_handle`` (stream_ref / Stream; None once a Stream
        # is closed, the descriptor itself for a class), else ``check_stream``.  Only checked
        # handles have a free list, so whatever else ``handle`` holds misses ``free_get`` and
        # the checked path, given the argument itself, says what is wrong.
        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            handle = stream
            if type(stream) is not int:
                try:
                    handle = stream._hipmr_handle
                except AttributeError:  # a stream object of another library
                    handle = check_stream(stream)
            if type(bytes) is int and 0 < bytes <= block_size and aligned(alignment) is alignment:
                lst = free_get(handle)
                if lst:
                    try:
                        ptr = lst.pop()
                        live[ptr] = bytes
                        return ptr
                    except IndexError:   # another thread took the last block meanwhile
                        pass
            return allocate_slow(bytes, alignment, key(check_stream(stream)))

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            handle = stream
            if type(stream) is not int:
                try:
                    handle = stream._hipmr_handle
                except AttributeError:  # a stream object of another library
                    handle = check_stream(stream)
            if type(ptr) is int is type(bytes) and aligned(alignment) is alignment:
                lst = free_get(handle)
                if lst is not None:  # a checked stream's: take the claim
                    known = live_pop(ptr, _NONE)
                    if known == bytes:
                        lst.append(ptr)
                        if _ANY and id(lst) in _DEAD:   # the resource let the list go
                            _rescue(lst)                # meanwhile
                        return
                    if known is not _NONE:  # put it back; the checked path decides
                        live[ptr] = known
            deallocate_slow(ptr, bytes, alignment, key(check_stream(stream)))

        self._install(allocate, deallocate, allocate_async, deallocate_async)

    def _free_lists(self) -> FreeLists:
        """This resource's :class:`FreeLists`: what an adaptor directly over it may use to
        serve its blocks from fast paths of its own (``BinningResource`` does for its
        fixed-size bins)."""
        state = self._state
        return FreeLists(state.free, state.live, state.free[SYNC])

    @property
    def block_size(self) -> int:
        """The size of every block (rounded up to 256)."""
        return self._block_size

    @property
    def blocks_to_preallocate(self) -> int:
        """Blocks per upstream chunk."""
        return self._per_chunk

    def pool_size(self) -> int:
        """Bytes currently held from the upstream."""
        with self._state.lock:
            return sum(self._state.chunks.values())

    def allocation_count(self) -> int:
        """Number of live allocations."""
        return len(self._state.live)

    def release(self) -> int:
        """Give every fully free chunk back to the upstream (after waiting on the host for the
        streams that freed blocks); returns the bytes given back."""
        return self._state.release()

    def __repr__(self) -> str:
        return (f"FixedSizeResource({self._upstream.resource!r}, "
                f"block_size={self._block_size}, blocks_to_preallocate={self._per_chunk})")


# ---- constructor checks (also BinningResource's): messages name the caller's arguments --------
def check_count(value: Any, name: str, what: str) -> int:
    """``value`` as a count of ``what`` (an int, not a bool, in ``[0, 2**63]``)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int number of {what}, not bool")
    try:
        count = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int number of {what}, not "
                        f"{type(value).__name__}") from None
    if count < 0:
        raise ValueError(f"{name}={count} is negative")
    if count > MAX_SIZE:
        raise ValueError(f"{name}={count} is larger than 2**63")
    return count


#: FixedSizeResource's default ``blocks_to_preallocate`` (the blocks of one chunk)
DEFAULT_BLOCKS = 128


def chunk_too_large(block_size: int, per_chunk: int) -> bool:
    """True when one chunk of ``per_chunk`` blocks of ``block_size`` bytes (rounded up to
    256) would be more than 2**63 bytes, which no upstream can serve."""
    return round_up(block_size, _GRAIN) * per_chunk > MAX_SIZE


def check_chunk(block_size: int, per_chunk: int) -> None:
    """ValueError naming the caller's ``block_size`` and ``blocks_to_preallocate`` when
    :func:`chunk_too_large`."""
    if chunk_too_large(block_size, per_chunk):
        raise ValueError(f"block_size={block_size} with blocks_to_preallocate={per_chunk}: "
                         f"one chunk of {per_chunk} blocks would be more than 2**63 bytes")

"""``FixedSizeResource``: one block size, served from per-stream free lists."""
from __future__ import annotations

from typing import Any, Dict, List

from .._sizes import Size, config_size
from .._exit import finalize
from .._locks import DeferringLock
from ..properties import DEFAULT_ALIGNMENT
from ._base import (FAST_ALIGNMENTS, STREAM_REF, SYNC, BoundAdaptor, IdentityEqual,
                    check_alignment, check_free, check_ptr, check_size, check_stream,
                    give_back_chunks, return_chunks, round_up)
from ._order import StreamOrder

__all__ = ["FixedSizeResource"]

_GRAIN = DEFAULT_ALIGNMENT
_NONE = object()


class _Blocks:
    """The resource's state and slow paths (``lock`` guards everything)."""

    def __init__(self, up: Any, is_async: bool, block_size: int, per_chunk: int) -> None:
        self.lock = DeferringLock()  # see deallocate_slow
        self.up_alloc = up.allocate
        self.up_dealloc = up.deallocate
        self.up_alloc_async = up.allocate_async if is_async else None
        self.block_size = block_size
        self.per_chunk = per_chunk
        self.free: Dict[Any, List[int]] = {SYNC: []}   # SYNC or stream handle -> free blocks
        self.live: Dict[int, int] = {}                  # ptr -> requested size
        self.chunks: Dict[int, int] = {}                # upstream chunk start -> size
        self.streams = StreamOrder()

    def grow(self, key: Any) -> None:
        """A new chunk from the upstream (lock held by the caller).  The lock is let go during
        the upstream call, which may block (a ``hipMalloc``, a stream synchronization): other
        threads keep allocating and freeing meanwhile."""
        size = self.block_size * self.per_chunk
        self.lock.release()
        try:
            if key is SYNC or self.up_alloc_async is None:
                ptr = self.up_alloc(size, _GRAIN)
            else:
                ptr = self.up_alloc_async(size, _GRAIN, key)
        finally:
            self.lock.acquire()
        if type(ptr) is not int or ptr <= 0 or ptr & (_GRAIN - 1):
            raise ValueError(f"the upstream returned {ptr!r} for {size} bytes: "
                             f"FixedSizeResource needs a non-null pointer aligned to {_GRAIN}")
        self.chunks[ptr] = size
        lst = self.free.setdefault(key, [])
        lst.extend(range(ptr + size - self.block_size, ptr - 1, -self.block_size))

    def take(self, key: Any) -> Any:
        """A free block for ``key`` (lock held): ``(ptr, None)``, or, for the host, ``(None,
        (events, source, blocks))`` when it must first wait for the stream ``source`` that freed
        ``blocks`` (taken out of the free lists): the caller waits without the lock."""
        free = self.free
        lst = free.get(key)
        if lst:
            return lst.pop(), None
        if key is not SYNC and free[SYNC]:  # freed synchronously: safe for every stream
            return free[SYNC].pop(), None
        others = [k for k, blocks in free.items() if blocks and k != key and k is not SYNC]
        if others:  # wait for the stream holding most, then take all its blocks
            source = max(others, key=lambda k: len(free[k]))
            if key is SYNC:
                events = self.streams.record_for_host((source,))  # may raise: nothing changed
                return None, (events, source, free.pop(source))
            self.streams.order((source,), key)
            mine = free.setdefault(key, [])
            mine.extend(free.pop(source))
            return mine.pop(), None
        self.grow(key)
        return free[key].pop(), None

    def allocate_slow(self, nbytes: Any, alignment: Any, key: Any) -> int:
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
            ptr, wait = self.take(key)
            if wait is None:
                self.live[ptr] = nbytes
                return ptr
        events, source, blocks = wait
        try:  # the host waits for the stream that freed the blocks, lock not held
            for ev in events:
                ev.synchronize()
        except BaseException:
            with self.lock:
                self.free.setdefault(source, []).extend(blocks)
            raise
        finally:
            for ev in events:
                ev.close()
        with self.lock:
            host = self.free[SYNC]
            host.extend(blocks)
            ptr = host.pop()
            self.live[ptr] = nbytes
            return ptr

    def deallocate_slow(self, ptr: Any, nbytes: Any, alignment: Any, key: Any) -> None:
        ptr = check_ptr(ptr)
        nbytes = check_size(nbytes)
        check_alignment(alignment, _GRAIN)  # no block was ever given out with a larger one
        if not ptr and not nbytes:
            return
        lock = self.lock
        if lock.held_here():
            # a finalizer run by the garbage collector inside this thread's slow path (it
            # allocates lists, events, errors): free once the lock is let go
            lock.defer(self.deallocate_slow, ptr, nbytes, alignment, key)
            return
        with lock:
            known = self.live.pop(ptr, None)
            if known == nbytes:
                lst = self.free.get(key)
                if lst is None:
                    lst = self.free[key] = []
                lst.append(ptr)
                return
            if known is not None:
                self.live[ptr] = known
        check_free(ptr, known, nbytes, "FixedSizeResource")  # raises (lock let go)

    def release(self) -> int:
        # the runtime may block (event waits, the upstream's frees): the lock is let go for
        # those, so that other threads keep allocating meanwhile
        with self.lock:
            free = self.free
            moved = {k: free.pop(k) for k in [k for k in free if k is not SYNC]}
            moved = {k: blocks for k, blocks in moved.items() if blocks}
            try:
                events = self.streams.record_for_host(list(moved))
            except BaseException:
                for k, blocks in moved.items():
                    free.setdefault(k, []).extend(blocks)
                raise
        try:
            for ev in events:
                ev.synchronize()
        except BaseException:
            with self.lock:
                for k, blocks in moved.items():
                    self.free.setdefault(k, []).extend(blocks)
            raise
        finally:
            for ev in events:
                ev.close()
        with self.lock:
            host = self.free[SYNC]
            for blocks in moved.values():
                host.extend(blocks)
            self.streams.close()
            idle = set(host)
            bs = self.block_size
            empty = []
            for start, size in list(self.chunks.items()):
                blocks = range(start, start + size, bs)
                if all(b in idle for b in blocks):
                    empty.append((start, size))
                    del self.chunks[start]         # out of the resource before the lock goes
                    idle.difference_update(blocks)
            if not empty:
                return 0
            host[:] = sorted(idle, reverse=True)

            def keep(rest: List[Any], waited: bool) -> None:  # what the upstream did not take
                for start, size in rest:
                    self.chunks[start] = size
                    host.extend(range(start + size - bs, start - 1, -bs))

            return return_chunks(self.lock, empty, [], self.up_dealloc, keep)


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
        block_size = config_size(block_size, "block_size")
        per_chunk = check_size(blocks_to_preallocate, "blocks_to_preallocate")
        if not block_size:
            raise ValueError("block_size=0: a block must hold at least one byte")
        if not per_chunk:
            raise ValueError("blocks_to_preallocate=0: a chunk must hold at least one block")
        self._block_size = round_up(block_size, _GRAIN)
        self._per_chunk = per_chunk
        state = self._state = _Blocks(ref, self._async, self._block_size, per_chunk)
        with state.lock:
            state.grow(SYNC)
        finalize(self, give_back_chunks, state.up_dealloc, state.chunks)
        self._bind(state)

    def _bind(self, state: _Blocks) -> None:
        lock = state.lock
        # the hot sections allocate no Python container, so no finalizer can run inside
        # them; a busy lock (another thread, or this one in a slow path) takes the slow path
        acquire = lock.try_acquire
        release = lock.release_fast
        free = state.free
        free_get = free.get
        host = free[SYNC]
        live = state.live
        live_pop = live.pop
        aligned = FAST_ALIGNMENTS.get
        block_size = self._block_size
        allocate_slow = state.allocate_slow
        deallocate_slow = state.deallocate_slow
        SR = STREAM_REF

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if type(bytes) is int and 0 < bytes <= block_size and aligned(alignment) is alignment \
                    and acquire(False):
                try:
                    if host:
                        ptr = host.pop()
                        live[ptr] = bytes
                        return ptr
                finally:
                    release()
            return allocate_slow(bytes, alignment, SYNC)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if type(ptr) is int and aligned(alignment) is alignment \
                    and acquire(False):
                try:
                    known = live_pop(ptr, _NONE)
                    if known == bytes:
                        host.append(ptr)
                        return
                    if known is not _NONE:  # wrong size: put it back, report below
                        live[ptr] = known
                finally:
                    release()
            deallocate_slow(ptr, bytes, alignment, SYNC)

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            if type(stream) is not int:
                stream = stream.get() if type(stream) is SR else check_stream(stream)
            if type(bytes) is int and 0 < bytes <= block_size and aligned(alignment) is alignment \
                    and acquire(False):
                try:
                    lst = free_get(stream)
                    if lst:
                        ptr = lst.pop()
                        live[ptr] = bytes
                        return ptr
                finally:
                    release()
            return allocate_slow(bytes, alignment, check_stream(stream))

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if type(stream) is not int:
                stream = stream.get() if type(stream) is SR else check_stream(stream)
            if type(ptr) is int and aligned(alignment) is alignment \
                    and acquire(False):
                try:
                    known = live_pop(ptr, _NONE)
                    if known == bytes:
                        lst = free_get(stream)  # only checked streams have an entry
                        if lst is not None:
                            lst.append(ptr)
                            return
                    if known is not _NONE:  # put it back; the checked path decides
                        live[ptr] = known
                finally:
                    release()
            deallocate_slow(ptr, bytes, alignment, check_stream(stream))

        self._install(allocate, deallocate, allocate_async, deallocate_async)

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

"""``VirtualPoolResource``: a pool that grows in place.  Its memory is one reserved address
range per device into which physical *pages* (each ``granularity`` bytes, its own
``hipMemCreate``) are mapped as the pool grows, and from which fully free pages are unmapped
again; free blocks coalesce across page boundaries, where ``PoolResource``'s chunks (each its
own upstream allocation) keep them apart.

Design: :class:`PoolResource`'s whole machinery (fast paths, free lists, best fit, stream order,
the fork refusal) over a different arena, :class:`_VirtualArena`, which changes three things:

* **Coalescing.**  It holds no chunks, so the best-fit structure merges every two adjacent
  free blocks (adjacent free blocks are always mapped memory of the one range).
* **Growth** (``_grow``, under the arena's lock, only on a slow path that found no free block):
  it maps the fewest pages that make a free block of the size needed, choosing among the
  unmapped gaps of the range (between mapped runs, and above the top one) the one whose free
  neighbours leave least to map (ties: the lowest address).  ``maximum_pool_size`` bounds the
  mapped bytes; before passing it, or when the device has no room (``hipMemCreate`` out of
  memory), the pool unmaps about as many fully free pages as it lacks (away from the gap it
  wants), plans again, then unmaps every fully free page and plans again, then raises
  ``OutOfMemoryError``.  ``release_threshold``: before a growth would take the mapped bytes
  past it, fully free pages are unmapped until they stay at or below it (where free pages
  allow).  New pages are clean: no stream has work queued on them.
* **Giving memory back** (``_release_free_chunks``, under memory pressure, by ``release()`` and
  by the threshold): every page lying wholly inside a free block leaves the best-fit structure
  (the block's partial pages stay free), the host waits for the streams that used those
  blocks (the lock let go meanwhile, as the pool's own chunk return does), then the pages are
  unmapped and released.  A step that fails puts the pages it did not unmap back as free
  blocks and raises.

The reserved range (``resources.virtual_range.VirtualRange``, which the package's
``__init__`` hands to this layer: ``hipmr_ctypes._virtual_range``) is the pool's upstream: it owns the reservation, the
pages' handles and the mapped runs, and makes every virtual-memory call; allocating from it
directly is refused.  Mapping and unmapping happen only under the arena's lock, so its books
need no lock of their own.  Allocations from mapped free space never call the runtime.
"""
from __future__ import annotations

from typing import Any, FrozenSet, List, Optional, Tuple

from .._device_sizes import parse_config_size
from .._exit import finalize
from .._sizes import Size
from .._stream_order import SYNC, wait_all
from ..errors import ForkedChildError, OutOfMemoryError
from ._chunks import refuse_in_forked_child
from .pool import _CLEAN, PoolResource, _Arena

__all__ = ["VirtualPoolResource"]


class _VirtualArena(_Arena):
    """:class:`~hipmr_ctypes.adaptors.pool._Arena` over a ``VirtualRange`` (see the module's
    docstring).  ``pool_size`` counts the mapped bytes."""

    def __init__(self, ref: Any, space: Any, maximum: Optional[int],
                 threshold: Optional[int]) -> None:
        super().__init__(ref, True, maximum)
        self.space = space
        self.threshold = threshold

    # ------------------------------------------------------------------------ growth
    def _plan(self, need: int) -> Optional[Tuple[int, int]]:
        """``(start, size)`` of the fewest pages to map so that a free block of ``need``
        bytes forms (with the free blocks on either side), or None when no gap of the range
        can hold it."""
        space = self.space
        page = space.page
        fsize, fend = self.fsize, self.fend
        best: Optional[Tuple[int, int]] = None
        for gs, ge in space.gaps():
            left = fsize[fend[gs]] if gs in fend else 0
            right = fsize.get(ge, 0)
            gap = ge - gs
            options = []
            low = -(-max(need - left, 0) // page) * page
            if 0 < low <= gap:
                options.append((low, gs))
            high = -(-max(need - right, 0) // page) * page
            if 0 < high <= gap and right:
                options.append((high, ge - high))
            if left + gap + right >= need:
                options.append((gap, gs))
            for size, start in options:
                if best is None or size < best[1] or (size == best[1] and start < best[0]):
                    best = (start, size)
        return best

    def _beside(self, start: int, size: int) -> Tuple[int, int]:
        """``[start, start + size)`` widened to the free blocks on either side."""
        left = self.fend.get(start)
        end = start + size
        return (start if left is None else left), end + self.fsize.get(end, 0)

    def _grow(self, need: int, nbytes: int, key: Any, captured: bool = False) -> None:
        """Map pages so that a free block of ``need`` bytes exists, or raise
        OutOfMemoryError (see the module's docstring).  Short of memory (the maximum, or the
        device), it first unmaps about as many free pages as it lacks, away from the gap it
        wants to map, then every free page, planning again after each.  ``captured``: for a
        capturing stream, so no page is unmapped meanwhile (unmapping waits on the host for
        the streams that used the pages, which a capture forbids)."""
        space = self.space
        maximum, threshold = self.maximum, self.threshold
        trimmed = captured
        stage = 2 if captured else 0   # 0: as it is; 1: some free pages unmapped; 2: all
        error: Optional[BaseException] = None
        while True:
            plan = self._plan(need)
            if plan is None:
                problem = (f"the pool's address range ({space.size} bytes) has no gap that "
                           f"can hold it")
            else:
                start, size = plan
                if threshold is not None and self.pool_size + size > threshold \
                        and not trimmed:
                    trimmed = True
                    if self._release_free_chunks(self.pool_size + size - threshold,
                                                 self._beside(start, size)):
                        continue
                if maximum is None or self.pool_size + size <= maximum:
                    try:
                        with space.held():
                            space.map(start, size)
                            self.pool_size += size
                            if self.pool_size > self.peak_pool_size:
                                self.peak_pool_size = self.pool_size
                            self._insert(start, size, _CLEAN)
                    except OutOfMemoryError as exc:
                        error = exc
                        problem = f"the device has no room for {size} bytes more: {exc}"
                        lacking = size
                    else:
                        return
                else:
                    problem = (f"the pool would pass maximum_pool_size={maximum} (mapped "
                               f"{self.pool_size} bytes, {size} more needed)")
                    lacking = self.pool_size + size - maximum
                if stage == 0:
                    stage = 1
                    if self._release_free_chunks(lacking, self._beside(start, size)):
                        continue
            if stage == 2:
                break
            stage = 2
            if captured or not self._release_free_chunks():
                break
        raise OutOfMemoryError(call="VirtualPoolResource.allocate", size=nbytes,
                               device=space.device, detail=problem) from error

    # -------------------------------------------------------------- giving memory back
    def _release_free_chunks(self, limit: Optional[int] = None,
                             keep: Tuple[int, int] = (0, 0)) -> int:
        """Unmap the pages lying wholly inside free blocks (the highest first, at least
        ``limit`` bytes of them when given, else all), but those of blocks that overlap
        ``keep`` (``(start, end)``: what a growth is about to use); returns the bytes
        unmapped.  Called with the lock held, returns with it held; the lock is let go while
        the host waits for the streams that used those blocks."""
        if self.forked:
            raise ForkedChildError()
        self._flush_all()
        space = self.space
        page, base = space.page, space.base
        pieces: List[Tuple[int, int, int, int, FrozenSet[Any]]] = []
        for start, size in self.fsize.items():
            first = base + -(-(start - base) // page) * page
            last = base + (start + size - base) // page * page
            if last > first and not (start < keep[1] and keep[0] < start + size):
                pieces.append((first, last, start, size, self.ftag[start]))
        if not pieces:
            return 0
        if limit is not None:
            pieces.sort(reverse=True)
            kept, total = [], 0
            for piece in pieces:
                if total >= limit:
                    break
                kept.append(piece)
                total += piece[1] - piece[0]
            pieces = kept
        streams = frozenset().union(*(piece[4] for piece in pieces))
        events = self.streams.record_for_host(streams) if streams else []  # may raise
        for first, last, start, size, tag in pieces:   # out of the pool, then unmapped
            self._remove(start)
            if first > start:
                self._add(start, first - start, tag)
            if start + size > last:
                self._add(last, start + size - last, tag)
            self.pool_size -= last - first
        lock = self.lock
        lock.release()
        waited = False
        try:
            wait_all(events)
            waited = True
        finally:
            lock.acquire()
            if not waited:          # back as they were
                for first, last, _, _, tag in pieces:
                    self.pool_size += last - first
                    self._insert(first, last - first, tag)
        done = 0
        with space.held():
            for i, (first, last, _, _, tag) in enumerate(pieces):
                try:
                    done += space.unmap(first, last - first)
                except Exception as exc:
                    unmapped = getattr(exc, "unmapped", 0)
                    done += unmapped
                    for f, l, _, _, _ in pieces[i:]:    # the pages still mapped: free again
                        f += unmapped
                        unmapped = 0
                        if l > f:
                            self.pool_size += l - f
                            self._insert(f, l - f, _CLEAN)
                    raise
        return done

    def refuse_in_child(self) -> None:
        super().refuse_in_child()
        self.space.forget()   # the parent's: never unmapped from the child


class VirtualPoolResource(PoolResource):
    """A pool of device memory that grows in place:
    ``VirtualPoolResource(device=None, *, initial_pool_size=None, maximum_pool_size=None,
    granularity=None, release_threshold=None, reserve_size=None)``.

    One address range is reserved on ``device`` (default: the current device), of
    ``reserve_size`` bytes (default: four times the device's memory; address space costs no
    memory); physical pages of ``granularity`` bytes (default: the device's recommended
    granularity, 2 MiB on current GPUs; a multiple of its minimum) are mapped into it as the
    pool grows, each where it makes the block needed with the free blocks beside it.  Free
    blocks coalesce across pages.  Fully free pages are unmapped (their memory goes back to the
    device) before an allocation would fail for lack of memory, by :meth:`release`, and
    whenever a growth would otherwise take the mapped bytes past ``release_threshold``
    (default: no threshold).  ``initial_pool_size``: bytes mapped at once (rounded up to the
    page; default none).  ``maximum_pool_size``: the most bytes mapped at once (rounded down
    to the page; default: no limit).  Sizes accept the package's size grammar (``"16GiB"``,
    ``"80%"``).

    Everything else is :class:`PoolResource`'s: sizes rounded up to 256, 256-byte alignment
    at least, stream-ordered allocation with safe reuse across streams, thread-safety, the
    fast paths (an allocation served from mapped free memory makes no runtime call);
    ``pool_size()`` and ``peak_pool_size`` count mapped bytes.  Async and device-accessible;
    equal only to itself.  When garbage-collected, it unmaps everything and frees its range:
    keep it alive while its memory is in use.

    NotSupportedError where the device or runtime has no virtual memory management;
    TypeError / ValueError for bad arguments before any native call.
    """

    def __init__(self, device: Optional[Any] = None, *,
                 initial_pool_size: Optional[Size] = None,
                 maximum_pool_size: Optional[Size] = None, granularity: Optional[int] = None,
                 release_threshold: Optional[Size] = None,
                 reserve_size: Optional[Size] = None) -> None:
        if granularity is not None and (type(granularity) is not int or granularity <= 0):
            raise TypeError(f"granularity must be a positive int or None, not {granularity!r}") \
                if type(granularity) is not int else \
                ValueError(f"granularity must be positive, not {granularity}")
        sizes = {name: None if value is None else parse_config_size(value, name)
                 for name, value in (("initial_pool_size", initial_pool_size),
                                     ("maximum_pool_size", maximum_pool_size),
                                     ("release_threshold", release_threshold),
                                     ("reserve_size", reserve_size))}
        from .. import _virtual_range   # (the package joins this layer to the resources')
        space: Any = _virtual_range(device, granularity, sizes)
        maximum = space.sizes["maximum_pool_size"]
        threshold = space.sizes["release_threshold"]
        self._space = space
        self._device: int = space.device
        self._page: int = space.page
        self._reserved: int = space.size
        self._release_threshold: Optional[int] = threshold
        ref = self._set_upstream(space)
        initial = space.sizes["initial_pool_size"] or 0
        initial = -(-initial // self._page) * self._page
        if maximum is not None and initial > maximum:
            space.close()
            raise ValueError(f"initial_pool_size={initial_pool_size} exceeds "
                             f"maximum_pool_size={maximum_pool_size}")
        self._initial = initial
        self._maximum = maximum
        arena = self._arena = _VirtualArena(ref, space, maximum, threshold)
        # the pages and the range go back when the pool goes (the arena, which holds the
        # range too, is collected only by the cycle collector)
        finalize(self, space.closer)
        if initial:
            with arena.lock:
                arena._grow(initial, initial, SYNC)
        self._bind(arena)
        refuse_in_forked_child(self, arena)

    # --------------------------------------------------------------------- inspection
    @property
    def device(self) -> int:
        """The device ordinal the memory lives on."""
        return self._device

    @property
    def granularity(self) -> int:
        """Bytes of one page: the pool maps and unmaps memory in these."""
        return self._page

    @property
    def mapped_bytes(self) -> int:
        """Bytes of physical memory mapped now (``pool_size()``)."""
        return self.pool_size()

    @property
    def reserved_bytes(self) -> int:
        """Bytes of address space reserved (fixed for the pool's life)."""
        return self._reserved

    @property
    def release_threshold(self) -> Optional[int]:
        """Mapped bytes above which a growth first unmaps free pages, or None."""
        return self._release_threshold

    def release(self) -> int:
        """Unmap every fully free page, after waiting on the host for the streams that freed
        into it; returns the bytes unmapped.  Afterwards the pool holds no events and refers
        to no stream.  ForkedChildError in a child forked after the runtime started (the
        pages are the parent's)."""
        if self._arena.forked:
            raise ForkedChildError()
        return super().release()

    def __repr__(self) -> str:
        return (f"VirtualPoolResource(device={self._device}, granularity={self.granularity}, "
                f"mapped_bytes={self.mapped_bytes}, maximum_pool_size={self._maximum})")

    def __reduce__(self) -> Tuple[Any, ...]:
        raise TypeError("a VirtualPoolResource owns its mappings and cannot be pickled")

"""``AlignedResource``: alignments larger than the upstream guarantees, by over-allocating
(or, directly over a ``PoolResource``, from the pool's lists of blocks aligned so, through the
pool's :class:`~hipmr_ctypes.adaptors.pool.PoolView`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._device_sizes import config_size
from .._sizes import Size
from ..errors import OutOfMemoryError
from ..properties import DEFAULT_ALIGNMENT
from .._checks import (FAST_ALIGNMENTS, MAX_SIZE, check_alignment, check_args, check_free_args,
                       check_stream)
from .._stream_order import SYNC
from ._base import BoundAdaptor
from ._checked import check_upstream_ptr, claim, duplicate, must_check_arguments, upstream_calls
from ._dead import ANY as _ANY, DEAD as _DEAD, rescue as _rescue

if TYPE_CHECKING:
    from .pool import PoolView

__all__ = ["AlignedResource"]

#: What the adaptor assumes every upstream honours (hipMalloc's alignment).
UPSTREAM_ALIGNMENT = DEFAULT_ALIGNMENT


# what the fast paths use, as globals rather than closure cells (every cell a closure uses is
# copied into every call's frame)
_COMPACT = (1 << 30) - 1      # sizes up to this one-digit int are compared inline
_TOTALS_CACHED = 4096         # sizes whose over-allocated total is remembered
_KEYS_CACHED = 4096           # sizes whose pool list key is remembered (then made again)
_MISS = (KeyError, IndexError, TypeError)  # no list / empty list / unhashable argument
_NONE: Any = object()         # "no such live block" (equal to no size)


def _fast_enough(alignment: int) -> bool:
    """Whether every size the fast path takes (up to ``_COMPACT``) over-allocated for
    ``alignment`` stays a valid size (so the fast path needs no test of the total)."""
    return _COMPACT + alignment - UPSTREAM_ALIGNMENT <= MAX_SIZE


def big_enough(alignment: int) -> bool:
    """Whether ``alignment`` is above what every upstream honours (256)."""
    return alignment > UPSTREAM_ALIGNMENT


def _allocate_fast(moved_setdefault: Any, default: int, threshold: int, up_alloc_async: Any,
                   allocate_checked: Any) -> Any:
    """The fast ``allocate_async`` with a threshold, or a default alignment of at most 256."""
    extra = default - UPSTREAM_ALIGNMENT
    mask = default - 1
    neg = -default
    big = default > UPSTREAM_ALIGNMENT

    def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
        if type(bytes) is int and 0 < bytes <= _COMPACT and (
                alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS.get(alignment) is alignment):
            if bytes < threshold or default <= alignment:
                ptr: int = up_alloc_async(bytes, alignment, stream)
                return ptr
            if not big:
                ptr = up_alloc_async(bytes, default, stream)
                return ptr
            total = bytes + extra
            ptr = up_alloc_async(total, UPSTREAM_ALIGNMENT, stream)
            aligned = (ptr + mask) & neg
            entry = (ptr, total, bytes)
            if moved_setdefault(aligned, entry) is not entry:
                raise duplicate("AlignedResource", ptr)
            return aligned
        ptr = allocate_checked(bytes, alignment, stream)
        return ptr

    return allocate_async


def _fast_paths(moved: Dict[int, Tuple[int, int, int]], default: int, threshold: int,
                up_alloc_async: Any, up_dealloc_async: Any, allocate_checked: Any,
                deallocate_checked: Any) -> Tuple[Any, Any]:
    """The stream-ordered hot paths over one of the package's own async upstreams (which
    check the stream and every argument they are given): an int size in ``1 .. 2**30 - 1``
    and an alignment in 1..256 are served inline, anything else (and every free of a block
    that was not over-allocated) by the checked paths ``allocate_checked`` /
    ``deallocate_checked``."""
    moved_pop = moved.pop
    moved_setdefault = moved.setdefault
    extra = default - UPSTREAM_ALIGNMENT   # what an over-allocation adds
    mask = default - 1
    big = default > UPSTREAM_ALIGNMENT     # (else: the upstream aligns it itself)
    totals: Dict[int, int] = {}            # size -> bytes + extra: one int per size, no sum

    def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
        """(No threshold, an alignment above 256: every allocation is over-allocated.)"""
        if type(bytes) is int and (alignment is DEFAULT_ALIGNMENT
                                   or FAST_ALIGNMENTS.get(alignment) is alignment):
            try:  # a size seen before (in 1 .. 2**30 - 1)
                total = totals[bytes]
            except KeyError:
                if not 0 < bytes <= _COMPACT:
                    ptr: int = allocate_checked(bytes, alignment, stream)
                    return ptr
                total = bytes + extra
                if len(totals) < _TOTALS_CACHED:
                    totals[bytes] = total
            ptr = up_alloc_async(total, UPSTREAM_ALIGNMENT, stream)
            offset = ptr & mask   # a multiple of 256: the upstream aligns to 256
            aligned = ptr + (default - offset) if offset else ptr
            entry = (ptr, total, bytes)
            if moved_setdefault(aligned, entry) is not entry:
                raise duplicate("AlignedResource", ptr)
            return aligned
        ptr = allocate_checked(bytes, alignment, stream)
        return ptr

    if threshold or not big:
        allocate_async = _allocate_fast(moved_setdefault, default, threshold, up_alloc_async,
                                        allocate_checked)

    def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        if type(ptr) is int is type(bytes) and (
                alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS.get(alignment) is alignment):
            entry = moved_pop(ptr, None)   # the pop is the claim: one caller wins
            if entry is not None:
                if entry[2] == bytes:
                    try:
                        up_dealloc_async(entry[0], entry[1], UPSTREAM_ALIGNMENT, stream)
                    except BaseException:
                        moved[ptr] = entry
                        raise
                    return
                moved[ptr] = entry  # another size: put it back, the checked path reports
        deallocate_checked(ptr, bytes, alignment, stream)

    return allocate_async, deallocate_async


def _pool_paths(view: "PoolView", alignment: int, lowest: int, foreign: Dict[int, Any],
                allocate_checked: Any, deallocate_checked: Any) -> Optional[List[Any]]:
    """``[allocate_async, deallocate_async, allocate, deallocate]`` for an
    ``AlignedResource(pool, alignment, threshold=lowest)`` directly over a ``PoolResource``,
    built from the pool's :class:`~hipmr_ctypes.adaptors.pool.PoolView` ``view`` and kept to
    its rules (None for an alignment the pool keeps no lists for: then the adaptor
    over-allocates).  A request of an int size in ``max(1, lowest) .. view.largest_aligned``
    with an alignment of at most 256 gets a block aligned to ``alignment`` from the pool
    itself, with no block over-allocated and no record of the adaptor's: from the pool's free
    list of such blocks for its stream and size (the pool's fast path with another key), else
    from the pool's slow path, which aligns it.  A block handed out from such a list is
    recorded live under its exact size's key, so a free finds it aligned and of that size with
    one comparison, and puts it back on the list; a free of another of the pool's blocks,
    aligned so and live with that size, goes there through the pool's slow path
    (``missed``).  Anything else goes to the adaptor's checked bodies ``allocate_checked`` /
    ``deallocate_checked`` (``stream`` SYNC for a synchronous call), and so does a free
    missed here of a pointer in ``foreign`` (the adaptor's over-allocated blocks)."""
    if not UPSTREAM_ALIGNMENT < alignment <= view.max_alignment:
        return None
    free = view.free
    sync_free = free[SYNC]
    live = view.live
    live_pop = live.pop
    key = view.stream_key
    allocate_slow = view.allocate_slow
    deallocate_slow = view.deallocate_slow
    aligned_key = view.aligned_key
    largest = view.largest_aligned
    mask = alignment - 1
    lo = max(1, lowest)
    # size -> its list key, for the sizes served here only: the look-up is the range check
    keys: Dict[int, int] = {}

    def served(bytes: Any) -> bool:
        """Whether the size ``bytes`` is served here (then its key is remembered)."""
        if type(bytes) is not int or not lo <= bytes <= largest:
            return False
        if len(keys) >= _KEYS_CACHED:  # bound the map; it refills on misses
            keys.clear()
        keys[bytes] = aligned_key(bytes, alignment)
        return True

    def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
        if type(bytes) is int and (alignment is DEFAULT_ALIGNMENT
                                   or FAST_ALIGNMENTS.get(alignment) is alignment):
            try:
                k = keys[bytes]
                ptr: int = free[stream if type(stream) is int else
                                stream._hipmr_handle][k].pop()
                live[ptr] = k   # (only a list of aligned blocks gives them back as such)
                return ptr
            except _MISS:
                pass
            except AttributeError:  # a stream object of another kind: with its handle
                if type(stream) is not int:
                    return allocate_async(bytes, alignment, check_stream(stream))
            if served(bytes):
                return allocate_slow(bytes, mask + 1, key(check_stream(stream)))
        return allocate_checked(bytes, alignment, stream)  # type: ignore[no-any-return]

    def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        if type(bytes) is int and (alignment is DEFAULT_ALIGNMENT
                                   or FAST_ALIGNMENTS.get(alignment) is alignment):
            try:
                k = keys[bytes]
                ptr: int = sync_free[k].pop()
                live[ptr] = k
                return ptr
            except _MISS:
                pass
            if served(bytes):
                return allocate_slow(bytes, mask + 1, SYNC)
        return allocate_checked(bytes, alignment, SYNC)  # type: ignore[no-any-return]

    def missed(ptr: Any, bytes: Any, alignment: Any, stream: Any) -> None:
        """A free the fast path did not take: a block of the pool's, aligned, with a
        size served here, goes to the pool's slow path (which files it on the aligned
        list), anything else to the adaptor's checked path."""
        if (type(ptr) is int and type(alignment) is int and not ptr & mask
                and ptr not in foreign and FAST_ALIGNMENTS.get(alignment) is alignment
                and served(bytes)):
            deallocate_slow(ptr, bytes, mask + 1,
                            SYNC if stream is SYNC else key(check_stream(stream)))
            return
        deallocate_checked(ptr, bytes, alignment, stream)

    def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        known = _NONE
        try:
            if type(ptr) is int is type(bytes) and (
                    alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS[alignment] is alignment):
                k = keys[bytes]
                lst = free[stream if type(stream) is int else stream._hipmr_handle][k]
                known = live_pop(ptr)   # the pop is the claim: one caller wins
                if known == k:  # handed out by an aligned fast path, with that size
                    lst.append(ptr)
                    if _ANY and id(lst) in _DEAD:   # the pool let the list go
                        _rescue(lst)                # meanwhile
                    return
        except _MISS:
            pass
        except AttributeError:  # read before the claim: nothing to put back
            if type(stream) is not int:
                return deallocate_async(ptr, bytes, alignment, check_stream(stream))
        if known is not _NONE:  # put it back; the checked path decides
            live[ptr] = known
        missed(ptr, bytes, alignment, stream)

    def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        known = _NONE
        try:
            if type(ptr) is int is type(bytes) and (
                    alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS[alignment] is alignment):
                k = keys[bytes]
                lst = sync_free[k]
                known = live_pop(ptr)
                if known == k:  # (the host's lists are never let go)
                    lst.append(ptr)
                    return
        except _MISS:
            pass
        if known is not _NONE:
            live[ptr] = known
        missed(ptr, bytes, alignment, SYNC)

    return [allocate_async, deallocate_async, allocate, deallocate]


class AlignedResource(BoundAdaptor):
    """``AlignedResource(upstream, alignment=256, threshold=0)``.

    Every allocation of at least ``threshold`` bytes is aligned to ``alignment`` at least,
    and every allocation to the alignment the caller asks for, however large.  Alignments up
    to 256 are passed to the upstream; larger ones are served by asking the upstream for
    ``bytes + alignment - 256`` bytes aligned to 256 and returning the aligned address inside
    (freed with the same arguments).  ``allocate(0)`` goes straight to the upstream.
    Thread-safe; an async resource when the upstream is one; equal to another over an equal
    upstream with the same alignment and threshold.
    """

    def __init__(self, upstream: Any, alignment: int = DEFAULT_ALIGNMENT,
                 threshold: Size = 0) -> None:
        ref = self._set_upstream(upstream)
        self._alignment = check_alignment(alignment, name="alignment")
        self._threshold = config_size(threshold, "threshold", fraction=False)
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        """Invariants:

        * the hot paths take no lock: ``moved[aligned] = (upstream ptr, total, bytes)``
          records an over-allocated block and ``moved.pop(aligned)`` claims it for its free
          (one atomic dict operation each);
        * over the package's own async upstreams a valid call is checked inline
          (:func:`_fast_paths`); anything else, and every call over a user-written upstream,
          takes the checked bodies below (``stream`` SYNC for a synchronous call)."""
        moved: Dict[int, Tuple[int, int, int]] = {}   # aligned ptr -> (upstream ptr, total, bytes)
        moved_pop = moved.pop
        default = self._alignment
        threshold = self._threshold
        must_check = must_check_arguments(ref)  # a user-written upstream: check everything
        fast = FAST_ALIGNMENTS.get
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        # the choice, once: the inline paths over one of the package's own async upstreams
        # (when every size they take stays a valid size over-allocated), else the checked ones
        inline = not must_check and self._async and _fast_enough(default)

        def want(nbytes: int, alignment: int) -> int:
            return default if nbytes >= threshold and default > alignment else alignment

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            """(``stream`` SYNC: the synchronous ``allocate``.)"""
            if must_check and stream is not SYNC:
                check_stream(stream)
            if must_check or not (type(bytes) is int and 0 <= bytes <= MAX_SIZE
                                  and fast(alignment) is alignment):
                bytes, alignment = check_args(bytes, alignment)
            alignment = want(bytes, alignment)
            if alignment <= UPSTREAM_ALIGNMENT or not bytes:
                a = alignment if alignment <= UPSTREAM_ALIGNMENT else UPSTREAM_ALIGNMENT
                return (up_alloc(bytes, a) if stream is SYNC
                        else up_alloc_async(bytes, a, stream))
            total = bytes + alignment - UPSTREAM_ALIGNMENT
            if total > MAX_SIZE:  # a valid request no upstream can serve
                raise OutOfMemoryError(call="AlignedResource.allocate", size=bytes,
                                       detail=f"with alignment={alignment} it needs more "
                                              "than 2**63 bytes of the upstream")
            ptr = (up_alloc(total, UPSTREAM_ALIGNMENT) if stream is SYNC
                   else up_alloc_async(total, UPSTREAM_ALIGNMENT, stream))
            if must_check:  # a user-written upstream: the block must start where promised
                ptr = check_upstream_ptr(
                    ptr, total, UPSTREAM_ALIGNMENT, up_dealloc if stream is SYNC else
                    (lambda p, n, a: up_dealloc_async(p, n, a, stream)), "AlignedResource")
            aligned = (ptr + alignment - 1) & -alignment
            entry = (ptr, total, bytes)
            if moved.setdefault(aligned, entry) is not entry:
                raise duplicate("AlignedResource", ptr)
            return aligned

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            """(``stream`` SYNC: the synchronous ``deallocate``.)"""
            if must_check and stream is not SYNC:
                check_stream(stream)  # before anything is claimed
            entry = moved_pop(ptr, None) if type(ptr) is int else None
            if must_check or not (type(bytes) is int and (entry[2] == bytes if entry is not None
                                                          else 0 <= bytes <= MAX_SIZE)
                                  and fast(alignment) is alignment):
                if entry is not None:  # put it back: the checked path decides
                    moved[ptr] = entry
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
                entry = claim(moved, ptr, bytes, 2, "AlignedResource", required=False)
            try:
                if entry is None:
                    a = want(bytes, alignment)
                    a = a if a <= UPSTREAM_ALIGNMENT else UPSTREAM_ALIGNMENT
                    if stream is SYNC:
                        up_dealloc(ptr, bytes, a)
                    else:
                        up_dealloc_async(ptr, bytes, a, stream)
                elif stream is SYNC:
                    up_dealloc(entry[0], entry[1], UPSTREAM_ALIGNMENT)
                else:
                    up_dealloc_async(entry[0], entry[1], UPSTREAM_ALIGNMENT, stream)
            except BaseException:
                if entry is not None:
                    moved[ptr] = entry
                raise

        if not inline:
            self._build(allocate_async, deallocate_async)
            return
        view = getattr(ref.resource, "_fast_view", None)  # the package's PoolResource
        paths = _pool_paths(view(), default, threshold, moved, allocate_async,
                            deallocate_async) if big_enough(default) and view is not None \
            else None
        if paths is not None:  # the pool aligns the blocks itself: nothing over-allocated
            self._build(paths[0], paths[1], allocate=paths[2], deallocate=paths[3])
            return
        self._build(*_fast_paths(moved, default, threshold, up_alloc_async, up_dealloc_async,
                                 allocate_async, deallocate_async),
                    allocate=lambda bytes, alignment=DEFAULT_ALIGNMENT:
                    allocate_async(bytes, alignment, SYNC),
                    deallocate=lambda ptr, bytes, alignment=DEFAULT_ALIGNMENT:
                    deallocate_async(ptr, bytes, alignment, SYNC))

    def _settings(self) -> Tuple[Any, ...]:
        return (self._alignment, self._threshold)

    @property
    def alignment(self) -> int:
        """The alignment of every allocation of at least :attr:`threshold` bytes."""
        return self._alignment

    @property
    def threshold(self) -> int:
        """Allocations smaller than this keep the alignment they ask for."""
        return self._threshold

    def __repr__(self) -> str:
        return (f"AlignedResource({self._upstream.resource!r}, alignment={self._alignment}, "
                f"threshold={self._threshold})")

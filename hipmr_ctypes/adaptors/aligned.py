"""``AlignedResource``: alignments larger than the upstream guarantees, by over-allocating."""
from __future__ import annotations

from typing import Any, Dict, Tuple

from .._sizes import Size, config_size
from ..errors import OutOfMemoryError
from ..properties import DEFAULT_ALIGNMENT
from ._base import (FAST_ALIGNMENTS, MAX_SIZE, SYNC, BoundAdaptor, check_alignment, check_args,
                    check_free_args, check_stream, check_upstream_ptr, claim, duplicate,
                    must_check_arguments, upstream_calls)

__all__ = ["AlignedResource"]

#: What the adaptor assumes every upstream honours (hipMalloc's alignment).
UPSTREAM_ALIGNMENT = DEFAULT_ALIGNMENT


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
        """The hot paths take no lock: ``moved[aligned] = (upstream ptr, total, bytes)``
        records an over-allocated block and ``moved.pop(aligned)`` claims it for its free (one
        atomic dict operation each).  Over the package's own upstreams a valid call is
        checked inline (int size in range, alignment in 1..256); anything else, and every call
        over a user-written upstream, takes the checked slow path."""
        moved: Dict[int, Tuple[int, int, int]] = {}   # aligned ptr -> (upstream ptr, total, bytes)
        moved_pop = moved.pop
        default = self._alignment
        threshold = self._threshold
        must_check = must_check_arguments(ref)  # a user-written upstream: check everything
        fast = FAST_ALIGNMENTS.get
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)

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

        self._build(allocate_async, deallocate_async)

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

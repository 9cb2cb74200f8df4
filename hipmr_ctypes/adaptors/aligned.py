"""``AlignedResource``: alignments larger than the upstream guarantees, by over-allocating."""
from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

from ..properties import DEFAULT_ALIGNMENT
from ._base import (BoundAdaptor, check_alignment, check_args, check_free, check_ptr, check_size,
                    check_stream, round_up, upstream_calls)

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
                 threshold: int = 0) -> None:
        ref = self._set_upstream(upstream)
        self._alignment = check_alignment(alignment, name="alignment")
        self._threshold = check_size(threshold, "threshold")
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        lock = threading.Lock()
        moved: Dict[int, Tuple[int, int, int]] = {}   # aligned ptr -> (upstream ptr, total, bytes)
        default = self._alignment
        threshold = self._threshold
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)

        def want(nbytes: int, alignment: int) -> int:
            return default if nbytes >= threshold and default > alignment else alignment

        def place(ptr: int, total: int, nbytes: int, alignment: int) -> int:
            aligned = round_up(ptr, alignment)
            with lock:
                moved[aligned] = (ptr, total, nbytes)
            return aligned

        def claim(ptr: Any, nbytes: Any, alignment: Any) -> Tuple[Any, ...]:
            """Checked arguments plus the upstream block behind ``ptr`` (None: passed through)."""
            ptr = check_ptr(ptr)
            nbytes, alignment = check_args(nbytes, alignment)
            with lock:
                entry = moved.get(ptr)
                if entry is not None:
                    check_free(ptr, entry[2], nbytes, "AlignedResource")
                    del moved[ptr]
            return ptr, nbytes, alignment, entry

        def restore(ptr: int, entry: Tuple[int, int, int]) -> None:
            with lock:
                moved[ptr] = entry

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            bytes, alignment = check_args(bytes, alignment)
            alignment = want(bytes, alignment)
            if alignment <= UPSTREAM_ALIGNMENT or not bytes:
                return up_alloc(bytes, min(alignment, UPSTREAM_ALIGNMENT))
            total = bytes + alignment - UPSTREAM_ALIGNMENT
            return place(up_alloc(total, UPSTREAM_ALIGNMENT), total, bytes, alignment)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            ptr, bytes, alignment, entry = claim(ptr, bytes, alignment)
            if entry is None:
                up_dealloc(ptr, bytes, min(want(bytes, alignment), UPSTREAM_ALIGNMENT))
                return
            try:
                up_dealloc(entry[0], entry[1], UPSTREAM_ALIGNMENT)
            except BaseException:
                restore(ptr, entry)
                raise

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            bytes, alignment = check_args(bytes, alignment)
            check_stream(stream)
            alignment = want(bytes, alignment)
            if alignment <= UPSTREAM_ALIGNMENT or not bytes:
                return up_alloc_async(bytes, min(alignment, UPSTREAM_ALIGNMENT), stream)
            total = bytes + alignment - UPSTREAM_ALIGNMENT
            return place(up_alloc_async(total, UPSTREAM_ALIGNMENT, stream), total, bytes,
                         alignment)

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            check_stream(stream)
            ptr, bytes, alignment, entry = claim(ptr, bytes, alignment)
            if entry is None:
                up_dealloc_async(ptr, bytes, min(want(bytes, alignment), UPSTREAM_ALIGNMENT),
                                 stream)
                return
            try:
                up_dealloc_async(entry[0], entry[1], UPSTREAM_ALIGNMENT, stream)
            except BaseException:
                restore(ptr, entry)
                raise

        self._install(allocate, deallocate, allocate_async, deallocate_async)

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

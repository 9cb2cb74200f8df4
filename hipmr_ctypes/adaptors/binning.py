"""``BinningResource``: routes each request by size to a bin resource."""
from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..properties import DEFAULT_ALIGNMENT
from ._base import (BoundAdaptor, as_upstream_ref, check_args, check_free, check_ptr,
                    check_size, check_stream)
from .fixed_size import FixedSizeResource

__all__ = ["BinningResource"]


class BinningResource(BoundAdaptor):
    """``BinningResource(upstream, bins=(), *, min_size_exponent=None,
    max_size_exponent=None)``.

    A request of ``bytes`` (with an alignment of at most 256) goes to the smallest bin whose
    size is at least ``bytes``; larger requests and larger alignments go to ``upstream``.
    ``bins`` lists bin sizes (each gets a :class:`FixedSizeResource` over the upstream with
    that block size) or ``(size, resource)`` pairs; ``min_size_exponent`` / ``max_size_exponent``
    (RMM's) add fixed-size bins of ``2**min .. 2**max`` bytes.  :meth:`add_bin` adds one later.
    A bin resource must have every property of the upstream, and be async when the upstream
    is.  Each pointer is freed through the resource that allocated it, also after bins were
    added.  Thread-safe; an async resource when the upstream is one; equal to another over an
    equal upstream with equal bins.
    """

    def __init__(self, upstream: Any, bins: Iterable[Any] = (), *,
                 min_size_exponent: Optional[int] = None,
                 max_size_exponent: Optional[int] = None) -> None:
        ref = self._set_upstream(upstream)
        specs: List[Tuple[int, Any]] = []
        try:
            items = list(bins)
        except TypeError:
            raise TypeError(f"bins must be an iterable of sizes or (size, resource) pairs, "
                            f"not {type(bins).__name__}") from None
        for item in items:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise TypeError(f"bins: {item!r} is not a size or a (size, resource) pair")
                specs.append((item[0], item[1]))
            else:
                specs.append((item, None))
        if (min_size_exponent is None) != (max_size_exponent is None):
            raise ValueError("min_size_exponent and max_size_exponent must be given together")
        if min_size_exponent is not None:
            low = check_size(min_size_exponent, "min_size_exponent")
            high = check_size(max_size_exponent, "max_size_exponent")
            if high < low or high > 62:
                raise ValueError(f"max_size_exponent={high} must be in [min_size_exponent, 62]")
            specs.extend((1 << e, None) for e in range(low, high + 1))
        self._lock = threading.Lock()
        self._sizes: List[int] = []        # sorted bin sizes
        self._refs: List[Any] = []         # the bins' refs, in the same order
        self._live: Dict[int, Tuple[Any, int]] = {}   # ptr -> (ref that allocated it, bytes)
        checked = [self._check_bin(size, res) for size, res in specs]
        for size, _ in checked:
            if sum(1 for s, _ in checked if s == size) > 1:
                raise ValueError(f"bins: the size {size} appears twice")
        for size, res in checked:
            self._insert(size, res if res is not None else FixedSizeResource(ref, size))
        self._bind(ref)

    def _check_bin(self, size: Any, resource: Any) -> Tuple[int, Any]:
        size = check_size(size, "size")
        if not size:
            raise ValueError("size=0: a bin must hold at least one byte")
        if resource is None:
            return size, None
        bin_ref = as_upstream_ref(resource, "resource")
        missing = [p.__name__ for p in self._upstream.properties
                   if p not in bin_ref.properties]
        if missing:
            raise TypeError(f"resource: the bin lacks the upstream's properties "
                            f"{', '.join(sorted(missing))}")
        if self._async and not hasattr(bin_ref, "allocate_async"):
            raise TypeError("resource: the upstream is an async resource but the bin is not")
        return size, bin_ref

    def _insert(self, size: int, resource: Any) -> None:
        bin_ref = as_upstream_ref(resource, "resource")
        with self._lock:
            if size in self._sizes:
                raise ValueError(f"size={size}: there is already a bin of that size")
            i = bisect_left(self._sizes, size)
            self._sizes.insert(i, size)
            self._refs.insert(i, bin_ref)

    def add_bin(self, size: int, resource: Any = None) -> None:
        """Add a bin for requests of up to ``size`` bytes (above the next smaller bin), served
        by ``resource`` (default: a new ``FixedSizeResource(upstream, size)``)."""
        size, bin_ref = self._check_bin(size, resource)
        with self._lock:
            if size in self._sizes:
                raise ValueError(f"size={size}: there is already a bin of that size")
        self._insert(size, bin_ref if bin_ref is not None
                     else FixedSizeResource(self._upstream, size))

    def _bind(self, ref: Any) -> None:
        lock = self._lock
        sizes = self._sizes
        refs = self._refs
        live = self._live
        upstream = ref

        def route(nbytes: int, alignment: int) -> Any:
            if alignment <= DEFAULT_ALIGNMENT:
                with lock:
                    i = bisect_left(sizes, nbytes)
                    if i < len(sizes):
                        return refs[i]
            return upstream

        def remember(ptr: int, target: Any, nbytes: int) -> None:
            if ptr:
                with lock:
                    live[ptr] = (target, nbytes)

        def claim(ptr: Any, nbytes: Any, alignment: Any) -> Tuple[Any, ...]:
            ptr = check_ptr(ptr)
            nbytes, alignment = check_args(nbytes, alignment)
            with lock:
                found = live.get(ptr)
                if found is None and not ptr and not nbytes:
                    return ptr, nbytes, alignment, None
                check_free(ptr, None if found is None else found[1], nbytes, "BinningResource")
                del live[ptr]
            return ptr, nbytes, alignment, found

        def restore(ptr: int, found: Tuple[Any, int]) -> None:
            with lock:
                live[ptr] = found

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            bytes, alignment = check_args(bytes, alignment)
            if not bytes:
                return 0
            target = route(bytes, alignment)
            ptr = target.allocate(bytes, alignment)
            remember(ptr, target, bytes)
            return ptr

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            ptr, bytes, alignment, found = claim(ptr, bytes, alignment)
            if found is None:
                return
            try:
                found[0].deallocate(ptr, bytes, alignment)
            except BaseException:
                restore(ptr, found)
                raise

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            bytes, alignment = check_args(bytes, alignment)
            check_stream(stream)
            if not bytes:
                return 0
            target = route(bytes, alignment)
            ptr = target.allocate_async(bytes, alignment, stream)
            remember(ptr, target, bytes)
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            check_stream(stream)
            ptr, bytes, alignment, found = claim(ptr, bytes, alignment)
            if found is None:
                return
            try:
                found[0].deallocate_async(ptr, bytes, alignment, stream)
            except BaseException:
                restore(ptr, found)
                raise

        self._install(allocate, deallocate, allocate_async, deallocate_async)

    def _settings(self) -> Tuple[Any, ...]:
        return tuple(self.bins)

    @property
    def bins(self) -> Tuple[Tuple[int, Any], ...]:
        """``((size, resource), ...)`` from the smallest bin up."""
        with self._lock:
            return tuple((s, r.resource) for s, r in zip(self._sizes, self._refs))

    @property
    def bin_resources(self) -> Dict[int, Any]:
        """``{size: resource}`` for every bin."""
        return dict(self.bins)

    def allocation_count(self) -> int:
        """Number of live allocations."""
        return len(self._live)

    def release(self) -> int:
        """Call ``release()`` on every bin that has one (the fixed-size bins give their free
        chunks back); returns the total bytes they report."""
        given = 0
        for _, resource in self.bins:
            rel = getattr(resource, "release", None)
            if callable(rel):
                given += rel() or 0
        return given

    def __repr__(self) -> str:
        return (f"BinningResource({self._upstream.resource!r}, "
                f"bins={[s for s, _ in self.bins]})")

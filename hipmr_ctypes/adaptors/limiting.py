"""``LimitingResource``: refuses allocations that would pass a byte limit."""
from __future__ import annotations

import threading
from typing import Any, List, Tuple

from .._hip.errors import OutOfMemoryError
from ..properties import DEFAULT_ALIGNMENT
from ._base import (FAST_ALIGNMENTS, MAX_PTR, MAX_SIZE, BoundAdaptor, check_args, check_free_args,
                    check_size, upstream_calls, checks_arguments)

__all__ = ["LimitingResource"]


class LimitingResource(BoundAdaptor):
    """``LimitingResource(upstream, limit)``: at most ``limit`` bytes outstanding.

    An allocation that would take the outstanding bytes (the sizes callers asked for) past
    ``limit`` raises ``OutOfMemoryError`` without reaching the upstream.  The bytes are
    reserved before the upstream is called and given back if it fails, so concurrent
    allocations never pass the limit together.  Thread-safe; an async resource when the
    upstream is one; equal to another over an equal upstream with the same limit.
    """

    def __init__(self, upstream: Any, limit: int) -> None:
        ref = self._set_upstream(upstream)
        self._limit = check_size(limit, "limit")
        self._bind(ref, self._limit)

    def _bind(self, ref: Any, limit: int) -> None:
        lock = threading.Lock()
        acquire = lock.acquire
        release = lock.release
        aligned = FAST_ALIGNMENTS.get
        own = not checks_arguments(ref)  # False: the upstream validates, keep only our needs
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        used = 0
        returned: List[int] = []   # sizes freed and not yet subtracted from ``used``
        freed = returned.append
        pop_returned = returned.pop

        def drain() -> None:
            """Subtract the freed sizes from ``used`` (lock held)."""
            nonlocal used
            k = len(returned)
            used -= sum(returned[:k])
            del returned[:k]  # sizes appended meanwhile stay

        def current() -> int:
            with lock:
                drain()
                return used

        def refuse(nbytes: int) -> OutOfMemoryError:
            check_size(nbytes)  # a size above 2**63 is a bad argument, not a lack of memory
            return OutOfMemoryError(call="LimitingResource.allocate", size=nbytes,
                                    detail=f"{used} of the limit {limit} bytes are in use")

        def unreserve(nbytes: int) -> None:
            nonlocal used
            with lock:
                used -= nbytes

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            nonlocal used
            if type(bytes) is not int or own and (not 0 <= bytes <= MAX_SIZE
                                                  or aligned(alignment) is not alignment):
                bytes, alignment = check_args(bytes, alignment)
            acquire()
            try:
                while returned:  # usually one size: the last free
                    used -= pop_returned()
                if used + bytes > limit:
                    raise refuse(bytes)
                used += bytes
            finally:
                release()
            try:
                return up_alloc(bytes, alignment)
            except BaseException:
                unreserve(bytes)
                raise

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if own and (type(ptr) is not int or not 0 <= ptr <= MAX_PTR or type(bytes) is not int
                        or not 0 <= bytes <= MAX_SIZE or aligned(alignment) is not alignment):
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            up_dealloc(ptr, bytes, alignment)
            freed(bytes)  # atomic; the next allocation or reader subtracts it

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            nonlocal used
            if type(bytes) is not int or own and (not 0 <= bytes <= MAX_SIZE
                                                  or aligned(alignment) is not alignment):
                bytes, alignment = check_args(bytes, alignment)
            acquire()
            try:
                while returned:  # usually one size: the last free
                    used -= pop_returned()
                if used + bytes > limit:
                    raise refuse(bytes)
                used += bytes
            finally:
                release()
            try:
                return up_alloc_async(bytes, alignment, stream)
            except BaseException:
                unreserve(bytes)
                raise

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if own and (type(ptr) is not int or not 0 <= ptr <= MAX_PTR or type(bytes) is not int
                        or not 0 <= bytes <= MAX_SIZE or aligned(alignment) is not alignment):
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            up_dealloc_async(ptr, bytes, alignment, stream)
            freed(bytes)

        self._used = current
        self._install(allocate, deallocate, allocate_async, deallocate_async)

    def _settings(self) -> Tuple[Any, ...]:
        return (self._limit,)

    @property
    def limit(self) -> int:
        """The most bytes that may be outstanding."""
        return self._limit

    def get_allocation_limit(self) -> int:
        """RMM's name for :attr:`limit`."""
        return self._limit

    def get_allocated_bytes(self) -> int:
        """Bytes outstanding now."""
        return self._used()

    def __repr__(self) -> str:
        return f"LimitingResource({self._upstream.resource!r}, limit={self._limit})"

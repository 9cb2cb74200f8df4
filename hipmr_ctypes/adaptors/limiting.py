"""``LimitingResource``: refuses allocations that would pass a byte limit."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Tuple

from ..errors import OutOfMemoryError
from .._locks import TokenMutex, wait_token
from .._device_sizes import config_size
from .._sizes import Size
from ..properties import DEFAULT_ALIGNMENT
from .._checks import check_args, check_free_args, check_size
from ._base import BoundAdaptor
from ._checked import must_check_arguments, upstream_calls

__all__ = ["LimitingResource"]


def _refused(nbytes: int, in_use: int, limit: int) -> OutOfMemoryError:
    """The error of an allocation of ``nbytes`` that would pass ``limit`` with ``in_use``
    bytes outstanding."""
    check_size(nbytes)  # a size above 2**63 is a bad argument, not a lack of memory
    return OutOfMemoryError(call="LimitingResource.allocate", size=nbytes,
                            detail=f"{in_use} of the limit {limit} bytes are in use")


class LimitingResource(BoundAdaptor):
    """``LimitingResource(upstream, limit)``: at most ``limit`` bytes outstanding.

    An allocation that would take the outstanding bytes (the sizes callers asked for) past
    ``limit`` raises ``OutOfMemoryError`` without reaching the upstream.  The bytes are
    reserved before the upstream is called and given back if it fails, so concurrent
    allocations never pass the limit together.  Thread-safe; an async resource when the
    upstream is one; equal to another over an equal upstream with the same limit.
    """

    #: hands out its upstream's pointers unchanged (read by IPC: see Adaptor)
    passes_pointers_through = True

    def __init__(self, upstream: Any, limit: Size) -> None:
        ref = self._set_upstream(upstream)
        self._limit = config_size(limit, "limit")
        self._bind(ref, self._limit)

    def _bind(self, ref: Any, limit: int) -> None:
        """Invariants:

        * ``used`` is what allocations reserved; ``returned`` holds credits, sizes freed (or
          reserved in vain) not yet subtracted from it; what is in use is
          ``used - sum(returned)``, never less than what is really outstanding;
        * a free appends its size (atomic) once the upstream freed: a finalizer that frees
          never waits for anything;
        * an allocation pops one credit (atomic: no other thread can take it); one that covers
          the size serves it without the mutex (the rest appended back; ``used`` unchanged, so
          the limit holds); otherwise it takes the :class:`TokenMutex` (int operations only),
          subtracts every credit, reserves and checks the limit there (``reserve``)."""
        check_first = must_check_arguments(ref)  # a user-written upstream: check everything
        mutex = TokenMutex()
        tokens = mutex.tokens            # pop(): take the token; append(True): give it back
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        used = 0
        returned: Deque[int] = deque()  # credits: sizes freed (or reserved in vain)

        def settle() -> int:
            """Subtract every credit from ``used`` (the mutex held); returns it.  An allocation
            may take a credit at any moment without the mutex, so the last one may be gone
            between the test and the pop."""
            nonlocal used
            try:
                while returned:
                    used -= returned.pop()
            except IndexError:  # another thread's allocation took the last one
                pass
            return used

        def reserve(bytes: int, freed: int) -> None:
            """Reserve ``bytes`` under the mutex, the credit ``freed`` already popped (0 when
            none); OutOfMemoryError when they would pass the limit."""
            nonlocal used
            try:
                tokens.pop()
            except IndexError:
                wait_token(tokens.pop)
            try:  # int operations only (settle() too): no free ever waits for this section
                used -= freed
                settle()
                used += bytes
                if used > limit:
                    used -= bytes
                    # refused: (~size, bytes in use), the error made once the token is back
                    bytes, freed = ~bytes, used
            finally:
                tokens.append(True)
            if bytes < 0:
                raise _refused(~bytes, freed, limit)

        def reserving(up: Callable[..., int]) -> Callable[..., int]:
            """An allocation through ``up(bytes, alignment, stream)``, its bytes taken from a
            credit or reserved: the one body of ``allocate_async`` and of the synchronous
            ``allocate``."""

            def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
                if type(bytes) is not int or bytes < 0:  # negative: never reserved
                    bytes, alignment = check_args(bytes, alignment)
                freed = 0
                if returned:
                    try:
                        freed = returned.pop()
                    except IndexError:  # another thread took the last credit meanwhile
                        pass
                if freed != bytes:  # (equal: the usual, a free and an allocation of one size)
                    if freed > bytes:
                        returned.append(freed - bytes)
                    else:
                        reserve(bytes, freed)
                try:
                    return up(bytes, alignment, stream)
                except BaseException:
                    returned.append(bytes)  # the reservation, given back
                    raise
            return allocate_async

        allocate_async = reserving(up_alloc_async)
        allocate_sync = reserving(lambda nbytes, alignment, _: up_alloc(nbytes, alignment))

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            return allocate_sync(bytes, alignment, None)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if type(bytes) is not int:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)  # index-able: int
            up_dealloc(ptr, bytes, alignment)
            returned.append(bytes)  # atomic; the next allocation or reader subtracts it

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if type(bytes) is not int:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)  # index-able: int
            up_dealloc_async(ptr, bytes, alignment, stream)
            returned.append(bytes)

        self._settle = settle
        self._mutex = mutex
        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate,
                    check_first=check_first)

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
        tokens = self._mutex.tokens
        wait_token(tokens.pop)
        try:
            return self._settle()
        finally:
            tokens.append(True)

    def __repr__(self) -> str:
        return f"LimitingResource({self._upstream.resource!r}, limit={self._limit})"

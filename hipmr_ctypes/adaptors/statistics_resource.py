"""``StatisticsResource``: counts the bytes and allocations that pass through it."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional, Tuple

from .._locks import TokenMutex, wait_token
from ..properties import DEFAULT_ALIGNMENT
from .._checks import check_args, check_free_args
from ._base import BoundAdaptor
from ._checked import must_check_arguments, upstream_calls

__all__ = ["StatisticsResource", "Statistics"]


@dataclass(frozen=True)
class Statistics:
    """A snapshot of a :class:`StatisticsResource`'s counters (RMM's ``Statistics``).

    Bytes are the sizes callers asked for; ``current_*`` is what is outstanding now,
    ``peak_*`` the most ever outstanding at once, ``total_*`` everything ever allocated.
    """

    current_bytes: int = 0
    current_count: int = 0
    peak_bytes: int = 0
    peak_count: int = 0
    total_bytes: int = 0
    total_count: int = 0


class StatisticsResource(BoundAdaptor):
    """Counts current / peak / total bytes and allocations: ``StatisticsResource(upstream)``.

    ``statistics`` is a :class:`Statistics` snapshot.  ``push_counters()`` starts a fresh set
    of counters (returning the statistics before the push); ``pop_counters()`` ends it,
    returning its statistics and folding them into the set below (RMM semantics: the lower
    peak becomes ``max(peak, current + popped peak)``).  Every call is counted, also
    ``allocate(0)``.  An allocation is counted once the upstream has made it, a deallocation
    before the upstream frees (and counted back if the upstream refuses it), so that under
    concurrency the counters never show more than is really outstanding: over a
    LimitingResource, the peak never passes the limit.  Thread-safe; an async resource when
    the upstream is one; equal to another over an equal upstream.
    """

    #: hands out its upstream's pointers unchanged (read by IPC: see Adaptor)
    passes_pointers_through = True

    def __init__(self, upstream: Any) -> None:
        ref = self._set_upstream(upstream)
        self._stack_lock = threading.Lock()   # push / pop: the stack and the counters together
        self._stack: List[_Counters] = []   # the counters below each pushed set
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        """Invariants:

        * the counters change only under the :class:`TokenMutex`, taken by allocations and
          readers, around a few int operations (nothing that allocates); a free takes none, so
          a finalizer that frees never waits for it;
        * a free appends its size on the left of ``returned`` before the upstream frees; one
          the upstream refuses then appends ``~size`` on the right, and is counted back;
        * an allocation takes one entry from the right: a free of its own size changes no
          current counter, another size only the bytes, a refusal counts back its size; when a
          peak is possible every entry logged is settled first, as readers do;
        * so ``current_*`` is never less than what is outstanding, never more than ``peak_*``,
          and a peak never shows more than was outstanding at once."""
        check_first = must_check_arguments(ref)  # a user-written upstream: check everything
        mutex = TokenMutex()
        tokens = mutex.tokens            # pop(): take the token; append(True): give it back
        # sizes freed, not yet subtracted (appended on the left); ~size for a free the
        # upstream refused (on the right: taken first)
        returned: Deque[int] = deque()
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        current_bytes = current_count = peak_bytes = peak_count = total_bytes = total_count = 0

        def settle(change: Optional[Callable[[_Counters], _Counters]] = None) -> _Counters:
            """Subtract the frees logged, count back the refused ones (the mutex held); returns
            the counters, then replaces them with ``change(counters)`` when given."""
            nonlocal current_bytes, current_count, peak_bytes, peak_count, total_bytes, \
                total_count
            while returned:
                freed = returned.pop()
                if freed >= 0:
                    current_bytes -= freed
                    current_count -= 1
                else:
                    current_bytes += ~freed
                    current_count += 1
            if current_bytes > peak_bytes:
                peak_bytes = current_bytes
            if current_count > peak_count:
                peak_count = current_count
            values = (current_bytes, current_count, peak_bytes, peak_count, total_bytes,
                      total_count)
            if change is not None:
                (current_bytes, current_count, peak_bytes, peak_count, total_bytes,
                 total_count) = change(values)
            return values

        def counting(up: Callable[..., int]) -> Callable[..., int]:
            """An allocation through ``up(bytes, alignment, stream)``, counted: the one body of
            ``allocate_async`` and of the synchronous ``allocate``."""

            def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
                nonlocal current_bytes, current_count, peak_bytes, peak_count, total_bytes, \
                    total_count
                if type(bytes) is not int:
                    bytes, alignment = check_args(bytes, alignment)  # an index-able size: int
                ptr: int = up(bytes, alignment, stream)
                try:
                    tokens.pop()
                except IndexError:
                    wait_token(tokens.pop)
                try:  # int operations only
                    if returned:  # a refusal first, if any, else the oldest free
                        freed = returned.pop()
                        if freed != bytes:  # (equal: no current counter changes, so no peak)
                            if freed >= 0:  # a free of another size: the count does not change
                                current_bytes += bytes - freed
                            else:  # a refused free counted back, and this allocation
                                current_bytes += ~freed + bytes
                                current_count += 2
                            if current_bytes > peak_bytes or current_count > peak_count:
                                settle()  # maybe a peak: every other entry first
                    else:
                        current_bytes += bytes
                        current_count += 1
                        if current_count > peak_count:
                            peak_count = current_count
                        if current_bytes > peak_bytes:
                            peak_bytes = current_bytes
                    total_bytes += bytes
                    total_count += 1
                finally:
                    tokens.append(True)
                return ptr
            return allocate_async

        allocate_async = counting(up_alloc_async)
        allocate_sync = counting(lambda nbytes, alignment, _: up_alloc(nbytes, alignment))

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            return allocate_sync(bytes, alignment, None)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if type(bytes) is not int or bytes < 0:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            returned.appendleft(bytes)
            try:
                up_dealloc(ptr, bytes, alignment)
            except BaseException:
                returned.append(~bytes)  # refused: counted back
                raise

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if type(bytes) is not int or bytes < 0:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            returned.appendleft(bytes)
            try:
                up_dealloc_async(ptr, bytes, alignment, stream)
            except BaseException:
                returned.append(~bytes)  # refused: counted back
                raise

        self._settle = settle
        self._mutex = mutex
        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate,
                    check_first=check_first)

    def _counters(self, change: Optional[Callable[[_Counters], _Counters]] = None) -> _Counters:
        """The counters, settled under the mutex (and replaced with ``change(counters)``)."""
        tokens = self._mutex.tokens
        wait_token(tokens.pop)
        try:
            return self._settle(change)
        finally:
            tokens.append(True)

    @property
    def statistics(self) -> Statistics:
        """The current counters (of the innermost pushed set)."""
        return Statistics(*self._counters())

    #: RMM's name for :attr:`statistics`.
    allocation_counts = statistics

    def push_counters(self) -> Statistics:
        """Start a fresh set of counters; returns the statistics before the push."""
        with self._stack_lock:
            before = self._counters(_fresh)
            self._stack.append(before)
        return Statistics(*before)

    def pop_counters(self) -> Statistics:
        """End the innermost set of counters, fold it into the one below and return it;
        ``IndexError`` when none was pushed."""
        with self._stack_lock:
            if not self._stack:
                raise IndexError("pop_counters: no counters were pushed")
            below = self._stack.pop()
            popped = self._counters(lambda counters: _folded(below, counters))
        return Statistics(*popped)

    @property
    def depth(self) -> int:
        """How many counter sets are pushed (0 when only the base set exists)."""
        return len(self._stack)


#: (current_bytes, current_count, peak_bytes, peak_count, total_bytes, total_count)
_Counters = Tuple[int, int, int, int, int, int]


def _fresh(counters: _Counters) -> _Counters:
    """A pushed set's counters: all zero."""
    return (0, 0, 0, 0, 0, 0)


def _folded(below: _Counters, popped: _Counters) -> _Counters:
    """The set below with a popped one folded in (RMM: the lower peak becomes
    ``max(peak, current + popped peak)``)."""
    current_bytes, current_count, peak_bytes, peak_count, total_bytes, total_count = popped
    return (below[0] + current_bytes, below[1] + current_count,
            max(below[2], below[0] + peak_bytes), max(below[3], below[1] + peak_count),
            below[4] + total_bytes, below[5] + total_count)

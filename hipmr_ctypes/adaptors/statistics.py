"""``StatisticsResource``: counts the bytes and allocations that pass through it."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Tuple

from .._locks import TokenMutex, wait_token
from ..properties import DEFAULT_ALIGNMENT
from ._base import (BoundAdaptor, check_args, check_free_args, checking_first,
                    must_check_arguments, upstream_calls)

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
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        """The counters change only under a :class:`TokenMutex` (a few int operations, no
        call that allocates), taken by allocations and readers.  A deallocation takes no
        mutex: it appends its size on the left of ``returned`` (atomic) before the upstream
        frees, and a later allocation or reader subtracts it.  A deallocation the upstream
        refuses then appends ``~size`` on the right, and is counted back, not as a new
        allocation.  An allocation takes one entry from the right: a refusal, if any is
        logged, else the oldest free.  A free of its own size (the usual) is a pair that
        changes neither current counter; another size changes the bytes only by the
        difference; a refusal counts back its size.  The other frees may stay logged: ``cb``
        and ``cn`` then count them still, so they are never less than what is outstanding,
        and ``cb <= pb``, ``cn <= pn`` hold after every section, so what is outstanding cannot
        pass a peak until ``cb`` or ``cn`` does; then every entry logged is taken first, as
        readers do (a refusal's free is logged before it, so it is never counted back without
        it).  Peaks can only rise at an allocation, which sees every deallocation logged before
        it, so current and peak are exact for that order and never show more than is really
        outstanding; and a finalizer that frees through this resource never waits for the
        mutex.

        The closures keep in their cells only what every call uses (each cell is copied into
        every call's frame); the checks' constants and slow paths are module globals."""
        mutex = TokenMutex()
        tokens = mutex.tokens            # pop(): take the token; append(True): give it back
        stack_lock = threading.Lock()   # push / pop: the stack and the counters together
        # sizes freed, not yet subtracted (appended on the left); ~size for a free the
        # upstream refused (on the right: taken first)
        returned: Deque[int] = deque()
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        stack: List[Tuple[int, ...]] = []
        cb = cn = pb = pn = tb = tn = 0   # current/peak/total bytes (b) and counts (n)

        def settle() -> None:
            """Subtract the frees logged, count back the refused ones (mutex held)."""
            nonlocal cb, cn, pb, pn
            while returned:
                freed = returned.pop()
                if freed >= 0:
                    cb -= freed
                    cn -= 1
                else:
                    cb += ~freed
                    cn += 1
            if cb > pb:
                pb = cb
            if cn > pn:
                pn = cn

        def read() -> Tuple[int, ...]:
            wait_token(tokens.pop)
            try:
                settle()
                values = cb, cn, pb, pn, tb, tn
            finally:
                tokens.append(True)
            return values

        def counting(up: Callable[..., int]) -> Callable[..., int]:
            """An allocation through ``up(bytes, alignment, stream)``, counted: the one body of
            ``allocate_async`` and of the synchronous ``allocate``."""

            def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
                nonlocal cb, cn, pb, pn, tb, tn
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
                                cb += bytes - freed
                            else:  # a refused free counted back, and this allocation
                                cb += ~freed + bytes
                                cn += 2
                            if cb > pb or cn > pn:  # maybe a peak: every other entry first
                                settle()
                    else:
                        cb += bytes
                        cn += 1
                        if cn > pn:
                            pn = cn
                        if cb > pb:
                            pb = cb
                    tb += bytes
                    tn += 1
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

        def snapshot() -> Statistics:
            return Statistics(*read())

        def push() -> Statistics:
            nonlocal cb, cn, pb, pn, tb, tn
            with stack_lock:
                wait_token(tokens.pop)
                try:
                    settle()
                    before = cb, cn, pb, pn, tb, tn
                    cb = cn = pb = pn = tb = tn = 0
                finally:
                    tokens.append(True)
                stack.append(before)
            return Statistics(*before)

        def pop() -> Statistics:
            nonlocal cb, cn, pb, pn, tb, tn
            with stack_lock:
                if not stack:
                    raise IndexError("pop_counters: no counters were pushed")
                lcb, lcn, lpb, lpn, ltb, ltn = stack.pop()
                wait_token(tokens.pop)
                try:
                    settle()
                    popped = cb, cn, pb, pn, tb, tn
                    pb = max(lpb, lcb + pb)
                    pn = max(lpn, lcn + pn)
                    cb, cn = lcb + cb, lcn + cn
                    tb, tn = ltb + tb, ltn + tn
                finally:
                    tokens.append(True)
            return Statistics(*popped)

        if must_check_arguments(ref):  # a user-written upstream: check everything first
            allocate, deallocate, allocate_async, deallocate_async = checking_first(
                allocate, deallocate, allocate_async, deallocate_async)
        self._snapshot = snapshot
        self._mutex = mutex
        self._push = push
        self._pop = pop
        self._depth = stack.__len__
        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate)

    @property
    def statistics(self) -> Statistics:
        """The current counters (of the innermost pushed set)."""
        return self._snapshot()

    #: RMM's name for :attr:`statistics`.
    allocation_counts = statistics

    def push_counters(self) -> Statistics:
        """Start a fresh set of counters; returns the statistics before the push."""
        return self._push()

    def pop_counters(self) -> Statistics:
        """End the innermost set of counters, fold it into the one below and return it;
        ``IndexError`` when none was pushed."""
        return self._pop()

    @property
    def depth(self) -> int:
        """How many counter sets are pushed (0 when only the base set exists)."""
        return self._depth()

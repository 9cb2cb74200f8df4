"""``StatisticsResource``: counts the bytes and allocations that pass through it."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, List, Tuple

from ..properties import DEFAULT_ALIGNMENT
from ._base import (FAST_ALIGNMENTS, MAX_PTR, MAX_SIZE, BoundAdaptor, check_args, check_free_args,
                    checks_arguments, upstream_calls)

__all__ = ["StatisticsResource", "Statistics"]

_FOLD_AT = 4096  # log entries that make an allocation fold the log into the counters


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

    def __init__(self, upstream: Any) -> None:
        ref = self._set_upstream(upstream)
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        """The hot paths take no lock: each call appends one entry to a log (``list.append``
        is atomic): ``n + 1`` for an allocation of n bytes, ``-(n + 1)`` for a deallocation.
        Readers, and every ``_FOLD_AT`` allocations, fold the log into the counters under a
        lock, in log order.
        The log order is a valid order of the operations (an allocation is logged after the
        upstream made it, a deallocation before the upstream frees it), so current and peak
        are exact for that order and never show more than is really outstanding."""
        lock = threading.Lock()
        log: List[int] = []
        append = log.append
        undone: List[int] = []   # refused deallocations (counted back, but not in totals)
        aligned = FAST_ALIGNMENTS.get
        own = not checks_arguments(ref)  # False: the upstream validates, keep only our needs
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        stack: List[Tuple[int, ...]] = []
        cb = cn = pb = pn = tb = tn = 0   # current/peak/total bytes (b) and counts (n)

        def fold() -> None:
            """Apply the log to the counters (lock held)."""
            nonlocal cb, cn, pb, pn, tb, tn
            k = len(log)
            if not k:
                return
            batch = log[:k]
            del log[:k]      # entries appended meanwhile stay, after position k
            b, n, peak_b, peak_n = cb, cn, pb, pn
            allocated = adds = 0
            for x in batch:
                if x > 0:
                    x -= 1
                    b += x
                    n += 1
                    allocated += x
                    adds += 1
                    if b > peak_b:
                        peak_b = b
                    if n > peak_n:
                        peak_n = n
                else:
                    b += x + 1
                    n -= 1
            if undone:  # counted back as allocations, but they were not new allocations
                n_undone = len(undone)
                given = undone[:n_undone]
                del undone[:n_undone]
                allocated -= sum(given)
                adds -= n_undone
            cb, cn, pb, pn = b, n, peak_b, peak_n
            tb += allocated
            tn += adds

        def fold_some() -> None:
            with lock:
                fold()

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if own and (type(bytes) is not int or not 0 <= bytes <= MAX_SIZE
                        or aligned(alignment) is not alignment):
                bytes, alignment = check_args(bytes, alignment)
            ptr = up_alloc(bytes, alignment)
            append(bytes + 1)
            if len(log) > _FOLD_AT:
                fold_some()
            return ptr

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if type(bytes) is not int or bytes < 0 or own and (
                    type(ptr) is not int or not 0 <= ptr <= MAX_PTR or bytes > MAX_SIZE
                    or aligned(alignment) is not alignment):
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            append(-1 - bytes)
            try:
                up_dealloc(ptr, bytes, alignment)
            except BaseException:
                with lock:  # a fold sees both or neither
                    append(bytes + 1)
                    undone.append(bytes)
                raise

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            if own and (type(bytes) is not int or not 0 <= bytes <= MAX_SIZE
                        or aligned(alignment) is not alignment):
                bytes, alignment = check_args(bytes, alignment)
            ptr = up_alloc_async(bytes, alignment, stream)
            append(bytes + 1)
            if len(log) > _FOLD_AT:
                fold_some()
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if type(bytes) is not int or bytes < 0 or own and (
                    type(ptr) is not int or not 0 <= ptr <= MAX_PTR or bytes > MAX_SIZE
                    or aligned(alignment) is not alignment):
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            append(-1 - bytes)
            try:
                up_dealloc_async(ptr, bytes, alignment, stream)
            except BaseException:
                with lock:  # a fold sees both or neither
                    append(bytes + 1)
                    undone.append(bytes)
                raise

        def snapshot() -> Statistics:
            with lock:
                fold()
                return Statistics(cb, cn, pb, pn, tb, tn)

        def push() -> Statistics:
            nonlocal cb, cn, pb, pn, tb, tn
            with lock:
                fold()
                before = Statistics(cb, cn, pb, pn, tb, tn)
                stack.append((cb, cn, pb, pn, tb, tn))
                cb = cn = pb = pn = tb = tn = 0
                return before

        def pop() -> Statistics:
            nonlocal cb, cn, pb, pn, tb, tn
            with lock:
                if not stack:
                    raise IndexError("pop_counters: no counters were pushed")
                fold()
                popped = Statistics(cb, cn, pb, pn, tb, tn)
                lcb, lcn, lpb, lpn, ltb, ltn = stack.pop()
                pb = max(lpb, lcb + pb)
                pn = max(lpn, lcn + pn)
                cb, cn = lcb + cb, lcn + cn
                tb, tn = ltb + tb, ltn + tn
                return popped

        self._snapshot = snapshot
        self._push = push
        self._pop = pop
        self._depth = stack.__len__
        self._install(allocate, deallocate, allocate_async, deallocate_async)

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

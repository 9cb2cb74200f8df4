"""``TrackingResource``: remembers every outstanding allocation (and, on request, where it
was made)."""
from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..properties import DEFAULT_ALIGNMENT
from ._base import BoundAdaptor, check_args, check_free, check_ptr, check_stream, upstream_calls

__all__ = ["TrackingResource", "TrackedAllocation"]


@dataclass(frozen=True)
class TrackedAllocation:
    """One outstanding allocation: pointer, size, alignment, stream handle (None for a
    synchronous allocation) and the stack where it was made (None unless captured)."""

    ptr: int
    size: int
    alignment: int
    stream: Any = None
    stack: Optional[traceback.StackSummary] = None


class TrackingResource(BoundAdaptor):
    """``TrackingResource(upstream, capture_stacks=False)``: tracks outstanding allocations.

    ``outstanding()`` returns ``{ptr: TrackedAllocation}``; ``get_allocated_bytes()`` the sum of
    their sizes; ``report()`` a readable list (with stacks when ``capture_stacks`` is true).
    Deallocating a pointer this adaptor did not hand out, or with another size or alignment,
    raises ``ValueError`` before the upstream is called.  Thread-safe; an async resource when the
    upstream is one; equal to another over an equal upstream with the same setting.
    """

    def __init__(self, upstream: Any, capture_stacks: bool = False) -> None:
        ref = self._set_upstream(upstream)
        if not isinstance(capture_stacks, bool):
            raise TypeError(f"capture_stacks must be a bool, not {type(capture_stacks).__name__}")
        self._capture = capture_stacks
        self._lock = threading.Lock()
        self._live: Dict[int, TrackedAllocation] = {}
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        lock = self._lock
        live = self._live
        capture = self._capture
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)

        def record(ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
            stack = (traceback.StackSummary.from_list(traceback.extract_stack()[:-2])
                     if capture else None)  # without record() and allocate()
            with lock:
                live[ptr] = TrackedAllocation(ptr, nbytes, alignment, stream, stack)

        def claim(ptr: Any, nbytes: Any, alignment: Any) -> Tuple[Any, ...]:
            """Check and stop tracking ``ptr`` (atomically, so that two threads can never both
            free it); returns the checked values and the record to restore on failure."""
            ptr = check_ptr(ptr)
            nbytes, alignment = check_args(nbytes, alignment)
            with lock:
                found = live.get(ptr)
                if found is None and not ptr and not nbytes:
                    return ptr, nbytes, alignment, None
                check_free(ptr, None if found is None else found.size, nbytes,
                           "TrackingResource")
                if found.alignment != alignment:
                    raise ValueError(f"ptr={ptr:#x} was allocated with alignment="
                                     f"{found.alignment}, not alignment={alignment}")
                del live[ptr]
            return ptr, nbytes, alignment, found

        def restore(found: Optional[TrackedAllocation]) -> None:
            if found is not None:
                with lock:
                    live[found.ptr] = found

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            bytes, alignment = check_args(bytes, alignment)
            ptr = up_alloc(bytes, alignment)
            if ptr:
                record(ptr, bytes, alignment, None)
            return ptr

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            ptr, bytes, alignment, found = claim(ptr, bytes, alignment)
            try:
                up_dealloc(ptr, bytes, alignment)
            except BaseException:
                restore(found)
                raise

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            bytes, alignment = check_args(bytes, alignment)
            handle = check_stream(stream)
            ptr = up_alloc_async(bytes, alignment, stream)
            if ptr:
                record(ptr, bytes, alignment, handle)
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            check_stream(stream)
            ptr, bytes, alignment, found = claim(ptr, bytes, alignment)
            try:
                up_dealloc_async(ptr, bytes, alignment, stream)
            except BaseException:
                restore(found)
                raise

        self._install(allocate, deallocate, allocate_async, deallocate_async)

    def _settings(self) -> Tuple[Any, ...]:
        return (self._capture,)

    @property
    def capture_stacks(self) -> bool:
        """Whether each allocation's stack is captured."""
        return self._capture

    def outstanding(self) -> Dict[int, TrackedAllocation]:
        """A copy of ``{ptr: TrackedAllocation}`` for every outstanding allocation."""
        with self._lock:
            return dict(self._live)

    def get_allocated_bytes(self) -> int:
        """The sum of the sizes of the outstanding allocations."""
        with self._lock:
            return sum(a.size for a in self._live.values())

    def report(self) -> str:
        """A readable list of the outstanding allocations, oldest first, with their stacks
        when they were captured."""
        allocations = self.outstanding()
        lines = [f"{len(allocations)} outstanding allocations, "
                 f"{sum(a.size for a in allocations.values())} bytes"]
        for a in allocations.values():
            where = "" if a.stream is None else f" on stream {a.stream:#x}"
            lines.append(f"ptr={a.ptr:#x} size={a.size} alignment={a.alignment}{where}")
            if a.stack is not None:
                lines.extend("  " + line.rstrip("\n").replace("\n", "\n  ")
                             for line in a.stack.format())
        return "\n".join(lines)

    #: RMM's name for :meth:`report`.
    get_outstanding_allocations_str = report

    def __repr__(self) -> str:
        return (f"TrackingResource({self._upstream.resource!r}, "
                f"capture_stacks={self._capture})")

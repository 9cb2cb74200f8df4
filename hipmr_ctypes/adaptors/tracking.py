"""``TrackingResource``: remembers every outstanding allocation (and, on request, where it
was made)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ._base import (MAX_PTR, SYNC, BoundAdaptor, check_args, check_free_args, check_stream,
                    check_upstream_ptr, claim, duplicate, must_check_arguments, upstream_calls)

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
        self._live: Dict[int, Tuple[Any, ...]] = {}
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        """The hot paths take no lock: ``live[ptr] = record`` records an allocation and
        ``live.pop(ptr)`` claims one for its free, each one atomic operation on a dict, so
        two threads can never both free a pointer.  A free whose size or alignment does not
        match is put back before the precise error is raised."""
        live = self._live                 # ptr -> (size, alignment, stream handle, stack)
        live_pop = live.pop
        setdefault = live.setdefault
        capture = self._capture
        must_check = must_check_arguments(ref)  # a user-written upstream: check everything
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)

        def stack(ours: int) -> Optional[traceback.StackSummary]:
            """The caller's stack, without our own ``ours`` innermost frames."""
            return traceback.StackSummary.from_list(traceback.extract_stack()[:-ours])

        def give_back(stream: Any) -> Any:
            if stream is SYNC:
                return up_dealloc
            return lambda p, n, a: up_dealloc_async(p, n, a, stream)

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            """(``stream`` SYNC: the synchronous ``allocate``.)"""
            if must_check or type(bytes) is not int or type(alignment) is not int:
                bytes, alignment = check_args(bytes, alignment)
            if stream is SYNC:
                ptr = up_alloc(bytes, alignment)
                handle = None
            else:
                handle = (stream if type(stream) is int and 0 <= stream <= MAX_PTR
                          else check_stream(stream))
                ptr = up_alloc_async(bytes, alignment, stream)
            if must_check:  # a user-written upstream: check what it returned
                ptr = check_upstream_ptr(ptr, bytes, alignment, give_back(stream),
                                         "TrackingResource")
            if ptr:
                record = (bytes, alignment, handle,
                          stack(3 if stream is SYNC else 2) if capture else None)
                if setdefault(ptr, record) is not record:  # handed out twice: keep the record
                    raise duplicate("TrackingResource", ptr)
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            """(``stream`` SYNC: the synchronous ``deallocate``.)"""
            if stream is not SYNC and (type(stream) is not int or not 0 <= stream <= MAX_PTR):
                check_stream(stream)  # before anything is claimed
            found = live_pop(ptr, None) if type(ptr) is int else None
            if (found is None or found[0] != bytes or found[1] != alignment
                    or type(bytes) is not int or type(alignment) is not int):
                if found is not None:  # put it back: the checked path decides
                    live[ptr] = found
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
                found = claim(live, ptr, bytes, 0, "TrackingResource")
                if found is None:
                    return
                if found[1] != alignment:
                    live[ptr] = found
                    raise ValueError(f"ptr={ptr:#x} was allocated with alignment={found[1]}, "
                                     f"not alignment={alignment}")
            try:
                if stream is SYNC:
                    up_dealloc(ptr, bytes, alignment)
                else:
                    up_dealloc_async(ptr, bytes, alignment, stream)
            except BaseException:
                live[ptr] = found
                raise

        self._build(allocate_async, deallocate_async)

    def _settings(self) -> Tuple[Any, ...]:
        return (self._capture,)

    @property
    def capture_stacks(self) -> bool:
        """Whether each allocation's stack is captured."""
        return self._capture

    def outstanding(self) -> Dict[int, TrackedAllocation]:
        """A copy of ``{ptr: TrackedAllocation}`` for every outstanding allocation."""
        live = self._live.copy()  # atomic snapshot: the hot paths take no lock
        return {ptr: TrackedAllocation(ptr, *record) for ptr, record in live.items()}

    def get_allocated_bytes(self) -> int:
        """The sum of the sizes of the outstanding allocations."""
        return sum(record[0] for record in self._live.copy().values())

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

    def get_outstanding_allocations_str(self) -> str:
        """RMM's text: one line ``0x7f00...: 256 B`` per outstanding allocation (followed by
        `` : callstack:`` and the stack when captured); the empty string when nothing is
        outstanding, so ``if mr.get_outstanding_allocations_str():`` is a leak check.  See
        :meth:`report` for a summary with sizes, alignments and streams."""
        lines = []
        for a in self.outstanding().values():
            line = f"{a.ptr:#x}: {a.size} B"
            if a.stack is not None:
                line += " : callstack:\n" + "".join(a.stack.format()).rstrip("\n")
            lines.append(line + "\n")
        return "".join(lines)

    def __repr__(self) -> str:
        return (f"TrackingResource({self._upstream.resource!r}, "
                f"capture_stacks={self._capture})")

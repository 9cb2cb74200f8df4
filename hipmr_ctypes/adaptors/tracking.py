"""``TrackingResource``: remembers every outstanding allocation (and, on request, where it
was made)."""
from __future__ import annotations

import operator
import traceback
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..properties import DEFAULT_ALIGNMENT
from .._checks import check_args, check_free_args, check_stream
from .._stream_order import SYNC
from ._base import BoundAdaptor
from ._checked import check_upstream_ptr, claim, duplicate, must_check_arguments, upstream_calls

__all__ = ["TrackingResource", "TrackedAllocation"]


def _full(size: int) -> Tuple[Any, ...]:
    """The record that a record made of its size alone stands for."""
    return (size, DEFAULT_ALIGNMENT, 0, None)


def _stack(ours: int) -> traceback.StackSummary:
    """The caller's stack, without our own ``ours`` innermost frames."""
    return traceback.StackSummary.from_list(traceback.extract_stack()[:-ours])


def _key(ptr: Any) -> Any:
    """The int key of the record a free popped with ``ptr`` (which equals it): ``ptr`` itself
    when it is an int, else the int it converts to (a float or an integer-like that hashes as
    the key it equals)."""
    if type(ptr) is int:
        return ptr
    for convert in (operator.index, int):
        try:
            key = convert(ptr)
        except Exception:  # noqa: BLE001 - try the next conversion
            continue
        if type(key) is int and key == ptr:
            return key
    return ptr


class _Books:
    """What the checked paths of a :class:`TrackingResource` use (its records, its setting,
    its upstream's calls), and those paths."""

    __slots__ = ("live", "capture", "must_check", "calls")

    def __init__(self, live: Dict[int, Any], capture: bool, ref: Any) -> None:
        self.live = live            # ptr -> (size, alignment, handle, stack) or size
        self.capture = capture
        self.must_check = must_check_arguments(ref)  # a user-written upstream
        self.calls = upstream_calls(ref)

    def allocate_checked(self, bytes: Any, alignment: Any, stream: Any) -> int:
        """The checked allocation: every call over a user-written upstream (whose address is
        checked too, and refused if it is live already) or with stacks captured, and the
        calls whose size or alignment is not an int.  Called from the installed method
        itself: the stack drops those two frames."""
        bytes, alignment = check_args(bytes, alignment)
        handle = None if stream is SYNC else check_stream(stream)
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = self.calls
        ptr = (up_alloc(bytes, alignment) if stream is SYNC
               else up_alloc_async(bytes, alignment, stream))
        if self.must_check:
            give_back = up_dealloc if stream is SYNC else (
                lambda p, n, a: up_dealloc_async(p, n, a, stream))
            ptr = check_upstream_ptr(ptr, bytes, alignment, give_back, "TrackingResource")
        if ptr:
            record = (bytes, alignment, handle, _stack(3) if self.capture else None)
            if not self.must_check:
                self.live[ptr] = record
            elif self.live.setdefault(ptr, record) is not record:
                raise duplicate("TrackingResource", ptr)  # handed out twice: keep it
        return ptr

    def free_checked(self, ptr: Any, bytes: Any, alignment: Any, stream: Any,
                      found: Any) -> None:
        """The checked free, for what the fast test did not pass (``found``: what it popped,
        or None), and every free over a user-written upstream: put back, check every
        argument, claim, then free."""
        live = self.live
        if found is not None:  # put it back: the checked path decides
            live[_key(ptr)] = found
        if stream is not SYNC:
            check_stream(stream)  # before anything is claimed
        ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
        found = claim(live, ptr, bytes, 0, "TrackingResource")
        if found is None:
            return
        if type(found) is int:
            found = _full(found)
        if found[1] != alignment:
            live[ptr] = found
            raise ValueError(f"ptr={ptr:#x} was allocated with alignment={found[1]}, "
                             f"not alignment={alignment}")
        _, up_dealloc, _, up_dealloc_async = self.calls
        try:
            if stream is SYNC:
                up_dealloc(ptr, bytes, alignment)
            else:
                up_dealloc_async(ptr, bytes, alignment, stream)
        except BaseException:
            live[ptr] = found
            raise


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

    #: hands out its upstream's pointers unchanged (read by IPC: see Adaptor)
    passes_pointers_through = True

    def __init__(self, upstream: Any, capture_stacks: bool = False) -> None:
        ref = self._set_upstream(upstream)
        if not isinstance(capture_stacks, bool):
            raise TypeError(f"capture_stacks must be a bool, not {type(capture_stacks).__name__}")
        self._capture = capture_stacks
        self._live: Dict[int, Any] = {}  # ptr -> record (see _bind)
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        """Invariants:

        * the hot paths take no lock: ``live[ptr] = record`` records an allocation and
          ``live.pop(ptr)`` claims one for its free (each one atomic dict operation), so two
          threads can never both free a pointer;
        * a record is ``(size, alignment, stream handle, stack)``, or, for the usual
          allocation (default alignment, stream 0, no stack), the size alone (``_full``);
        * a free that does not match (size, alignment, a pointer not live or not hashable)
          puts back what it popped and takes the checked path;
        * over the package's own resources (which check every argument before they change
          anything and never hand out a live address twice) a record is claimed before the
          upstream frees and put back if it refuses; over a user-written upstream every
          argument and every returned address is checked first, and an address handed out
          twice is refused."""
        books = _Books(self._live, self._capture, ref)
        must_check = books.must_check
        # the choice, once: checked allocations over a user-written upstream or when stacks
        # are captured, checked frees over a user-written upstream
        checked_allocations = must_check or self._capture
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = books.calls
        live = books.live
        live_pop = live.pop
        allocate_checked = books.allocate_checked
        free_checked = books.free_checked

        if checked_allocations:
            def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
                return allocate_checked(bytes, alignment, stream)

            def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
                return allocate_checked(bytes, alignment, SYNC)
        else:
            def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
                if type(bytes) is not int or type(stream) is not int:
                    return allocate_checked(bytes, alignment, stream)  # (converts the stream)
                if alignment is DEFAULT_ALIGNMENT:
                    ptr: int = up_alloc_async(bytes, alignment, stream)  # it checks an int stream
                    if ptr:
                        live[ptr] = bytes if stream == 0 else (bytes, alignment, stream, None)
                    return ptr
                if type(alignment) is not int:
                    return allocate_checked(bytes, alignment, stream)
                ptr = up_alloc_async(bytes, alignment, stream)
                if ptr:
                    live[ptr] = (bytes, alignment, stream, None)
                return ptr

            def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
                if (type(bytes) is not int
                        or alignment is not DEFAULT_ALIGNMENT and type(alignment) is not int):
                    return allocate_checked(bytes, alignment, SYNC)
                ptr: int = up_alloc(bytes, alignment)
                if ptr:
                    live[ptr] = (bytes, alignment, None, None)
                return ptr

        if must_check:
            def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
                free_checked(ptr, bytes, alignment, stream, None)

            def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
                free_checked(ptr, bytes, alignment, SYNC, None)
        else:
            def freeing(up: Any) -> Any:
                """A free through ``up(ptr, bytes, alignment, stream)``: the one body of
                ``deallocate_async`` and of the synchronous ``deallocate``."""

                def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
                    try:  # not live (KeyError) or not hashable: the checked path says which
                        found = live_pop(ptr)
                    except Exception:
                        return free_checked(ptr, bytes, alignment, stream, None)
                    try:  # the record matches by value; the package's upstream checks types
                        if found is bytes:  # a size alone (default alignment, stream 0)
                            if alignment == DEFAULT_ALIGNMENT:
                                up(ptr, bytes, alignment, stream)
                                return
                        elif type(found) is int:  # a size alone
                            if found == bytes and alignment == DEFAULT_ALIGNMENT:
                                up(ptr, bytes, alignment, stream)
                                return
                        elif found[0] == bytes and found[1] == alignment:
                            up(ptr, bytes, alignment, stream)
                            return
                    except BaseException:  # refused, or not even comparable: put it back
                        live[_key(ptr)] = found
                        raise
                    free_checked(ptr, bytes, alignment, stream, found)
                return deallocate_async

            deallocate_async = freeing(up_dealloc_async)
            deallocate_sync = freeing(lambda ptr, nbytes, alignment, _: up_dealloc(ptr, nbytes,
                                                                                   alignment))

            def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
                deallocate_sync(ptr, bytes, alignment, SYNC)

        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate)

    def _settings(self) -> Tuple[Any, ...]:
        return (self._capture,)

    @property
    def capture_stacks(self) -> bool:
        """Whether each allocation's stack is captured."""
        return self._capture

    def outstanding(self) -> Dict[int, TrackedAllocation]:
        """A copy of ``{ptr: TrackedAllocation}`` for every outstanding allocation."""
        live = self._live.copy()  # atomic snapshot: the hot paths take no lock
        return {ptr: TrackedAllocation(ptr, *(_full(record) if type(record) is int else record))
                for ptr, record in live.items()}

    def get_allocated_bytes(self) -> int:
        """The sum of the sizes of the outstanding allocations."""
        return sum(record if type(record) is int else record[0]
                   for record in self._live.copy().values())

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

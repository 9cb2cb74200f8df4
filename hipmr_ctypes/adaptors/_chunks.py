"""What the two sub-allocators (pool, fixed-size) share: the chunks they hold from the
upstream (the check of a new one, their return, the finalizer that gives them all back) and
their refusal in a forked child.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Tuple

from .._exit import finalizer
from .._limits import MAX_ADDRESS
from .._locks import on_forked_child
from .._stream_order import wait_all
from ..errors import ForkedChildError
from ..properties import DEFAULT_ALIGNMENT

__all__ = ["round_up", "give_back_chunks", "return_chunks", "overlaps", "check_upstream_chunk",
           "refuse_in_forked_child"]


def round_up(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of the power of two ``alignment``."""
    return (value + alignment - 1) & -alignment


@finalizer
def give_back_chunks(up_dealloc: Callable[..., Any], chunks: Dict[int, int]) -> None:
    """Finalizer of the sub-allocators: return every chunk ``{start: size}`` to the upstream
    (with alignment 256) when the resource is garbage-collected; errors are ignored (the
    interpreter may be exiting).  Never run at exit (see ``hipmr_ctypes._exit``)."""
    for start, size in list(chunks.items()):
        try:
            up_dealloc(start, size, DEFAULT_ALIGNMENT)
        except Exception:
            pass
    chunks.clear()


def return_chunks(lock: Any, chunks: List[Tuple[int, int]], events: List[Any],
                  up_dealloc: Callable[..., Any],
                  keep: Callable[[List[Tuple[int, int]], bool], None],
                  returning: Dict[int, int]) -> int:
    """Give ``chunks`` ``[(start, size)]``, already out of the sub-allocator's books, back to
    the upstream (with alignment 256); returns the bytes given back.

    Called with ``lock`` held, and returns with it held; the lock is let go meanwhile, while
    the host waits for ``events`` (recorded on the streams that freed into the chunks; closed
    here) and while the upstream frees (both may block), so that other threads keep
    allocating.  Until the upstream is asked to take a chunk back it stays in ``returning``
    (``{start: size}``), which growth checks as it checks the books (an upstream that hands
    out a chunk it has not got back yet is refused).  If a wait or a free raises,
    ``keep(rest, waited)`` takes back, under the lock, the chunks the upstream did not get
    (``waited``: the events all completed), but for one that overlaps a chunk the pool got
    meanwhile (the upstream handed it out again: it is the upstream's now); the error
    propagates."""
    returning.update(chunks)
    lock.release()
    given = done = 0
    waited = False
    try:
        wait_all(events)
        waited = True
        for start, size in chunks:
            returning.pop(start, None)   # the upstream may hand it out again from now on
            up_dealloc(start, size, DEFAULT_ALIGNMENT)
            given += size
            done += 1
    except BaseException:
        lock.acquire()
        rest = chunks[done:]
        for start, _ in rest:
            returning.pop(start, None)
        keep(rest, waited)
        raise
    lock.acquire()
    return given


def overlaps(chunks: Dict[int, int], start: int, size: int) -> bool:
    """True when ``[start, start + size)`` overlaps a chunk of ``{start: size}``."""
    end = start + size
    return any(s < end and start < s + n for s, n in chunks.items())


def check_upstream_chunk(ptr: Any, size: int, chunks: Dict[int, int], give_back: Any,
                         owner: str, returning: Dict[int, int]) -> int:
    """The one check of a chunk an upstream returned for ``size`` bytes (a sub-allocator's
    slow path): a non-null int address aligned to 256 whose ``size`` bytes fit below 2**64
    and overlap none of ``chunks`` nor of ``returning`` (chunks on their way back to the
    upstream: see :func:`return_chunks`) (an upstream that hands out an address twice would
    otherwise give one block to two users).  Anything else is given back when it can be
    (never a pointer overlapping a chunk already held: that would free live memory) and
    refused with ValueError."""
    # a copy: a thread returning chunks takes them out of ``returning`` without the lock,
    # and iterating the dict itself meanwhile would raise RuntimeError (dict.copy is atomic)
    returning = returning.copy()
    if (type(ptr) is int and 0 < ptr and ptr + size <= MAX_ADDRESS + 1
            and not ptr & (DEFAULT_ALIGNMENT - 1) and not overlaps(chunks, ptr, size)
            and not overlaps(returning, ptr, size)):
        return ptr
    if type(ptr) is int and 0 < ptr <= MAX_ADDRESS and (
            overlaps(chunks, ptr, size) or overlaps(returning, ptr, size)):
        problem = "it overlaps memory the upstream handed out before and that is still held"
    else:
        problem = f"a sub-allocator needs a non-null address aligned to {DEFAULT_ALIGNMENT}"
        if type(ptr) is int and 0 < ptr <= MAX_ADDRESS:
            try:
                give_back(ptr, size, DEFAULT_ALIGNMENT)
            except Exception:  # noqa: BLE001 - the refusal below is the error to report
                pass
    raise ValueError(f"{owner}: the upstream returned {ptr!r} for {size} bytes: {problem}")


#: the pool and fixed-size resources of this process, weakly, each with its state: in a child
#: forked after the runtime started they refuse every call (the blocks they cache are the
#: parent's memory)
_SUB_ALLOCATORS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def refuse_in_forked_child(resource: Any, state: Any) -> None:
    """Make ``resource`` (a sub-allocator) refuse every call in a child forked after the
    runtime started (see ``hipmr_ctypes._hip.fork``).  ``state.refuse_in_child()`` empties
    its free lists and its table of live blocks and makes its slow paths raise: the hot
    paths that refs, ``Buffer`` and the adaptors serving its lists themselves bound before the
    fork then miss, and reach those slow paths."""
    _SUB_ALLOCATORS[resource] = state


def _refusal() -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ForkedChildError()
    return refused


def _refuse_sub_allocators() -> None:
    for resource, state in list(_SUB_ALLOCATORS.items()):
        state.refuse_in_child()
        resource._install(_refusal(), _refusal(), _refusal(), _refusal())


on_forked_child(_refuse_sub_allocators)

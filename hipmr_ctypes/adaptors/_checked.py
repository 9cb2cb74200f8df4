"""The checked paths adaptors share: whether an adaptor must check every argument itself (a
user-written upstream), the wrappers that do, the check of what an upstream returned, and the
checked claim of a record for a free.  The argument checks themselves are
:mod:`hipmr_ctypes._checks`'.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Tuple

from .._checks import check_args, check_free, check_free_args, check_stream
from .._limits import MAX_ADDRESS
from ..properties import DEFAULT_ALIGNMENT
from ..resource_refs import resource_ref

if TYPE_CHECKING:  # a ref with any properties, for annotations
    from typing_extensions import Unpack
    AnyRef = resource_ref[Unpack[Tuple[Any, ...]]]

__all__ = ["must_check_arguments", "upstream_calls", "checked_frees", "checking_first",
           "check_upstream_ptr", "duplicate", "claim"]


def must_check_arguments(ref: resource_ref) -> bool:
    """True when an adaptor over ``ref`` must check every argument itself: the resource behind
    it is not one of the package's own, which validate every argument (sizes, alignments,
    pointers) before they change anything.  Over those, an adaptor keeps only the checks its own
    bookkeeping needs."""
    return getattr(type(ref.resource), "_checks_arguments", False) is not True


def upstream_calls(ref: AnyRef) -> Tuple[Callable[..., int], Callable[..., None], Any, Any]:
    """``(allocate, deallocate, allocate_async, deallocate_async)`` of an upstream ref, bound
    once (the async ones are None for a synchronous ref)."""
    return (ref.allocate, ref.deallocate, getattr(ref, "allocate_async", None),
            getattr(ref, "deallocate_async", None))


def checked_frees(ref: AnyRef) -> Tuple[Any, Any]:
    """``deallocate`` / ``deallocate_async`` that check their arguments, then call the
    upstream's: for adaptors that do nothing of their own when memory is freed.  Over one of
    the package's own resources, which check every argument themselves, the upstream's own
    (bound) methods: the adaptor then adds nothing to a free."""
    if not must_check_arguments(ref):
        return ref.deallocate, getattr(ref, "deallocate_async", None)
    up_dealloc = ref.deallocate
    up_dealloc_async = getattr(ref, "deallocate_async", None)

    def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        up_dealloc(*check_free_args(ptr, bytes, alignment))

    def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        check_stream(stream)
        up_dealloc_async(*check_free_args(ptr, bytes, alignment), stream)  # type: ignore[misc]

    return deallocate, deallocate_async


def checking_first(allocate: Callable[..., int], deallocate: Callable[..., None],
                   allocate_async: Any, deallocate_async: Any) -> Tuple[Any, Any, Any, Any]:
    """``(allocate, deallocate, allocate_async, deallocate_async)`` that check every argument
    they are given (sizes, alignments, pointers: :func:`check_args`, :func:`check_free_args`),
    then call the given fast paths with the checked values: what an adaptor over a
    user-written upstream installs (:func:`must_check_arguments`), so that its fast paths
    test only what their own bookkeeping needs and carry no test of the upstream's kind.  The
    async pair is None where the given one is."""

    def checked_allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        return allocate(*check_args(bytes, alignment))

    def checked_deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        deallocate(*check_free_args(ptr, bytes, alignment))

    def checked_allocate_async(bytes: int, alignment: int, stream: Any) -> int:
        bytes, alignment = check_args(bytes, alignment)
        ptr: int = allocate_async(bytes, alignment, stream)
        return ptr

    def checked_deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
        deallocate_async(ptr, bytes, alignment, stream)

    return (checked_allocate, checked_deallocate,
            None if allocate_async is None else checked_allocate_async,
            None if deallocate_async is None else checked_deallocate_async)


def check_upstream_ptr(ptr: Any, nbytes: int, alignment: int, give_back: Any,
                       owner: str) -> int:
    """The one check of what a user-written upstream returned for ``(nbytes, alignment)``
    (the package's own resources are trusted): an int address whose ``nbytes`` fit below
    2**64, aligned to ``alignment``, non-null unless ``nbytes`` is 0.  Anything else is
    given back when it is an address (with the arguments it was asked for) and refused:
    TypeError for something that is not an int, ValueError otherwise."""
    if (type(ptr) is int and 0 <= ptr and ptr + nbytes <= MAX_ADDRESS + 1
            and not ptr & (alignment - 1) and (ptr or not nbytes)):
        return ptr
    if type(ptr) is int and 0 < ptr <= MAX_ADDRESS:
        try:
            give_back(ptr, nbytes, alignment)
        except Exception:  # noqa: BLE001 - the refusal below is the error to report
            pass
        problem = (f"it is not aligned to {alignment}" if ptr & (alignment - 1)
                   else "its bytes run past the end of the address space")
    elif type(ptr) is int and ptr == 0:
        problem = "a null pointer for a non-empty allocation"
    elif type(ptr) is int:
        problem = "not an address in [0, 2**64)"
    else:
        raise TypeError(f"{owner}: the pointer returned by the upstream's allocate for "
                        f"bytes={nbytes} is {ptr!r}, not an int address")
    raise ValueError(f"{owner}: the pointer returned by the upstream's allocate for "
                     f"bytes={nbytes}, alignment={alignment} is {ptr!r}: {problem}")


def duplicate(owner: str, ptr: int) -> ValueError:
    """The error for an upstream that returned an address it had handed out before and that
    is still live (never given back: that would free the live allocation)."""
    return ValueError(f"{owner}: the upstream returned ptr={ptr:#x}, which it handed out "
                      "before and which is still live: the upstream is broken")


def claim(records: Dict[int, Any], ptr: int, nbytes: int, size_at: int, owner: str,
          required: bool = True) -> Any:
    """The checked claim of ``ptr``'s record for its free (the slow path of a lock-free
    ``records.pop(ptr)``; the arguments are already checked): the record, taken with one
    ``dict.pop`` so that two threads can never both claim it.  ``record[size_at]`` (or the
    record itself, when it is an int) is the size it was allocated with: another ``nbytes`` is
    a ValueError, and so is a pointer with no record, unless it is the no-op free of ``(0, 0)``
    or ``required`` is false (then None)."""
    found = records.get(ptr)
    if found is None and (not required or (not ptr and not nbytes)):
        return None
    check_free(ptr, found if found is None or type(found) is int else found[size_at], nbytes,
               owner)
    found = records.pop(ptr, None)
    if found is None:  # another thread freed it meanwhile
        check_free(ptr, None, nbytes, owner)
    return found

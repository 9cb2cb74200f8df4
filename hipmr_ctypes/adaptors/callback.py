"""``CallbackResource``: a resource made of plain functions."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..properties import DEFAULT_ALIGNMENT, Property
from .._checks import (FAST_ALIGNMENTS, MAX_SIZE, check_args, check_callable, check_free_args,
                       check_stream)
from .._limits import MAX_ADDRESS
from ._base import BoundMethods
from ._checked import check_upstream_ptr

__all__ = ["CallbackResource"]


class CallbackResource(BoundMethods):
    """``CallbackResource(allocate, deallocate, allocate_async=None, deallocate_async=None,
    properties=())``: a resource whose calls go to the given functions.

    ``allocate(bytes, alignment) -> ptr`` and ``deallocate(ptr, bytes, alignment)``; with both
    ``allocate_async(bytes, alignment, stream) -> ptr`` and ``deallocate_async(ptr, bytes,
    alignment, stream)`` (``stream`` is passed as an int handle) it is an async resource.
    ``properties``: the property classes it declares.  Sizes and alignments are checked before
    a function is called; what ``allocate`` returns must be an int address (0 only for 0
    bytes is up to the function).  An exception a function raises comes through unchanged
    (RMM raises ``RuntimeError``: docs/porting.md).  Equal to another with the same functions
    and properties.
    """

    def __init__(self, allocate: Callable[[int, int], int],
                 deallocate: Callable[[int, int, int], Any],
                 allocate_async: Optional[Callable[[int, int, int], int]] = None,
                 deallocate_async: Optional[Callable[[int, int, int, int], Any]] = None,
                 properties: Tuple[type, ...] = ()) -> None:
        check_callable(allocate, "allocate")
        check_callable(deallocate, "deallocate")
        if (allocate_async is None) != (deallocate_async is None):
            raise TypeError("allocate_async and deallocate_async must be given together")
        if allocate_async is not None:
            check_callable(allocate_async, "allocate_async")
            check_callable(deallocate_async, "deallocate_async")
        if not isinstance(properties, (tuple, list, frozenset, set)):
            raise TypeError(f"properties must be a tuple of property classes, not "
                            f"{type(properties).__name__}")
        for prop in properties:
            if not (isinstance(prop, type) and issubclass(prop, Property)) or prop is Property:
                raise TypeError(f"properties: {prop!r} is not a property class")
        self.properties: Tuple[type, ...] = tuple(dict.fromkeys(properties))
        self._functions = (allocate, deallocate, allocate_async, deallocate_async)
        self._async = allocate_async is not None
        self._bind()

    def _bind(self) -> None:
        """Invariants: every argument is checked before a function is called (inline, the
        checked path when that fails); what ``allocate`` returned is an int address whose
        bytes fit below 2**64, aligned as asked (0 is left to the function), else it is given
        back when it can be and refused (:func:`_refused`)."""
        fn_alloc, fn_dealloc, fn_alloc_async, fn_dealloc_async = self._functions
        aligned = FAST_ALIGNMENTS.get

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if (type(bytes) is not int or not 0 <= bytes <= MAX_SIZE
                    or aligned(alignment) is not alignment):
                bytes, alignment = check_args(bytes, alignment)
            ptr = fn_alloc(bytes, alignment)
            if type(ptr) is int and 0 <= ptr <= MAX_ADDRESS - bytes + 1 \
                    and not ptr & (alignment - 1):
                return ptr
            return _refused(ptr, bytes, alignment, fn_dealloc)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if (type(ptr) is not int or not 0 <= ptr <= MAX_ADDRESS or type(bytes) is not int
                    or not 0 <= bytes <= MAX_SIZE or aligned(alignment) is not alignment):
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            fn_dealloc(ptr, bytes, alignment)

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            if (type(bytes) is not int or not 0 <= bytes <= MAX_SIZE
                    or aligned(alignment) is not alignment):
                bytes, alignment = check_args(bytes, alignment)
            handle = check_stream(stream)
            ptr = fn_alloc_async(bytes, alignment, handle)  # type: ignore[misc]
            if type(ptr) is int and 0 <= ptr <= MAX_ADDRESS - bytes + 1 \
                    and not ptr & (alignment - 1):
                return ptr
            return _refused(ptr, bytes, alignment,
                            lambda p, n, a: fn_dealloc_async(p, n, a, handle))  # type: ignore[misc]

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if (type(ptr) is not int or not 0 <= ptr <= MAX_ADDRESS or type(bytes) is not int
                    or not 0 <= bytes <= MAX_SIZE or aligned(alignment) is not alignment):
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            fn_dealloc_async(ptr, bytes, alignment, check_stream(stream))  # type: ignore[misc]

        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate)

    @property
    def functions(self) -> Tuple[Any, ...]:
        """``(allocate, deallocate, allocate_async, deallocate_async)`` as given."""
        return self._functions

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        # isinstance as well: mypy before 2.0 (Python 3.9's) narrows only through it
        if type(other) is not type(self) or not isinstance(other, type(self)):
            return False
        return (self._functions == other._functions
                and set(self.properties) == set(other.properties))

    def __hash__(self) -> int:
        return hash((type(self), self._functions, frozenset(self.properties)))

    def __repr__(self) -> str:
        names = [getattr(f, "__name__", repr(f)) for f in self._functions if f is not None]
        return f"CallbackResource({', '.join(names)})"


def _refused(ptr: Any, nbytes: int, alignment: int, give_back: Callable[..., Any]) -> int:
    """What a function returned that is not an aligned address whose bytes fit below 2**64:
    given back (through ``give_back(ptr, bytes, alignment)``) when it can be, and refused
    (the one upstream-result check)."""
    return check_upstream_ptr(ptr, nbytes if ptr else 0, alignment, give_back,
                              "CallbackResource")

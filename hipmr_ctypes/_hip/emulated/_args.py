"""Argument handling for the emulated functions.

The emulated functions receive what the real ``ctypes`` functions would receive (see
``docs/internals.md``) and accept the same spellings ctypes accepts for each C type.  Anything
ctypes would reject (a float for a size, a ``c_int`` where ``int*`` of another type is declared,
a string for an output) becomes ``TypeError`` here, which the call wrapper turns into
``hipErrorInvalidValue``; nothing an argument can hold reaches native memory unchecked except a
host pointer, which is trusted exactly as the real runtime trusts it.
"""
from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Sequence, Tuple, Type, TypeVar

from ..._limits import MAX_ADDRESS

__all__ = ["Status", "addr", "extent", "i32", "u32", "u64", "out", "out_array", "char_buffer",
           "int_cell", "MAX_ADDRESS"]

_CArgObject = type(ctypes.byref(ctypes.c_int()))
_SimpleCData = ctypes.c_int.__bases__[0]
_INTEGER_CODES = frozenset("bBhHiIlLqQ")

T = TypeVar("T")


class Status(Exception):
    """Raised inside an emulated call to return the HIP status ``code`` at once."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _int(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, int):  # bool and int subclasses, as ctypes accepts them
        return int(value)
    if isinstance(value, _SimpleCData) and getattr(type(value), "_type_") in _INTEGER_CODES:
        return int(value.value)  # type: ignore[attr-defined]
    raise TypeError(f"expected an integer, got {type(value).__name__}")


def i32(value: Any) -> int:
    """A C ``int`` argument: wrapped to 32 bits and signed, as ctypes converts it."""
    v = _int(value) & 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def u32(value: Any) -> int:
    """A C ``unsigned int`` argument (wrapped to 32 bits, as ctypes converts it)."""
    return _int(value) & 0xFFFFFFFF


def u64(value: Any) -> int:
    """A C ``size_t`` / ``uint64_t`` argument (wrapped to 64 bits, as ctypes converts it)."""
    return _int(value) & MAX_ADDRESS  # a C uint64's bits


#: The interpreter's own errors: never an argument's fault, never a HIP status.
_OWN_ERRORS = {"RecursionError": RecursionError, "MemoryError": MemoryError,
               "KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}


def raise_own_error(exc: BaseException) -> None:
    """Raise the interpreter's own error that ``exc`` carries, if any: ctypes turns any
    exception raised while it converts an argument into ``ArgumentError("argument N: Type:
    message")``, so a ``RecursionError`` at the interpreter's limit (or a ``MemoryError``, an
    interrupt) would otherwise become a HIP status.  Anything else returns."""
    if not isinstance(exc, ctypes.ArgumentError):
        return
    _, _, rest = str(exc).partition(": ")
    name, _, message = rest.partition(": ")
    if name.startswith("<class '") and name.endswith("'>"):   # Python before 3.11's wording
        name = name[8:-2].rpartition(".")[2]
    own = _OWN_ERRORS.get(name)
    if own is not None:
        raise (own(message) if message else own()) from exc


def addr(value: Any) -> int:
    """A ``void*`` / handle argument as an address: int, None, ``c_void_p``, arrays, byref()..."""
    if value is None:
        return 0
    if type(value) is int:
        return value & MAX_ADDRESS
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    if isinstance(value, int):
        return int(value) & MAX_ADDRESS
    if isinstance(value, (float, str, complex)):
        raise TypeError(f"a {type(value).__name__} is not a pointer")
    try:
        return ctypes.cast(value, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError) as exc:
        raise_own_error(exc)
        raise TypeError(f"{type(value).__name__} is not a pointer: {exc}") from None


def extent(value: Any) -> Optional[int]:
    """Bytes available at a pointer argument that carries its own size, else None.

    ctypes arrays, ``byref()`` of any ctypes object and ``bytes`` know their size, so a copy
    can be checked against it; plain addresses cannot.
    """
    if isinstance(value, ctypes.Array):
        return ctypes.sizeof(value)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, _CArgObject):
        inner = getattr(value, "_obj")  # what byref() designates
        return ctypes.sizeof(inner) - ((ctypes.cast(value, ctypes.c_void_p).value or 0)
                                       - ctypes.addressof(inner))
    return None


def _target(obj: Any) -> Any:
    """The ctypes object an output argument designates (instance, ``byref(x)`` or ``pointer(x)``)."""
    if obj is None:
        raise Status(1)
    if isinstance(obj, _CArgObject):
        inner = getattr(obj, "_obj")  # what byref() designates
        if ctypes.cast(obj, ctypes.c_void_p).value != ctypes.addressof(inner):
            raise TypeError("byref() with an offset is not supported by the emulation")
        return inner
    if isinstance(obj, ctypes._Pointer):
        if not obj:
            raise Status(1)  # NULL pointer
        return obj.contents
    return obj


def out(obj: Any, ctype: Type[T]) -> T:
    """The ctypes instance of type ``ctype`` that an output argument designates.

    NULL (None, a NULL pointer) is ``hipErrorInvalidValue``; another type is a TypeError, as
    ctypes raises for ``POINTER(ctype)``.
    """
    target = _target(obj)
    if not isinstance(target, ctype):
        raise TypeError(f"expected a {ctype.__name__} instance, got {type(target).__name__}")
    return target


def out_array(obj: Any, ctype: Type[T], count: int) -> Sequence[T]:
    """``count`` structures of type ``ctype`` from an instance or a ctypes array of them."""
    target = _target(obj)
    if isinstance(target, ctype):
        items: List[T] = [target]
    elif isinstance(target, ctypes.Array) and issubclass(getattr(type(target), "_type_"), ctype):
        items = target  # type: ignore[assignment]
    else:
        raise TypeError(f"expected {ctype.__name__} or an array of them, "
                        f"got {type(target).__name__}")
    if count > len(items):
        raise Status(1)
    return items[:count]


def char_buffer(obj: Any) -> Tuple[int, int]:
    """(address, capacity) of a writable ``char*`` argument: a ctypes char array only."""
    target = _target(obj)
    if isinstance(target, ctypes.Array) and getattr(type(target), "_type_") is ctypes.c_char:
        return ctypes.addressof(target), len(target)
    raise TypeError(f"expected a ctypes char buffer, got {type(target).__name__}")


def int_cell(obj: Any, size: int) -> Any:
    """The integer ctypes instance a ``void*`` value argument points to; it must be ``size`` bytes."""
    target = _target(obj)
    if not (isinstance(target, _SimpleCData) and getattr(type(target), "_type_") in _INTEGER_CODES):
        raise TypeError(f"expected byref() of an integer ctypes value, got {type(target).__name__}")
    if ctypes.sizeof(target) != size:  # type: ignore[arg-type]
        raise TypeError(f"this attribute takes a {size}-byte integer, "
                        f"got {type(target).__name__} "
                        f"({ctypes.sizeof(target)} bytes)")  # type: ignore[arg-type]
    return target

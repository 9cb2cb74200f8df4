"""Argument checks shared by the resources and the adaptors.

Each check raises TypeError / ValueError naming the argument, before anything is changed or
any native call is made.  Hot paths inline the cheap part (``type(x) is int``, a range, a set
membership) and call these only when that fails, so a valid call pays a few comparisons and an
invalid one gets the precise error.  Imports only ``stream_ref`` (the model layer).
"""
from __future__ import annotations

import operator
from typing import Any, Dict, Optional, Tuple

from ._limits import MAX_ADDRESS
from .stream_refs import HANDLE_READERS, as_stream_handle, stream_ref

__all__ = ["MAX_SIZE", "STREAM_REF", "FAST_ALIGNMENTS", "check_size",
           "check_alignment", "check_ptr", "check_stream", "check_args", "check_free_args",
           "check_free", "check_callable"]

#: Largest size accepted, in bytes: anything larger raises ValueError.
MAX_SIZE = 1 << 63
#: The stream_ref class, for ``type(stream) is STREAM_REF`` fast paths.
STREAM_REF = stream_ref
#: alignment -> alignment for every power of two up to 256 (the default alignment).
#: ``FAST_ALIGNMENTS[a] is a`` holds only for a genuine int in that set (CPython caches those
#: small ints), never for a bool, a float or another integer type, which take the checked slow
#: path instead (``KeyError`` / ``TypeError`` for anything else); ``None`` maps to False so
#: that ``get(None)`` is not ``None``.  A fast path tests ``alignment is DEFAULT_ALIGNMENT``
#: first (the same cached int): the usual argument then skips the lookup.
FAST_ALIGNMENTS: Dict[Optional[int], int] = {1 << i: 1 << i for i in range(9)}
FAST_ALIGNMENTS[None] = False


def _as_int(value: Any, name: str, what: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, (bool, float, str, bytes)) or value is None:
        raise TypeError(f"{name} must be an int {what}, not {type(value).__name__}")
    try:
        return operator.index(value)  # numpy integers and the like
    except TypeError:
        from ._rmm_names import stream_as_alignment_hint   # RMM's allocate(nbytes, stream)
        hint = stream_as_alignment_hint(value, name)
        raise TypeError(hint or f"{name} must be an int {what}, not "
                                f"{type(value).__name__}") from None


def check_size(value: Any, name: str = "bytes") -> int:
    """``value`` as a size in bytes: an int (not a bool) in ``[0, 2**63]``."""
    size = _as_int(value, name, "number of bytes")
    if size < 0:
        raise ValueError(f"{name}={size} is negative")
    if size > MAX_SIZE:
        raise ValueError(f"{name}={size} is larger than 2**63")
    return size


def check_alignment(value: Any, max_alignment: Optional[int] = None,
                    name: str = "alignment") -> int:
    """``value`` as an alignment: a positive power-of-two int (not a bool), at most
    ``max_alignment`` (None: at most 2**63)."""
    alignment = _as_int(value, name, "power of two")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{name}={alignment} is not a power of two")
    if max_alignment is not None and alignment > max_alignment:
        raise ValueError(f"{name}={alignment} is larger than {max_alignment}, the most this "
                         "resource can guarantee")
    if alignment > MAX_SIZE:
        raise ValueError(f"{name}={alignment} is larger than 2**63")
    return alignment


def check_ptr(value: Any, name: str = "ptr") -> int:
    """``value`` as a pointer: an int address in ``[0, 2**64)``."""
    ptr = _as_int(value, name, "address")
    if not 0 <= ptr <= MAX_ADDRESS:
        raise ValueError(f"{name}={ptr:#x} is not an address in [0, 2**64)")
    return ptr


_READERS = HANDLE_READERS


def check_stream(stream: Any, name: str = "stream") -> int:
    """The int handle of ``stream`` (anything :class:`stream_ref` accepts)."""
    if type(stream) is int:
        if 0 <= stream <= MAX_ADDRESS:
            return stream
        raise ValueError(f"{name}={stream} is not a stream handle (an address in [0, 2**64))")
    if type(stream) is STREAM_REF:
        return stream._handle
    read = _READERS.get(type(stream))
    if read is not None:   # the package's Stream: its checked handle, one call
        return read(stream)
    return as_stream_handle(stream, name)


def check_args(nbytes: Any, alignment: Any,
               max_alignment: Optional[int] = None) -> Tuple[int, int]:
    """A checked ``(bytes, alignment)`` pair (:func:`check_size`, :func:`check_alignment` with
    ``max_alignment``): the slow path of an allocation's inline test."""
    return check_size(nbytes), check_alignment(alignment, max_alignment)


def check_free_args(ptr: Any, nbytes: Any, alignment: Any,
                    max_alignment: Optional[int] = None) -> Tuple[int, int, int]:
    """A checked ``(ptr, bytes, alignment)`` triple: the slow path of a free's inline test."""
    return check_ptr(ptr), check_size(nbytes), check_alignment(alignment, max_alignment)


def check_free(ptr: int, known: Any, nbytes: int, owner: str) -> None:
    """Raise ValueError unless ``known``, the size ``ptr`` was allocated with (None when it is
    not live), equals the ``nbytes`` it is being freed with."""
    if known is None:
        raise ValueError(f"ptr={ptr:#x} is not a live allocation of this {owner} (never "
                         "allocated by it, or already deallocated)")
    if known != nbytes:
        raise ValueError(f"ptr={ptr:#x} was allocated with {known} bytes, not bytes={nbytes}")


def check_callable(value: Any, name: str) -> Any:
    """``value`` unchanged if callable, else TypeError naming ``name``."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")
    return value

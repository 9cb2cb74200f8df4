"""What every concrete resource shares: argument checks, the synchronous-adapter rule for
``allocate_async`` / ``deallocate_async`` of resources whose memory is not stream-ordered, and
the base class that wires them together.

Checks run before any native call and name the argument they reject.  The hot paths inline
the cheap part of these checks (``type(x) is int``, a range, membership in
:data:`DEVICE_ALIGNMENTS`) and call the functions here only when that fails, so a valid call
pays for a few comparisons and an invalid one gets the precise error.
"""
from __future__ import annotations

import operator
from typing import Any

from ..properties import DEFAULT_ALIGNMENT
from ..stream import as_stream_handle
from ..stream_ref import stream_ref

__all__ = ["MAX_SIZE", "MAX_DEVICE_ALIGNMENT", "DEVICE_ALIGNMENTS", "MAX_HANDLE",
           "check_size", "check_alignment", "check_ptr", "check_args", "check_stream",
           "sync_stream", "SyncResource", "STREAM_REF", "error", "check"]

#: Largest size accepted (bytes): anything larger raises ValueError before any native call.
MAX_SIZE = 1 << 63
#: Largest alignment HIP guarantees for device-style allocations.
MAX_DEVICE_ALIGNMENT = DEFAULT_ALIGNMENT
#: Every alignment a device-style resource accepts: {1, 2, 4, ..., 256}.
DEVICE_ALIGNMENTS = frozenset(1 << i for i in range(MAX_DEVICE_ALIGNMENT.bit_length()))
#: Largest pointer / handle value (an address).
MAX_HANDLE = (1 << 64) - 1
#: The stream_ref class, for ``type(stream) is STREAM_REF`` fast paths.
STREAM_REF = stream_ref


def _as_int(value: Any, name: str, what: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (float, str, bytes)):
        raise TypeError(f"{name} must be an int {what}, not {type(value).__name__}")
    try:
        return operator.index(value)  # numpy integers and the like
    except TypeError:
        raise TypeError(f"{name} must be an int {what}, not {type(value).__name__}") from None


def check_size(value: Any, name: str = "bytes") -> int:
    """``value`` as a size in bytes: an int in ``[0, 2**63]``; TypeError / ValueError otherwise."""
    value = _as_int(value, name, "number of bytes")
    if value < 0:
        raise ValueError(f"{name}={value} is negative")
    if value > MAX_SIZE:
        raise ValueError(f"{name}={value} is larger than 2**63")
    return value


def check_alignment(value: Any, max_alignment: "int | None" = MAX_DEVICE_ALIGNMENT,
                    name: str = "alignment") -> int:
    """``value`` as an alignment: a power of two int, at most ``max_alignment`` (None: any)."""
    value = _as_int(value, name, "power of two")
    if value <= 0 or value & (value - 1):
        raise ValueError(f"{name}={value} is not a power of two")
    if max_alignment is not None and value > max_alignment:
        raise ValueError(f"{name}={value} is larger than {max_alignment}, the most this "
                         "resource can guarantee")
    return value


def check_ptr(value: Any, name: str = "ptr") -> int:
    """``value`` as a pointer: an int address in ``[0, 2**64)``."""
    value = _as_int(value, name, "address")
    if not 0 <= value <= MAX_HANDLE:
        raise ValueError(f"{name}={value:#x} is not an address in [0, 2**64)")
    return value


def check_args(nbytes: Any, alignment: Any, max_alignment: "int | None") -> int:
    """Check a (bytes, alignment) pair; return the size as an int."""
    nbytes = check_size(nbytes)
    check_alignment(alignment, max_alignment)
    return nbytes


def check_stream(stream: Any, name: str = "stream") -> int:
    """The int handle of ``stream`` (anything :class:`stream_ref` accepts)."""
    if type(stream) is int:
        if 0 <= stream <= MAX_HANDLE:
            return stream
        raise ValueError(f"{name}={stream} is not a stream handle (an address in [0, 2**64))")
    if type(stream) is STREAM_REF:
        return stream._handle
    return as_stream_handle(stream, name)


def error(rt: Any, status: int, call: str, **kw: Any) -> Exception:
    """``rt.error(status, call, ...)``; it also resets the calling thread's last error, as RMM
    and CCCL do before they throw (see ``Runtime.clear_last_error``)."""
    return rt.error(status, call, **kw)


def check(rt: Any, status: int, call: str, **kw: Any) -> None:
    """Raise :func:`error` when ``status`` is not success."""
    if status:
        raise error(rt, status, call, **kw)


def sync_stream(handle: int) -> None:
    """Wait for every piece of work queued on the stream ``handle`` (``hipStreamSynchronize``)."""
    stream_ref(handle).wait()


class SyncResource:
    """Base of resources whose memory is not stream-ordered (``hipMalloc`` and the like).

    A subclass provides ``_alloc(nbytes, alignment) -> ptr`` and ``_free(ptr)`` (called with
    valid, non-zero arguments only) and the class attributes ``properties`` and ``_max_alignment``.
    ``allocate_async`` allocates at once; ``deallocate_async`` waits for the stream before
    freeing (upstream's ``synchronous_resource_adapter`` rule), so memory still used by work
    queued on the stream is never handed back early.
    """

    #: validates every argument before any native call (adaptors over it rely on this)
    _checks_arguments = True

    __slots__ = ("__weakref__",)
    properties: tuple = ()
    _max_alignment: "int | None" = MAX_DEVICE_ALIGNMENT

    def _alloc(self, nbytes: int, alignment: int) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _free(self, ptr: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sync(self, handle: int) -> None:
        sync_stream(handle)

    def _claim(self, ptr: int, nbytes: int) -> None:
        """Before freeing ``ptr`` (non-zero): raise ValueError if it cannot be freed here."""

    def _unclaim(self, ptr: int, nbytes: int) -> None:
        """Undo :meth:`_claim` when the free did not happen."""

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocate ``bytes`` bytes aligned to ``alignment``; ``allocate(0)`` returns 0."""
        if (type(bytes) is not int or not 0 < bytes <= MAX_SIZE or type(alignment) is not int
                or alignment not in DEVICE_ALIGNMENTS):
            bytes = check_args(bytes, alignment, self._max_alignment)
            if not bytes:
                return 0
        return self._alloc(bytes, alignment)

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Free ``ptr`` from ``allocate(bytes, alignment)``; ``deallocate(0, ...)`` does nothing."""
        ptr = check_ptr(ptr)
        check_args(bytes, alignment, self._max_alignment)
        if ptr:
            self._claim(ptr, bytes)
            self._free(ptr)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """Allocate at once (this memory is not stream-ordered); ``stream`` is checked only."""
        check_stream(stream)
        return self.allocate(bytes, alignment)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Wait for ``stream`` (``hipStreamSynchronize``), then free ``ptr``."""
        ptr = check_ptr(ptr)
        check_args(bytes, alignment, self._max_alignment)
        handle = check_stream(stream)
        if ptr:
            self._claim(ptr, bytes)
            try:
                self._sync(handle)
            except BaseException:
                self._unclaim(ptr, bytes)
                raise
            self._free(ptr)

"""What every concrete resource shares: the device alignments, the synchronous-adapter rule
for ``allocate_async`` / ``deallocate_async`` of resources whose memory is not stream-ordered,
and the base class that wires them together.

The argument checks are :mod:`hipmr_ctypes._checks`' (run before any native call, naming the
argument they reject).  The hot paths inline the cheap part (``type(x) is int``, a range,
membership in :data:`DEVICE_ALIGNMENTS`) and call those only when that fails.
"""
from __future__ import annotations

from typing import Any, Tuple

from ..properties import DEFAULT_ALIGNMENT
from .._checks import MAX_SIZE, check_args, check_ptr, check_stream
from ..stream_refs import stream_ref

__all__ = ["MAX_DEVICE_ALIGNMENT", "DEVICE_ALIGNMENTS", "sync_stream", "SyncResource",
           "FlagsEqual"]

#: Largest alignment HIP guarantees for device-style allocations.
MAX_DEVICE_ALIGNMENT = DEFAULT_ALIGNMENT
#: Every alignment a device-style resource accepts: {1, 2, 4, ..., 256}.
DEVICE_ALIGNMENTS = frozenset(1 << i for i in range(MAX_DEVICE_ALIGNMENT.bit_length()))


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
    properties: Tuple[type, ...] = ()
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
            bytes = check_args(bytes, alignment, self._max_alignment)[0]
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


class FlagsEqual:
    """Equality, hash and pickling of resources defined by their ``_flags`` alone (pinned and
    managed memory): two of the same type and flags are equal."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        same: bool = other._flags == self._flags  # type: ignore[attr-defined]
        return same

    def __hash__(self) -> int:
        return hash((type(self), self._flags))  # type: ignore[attr-defined]

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self._flags,))  # type: ignore[attr-defined]

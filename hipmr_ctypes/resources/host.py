"""``HostMemoryResource``: ordinary (pageable) host memory from the C library's
``posix_memalign`` / ``free``; needs no HIP library at all."""
from __future__ import annotations

import ctypes
import errno
import os
from ctypes import c_void_p
from typing import Any, Dict, Tuple

from .. import _hip
from ..errors import NoDeviceError, OutOfMemoryError
from .._hip.native import memalign_and_free
from ..properties import DEFAULT_ALIGNMENT, host_accessible
from .._checks import check_args
from ._common import SyncResource, sync_stream

__all__ = ["HostMemoryResource"]

# every live allocation of every HostMemoryResource (they are all equal: any of them frees
# what another allocated): ptr -> bytes.  libc's free must never see a foreign pointer.
_live: Dict[int, int] = {}
_SIZEOF_PTR = ctypes.sizeof(c_void_p)
# the runtime last found to see no device (no stream to wait for, ever, in this process)
_deviceless: object = None


def _load_libc() -> Tuple[Any, Any]:
    """``(posix_memalign, free)`` from the C library (``hipmr_ctypes._hip.native``)."""
    found = memalign_and_free()
    if found is None:
        raise OSError("the C library has no posix_memalign: HostMemoryResource needs it")
    return found


class HostMemoryResource(SyncResource):
    """Pageable host memory from ``posix_memalign`` (any power-of-two alignment), freed with
    ``free``.  Host-accessible only; works with no HIP library loaded.

    Not stream-ordered: ``deallocate_async`` waits for the stream first (when a HIP runtime is
    loaded and sees a device; with none, no work can be queued on any stream).  All instances are equal, and any
    of them frees what another allocated.  Freeing a pointer no HostMemoryResource handed out
    (or one already freed, or with another size than allocated) is a ValueError, never a
    crash: the live allocations are recorded.
    """

    __slots__ = ("_memalign", "_free_fn")
    properties: Tuple[type, ...] = (host_accessible,)
    _max_alignment = None

    def __init__(self) -> None:
        self._memalign, self._free_fn = _load_libc()

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """``posix_memalign`` ``bytes`` bytes aligned to ``alignment`` (any power of two);
        ``allocate(0)`` returns 0."""
        bytes = check_args(bytes, alignment)[0]
        if not bytes:
            return 0
        return self._alloc(bytes, alignment)

    def _alloc(self, nbytes: int, alignment: int) -> int:
        out = c_void_p()
        rc = self._memalign(out, max(alignment, _SIZEOF_PTR), nbytes)
        if rc:
            if rc == errno.ENOMEM:
                raise OutOfMemoryError(None, "ENOMEM", os.strerror(rc), "posix_memalign",
                                       size=nbytes)
            raise OSError(rc, f"posix_memalign({nbytes}, {alignment}) failed: "
                              f"{os.strerror(rc)}")
        ptr = out.value or 0
        _live[ptr] = nbytes  # atomic
        return ptr

    def _claim(self, ptr: int, nbytes: int) -> None:
        # no lock: the pop is the claim (one atomic dict operation, so two threads can never
        # both free ptr), and a finalizer run by the collector here can always free too
        size = _live.pop(ptr, None)
        if size is not None and size != nbytes:
            _live[ptr] = size
        if size is None:
            raise ValueError(f"ptr={ptr:#x} was not allocated by a HostMemoryResource, or "
                             "was freed already")
        if size != nbytes:
            raise ValueError(f"bytes={nbytes}, but ptr={ptr:#x} was allocated with "
                             f"{size} bytes")

    def _unclaim(self, ptr: int, nbytes: int) -> None:
        _live[ptr] = nbytes

    def _free(self, ptr: int) -> None:
        self._free_fn(ptr)

    def _sync(self, handle: int) -> None:
        global _deviceless
        try:
            rt = _hip.get_runtime()
        except Exception:  # no HIP runtime can load: nothing can be queued on any stream
            return
        if rt is _deviceless:
            return
        try:
            sync_stream(handle)
        except NoDeviceError:  # a runtime with no device: no work can be queued either
            _deviceless = rt

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return True

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), ())

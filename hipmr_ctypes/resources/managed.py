"""``ManagedMemoryResource``: managed (unified) memory from ``hipMallocManaged`` / ``hipFree``
(RMM's ``ManagedMemoryResource``, CCCL's ``managed_memory_resource``)."""
from __future__ import annotations

from ctypes import c_int, c_void_p
from typing import Tuple

from .. import _hip
from .._hip.types import hipMemAttachGlobal, hipMemAttachHost
from ..properties import device_accessible, host_accessible
from ._common import FlagsEqual, SyncResource

__all__ = ["ManagedMemoryResource"]

_FLAG_NAMES = {hipMemAttachGlobal: "hipMemAttachGlobal", hipMemAttachHost: "hipMemAttachHost"}


class ManagedMemoryResource(FlagsEqual, SyncResource):
    """Managed memory from ``hipMallocManaged(ptr, bytes, flags)``, freed with ``hipFree``:
    accessible from the host and from every device, migrated on demand.

    ``flags``: ``hipMemAttachGlobal`` (1, the default) or ``hipMemAttachHost`` (2).  Not
    stream-ordered (see ``SyncResource``).  Alignment: a power of two up to 256.  Equal when the
    flags are equal.
    """

    __slots__ = ("_flags", "_rt", "_malloc", "_free_fn")
    properties: Tuple[type, ...] = (device_accessible, host_accessible)
    _allocation_kind = "managed"   # what _memory_query.memory_kind says of its memory

    def __init__(self, flags: int = hipMemAttachGlobal) -> None:
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"flags must be an int, not {type(flags).__name__}")
        if flags not in _FLAG_NAMES:
            raise ValueError(f"flags={flags} must be hipMemAttachGlobal ({hipMemAttachGlobal}) "
                             f"or hipMemAttachHost ({hipMemAttachHost})")
        rt = _hip.get_runtime()
        self._flags = int(flags)
        self._rt = rt
        self._malloc = rt.fn.hipMallocManaged
        self._free_fn = rt.fn.hipFree

    @property
    def flags(self) -> int:
        """The ``hipMallocManaged`` flags."""
        return self._flags

    def _alloc(self, nbytes: int, alignment: int) -> int:
        out = c_void_p()
        st = self._malloc(out, nbytes, self._flags)
        if st:
            device = c_int()
            self._rt.fn.hipGetDevice(device)  # managed memory counts against the current one
            raise self._rt.error(st, "hipMallocManaged", size=nbytes, device=device.value)
        return out.value  # type: ignore[return-value]  # not NULL on success

    def _free(self, ptr: int) -> None:
        st = self._free_fn(ptr)
        if st:
            raise self._rt.error(st, "hipFree", detail=f"ptr={ptr:#x}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(flags={_FLAG_NAMES[self._flags]})"

"""Memory from the system allocator, used by the device directly: ``SystemMemoryResource`` and
``SamHeadroomMemoryResource`` (RMM's names).

On a device with pageable memory access (``hipDeviceAttributePageableMemoryAccess``: an APU
such as MI300A, or a discrete GPU with XNACK / HMM enabled) the device reads and writes
ordinary host memory, with page migration by the driver, as it does managed memory.  These
resources hand out such memory (``posix_memalign``, shared with ``HostMemoryResource``'s
record of live allocations) and refuse to be built where the device lacks the access.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

from .. import _hip
from .._device_sizes import config_size
from .._hip.exceptions import NotSupportedError
from .._hip.types import MEM_ADVICE, hipCpuDeviceId
from ..device import Device, check_device, on_device
from ..properties import device_accessible, host_accessible
from .host import HostMemoryResource

__all__ = ["SystemMemoryResource", "SamHeadroomMemoryResource"]

_SET_PREFERRED_LOCATION = MEM_ADVICE["preferred_location"][0]
#: the granularity of the part preferring the device (RMM's: the allocation alignment)
_ALIGNMENT = 256


def _check_pageable(device: int, who: str) -> None:
    if not Device(device).pageable_memory_access:
        raise NotSupportedError(
            801, "hipErrorNotSupported",
            f"{who} needs a device with pageable memory access "
            f"(hipDeviceAttributePageableMemoryAccess), and device {device} has none: "
            "it is an APU such as MI300A, or a GPU with XNACK (HSA_XNACK=1) or HMM enabled; "
            "use ManagedMemoryResource on this device instead", None)


class SystemMemoryResource(HostMemoryResource):
    """Memory from the system allocator (``posix_memalign``), accessible from the host and
    from the device, which reaches it through pageable memory access (RMM's
    ``system_memory_resource``).

    ``device``: the device that uses it (default: the current one); building it where that
    device has no pageable memory access raises ``NotSupportedError``.  Not stream-ordered
    (``deallocate_async`` waits for the stream); its memory counts as managed memory (it
    migrates on demand, and ``Buffer.prefetch`` moves it).  All instances for one device are
    equal.
    """

    __slots__ = ("_device",)
    properties: Tuple[type, ...] = (device_accessible, host_accessible)
    _allocation_kind = "managed"   # what _memory_query.memory_kind says of its memory

    def __init__(self, device: Optional[Any] = None) -> None:
        ordinal = Device().id if device is None else check_device(device)
        _check_pageable(ordinal, type(self).__name__)
        super().__init__()
        self._device = ordinal

    @property
    def device(self) -> int:
        """The device that uses this memory."""
        return self._device

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SystemMemoryResource) or type(other) is not type(self):
            return NotImplemented
        return bool(other._device == self._device)

    def __hash__(self) -> int:
        return hash((type(self), self._device))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self._device})"

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self._device,))


class SamHeadroomMemoryResource(SystemMemoryResource):
    """System memory that prefers the device while the device keeps ``headroom`` bytes free
    (RMM's ``sam_headroom_memory_resource``).

    Each allocation is system memory (as :class:`SystemMemoryResource`'s); its leading part,
    up to the device's free memory less ``headroom`` (rounded down to 256 bytes), is advised
    to prefer the device (``hipMemAdvise`` SetPreferredLocation), the rest to prefer the host.
    ``headroom``: a size (``"4GiB"``, an int, a fraction of the device's memory).
    """

    __slots__ = ("_headroom", "_rt")

    def __init__(self, headroom: Any, device: Optional[Any] = None) -> None:
        ordinal = Device().id if device is None else check_device(device)
        self._headroom = config_size(headroom, "headroom", ordinal)
        super().__init__(ordinal)
        self._rt = _hip.get_runtime()

    @property
    def headroom(self) -> int:
        """The bytes of device memory allocations leave free."""
        return self._headroom

    def _alloc(self, nbytes: int, alignment: int) -> int:
        ptr = super()._alloc(nbytes, alignment)
        try:
            self._advise(ptr, nbytes)
        except BaseException:
            self._claim(ptr, nbytes)
            self._free(ptr)
            raise
        return ptr

    def _advise(self, ptr: int, nbytes: int) -> None:
        rt = self._rt
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        with on_device(self._device):
            rt.check(rt.fn.hipMemGetInfo(free, total), "hipMemGetInfo", device=self._device)
        allocatable = max(free.value - self._headroom, 0)
        device_part = min(allocatable, nbytes) // _ALIGNMENT * _ALIGNMENT
        if device_part:
            rt.check(rt.fn.hipMemAdvise(ptr, device_part, _SET_PREFERRED_LOCATION,
                                        self._device), "hipMemAdvise", size=device_part,
                     device=self._device)
        if nbytes - device_part:
            rt.check(rt.fn.hipMemAdvise(ptr + device_part, nbytes - device_part,
                                        _SET_PREFERRED_LOCATION, hipCpuDeviceId),
                     "hipMemAdvise", size=nbytes - device_part)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamHeadroomMemoryResource) or type(other) is not type(self):
            return NotImplemented
        return bool((other._device, other._headroom)
                    == (self._device, self._headroom))

    def __hash__(self) -> int:
        return hash((type(self), self._device, self._headroom))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(headroom={self._headroom}, device={self._device})"

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self._headroom, self._device))

"""A Numba External Memory Management (EMM) plugin: device arrays allocated through
hipmr_ctypes.

Enable it before Numba creates its CUDA context, either with the environment variable
``NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba`` or with
``numba.cuda.set_memory_manager(HipmrNumbaManager)``.  Each ``memalloc`` is a
:class:`~hipmr_ctypes.Buffer` on the current device's resource
(``get_current_device_resource()``), freed when Numba finalizes the memory.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict

from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer

from ..buffer import Buffer
from ..device import Device

__all__ = ["HipmrNumbaManager"]

try:  # numba-cuda exports it as numba.cuda.MemoryInfo, older Numba only from the driver
    from numba.cuda import MemoryInfo as _MemoryInfo
except ImportError:  # pragma: no cover - depends on the Numba version
    from numba.cuda.cudadrv.driver import MemoryInfo as _MemoryInfo  # type: ignore[no-redef]


def _device_pointer(ptr: int) -> Any:
    """``ptr`` as Numba's driver expects it: a ``CUdeviceptr`` with the NVIDIA binding (the
    default in numba-cuda), a ``c_uint64`` with Numba's older ctypes binding."""
    from numba.cuda.cudadrv import driver
    if getattr(driver, "USE_NV_BINDING", True):
        binding = getattr(driver, "binding", None)
        CUdeviceptr = getattr(binding, "CUdeviceptr", None)
        if CUdeviceptr is None:
            from cuda.bindings.driver import CUdeviceptr  # type: ignore[no-redef]
        return CUdeviceptr(ptr)
    return ctypes.c_uint64(ptr)


def _finalizer(key: int, allocations: Dict[int, Any]) -> Callable[[], None]:
    def finalize() -> None:
        # Context.reset() may have emptied `allocations` before Numba's atexit finalizers run.
        if allocations:
            allocations.pop(key, None)
    return finalize


class HipmrNumbaManager(HostOnlyCUDAMemoryManager):
    """Numba EMM plugin (interface version 1): on-device allocations from hipmr_ctypes; host
    allocations stay Numba's own (``HostOnlyCUDAMemoryManager``)."""

    def initialize(self) -> None:
        """Nothing to set up: the per-device resource is made on first use."""

    def memalloc(self, size: int) -> MemoryPointer:
        """A ``MemoryPointer`` over a new :class:`Buffer` of ``size`` bytes, which the
        plugin's ``allocations`` table keeps alive until Numba finalizes the pointer."""
        buf = Buffer(size)
        key = buf.ptr or id(buf)
        self.allocations[key] = buf
        return MemoryPointer(self.context, _device_pointer(buf.ptr), size,
                             finalizer=_finalizer(key, self.allocations))

    def get_memory_info(self) -> Any:
        """Numba's ``MemoryInfo(free, total)``: the bytes of the current device (what the
        device has, whatever part of it a pooling resource holds)."""
        free, total = Device().memory_info()
        return _MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory: Any) -> Any:
        """Not supported: hipmr_ctypes allocations are not exported to other processes here."""
        raise NotImplementedError("HipmrNumbaManager does not support IPC handles")

    @property
    def interface_version(self) -> int:
        """The EMM plugin interface version implemented: 1."""
        return 1


# NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba looks for this name
_numba_memory_manager = HipmrNumbaManager


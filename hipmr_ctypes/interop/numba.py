# pyright: reportMissingImports=false, reportAttributeAccessIssue=false, reportUnknownParameterType=false
# (CuPy / Numba are optional: this module is imported only where they are installed)
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
    from numba.cuda.cudadrv.driver import MemoryInfo as _MemoryInfo


def _device_pointer(ptr: int) -> Any:
    """``ptr`` as Numba's driver expects it: a ``CUdeviceptr`` with the NVIDIA binding (the
    default in numba-cuda), a ``c_uint64`` with Numba's older ctypes binding."""
    from numba.cuda.cudadrv import driver
    if getattr(driver, "USE_NV_BINDING", True):
        binding = getattr(driver, "binding", None)
        make: Any = getattr(binding, "CUdeviceptr", None)
        if make is None:
            from cuda.bindings.driver import CUdeviceptr as make  # type: ignore[no-redef]
        return make(ptr)
    return ctypes.c_uint64(ptr)


def _address(memory: Any) -> int:
    """The device address of a Numba ``MemoryPointer`` (either driver binding)."""
    value = getattr(memory, "device_pointer_value", None)
    if value is not None:
        return int(value)
    handle = memory.handle
    return int(getattr(handle, "value", handle) or 0)


def _numba_ipc_handle(data: bytes) -> Any:
    """The 64 bytes of a legacy handle as the handle type of Numba's driver binding."""
    from numba.cuda.cudadrv import driver
    if getattr(driver, "USE_NV_BINDING", True):
        binding = getattr(driver, "binding", None)
        make: Any = getattr(binding, "CUipcMemHandle", None)
        if make is None:
            from cuda.bindings.driver import CUipcMemHandle as make  # type: ignore[no-redef]
        handle = make()
        handle.reserved = data
        return handle
    from numba.cuda.cudadrv import drvapi
    return drvapi.cu_ipc_mem_handle.from_buffer_copy(data)


def _finalizer(key: int, allocations: Dict[int, Any]) -> Callable[[], None]:
    def finalize() -> None:
        # Context.reset() may have emptied `allocations` before Numba's atexit finalizers run.
        if allocations:
            allocations.pop(key, None)
    return finalize


class HipmrNumbaManager(HostOnlyCUDAMemoryManager):  # type: ignore[misc]
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
        """A ``numba.cuda.IpcHandle`` of ``memory`` (an allocation of this plugin, or a view of
        one), built on :meth:`Buffer.export_ipc`: Numba's other process opens its legacy
        handle (``cuIpcOpenMemHandle``).  The memory must come from a
        ``DeviceMemoryResource`` (the default per-device resource): Numba opens legacy
        handles only, so pool memory raises NotSupportedError."""
        from numba.cuda.cudadrv.driver import IpcHandle
        ptr = _address(memory)
        buf = self._buffer_at(ptr)
        descriptor = buf.export_ipc()
        if descriptor.kind != "legacy":
            from ..errors import NotSupportedError
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "Numba shares memory through legacy IPC handles, which "
                                    "pool memory does not have: use DeviceMemoryResource as "
                                    "the per-device resource for arrays Numba shares",
                                    "HipmrNumbaManager.get_ipc_handle")
        try:
            handle = _numba_ipc_handle(descriptor.data)
        except (AttributeError, TypeError, ValueError):
            # a driver binding whose handle type cannot be filled from bytes: let Numba's
            # own driver make the same legacy handle
            from numba.cuda.cudadrv.driver import GetIpcHandleMixin
            return GetIpcHandleMixin.get_ipc_handle(self, memory)
        source_info = self.context.device.get_device_identity()
        return IpcHandle(memory, handle, memory.size, source_info,
                         offset=ptr - buf.ptr + descriptor.offset)

    def _buffer_at(self, ptr: int) -> Buffer:
        """The Buffer of this plugin whose memory holds ``ptr``."""
        found = self.allocations.get(ptr)
        if isinstance(found, Buffer):
            return found
        for buf in list(self.allocations.values()):
            if isinstance(buf, Buffer) and not buf.closed and buf.ptr <= ptr < buf.ptr + buf.size:
                return buf
        raise ValueError(f"{ptr:#x} is not memory this plugin allocated")

    @property
    def interface_version(self) -> int:
        """The EMM plugin interface version implemented: 1."""
        return 1


# NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba looks for this name
_numba_memory_manager = HipmrNumbaManager


# pyright: reportMissingImports=false, reportAttributeAccessIssue=false, reportUnknownParameterType=false
# (CuPy / Numba are optional: this module is imported only where they are installed)
"""A Numba External Memory Management (EMM) plugin: device arrays allocated through
hipmr_ctypes.

Enable it before Numba creates its CUDA context, either with the environment variable
``NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba`` or with
``numba.cuda.set_memory_manager(HipmrNumbaManager)``.  Each ``memalloc`` comes from the resource
of the context's device (``get_per_device_resource``) on the null stream, and is freed exactly
once: by ``free()`` or when Numba drops the memory pointer (and every view of it).  At
interpreter exit, memory still reachable is not freed (see ``hipmr_ctypes._exit``).

The pointer is Numba's own ``MemoryPointer`` (views, reference counts and ``free()`` behave as
Numba's), in a subclass that frees in ``__del__`` instead of through the ``weakref.finalize``
Numba's base class would make for each allocation.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
from numba.cuda.cudadrv import driver as _driver

from .._exit import _state as _exit_state, warn_failed_free
from ..buffer import Buffer
from ..device import Device, get_device
from ..properties import DEFAULT_ALIGNMENT
from ._current import current as _current_resources, resource_of as _resource_of

__all__ = ["HipmrNumbaManager"]

try:  # numba-cuda exports it as numba.cuda.MemoryInfo, older Numba only from the driver
    from numba.cuda import MemoryInfo as _MemoryInfo
except ImportError:  # pragma: no cover - depends on the Numba version
    from numba.cuda.cudadrv.driver import MemoryInfo as _MemoryInfo


def _pointer_type() -> Callable[[int], Any]:
    """What makes a device pointer for Numba's driver: ``CUdeviceptr`` of the NVIDIA binding
    (numba-cuda's only binding), ``c_uint64`` with older Numba's ctypes binding."""
    if getattr(_driver, "USE_NV_BINDING", True):
        make: Any = getattr(getattr(_driver, "binding", None), "CUdeviceptr", None)
        if make is None:  # pragma: no cover - depends on the Numba version
            from cuda.bindings.driver import CUdeviceptr as make  # type: ignore[no-redef]
        return make  # type: ignore[no-any-return]
    return ctypes.c_uint64  # pragma: no cover - older Numba


_device_pointer = _pointer_type()


def _address(memory: Any) -> int:
    """The device address of a Numba ``MemoryPointer`` (either driver binding)."""
    value = getattr(memory, "device_pointer_value", None)
    if value is not None:
        return int(value)
    handle = memory.handle
    return int(getattr(handle, "value", handle) or 0)


def _numba_ipc_handle(data: bytes) -> Any:
    """The 64 bytes of a legacy handle as the handle type of Numba's driver binding."""
    if getattr(_driver, "USE_NV_BINDING", True):
        make: Any = getattr(getattr(_driver, "binding", None), "CUipcMemHandle", None)
        if make is None:
            from cuda.bindings.driver import CUipcMemHandle as make  # type: ignore[no-redef]
        handle = make()
        handle.reserved = data
        return handle
    from numba.cuda.cudadrv import drvapi
    return drvapi.cu_ipc_mem_handle.from_buffer_copy(data)


_adopting = threading.Lock()


class _HipmrMemoryPointer(MemoryPointer):  # type: ignore[misc]
    """Numba's ``MemoryPointer`` over one allocation of this plugin, built by Numba's own
    ``__init__`` (without a finalizer); ``memalloc`` then sets ``is_managed`` (``free()``
    frees, as with Numba's own memory) and ``_hipmr``.

    ``_hipmr`` is ``(deallocate_async, ptr, size, resource, device)`` while the pointer owns
    the memory: deleting it (which only one caller can do) is the claim that frees exactly
    once (``free()``, the collector, or handing the memory to a :class:`Buffer` for IPC).
    After such a hand-over, ``_hipmr_buffer`` owns the memory and lives as long as the
    pointer."""

    _hipmr: Tuple[Any, ...]   # an instance attribute only (no class default: absent = not owned)

    def free(self) -> None:
        """Free the memory now (Numba's ``MemoryPointer.free``); RuntimeError if it was freed
        already."""
        try:
            owned = self._hipmr
            del self._hipmr   # the claim
        except AttributeError:
            buf = self.__dict__.pop("_hipmr_buffer", None)
            if buf is None or buf.closed:
                raise RuntimeError("Freeing dead memory")
            buf.close()
            return
        try:
            owned[0](owned[1], owned[2], DEFAULT_ALIGNMENT, 0)
        except BaseException:
            self._hipmr = owned  # still ours
            raise

    def __del__(self, _state: Dict[str, bool] = _exit_state,
                _failed: Callable[..., None] = warn_failed_free) -> None:
        if _state["keep"]:  # exiting: memory that may still be reachable stays valid
            return
        try:
            owned = self._hipmr
            del self._hipmr   # the claim (not __dict__.pop: reading __dict__ makes the dict)
        except AttributeError:  # freed, handed to a Buffer, or __init__ did not get that far
            return
        try:
            owned[0](owned[1], owned[2], DEFAULT_ALIGNMENT, 0)
        except Exception as exc:  # noqa: BLE001 - nobody to raise to
            _failed("Numba memory manager", owned[1], owned[2], exc)

    def _hipmr_as_buffer(self) -> Buffer:
        """The memory as a :class:`Buffer` (made once, which then owns it)."""
        with _adopting:
            buf: Optional[Buffer] = self.__dict__.get("_hipmr_buffer")
            if buf is None:
                try:
                    owned = self._hipmr
                    del self._hipmr   # the claim
                except AttributeError:
                    raise ValueError("this memory was freed") from None
                try:
                    buf = Buffer._adopt(owned[1], owned[2], owned[3], owned[4])
                except BaseException:
                    self._hipmr = owned
                    raise
                self._hipmr_buffer = buf
        return buf


class HipmrNumbaManager(HostOnlyCUDAMemoryManager):  # type: ignore[misc]
    """Numba EMM plugin (interface version 1): on-device allocations from hipmr_ctypes; host
    allocations stay Numba's own (``HostOnlyCUDAMemoryManager``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the context's device, read once: an instance attribute from the start (one a class
        # attribute shadows is read the slow way on every allocation)
        self._hipmr_device: Optional[int] = None

    def initialize(self) -> None:
        """Nothing to set up: the per-device resource is made on first use."""

    def _device(self) -> int:
        """The device of this manager's context (read once), else the current device."""
        device = self._hipmr_device
        if device is None:
            try:
                device = self._hipmr_device = int(self.context.device.id)
            except (AttributeError, TypeError, ValueError):  # no context: the current device
                return get_device()
        return device

    def memalloc(self, size: int) -> MemoryPointer:
        """A Numba ``MemoryPointer`` over ``size`` new bytes from the resource of the context's
        device, on the null stream; freed by ``free()`` or when Numba drops the pointer."""
        device = self._hipmr_device
        if device is None:
            device = self._device()
        try:
            resource, where, allocate_async, dealloc = _current_resources[device]
        except KeyError:
            resource, where, allocate_async, dealloc = _resource_of(device)
        if not size:
            return MemoryPointer(self.context, _device_pointer(0), 0)
        ptr = allocate_async(size, DEFAULT_ALIGNMENT, 0)
        try:
            memory = _HipmrMemoryPointer(self.context, _device_pointer(ptr), size)
        except BaseException:
            dealloc(ptr, size, DEFAULT_ALIGNMENT, 0)
            raise
        memory.is_managed = True
        memory._hipmr = (dealloc, ptr, size, resource, where)
        return memory

    def get_memory_info(self) -> Any:
        """Numba's ``MemoryInfo(free, total)``: the bytes of the context's device (what the
        device has, whatever part of it a pooling resource holds)."""
        free, total = Device(self._device()).memory_info()
        return _MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory: Any) -> Any:
        """A ``numba.cuda.IpcHandle`` of ``memory`` (an allocation of this plugin, or a view of
        one), built on :meth:`Buffer.export_ipc`: Numba's other process opens its legacy
        handle (``cuIpcOpenMemHandle``).  Memory another object owns (an array from the CUDA
        Array Interface) gets Numba's own handle, as with Numba's manager.  The memory must come from a
        ``DeviceMemoryResource`` (the default per-device resource), directly or through
        adaptors that hand its pointers out unchanged: Numba opens legacy handles only, so
        other memory (a pool's) raises NotSupportedError."""
        from numba.cuda.cudadrv.driver import IpcHandle
        from ..errors import NotSupportedError
        from ..ipc import source_of
        from ..resources import DeviceMemoryResource
        from numba.cuda.cudadrv.driver import GetIpcHandleMixin
        base = getattr(memory, "owner", None)
        if not isinstance(base, _HipmrMemoryPointer):
            # memory another owner holds (an array that came in through the CUDA Array
            # Interface, even over memory of ours): Numba's own way, as its manager does
            # (the allocation's base from the driver, its legacy handle)
            return GetIpcHandleMixin.get_ipc_handle(self, memory)
        ptr = _address(memory)
        owned = base.__dict__.get("_hipmr")
        buf = base.__dict__.get("_hipmr_buffer")
        resource = owned[3] if owned is not None else (buf.resource if buf is not None else None)
        if resource is None:
            raise ValueError(f"{ptr:#x}: this memory was freed")
        try:
            source = source_of(resource)
        except NotSupportedError:
            source = None
        if not isinstance(source, DeviceMemoryResource):
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "Numba shares memory through legacy IPC handles "
                                    "(hipIpcGetMemHandle), which only memory of a "
                                    "DeviceMemoryResource has (pool memory does not): use "
                                    "DeviceMemoryResource as the per-device resource for "
                                    "arrays Numba shares", "HipmrNumbaManager.get_ipc_handle")
        buf = base._hipmr_as_buffer()
        descriptor = buf.export_ipc()
        try:
            handle = _numba_ipc_handle(descriptor.data)
        except (AttributeError, TypeError, ValueError):
            # a driver binding whose handle type cannot be filled from bytes: let Numba's
            # own driver make the same legacy handle
            return GetIpcHandleMixin.get_ipc_handle(self, memory)
        source_info = self.context.device.get_device_identity()
        return IpcHandle(memory, handle, memory.size, source_info,
                         offset=ptr - buf.ptr + descriptor.offset)

    @property
    def interface_version(self) -> int:
        """The EMM plugin interface version implemented: 1."""
        return 1


# NUMBA_CUDA_MEMORY_MANAGER=hipmr_ctypes.interop.numba looks for this name
_numba_memory_manager = HipmrNumbaManager


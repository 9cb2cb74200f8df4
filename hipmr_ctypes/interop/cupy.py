# pyright: reportMissingImports=false, reportAttributeAccessIssue=false
# (CuPy / Numba are optional: this module is imported only where they are installed)
"""CuPy allocations through hipmr_ctypes: ``cupy.cuda.set_allocator(allocator())``.

Each CuPy allocation is made on CuPy's current stream through ``resource`` (default: the
resource of CuPy's current device at the time of each allocation), and is freed exactly once,
in stream order on that stream, when CuPy lets its memory go (the last array over it is
dropped).  The memory holds the resource and CuPy's stream object, so neither goes away before
it.  At interpreter exit, memory still reachable is not freed (see ``hipmr_ctypes._exit``).

How an allocation is built (the allocator is CuPy's hottest path): what does not change between
allocations is decided once, per allocator or per resource (the resource's checks, the device
its memory lives on); each allocation then makes two objects, CuPy's ``MemoryPointer`` and an
``UnownedMemory`` of a subclass whose ``__del__`` frees, given the device so that CuPy asks the
runtime nothing.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import cupy

from .._exit import _state as _exit_state, warn_failed_free
from .._memory_query import memory_device
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from ..resource_refs import async_resource_ref
from ._current import current as _current_resources, resource_of as _resource_of

__all__ = ["allocator"]

_UnownedMemory = cupy.cuda.memory.UnownedMemory
_MemoryPointer = cupy.cuda.memory.MemoryPointer
_device_id: Callable[[], int] = cupy.cuda.device.get_device_id
_get_current_stream: Callable[..., Any] = cupy.cuda.get_current_stream


class _Allocation(cupy.cuda.memory.UnownedMemory):  # type: ignore[misc]
    """CuPy's ``UnownedMemory`` over one allocation, which frees it when CuPy lets it go
    (refcounting runs ``__del__`` exactly once).  ``_free`` is the resource's bound
    ``deallocate_async`` and ``_stream`` CuPy's stream object: both are held until then.  One
    object per allocation beside CuPy's ``MemoryPointer``: no separate owner."""

    __slots__ = ("_free", "_handle", "_stream")

    def __del__(self, _state: Dict[str, bool] = _exit_state,
                _failed: Callable[..., None] = warn_failed_free) -> None:
        if _state["keep"]:  # exiting: memory that may still be reachable stays valid
            return
        try:
            free = self._free
        except AttributeError:  # never owned memory (construction failed)
            return
        try:
            free(self.ptr, self.size, DEFAULT_ALIGNMENT, self._handle)
        except Exception as exc:  # noqa: BLE001 - nobody to raise to
            _failed("CuPy allocator", self.ptr, self.size, exc)


def _stream_without_device(device: int) -> Any:
    """Older CuPy: ``get_current_stream()`` takes no device (it reads the current one)."""
    return _get_current_stream()


def _first_stream(device: int) -> Any:
    """CuPy's current stream of ``device``; the first call learns which form this CuPy has and
    keeps it: CuPy 13+ takes the device (and then asks the runtime nothing), older CuPy
    takes none."""
    global _current_stream
    try:
        stream = _get_current_stream(device)
    except TypeError:
        _current_stream = _stream_without_device
        return _get_current_stream()
    _current_stream = _get_current_stream
    return stream


_current_stream: Callable[[int], Any] = _first_stream


def _current(nbytes: int) -> Any:
    """``nbytes`` from the resource of CuPy's current device, on CuPy's current stream."""
    device = _device_id()
    stream = _current_stream(device)
    try:
        _, where, allocate_async, free = _current_resources[device]
    except KeyError:
        _, where, allocate_async, free = _resource_of(device)
    if not nbytes:
        return _MemoryPointer(_UnownedMemory(0, 0, None, where), 0)
    handle = stream.ptr
    ptr = allocate_async(nbytes, DEFAULT_ALIGNMENT, handle)
    try:
        memory = _Allocation(ptr, nbytes, None, where)
    except BaseException:
        free(ptr, nbytes, DEFAULT_ALIGNMENT, handle)
        raise
    memory._handle = handle
    memory._stream = stream
    memory._free = free  # last: from here on, the memory frees itself
    return _MemoryPointer(memory, 0)


def allocator(resource: Any = None) -> Callable[[int], Any]:
    """A function for ``cupy.cuda.set_allocator``: ``nbytes -> cupy.cuda.MemoryPointer``.

    ``resource``: an async, device-accessible resource (or ref), checked now (TypeError
    naming what is missing); None uses the resource of CuPy's current device
    (``get_per_device_resource``) at each allocation.
    """
    if resource is None:
        return _current
    ref = async_resource_ref[device_accessible](resource)  # TypeError now, not later
    allocate_async, deallocate_async = ref.allocate_async, ref.deallocate_async
    fixed: Optional[int] = memory_device(ref.resource)

    def allocate(nbytes: int) -> Any:
        """``nbytes`` from the allocator's resource, on CuPy's current stream."""
        device = _device_id()
        stream = _current_stream(device)
        where = device if fixed is None else fixed
        if not nbytes:
            return _MemoryPointer(_UnownedMemory(0, 0, None, where), 0)
        handle = stream.ptr
        ptr = allocate_async(nbytes, DEFAULT_ALIGNMENT, handle)
        try:
            memory = _Allocation(ptr, nbytes, None, where)
        except BaseException:
            deallocate_async(ptr, nbytes, DEFAULT_ALIGNMENT, handle)
            raise
        memory._handle = handle
        memory._stream = stream
        memory._free = deallocate_async
        return _MemoryPointer(memory, 0)

    return allocate

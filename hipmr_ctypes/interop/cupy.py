# pyright: reportMissingImports=false, reportAttributeAccessIssue=false
# (CuPy / Numba are optional: this module is imported only where they are installed)
"""CuPy allocations through hipmr_ctypes: ``cupy.cuda.set_allocator(allocator())``.

Each CuPy allocation becomes a :class:`~hipmr_ctypes.Buffer` made on CuPy's current stream
through ``resource`` (default: the current device's resource at the time of each allocation),
and is freed, in stream order on that stream, when CuPy drops its memory.
"""
from __future__ import annotations

from typing import Any, Callable, Tuple

import cupy

from ..buffer import Buffer

__all__ = ["allocator"]


class _CupyStream:
    """CuPy's stream as the buffer's stream: the buffer holds it, so the stream outlives the
    memory freed on it."""

    __slots__ = ("stream",)

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __hip_stream__(self) -> Tuple[int, int]:
        return (0, self.stream.ptr)


def allocator(resource: Any = None) -> Callable[[int], Any]:
    """A function for ``cupy.cuda.set_allocator``: ``nbytes -> cupy.cuda.MemoryPointer``.

    ``resource``: an async, device-accessible resource (or ref); None uses the current
    device's resource (``get_current_device_resource()``) at each allocation.
    """
    if resource is not None:
        from ..resource_ref import async_resource_ref
        from ..properties import device_accessible
        resource = async_resource_ref[device_accessible](resource)  # TypeError now, not later

    def allocate(nbytes: int) -> Any:
        stream = _CupyStream(cupy.cuda.get_current_stream())
        buf = Buffer(nbytes, resource=resource, stream=stream)
        device_id = -1 if buf.ptr else cupy.cuda.device.get_device_id()
        mem = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, device_id)
        return cupy.cuda.MemoryPointer(mem, 0)

    return allocate

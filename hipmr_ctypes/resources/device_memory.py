"""``DeviceMemoryResource``: ``hipMalloc`` / ``hipFree`` on one device (RMM's
``CudaMemoryResource``, CCCL's ``device_memory_resource``)."""
from __future__ import annotations

from ctypes import c_int, c_void_p
from typing import Any, Callable, Optional, Tuple

from .. import _hip
from ..device import check_device, device_count, get_device
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from .._checks import MAX_SIZE, check_args, check_ptr
from .._limits import MAX_ADDRESS
from ._common import DEVICE_ALIGNMENTS, MAX_DEVICE_ALIGNMENT, SyncResource

__all__ = ["DeviceMemoryResource"]


class DeviceMemoryResource(SyncResource):
    """Device memory from ``hipMalloc``, freed with ``hipFree``, on ``device`` (default: the
    current device when the resource is made).

    Each call makes ``device`` current for its duration and restores the previous device, and
    switches only when the current device differs (with one visible device it never asks).
    Not stream-ordered: ``allocate_async`` allocates at once and ``deallocate_async`` waits for
    the stream before freeing.  Alignment: a power of two up to 256.  Two resources for the same
    device are equal.
    """

    __slots__ = ("_device", "_rt", "_malloc", "_free_fn", "_switch")
    properties: Tuple[type, ...] = (device_accessible,)
    #: its memory is shared with other processes by legacy handles (hipmr_ctypes.ipc)
    _ipc_memory = "legacy"

    def __init__(self, device: Optional[Any] = None) -> None:
        rt = _hip.get_runtime()
        self._device = get_device() if device is None else check_device(device)
        self._rt = rt
        self._malloc = rt.fn.hipMalloc
        self._free_fn = rt.fn.hipFree
        # With one device, the current device is always this one: never ask.
        self._switch = device_count() > 1

    @property
    def device(self) -> int:
        """The device ordinal the memory lives on."""
        return self._device

    def _call(self, fn: Callable[..., int], *args: Any) -> int:
        """Run ``fn(*args)`` with this resource's device current, restoring the previous one."""
        rt = self._rt
        cur = c_int()
        rt.check(rt.fn.hipGetDevice(cur), "hipGetDevice")
        prev = cur.value
        if prev == self._device:
            return fn(*args)
        rt.check(rt.fn.hipSetDevice(self._device), "hipSetDevice", device=self._device)
        try:
            return fn(*args)
        finally:
            rt.fn.hipSetDevice(prev)

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """``hipMalloc(bytes)`` on this device; ``allocate(0)`` returns 0."""
        if (type(bytes) is not int or not 0 < bytes <= MAX_SIZE or type(alignment) is not int
                or alignment not in DEVICE_ALIGNMENTS):
            bytes = check_args(bytes, alignment, MAX_DEVICE_ALIGNMENT)[0]
            if not bytes:
                return 0
        out = c_void_p()
        st = self._call(self._malloc, out, bytes) if self._switch else self._malloc(out, bytes)
        if st:
            raise self._rt.error(st, "hipMalloc", size=bytes, device=self._device)
        return out.value  # type: ignore[return-value]  # not NULL on success

    def _alloc(self, nbytes: int, alignment: int) -> int:
        return self.allocate(nbytes, alignment)

    def _free(self, ptr: int) -> None:
        st = self._call(self._free_fn, ptr) if self._switch else self._free_fn(ptr)
        if st:
            raise self._rt.error(st, "hipFree", device=self._device, detail=f"ptr={ptr:#x}")

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """``hipFree(ptr)``; ``deallocate(0, ...)`` does nothing."""
        if (type(ptr) is not int or not 0 < ptr <= MAX_ADDRESS
                or type(bytes) is not int or not 0 <= bytes <= MAX_SIZE
                or type(alignment) is not int or alignment not in DEVICE_ALIGNMENTS):
            ptr = check_ptr(ptr)
            check_args(bytes, alignment, MAX_DEVICE_ALIGNMENT)
            if not ptr:
                return
        self._free(ptr)

    def __eq__(self, other: object) -> bool:
        # isinstance as well: mypy before 2.0 (Python 3.9's) narrows only through it
        if type(other) is not type(self) or not isinstance(other, type(self)):
            return NotImplemented
        return other._device == self._device

    def __hash__(self) -> int:
        return hash((type(self), self._device))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self._device})"

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self._device,))

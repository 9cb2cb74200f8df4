"""``DeviceMemoryResource``: ``hipMalloc`` / ``hipFree`` on one device (RMM's
``CudaMemoryResource``, CCCL's ``device_memory_resource``); fine-grained and uncached device
memory through AMD's ``hipExtMallocWithFlags``."""
from __future__ import annotations

from ctypes import c_int, c_void_p
from typing import Any, Callable, Optional, Tuple

from .. import _hip
from .._hip.exceptions import NotSupportedError
from .._hip.types import (DEVICE_MALLOC_UNCACHED_SINCE, hipDeviceMallocFinegrained,
                          hipDeviceMallocUncached)
from ..device import check_device, device_count, get_device
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from .._checks import MAX_SIZE, check_args, check_ptr
from .._limits import MAX_ADDRESS
from ._common import DEVICE_ALIGNMENTS, MAX_DEVICE_ALIGNMENT, SyncResource

__all__ = ["DeviceMemoryResource"]


class DeviceMemoryResource(SyncResource):
    """Device memory from ``hipMalloc``, freed with ``hipFree``, on ``device`` (default: the
    current device when the resource is made).

    ``fine_grained=True``: fine-grained memory (``hipExtMallocWithFlags`` with
    ``hipDeviceMallocFinegrained``), coherent with the host and other devices while kernels
    run; ``uncached=True``: fine-grained memory the device does not cache
    (``hipDeviceMallocUncached``, ROCm 5.5 and later).  Both are AMD's: on the nvidia
    platform (and an AMD runtime too old for uncached memory) they raise
    ``NotSupportedError`` when the resource is made.

    Each call makes ``device`` current for its duration and restores the previous device, and
    switches only when the current device differs (with one visible device it never asks).
    Not stream-ordered: ``allocate_async`` allocates at once and ``deallocate_async`` waits for
    the stream before freeing.  Alignment: a power of two up to 256.  Two resources for the same
    device are equal.
    """

    __slots__ = ("_device", "_rt", "_malloc", "_free_fn", "_switch", "_ext_flags",
                 "_malloc_name")
    properties: Tuple[type, ...] = (device_accessible,)
    #: its memory is shared with other processes by legacy handles (hipmr_ctypes.ipc)
    _ipc_memory = "legacy"

    def __init__(self, device: Optional[Any] = None, *, fine_grained: bool = False,
                 uncached: bool = False) -> None:
        for name, value in (("fine_grained", fine_grained), ("uncached", uncached)):
            if type(value) is not bool:
                raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
        rt = _hip.get_runtime()
        self._device = get_device() if device is None else check_device(device)
        self._rt = rt
        self._ext_flags = (hipDeviceMallocUncached if uncached
                           else hipDeviceMallocFinegrained if fine_grained else 0)
        self._malloc_name = "hipMalloc"
        self._malloc = rt.fn.hipMalloc
        if self._ext_flags:
            self._malloc = _ext_malloc(rt, self._ext_flags, uncached)
            self._malloc_name = "hipExtMallocWithFlags"
        self._free_fn = rt.fn.hipFree
        # With one device, the current device is always this one: never ask.
        self._switch = device_count() > 1

    @property
    def device(self) -> int:
        """The device ordinal the memory lives on."""
        return self._device

    @property
    def fine_grained(self) -> bool:
        """True for fine-grained memory (uncached memory is fine-grained too)."""
        return self._ext_flags != 0

    @property
    def uncached(self) -> bool:
        """True for memory the device does not cache."""
        return self._ext_flags == hipDeviceMallocUncached

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
            raise self._rt.error(st, self._malloc_name, size=bytes, device=self._device)
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
        return other._device == self._device and other._ext_flags == self._ext_flags

    def __hash__(self) -> int:
        if self._ext_flags:
            return hash((type(self), self._device, self._ext_flags))
        return hash((type(self), self._device))

    def __repr__(self) -> str:
        extra = (", uncached=True" if self.uncached
                 else ", fine_grained=True" if self._ext_flags else "")
        return f"{type(self).__name__}(device={self._device}{extra})"

    def __reduce__(self) -> Tuple[Any, ...]:
        if self._ext_flags:
            return (_rebuild, (type(self), self._device, self.fine_grained, self.uncached))
        return (type(self), (self._device,))


def _rebuild(cls: Any, device: int, fine_grained: bool, uncached: bool) -> Any:
    """Unpickle a resource made with keyword arguments."""
    return cls(device, fine_grained=fine_grained, uncached=uncached)


def _ext_malloc(rt: Any, flags: int, uncached: bool) -> Callable[..., int]:
    """``hipMalloc``'s shape over ``hipExtMallocWithFlags(ptr, bytes, flags)``; raises
    NotSupportedError where the runtime has no such memory."""
    ext = rt.fn.hipExtMallocWithFlags
    if rt.platform == "nvidia" or getattr(ext, "missing", False):
        raise NotSupportedError(801, "hipErrorNotSupported",
                                "fine-grained and uncached device memory are AMD's "
                                "(hipExtMallocWithFlags); this runtime has none",
                                "hipExtMallocWithFlags")
    if uncached and rt.runtime_version()[:2] < DEVICE_MALLOC_UNCACHED_SINCE:
        raise NotSupportedError(801, "hipErrorNotSupported",
                                "uncached device memory (hipDeviceMallocUncached) needs HIP "
                                "5.5 (ROCm 5.5) or later", "hipExtMallocWithFlags")

    def hipExtMallocWithFlags(out: Any, nbytes: int) -> int:
        return int(ext(out, nbytes, flags))
    return hipExtMallocWithFlags

"""``AsyncMemoryResource``: stream-ordered allocation from a HIP memory pool
(``hipMallocFromPoolAsync`` / ``hipFreeAsync``; RMM's ``CudaAsyncMemoryResource``), and
``MemoryPool``, the pool object it exposes as ``.pool``."""
from __future__ import annotations

import os
import weakref
from ctypes import byref, c_int, c_uint64, c_void_p
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple, Union

from .. import _hip
from .._exit import finalize, finalizer
from ..errors import NotSupportedError
from .._hip.types import (hipMemAccessDesc, hipMemAccessFlagsProtNone, hipMemAccessFlagsProtRead,
                          hipMemAccessFlagsProtReadWrite, hipMemAllocationTypePinned,
                          hipMemHandleTypeNone, hipMemHandleTypePosixFileDescriptor,
                          hipMemLocation, hipMemLocationTypeDevice, hipMemPoolAttrReleaseThreshold,
                          hipMemPoolAttrReservedMemCurrent, hipMemPoolAttrReservedMemHigh,
                          hipMemPoolAttrUsedMemCurrent, hipMemPoolAttrUsedMemHigh,
                          hipMemPoolProps, hipMemPoolReuseAllowInternalDependencies,
                          hipMemPoolReuseAllowOpportunistic,
                          hipMemPoolReuseFollowEventDependencies)
from ..device import Device, check_device, device_count, get_device
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from .._checks import FAST_ALIGNMENTS as _FAST
from .._checks import check_ptr, check_size, check_stream
from .._limits import MAX_ADDRESS, MAX_ONE_DIGIT_INT
from .._thread_exit import arm
from ..stream_ref import PER_THREAD_HANDLE as _PER_THREAD
from .._device_sizes import parse_config_size, resolve_size
from .._sizes import DeviceFraction, Size, parse_size
from ._common import MAX_DEVICE_ALIGNMENT, check_args

if TYPE_CHECKING:
    from .ipc import ImportedMappings, IpcPoolHandle

__all__ = ["AsyncMemoryResource", "MemoryPool", "MAX_RELEASE_THRESHOLD"]

# The hot paths test ``alignment is DEFAULT_ALIGNMENT``: true for the int 256 only (CPython
# keeps one object for each small int), never for ``256.0`` or a numpy integer.  Sizes up to
# MAX_ONE_DIGIT_INT are tested inline; larger ones (up to ``2**63``) take the checked path.
#: ``_ptr`` and ``_bytes`` before the first allocation: no argument is this object (None and 0,
#: which must be tested, would be)
_NO_ALLOCATION = object()

#: Bytes of the random identity of an exportable pool (``resources.ipc.POOL_ID_BYTES``)
POOL_ID_BYTES = 16
#: The largest release threshold (``UINT64_MAX``): freed memory stays in the pool (RMM's default).
MAX_RELEASE_THRESHOLD = MAX_ADDRESS

_POOL_SUPPORT_HINT = (
    "device {device} reports no memory-pool support (hipDeviceAttributeMemoryPoolsSupported "
    "is 0). ROCm before 6.2 disables memory pools by default: set HIP_MEM_POOL_SUPPORT=1 in the "
    "environment before the process starts to enable them, or use DeviceMemoryResource")


def _parse_threshold(value: Any, name: str = "release_threshold") -> Union[int, DeviceFraction]:
    """A release threshold read by the one size grammar: an int in ``[0, 2**64)``, or a
    fraction of the device's memory (resolved by :func:`_check_threshold`)."""
    if isinstance(value, DeviceFraction):
        return value
    if isinstance(value, (str, float)):
        try:
            value = parse_size(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
        if isinstance(value, DeviceFraction):
            return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of bytes, not {type(value).__name__}")
    if not 0 <= value <= MAX_RELEASE_THRESHOLD:
        raise ValueError(f"{name}={value} is not in [0, 2**64)")
    return int(value)


def _check_threshold(value: Any, name: str = "release_threshold",
                     device: Optional[int] = None) -> int:
    """A release threshold in bytes: a fraction is of ``device``'s total memory."""
    parsed = _parse_threshold(value, name)
    if isinstance(parsed, DeviceFraction):
        return parsed.of(int(Device(device).memory_info()[1]))
    return parsed


#: the first runtime versions whose hipMemPoolProps has maxSize: ROCm 6.2, CUDA 12.2
_MAX_SIZE_SINCE = {"amd": (6, 2, 0), "emulated": (6, 2, 0), "nvidia": (12, 2, 0)}


def _require_max_size(rt: Any) -> None:
    since = _MAX_SIZE_SINCE.get(rt.platform, (6, 2, 0))
    version = rt.runtime_version()
    if tuple(version) < since:
        name = "CUDA" if rt.platform == "nvidia" else "ROCm"
        raise NotSupportedError(801, "hipErrorNotSupported",
                                f"maximum_pool_size needs {name} {since[0]}.{since[1]} or later "
                                f"(hipMemPoolProps.maxSize); this runtime is "
                                f"{'.'.join(map(str, version))}", "AsyncMemoryResource")


def _require_pools(device: int) -> None:
    if not Device(device).supports_memory_pools:
        raise NotSupportedError(801, "hipErrorNotSupported",
                                _POOL_SUPPORT_HINT.format(device=device), "AsyncMemoryResource")


def _handle_types(device: int) -> int:
    try:
        return Device(device).attribute("memory_pool_supported_handle_types")
    except (NotSupportedError, ValueError):
        return 0


@finalizer
def _destroy_pool(destroy: Callable[[int], Any], handle: int) -> None:
    try:
        destroy(handle)
    except Exception:  # interpreter exit: the runtime may already be gone
        pass


def _pool_closed(*args: Any) -> int:
    raise ValueError("AsyncMemoryResource: its memory pool is closed")


def _free_then_destroy(free: Any, pool: "MemoryPool") -> Any:
    """``hipFreeAsync`` for a resource whose owned pool was closed with allocations still out:
    after each free, the pool is destroyed if that was the last one."""
    def free_async(ptr: int, stream: int) -> int:
        st: int = free(ptr, stream)
        if not st:
            pool._destroy_when_unused(stream)
        return st
    return free_async


class MemoryPool:
    """A HIP memory pool (``hipMemPool_t``): its usage counters and settings.

    ``owned`` pools (made by :class:`AsyncMemoryResource`) are destroyed exactly once: by
    ``close()`` or when garbage-collected.  A pool that is not owned (a device's current pool)
    is never destroyed; ``close()`` only stops this object from using it.  After ``close()``
    every method and property except ``closed``, ``owned`` and ``device`` raises ValueError.
    """

    __slots__ = ("_handle", "_device", "_owned", "_rt", "_finalizer", "_users", "_closed",
                 "_ipc_id", "_mapped", "_shared", "_max_size", "__weakref__")

    def __init__(self, handle: int, device: int, owned: bool, rt: Any = None) -> None:
        rt = _hip.get_runtime() if rt is None else rt
        self._handle = handle
        self._device = device
        self._owned = owned
        self._rt = rt
        self._closed = False
        self._max_size: Optional[int] = None        # hipMemPoolProps.maxSize, when this made it
        self._ipc_id: Optional[bytes] = None        # an exportable or imported pool's identity
        self._mapped: Optional["ImportedMappings"] = None   # an imported pool: its mappings
        # an exportable pool's own handle, made by the first Buffer.export_ipc: HIP and CUDA
        # export pointers only of a pool exported already (hipErrorInvalidValue otherwise)
        self._shared: Optional["IpcPoolHandle"] = None
        # by identity: resources on one pool are equal, and a set would keep only one of them
        self._users: "weakref.WeakValueDictionary[int, AsyncMemoryResource]" = \
            weakref.WeakValueDictionary()
        self._finalizer = (finalize(self, _destroy_pool, rt.fn.hipMemPoolDestroy, handle)
                           if owned else None)

    def _live(self) -> int:
        if self._closed:
            raise ValueError("memory pool: this MemoryPool is closed")
        return self._handle

    @property
    def handle(self) -> int:
        """The ``hipMemPool_t`` as an int."""
        return self._live()

    @property
    def device(self) -> int:
        """The device the pool's memory lives on."""
        return self._device

    @property
    def owned(self) -> bool:
        """True when this object destroys the pool (on ``close()`` or garbage collection)."""
        return self._owned

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    @property
    def imported(self) -> bool:
        """True for a pool imported from another process (``AsyncMemoryResource.from_ipc``)."""
        return self._mapped is not None

    def export_handle(self) -> "IpcPoolHandle":
        """A new :class:`~hipmr_ctypes.IpcPoolHandle` of this pool
        (``hipMemPoolExportToShareableHandle``): a POSIX file descriptor that another process
        turns into an importing resource with ``AsyncMemoryResource.from_ipc``.  Only a pool
        made with ``AsyncMemoryResource(enable_ipc=True)`` can be exported (NotSupportedError
        otherwise).  Each call gives a new descriptor, closed by the handle's ``close()``."""
        from .ipc import IpcPoolHandle
        handle = self._live()
        if self._mapped is not None:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "an imported memory pool cannot be exported again",
                                    "MemoryPool.export_handle")
        if self._ipc_id is None:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "this memory pool cannot be shared: make it with "
                                    "AsyncMemoryResource(enable_ipc=True)",
                                    "MemoryPool.export_handle")
        fd = c_int(-1)
        rt = self._rt
        rt.check(rt.fn.hipMemPoolExportToShareableHandle(
            byref(fd), handle, hipMemHandleTypePosixFileDescriptor, 0),
            "hipMemPoolExportToShareableHandle", device=self._device)
        return IpcPoolHandle(fd.value, self._device, self._ipc_id)

    def _get(self, attr: int, name: str) -> int:
        out = c_uint64()
        rt = self._rt
        rt.check(rt.fn.hipMemPoolGetAttribute(self._live(), attr, byref(out)),
                 "hipMemPoolGetAttribute", device=self._device, detail=name)
        return out.value

    def _set(self, attr: int, value: int, name: str) -> None:
        rt = self._rt
        rt.check(rt.fn.hipMemPoolSetAttribute(self._live(), attr, byref(c_uint64(value))),
                 "hipMemPoolSetAttribute", device=self._device, detail=name)

    @property
    def reserved(self) -> int:
        """Bytes of device memory the pool holds now (``hipMemPoolAttrReservedMemCurrent``)."""
        return self._get(hipMemPoolAttrReservedMemCurrent, "reserved")

    @property
    def reserved_high(self) -> int:
        """High-water mark of ``reserved`` (``hipMemPoolAttrReservedMemHigh``)."""
        return self._get(hipMemPoolAttrReservedMemHigh, "reserved_high")

    @property
    def used(self) -> int:
        """Bytes handed out and not yet freed (``hipMemPoolAttrUsedMemCurrent``)."""
        return self._get(hipMemPoolAttrUsedMemCurrent, "used")

    @property
    def used_high(self) -> int:
        """High-water mark of ``used`` (``hipMemPoolAttrUsedMemHigh``)."""
        return self._get(hipMemPoolAttrUsedMemHigh, "used_high")

    @property
    def release_threshold(self) -> int:
        """Bytes the pool keeps reserved when synchronizing instead of returning them to the
        system (``hipMemPoolAttrReleaseThreshold``); settable, ``0 ... 2**64-1``."""
        return self._get(hipMemPoolAttrReleaseThreshold, "release_threshold")

    @release_threshold.setter
    def release_threshold(self, value: int) -> None:
        value = _check_threshold(value, device=self._device)
        self._set(hipMemPoolAttrReleaseThreshold, value, "release_threshold")

    @property
    def max_size(self) -> Optional[int]:
        """The most the pool may reserve, set when it was made
        (``AsyncMemoryResource(maximum_pool_size=...)``, ``hipMemPoolProps.maxSize``); None
        when no maximum was set, or for a pool this package did not make."""
        self._live()
        return self._max_size

    @property
    def reuse_follow_event_dependencies(self) -> bool:
        """``hipMemPoolReuseFollowEventDependencies``: memory freed on one stream may serve
        another stream that waits on an event recorded after the free.  Settable (a bool)."""
        return self._get_flag(hipMemPoolReuseFollowEventDependencies,
                              "reuse_follow_event_dependencies")

    @reuse_follow_event_dependencies.setter
    def reuse_follow_event_dependencies(self, value: bool) -> None:
        self._set_flag(hipMemPoolReuseFollowEventDependencies, value,
                       "reuse_follow_event_dependencies")

    @property
    def reuse_allow_opportunistic(self) -> bool:
        """``hipMemPoolReuseAllowOpportunistic``: memory freed on one stream may serve another
        once the free's work has completed.  Settable (a bool)."""
        return self._get_flag(hipMemPoolReuseAllowOpportunistic, "reuse_allow_opportunistic")

    @reuse_allow_opportunistic.setter
    def reuse_allow_opportunistic(self, value: bool) -> None:
        self._set_flag(hipMemPoolReuseAllowOpportunistic, value, "reuse_allow_opportunistic")

    @property
    def reuse_allow_internal_dependencies(self) -> bool:
        """``hipMemPoolReuseAllowInternalDependencies``: the runtime may make a stream wait on
        the freeing stream's work to reuse its memory.  Settable (a bool)."""
        return self._get_flag(hipMemPoolReuseAllowInternalDependencies,
                              "reuse_allow_internal_dependencies")

    @reuse_allow_internal_dependencies.setter
    def reuse_allow_internal_dependencies(self, value: bool) -> None:
        self._set_flag(hipMemPoolReuseAllowInternalDependencies, value,
                       "reuse_allow_internal_dependencies")

    def _get_flag(self, attr: int, name: str) -> bool:
        out = c_int()
        rt = self._rt
        rt.check(rt.fn.hipMemPoolGetAttribute(self._live(), attr, byref(out)),
                 "hipMemPoolGetAttribute", device=self._device, detail=name)
        return bool(out.value)

    def _set_flag(self, attr: int, value: Any, name: str) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
        rt = self._rt
        rt.check(rt.fn.hipMemPoolSetAttribute(self._live(), attr, byref(c_int(int(value)))),
                 "hipMemPoolSetAttribute", device=self._device, detail=name)

    def reset_high(self) -> None:
        """Reset ``reserved_high`` and ``used_high`` to the current values."""
        self._set(hipMemPoolAttrReservedMemHigh, 0, "reserved_high")
        self._set(hipMemPoolAttrUsedMemHigh, 0, "used_high")

    def trim_to(self, bytes: int) -> None:
        """Release reserved memory back to the system until at most ``bytes`` stay reserved
        (``hipMemPoolTrimTo``); memory in use is never released."""
        nbytes = check_size(bytes)
        rt = self._rt
        rt.check(rt.fn.hipMemPoolTrimTo(self._live(), nbytes), "hipMemPoolTrimTo",
                 device=self._device)

    def set_access(self, device: Any, read_write: bool = True) -> None:
        """Let ``device`` (a peer) read and write this pool's memory, or, with
        ``read_write=False``, take that access away (``hipMemPoolSetAccess``)."""
        if not isinstance(read_write, bool):
            raise TypeError(f"read_write must be a bool, not {type(read_write).__name__}")
        handle = self._live()
        ordinal = check_device(device)
        desc = hipMemAccessDesc()
        desc.location.type = hipMemLocationTypeDevice
        desc.location.id = ordinal
        desc.flags = hipMemAccessFlagsProtReadWrite if read_write else hipMemAccessFlagsProtNone
        rt = self._rt
        rt.check(rt.fn.hipMemPoolSetAccess(handle, desc, 1), "hipMemPoolSetAccess",
                 device=ordinal)

    def access(self, device: Any) -> str:
        """``"read_write"``, ``"read"`` or ``"none"``: what ``device`` may do with this pool's
        memory (``hipMemPoolGetAccess``)."""
        handle = self._live()
        ordinal = check_device(device)
        loc = hipMemLocation()
        loc.type = hipMemLocationTypeDevice
        loc.id = ordinal
        out = c_int()
        rt = self._rt
        rt.check(rt.fn.hipMemPoolGetAccess(out, handle, loc), "hipMemPoolGetAccess",
                 device=ordinal)
        return {hipMemAccessFlagsProtReadWrite: "read_write",
                hipMemAccessFlagsProtRead: "read"}.get(out.value, "none")

    def close(self) -> None:
        """Stop using the pool (idempotent): resources using it refuse to allocate from now on
        (ValueError) but still free what they handed out.  An owned pool is destroyed as soon
        as nothing allocated from it is outstanding: now, or when the last of it is freed
        through a resource (destroying a pool with live allocations and freeing them later
        crashes CUDA 13)."""
        if self._closed:
            return
        self._closed = True
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.close()
        for user in list(self._users.values()):
            user._malloc = _pool_closed
            if self._finalizer is not None:
                user._free_fn = _free_then_destroy(user._free_fn, self)
        if self._finalizer is not None:
            self._destroy_when_unused(None)

    def _destroy_when_unused(self, stream: Optional[int]) -> None:
        """Destroy a closed, owned pool if nothing allocated from it is outstanding once
        ``stream`` (None: the whole device) has done its work."""
        finalizer = self._finalizer
        if finalizer is None or not finalizer.alive:
            return
        rt = self._rt
        used = c_uint64()
        if self._mapped is not None:   # an imported pool: what this process still maps
            if not self._mapped:
                finalizer()
            return
        try:
            if stream is None:
                Device(self._device).synchronize()
            elif rt.fn.hipStreamSynchronize(stream):
                return
            if rt.fn.hipMemPoolGetAttribute(self._handle, hipMemPoolAttrUsedMemCurrent,
                                            byref(used)):
                return
        finally:
            rt.fn.hipGetLastError()
        if used.value == 0:
            finalizer()

    def __enter__(self) -> "MemoryPool":
        self._live()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryPool):
            return NotImplemented
        return other._handle == self._handle

    def __hash__(self) -> int:
        return hash((MemoryPool, self._handle))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._handle:#x}"
        return (f"<MemoryPool {state} device={self._device} "
                f"{'owned' if self._owned else 'not owned'}>")


class AsyncMemoryResource:
    """Stream-ordered device memory from a memory pool: ``hipMallocFromPoolAsync`` /
    ``hipFreeAsync`` (RMM's ``CudaAsyncMemoryResource``).

    ``AsyncMemoryResource(device=None, *, initial_pool_size=None, release_threshold=None,
    enable_ipc=False, maximum_pool_size=None)`` creates and owns a new pool on ``device``
    (default: the current one): ``release_threshold`` defaults to ``2**64-1`` so freed memory
    stays in the pool; ``initial_pool_size`` bytes are allocated and freed once to prime it;
    ``enable_ipc`` makes the pool exportable as POSIX file descriptors; ``maximum_pool_size``
    caps what the pool may reserve (``hipMemPoolProps.maxSize``: ROCm 6.2+ / CUDA 12.2+,
    NotSupportedError before).  Sizes as everywhere: bytes, ``"4GiB"``, ``"80%"``.  :meth:`from_default_pool` uses a device's
    current pool instead (not owned, never destroyed).

    Raises :class:`NotSupportedError` when the device has no memory-pool support (ROCm before
    6.2 unless ``HIP_MEM_POOL_SUPPORT=1``).  ``allocate`` / ``deallocate`` run on the null
    stream and wait for it.  Alignment: a power of two up to 256.  Equal when using the same
    pool.  ``.pool`` is the :class:`MemoryPool`; ``close()`` closes it.
    """

    #: validates every argument before any native call (adaptors over it rely on this)
    _checks_arguments = True

    __slots__ = ("_pool", "_handle", "_device", "_rt", "_malloc", "_free_fn", "_settings",
                 "_stream", "_ptr", "_bytes", "__weakref__")
    _ptr: object
    _bytes: object
    properties: Tuple[type, ...] = (device_accessible,)

    def __init__(self, device: Optional[Any] = None, *, initial_pool_size: Optional[Size] = None,
                 release_threshold: Optional[Size] = None, enable_ipc: bool = False,
                 maximum_pool_size: Optional[Size] = None) -> None:
        initial = (None if initial_pool_size is None
                   else parse_config_size(initial_pool_size, "initial_pool_size"))
        most = (None if maximum_pool_size is None
                else parse_config_size(maximum_pool_size, "maximum_pool_size"))
        if type(initial) is int and type(most) is int and initial > most:
            raise ValueError(f"initial_pool_size={initial_pool_size!r} is larger than "
                             f"maximum_pool_size={maximum_pool_size!r}")
        threshold_size = (None if release_threshold is None
                          else _parse_threshold(release_threshold))
        if not isinstance(enable_ipc, bool):
            raise TypeError(f"enable_ipc must be a bool, not {type(enable_ipc).__name__}")
        rt = _hip.get_runtime()
        dev = get_device() if device is None else check_device(device)
        initial_pool_size = (None if initial is None
                             else resolve_size(initial, "initial_pool_size", dev))
        threshold = (MAX_RELEASE_THRESHOLD if threshold_size is None
                     else _check_threshold(threshold_size, device=dev))
        maximum = None if most is None else resolve_size(most, "maximum_pool_size", dev)
        if maximum is not None:
            if maximum == 0:
                raise ValueError("maximum_pool_size=0: a pool needs room for one allocation "
                                 "(None: no maximum)")
            if initial_pool_size is not None and initial_pool_size > maximum:
                raise ValueError(f"initial_pool_size={initial_pool_size} bytes is larger than "
                                 f"maximum_pool_size={maximum} bytes")
            _require_max_size(rt)
        _require_pools(dev)
        if enable_ipc and not _handle_types(dev) & hipMemHandleTypePosixFileDescriptor:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    f"device {dev} cannot export memory pools as POSIX file "
                                    "descriptors (enable_ipc=True)", "AsyncMemoryResource")
        props = hipMemPoolProps()
        props.allocType = hipMemAllocationTypePinned
        props.handleTypes = (hipMemHandleTypePosixFileDescriptor if enable_ipc
                             else hipMemHandleTypeNone)
        props.location.type = hipMemLocationTypeDevice
        props.location.id = dev
        props.maxSize = maximum or 0
        out = c_void_p()
        rt.check(rt.fn.hipMemPoolCreate(out, props), "hipMemPoolCreate", device=dev)
        pool = MemoryPool(out.value or 0, dev, True, rt)
        pool._max_size = maximum
        if enable_ipc:
            pool._ipc_id = os.urandom(POOL_ID_BYTES)
        try:
            pool.release_threshold = threshold
            if initial_pool_size:
                _prime(rt, pool, dev, initial_pool_size)
        except BaseException:
            pool.close()
            raise
        self._bind(pool, rt, (("initial_pool_size", initial_pool_size),
                              ("release_threshold", threshold), ("enable_ipc", enable_ipc),
                              ("maximum_pool_size", maximum)))

    @classmethod
    def from_default_pool(cls, device: Optional[Any] = None) -> "AsyncMemoryResource":
        """A resource over ``device``'s current memory pool (``hipDeviceGetMemPool``; default
        device: the current one).  The pool is not owned: closing never destroys it."""
        rt = _hip.get_runtime()
        dev = get_device() if device is None else check_device(device)
        _require_pools(dev)
        out = c_void_p()
        rt.check(rt.fn.hipDeviceGetMemPool(out, dev), "hipDeviceGetMemPool", device=dev)
        self = cls.__new__(cls)
        self._bind(MemoryPool(out.value or 0, dev, False, rt), rt, (("default_pool", True),))
        return self

    @classmethod
    def from_ipc(cls, handle: "IpcPoolHandle", device: Optional[Any] = None
                 ) -> "AsyncMemoryResource":
        """An importing resource over the pool of ``handle`` (exported by another process with
        ``MemoryPool.export_handle()``; ``hipMemPoolImportFromShareableHandle``).

        It only maps: ``Buffer.from_ipc(descriptor, resource)`` gives a Buffer over memory of
        that pool, and closing the Buffer unmaps it.  Allocating raises NotSupportedError.
        ``device`` (default: the current one) is the device this process reads the memory
        from: when it is not the pool's device, the importing resource grants it access to the
        imported pool (``hipMemPoolSetAccess``; the exporter's grants do not carry over).
        ``close()`` destroys the imported pool once nothing mapped from it is left; ``handle``
        stays open (close it when no other import needs it)."""
        from .ipc import ImportedMappings, cannot_allocate, import_pool, unmap_only
        from .ipc import IpcPoolHandle
        if not isinstance(handle, IpcPoolHandle):
            raise TypeError(f"handle must be an IpcPoolHandle, not {type(handle).__name__}")
        handle.fd   # ValueError when closed
        rt = _hip.get_runtime()
        dev = get_device() if device is None else check_device(device)
        pool_device = handle.device
        if pool_device != dev:
            check_device(pool_device, "the handle's device")
        pool = MemoryPool(import_pool(handle), pool_device, True, rt)
        pool._ipc_id = handle.pool_id
        mapped = ImportedMappings()
        pool._mapped = mapped
        try:
            if dev != pool_device:
                pool.set_access(dev)
        except BaseException:
            pool.close()
            raise
        self = cls.__new__(cls)
        self._bind(pool, rt, (("imported_from_device", pool_device), ("accessed_from", dev)))
        self._malloc = cannot_allocate
        self._free_fn = unmap_only(self._free_fn, mapped)
        return self

    @classmethod
    def from_pool_handle(cls, handle: Any, device: Optional[Any] = None
                         ) -> "AsyncMemoryResource":
        """A resource over another library's memory pool: ``handle`` is a live
        ``hipMemPool_t`` (``cudaMemPool_t`` on nvidia) as an int, a ``ctypes.c_void_p``, or an
        object that ``int()`` turns into one (hip-python's ``hipMemPool_t``,
        cuda-bindings' ``cudaMemPool_t`` / ``CUmemoryPool``); CuPy's ``MemoryAsyncPool``
        is one such library.  The pool is not owned: nothing here destroys it, so keep the
        library that made it from destroying it while the resource (or memory from it) is
        in use.

        ``device`` (default: found from the pool) is the device the pool's memory lives on:
        without it, the one device that has read-write access to the pool
        (``hipMemPoolGetAccess``); a pool that grants that access to peers too needs
        ``device``.  A handle the runtime does not know raises ValueError; TypeError /
        ValueError for a handle that is not a pointer, before any native call."""
        value = _pool_handle_value(handle)
        dev = None if device is None else check_device(device)
        rt = _hip.get_runtime()
        devices = range(device_count()) if dev is None else (dev,)
        read_write = []
        for ordinal in devices:
            loc = hipMemLocation()
            loc.type = hipMemLocationTypeDevice
            loc.id = ordinal
            flags = c_int()
            if rt.fn.hipMemPoolGetAccess(flags, value, loc):
                rt.clear_last_error()
                raise ValueError(f"handle={value:#x} is not a memory pool the runtime knows "
                                 "(hipMemPoolGetAccess refused it)")
            if flags.value == hipMemAccessFlagsProtReadWrite:
                read_write.append(ordinal)
        if dev is None:
            if len(read_write) != 1:
                raise ValueError(f"the pool {value:#x} is read-write on devices {read_write}: "
                                 "pass device= (the device its memory lives on)")
            dev = read_write[0]
        elif not read_write:
            raise ValueError(f"the pool {value:#x} cannot be used from device {dev} (no "
                             "read-write access): pass the pool's own device")
        self = cls.__new__(cls)
        self._bind(MemoryPool(value, dev, False, rt), rt, (("foreign_pool", True),))
        return self

    def _bind(self, pool: MemoryPool, rt: Any, settings: Tuple[Any, ...]) -> None:
        self._pool = pool
        self._handle = pool._handle
        self._device = pool._device
        self._rt = rt
        self._settings = settings
        self._malloc = rt.fn.hipMallocFromPoolAsync
        self._free_fn = rt.fn.hipFreeAsync
        self._stream = 0  # the stream handle last validated (see _stream_arg)
        self._ptr = _NO_ALLOCATION  # the pointer last allocated (see allocate_async)
        self._bytes = _NO_ALLOCATION  # the size last allocated (see allocate_async)
        pool._users[id(self)] = self

    def __copy__(self) -> "AsyncMemoryResource":
        """Another resource on the same pool, which ``pool.close()`` closes too (a copy of
        the slots alone would not be known to the pool, and go on allocating from it)."""
        cls = type(self)
        new = cls.__new__(cls)
        for name in ("_pool", "_handle", "_device", "_rt", "_malloc", "_free_fn", "_settings",
                     "_stream", "_ptr", "_bytes"):
            setattr(new, name, getattr(self, name))
        self._pool._users[id(new)] = new
        new._malloc, new._free_fn = self._malloc, self._free_fn  # if closed meanwhile
        return new

    def __deepcopy__(self, memo: Any) -> "AsyncMemoryResource":
        return self.__copy__()

    def __reduce__(self) -> Tuple[Any, ...]:
        """Pickled by its settings, as every resource is: unpickling makes a new pool with
        the settings this one was made with (``AsyncMemoryResource(device, ...)``), or
        takes the device's current pool again (:meth:`from_default_pool`).  A pool's memory
        never travels: an importing resource (:meth:`from_ipc`) or one over another
        library's pool raises TypeError (send the :class:`IpcPoolHandle` instead)."""
        settings = dict(self._settings)
        if settings.get("default_pool"):
            return (_rebuild, (self._device, None))
        if "enable_ipc" in settings:
            return (_rebuild, (self._device, {
                "initial_pool_size": settings.get("initial_pool_size"),
                "release_threshold": settings.get("release_threshold"),
                "enable_ipc": settings["enable_ipc"]}))
        raise TypeError(f"{self!r} cannot be pickled: its pool belongs to another process or "
                        "library (pickle the IpcPoolHandle of an exported pool, through "
                        "multiprocessing, instead)")

    @property
    def pool(self) -> MemoryPool:
        """The :class:`MemoryPool` this resource allocates from."""
        return self._pool

    @property
    def device(self) -> int:
        """The device ordinal the memory lives on."""
        return self._device

    # ---- hot path: one inlined test for the usual call (an int size, the default alignment,
    # the stream last validated here, passed again: the same object; or a created stream's
    # int handle up to 2**63, tested in full) and the native call; a free tests the pointer
    # the same way: the int object the last allocation returned (an address the runtime gave,
    # so an int in range: nothing to test), or any int in (0, 2**63]; a size is the int object
    # the last allocation took (tested then; an int never changes: a caller that frees with the
    # size it allocated with, as Buffer does, or allocates the same size object again, skips
    # its test), or an int tested here;
    # anything else takes the checked path, which tests the other fast cases, converts what it
    # may (Stream, stream_ref, numpy integers, handles above 2**63), names what it rejects and
    # remembers a validated int handle.  An allocation on the per-thread stream (handle 2)
    # always takes it: the calling thread is made to wait for that stream when it ends
    # (hipmr_ctypes._thread_exit), so that handle is never remembered.  The test is kept out
    # of the native call's error handling, so no error of the call is swallowed.
    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """``hipMallocFromPoolAsync(bytes)`` on ``stream`` (anything ``stream_ref`` accepts);
        returns the pointer as an int (0 for ``bytes == 0``)."""
        if not ((stream is self._stream or type(stream) is int and 2 < stream <= 1 << 63)
                and (bytes is self._bytes or type(bytes) is int and 0 < bytes <= MAX_ONE_DIGIT_INT)
                and alignment is DEFAULT_ALIGNMENT):
            bytes, stream = self._alloc_args(bytes, alignment, stream)
            if not bytes:
                return 0
        out = c_void_p()
        malloc = self._malloc
        st = malloc(out, bytes, self._handle, stream)
        if st:
            raise self._rt.error(st, "hipMallocFromPoolAsync", size=bytes,
                                 device=self._device)
        ptr: int = out.value  # type: ignore[assignment]  # not NULL on success
        self._ptr = ptr
        self._bytes = bytes
        return ptr

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """``hipFreeAsync(ptr)`` on ``stream``; ``ptr == 0`` does nothing."""
        if not ((stream is self._stream or type(stream) is int and 0 <= stream <= 1 << 63)
                and (ptr is self._ptr or type(ptr) is int and 0 < ptr <= 1 << 63)
                and (bytes is self._bytes or type(bytes) is int and 0 <= bytes <= MAX_ONE_DIGIT_INT)
                and alignment is DEFAULT_ALIGNMENT):
            ptr, stream = self._free_args(ptr, bytes, alignment, stream)
            if not ptr:
                return
        free = self._free_fn
        st = free(ptr, stream)
        if st:
            raise self._rt.error(st, "hipFreeAsync", device=self._device,
                                 detail=f"ptr={ptr:#x}")

    def _alloc_args(self, nbytes: Any, alignment: Any, stream: Any) -> Tuple[int, int]:
        """The checked path of ``allocate_async``'s test: (size, stream handle), or the
        precise TypeError / ValueError."""
        try:
            fast = (type(nbytes) is int and 0 <= nbytes <= 1 << 63
                    and _FAST[alignment] is alignment)
        except (KeyError, TypeError):  # an alignment that is no key / not hashable
            fast = False
        if not fast:
            nbytes = check_args(nbytes, alignment, MAX_DEVICE_ALIGNMENT)
        handle = self._stream_arg(stream)
        if handle == _PER_THREAD:  # the calling thread's own: waited for when it ends
            arm(self._rt)
        return nbytes, handle

    def _free_args(self, ptr: Any, nbytes: Any, alignment: Any, stream: Any
                   ) -> Tuple[int, int]:
        """The checked path of ``deallocate_async``'s test: (pointer, stream handle)."""
        try:
            fast = (type(ptr) is int is type(nbytes) and 0 <= ptr <= MAX_ADDRESS
                    and 0 <= nbytes <= 1 << 63 and _FAST[alignment] is alignment)
        except (KeyError, TypeError):
            fast = False
        if not fast:
            ptr = check_ptr(ptr)
            check_args(nbytes, alignment, MAX_DEVICE_ALIGNMENT)
        return ptr, self._stream_arg(stream)

    def _stream_arg(self, stream: Any) -> int:
        """The handle of ``stream``; a valid int handle is remembered, so that the hot paths
        know it by identity next time (any value in ``[0, 2**64)`` is a valid handle, so an
        int once validated is valid for ever; the slot is one atomic store)."""
        handle = check_stream(stream)
        if stream is handle and handle != _PER_THREAD:  # see allocate_async's test
            self._stream = handle
        return handle

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocate on the null stream and wait for it."""
        ptr = self.allocate_async(bytes, alignment, 0)
        if ptr:
            st = self._rt.fn.hipStreamSynchronize(0)
            if st:
                self._free_fn(ptr, 0)
                raise self._rt.error(st, "hipStreamSynchronize", device=self._device)
        return ptr

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Free on the null stream and wait for it."""
        self.deallocate_async(ptr, bytes, alignment, 0)
        if ptr:
            self._rt.check(self._rt.fn.hipStreamSynchronize(0), "hipStreamSynchronize",
                           device=self._device)

    def close(self) -> None:
        """Close the pool (see :meth:`MemoryPool.close`)."""
        self._pool.close()

    def __enter__(self) -> "AsyncMemoryResource":
        self._pool._live()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        # isinstance as well: mypy before 2.0 (Python 3.9's) narrows only through it
        if type(other) is not type(self) or not isinstance(other, type(self)):
            return NotImplemented
        return other._handle == self._handle

    def __hash__(self) -> int:
        return hash((type(self), self._handle))

    def __repr__(self) -> str:
        settings = "".join(f", {k}={v}" for k, v in self._settings if v is not None)
        state = "closed" if self._pool._closed else f"{self._handle:#x}"
        return f"{type(self).__name__}(device={self._device}{settings}) [pool {state}]"


def _pool_handle_value(handle: Any) -> int:
    """The address of a pool handle given as an int, a ``c_void_p`` or a binding's handle
    object (``int()``); TypeError / ValueError for anything else or NULL."""
    if isinstance(handle, c_void_p):
        value: Any = handle.value or 0
    elif handle is None or isinstance(handle, (bool, float, str, bytes)):
        raise TypeError(f"handle must be a hipMemPool_t (an int address), not "
                        f"{type(handle).__name__}")
    elif isinstance(handle, int):
        value = handle
    else:
        # the handle's own value: cuda-bindings' and hip-python's handle objects give it to
        # int(); their getPtr() is the address of the object's storage, not the handle
        try:
            value = int(handle)
        except (TypeError, ValueError):
            raise TypeError(f"handle must be a hipMemPool_t (an int address), not "
                            f"{type(handle).__name__}") from None
    value = check_ptr(value, "handle")
    if not value:
        raise ValueError("handle is NULL: not a memory pool")
    return int(value)


def _rebuild(device: int, settings: Optional[Any]) -> AsyncMemoryResource:
    """Unpickling an :class:`AsyncMemoryResource` (see its ``__reduce__``)."""
    if settings is None:
        return AsyncMemoryResource.from_default_pool(device)
    return AsyncMemoryResource(device, **settings)


def _prime(rt: Any, pool: MemoryPool, device: int, nbytes: int) -> None:
    """Allocate then free ``nbytes`` once on the null stream of ``device`` and wait."""
    with Device(device):
        out = c_void_p()
        rt.check(rt.fn.hipMallocFromPoolAsync(out, nbytes, pool._handle, 0),
                 "hipMallocFromPoolAsync", size=nbytes, device=device)
        st = rt.fn.hipFreeAsync(out.value, 0)
        st2 = rt.fn.hipStreamSynchronize(0)
        rt.check(st, "hipFreeAsync", device=device)
        rt.check(st2, "hipStreamSynchronize", device=device)

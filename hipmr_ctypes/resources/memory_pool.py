"""``MemoryPool``: a HIP memory pool (``hipMemPool_t``), its usage counters and settings;
the pool of an :class:`~hipmr_ctypes.AsyncMemoryResource` (``resource.pool``).

The resources that allocate from a pool register with it (:meth:`MemoryPool._add_user`);
``close()`` calls each one's ``_pool_closed(destroy)``, and the resource changes its own
functions.  A shareable pool's IPC state is one ``hipmr_ctypes.ipc.PoolIpc``, given when the
pool is made."""
from __future__ import annotations

import weakref
from ctypes import byref, c_int, c_uint64
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import _hip
from .._exit import finalize, finalizer
from .._checks import check_size
from .._hip.types import (hipMemAccessDesc, hipMemAccessFlagsProtNone, hipMemAccessFlagsProtRead,
                          hipMemAccessFlagsProtReadWrite, hipMemLocation,
                          hipMemLocationTypeDevice, hipMemPoolAttrReleaseThreshold,
                          hipMemPoolAttrReservedMemCurrent, hipMemPoolAttrReservedMemHigh,
                          hipMemPoolAttrUsedMemCurrent, hipMemPoolAttrUsedMemHigh,
                          hipMemPoolReuseAllowInternalDependencies,
                          hipMemPoolReuseAllowOpportunistic,
                          hipMemPoolReuseFollowEventDependencies)
from .._limits import MAX_ADDRESS
from .._sizes import DeviceFraction, parse_size
from ..device import Device, check_device
from ..errors import NotSupportedError

if TYPE_CHECKING:
    from typing import Protocol

    from ..ipc import IpcPoolHandle, PoolIpc

    class PoolUser(Protocol):
        """What a resource on a pool offers it."""

        def _pool_closed(self, destroy: Optional[Callable[[Optional[int]], None]]) -> None:
            ...

__all__ = ["MemoryPool", "MAX_RELEASE_THRESHOLD"]

#: The largest release threshold (``UINT64_MAX``): freed memory stays in the pool (RMM's default).
MAX_RELEASE_THRESHOLD = MAX_ADDRESS


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


@finalizer
def _destroy_pool(destroy: Callable[[int], Any], handle: int) -> None:
    try:
        destroy(handle)
    except Exception:  # interpreter exit: the runtime may already be gone
        pass


class MemoryPool:
    """A HIP memory pool (``hipMemPool_t``): its usage counters and settings.

    ``owned`` pools (made by :class:`AsyncMemoryResource`) are destroyed exactly once: by
    ``close()`` or when garbage-collected.  A pool that is not owned (a device's current pool)
    is never destroyed; ``close()`` only stops this object from using it.  After ``close()``
    every method and property except ``closed``, ``owned`` and ``device`` raises ValueError.
    """

    __slots__ = ("_handle", "_device", "_owned", "_rt", "_finalizer", "_users", "_closed",
                 "_ipc", "_max_size", "__weakref__")

    def __init__(self, handle: int, device: int, owned: bool, rt: Any = None, *,
                 max_size: Optional[int] = None, ipc: Optional["PoolIpc"] = None) -> None:
        rt = _hip.get_runtime() if rt is None else rt
        self._handle = handle
        self._device = device
        self._owned = owned
        self._rt = rt
        self._closed = False
        self._max_size = max_size   # hipMemPoolProps.maxSize, when this package made the pool
        self._ipc = ipc             # a shareable pool's IPC state (hipmr_ctypes.ipc); else None
        # by identity: resources on one pool are equal, and a set would keep only one of them
        self._users: "weakref.WeakValueDictionary[int, PoolUser]" = weakref.WeakValueDictionary()
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
        ipc = self._ipc
        return ipc is not None and ipc.imported

    def export_handle(self) -> "IpcPoolHandle":
        """A new :class:`~hipmr_ctypes.IpcPoolHandle` of this pool
        (``hipMemPoolExportToShareableHandle``): a POSIX file descriptor that another process
        turns into an importing resource with ``AsyncMemoryResource.from_ipc``.  Only a pool
        made with ``AsyncMemoryResource(enable_ipc=True)`` can be exported (NotSupportedError
        otherwise).  Each call gives a new descriptor, closed by the handle's ``close()``."""
        handle = self._live()
        ipc = self._ipc
        if ipc is not None and ipc.imported:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "an imported memory pool cannot be exported again",
                                    "MemoryPool.export_handle")
        if ipc is None:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "this memory pool cannot be shared: make it with "
                                    "AsyncMemoryResource(enable_ipc=True)",
                                    "MemoryPool.export_handle")
        from ..ipc import export_pool
        return export_pool(handle, self._device, ipc.pool_id, self._rt)

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
        if self._ipc is not None:
            self._ipc.close()
        owned = self._finalizer is not None
        destroy = self._destroy_when_unused if owned else None
        for user in list(self._users.values()):
            user._pool_closed(destroy)
        if owned:
            self._destroy_when_unused(None)

    def _add_user(self, user: "PoolUser") -> None:
        """``user`` allocates from this pool: :meth:`close` calls its ``_pool_closed``."""
        self._users[id(user)] = user

    def _destroy_when_unused(self, stream: Optional[int]) -> None:
        """Destroy a closed, owned pool if nothing allocated from it is outstanding once
        ``stream`` (None: the whole device) has done its work."""
        finalizer = self._finalizer
        if finalizer is None or not finalizer.alive:
            return
        rt = self._rt
        used = c_uint64()
        ipc = self._ipc
        if ipc is not None and ipc.mappings is not None:   # imported: what this process maps
            if not ipc.mappings:
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

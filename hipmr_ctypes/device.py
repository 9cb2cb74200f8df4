"""Runtime and device queries: ``platform()``, versions, ``device_count()``, ``Device``."""
from __future__ import annotations

import ctypes
import operator
import threading
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Generator, Optional, Tuple, Union

from . import _hip
from ._hip.exceptions import NoDeviceError, NotSupportedError
from ._hip.types import (DEVICE_ATTRIBUTES, hipDeviceAttributeIntegrated,
                         hipDeviceAttributeManagedMemory,
                         hipDeviceAttributeMemoryPoolsSupported,
                         hipDeviceAttributePageableMemoryAccess, MEM_ADVICE,
                         hipCpuDeviceId)

__all__ = ["platform", "runtime_version", "driver_version", "device_count", "get_device",
           "set_device", "Device", "check_device", "prefetch", "synchronize", "on_device"]


def platform() -> str:
    """The selected platform: ``"amd"``, ``"nvidia"`` or ``"emulated"`` (loads nothing)."""
    rt = _hip._runtime
    return rt.platform if rt is not None else _hip._platform or _hip.selected_platform()


def runtime_version() -> Tuple[int, int, int]:
    """The runtime's version ``(major, minor, patch)`` (HIP's encoding; CUDA's on ``nvidia``)."""
    return _hip.get_runtime().runtime_version()


def driver_version() -> Tuple[int, int, int]:
    """The driver's version ``(major, minor, patch)``."""
    return _hip.get_runtime().driver_version()


#: HIP statuses of ``hipGetDeviceCount`` that mean "no usable device here": no device, and a
#: runtime with no (or too old a) driver beneath it (``cudaErrorInsufficientDriver`` on nvidia).
_NO_DEVICE_CODES = (100, 35)


def device_count() -> int:
    """How many devices the runtime sees; 0 when it reports ``hipErrorNoDevice`` or
    ``hipErrorInsufficientDriver`` (a runtime library with no driver beneath it)."""
    rt = _hip.get_runtime()
    out = ctypes.c_int(0)
    st = rt.fn.hipGetDeviceCount(out)
    if st:
        err = rt.error(st, "hipGetDeviceCount")
        if err.code in _NO_DEVICE_CODES:
            return 0
        raise err
    return out.value


def get_device() -> int:
    """The calling thread's current device ordinal."""
    rt = _hip.get_runtime()
    out = ctypes.c_int()
    rt.check(rt.fn.hipGetDevice(out), "hipGetDevice")
    return out.value


# ---- the calling thread's current device, read as cheaply as the loaded runtime allows ---------

_C_FUNCTION: Any = getattr(ctypes, "_CFuncPtr")   # the type of every foreign function


def _device_reader(fn: Any) -> Callable[[Any], int]:
    """``hipGetDevice`` as cheap as ctypes makes it: a native function is called through a
    prototype without argument conversion (given a ``byref``); the emulated one as it is.
    The GIL is let go during the call as for every native call: a first call in a new thread
    may wait for the runtime's locks, which a thread that wants the GIL can hold (a
    prototype that kept the GIL hung a GPU test that way)."""
    if isinstance(fn, _C_FUNCTION):
        address: int = ctypes.cast(fn, ctypes.c_void_p).value or 0
        reader: Callable[[Any], int] = ctypes.CFUNCTYPE(ctypes.c_int)(address)
        return reader
    native: Callable[[Any], int] = fn
    return native


def device_function(rt: Any) -> Callable[[], int]:
    """A function returning the calling thread's current device for the runtime ``rt`` (the
    loaded one): with exactly one device visible it is 0 without asking (no other device can
    be current); with several, the runtime's own ``hipGetDevice`` into an int of the calling
    thread (one shared int would race, as the call lets the GIL go); a failure raises the
    package's error through :func:`get_device`."""
    try:
        count = device_count()
    except Exception:  # noqa: BLE001 - get_device raises what there is to raise
        count = 0
    if count == 1:
        def only_device() -> int:
            return 0
        return only_device
    if count < 1:
        return get_device
    read = _device_reader(rt.fn.hipGetDevice)
    local = threading.local()

    def current_device() -> int:
        try:
            ref, out = local.slot
        except AttributeError:
            out = ctypes.c_int()
            ref, out = local.slot = (ctypes.byref(out), out)
        if read(ref):
            return get_device()  # the status as the package's error
        value: int = out.value
        return value
    return current_device


#: (the runtime, its current-device function): made again when another runtime is loaded
_devices: Tuple[Any, Callable[[], int]] = (None, get_device)


def current_device_function() -> Callable[[], int]:
    """:func:`device_function` of the loaded runtime (loading it if need be), made once."""
    global _devices
    rt = _hip.get_runtime()
    devices = _devices
    if devices[0] is not rt:
        devices = _devices = (rt, device_function(rt))
    return devices[1]


def check_device(device: object, name: str = "device") -> int:
    """Validate a device argument (an int ordinal or a :class:`Device`); return the ordinal.

    Raises TypeError / ValueError before any native call that would change state, and
    NoDeviceError when the runtime sees no device at all.
    """
    if isinstance(device, Device):
        return device.id
    if isinstance(device, bool):
        raise TypeError(f"{name} must be an int device ordinal or a Device, not bool")
    if not isinstance(device, int):
        try:
            device = operator.index(device)  # type: ignore[arg-type]  # numpy ints and the like
        except TypeError:
            raise TypeError(f"{name} must be an int device ordinal or a Device, "
                            f"not {type(device).__name__}") from None
    count = device_count()
    if count == 0:
        raise NoDeviceError(100, "hipErrorNoDevice", "no device is visible", None,
                            f"{name}={device}")
    if not 0 <= device < count:
        raise ValueError(f"{name}={device} is out of range: {count} device(s) visible")
    return device


def set_device(device: Union[int, "Device"]) -> None:
    """Make ``device`` current for the calling thread."""
    ordinal = check_device(device)
    rt = _hip.get_runtime()
    rt.check(rt.fn.hipSetDevice(ordinal), "hipSetDevice", device=ordinal)


@contextmanager
def on_device(ordinal: int) -> Generator[None, None, None]:
    """``with on_device(i):`` makes the (already validated) ordinal ``i`` current for the
    block and restores the previous device; asks the runtime nothing more when it is current
    already.  The light form of ``with Device(i):`` for the package's own calls."""
    rt = _hip.get_runtime()
    cur = ctypes.c_int()
    rt.check(rt.fn.hipGetDevice(cur), "hipGetDevice")
    prev = cur.value
    if prev == ordinal:
        yield
        return
    rt.check(rt.fn.hipSetDevice(ordinal), "hipSetDevice", device=ordinal)
    try:
        yield
    finally:
        rt.fn.hipSetDevice(prev)


_NO_SWITCH = nullcontext()


def on_device_or_current(ordinal: Optional[int]) -> ContextManager[None]:
    """``with on_device_or_current(d):`` is ``with on_device(d):`` for an ordinal, and changes
    nothing for None (host memory, or memory whose device only the current one says): the
    package's calls on memory of a known device run with that device current.  The device
    current already (always so with one device visible) costs no runtime call and no
    generator: the copies and memsets of small buffers are mostly this test."""
    if ordinal is None or current_device_function()() == ordinal:
        return _NO_SWITCH
    return on_device(ordinal)


def synchronize() -> None:
    """Wait for all work on the current device."""
    rt = _hip.get_runtime()
    rt.check(rt.fn.hipDeviceSynchronize(), "hipDeviceSynchronize")


def prefetch(ptr: int, nbytes: int, device: int, stream: object = 0) -> None:
    """Prefetch managed memory ``[ptr, ptr+nbytes)`` to ``device`` on ``stream``."""
    from .stream_refs import stream_ref
    handle = stream_ref(stream).get()
    rt = _hip.get_runtime()
    rt.check(rt.fn.hipMemPrefetchAsync(ptr, nbytes, device, handle), "hipMemPrefetchAsync",
             device=device)


def prefetch_target(device: object) -> int:
    """The device a prefetch goes to: ``"host"`` is ``hipCpuDeviceId`` (-1), None the current
    device, else a checked ordinal or :class:`Device`."""
    if isinstance(device, str):
        if device != "host":
            raise TypeError(f"device must be an int device ordinal, a Device or 'host', "
                            f"not {device!r}")
        return hipCpuDeviceId
    return get_device() if device is None else check_device(device)


def advise(ptr: int, nbytes: int, kind: str, advice: object, device: object,
           unset: object) -> None:
    """``hipMemAdvise`` over ``[ptr, ptr+nbytes)`` of memory of ``kind`` (``Buffer.advise``):
    every argument checked before the call; only managed memory takes advice."""
    if not isinstance(advice, str):
        raise TypeError(f"advice must be a str, not {type(advice).__name__}")
    codes = MEM_ADVICE.get(advice)
    if codes is None:
        raise ValueError(f"advice={advice!r}: expected one of {', '.join(MEM_ADVICE)}")
    if type(unset) is not bool:
        raise TypeError(f"unset must be a bool, not {type(unset).__name__}")
    if advice == "read_mostly":
        target = get_device() if device is None else check_device(device)
    elif advice == "coarse_grain" and device == "host":
        raise ValueError("device='host': coarse_grain advice names a device")
    else:
        target = prefetch_target(device)
    if kind != "managed":
        raise ValueError(f"advise needs managed memory; this is {kind} memory")
    rt = _hip.get_runtime()
    if advice == "coarse_grain" and rt.platform == "nvidia":
        raise NotSupportedError(801, "hipErrorNotSupported",
                                "coarse_grain advice is AMD's (hipMemAdviseSetCoarseGrain); "
                                "CUDA has no such advice", "hipMemAdvise")
    if not nbytes:
        return
    code = codes[1] if unset else codes[0]
    rt.check(rt.fn.hipMemAdvise(ptr, nbytes, code, target), "hipMemAdvise", size=nbytes,
             device=target if target >= 0 else None, detail=f"advice {advice!r}")


def discard(ptr: int, nbytes: int, kind: str, handle: int) -> None:
    """``hipMemDiscardBatchAsync`` of ``[ptr, ptr+nbytes)`` on the stream ``handle``
    (``Buffer.discard``): only managed memory; NotSupportedError where the runtime lacks the
    call (HIP before 7.2)."""
    if kind != "managed":
        raise ValueError(f"discard needs managed memory; this is {kind} memory")
    rt = _hip.get_runtime()
    if not nbytes:
        return
    ptrs = (ctypes.c_void_p * 1)(ptr)
    sizes = (ctypes.c_size_t * 1)(nbytes)
    if not handle and rt.platform == "nvidia":
        # CUDA refuses the null stream here; the per-thread default stream is ordered with
        # the legacy null stream, so the discard still follows the work queued on it
        from .stream_refs import PER_THREAD_HANDLE
        handle = PER_THREAD_HANDLE
    rt.check(rt.fn.hipMemDiscardBatchAsync(ptrs, sizes, 1, 0, handle),
             "hipMemDiscardBatchAsync", size=nbytes)


def prefetch_if_managed(ptr: int, nbytes: int, device: int, handle: int) -> bool:
    """Prefetch ``[ptr, ptr+nbytes)`` to ``device`` on the stream ``handle`` when the memory
    can be prefetched; returns False, having done nothing, when the runtime refuses the
    range as not managed (``hipErrorInvalidValue``, cleared so that nobody else sees it).
    ``device`` and ``handle`` must already be valid; any other failure raises ``HipError``."""
    rt = _hip.get_runtime()
    st = rt.fn.hipMemPrefetchAsync(ptr, nbytes, device, handle)
    if not st:
        return True
    if rt.hip_code(st) == 1:  # hipErrorInvalidValue: not managed memory
        rt.clear_last_error()
        return False
    raise rt.error(st, "hipMemPrefetchAsync", device=device)


_tls = threading.local()
_PEER_ALREADY_ENABLED = 704   # hipErrorPeerAccessAlreadyEnabled
_PEER_NOT_ENABLED = 705       # hipErrorPeerAccessNotEnabled


class Device:
    """One GPU: ``Device(i)`` (``Device()`` is the current one).

    ``with Device(i):`` makes it current for the calling thread and restores the previous
    device on exit, also on error.
    """

    __slots__ = ("_id", "__weakref__")

    def __init__(self, device: Optional[Union[int, "Device"]] = None) -> None:
        self._id = get_device() if device is None else check_device(device)

    @property
    def id(self) -> int:
        """The device ordinal."""
        return self._id

    def __index__(self) -> int:
        return self._id

    __int__ = __index__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._id == self._id

    def __hash__(self) -> int:
        return hash(("Device", self._id))

    def __repr__(self) -> str:
        return f"<Device {self._id} ({platform()})>"

    @property
    def name(self) -> str:
        """The device's marketing name."""
        rt = _hip.get_runtime()
        buf = ctypes.create_string_buffer(256)
        rt.check(rt.fn.hipDeviceGetName(buf, 256, self._id), "hipDeviceGetName", device=self._id)
        return buf.value.decode(errors="replace")

    def attribute(self, attr: Union[str, int]) -> int:
        """A ``hipDeviceAttribute_t`` value, by code or by name (``"warp_size"``)."""
        if isinstance(attr, str):
            key = attr.lower().replace("hipdeviceattribute", "")
            code = DEVICE_ATTRIBUTES.get(key)
            if code is None:
                known = ", ".join(sorted(DEVICE_ATTRIBUTES))
                raise ValueError(f"unknown device attribute {attr!r}; known names: {known}")
        elif isinstance(attr, int) and not isinstance(attr, bool):
            if not 0 <= attr < (1 << 31):
                raise ValueError(f"attr={attr} is not a hipDeviceAttribute_t code")
            code = attr
        else:
            raise TypeError(f"attr must be a str or int, not {type(attr).__name__}")
        rt = _hip.get_runtime()
        out = ctypes.c_int()
        rt.check(rt.fn.hipDeviceGetAttribute(out, code, self._id), "hipDeviceGetAttribute",
                 device=self._id, detail=f"attribute {attr!r}")
        return out.value

    def _flag(self, code: int) -> bool:
        try:
            return bool(self.attribute(code))
        except (NotSupportedError, ValueError):
            return False

    @property
    def supports_memory_pools(self) -> bool:
        """``hipDeviceAttributeMemoryPoolsSupported`` (0 by default before ROCm 6.2)."""
        return self._flag(hipDeviceAttributeMemoryPoolsSupported)

    @property
    def supports_managed_memory(self) -> bool:
        """``hipDeviceAttributeManagedMemory``."""
        return self._flag(hipDeviceAttributeManagedMemory)

    @property
    def integrated(self) -> bool:
        """``hipDeviceAttributeIntegrated``: the device shares the host's memory (an APU such
        as MI300A)."""
        return self._flag(hipDeviceAttributeIntegrated)

    @property
    def pageable_memory_access(self) -> bool:
        """``hipDeviceAttributePageableMemoryAccess``: the device reads and writes memory from
        the system allocator (``malloc``, NumPy arrays) directly, with no registration: an
        APU, or a GPU with XNACK / HMM enabled.  What ``SystemMemoryResource`` needs."""
        return self._flag(hipDeviceAttributePageableMemoryAccess)

    def memory_info(self) -> Tuple[int, int]:
        """``(free, total)`` bytes of this device."""
        rt = _hip.get_runtime()
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        with self:
            rt.check(rt.fn.hipMemGetInfo(free, total), "hipMemGetInfo", device=self._id)
        return free.value, total.value

    def _peer(self, peer: object) -> int:
        ordinal = check_device(peer, "peer")
        if ordinal == self._id:
            raise ValueError(f"peer={ordinal}: a device is not its own peer")
        return ordinal

    def can_access_peer(self, peer: Union[int, "Device"]) -> bool:
        """True when this device can map memory of ``peer`` (``hipDeviceCanAccessPeer``); False
        for the device itself."""
        ordinal = check_device(peer, "peer")
        if ordinal == self._id:
            return False
        rt = _hip.get_runtime()
        out = ctypes.c_int()
        rt.check(rt.fn.hipDeviceCanAccessPeer(out, self._id, ordinal), "hipDeviceCanAccessPeer",
                 device=self._id, detail=f"peer {ordinal}")
        return bool(out.value)

    def enable_peer_access(self, peer: Union[int, "Device"]) -> None:
        """Let kernels on this device read and write ``hipMalloc`` memory of ``peer``
        (``hipDeviceEnablePeerAccess``).  Idempotent: a peer already enabled is not an error.
        Memory-pool memory needs :meth:`MemoryPool.set_access` instead.  Peer copies
        (``Buffer.copy_from_device``, ``Buffer.copy``) work without it."""
        ordinal = self._peer(peer)
        rt = _hip.get_runtime()
        with self:
            st = rt.fn.hipDeviceEnablePeerAccess(ordinal, 0)
        if st and rt.hip_code(st) == _PEER_ALREADY_ENABLED:
            rt.clear_last_error()
            return
        rt.check(st, "hipDeviceEnablePeerAccess", device=self._id, detail=f"peer {ordinal}")

    def disable_peer_access(self, peer: Union[int, "Device"]) -> None:
        """Undo :meth:`enable_peer_access` (``hipDeviceDisablePeerAccess``).  Idempotent: a
        peer that is not enabled is not an error."""
        ordinal = self._peer(peer)
        rt = _hip.get_runtime()
        with self:
            st = rt.fn.hipDeviceDisablePeerAccess(ordinal)
        if st and rt.hip_code(st) == _PEER_NOT_ENABLED:
            rt.clear_last_error()
            return
        rt.check(st, "hipDeviceDisablePeerAccess", device=self._id, detail=f"peer {ordinal}")

    def synchronize(self) -> None:
        """Wait for all work on this device."""
        with self:
            synchronize()

    def __enter__(self) -> "Device":
        rt = _hip.get_runtime()
        prev = ctypes.c_int()
        rt.check(rt.fn.hipGetDevice(prev), "hipGetDevice")
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        if prev.value != self._id:
            rt.check(rt.fn.hipSetDevice(self._id), "hipSetDevice", device=self._id)
        stack.append(prev.value)
        return self

    def __exit__(self, *exc: Any) -> None:
        prev = _tls.stack.pop()
        if prev != self._id:
            rt = _hip.get_runtime()
            rt.check(rt.fn.hipSetDevice(prev), "hipSetDevice", device=prev)

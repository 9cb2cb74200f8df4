"""Owning ``Stream`` and ``Event`` objects, ``wait_event``, and the events that order work
across streams (:func:`event_for`, :func:`record_or_synchronize`).

Both are destroyed exactly once: by ``close()``, by the context manager, or by a finalizer when
garbage-collected (never at interpreter exit: see ``hipmr_ctypes._exit``).  Using one after ``close()`` raises ``ValueError`` before any native call.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from . import _hip
from ._hip.errors import HipError, NoDeviceError
from ._exit import finalize, finalizer
from .device import Device, check_device, device_count, device_function, get_device
from .stream_ref import (HANDLE_READERS, PER_THREAD_HANDLE, IntValue, _binding_module,
                         as_stream_handle, stream_ref)

_T = TypeVar("_T")
__all__ = ["Stream", "Event", "wait_event", "new_event", "event_for", "record_or_synchronize",
           "stream_key", "handle_of", "is_foreign", "LAST_SPECIAL_HANDLE", "DeviceWait",
           "track_streams", "device_of"]

if not _binding_module:  # stream_ref reaches the binding without an import from now on
    _binding_module.append(_hip)


@finalizer
def _destroy(destroy: Callable[[int], Any], handle: int) -> None:
    try:
        destroy(handle)
    except Exception:  # interpreter exit: the runtime may already be gone
        pass


#: the device of every live package-owned Stream, by handle
_stream_devices: Dict[int, int] = {}
#: the sub-allocators that keep state per stream (weakly): see :func:`track_streams`
_holders: "weakref.WeakSet[Any]" = weakref.WeakSet()


def track_streams(holder: Any) -> None:
    """Have ``holder`` told before a package-owned :class:`Stream` is destroyed.

    ``holder`` has ``lock`` (a :class:`~hipmr_ctypes._locks.DeferringLock`),
    ``holds_stream(handle)`` (lock-free: whether it keeps state for that stream) and
    ``stream_closed(handle)`` (takes the lock: the stream's work is complete; forget it).
    Held weakly.  A destroyed handle can be named again by a new stream, and some runtime
    calls on a destroyed handle crash the process (``cudaStreamGetDevice``): so no state
    keyed by a stream may outlive it."""
    _holders.add(holder)


@finalizer
def _close_stream(destroy: Any, handle: int) -> None:
    """A Stream's finalizer: the sub-allocators that hold blocks freed on it forget it (after
    its work is complete), then the handle is destroyed."""
    holders = [h for h in list(_holders) if h.holds_stream(handle)]
    if holders:
        try:
            stream_ref(handle).wait()
        except Exception:  # noqa: BLE001 - a sticky device error: nothing runs any more
            pass
    _forget_then_destroy(destroy, handle, holders)


def _forget_then_destroy(destroy: Any, handle: int, holders: List[Any]) -> None:
    while holders:
        lock = holders[0].lock
        if lock.held_here():  # a collection inside that holder's locked section: once it
            lock.defer(_forget_then_destroy, destroy, handle, holders)  # lets go
            return
        try:
            holders.pop(0).stream_closed(handle)
        except Exception:  # noqa: BLE001 - finalizers have nobody to report to
            pass
    _stream_devices.pop(handle, None)  # before: a new stream may get the handle at once
    _destroy(destroy, handle)


class _Owned:
    """What an owning Stream and Event share: the handle, ``close()`` (idempotent, through the
    finalizer that also runs at garbage collection), the context manager, and the check that
    raises ``ValueError`` on use after close, before any native call."""

    __slots__ = ()
    _what = "object"
    _handle: int
    _flags: int
    _finalizer: Any

    def _own(self, handle: int, destroy: Callable[[int], Any]) -> None:
        self._handle = handle  # type: ignore[misc]  # a slot of each subclass
        self._finalizer = finalize(self, _destroy, destroy, handle)

    def _live(self) -> int:
        if not self._finalizer.alive:
            raise ValueError(f"{self._what.lower()}: this {self._what} is closed")
        return self._handle

    @property
    def handle(self) -> int:
        """The native handle (``hipStream_t`` / ``hipEvent_t``) as an int."""
        return self._live()

    @property
    def flags(self) -> int:
        """The creation flags."""
        return self._flags

    @property
    def closed(self) -> bool:
        """True once the native object has been destroyed."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Destroy the native object (idempotent); work already queued still completes.  A
        stream that pool or fixed-size resources hold freed blocks of is synchronized first,
        and they forget it."""
        self._finalizer()

    def __enter__(self: _T) -> _T:
        self._live()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Stream(_Owned):
    """An owning HIP stream: ``Stream(flags=0, priority=0, device=None)``.

    ``flags``: 0 (``hipStreamDefault``) or 1 (``hipStreamNonBlocking``). ``priority``: lower
    numbers are higher priority; clamped by the runtime to its range. ``device``: created on
    that device (default: the current one).
    """

    __slots__ = ("_handle", "_ref", "_flags", "_device", "_finalizer", "_open", "__weakref__")
    _what = "Stream"
    #: the handle while the stream is open, None once closed: what the pool's and the
    #: fixed-size resource's fast paths read, as ``_hipmr_handle`` (None takes their checked
    #: path, which says the stream is closed)
    _open: Optional[int]

    def __init__(self, flags: int = 0, priority: int = 0,
                 device: Optional[object] = None) -> None:
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"flags must be an int, not {type(flags).__name__}")
        if flags not in (0, 1):
            raise ValueError(f"flags={flags}: expected 0 (default) or 1 (non-blocking)")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, not {type(priority).__name__}")
        if not -(1 << 31) <= priority < (1 << 31):
            raise ValueError(f"priority={priority} does not fit a C int")
        rt = _hip.get_runtime()
        out = ctypes.c_void_p()
        if device is None:
            self._device = Device().id
            st = rt.fn.hipStreamCreateWithPriority(out, flags, priority)
        else:
            self._device = check_device(device)
            with Device(self._device):
                st = rt.fn.hipStreamCreateWithPriority(out, flags, priority)
        rt.check(st, "hipStreamCreateWithPriority", device=self._device)
        handle = self._handle = out.value or 0
        _stream_devices[handle] = self._device
        self._finalizer = finalize(self, _close_stream, rt.fn.hipStreamDestroy, handle)
        self._flags = flags
        self._ref = stream_ref(self._handle)
        self._open = handle

    def close(self) -> None:
        """Destroy the stream (idempotent); work already queued still completes.  A stream
        that pool or fixed-size resources hold freed blocks of is synchronized first, and they
        forget it."""
        self._open = None
        self._finalizer()

    @property
    def ref(self) -> stream_ref:
        """A non-owning :class:`stream_ref` to this stream."""
        self._live()
        return self._ref

    @property
    def device(self) -> IntValue:
        """The device the stream was created on (``s.device()`` reads the same value)."""
        return IntValue(self._device)

    @property
    def priority(self) -> IntValue:
        """The stream's priority as the runtime reports it (``s.priority()`` reads the same
        value)."""
        return stream_ref(self._live()).priority

    def synchronize(self) -> None:
        """Block until all work queued on the stream is done."""
        stream_ref(self._live()).wait()

    #: ``stream_ref``'s spellings (and libhipcxx's ``wait``): the same call
    wait = synchronize
    sync = synchronize

    def query(self) -> bool:
        """True when all queued work is done, False while some is pending."""
        return stream_ref(self._live()).ready()

    #: ``stream_ref``'s spellings (libhipcxx's ``ready``): the same call
    ready = query
    is_done = query

    def wait_event(self, event: "Event") -> None:
        """Make later work on this stream wait for ``event``."""
        wait_event(self._live(), event)

    def __hip_stream__(self) -> Tuple[int, int]:
        return (0, self._live())

    __cuda_stream__ = __hip_stream__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Stream):
            return other is self
        return NotImplemented  # a stream_ref (or another library's stream) compares handles

    def __hash__(self) -> int:
        """The handle's hash, as ``stream_ref``'s: ``stream_ref(s) == s`` and they hash alike."""
        return hash(self._handle)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<Stream {state} device={self._device} flags={self._flags}>"


HANDLE_READERS[Stream] = Stream._live   # a closed Stream raises, as its protocol does
setattr(Stream, "_hipmr_handle", vars(Stream)["_open"])  # as stream_ref's: the handle, or None


class Event(_Owned):
    """An owning HIP event: ``Event(flags=0)`` (2 = ``hipEventDisableTiming``, 1 = blocking sync)."""

    __slots__ = ("_handle", "_flags", "_finalizer", "_recorded", "_device", "__weakref__")
    _what = "Event"

    def __init__(self, flags: int = 0) -> None:
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"flags must be an int, not {type(flags).__name__}")
        if flags < 0 or flags & ~0x7:
            raise ValueError(f"flags={flags}: expected a combination of 1 (blocking sync), "
                             f"2 (disable timing) and 4 (interprocess)")
        rt = _hip.get_runtime()
        self._device = Device().id  # events are recorded on streams of this device only
        out = ctypes.c_void_p()
        rt.check(rt.fn.hipEventCreateWithFlags(out, flags), "hipEventCreateWithFlags")
        self._own(out.value or 0, rt.fn.hipEventDestroy)
        self._flags = flags
        self._recorded = False

    @property
    def device(self) -> IntValue:
        """The device the event was created on (it can be recorded on its streams only;
        ``e.device()`` reads the same value)."""
        return IntValue(self._device)

    def record(self, stream: object = 0) -> "Event":
        """Record the event on ``stream`` (anything :class:`stream_ref` accepts); returns self.
        A :class:`Stream` of another device than the event's is a ValueError."""
        handle = as_stream_handle(stream)
        if type(stream) is Stream and stream._device != self._device:
            raise ValueError(f"stream: {stream!r} is on device {stream._device}; this Event "
                             f"was created on device {self._device} and can be recorded only "
                             "on streams of that device")
        rt = _hip.get_runtime()
        rt.check(rt.fn.hipEventRecord(self._live(), handle), "hipEventRecord")
        self._recorded = True
        return self

    def synchronize(self) -> None:
        """Block until the recorded work is done."""
        rt = _hip.get_runtime()
        rt.check(rt.fn.hipEventSynchronize(self._live()), "hipEventSynchronize")

    def query(self) -> bool:
        """True when the recorded work is done (or nothing was recorded), False otherwise."""
        rt = _hip.get_runtime()
        st = rt.fn.hipEventQuery(self._live())
        if st == 0:
            return True
        if rt.is_not_ready(st):
            return False
        raise rt.error(st, "hipEventQuery")

    def elapsed_time(self, other: "Event") -> float:
        """Milliseconds from this event to ``other`` (both recorded, timing enabled)."""
        if not isinstance(other, Event):
            raise TypeError(f"other must be an Event, not {type(other).__name__}")
        if self._flags & 2 or other._flags & 2:
            raise ValueError("elapsed_time needs events created without flag 2 (disable timing)")
        rt = _hip.get_runtime()
        out = ctypes.c_float()
        rt.check(rt.fn.hipEventElapsedTime(out, self._live(), other._live()),
                 "hipEventElapsedTime")
        return out.value

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<Event {state} flags={self._flags}>"


def wait_event(stream: object, event: Event) -> None:
    """Make later work on ``stream`` wait until ``event`` has completed."""
    if not isinstance(event, Event):
        raise TypeError(f"event must be an Event, not {type(event).__name__}")
    handle = as_stream_handle(stream)
    rt = _hip.get_runtime()
    rt.check(rt.fn.hipStreamWaitEvent(handle, event._live(), 0), "hipStreamWaitEvent")


def new_event() -> Event:
    """A timing-disabled event (``hipEventDisableTiming``) on the calling thread's device."""
    return Event(flags=2)


#: handles above this name one created stream each; 0 (null) and 1 (legacy) name one stream
#: per device, 2 (per-thread) one per thread and device
LAST_SPECIAL_HANDLE = 2
_PER_THREAD = PER_THREAD_HANDLE
_local = threading.local()
_tokens = itertools.count(1)


def _thread_token() -> int:
    """A number for the calling thread, never reused (``threading.get_ident`` values are
    reused once a thread ends, while work it queued on its per-thread stream may still run)."""
    try:
        return _local.token  # type: ignore[no-any-return]
    except AttributeError:
        token = _local.token = next(_tokens)
        return token


def _key_function(rt: Any) -> Callable[[int], Any]:
    """The :func:`stream_key` function for the runtime ``rt`` (None: none loaded).  With one
    device visible the null and legacy streams are the handle itself.  With several, the
    calling thread's current device is part of their key: it is read with the runtime's own
    ``hipGetDevice`` into an int of the calling thread (no wrapper, no allocation; one shared
    int would race, as the call releases the GIL): the cheapest exact answer there is."""
    token = _thread_token
    try:
        several = rt is not None and device_count() > 1
    except Exception:  # noqa: BLE001 - no device: no null streams to tell apart
        several = False
    if rt is None or not several:
        def one_device(handle: int) -> Any:
            if handle != _PER_THREAD:
                return handle
            try:  # the calling thread's per-thread stream: its key, made once per thread
                return _local.per_thread_key
            except AttributeError:
                made = _local.per_thread_key = (handle, 0, token())
                return made
        setattr(one_device, "own_keys_below", _PER_THREAD)   # see own_keys_below()
        return one_device
    current = device_function(rt)

    def several_devices(handle: int) -> Any:
        if handle > LAST_SPECIAL_HANDLE:
            return handle
        try:
            device = current()
        except NoDeviceError:  # host memory with no device: no stream can run work
            device = -1
        return (handle, device, token() if handle == _PER_THREAD else 0)
    return several_devices


#: (runtime, its key function): made again when another runtime is loaded
_keys: Tuple[Any, Callable[[int], Any]] = (None, _key_function(None))


def stream_keys() -> Callable[[int], Any]:
    """:func:`stream_key` bound to the loaded runtime: what a sub-allocator keeps at
    construction for its fast paths (one call less per key)."""
    global _keys
    try:
        rt = _hip.get_runtime()
    except Exception:  # noqa: BLE001 - no library: host memory only
        rt = None
    keys = _keys
    if keys[0] is not rt:
        keys = _keys = (rt, _key_function(rt))
    return keys[1]


def own_keys_below(keys: Callable[[int], Any]) -> int:
    """The handles below this one are their own key for the key function ``keys`` (the null
    and legacy streams with one device visible; none with several): a fast path tests this
    instead of calling ``keys``."""
    below: int = getattr(keys, "own_keys_below", 0)
    return below


def stream_key(handle: int) -> Any:
    """The identity of the stream ``handle`` names for the calling thread (a key for
    stream-ordered free lists): the handle itself for a created stream; for the special
    handles a tuple ``(handle, device, thread)``: the null and legacy streams are one per
    device (thread 0; with one device visible, the handle itself), the per-thread stream one
    per thread and device.  ``handle`` must be a checked handle (an int in ``[0, 2**64)``)."""
    if handle > LAST_SPECIAL_HANDLE:
        return handle
    return stream_keys()(handle)


def handle_of(key: Any) -> int:
    """The stream handle of a :func:`stream_key` (what the runtime takes)."""
    return key if type(key) is int else key[0]


def is_foreign(key: Any) -> bool:
    """True for another thread's per-thread stream: nothing can be recorded on it from the
    calling thread (handle 2 names the caller's own)."""
    return type(key) is tuple and key[0] == _PER_THREAD and key[2] != _thread_token()


class DeviceWait:
    """Stands for an event where none can be recorded (another thread's per-thread stream):
    ``synchronize()`` waits for all work on the device, which includes that stream's."""

    __slots__ = ("device",)

    def __init__(self, device: int) -> None:
        self.device: int = device

    def synchronize(self) -> None:
        Device(self.device).synchronize()

    def close(self) -> None:
        pass


def device_of(handle: int) -> int:
    """The device of the live stream ``handle`` (one the caller is using right now): known
    for the package's own streams and the special ones (the current device), asked of the
    runtime for another library's; the current device when the runtime cannot tell."""
    device = _stream_devices.get(handle)
    if device is not None:
        return device
    if handle > LAST_SPECIAL_HANDLE:
        try:
            return stream_ref(handle).device()
        except Exception:  # noqa: BLE001 - no hipStreamGetDevice, or not a runtime stream
            pass
    return get_device()


def event_for(stream: Any, device: Optional[int] = None) -> Event:
    """A new timing-disabled event on the device of ``stream`` (a handle or a
    :func:`stream_key`): an event can be recorded only on a stream of its own device, and the
    calling thread's current device may be another one (a pool for device 1 used from a thread
    on device 0).  The device is ``device`` when given (what the caller recorded while the
    stream was in use), the key's for a special stream, the package's own record for its live
    streams, else the current one.  The runtime is never asked: ``stream`` may be gone, and
    ``cudaStreamGetDevice`` on a destroyed stream crashes the process."""
    if device is None:
        if type(stream) is tuple:
            device = stream[1]
        else:
            device = _stream_devices.get(stream)
    if device is not None and device != get_device():
        with Device(device):
            return new_event()
    return new_event()


#: hipEventRecord's status for a stream that no longer exists (destroyed after memory was
#: freed on it): invalid handle, or (AMD) context destroyed
_GONE = (400, 709)


def record_or_synchronize(event: Event, stream: Any) -> bool:
    """Record ``event`` on ``stream`` (a handle or a :func:`stream_key`); False when the stream
    no longer exists.  Its queued work can then only be waited for device-wide: every device is
    synchronized (a destroyed stream's work still runs to completion), so nothing it did can
    still be pending."""
    try:
        if type(stream) is tuple and stream[1] != get_device():
            with Device(stream[1]):  # the null stream of another device
                event.record(stream[0])
        else:
            event.record(handle_of(stream))
        return True
    except HipError as exc:
        if exc.code not in _GONE:
            raise
    for device in range(device_count()):
        Device(device).synchronize()
    return False

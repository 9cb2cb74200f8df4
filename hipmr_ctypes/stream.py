"""Owning ``Stream`` and ``Event`` objects, ``wait_event`` and :func:`event_for` (an event on
a stream's device).  What orders the sub-allocators' blocks across streams (stream keys,
``StreamOrder``) is in :mod:`hipmr_ctypes._stream_order`.

Both are destroyed exactly once: by ``close()``, by the context manager, or by a finalizer when
garbage-collected (never at interpreter exit: see ``hipmr_ctypes._exit``).  Using one after ``close()`` raises ``ValueError`` before any native call.
"""
from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from . import _hip
from ._exit import finalize, finalizer
from .device import Device, check_device, get_device
from .stream_refs import (HANDLE_READERS, IntValue, _binding_module, as_stream_handle,
                         stream_ref)

_T = TypeVar("_T")
__all__ = ["Stream", "Event", "Graph", "IpcEventHandle", "wait_event", "new_event", "event_for",
           "track_streams", "STREAM_DEVICES", "capture_check", "relaxed_capture_mode"]

if not _binding_module:  # stream_ref reaches the binding without an import from now on
    _binding_module.append(_hip)


@finalizer
def _destroy(destroy: Callable[[int], Any], handle: int) -> None:
    try:
        destroy(handle)
    except Exception:  # interpreter exit: the runtime may already be gone
        pass


#: the device of every live package-owned Stream, by handle (what :func:`event_for` and the
#: stream order read: the runtime is never asked about a stream that may be gone)
STREAM_DEVICES: Dict[int, int] = {}
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
    STREAM_DEVICES.pop(handle, None)  # before: a new stream may get the handle at once
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
        STREAM_DEVICES[handle] = self._device
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

    def begin_capture(self, mode: str = "global") -> None:
        """Start capturing the work queued on this stream into a graph
        (``hipStreamBeginCapture``) instead of running it; :meth:`end_capture` gives the
        graph.  ``mode`` (``"global"``, ``"thread_local"`` or ``"relaxed"``) says which
        potentially unsafe calls (synchronous allocation, copies, synchronization) are
        refused meanwhile: in any thread while a global capture is under way, in this thread
        only, or none.  A stream already capturing raises HipError."""
        code = _CAPTURE_MODES.get(mode) if isinstance(mode, str) else None
        if code is None:
            raise ValueError(f"mode={mode!r}: expected one of {', '.join(_CAPTURE_MODES)}")
        handle = self._live()
        rt = _hip.get_runtime()
        rt.check(rt.fn.hipStreamBeginCapture(handle, code), "hipStreamBeginCapture")

    def end_capture(self) -> "Graph":
        """End the capture begun on this stream (``hipStreamEndCapture``) and return it as
        an executable :class:`Graph` (``hipGraphInstantiate``).  A capture that an operation
        it forbids invalidated raises HipError (hipErrorStreamCaptureInvalidated)."""
        handle = self._live()
        rt = _hip.get_runtime()
        graph = ctypes.c_void_p()
        rt.check(rt.fn.hipStreamEndCapture(handle, graph), "hipStreamEndCapture")
        return Graph._instantiate(rt, graph.value or 0)

    @property
    def is_capturing(self) -> bool:
        """True while the stream takes part in a graph capture (``hipStreamIsCapturing``:
        begun on it with ``hipStreamBeginCapture``, or joined to one by waiting for an event
        recorded in it), also once that capture has been invalidated; False otherwise, and
        always with a runtime that has no capture functions."""
        return capture_check()(self._live())

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
    """An owning HIP event: ``Event(flags=0, *, interprocess=False)`` (flags: 2 =
    ``hipEventDisableTiming``, 1 = blocking sync, 4 = ``hipEventInterprocess``).

    ``interprocess=True`` adds the interprocess flag and disables timing (which the runtime
    requires of an interprocess event): :meth:`export_ipc` then gives a handle another process
    opens with :meth:`Event.from_ipc`.
    """

    __slots__ = ("_handle", "_flags", "_finalizer", "_recorded", "_device", "__weakref__")
    _what = "Event"

    def __init__(self, flags: int = 0, *, interprocess: bool = False) -> None:
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"flags must be an int, not {type(flags).__name__}")
        if flags < 0 or flags & ~0x7:
            raise ValueError(f"flags={flags}: expected a combination of 1 (blocking sync), "
                             f"2 (disable timing) and 4 (interprocess)")
        if type(interprocess) is not bool:
            raise TypeError(f"interprocess must be a bool, not {type(interprocess).__name__}")
        if interprocess:
            flags |= _EVENT_INTERPROCESS | _EVENT_DISABLE_TIMING
        elif flags & _EVENT_INTERPROCESS and not flags & _EVENT_DISABLE_TIMING:
            raise ValueError(f"flags={flags}: an interprocess event (4) needs timing disabled "
                             "(2); or pass interprocess=True")
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

    @property
    def interprocess(self) -> bool:
        """True for an event made with ``interprocess=True`` (or flag 4)."""
        return bool(self._flags & _EVENT_INTERPROCESS)

    def export_ipc(self) -> "IpcEventHandle":
        """A handle another process opens with :meth:`Event.from_ipc`
        (``hipIpcGetEventHandle``): there, waiting on the event (``wait_event``,
        ``synchronize``, ``query``) follows what this process records on it.  The event must
        be interprocess (ValueError otherwise, before any native call)."""
        handle = self._live()
        if not self._flags & _EVENT_INTERPROCESS:
            raise ValueError("export_ipc needs an interprocess event: "
                             "Event(interprocess=True)")
        rt = _hip.get_runtime()
        from ._hip.types import hipIpcEventHandle_t
        raw = hipIpcEventHandle_t()
        rt.check(rt.fn.hipIpcGetEventHandle(raw, handle), "hipIpcGetEventHandle")
        return IpcEventHandle(bytes(raw), self._device, os.getpid())

    @classmethod
    def from_ipc(cls, handle: "IpcEventHandle") -> "Event":
        """The event another process exported (``hipIpcOpenEventHandle``), on the device it
        was made on: timing disabled, interprocess, owned (closing it closes this process's
        use of it only).  A handle exported by this very process is a ValueError (use that
        Event itself), before any native call."""
        if type(handle) is not IpcEventHandle:
            raise TypeError(f"handle must be an IpcEventHandle, not {type(handle).__name__}")
        if handle.pid == os.getpid():
            raise ValueError("this IpcEventHandle was exported by this process: use the "
                             "Event it came from")
        device = check_device(handle.device)
        rt = _hip.get_runtime()
        from ._hip.types import hipIpcEventHandle_t
        raw = hipIpcEventHandle_t.from_buffer_copy(handle.data)
        out = ctypes.c_void_p()
        with Device(device):
            rt.check(rt.fn.hipIpcOpenEventHandle(out, raw), "hipIpcOpenEventHandle",
                     device=device)
        event = object.__new__(cls)
        event._device = device
        event._own(out.value or 0, rt.fn.hipEventDestroy)
        event._flags = _EVENT_INTERPROCESS | _EVENT_DISABLE_TIMING
        event._recorded = False
        return event

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<Event {state} flags={self._flags}>"


#: hipEventDisableTiming and hipEventInterprocess (the same values in every release and in
#: CUDA; tests/binding/test_abi.py checks them against the headers as types' MACROS)
_EVENT_DISABLE_TIMING = 2
_EVENT_INTERPROCESS = 4


class IpcEventHandle:
    """What :meth:`Event.export_ipc` gives: the runtime's 64-byte event handle, with the
    device and the exporting process's id.  Immutable and picklable (send it to the other
    process any way you like: a pipe, ``multiprocessing``, a socket); opened there with
    :meth:`Event.from_ipc`."""

    __slots__ = ("_data", "_device", "_pid")
    _data: bytes
    _device: int
    _pid: int

    def __init__(self, data: bytes, device: int, pid: int) -> None:
        if type(data) is not bytes or len(data) != 64:
            raise ValueError("data must be the 64 bytes of a hipIpcEventHandle_t")
        for name, value in (("device", device), ("pid", pid)):
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an int >= 0, not {value!r}")
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_device", device)
        object.__setattr__(self, "_pid", pid)

    @property
    def data(self) -> bytes:
        """The runtime's handle (64 bytes)."""
        return self._data

    @property
    def device(self) -> int:
        """The device the event was made on."""
        return self._device

    @property
    def pid(self) -> int:
        """The id of the process that exported it."""
        return self._pid

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IpcEventHandle is immutable")

    def __reduce__(self) -> Tuple[Any, Tuple[bytes, int, int]]:
        return (IpcEventHandle, (self._data, self._device, self._pid))

    def __eq__(self, other: object) -> bool:
        if type(other) is not IpcEventHandle:
            return NotImplemented
        return (self._data, self._device, self._pid) == (other._data, other._device,
                                                         other._pid)

    def __hash__(self) -> int:
        return hash((self._data, self._device, self._pid))

    def __repr__(self) -> str:
        return f"<IpcEventHandle device={self._device} pid={self._pid}>"


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


def event_for(stream: Any, device: Optional[int] = None) -> Event:
    """A new timing-disabled event on the device of ``stream`` (a handle or a stream key,
    ``_stream_order.stream_key``): an event can be recorded only on a stream of its own
    device, and the calling thread's current device may be another one (a pool for device 1
    used from a thread on device 0).  The device is ``device`` when given (what the caller
    recorded while the stream was in use), the key's for a special stream, the package's own
    record for its live streams, else the current one.  The runtime is never asked:
    ``stream`` may be gone, and ``cudaStreamGetDevice`` on a destroyed stream crashes the
    process."""
    if device is None:
        if type(stream) is tuple:
            device = stream[1]
        else:
            device = STREAM_DEVICES.get(stream)
    if device is not None and device != get_device():
        with Device(device):
            return new_event()
    return new_event()


_CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}   # hipStreamCaptureMode


@finalizer
def _destroy_graph(rt: Any, graph_exec: int, graph: int) -> None:
    try:
        rt.fn.hipGraphExecDestroy(graph_exec)
        rt.fn.hipGraphDestroy(graph)
    except Exception:  # interpreter exit: the runtime may already be gone
        pass


class Graph:
    """An executable graph of the work a :class:`Stream` captured
    (``stream.end_capture()``): ``launch(stream)`` runs that work again on ``stream``
    (``hipGraphLaunch``), as often as wanted, with the same addresses every time.
    ``close()`` (idempotent; also when garbage-collected, and the context manager) destroys
    it.  Memory the graph allocated (a stream-ordered allocation captured, and not freed in
    the capture) must be freed before the graph is launched again."""

    __slots__ = ("_exec", "_graph", "_rt", "_finalizer", "__weakref__")
    _exec: int
    _graph: int
    _rt: Any
    _finalizer: Any

    def __init__(self) -> None:
        raise TypeError("a Graph comes from Stream.end_capture()")

    @classmethod
    def _instantiate(cls, rt: Any, graph: int) -> "Graph":
        out = ctypes.c_void_p()
        st = rt.fn.hipGraphInstantiate(out, graph, None, None, 0)
        if st:
            rt.fn.hipGraphDestroy(graph)
            raise rt.error(st, "hipGraphInstantiate")
        self = object.__new__(cls)
        self._exec = out.value or 0
        self._graph = graph
        self._rt = rt
        self._finalizer = finalize(self, _destroy_graph, rt, self._exec, graph)
        return self

    def launch(self, stream: object) -> None:
        """Queue the graph's work on ``stream`` (anything ``stream_ref`` accepts)."""
        handle = as_stream_handle(stream)
        if not self._finalizer.alive:
            raise ValueError("graph: this Graph is closed")
        rt = self._rt
        rt.check(rt.fn.hipGraphLaunch(self._exec, handle), "hipGraphLaunch")

    @property
    def closed(self) -> bool:
        """True once the graph has been destroyed."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Destroy the graph (idempotent); launches already queued still complete."""
        self._finalizer()

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._exec:x}"
        return f"<Graph {state}>"


#: hipStreamIsCapturing's statuses that say "this stream cannot be captured, asked from here":
#: a runtime not (or no longer) initialized, no device or an invalid one (what a library with
#: no GPU answers), an invalid or destroyed handle, a destroyed context
_NOT_CAPTURED = frozenset((3, 4, 100, 101, 400, 709))
_IMPLICIT = 906   # hipErrorStreamCaptureImplicit: the legacy stream, while a capture is under way


def _never(handle: int) -> bool:
    return False


def capture_check() -> Callable[[int], bool]:
    """``is_capturing(handle) -> bool`` for the loaded runtime, its function pointer bound
    once: what the sub-allocators keep at construction and call only where they would
    otherwise record, wait for or synchronize on an event.  True for a stream in a capture
    (active or invalidated) and for the legacy null stream while a capture that it would join
    implicitly is under way; False for a stream that cannot be asked (gone, no device) and
    with no runtime or one without ``hipStreamIsCapturing``."""
    try:
        rt = _hip.get_runtime()
    except Exception:  # noqa: BLE001 - no library: nothing can be captured
        return _never
    query = rt.fn.hipStreamIsCapturing
    if getattr(query, "missing", False):
        return _never
    hip_code = rt.hip_code
    c_int = ctypes.c_int

    def is_capturing(handle: int) -> bool:
        status = c_int()   # one per call: the call lets go of the GIL
        st = query(handle, status)
        if st:
            code = hip_code(st)
            if code == _IMPLICIT or code in _NOT_CAPTURED:
                rt.clear_last_error()
                return code == _IMPLICIT
            raise rt.error(st, "hipStreamIsCapturing")
        return status.value != 0
    return is_capturing


class relaxed_capture_mode:
    """``with relaxed_capture_mode():`` the calling thread's capture mode is
    ``hipStreamCaptureModeRelaxed`` inside (``hipThreadExchangeStreamCaptureMode``), the mode
    it had afterwards: a synchronous allocation from the upstream (``hipMalloc``) while a
    capture in Global mode is under way is then allowed, as CUDA and HIP allow it in Relaxed
    mode.  Nothing happens with a runtime that lacks the function."""

    __slots__ = ("_fn", "_mode", "_rt")

    def __enter__(self) -> "relaxed_capture_mode":
        self._fn = None
        try:
            rt = _hip.get_runtime()
        except Exception:  # noqa: BLE001 - no library: no capture
            return self
        fn = rt.fn.hipThreadExchangeStreamCaptureMode
        if getattr(fn, "missing", False):
            return self
        mode = self._mode = ctypes.c_int(2)   # hipStreamCaptureModeRelaxed
        rt.check(fn(mode), "hipThreadExchangeStreamCaptureMode")
        self._fn, self._rt = fn, rt
        return self

    def __exit__(self, *exc: Any) -> None:
        fn = self._fn
        if fn is not None:
            self._rt.check(fn(self._mode), "hipThreadExchangeStreamCaptureMode")

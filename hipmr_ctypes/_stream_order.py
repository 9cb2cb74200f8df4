"""Stream order for the sub-allocators (pool, fixed-size): before memory freed on stream S
is handed out on another stream T, T must not run ahead of the work S had queued.

* Stream keys (:func:`stream_key`): the identity of the stream a handle names for the calling
  thread, what the free lists are keyed by; :data:`SYNC` keys a synchronous call.
* :class:`StreamOrder`: called lazily, only when a block actually moves between streams, it
  records one reusable event per source stream (which covers everything S queued before the
  free) and makes T wait for it (``hipStreamWaitEvent``), or, when T is the host, waits for
  it on the host.  No HIP call is made on the hot paths.
* :func:`wait_all`: the host's wait for the fresh events :meth:`StreamOrder.record_for_host`
  made, then their close.
* Graph capture: an event recorded on a capturing stream becomes part of the capture, and a
  stream that waits for it joins the capture; a host wait for it, or any synchronization of
  the stream, invalidates the capture.  :meth:`StreamOrder.capture_safe` says whether the
  events an order needs may be made now; the callers take another block when they may not.
  It asks the runtime (``hipStreamIsCapturing``) only where an event would otherwise be
  recorded, waited for or synchronized.

The runtime is never asked about a stream after it was in use (it may be gone): the device
of each created stream is noted while it is in use.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Set, Tuple

# module globals, so that tests can replace them with fakes
from . import _hip
from .errors import HipError, NoDeviceError
from .device import Device, device_count, device_function, get_device
from .stream import STREAM_DEVICES, Event, capture_check, event_for, wait_event
from .stream_refs import PER_THREAD_HANDLE, stream_ref
from ._thread_exit import arm

__all__ = ["SYNC", "LAST_SPECIAL_HANDLE", "stream_key", "stream_keys", "own_keys_below",
           "handle_of", "is_foreign", "Recorded", "DeviceWait", "device_of",
           "record_or_synchronize", "wait_all", "RuntimeEvents", "StreamOrder"]


class _Sync:
    """The type of :data:`SYNC`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SYNC"

    def __reduce__(self) -> str:
        return "SYNC"

    def __hash__(self) -> int:
        # fixed, not the address: an address-based hash could put SYNC in the dict slot of
        # stream 0 and cost every look-up of that stream a probe; -2 is away from the special
        # streams (0, 1, 2) and from aligned handles
        return -2


#: The "stream" of a synchronous call (``allocate`` / ``deallocate``), wherever an adaptor's
#: body serves both kinds of call or keys its state by stream: never a stream handle.
SYNC = _Sync()


#: handles above this name one created stream each; 0 (null) and 1 (legacy) name one stream
#: per device, 2 (per-thread) one per thread and device
LAST_SPECIAL_HANDLE = 2
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
            if handle != PER_THREAD_HANDLE:
                return handle
            try:  # the calling thread's per-thread stream: its key, made once per thread
                return _local.per_thread_key
            except AttributeError:
                made = _local.per_thread_key = (handle, 0, token())
                return made
        setattr(one_device, "own_keys_below", PER_THREAD_HANDLE)   # see own_keys_below()
        return one_device
    current = device_function(rt)

    def several_devices(handle: int) -> Any:
        if handle > LAST_SPECIAL_HANDLE:
            return handle
        try:
            device = current()
        except NoDeviceError:  # host memory with no device: no stream can run work
            device = -1
        return (handle, device, token() if handle == PER_THREAD_HANDLE else 0)
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
    return type(key) is tuple and key[0] == PER_THREAD_HANDLE and key[2] != _thread_token()


def _is_own_per_thread(key: Any) -> bool:
    return type(key) is tuple and key[0] == PER_THREAD_HANDLE and key[2] == _thread_token()


#: the tokens of the threads that ended after waiting for their per-thread streams (the
#: thread-exit guard, ``_thread_exit``): nothing they queued can still run, so blocks they
#: freed on those streams are clean.  Bounded: past the limit it is emptied, which only makes
#: later waits device-wide again (never wrong).
_finished: Set[int] = set()
_FINISHED_LIMIT = 1 << 16


def _thread_finished(token: int) -> None:
    if len(_finished) >= _FINISHED_LIMIT:
        _finished.clear()
    _finished.add(token)


def _ended(key: Any) -> bool:
    """True for the per-thread stream key of a thread that ended having waited for it."""
    return key[2] in _finished


class Recorded:
    """A tag element for blocks freed on a thread's per-thread stream and moved out of its
    free lists by that thread itself: the work its stream had queued until then, covered by
    ``event``, recorded by that thread at the move.  Another stream waits for the event (not
    for the whole device); the event lives as long as a block carries this element."""

    __slots__ = ("key", "event")

    def __init__(self, key: Any, event: Any) -> None:
        self.key = key
        self.event = event

    def __repr__(self) -> str:
        return f"Recorded({self.key!r})"


class _RecordedWait:
    """:meth:`StreamOrder.record_for_host`'s stand-in for a :class:`Recorded` element: the host
    waits for its event; ``close`` leaves the event to the element, which other blocks may
    still carry."""

    __slots__ = ("recorded",)

    def __init__(self, recorded: Recorded) -> None:
        self.recorded = recorded

    def synchronize(self) -> None:
        self.recorded.event.synchronize()

    def close(self) -> None:
        pass


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
    device = STREAM_DEVICES.get(handle)
    if device is not None:
        return device
    if handle > LAST_SPECIAL_HANDLE:
        try:
            return stream_ref(handle).device()
        except Exception:  # noqa: BLE001 - no hipStreamGetDevice, or not a runtime stream
            pass
    return get_device()


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


def wait_all(events: List[Any]) -> None:
    """Wait on the host for every event of ``events`` (fresh ones, from
    :meth:`StreamOrder.record_for_host`), then close them all, also when a wait raises."""
    try:
        for ev in events:
            ev.synchronize()
    finally:
        for ev in events:
            ev.close()


class RuntimeEvents:
    """What a :class:`StreamOrder` asks of the runtime: an event on a stream's device, a
    record on a stream (False when it is gone), a stream's wait for an event, a device-wide
    wait, and a live stream's device.  This default calls the module's functions; a test
    gives ``StreamOrder(events)`` an object with the same five methods instead."""

    __slots__ = ()

    def event_for(self, stream: Any, device: Any = None) -> Any:
        return event_for(stream, device)

    def record_or_synchronize(self, event: Any, stream: Any) -> bool:
        return record_or_synchronize(event, stream)

    def wait_event(self, stream: int, event: Any) -> None:
        wait_event(stream, event)

    def device_wait(self, device: int) -> Any:
        return DeviceWait(device)

    def device_of(self, handle: int) -> int:
        return device_of(handle)


_RUNTIME_EVENTS = RuntimeEvents()


def _event_or_none(runtime: Any, stream: int, device: Any = None) -> Any:
    """``runtime.event_for``, or None when the runtime sees no device (a pool over host memory
    on a machine without a GPU: no work can be queued on any stream, so none is waited for)."""
    try:
        return runtime.event_for(stream, device)
    except NoDeviceError:
        return None


class StreamOrder:
    """One reusable event per stream that has freed memory another user took, and the device
    of every created stream (handle > ``LAST_SPECIAL_HANDLE``) the sub-allocator keeps blocks of,
    noted while the stream was in use: the runtime is never asked about a stream later (it
    may be gone).  ``runtime`` (default :class:`RuntimeEvents`) makes, records and waits for
    the events."""

    __slots__ = ("events", "devices", "runtime", "capturing")

    def __init__(self, runtime: Any = None) -> None:
        self.events: Dict[int, Any] = {}
        self.devices: Dict[Any, int] = {}
        self.runtime: Any = _RUNTIME_EVENTS if runtime is None else runtime
        #: ``capturing(handle) -> bool`` (``stream.capture_check``, bound once)
        self.capturing: Callable[[int], bool] = capture_check()

    def key_capturing(self, key: Any) -> bool:
        """Whether the stream of ``key`` (a stream key, or :data:`SYNC`: never) takes part in
        a capture.  Another thread's per-thread stream cannot be asked from here (handle 2
        names the caller's own): False, as it was before captures existed."""
        if key is SYNC or is_foreign(key):
            return False
        if type(key) is Recorded:
            key = key.key
            if is_foreign(key):
                return False
        return self.capturing(handle_of(key))

    def capture_safe(self, tag: Iterable[Any], key: Any) -> bool:
        """Whether ``key`` (a stream key, or :data:`SYNC` for the host) may be ordered after
        the streams of ``tag`` with events now: False when ``key`` or one of those streams
        takes part in a capture (an event recorded on a capturing stream joins the waiter to
        the capture; recorded elsewhere and waited for by a capturing stream, or waited for
        on the host, it breaks the rule that captured work never waits outside the graph).
        True at once when ``tag`` names no stream but ``key``."""
        others = [s for s in tag if s != key and s is not SYNC
                  and not (type(s) is Recorded and s.key == key)]
        if not others:
            return True
        if self.key_capturing(key):
            return False
        for s in others:
            if self.key_capturing(s):
                return False
        return True

    def note(self, key: Any) -> None:
        """Remember the device of ``key``'s stream (a created one), which the caller is using
        now: before any block is kept for it.  For the caller's own per-thread stream: the
        thread waits for that stream when it ends, and is then known to have ended (see
        :data:`_finished`)."""
        if type(key) is int:
            if key > LAST_SPECIAL_HANDLE and key not in self.devices:
                self.devices[key] = self.runtime.device_of(key)  # (a null stream's key: 0)
        elif _is_own_per_thread(key):
            try:
                arm(_hip.get_runtime(), key[2], _thread_finished)
            except Exception:  # noqa: BLE001 - no runtime: nothing queued, nothing to wait for
                pass

    def tag_of(self, key: Any) -> FrozenSet[Any]:
        """The tag of blocks moved out of ``key``'s free lists now: ``{key}``, or for the
        calling thread's own per-thread stream ``{Recorded(key, event)}`` with an event
        recorded on it now (``{key}`` when it cannot be recorded, or while that stream takes
        part in a capture: the event would be a node of the graph)."""
        if _is_own_per_thread(key) and not self.capturing(PER_THREAD_HANDLE):
            try:
                ev = self.runtime.event_for(key)   # on the key's device, and recorded there
                try:
                    recorded = self.runtime.record_or_synchronize(ev, key)
                except BaseException:
                    ev.close()
                    raise
                if recorded:
                    return frozenset((Recorded(key, ev),))
                ev.close()
            except Exception:  # noqa: BLE001 - as before: another thread waits device-wide
                pass
        return frozenset((key,))

    def holds(self, handle: int) -> bool:
        """True when blocks may be kept for the created stream ``handle``."""
        return handle in self.devices

    def drop(self, key: Any) -> None:
        """Forget ``key`` entirely (its event and device): no block is kept for it any more."""
        self.devices.pop(key, None)
        self.forget(key)

    def prune(self, keep: Any) -> None:
        """Forget the devices of the created streams not in ``keep`` (the keys still used)."""
        devices = self.devices
        # a snapshot first: a lock-free free notes a new stream's device meanwhile
        # (FixedSizeResource.deallocate_slow), and iterating the dict itself then fails
        # ("dictionary changed size during iteration", seen without the GIL)
        for key in [k for k in list(devices) if k not in keep]:
            devices.pop(key, None)

    def order(self, streams: Iterable[Any], key: Any) -> List[Any]:
        """Make ``key`` (a :func:`stream_key`, or :data:`SYNC`) wait for the work queued so far
        on every stream in ``streams`` (keys) other than itself; returns the streams waited
        for."""
        others = [s for s in streams if s != key and s is not SYNC]
        events = self.events
        runtime = self.runtime
        for s in others:
            if type(s) is Recorded:  # up to an event its own thread recorded
                if s.key == key or _ended(s.key):
                    continue
                if key is SYNC:
                    s.event.synchronize()
                else:
                    runtime.wait_event(handle_of(key), s.event)
                continue
            if is_foreign(s):  # another thread's per-thread stream: wait device-wide,
                if not _ended(s):  # unless the thread waited for it when it ended
                    runtime.device_wait(s[1]).synchronize()
                continue
            ev = events.get(s)
            if ev is None:
                ev = _event_or_none(runtime, s, self.devices.get(s))
                if ev is None:  # a runtime with no device: nothing can be queued anywhere
                    continue
                events[s] = ev
            if not runtime.record_or_synchronize(ev, s):  # s destroyed: waited device-wide
                events.pop(s).close()
                continue
            if key is SYNC:
                ev.synchronize()
            else:
                runtime.wait_event(handle_of(key), ev)
        return others

    def record_for_host(self, streams: Iterable[Any]) -> List[Any]:
        """Fresh events recorded now on every stream in ``streams``: the caller waits for them
        on the host *without* holding its lock, then closes them.  Fresh (not the reusable
        ones) so that nothing can re-record or close them meanwhile.  For another thread's
        per-thread stream a device-wide wait stands in for the event."""
        events: List[Any] = []
        runtime = self.runtime
        try:
            for s in streams:
                if type(s) is Recorded:
                    if not _ended(s.key):
                        events.append(_RecordedWait(s))
                elif is_foreign(s):
                    if not _ended(s):
                        events.append(runtime.device_wait(s[1]))
                elif s is not SYNC:
                    ev = _event_or_none(runtime, s, self.devices.get(s))
                    if ev is None:  # a runtime with no device: nothing can be queued
                        continue
                    events.append(ev)
                    if not runtime.record_or_synchronize(ev, s):  # s destroyed: waited for
                        events.pop().close()
        except BaseException:
            for ev in events:
                ev.close()
            raise
        return events

    def forget(self, key: Any) -> None:
        """Destroy the event of ``key`` (a stream the caller no longer tracks), if any."""
        ev = self.events.pop(key, None)
        if ev is not None:
            ev.close()

    def close(self) -> None:
        """Destroy the events (they are made again when needed)."""
        events = list(self.events.values())
        self.events.clear()
        for ev in events:
            ev.close()

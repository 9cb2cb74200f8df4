"""Stream ordering for the sub-allocators (pool, fixed-size): before memory freed on stream S
is handed out on another stream T, T must not run ahead of the work S had queued.

The sub-allocators call :meth:`StreamOrder.order` lazily, only when a block actually moves
between streams: it records one reusable event per source stream (at that moment, which covers
everything S queued before the free) and makes T wait for it (``hipStreamWaitEvent`` through
:func:`hipmr_ctypes.stream.wait_event`), or, when T is the host (a synchronous allocation),
waits for the event on the host.  No HIP call is made on the hot paths.  The events come from
:mod:`hipmr_ctypes.stream` (:func:`~hipmr_ctypes.stream.event_for`,
:func:`~hipmr_ctypes.stream.record_or_synchronize`).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List

# module globals, so that tests can replace them with fakes
from ..errors import NoDeviceError
from ..stream import DeviceWait as _DeviceWait
from ..stream import (LAST_SPECIAL_HANDLE, device_of, event_for, handle_of, is_foreign,
                      own_keys_below, record_or_synchronize, stream_key, stream_keys,
                      track_streams,
                      wait_event)

from ._base import SYNC

__all__ = ["StreamOrder", "stream_key", "stream_keys", "own_keys_below", "handle_of",
           "track_streams"]


def _event_or_none(stream: int, device: Any = None) -> Any:
    """:func:`event_for`, or None when the runtime sees no device (a pool over host memory on
    a machine without a GPU: no work can be queued on any stream, so none is waited for)."""
    try:
        return event_for(stream, device)
    except NoDeviceError:
        return None


class StreamOrder:
    """One reusable event per stream that has freed memory another user took, and the device
    of every created stream (handle > ``LAST_SPECIAL_HANDLE``) the sub-allocator keeps blocks of,
    noted while the stream was in use: the runtime is never asked about a stream later (it
    may be gone)."""

    __slots__ = ("events", "devices")

    def __init__(self) -> None:
        self.events: Dict[int, Any] = {}
        self.devices: Dict[Any, int] = {}

    def note(self, key: Any) -> None:
        """Remember the device of ``key``'s stream (a created one), which the caller is using
        now: before any block is kept for it."""
        if type(key) is int and key > LAST_SPECIAL_HANDLE and key not in self.devices:
            self.devices[key] = device_of(key)  # (a null stream's key is 0 with one device)

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
        for s in others:
            if is_foreign(s):  # another thread's per-thread stream: wait device-wide
                _DeviceWait(s[1]).synchronize()
                continue
            ev = events.get(s)
            if ev is None:
                ev = _event_or_none(s, self.devices.get(s))
                if ev is None:  # a runtime with no device: nothing can be queued anywhere
                    continue
                events[s] = ev
            if not record_or_synchronize(ev, s):  # s was destroyed: waited for device-wide
                events.pop(s).close()
                continue
            if key is SYNC:
                ev.synchronize()
            else:
                wait_event(handle_of(key), ev)
        return others

    def record_for_host(self, streams: Iterable[Any]) -> List[Any]:
        """Fresh events recorded now on every stream in ``streams``: the caller waits for them
        on the host *without* holding its lock, then closes them.  Fresh (not the reusable
        ones) so that nothing can re-record or close them meanwhile.  For another thread's
        per-thread stream a device-wide wait stands in for the event."""
        events: List[Any] = []
        try:
            for s in streams:
                if is_foreign(s):
                    events.append(_DeviceWait(s[1]))
                elif s is not SYNC:
                    ev = _event_or_none(s, self.devices.get(s))
                    if ev is None:  # a runtime with no device: nothing can be queued
                        continue
                    events.append(ev)
                    if not record_or_synchronize(ev, s):  # s was destroyed: waited for device-wide
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

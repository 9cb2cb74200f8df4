"""Stream ordering for the sub-allocators (pool, fixed-size): before memory freed on stream S
is handed out on another stream T, T must not run ahead of the work S had queued.

The sub-allocators call :meth:`StreamOrder.order` lazily, only when a block actually moves
between streams: it records one reusable event per source stream (at that moment, which covers
everything S queued before the free) and makes T wait for it (``hipStreamWaitEvent`` through
:func:`hipmr_ctypes.stream.wait_event`), or, when T is the host (a synchronous allocation),
waits for the event on the host.  No HIP call is made on the hot paths.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable

__all__ = ["StreamOrder", "HOST"]

#: The key of host-synchronous (``allocate`` / ``deallocate``) use: not a stream handle.
HOST = None


def _new_event() -> Any:
    """A timing-disabled event (a module function so that tests can replace it)."""
    from ..stream import Event
    return Event(flags=2)


def _event_for(stream: int) -> Any:
    """A new event on the device of ``stream``: an event can be recorded only on a stream of
    its own device, and the calling thread's current device may be another one (a pool for
    device 1 used from a thread on device 0).  The special streams (0, 1, 2) belong to the
    current device; a stream whose device the runtime cannot tell gets one there too."""
    if stream not in (0, 1, 2):
        from ..device import Device, get_device
        from ..stream_ref import stream_ref
        try:
            device = stream_ref(stream).device()
        except Exception:  # noqa: BLE001 - no hipStreamGetDevice, or not a runtime stream
            device = None
        if device is not None and device != get_device():
            with Device(device):
                return _new_event()
    return _new_event()


#: hipEventRecord's status for a stream that no longer exists (destroyed after memory was
#: freed on it): invalid handle, or (AMD) context destroyed
_GONE = (400, 709)


def _record(event: Any, stream: int) -> bool:
    """Record ``event`` on ``stream``; False when the stream no longer exists.  Its queued
    work can then only be waited for device-wide: every device is synchronized (a destroyed
    stream's work still runs to completion), so nothing it did can still be pending."""
    from .._hip.errors import HipError
    try:
        event.record(stream)
        return True
    except HipError as exc:
        if exc.code not in _GONE:
            raise
    from ..device import Device, device_count
    for device in range(device_count()):
        Device(device).synchronize()
    return False


def _wait_event(stream: int, event: Any) -> None:
    """Make ``stream`` wait for ``event`` (a module function so that tests can replace it)."""
    from ..stream import wait_event
    wait_event(stream, event)


class StreamOrder:
    """One reusable event per stream that has freed memory another user took."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: Dict[int, Any] = {}

    def order(self, streams: Iterable[Any], key: Any) -> list:
        """Make ``key`` (a stream handle, or :data:`HOST`) wait for the work queued so far on
        every stream in ``streams`` other than itself; returns the streams waited for."""
        others = [s for s in streams if s != key and s is not HOST]
        events = self.events
        for s in others:
            ev = events.get(s)
            if ev is None:
                ev = events[s] = _event_for(s)
            if not _record(ev, s):  # s was destroyed: waited for device-wide
                events.pop(s).close()
                continue
            if key is HOST:
                ev.synchronize()
            else:
                _wait_event(key, ev)
        return others

    def record_for_host(self, streams: Iterable[Any]) -> list:
        """Fresh events recorded now on every stream in ``streams``: the caller waits for them
        on the host *without* holding its lock, then closes them.  Fresh (not the reusable
        ones) so that nothing can re-record or close them meanwhile."""
        events = []
        try:
            for s in streams:
                if s is not HOST:
                    ev = _event_for(s)
                    events.append(ev)
                    if not _record(ev, s):  # s was destroyed: waited for device-wide
                        events.pop().close()
        except BaseException:
            for ev in events:
                ev.close()
            raise
        return events

    def close(self) -> None:
        """Destroy the events (they are made again when needed)."""
        events = list(self.events.values())
        self.events.clear()
        for ev in events:
            ev.close()

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
                ev = events[s] = _new_event()
            ev.record(s)
            if key is HOST:
                ev.synchronize()
            else:
                _wait_event(key, ev)
        return others

    def close(self) -> None:
        """Destroy the events (they are made again when needed)."""
        events = list(self.events.values())
        self.events.clear()
        for ev in events:
            ev.close()

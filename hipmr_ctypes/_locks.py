"""A lock that knows which thread holds it and can defer calls until it is let go.

The garbage collector can run a finalizer at any allocation, also in a thread that holds a
lock in the middle of an update; a finalizer that frees memory through the same object would
then deadlock on a plain ``threading.Lock`` (or, with an ``RLock``, run in the middle of the
update).  Code that can be re-entered this way checks :meth:`DeferringLock.held_here` and
:meth:`~DeferringLock.defer`\\ s the call instead; deferred calls run, in order, right after the
lock is let go.  A leaf module: it imports only the standard library, so every layer may use it.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

__all__ = ["DeferringLock"]


class DeferringLock:
    """A non-reentrant lock with an owner and a queue of calls deferred until its release."""

    __slots__ = ("_lock", "owner", "_deferred")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: Optional[int] = None
        self._deferred: List[Any] = []

    def held_here(self) -> bool:
        """True when the calling thread holds the lock."""
        return self.owner == threading.get_ident()

    def acquire(self) -> None:
        """Take the lock (blocking)."""
        self._lock.acquire()
        self.owner = threading.get_ident()

    def release(self) -> None:
        """Let go of the lock, then run the calls deferred meanwhile (their errors are
        dropped: they come from finalizers, which have nobody to report to)."""
        self.owner = None
        self._lock.release()
        while self._deferred:
            try:
                call, args = self._deferred.pop(0)
            except IndexError:
                return
            try:
                call(*args)
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "DeferringLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def defer(self, call: Callable[..., Any], *args: Any) -> None:
        """Run ``call(*args)`` once the lock is let go."""
        self._deferred.append((call, args))

"""A thread that allocated on its per-thread stream synchronizes that stream when it ends.

CUDA 13's driver (580) hangs a thread's exit when its per-thread stream still has work queued
after a stream-ordered allocation (``cudaMallocAsync`` / ``cudaMallocFromPoolAsync``, then a
copy, a memset or an event record, not yet waited for): the thread's exit handler in the driver
never returns, and every other thread's next runtime call blocks behind it.  Waiting for the
stream before the thread ends avoids it (docs/internals.md, "Thread exit").

:func:`arm` is called on the checked path of ``AsyncMemoryResource.allocate_async`` (the only
place the package queues a stream-ordered allocation) whenever the stream is the per-thread
one, and by a sub-allocator when it first keeps blocks freed on a thread's per-thread stream
(``_stream_order.StreamOrder.note``): after the wait, that thread's blocks are known clean.
It keeps, in a ``threading.local``, an object whose ``__del__`` runs in the ending thread
while its Python state is cleared, before ``Thread.join`` returns and before the driver's exit
handler: it synchronizes the per-thread stream of every device the thread allocated on.

Interpreter exit: nothing here may wait on a lock that a thread stopped by the interpreter
holds (docs/internals.md, "Thread exit").  A guard waits only in the thread that armed it
(``PER_THREAD_HANDLE`` names the *calling* thread's stream: waiting in another thread would
wait for the wrong one), and never once the interpreter finalizes: then the finalizing thread clears the
``threading.local`` of daemon threads that can never run again, and those may be stopped
holding any lock (the emulator's, a lock of the runtime's host callbacks).  The main thread
waits for its own per-thread streams in an ``atexit`` hook instead, while every thread still
runs; an allocation on it after that hook is not waited for (the process is ending: no later
thread can be blocked behind it).
"""
from __future__ import annotations

import atexit
import sys
import threading
from ctypes import byref, c_int
from typing import Any, Callable, List, Optional, Tuple

from .device import current_device_function
from .stream_refs import PER_THREAD_HANDLE

__all__ = ["arm"]

_local = threading.local()


class _ExitSync:
    """Waits for the ending thread's per-thread streams (see the module docstring)."""

    __slots__ = ("rt", "devices", "ident", "then", "__weakref__")

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.devices: List[int] = []
        self.ident = threading.get_ident()
        self.then: List[Tuple[Callable[[Any], None], Any]] = []

    def wait(self) -> None:
        """Synchronize the per-thread stream of each device recorded, in the calling thread
        (the one that armed the guard), the thread's device restored after; then forget
        them.  Errors are ignored: the thread is ending, nobody can be told."""
        devices, self.devices = self.devices, []
        then, self.then = self.then, []
        if not devices:
            return
        fn = self.rt.fn
        out = c_int(-1)
        try:
            fn.hipGetDevice(byref(out))
            first = now = out.value
            waited = True
            for device in devices:
                if device != now:
                    waited = not fn.hipSetDevice(device) and waited
                    now = device
                waited = not fn.hipStreamSynchronize(PER_THREAD_HANDLE) and waited
            if now != first >= 0:
                fn.hipSetDevice(first)
            if waited:   # every per-thread stream of the thread is idle for good
                for call, arg in then:
                    call(arg)
        except Exception:  # noqa: BLE001 - the thread is ending: nobody can be told
            pass

    def __del__(self, _ident: Callable[[], int] = threading.get_ident,
                _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        try:
            if _ident() == self.ident and not _finalizing():
                self.wait()
        except Exception:  # noqa: BLE001 - (module teardown: nothing to report to)
            pass


def _wait_at_exit() -> None:
    """The ``atexit`` hook: the exiting thread (the main one) waits for its own per-thread
    streams now, while every thread still runs (its guard will not wait at finalization)."""
    guard = getattr(_local, "guard", None)
    if guard is not None and guard.ident == threading.get_ident():
        guard.wait()


atexit.register(_wait_at_exit)


def arm(rt: Any, arg: Any = None, then: Optional[Callable[[Any], None]] = None) -> None:
    """Make the calling thread wait for its per-thread stream of the current device when it
    ends (``rt``: the runtime the allocation is queued on); ``then(arg)`` runs after that wait
    when every one of the thread's per-thread streams was waited for without an error (once
    per distinct pair)."""
    try:
        guard = _local.guard
    except AttributeError:
        guard = None
    if guard is None or guard.rt is not rt:
        if guard is not None:  # another runtime: the old guard waits for its streams as it
            guard.then.clear()  # goes, but the thread goes on, so nothing due at its end runs
        guard = _local.guard = _ExitSync(rt)
    device = current_device_function()()
    if device not in guard.devices:
        guard.devices.append(device)
    if then is not None and (then, arg) not in guard.then:
        guard.then.append((then, arg))

"""A thread that allocated on its per-thread stream synchronizes that stream when it ends.

CUDA 13's driver (580) hangs a thread's exit when its per-thread stream still has work queued
after a stream-ordered allocation (``cudaMallocAsync`` / ``cudaMallocFromPoolAsync``, then a
copy, a memset or an event record, not yet waited for): the thread's exit handler in the driver
never returns, and every other thread's next runtime call blocks behind it.  Waiting for the
stream before the thread ends avoids it (docs/internals.md, "Thread exit").

:func:`arm` is called on the checked path of ``AsyncMemoryResource.allocate_async`` (the only
place the package queues a stream-ordered allocation) whenever the stream is the per-thread
one.  It keeps, in a ``threading.local``, an object whose ``__del__`` runs in the ending thread
while its Python state is cleared, before ``Thread.join`` returns and before the driver's exit
handler: it synchronizes the per-thread stream of every device the thread allocated on.
"""
from __future__ import annotations

import threading
from ctypes import byref, c_int
from typing import Any, List

from .device import current_device_function
from .stream_ref import PER_THREAD_HANDLE as PER_THREAD

__all__ = ["arm"]

_local = threading.local()


class _ExitSync:
    """Waits for the ending thread's per-thread streams (see the module docstring)."""

    __slots__ = ("rt", "devices", "__weakref__")

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.devices: List[int] = []

    def __del__(self) -> None:
        fn = self.rt.fn
        out = c_int(-1)
        try:
            fn.hipGetDevice(byref(out))
            first = now = out.value
            for device in self.devices:
                if device != now:
                    fn.hipSetDevice(device)
                    now = device
                fn.hipStreamSynchronize(PER_THREAD)
            if now != first >= 0:
                fn.hipSetDevice(first)
        except Exception:  # noqa: BLE001 - the thread is ending: nobody can be told
            pass


def arm(rt: Any) -> None:
    """Make the calling thread wait for its per-thread stream of the current device when it
    ends (``rt``: the runtime the allocation is queued on)."""
    try:
        guard = _local.guard
    except AttributeError:
        guard = None
    if guard is None or guard.rt is not rt:
        guard = _local.guard = _ExitSync(rt)
    device = current_device_function()()
    if device not in guard.devices:
        guard.devices.append(device)

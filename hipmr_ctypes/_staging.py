"""Large synchronous copies between pageable host memory and the device, staged through
page-locked (pinned) memory, chunked and pipelined.

The runtime cannot DMA from or into pageable memory: for such a copy it stages the bytes
through pinned buffers of its own, one piece after another, and the host waits for each piece.
Here the package does the staging itself, so that the CPU's copy of one chunk overlaps the
device's transfer of the chunk before it:

* host to device: chunk *i* is copied by the CPU into pinned slot ``i % SLOTS`` (once the
  transfer that last read that slot has completed: its event), then its transfer is queued on
  the copy's stream and an event recorded after it;
* device to host: the transfer of chunk *i + 1* into its slot is queued before the CPU copies
  chunk *i* out of the slot its transfer has filled (its event waited for).

The CPU copies are ``ctypes.memmove``, which lets go of the GIL.  The copy's stream is the
buffer's own, so the copy is ordered after the work on it, as the runtime's synchronous copy
would be; the call returns when the whole copy is complete (the stream synchronized).

Each (runtime, device) has one staging set: ``SLOTS`` pinned chunks of ``CHUNK`` bytes
(``hipHostMallocPortable``) and one event per slot, made on its first staged copy and kept for
the life of the process (a bounded cache, like the runtime's own staging buffers; nothing is
allocated per copy).  A set serves one copy at a time: a copy that finds its set busy (another
thread is copying) is not staged, and the runtime copies it as before; so is a copy whose
set cannot be made (no pinned memory: the error is kept and not retried).  A forked child never
stages (the runtime is not usable there at all; see ``_hip.fork``).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, List, Optional, Tuple

from ._hip.types import hipEventDisableTiming, hipHostMallocPortable, hipMemcpyDefault
from .device import get_device, on_device_or_current

__all__ = ["THRESHOLD", "CHUNK", "SLOTS", "to_device", "to_host"]

#: copies of fewer bytes go to the runtime directly (one call is faster than a pipeline)
THRESHOLD = 16 << 20
#: the bytes of one pinned slot: the pipeline's step
CHUNK = 4 << 20
#: pinned slots per staging set (two: one filled by the CPU while the other is in flight)
SLOTS = 2

_memmove = ctypes.memmove


class _Set:
    """One device's pinned slots and their events (see the module docstring)."""

    __slots__ = ("rt", "lock", "slots", "events", "chunk")

    def __init__(self, rt: Any, chunk: int, count: int) -> None:
        self.rt = rt
        self.lock = threading.Lock()
        self.chunk = chunk
        self.slots: List[int] = []
        self.events: List[int] = []
        try:
            for _ in range(count):
                out = ctypes.c_void_p()
                rt.check(rt.fn.hipHostMalloc(out, chunk, hipHostMallocPortable),
                         "hipHostMalloc", size=chunk)
                self.slots.append(out.value or 0)
                ev = ctypes.c_void_p()
                rt.check(rt.fn.hipEventCreateWithFlags(ev, hipEventDisableTiming),
                         "hipEventCreateWithFlags")
                self.events.append(ev.value or 0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give the slots and events back (a set that could not be made completely)."""
        rt = self.rt
        for ptr in self.slots:
            rt.fn.hipHostFree(ptr)
        for ev in self.events:
            rt.fn.hipEventDestroy(ev)
        self.slots, self.events = [], []


# (id of the runtime, device) -> (the runtime, its set or None: it could not be made); the
# runtime is held, so its id is not reused while its entry is here
_sets: Dict[Tuple[int, int], Tuple[Any, Optional[_Set]]] = {}
_make_lock = threading.Lock()


def _set_for(rt: Any, device: Optional[int]) -> Optional[_Set]:
    """The staging set of ``device`` (None: the current one) on ``rt``, made on first use;
    None when it cannot be made (the error is not raised: the runtime copies instead)."""
    if device is None:
        device = get_device()
    key = (id(rt), device)
    entry = _sets.get(key)
    if entry is None:
        with _make_lock:
            entry = _sets.get(key)
            if entry is None:
                made: Optional[_Set] = None
                try:
                    with on_device_or_current(device):
                        made = _Set(rt, CHUNK, SLOTS)
                except Exception:  # noqa: BLE001 - no pinned memory: not staged, ever
                    rt.clear_last_error()
                entry = _sets[key] = (rt, made)
    return entry[1]


def _finish(rt: Any, stream: int, ok: bool) -> None:
    """Wait for the copy's stream; after a failure, wait without raising (the slots may be
    in flight: the next copy must not overwrite them first)."""
    st = rt.fn.hipStreamSynchronize(stream)
    if st and ok:
        rt.check(st, "hipStreamSynchronize")
    elif st:
        rt.clear_last_error()


def to_device(rt: Any, dst: int, src: int, n: int, stream: int, device: Optional[int]) -> bool:
    """Copy ``n`` bytes from pageable ``src`` to device memory ``dst`` on ``stream``, staged;
    returns False, having done nothing, when the copy is not staged (see the module)."""
    staging = _set_for(rt, device)
    if staging is None or not staging.lock.acquire(False):
        return False
    ok = False
    try:
        fn = rt.fn
        check = rt.check
        copy_async, record, wait = fn.hipMemcpyAsync, fn.hipEventRecord, fn.hipEventSynchronize
        slots, events, chunk = staging.slots, staging.events, staging.chunk
        count = len(slots)
        queued = [False] * count
        offset = i = 0
        while offset < n:
            m = min(chunk, n - offset)
            s = i % count
            if queued[s]:
                check(wait(events[s]), "hipEventSynchronize")
            _memmove(slots[s], src + offset, m)
            check(copy_async(dst + offset, slots[s], m, hipMemcpyDefault, stream),
                  "hipMemcpyAsync", size=m)
            check(record(events[s], stream), "hipEventRecord")
            queued[s] = True
            offset += m
            i += 1
        ok = True
    finally:
        try:
            _finish(rt, stream, ok)
        finally:
            staging.lock.release()
    return True


def to_host(rt: Any, dst: int, src: int, n: int, stream: int, device: Optional[int]) -> bool:
    """Copy ``n`` bytes from device memory ``src`` to pageable ``dst`` on ``stream``, staged;
    returns False, having done nothing, when the copy is not staged (see the module)."""
    staging = _set_for(rt, device)
    if staging is None or not staging.lock.acquire(False):
        return False
    ok = False
    try:
        fn = rt.fn
        check = rt.check
        copy_async, record, wait = fn.hipMemcpyAsync, fn.hipEventRecord, fn.hipEventSynchronize
        slots, events, chunk = staging.slots, staging.events, staging.chunk
        count = len(slots)
        pieces = [(off, min(chunk, n - off)) for off in range(0, n, chunk)]

        def queue(i: int) -> None:
            off, m = pieces[i]
            s = i % count
            check(copy_async(slots[s], src + off, m, hipMemcpyDefault, stream),
                  "hipMemcpyAsync", size=m)
            check(record(events[s], stream), "hipEventRecord")

        ahead = min(count - 1, len(pieces))
        for i in range(ahead):
            queue(i)
        for i, (off, m) in enumerate(pieces):
            if i + ahead < len(pieces):
                queue(i + ahead)   # its slot was emptied by the CPU one round before
            s = i % count
            check(wait(events[s]), "hipEventSynchronize")
            _memmove(dst + off, slots[s], m)
        ok = True
    finally:
        try:
            _finish(rt, stream, ok)
        finally:
            staging.lock.release()
    return True

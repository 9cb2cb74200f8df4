"""Streams, events and synchronization.

Work is executed when it is submitted, so every stream is idle unless a test made it busy
with ``set_stream_busy``.  Synchronize points (stream, event, device) are where memory pools give
back cached memory above their release threshold, as on the real runtimes.
"""
from __future__ import annotations

import time
from ctypes import c_float, c_int, c_uint, c_ulonglong, c_void_p
from typing import Any

from ..types import (hipEventBlockingSync, hipEventDisableTiming, hipEventInterprocess,
                     hipStreamNonBlocking)
from ._args import Status, addr, i32, out, u32
from ._core import INVALID_HANDLE, INVALID_VALUE, NOT_READY, EmulatorCore, Event, Stream

__all__ = ["StreamMixin"]

PRIORITY_LEAST = 0       # hipDeviceGetStreamPriorityRange: (least, greatest), as AMD and CUDA
PRIORITY_GREATEST = -1
hipEventDisableSystemFence = 0x20000000
hipEventReleaseToDevice = 0x40000000
hipEventReleaseToSystem = 0x80000000
_EVENT_RELEASE_FLAGS = hipEventDisableSystemFence | hipEventReleaseToDevice | hipEventReleaseToSystem
_EVENT_FLAGS = hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess | \
    _EVENT_RELEASE_FLAGS


class StreamMixin(EmulatorCore):
    """hipStream*, hipEvent*, hipDeviceSynchronize, hipDeviceGetStreamPriorityRange."""

    def _event(self, handle: Any) -> Event:
        ev = self._events.get(addr(handle))
        if ev is None:
            raise Status(INVALID_HANDLE)
        return ev

    # ---- streams --------------------------------------------------------------------------
    def hipStreamCreateWithPriority(self, stream: Any, flags: Any, priority: Any) -> None:
        """hipStreamCreateWithPriority(hipStream_t*, unsigned, int): priority is clamped."""
        target = out(stream, c_void_p)
        f, prio = u32(flags), i32(priority)
        if f not in (0, hipStreamNonBlocking):
            raise Status(INVALID_VALUE)
        prio = min(PRIORITY_LEAST, max(PRIORITY_GREATEST, prio))
        with self._lock:
            handle = self._new_handle()
            self._streams[handle] = Stream(handle, self._tls.device, f, prio, self._new_handle())
        target.value = handle

    def hipStreamDestroy(self, stream: Any) -> None:
        """hipStreamDestroy(hipStream_t): unknown, destroyed or special handles are invalid."""
        with self._lock:
            handle = addr(stream)
            s = self._streams.pop(handle, None)
            if s is None:
                if handle in self._destroyed_streams:
                    self.destroyed_stream_calls.append(("hipStreamDestroy", handle))
                raise Status(INVALID_HANDLE)
            s.alive = False
            self._destroyed_streams.add(handle)

    def hipStreamSynchronize(self, stream: Any) -> None:
        """hipStreamSynchronize(hipStream_t): the stream becomes idle; pools trim."""
        with self._lock:
            s = self._stream_or(addr(stream))
            s.busy = 0
            self._release_device_pools(s.device, addr(stream))

    def hipStreamQuery(self, stream: Any) -> int:
        """hipStreamQuery(hipStream_t): hipErrorNotReady while set_stream_busy says so."""
        with self._lock:
            s = self._stream_or(addr(stream))
            if s.busy:
                s.busy -= 1
                return NOT_READY
        return 0

    def hipStreamWaitEvent(self, stream: Any, event: Any, flags: Any) -> None:
        """hipStreamWaitEvent(hipStream_t, hipEvent_t, unsigned): validated; nothing to wait for."""
        f = u32(flags)
        with self._lock:
            self._stream_or(addr(stream))
            self._event(event)
        if f not in (0, 1):   # hipEventWaitDefault, hipEventWaitExternal
            raise Status(INVALID_VALUE)

    def hipStreamGetPriority(self, stream: Any, priority: Any) -> None:
        """hipStreamGetPriority(hipStream_t, int*)."""
        target = out(priority, c_int)
        with self._lock:
            target.value = self._stream_or(addr(stream)).priority

    def hipStreamGetFlags(self, stream: Any, flags: Any) -> None:
        """hipStreamGetFlags(hipStream_t, unsigned*)."""
        target = out(flags, c_uint)
        with self._lock:
            target.value = self._stream_or(addr(stream)).flags

    def hipStreamGetDevice(self, stream: Any, device: Any) -> None:
        """hipStreamGetDevice(hipStream_t, int*): the device current when it was created."""
        target = out(device, c_int)
        with self._lock:
            target.value = self._stream_or(addr(stream)).device

    def hipStreamGetId(self, stream: Any, stream_id: Any) -> None:
        """hipStreamGetId(hipStream_t, unsigned long long*): unique, never reused."""
        target = out(stream_id, c_ulonglong)
        with self._lock:
            target.value = self._stream_or(addr(stream)).sid

    def hipDeviceGetStreamPriorityRange(self, least_priority: Any, greatest_priority: Any) -> None:
        """hipDeviceGetStreamPriorityRange(int*, int*): (0, -1); either may be NULL."""
        if least_priority is not None:
            out(least_priority, c_int).value = PRIORITY_LEAST
        if greatest_priority is not None:
            out(greatest_priority, c_int).value = PRIORITY_GREATEST

    def hipDeviceSynchronize(self) -> None:
        """hipDeviceSynchronize(): every stream of the current device becomes idle; pools trim."""
        with self._lock:
            ordinal = self._tls.device
            self._complete_device(ordinal)
            self._release_device_pools(ordinal)

    # ---- events ---------------------------------------------------------------------------
    def hipEventCreateWithFlags(self, event: Any, flags: Any) -> None:
        """hipEventCreateWithFlags(hipEvent_t*, unsigned): AMD's flag rules."""
        target = out(event, c_void_p)
        f = u32(flags)
        release = f & _EVENT_RELEASE_FLAGS
        if (f & ~_EVENT_FLAGS or release & (release - 1)
                or (f & hipEventInterprocess and not f & hipEventDisableTiming)):
            raise Status(INVALID_VALUE)
        with self._lock:
            handle = self._new_handle()
            self._events[handle] = Event(handle, self._tls.device, f)
        target.value = handle

    def hipEventRecord(self, event: Any, stream: Any) -> None:
        """hipEventRecord(hipEvent_t, hipStream_t): stamps time.perf_counter()."""
        with self._lock:
            ev = self._event(event)
            s = self._stream_or(addr(stream))
            if s.device != ev.device:
                raise Status(INVALID_HANDLE)
            ev.recorded = True
            ev.stamp = time.perf_counter()
            ev.stream, ev.epoch = (s, s.epoch) if s.busy else (None, 0)
            if ev.ipc is not None:   # what other processes that opened it see
                ev.ipc.set_pending(ev.stream is not None)

    def hipEventSynchronize(self, event: Any) -> None:
        """hipEventSynchronize(hipEvent_t): completes the work it waits for; pools trim.  An
        interprocess event recorded by another process: waits until that process's work is
        done (its shared signal cleared), polling, as clr does."""
        with self._lock:
            ev = self._event(event)
            waited = ev.stream.handle if ev.pending() else None   # type: ignore[union-attr]
            if ev.pending():
                ev.stream.busy = 0   # type: ignore[union-attr]
            self._complete_event(ev)
            self._release_device_pools(ev.device, waited if waited is not None else -1)
            shared = ev.ipc
        if shared is not None:
            while shared.pending():
                time.sleep(0.001)

    def hipEventQuery(self, event: Any) -> int:
        """hipEventQuery(hipEvent_t): not ready while its stream is busy (consumes one query)."""
        with self._lock:
            ev = self._event(event)
            if ev.pending():
                ev.stream.busy -= 1   # type: ignore[union-attr]
                return NOT_READY
            self._complete_event(ev)
            if ev.ipc is not None and ev.ipc.pending():   # recorded by another process,
                return NOT_READY                          # whose work is still pending
        return 0

    def _complete_event(self, ev: Event) -> None:
        """The work ``ev`` was recorded after is done (lock held); an interprocess event
        this process recorded says so to the other processes."""
        if ev.stream is not None and ev.ipc is not None:
            ev.ipc.set_pending(False)
        ev.stream = None

    def hipEventElapsedTime(self, ms: Any, start: Any, stop: Any) -> int:
        """hipEventElapsedTime(float*, hipEvent_t, hipEvent_t): clr's checks, in clr's order."""
        target = out(ms, c_float)
        with self._lock:
            first, last = self._event(start), self._event(stop)
            if first.device != last.device or not (first.recorded and last.recorded):
                raise Status(INVALID_HANDLE)
            if (first.flags | last.flags) & hipEventDisableTiming:
                raise Status(INVALID_HANDLE)
            if first.pending() or last.pending():
                return NOT_READY
            target.value = (last.stamp - first.stamp) * 1000.0
        return 0

    def hipEventDestroy(self, event: Any) -> None:
        """hipEventDestroy(hipEvent_t): unknown or destroyed handles are invalid."""
        with self._lock:
            ev = self._events.pop(addr(event), None)
            if ev is None:
                raise Status(INVALID_HANDLE)
            if self._ipc_events.pop(ev.handle, None) is not None:
                ev.ipc.close()   # the exporter removes the shared signal's name


"""Large synchronous copies between pageable host memory and the device, staged through
page-locked (pinned) memory, chunked and pipelined.

The runtime cannot DMA from or into pageable memory: for such a copy it stages the bytes
through pinned buffers of its own, one piece after another, and the host waits for each piece.
Here the package does the staging itself, so that the CPU's copy of one chunk overlaps the
device's transfer of the chunk before it, and several CPU copies run at once:

* host to device: chunk *i* is copied by the CPU into pinned slot ``i % SLOTS`` (once the
  transfer that last read that slot has completed: its event), then its transfer is queued on
  the copy's stream and an event recorded after it;
* device to host: the transfer of chunk *i + 1* into its slot is queued before the CPU copies
  chunk *i* out of the slot its transfer has filled (its event waited for);
* the bytes are split into up to ``WORKERS`` contiguous parts of ``MIN_PART`` bytes or
  more, one pipeline each: the calling
  thread runs the first, a thread started for the copy each other one (joined before the
  copy returns).  On the per-thread stream (handle 2, another stream in every thread) one
  pipeline runs, in the calling thread.

The CPU copies are ``ctypes.memmove``, which lets go of the GIL.  The copy's stream is the
buffer's own, so the copy is ordered after the work on it, as the runtime's synchronous copy
would be; the call returns when the whole copy is complete (the stream synchronized), also
after an error, which is then raised.  An interrupt (``KeyboardInterrupt``, or any exception
a signal handler raises in the calling thread) is an error like any other: the pipelines stop
at their next chunk, the call waits for every one of them and for the stream (a wait that an
interrupt only restarts), and raises the interrupt then, so that no CPU copy or queued
transfer touches the caller's memory after the call has left.

Each (runtime, device) has ``WORKERS`` staging sets, each ``SLOTS`` pinned chunks of ``CHUNK``
bytes (``hipHostMallocPortable``) and one event per slot, made on the first staged copy and
kept for the life of the process (a bounded cache, like the runtime's own staging buffers;
nothing is allocated per copy).  A set serves one pipeline at a time: a copy takes the sets
that are free (others may be copying), and a copy that finds none free, or whose sets cannot
be made (no pinned memory: not retried), is left to the runtime, as a smaller copy is.  A
forked child never stages: the runtime is not usable there at all (see ``_hip.fork``).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._hip.types import hipEventDisableTiming, hipHostMallocPortable, hipMemcpyDefault
from ..device import get_device, on_device_or_current
from ..stream_refs import PER_THREAD_HANDLE

__all__ = ["THRESHOLD", "TO_HOST_THRESHOLD", "TO_EXISTING_HOST_THRESHOLD", "CHUNK", "SLOTS",
           "WORKERS", "MIN_PART", "threshold", "to_device", "to_host", "to_existing_host"]

#: host-to-device copies of fewer bytes go to the runtime directly (one call is faster than
#: a pipeline)
THRESHOLD = 16 << 20
#: the same for device-to-host copies into a fresh destination (``tobytes()``,
#: ``copy_to_host()``): from here two pipelines beat the runtime's own copy, by most from
#: 32 MiB, where every new block is a fresh mapping whose pages fault in while it fills; below
#: it the runtime's one copy is faster (the runs: benchmarks/results/history.md)
TO_HOST_THRESHOLD = 20 << 20
#: the same into pageable memory already in use (``copy_to_host(out)``): below it the
#: runtime's own copy into touched memory matches or beats two pipelines
TO_EXISTING_HOST_THRESHOLD = 64 << 20
#: the bytes of one pinned slot: the pipeline's step
CHUNK = 2 << 20
#: pinned slots per pipeline (two: one filled by the CPU while the other is in flight)
SLOTS = 2
#: the fewest bytes a pipeline is started for: below ``WORKERS * MIN_PART`` a copy runs
#: fewer pipelines (16 MiB: two), since starting one and filling it costs more than it brings
#: on a short part
MIN_PART = 8 << 20


def _default_workers(cpus: int) -> int:
    return max(1, min(4, cpus // 2))


#: pipelines per copy, each over its own part of the bytes and its own slots: the calling
#: thread runs one, a thread started for the copy each other one (one pipeline is bound by
#: the CPU's copies, not by the link): up to 4, half the CPUs this process may run on
WORKERS = _default_workers(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else (os.cpu_count() or 1))

_memmove = ctypes.memmove


class _Set:
    """One pipeline's pinned slots and their events (see the module docstring)."""

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


# (id of the runtime, device) -> (the runtime, the device's WORKERS sets, or () when they
# could not be made); the runtime is held, so its id is not reused while its entry is here
_sets: Dict[Tuple[int, int], Tuple[Any, Tuple[_Set, ...]]] = {}
_make_lock = threading.Lock()


def _sets_for(rt: Any, device: int) -> Tuple[_Set, ...]:
    """The staging sets of ``device`` on ``rt``, made on first use; () when they cannot be
    made (the error is not raised: the runtime copies instead)."""
    key = (id(rt), device)
    entry = _sets.get(key)
    if entry is None:
        with _make_lock:
            entry = _sets.get(key)
            if entry is None:
                made: List[_Set] = []
                try:
                    with on_device_or_current(device):
                        for _ in range(max(1, WORKERS)):
                            made.append(_Set(rt, CHUNK, SLOTS))
                except Exception:  # noqa: BLE001 - no pinned memory: not staged, ever
                    rt.clear_last_error()
                    for one in made:
                        one.close()
                    made = []
                entry = _sets[key] = (rt, tuple(made))
    return entry[1]


def _into_device(rt: Any, staging: _Set, dst: int, src: int, n: int, stream: int,
                 stop: List[bool]) -> None:
    """One pipeline, host to device: chunk i is copied into slot i % SLOTS once the transfer
    that last read that slot is done, then its transfer is queued; it ends early, before a
    chunk, once ``stop[0]`` is set (another pipeline failed, or the caller was
    interrupted)."""
    fn = rt.fn
    check = rt.check
    copy_async, record, wait = fn.hipMemcpyAsync, fn.hipEventRecord, fn.hipEventSynchronize
    slots, events, chunk = staging.slots, staging.events, staging.chunk
    count = len(slots)
    queued = [False] * count
    offset = i = 0
    while offset < n and not stop[0]:
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


def _into_host(rt: Any, staging: _Set, dst: int, src: int, n: int, stream: int,
               stop: List[bool]) -> None:
    """One pipeline, device to host: the transfer of chunk i + SLOTS - 1 is queued before the
    CPU copies chunk i out of the slot its transfer filled; it ends early, before a chunk,
    once ``stop[0]`` is set."""
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
        if stop[0]:
            return   # the transfers queued into the slots are waited for by the caller
        if i + ahead < len(pieces):
            queue(i + ahead)   # its slot was emptied by the CPU one round before
        s = i % count
        check(wait(events[s]), "hipEventSynchronize")
        _memmove(dst + off, slots[s], m)


def _staged(pipeline: Callable[..., None], rt: Any, dst: int, src: int, n: int, stream: int,
            device: Optional[int], least: int = 1) -> bool:
    """Run ``pipeline`` over ``n`` bytes on as many free sets as there are (up to WORKERS;
    one only on the per-thread stream, which names another stream in every thread), each over
    its own contiguous part; False, having done nothing, when fewer than ``least`` are free.

    Nothing it started touches ``dst`` or ``src`` once it returns or raises: an exception
    (an error, or one a signal handler raises, such as ``KeyboardInterrupt``) stops the
    pipelines at their next chunk, and the call leaves only after every pipeline's CPU copies
    and the stream's queued copies are done.  The wait starts again after each interruption
    (bounded: the pipelines stop at their next chunk) and the first one is raised after it."""
    if device is None:
        device = get_device()
    sets = _sets_for(rt, device)
    want = 1 if stream == PER_THREAD_HANDLE else max(1, n // MIN_PART)
    claimed: List[_Set] = []
    for one in sets:
        if len(claimed) == want:
            break
        if one.lock.acquire(False):
            claimed.append(one)
    if len(claimed) < least:
        for one in claimed:
            one.lock.release()
        return False
    errors: List[BaseException] = []
    stop = [False]
    # One (claim, done) pair per pipeline run by a thread of its own.  Whoever takes
    # ``claim`` (a re-entrant lock: the caller may take it again after an interrupt) first
    # decides: the thread, which then copies its part and sets ``done``; or the caller, once
    # the copy is stopping, and the part is then never begun (a thread that could not be
    # started, or not yet scheduled, copies nothing after the call has left).
    workers: List[Tuple[Any, threading.Event]] = []
    status = [0]
    interrupted: Optional[BaseException] = None
    try:
        try:
            chunk = claimed[0].chunk
            share = -(-n // len(claimed))          # each pipeline's part, rounded up to chunks
            per = -(-share // chunk) * chunk
            parts = [(staging, off, min(per, n - off))
                     for staging, off in zip(claimed, range(0, n, per))]

            def run(staging: _Set, off: int, m: int, worker: Any) -> None:
                if worker is not None and not worker[0].acquire(False):
                    return   # the caller gave this part up before it began
                try:
                    if worker is not None:
                        with on_device_or_current(device):
                            pipeline(rt, staging, dst + off, src + off, m, stream, stop)
                    else:
                        pipeline(rt, staging, dst + off, src + off, m, stream, stop)
                except BaseException as exc:  # noqa: BLE001 - raised by the caller below
                    stop[0] = True
                    errors.append(exc)
                finally:
                    if worker is not None:
                        worker[1].set()

            for staging, off, m in parts[1:]:
                worker = (threading.RLock(), threading.Event())
                workers.append(worker)
                try:
                    threading.Thread(target=run, args=(staging, off, m, worker),
                                     daemon=True).start()
                except RuntimeError:   # no new threads (the interpreter is exiting): in turn
                    workers.pop()
                    run(staging, off, m, None)
            staging, off, m = parts[0]
            run(staging, off, m, None)
        except BaseException as exc:  # noqa: BLE001 - raised once the copy has stopped
            stop[0] = True
            errors.insert(0, exc)
    finally:
        # Written inline, not as a call: nothing may run between leaving the copy and this
        # wait that an interrupt could escape from.  Every exception in here is an
        # interruption (the wait raises nothing of its own); the wait starts again after it.
        while True:
            try:
                try:
                    for claim, done in workers:
                        if not (stop[0] and claim.acquire(False)):
                            done.wait()   # the thread has begun its part (or will)
                    status[0] = rt.fn.hipStreamSynchronize(stream)
                    while claimed:   # the slots are idle: later copies may use them
                        claimed.pop().lock.release()
                    break
                except BaseException as exc:  # noqa: BLE001 - raised after the wait
                    stop[0] = True
                    if interrupted is None:
                        interrupted = exc
            except BaseException as exc:  # noqa: BLE001 - a second one, in the handler
                stop[0] = True
                if interrupted is None:
                    interrupted = exc
    if errors or interrupted is not None:
        if status[0]:
            rt.clear_last_error()   # the copy's own failure (or the interrupt) is raised
        raise errors[0] if errors else interrupted  # type: ignore[misc]
    if status[0]:
        rt.check(status[0], "hipStreamSynchronize")
    return True


def threshold(staged: Callable[..., bool]) -> int:
    """The fewest bytes a copy needs to be handed to ``staged`` (:func:`to_device`,
    :func:`to_host` or :func:`to_existing_host`)."""
    if staged is to_device:
        return THRESHOLD
    return TO_HOST_THRESHOLD if staged is to_host else TO_EXISTING_HOST_THRESHOLD


def to_device(rt: Any, dst: int, src: int, n: int, stream: int, device: Optional[int]) -> bool:
    """Copy ``n`` bytes from pageable ``src`` to device memory ``dst`` on ``stream``, staged;
    returns False, having done nothing, when the copy is not staged (see the module)."""
    return _staged(_into_device, rt, dst, src, n, stream, device)


def to_host(rt: Any, dst: int, src: int, n: int, stream: int, device: Optional[int]) -> bool:
    """Copy ``n`` bytes from device memory ``src`` to fresh pageable ``dst`` (memory nobody
    has touched yet) on ``stream``, staged; returns False, having done nothing, when the copy
    is not staged (see the module)."""
    return _staged(_into_host, rt, dst, src, n, stream, device)


def to_existing_host(rt: Any, dst: int, src: int, n: int, stream: int,
                     device: Optional[int]) -> bool:
    """:func:`to_host` into pageable memory already in use (``copy_to_host(out)``): staged
    only when two pipelines or more can run, since the runtime's own copy into touched memory
    is faster than one pipeline's CPU copy."""
    return _staged(_into_host, rt, dst, src, n, stream, device, least=2)

#!/usr/bin/env python3
"""Fuzz the sub-allocating adaptors against a simple reference model.

    python scripts/fuzz_pool.py --seed 1 --ops 1000000            # every target, 1M ops each
    python scripts/fuzz_pool.py --target pool --seeds 20 --ops 50000

Random sequences of allocate / deallocate (synchronous and stream-ordered, on several fake
streams) / release, plus invalid calls (double free, wrong size, foreign pointer), run over
PoolResource, BinningResource, FixedSizeResource and stacks of adaptors, on top of
:class:`AddressSpaceResource`: a user-written upstream that hands out addresses (no memory)
and checks how it is used.  After every step the model checks that

* live ranges never overlap and every pointer honours its alignment;
* an invalid call raised (ValueError / OutOfMemoryError) and changed nothing;
* the StatisticsResource on top matches the model's current / peak / total counts;
* memory freed on stream S is handed to another stream T (or the host, or the upstream) only
  after T waited for an event recorded on S after the free (fake events check this);

and periodically that the pool's own structures tile its chunks exactly; after release()
with nothing live, every byte is back in the upstream.  Seeded and reproducible; a failure
prints the seed, the target and the step.  The test suite imports this file and runs short
versions (tests/test_pool_fuzz.py).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from bisect import bisect_left, insort
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from hipmr_ctypes import device_accessible, host_accessible, stream_ref  # noqa: E402
from hipmr_ctypes._hip.errors import OutOfMemoryError  # noqa: E402
from hipmr_ctypes.adaptors import (AlignedResource, BinningResource,  # noqa: E402
                                   FixedSizeResource, LimitingResource, PoolResource,
                                   StatisticsResource, TrackingResource)
from hipmr_ctypes.adaptors import _order  # noqa: E402

HOST = None          # the "stream" of synchronous calls
STREAMS = (HOST, 0, 1, 2, 3)


class FuzzFailure(AssertionError):
    """A broken invariant; the message names the seed, target and step."""


# --------------------------------------------------------------------------- fake streams
class StreamModel:
    """Fake events for the adaptors' stream ordering, and vector clocks to check them with.

    Each stream counts the frees made on it.  Each stream (and the host) knows, for every
    stream, up to which free that stream's work is ordered before its own later work:
    ``Event.record(s)`` snapshots what s knows (and s's own count), ``wait_event(t, ev)``
    merges the snapshot into what t knows, ``ev.synchronize()`` into what the host knows
    (which every later operation inherits).  Ordering is transitive, as on a GPU.
    """

    def __init__(self) -> None:
        self.clock: Dict[Any, int] = {s: 0 for s in STREAMS}
        self.know: Dict[Any, Dict[Any, int]] = {s: {} for s in STREAMS}  # HOST included
        self.events_made = 0

    def tick(self, stream: Any) -> int:
        self.clock[stream] += 1
        return self.clock[stream]

    def snapshot(self, stream: Any) -> Dict[Any, int]:
        view = dict(self.know[HOST])
        for src, count in self.know[stream].items():
            view[src] = max(view.get(src, 0), count)
        view[stream] = self.clock[stream]
        return view

    def merge(self, who: Any, view: Dict[Any, int]) -> None:
        mine = self.know[who]
        for src, count in view.items():
            if count > mine.get(src, 0):
                mine[src] = count

    def safe(self, source: Any, count: int, user: Any) -> bool:
        """Is ``user`` (a stream or HOST) ordered after free number ``count`` on ``source``?"""
        if source is HOST or source == user or self.know[HOST].get(source, 0) >= count:
            return True
        return user is not HOST and self.know[user].get(source, 0) >= count

    def install(self) -> Tuple[Any, Any]:
        model = self

        class FakeEvent:
            def __init__(self) -> None:
                self.view: Dict[Any, int] = {}
                self.closed = False
                model.events_made += 1

            def record(self, stream: Any) -> None:
                if stream is HOST or stream not in model.clock:
                    raise AssertionError(f"event recorded on a non-stream {stream!r}")
                self.view = model.snapshot(stream)

            def synchronize(self) -> None:
                model.merge(HOST, self.view)

            def close(self) -> None:
                self.closed = True

        def wait_event(stream: Any, ev: FakeEvent) -> None:
            if stream is HOST or stream not in model.clock:
                raise AssertionError(f"wait_event on a non-stream {stream!r}")
            model.merge(stream, ev.view)

        # event_for asks the runtime for a stream's device: fake streams never reach it
        saved = (_order.event_for, _order.wait_event)
        _order.event_for = lambda stream: FakeEvent()
        _order.wait_event = wait_event
        return saved

    @staticmethod
    def uninstall(saved: Tuple[Any, Any]) -> None:
        _order.event_for, _order.wait_event = saved


def recording_events(setattr_: Any) -> List[Tuple[Any, ...]]:
    """Replace the adaptors' events by fakes that log every call as ``("record", stream)``,
    ``("wait", stream)``, ``("synchronize",)`` or ``("close",)``; ``setattr_(obj, name,
    value)`` does the replacing (pytest's ``monkeypatch.setattr`` undoes it afterwards).
    Returns the log."""
    calls: List[Tuple[Any, ...]] = []

    class RecordingEvent:
        def record(self, stream: Any) -> None:
            calls.append(("record", stream))

        def synchronize(self) -> None:
            calls.append(("synchronize",))

        def close(self) -> None:
            calls.append(("close",))

    setattr_(_order, "event_for", lambda stream: RecordingEvent())
    setattr_(_order, "wait_event", lambda stream, ev: calls.append(("wait", stream)))
    return calls


class FreedRanges:
    """Address ranges not in use, each with the (stream, count) of the free that released it:
    whoever gets them next must be ordered after that free."""

    def __init__(self) -> None:
        self.starts: List[int] = []
        self.info: Dict[int, Tuple[int, Any, int]] = {}   # start -> (end, stream, count)

    def add(self, start: int, end: int, stream: Any, count: int) -> None:
        self.take(start, end)            # a newer free replaces older records
        insort(self.starts, start)
        self.info[start] = (end, stream, count)

    def overlapping(self, start: int, end: int) -> List[Tuple[int, int, Any, int]]:
        starts = self.starts
        i = max(bisect_left(starts, start) - 1, 0)
        found = []
        while i < len(starts) and starts[i] < end:
            s = starts[i]
            e, stream, count = self.info[s]
            if e > start:
                found.append((s, e, stream, count))
            i += 1
        return found

    def take(self, start: int, end: int) -> List[Tuple[int, int, Any, int]]:
        """Remove [start, end) from the records; returns the records it overlapped."""
        found = self.overlapping(start, end)
        for s, e, stream, count in found:
            del self.starts[bisect_left(self.starts, s)]
            del self.info[s]
            if s < start:
                insort(self.starts, s)
                self.info[s] = (start, stream, count)
            if e > end:
                insort(self.starts, end)
                self.info[end] = (e, stream, count)
        return found


# ---------------------------------------------------------------------- test upstreams
class AddressSpaceResource:
    """A user-written async resource handing out addresses (no memory behind them).

    Allocations are aligned as asked (any power of two) and never overlap; the resource checks
    that each deallocation matches an allocation (pointer, size, alignment) and, with a
    :class:`StreamModel`, that nothing is given back before the streams that freed it were
    waited for.  ``capacity`` (bytes outstanding) makes it raise ``OutOfMemoryError``.
    """

    def __init__(self, capacity: Optional[int] = None, base: int = 1 << 32,
                 properties: Tuple[type, ...] = (device_accessible,),
                 streams: Optional[StreamModel] = None,
                 freed: Optional[FreedRanges] = None) -> None:
        self.properties = properties
        self.capacity = capacity
        self.next = base
        self.live: Dict[int, Tuple[int, int]] = {}
        self.outstanding = 0
        self.calls = 0
        self.streams = streams
        self.freed = freed

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        return self._allocate(bytes, alignment, HOST)

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        self._deallocate(ptr, bytes, alignment, HOST)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        self._check_stream(stream)
        return self._allocate(bytes, alignment, stream)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        self._check_stream(stream)
        self._deallocate(ptr, bytes, alignment, stream)

    @staticmethod
    def _check_stream(stream: Any) -> None:
        if not (type(stream) is int and stream >= 0):
            stream_ref(stream)  # TypeError / ValueError for anything that is not a stream

    def _allocate(self, nbytes: int, alignment: int, stream: Any) -> int:
        if type(nbytes) is not int or nbytes < 0 or alignment & (alignment - 1):
            raise ValueError(f"bad arguments ({nbytes!r}, {alignment!r})")
        self.calls += 1
        if not nbytes:
            return 0
        if self.capacity is not None and self.outstanding + nbytes > self.capacity:
            raise OutOfMemoryError(size=nbytes, detail="AddressSpaceResource capacity")
        ptr = -(-self.next // max(alignment, 256)) * max(alignment, 256)
        self.next = ptr + nbytes + 4096      # a gap, so that chunks are never adjacent
        self.live[ptr] = (nbytes, alignment)
        self.outstanding += nbytes
        if self.freed is not None and self.streams is not None and stream is not HOST:
            # stream-ordered memory: usable on `stream` at once, elsewhere after a wait
            self.freed.add(ptr, ptr + nbytes, stream, self.streams.tick(stream))
        return ptr

    def _deallocate(self, ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
        self.calls += 1
        if not ptr and not nbytes:
            return
        if self.live.get(ptr) != (nbytes, alignment):
            raise AssertionError(f"upstream: deallocate({ptr:#x}, {nbytes}, {alignment}) "
                                 f"does not match an allocation ({self.live.get(ptr)})")
        if self.freed is not None and self.streams is not None:
            for s, e, src, count in self.freed.take(ptr, ptr + nbytes):
                if not self.streams.safe(src, count, stream):
                    raise AssertionError(
                        f"upstream: [{s:#x}, {e:#x}) given back on {stream!r} before the "
                        f"free #{count} on stream {src!r} was waited for")
        del self.live[ptr]
        self.outstanding -= nbytes

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    __hash__ = object.__hash__


class HostBufferResource:
    """A user-written synchronous resource over real host memory (ctypes buffers), with the
    properties it is given.  Each allocation is a fresh buffer, so the bytes can be written
    and read back; outstanding buffers are kept alive in ``live``."""

    def __init__(self, properties: Tuple[type, ...] = (host_accessible,)) -> None:
        self.properties = properties
        self.live: Dict[int, Tuple[Any, int]] = {}

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        import ctypes
        if type(bytes) is not int or bytes < 0:
            raise ValueError(f"bytes={bytes!r}")
        if not bytes:
            return 0
        buf = ctypes.create_string_buffer(bytes + alignment)
        ptr = -(-ctypes.addressof(buf) // alignment) * alignment
        self.live[ptr] = (buf, bytes)
        return ptr

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        if not ptr and not bytes:
            return
        buf, size = self.live.pop(ptr)
        if size != bytes:
            self.live[ptr] = (buf, size)
            raise ValueError(f"size {bytes} != {size}")

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    __hash__ = object.__hash__


# ------------------------------------------------------------------------- pool checks
def check_pool_tiles(pool: PoolResource) -> None:
    """The pool's best-fit blocks, free-list blocks and live blocks tile its chunks exactly."""
    arena = pool._arena
    pieces = []
    for start, size in arena.fsize.items():
        pieces.append((start, size, "free"))
    for key, classes in arena.classes.items():
        for size, lst in classes.items():
            pieces.extend((p, size, f"list {key!r}") for p in lst)
    for ptr, nbytes in arena.live.items():
        pieces.append((ptr, -(-nbytes // 256) * 256, "live"))
    pieces.sort()
    chunks = sorted(arena.chunks.items())
    if sum(s for _, s in chunks) != arena.pool_size:
        raise AssertionError("pool_size differs from the sum of the chunks")
    if len(arena.fsorted) != len(arena.fsize) or len(arena.fend) != len(arena.fsize):
        raise AssertionError("best-fit structure maps disagree")
    i = 0
    for start, size in chunks:
        pos = start
        while i < len(pieces) and pieces[i][0] < start + size:
            p, s, what = pieces[i]
            if p != pos:
                raise AssertionError(f"chunk {start:#x}: {what} block at {p:#x}, expected "
                                     f"{pos:#x}")
            pos += s
            i += 1
        if pos != start + size:
            raise AssertionError(f"chunk {start:#x}+{size}: blocks end at {pos:#x}")
    if i != len(pieces):
        raise AssertionError(f"block {pieces[i]} lies outside every chunk")
    for start, size in arena.fsize.items():  # coalesced: no two free neighbours in a chunk
        end = start + size
        if end in arena.fsize and end not in arena.chunks:
            raise AssertionError(f"free blocks at {start:#x} and {end:#x} were not merged")


# --------------------------------------------------------------------------------- fuzz
TARGETS = ("pool", "pool-max", "binning", "fixed", "stack", "aligned")


class Fuzzer:
    """One run: a target built over an AddressSpaceResource, a model, and the operations."""

    def __init__(self, target: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.target = target
        self.seed = seed
        self.streams = StreamModel()
        self.freed = FreedRanges()
        capacity = None
        if target == "pool-max":
            capacity = self.rng.choice([None, 1 << 26])
        self.up = AddressSpaceResource(capacity=capacity, streams=self.streams,
                                       freed=self.freed)
        self.max_size = 1 << 22
        self.max_alignment = 256
        self.pool: Optional[PoolResource] = None
        self.releasers: List[Any] = []
        rng = self.rng
        if target in ("pool", "pool-max"):
            initial = rng.choice([None, 0, 1 << 20, 3 << 19])
            maximum = None if target == "pool" else rng.choice([1 << 24, 1 << 25, 5 << 22])
            if maximum is not None and initial is not None and initial > maximum:
                initial = None
            inner = self.pool = PoolResource(self.up, initial, maximum)
            self.max_alignment = 4096
        elif target == "binning":
            inner = BinningResource(self.up, [512, (2048, PoolResource(self.up))],
                                    min_size_exponent=12, max_size_exponent=14)
            self.max_size = 1 << 18
        elif target == "fixed":
            inner = FixedSizeResource(self.up, block_size=rng.choice([256, 1000, 8192]),
                                      blocks_to_preallocate=rng.choice([1, 4, 16]))
            self.max_size = inner.block_size
        elif target == "stack":
            self.pool = PoolResource(self.up, maximum_pool_size=1 << 26)
            inner = TrackingResource(LimitingResource(self.pool, 1 << 25))
        elif target == "aligned":
            self.pool = PoolResource(self.up)
            inner = AlignedResource(self.pool, alignment=4096, threshold=1 << 16)
            self.max_alignment = 1 << 16
        else:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
        self.inner = inner
        self.r = StatisticsResource(inner)
        self.releasers = [x for x in (inner, self.pool) if hasattr(x, "release")]
        # model
        # ptr -> (size, alignment, stream, what the allocating stream knew then)
        self.live: Dict[int, Tuple[int, int, Any, Dict[Any, int]]] = {}
        self.starts: List[int] = []
        self.cur = self.peak = self.total = 0
        self.ncur = self.npeak = self.ntotal = 0
        self.step = 0
        self.target_live = self.rng.choice([8, 64, 512])   # the live set hovers around this

    # ------------------------------------------------------------------ model helpers
    def fail(self, message: str) -> None:
        raise FuzzFailure(f"seed={self.seed} target={self.target} step={self.step}: {message}")

    def size(self) -> int:
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:
            n = rng.randint(1, 4096)
        elif roll < 0.85:
            n = rng.randint(1, 1 << 18)
        elif roll < 0.97:
            n = rng.choice([256, 1024, 4096, 65536, 1 << 20])
        else:
            n = rng.randint(1, self.max_size) if rng.random() < 0.5 else 0
        return min(n, self.max_size)

    def alignment(self) -> int:
        rng = self.rng
        if rng.random() < 0.8:
            return 256
        return 1 << rng.randint(0, self.max_alignment.bit_length() - 1)

    def add_live(self, ptr: int, size: int, alignment: int, stream: Any) -> None:
        if size == 0:
            if ptr != 0:
                self.fail(f"allocate(0) returned {ptr:#x}")
            return
        if ptr <= 0 or ptr % alignment:
            self.fail(f"pointer {ptr:#x} is not aligned to {alignment}")
        starts = self.starts
        i = bisect_left(starts, ptr)
        if i < len(starts) and starts[i] < ptr + size:
            self.fail(f"[{ptr:#x}, +{size}) overlaps the live block at {starts[i]:#x}")
        if i and starts[i - 1] + self.live[starts[i - 1]][0] > ptr:
            self.fail(f"[{ptr:#x}, +{size}) overlaps the live block at {starts[i - 1]:#x}")
        for s, e, src, count in self.freed.take(ptr, ptr + size):
            if not self.streams.safe(src, count, stream):
                self.fail(f"[{max(s, ptr):#x}, {min(e, ptr + size):#x}) was freed on stream "
                          f"{src!r} (free #{count}) and handed to {stream!r} without a wait")
        insort(starts, ptr)
        view = (self.streams.snapshot(stream) if stream is not HOST
                else dict(self.streams.know[HOST]))
        self.live[ptr] = (size, alignment, stream, view)

    def count_alloc(self, size: int) -> None:
        self.cur += size
        self.ncur += 1
        self.total += size
        self.ntotal += 1
        self.peak = max(self.peak, self.cur)
        self.npeak = max(self.npeak, self.ncur)

    def check_stats(self) -> None:
        st = self.r.statistics
        want = (self.cur, self.ncur, self.peak, self.npeak, self.total, self.ntotal)
        got = (st.current_bytes, st.current_count, st.peak_bytes, st.peak_count,
               st.total_bytes, st.total_count)
        if got != want:
            self.fail(f"statistics {got} != model {want}")

    # ------------------------------------------------------------------------ actions
    def do_allocate(self) -> None:
        size, alignment = self.size(), self.alignment()
        stream = self.rng.choice(STREAMS)
        try:
            if stream is HOST:
                ptr = self.r.allocate(size, alignment)
            else:
                ptr = self.r.allocate_async(size, alignment, stream)
        except OutOfMemoryError:
            if self.target not in ("pool-max", "stack"):
                self.fail(f"unexpected OutOfMemoryError for {size} bytes")
            return
        self.count_alloc(size)
        self.add_live(ptr, size, alignment, stream)

    def do_deallocate(self) -> None:
        if not self.live:
            return
        ptr = self.starts[self.rng.randrange(len(self.starts))]
        size, alignment, _, _ = self.live[ptr]
        stream = self.rng.choice(STREAMS)
        if stream is HOST:
            self.r.deallocate(ptr, size, alignment)
        else:
            self.r.deallocate_async(ptr, size, alignment, stream)
        self.forget(ptr, stream)

    def forget(self, ptr: int, stream: Any) -> None:
        """The model's side of freeing ``ptr`` on ``stream``.  The caller's own obligation is
        modelled too: a free on stream S is ordered after the allocation (on whatever stream)
        it frees, so S learns what the allocating stream knew then."""
        size, _, _, view = self.live.pop(ptr)
        del self.starts[bisect_left(self.starts, ptr)]
        self.streams.merge(stream, view)
        self.freed.add(ptr, ptr + size, stream,
                       0 if stream is HOST else self.streams.tick(stream))
        self.cur -= size
        self.ncur -= 1

    def do_invalid(self) -> None:
        """A call that must raise and change nothing."""
        rng = self.rng
        before = self.r.statistics
        upstream_before = self.up.outstanding
        kind = rng.randrange(4)
        try:
            if kind == 0 or not self.live:         # a pointer nobody allocated
                self.r.deallocate(rng.randrange(1, 1 << 20) * 256 + (1 << 52), 256)
            elif kind == 1:                        # wrong size
                ptr = self.starts[rng.randrange(len(self.starts))]
                size, alignment, _, _ = self.live[ptr]
                self.r.deallocate(ptr, size + 1000, alignment)
            elif kind == 2:                        # bad arguments
                rng.choice([lambda: self.r.allocate(-1), lambda: self.r.allocate(1.5),
                            lambda: self.r.allocate(True), lambda: self.r.allocate(8, 3),
                            lambda: self.r.allocate(8, 0)])()
            else:                                  # double free of a freed pointer
                ptr = self.starts[rng.randrange(len(self.starts))]
                size, alignment, _, _ = self.live[ptr]
                self.r.deallocate(ptr, size, alignment)
                self.forget(ptr, HOST)
                before = self.r.statistics
                upstream_before = self.up.outstanding
                self.r.deallocate(ptr, size, alignment)
        except (ValueError, TypeError):
            pass
        else:
            self.fail(f"invalid call of kind {kind} did not raise")
        if self.r.statistics != before or self.up.outstanding != upstream_before:
            self.fail(f"invalid call of kind {kind} changed the state")

    def do_release(self) -> None:
        for res in self.releasers:
            res.release()
        if self.pool is not None and self.up.outstanding != self.pool.pool_size() \
                and self.target != "binning":
            self.fail(f"after release the upstream holds {self.up.outstanding} bytes, the "
                      f"pool reports {self.pool.pool_size()}")

    def check_structures(self) -> None:
        if self.pool is not None:
            try:
                check_pool_tiles(self.pool)
            except AssertionError as exc:
                self.fail(str(exc))

    def finish(self) -> None:
        """Free everything, release, and check that every byte is back upstream."""
        for ptr in list(self.starts):
            self.do_deallocate_ptr(ptr)
        self.check_stats()
        self.do_release()
        if self.up.outstanding:
            self.fail(f"{self.up.outstanding} bytes still held from the upstream after "
                      "release()")

    def do_deallocate_ptr(self, ptr: int) -> None:
        size, alignment, _, _ = self.live[ptr]
        self.r.deallocate(ptr, size, alignment)
        self.forget(ptr, HOST)

    def run(self, ops: int, check_every: int = 500) -> None:
        saved = self.streams.install()
        try:
            rng = self.rng
            for self.step in range(ops):
                roll = rng.random()
                if roll < 0.5 + (0.1 if len(self.live) < self.target_live else -0.1):
                    self.do_allocate()
                elif roll < 0.985:
                    self.do_deallocate()
                elif roll < 0.995:
                    self.do_invalid()
                else:
                    self.do_release()
                self.check_stats()
                if self.step % check_every == 0:
                    self.check_structures()
            self.step = ops
            self.check_structures()
            self.finish()
        finally:
            StreamModel.uninstall(saved)


def run(seed: int, ops: int, target: str = "pool", check_every: int = 500) -> None:
    """One reproducible run; raises FuzzFailure (naming the seed) on a broken invariant."""
    fuzzer = Fuzzer(target, seed)
    try:
        fuzzer.run(ops, check_every)
    except FuzzFailure:
        raise
    except Exception as exc:
        raise FuzzFailure(f"seed={seed} target={target} step={fuzzer.step}: "
                          f"{type(exc).__name__}: {exc}") from exc


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None,
                        help="first seed (default: random, printed)")
    parser.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds")
    parser.add_argument("--ops", type=int, default=100_000, help="operations per run")
    parser.add_argument("--target", choices=TARGETS + ("all",), default="all")
    parser.add_argument("--check-every", type=int, default=500,
                        help="steps between full structure checks")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    targets = TARGETS if args.target == "all" else (args.target,)
    failures = 0
    for s in range(seed, seed + args.seeds):
        for target in targets:
            started = time.perf_counter()
            try:
                run(s, args.ops, target, args.check_every)
            except FuzzFailure as exc:
                failures += 1
                print(f"FAIL {exc}", flush=True)
                continue
            print(f"ok   seed={s} target={target} ops={args.ops} "
                  f"({time.perf_counter() - started:.1f}s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

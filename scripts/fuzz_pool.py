#!/usr/bin/env python3
"""Fuzz the sub-allocating adaptors against a simple reference model.

    python scripts/fuzz_pool.py --seed 1 --ops 1000000            # every target, 1M ops each
    python scripts/fuzz_pool.py --target pool --seeds 20 --ops 50000
    python scripts/fuzz_pool.py --ops 1000000 --deadline "$(($(date +%s) + 60))"  # stop by then

Random sequences of allocate / deallocate (synchronous and stream-ordered, on several fake
streams) / release, plus invalid calls (double free, wrong size, foreign pointer), run over
PoolResource, BinningResource, FixedSizeResource and stacks of adaptors, on top of
:class:`AddressSpaceResource`: a user-written upstream that hands out addresses (no memory)
and checks how it is used (``scripts/pool_model.py``, the model the tests share).  After
every step the model checks that

* live ranges never overlap and every pointer honours its alignment;
* an invalid call raised (ValueError / OutOfMemoryError) and changed nothing;
* the StatisticsResource on top matches the model's current / peak / total counts;
* memory freed on stream S is handed to another stream T (or the host, or the upstream) only
  after T waited for an event recorded on S after the free (fake events check this);

and periodically that the pool's own structures tile its chunks exactly; after release()
with nothing live, every byte is back in the upstream.  Seeded and reproducible; a failure
prints the seed, the target and the step.  The test suite imports this file and runs short
versions (tests/adaptors/test_pool_fuzz.py).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from bisect import bisect_left, insort
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from hipmr_ctypes import (AlignedResource, BinningResource, FixedSizeResource,  # noqa: E402
                          LimitingResource, OutOfMemoryError, PoolResource, StatisticsResource,
                          TrackingResource)
from pool_model import (HOST, STREAMS, AddressSpaceResource, Corruption,  # noqa: E402
                        FreedRanges, StreamModel, check_pool_tiles)


class FuzzFailure(Corruption):
    """A broken invariant; the message names the seed, target and step."""


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

    def run(self, ops: int, check_every: int = 500, deadline: Optional[float] = None) -> int:
        """Run ``ops`` operations, or fewer if ``deadline`` (seconds since the epoch) passes
        first; then check everything and free it all.  Returns the operations run."""
        saved = self.streams.install()
        try:
            rng = self.rng
            for self.step in range(ops):
                if deadline is not None and not self.step % 64 and time.time() > deadline:
                    ops = self.step
                    break
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
        return ops


def run(seed: int, ops: int, target: str = "pool", check_every: int = 500,
        deadline: Optional[float] = None) -> int:
    """One reproducible run; raises FuzzFailure (naming the seed) on a broken invariant.
    Returns the operations run (fewer than ``ops`` when ``deadline`` passed first)."""
    fuzzer = Fuzzer(target, seed)
    try:
        return fuzzer.run(ops, check_every, deadline)
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
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds since the epoch: every run stops there (checked and "
                             "freed as at its end) and the runs not started are skipped")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="append one JSON line per run to FILE: seed, target, ops asked "
                             "and run, the failure's message (or null), skipped")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    targets = TARGETS if args.target == "all" else (args.target,)
    failures = 0

    def record(s: int, target: str, done: int, failure: Optional[str] = None,
               skipped: bool = False) -> None:
        if args.record:
            with open(args.record, "a") as fh:
                fh.write(json.dumps({"seed": s, "target": target, "asked": args.ops,
                                     "ops": done, "failure": failure,
                                     "skipped": skipped}) + "\n")

    for s in range(seed, seed + args.seeds):
        for target in targets:
            if args.deadline is not None and time.time() > args.deadline:
                print(f"skip seed={s} target={target}: the deadline passed", flush=True)
                record(s, target, 0, skipped=True)
                continue
            started = time.perf_counter()
            try:
                done = run(s, args.ops, target, args.check_every, args.deadline)
            except FuzzFailure as exc:
                failures += 1
                print(f"FAIL {exc}", flush=True)
                record(s, target, 0, failure=str(exc))
                continue
            record(s, target, done)
            note = "" if done == args.ops else f"; stopped at the deadline, of {args.ops}"
            print(f"ok   seed={s} target={target} ops={done} "
                  f"({time.perf_counter() - started:.1f}s{note})", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

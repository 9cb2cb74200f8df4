"""Threads: many threads on one resource, stream and event churn, the per-device table, and
native calls that block.

Every test joins its threads with a timeout and fails if one is still alive (a deadlock).
The hammer tests run a fixed number of operations per thread over the emulated device, with
``hipmr_ctypes.Stream`` objects and the null stream, check that no two live allocations ever
overlap (a locked interval map checked at every allocation, and each block's bytes checked
before it is freed) and that every count balances exactly at the end: the statistics are
back to zero, and after ``release()`` the emulator's live allocations are back to where they
started.
"""
from __future__ import annotations

import ctypes
import gc
import random
import sys
import threading
import time

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.exceptions import OutOfMemoryError

from support import Corruption, Hang, Leak, LiveRanges, past_deadline, process_runtime

THREADS = 16
OPS = 600                 # per thread and test
JOIN = 60.0               # seconds: a thread still alive after this is deadlocked
MiB = 1 << 20

#: operations the thread tests ran and were to run, and the hammering threads stopped by the
#: deadline of scripts/reliability_report.py --budget (which reads them)
THREAD_OPS = [0]
THREAD_OPS_PLANNED = [0]
THREADS_CUT = [0]
#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability(counters={"thread_ops": THREAD_OPS,
                                               "thread_ops_planned": THREAD_OPS_PLANNED,
                                               "threads_cut": THREADS_CUT})
_COUNTS_LOCK = threading.Lock()


def _count(ran, planned=None, cut=0):
    """Add to the counters above (from any thread)."""
    with _COUNTS_LOCK:
        THREAD_OPS[0] += ran
        THREAD_OPS_PLANNED[0] += ran if planned is None else planned
        THREADS_CUT[0] += cut


def run_threads(target, n=THREADS, args=()):
    """Run ``target(i, *args)`` in ``n`` threads; return the errors they raised."""
    errors, raised = [], []

    def body(i):
        try:
            target(i, *args)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")
            raised.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch often: more interleavings
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + JOIN
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(interval)
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise Hang(f"deadlock: {len(alive)} threads still running after {JOIN} s")
    kinds = [exc for exc in raised if getattr(exc, "reliability_kind", None)]
    if kinds:  # a broken invariant of its kind (an overwritten block), not just any error
        raise type(kinds[0])("; ".join(errors[:3]))
    return errors


@pytest.fixture
def emu(emulator):
    gc.collect()
    before = emulator.live_allocations()
    yield emulator
    gc.collect()
    if emulator.live_allocations() != before:
        raise Leak("leaked device memory")


@pytest.fixture
def streams():
    made = [hmr.Stream() for _ in range(4)]
    yield made
    for s in made:
        s.close()


def hammer(i, resource, streams, ranges, outcome, expect_oom):
    """OPS random allocations / frees, sync and on streams, each block filled and checked."""
    rng = random.Random(1000 + i)
    mine = []
    choices = streams + [0, None]  # Stream objects, the null stream, host-synchronous
    done = failed = allocated = 0
    cut = False
    for _ in range(OPS):
        if past_deadline():  # the reliability report's budget is spent: stop here
            cut = True
            break
        done += 1
        if mine and (len(mine) > 20 or rng.random() < 0.45):
            ptr, size, fill = mine.pop(rng.randrange(len(mine)))
            if ctypes.string_at(ptr, size) != fill * size:
                raise Corruption(f"block {ptr:#x} was overwritten while live")
            ranges.remove(ptr)
            on = rng.choice(choices)
            if on is None:
                resource.deallocate(ptr, size)
            else:
                resource.deallocate_async(ptr, size, 256, on)
            continue
        size = rng.choice([rng.randint(1, 300), rng.randint(1, 5000), 4096,
                           rng.randint(1, 1 << 20), 256 * 1024])
        on = rng.choice(choices)
        try:
            ptr = resource.allocate(size) if on is None else resource.allocate_async(size, 256,
                                                                                     on)
        except OutOfMemoryError:
            if not expect_oom:
                raise
            failed += 1
            continue
        allocated += 1
        ranges.add(ptr, size)
        fill = bytes([rng.randrange(1, 256)])
        ctypes.memset(ptr, fill[0], size)
        mine.append((ptr, size, fill))
    for ptr, size, fill in mine:
        assert ctypes.string_at(ptr, size) == fill * size
        ranges.remove(ptr)
        resource.deallocate(ptr, size)
    with ranges.lock:
        outcome.append((done, allocated, failed, cut))


def _hammer_all(resource, streams, expect_oom=False):
    ranges, outcome = LiveRanges(), []
    errors = run_threads(hammer, args=(resource, streams, ranges, outcome, expect_oom))
    assert errors == [], errors[:3]
    if ranges.errors:
        raise Corruption(f"overlapping live blocks: {ranges.errors[:3]}")
    assert ranges.starts == [] and len(outcome) == THREADS
    _count(sum(o[0] for o in outcome), THREADS * OPS, sum(o[3] for o in outcome))
    return sum(o[1] for o in outcome), sum(o[2] for o in outcome)


def test_sixteen_threads_on_one_pool(emu, streams):
    up = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(up, initial_pool_size=4 * MiB)
    _hammer_all(pool, streams)
    assert pool.allocation_count() == 0 and pool.get_allocated_bytes() == 0
    assert pool.free_bytes() == pool.pool_size()
    pool.release()
    assert pool.pool_size() == 0
    assert up.pool.used == 0


def test_sixteen_threads_on_statistics_limiting_pool(emu, streams):
    up = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(up, maximum_pool_size=48 * MiB)
    limiting = hmr.LimitingResource(pool, 32 * MiB)
    stats = hmr.StatisticsResource(limiting)
    allocated, _ = _hammer_all(stats, streams, expect_oom=True)
    st = stats.statistics
    assert st.current_bytes == 0 and st.current_count == 0
    assert st.total_count == allocated
    assert st.peak_bytes <= 32 * MiB and (st.peak_bytes > 0 or not allocated)
    assert limiting.get_allocated_bytes() == 0
    assert pool.allocation_count() == 0
    pool.release()
    assert pool.pool_size() == 0 and up.pool.used == 0


def test_sixteen_threads_on_tracking_binning_over_async(emu, streams):
    up = hmr.AsyncMemoryResource()
    tracking = hmr.TrackingResource(hmr.BinningResource(up, [512, 4096, 65536]))
    _hammer_all(tracking, streams)
    assert tracking.outstanding() == {}
    tracking.upstream.release()
    assert up.pool.used == 0


def test_sixteen_threads_on_the_async_resource(emu, streams):
    up = hmr.AsyncMemoryResource()
    _hammer_all(up, streams)
    assert up.pool.used == 0


# ---- object churn from many threads --------------------------------------------------------------
def test_streams_and_events_created_and_closed_from_many_threads(emu):
    def churn(i):
        rng = random.Random(i)
        for _ in range(60):
            s = hmr.Stream(flags=rng.choice([0, 1]), priority=rng.choice([0, -1]))
            e = hmr.Event(flags=rng.choice([0, 2]))
            e.record(s)
            s.wait_event(e)
            assert e.query() in (True, False)
            s.synchronize()
            if rng.random() < 0.5:
                e.close()
                s.close()
                assert e.closed and s.closed
            # else: dropped; the finalizers destroy them, on whichever thread collects
        _count(60)

    before = _handles()
    assert run_threads(churn) == []
    gc.collect()
    assert _handles() == before, "streams or events were not destroyed"


def test_buffers_created_and_closed_from_many_threads(emu, streams):
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())

    def churn(i):
        rng = random.Random(i)
        for k in range(80):
            data = bytes([(i + k) & 0xFF]) * rng.randint(1, 20000)
            resource = rng.choice([None, pool])
            stream = rng.choice([None, rng.choice(streams)])
            b = hmr.Buffer.from_host(data, resource=resource, stream=stream)
            if stream is not None:
                stream.synchronize()
            assert b.tobytes() == data
            if rng.random() < 0.6:
                b.close(stream=rng.choice([None, 0]))
            # else: garbage-collected on some thread
        _count(80)

    assert run_threads(churn) == []
    gc.collect()
    assert pool.allocation_count() == 0
    pool.release()


def test_per_device_resource_from_many_threads(emu):
    made = [hmr.AsyncMemoryResource() for _ in range(4)]
    with process_runtime():
        # allocate / free through whatever resource is current, with the right size
        def churn_sized(i):
            rng = random.Random(i)
            for _ in range(100):
                if rng.random() < 0.3:
                    previous = hmr.set_current_device_resource(rng.choice(made))
                    assert hmr.is_async_resource(previous)
                r = hmr.get_current_device_resource()
                n = rng.randint(1, 10000)
                p = r.allocate(n)
                r.deallocate(p, n)
            _count(100)

        # the very first get from 16 threads at once: one default resource, shared
        results = []
        assert run_threads(lambda i: results.append(hmr.get_current_device_resource())) == []
        assert len({id(r) for r in results}) == 1
        assert isinstance(results[0], hmr.DeviceMemoryResource)
        assert run_threads(churn_sized) == []
        assert hmr.get_current_device_resource() in made


def _handles():
    gc.collect()
    emu = _hip.get_runtime().emulator
    with emu._lock:  # test-only look at the emulator's tables
        return len(emu._streams), len(emu._events), len(emu._pools)


# ---- a native call that blocks must not stop the other threads -----------------------------------
class Blocker:
    """Replaces one runtime function with a version that blocks (until released) when called
    from a thread that armed it, as a real synchronize does while the GPU works."""

    def __init__(self, monkeypatch, name):
        rt = _hip.get_runtime()
        self.real = getattr(rt.fn, name)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.local = threading.local()
        monkeypatch.setattr(rt.fn, name, self._call)

    def arm(self):
        self.local.armed = True

    def _call(self, *args):
        if getattr(self.local, "armed", False):
            self.local.armed = False
            self.entered.set()
            self.release.wait(JOIN)
        return self.real(*args)


def _while_blocked(blocker, blocked_work, other_work):
    """Run ``blocked_work`` in a thread until it blocks in the runtime, then ``other_work``
    in another thread; return whether ``other_work`` finished while the first was blocked."""
    errors = []

    def first():
        try:
            blocker.arm()
            blocked_work()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    finished = threading.Event()

    def second():
        try:
            other_work()
            finished.set()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t1 = threading.Thread(target=first, daemon=True)
    t1.start()
    assert blocker.entered.wait(JOIN), "the first thread never reached the runtime call"
    t2 = threading.Thread(target=second, daemon=True)
    t2.start()
    ok = finished.wait(5.0)
    blocker.release.set()
    t1.join(JOIN)
    t2.join(JOIN)
    if t1.is_alive() or t2.is_alive():
        raise Hang("deadlock")
    assert errors == [], errors
    return ok


def _other_thread_allocates(resource, stream=None):
    def work():
        for n in (100, 5000, 100, 1 << 20):
            p = (resource.allocate(n) if stream is None
                 else resource.allocate_async(n, 256, stream))
            ctypes.memset(p, 7, n)
            if stream is None:
                resource.deallocate(p, n)
            else:
                resource.deallocate_async(p, n, 256, stream)
    return work


@pytest.mark.parametrize("resource_kind", ["async", "pool"])
def test_a_blocked_synchronize_does_not_block_allocation(emu, monkeypatch, resource_kind):
    """One thread waits in hipStreamSynchronize (the GPU is busy); another allocates from the
    same resource meanwhile."""
    up = hmr.AsyncMemoryResource()
    resource = up if resource_kind == "async" else hmr.PoolResource(up, initial_pool_size=4 * MiB)
    with hmr.Stream() as s, hmr.Stream() as other:
        p = resource.allocate_async(1000, 256, s)
        blocker = Blocker(monkeypatch, "hipStreamSynchronize")
        assert _while_blocked(blocker, s.synchronize, _other_thread_allocates(resource, other))
        resource.deallocate_async(p, 1000, 256, s)
        if resource_kind == "pool":
            resource.release()


def test_a_blocked_event_wait_does_not_block_allocation(emu, monkeypatch):
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=4 * MiB)
    with hmr.Stream() as s, hmr.Event() as e:
        e.record(s)
        blocker = Blocker(monkeypatch, "hipEventSynchronize")
        assert _while_blocked(blocker, e.synchronize, _other_thread_allocates(pool))
    pool.release()


def test_a_blocked_buffer_copy_does_not_block_other_buffers(emu, monkeypatch):
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=4 * MiB)
    src = hmr.Buffer.from_host(b"x" * 4096, resource=pool)
    blocker = Blocker(monkeypatch, "hipMemcpy")

    def others():
        with hmr.Buffer(8192, resource=pool) as b:
            b.memset(3)
            assert b.tobytes() == b"\x03" * 8192

    assert _while_blocked(blocker, src.tobytes, others)
    src.close()
    pool.release()


def test_a_blocked_upstream_does_not_block_the_pool_cache(emu, monkeypatch):
    """One thread grows the pool and its upstream blocks (AsyncMemoryResource.allocate waits
    for the null stream); another thread asks for a size the pool has cached.  The pool must
    not hold its lock across the upstream call."""
    up = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(up, initial_pool_size=2 * MiB)
    cached = pool.allocate(4096)
    pool.deallocate(cached, 4096)
    blocker = Blocker(monkeypatch, "hipStreamSynchronize")
    grow = lambda: pool.deallocate(pool.allocate(64 * MiB), 64 * MiB)  # noqa: E731
    finished = _while_blocked(blocker, grow, lambda: pool.deallocate(pool.allocate(4096), 4096))
    pool.release()
    assert finished, ("PoolResource holds its lock while its upstream blocks: a thread "
                      "allocating a cached block waited for another thread's growth")


def test_a_blocked_host_wait_does_not_block_the_pool(emu, monkeypatch):
    """A synchronous allocation takes a block last freed on a stream: the pool waits on the
    host for that stream's event.  Meanwhile another thread allocates from the pool."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=2 * MiB)
    with hmr.Stream() as s:
        p = pool.allocate_async(MiB, 256, s)
        pool.deallocate_async(p, MiB, 256, s)
        small = pool.allocate_async(4096, 256, 0)
        pool.deallocate_async(small, 4096, 256, 0)
        blocker = Blocker(monkeypatch, "hipEventSynchronize")
        take = lambda: pool.deallocate(pool.allocate(MiB), MiB)  # noqa: E731
        finished = _while_blocked(blocker, take,
                                  lambda: pool.deallocate_async(
                                      pool.allocate_async(4096, 256, 0), 4096, 256, 0))
        pool.release()
    assert finished, ("PoolResource holds its lock while it waits on the host for a stream's "
                      "event: other threads' allocations wait too")


def test_a_blocked_upstream_does_not_block_the_fixed_size_resource(emu, monkeypatch):
    """FixedSizeResource: one thread's allocation needs a new chunk and the upstream blocks;
    another thread frees and allocates a block meanwhile."""
    fixed = hmr.FixedSizeResource(hmr.AsyncMemoryResource(), 4096, 4)
    keep = fixed.allocate(4096)
    held = [fixed.allocate(4096) for _ in range(3)]          # every block of the chunk in use
    blocker = Blocker(monkeypatch, "hipStreamSynchronize")
    grown = []
    finished = _while_blocked(blocker, lambda: grown.append(fixed.allocate(4096)),
                              lambda: (fixed.deallocate(keep, 4096),
                                       fixed.deallocate(fixed.allocate(4096), 4096)))
    for p in held + grown:
        fixed.deallocate(p, 4096)
    fixed.release()
    assert finished, ("FixedSizeResource holds its lock while its upstream blocks: a thread "
                      "with a free block waited for another thread's growth")


def test_a_blocked_host_wait_does_not_block_the_fixed_size_resource(emu, monkeypatch):
    """FixedSizeResource: a synchronous allocation takes blocks freed on a stream and waits on
    the host for that stream's event; another thread reuses its own stream's block meanwhile."""
    fixed = hmr.FixedSizeResource(hmr.AsyncMemoryResource(), 4096, 4)
    with hmr.Stream() as s:
        mine = fixed.allocate_async(4096, 256, 0)
        a, b = fixed.allocate_async(4096, 256, s), fixed.allocate_async(4096, 256, s)
        last = fixed.allocate(4096)
        fixed.deallocate_async(a, 4096, 256, s)
        fixed.deallocate_async(b, 4096, 256, s)               # the only free blocks: on s
        blocker = Blocker(monkeypatch, "hipEventSynchronize")
        took = []

        def reuse():
            fixed.deallocate_async(mine, 4096, 256, 0)
            fixed.deallocate_async(fixed.allocate_async(4096, 256, 0), 4096, 256, 0)

        finished = _while_blocked(blocker, lambda: took.append(fixed.allocate(4096)), reuse)
        for p in took + [last]:
            fixed.deallocate(p, 4096)
        fixed.release()
    assert finished, ("FixedSizeResource holds its lock while it waits on the host for a "
                      "stream's event: other threads' allocations wait too")


def test_a_blocked_release_does_not_block_cached_allocations(emu, monkeypatch):
    """One thread releases the pool's free chunks and the upstream's free blocks (waits for
    the null stream); another thread allocates a size the pool has cached meanwhile."""
    up = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(up, initial_pool_size=MiB)
    cached = pool.allocate(4096)
    pool.deallocate(cached, 4096)                     # cached: served without the lock
    big = pool.allocate(8 * MiB)
    pool.deallocate(big, 8 * MiB)                     # a whole free chunk to give back
    blocker = Blocker(monkeypatch, "hipStreamSynchronize")
    finished = _while_blocked(blocker, pool.release,
                              lambda: pool.deallocate(pool.allocate(4096), 4096))
    pool.release()
    assert finished, "a release() waiting for the runtime blocked a cached allocation"


def test_a_blocked_release_does_not_block_the_fixed_size_resource(emu, monkeypatch):
    fixed = hmr.FixedSizeResource(hmr.AsyncMemoryResource(), 4096, 4)
    keep = fixed.allocate(4096)
    blocks = [fixed.allocate(4096) for _ in range(7)]  # two chunks
    for p in blocks[3:]:
        fixed.deallocate(p, 4096)                      # the second chunk is free again
    blocker = Blocker(monkeypatch, "hipStreamSynchronize")
    finished = _while_blocked(blocker, fixed.release,
                              lambda: (fixed.deallocate(keep, 4096),
                                       fixed.deallocate(fixed.allocate(4096), 4096)))
    for p in blocks[:3]:
        fixed.deallocate(p, 4096)
    fixed.release()
    assert fixed.pool_size() == 0
    assert finished, "a release() waiting for the runtime blocked another thread"

"""16 threads hammering one PoolResource, and a statistics + limiting + pool stack, with mixed
sizes and streams for a fixed number of operations: no deadlock (join with a timeout), no two
live allocations ever overlap (checked in a shared interval map and by writing each block's
bytes), and every count balances exactly at the end.  Under ``scripts/reliability_report.py
--budget`` the threads stop at its deadline (``support.past_deadline``) and count what ran."""
import ctypes
import random
import sys
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import OutOfMemoryError
from hipmr_ctypes.adaptors import LimitingResource, PoolResource, StatisticsResource
from hipmr_ctypes.resources import HostMemoryResource

from support import (AddressSpaceResource, Corruption, Hang, LiveRanges, check_pool_tiles,
                     past_deadline)

THREADS = 16
OPS = 1500
JOIN_TIMEOUT = 120.0

#: operations the threads ran and were to run, and the threads stopped by the deadline
#: (read by scripts/reliability_report.py)
THREAD_OPS = [0]
THREAD_OPS_PLANNED = [0]
THREADS_CUT = [0]
#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability(counters={"thread_ops": THREAD_OPS,
                                               "thread_ops_planned": THREAD_OPS_PLANNED,
                                               "threads_cut": THREADS_CUT})


def hammer(resource, streams, ranges, writable, seed, counts, errors, expect_oom, start):
    rng = random.Random(seed)
    mine = []
    allocated = failed = done = 0
    cut = False
    try:
        start.wait(JOIN_TIMEOUT)   # every thread starts at once: the most contention
        for _ in range(OPS):
            if past_deadline():
                cut = True
                break
            done += 1
            if mine and (len(mine) > 24 or rng.random() < 0.45):
                ptr, size, stream, fill = mine.pop(rng.randrange(len(mine)))
                if writable and ctypes.string_at(ptr, size) != fill * size:
                    errors.append(f"block {ptr:#x} was overwritten while live")
                ranges.remove(ptr)
                free_on = rng.choice(streams + [None])
                if free_on is None:
                    resource.deallocate(ptr, size)
                else:
                    resource.deallocate_async(ptr, size, 256, free_on)
                continue
            size = rng.choice([rng.randint(1, 512), rng.randint(1, 70000), 65536,
                               rng.randint(1, 1 << 21)])
            stream = rng.choice(streams + [None])
            try:
                ptr = (resource.allocate(size) if stream is None
                       else resource.allocate_async(size, 256, stream))
            except OutOfMemoryError:
                if not expect_oom:
                    raise
                failed += 1
                continue
            allocated += 1
            ranges.add(ptr, size)
            fill = bytes([rng.randrange(1, 256)])
            if writable:
                ctypes.memset(ptr, fill[0], size)
            mine.append((ptr, size, stream, fill))
        for ptr, size, stream, _ in mine:
            ranges.remove(ptr)
            resource.deallocate(ptr, size)
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        errors.append(f"{type(exc).__name__}: {exc}")
    counts.append((allocated, failed, done, cut))


def run_threads(resource, streams, writable, expect_oom=False):
    ranges = LiveRanges()
    counts, errors = [], []
    start = threading.Barrier(THREADS)
    threads = [threading.Thread(target=hammer, daemon=True,
                                args=(resource, streams, ranges, writable, seed, counts, errors,
                                      expect_oom, start))
               for seed in range(THREADS)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per run
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT)
    finally:
        sys.setswitchinterval(interval)
    if any(t.is_alive() for t in threads):
        raise Hang("deadlock: threads still running")
    if ranges.errors:
        raise Corruption(f"overlapping live blocks: {ranges.errors[:3]}")
    assert errors == []
    assert len(counts) == THREADS and ranges.starts == []
    THREAD_OPS[0] += sum(c[2] for c in counts)
    THREAD_OPS_PLANNED[0] += THREADS * OPS
    cut = sum(c[3] for c in counts)
    THREADS_CUT[0] += cut
    return sum(c[0] for c in counts), sum(c[1] for c in counts), sum(c[2] for c in counts), cut


@pytest.fixture
def streams():
    made = [hmr.Stream() for _ in range(3)]
    yield [0, 2] + [s.handle for s in made]   # 2: each thread's own per-thread stream
    for s in made:
        s.close()


def test_sixteen_threads_on_one_pool_over_host_memory(streams):
    pool = PoolResource(HostMemoryResource())
    allocated, _, done, _ = run_threads(pool, streams, writable=True)
    assert allocated >= done // 3  # a third of the operations at least are allocations
    assert pool.allocation_count() == 0
    check_pool_tiles(pool)
    pool.release()
    assert pool.pool_size() == 0


def test_sixteen_threads_on_statistics_limiting_pool(streams):
    up = AddressSpaceResource()
    pool = PoolResource(up, maximum_pool_size=1 << 27)
    # 8 MiB: far below what 16 threads holding up to 24 blocks of up to 2 MiB each ask for,
    # so the limit refuses some allocations in every run
    limiting = LimitingResource(pool, 1 << 23)
    stats = StatisticsResource(limiting)
    allocated, failed, done, cut = run_threads(stats, streams, writable=False, expect_oom=True)
    st = stats.statistics
    assert st.total_count == allocated and st.current_count == 0 and st.current_bytes == 0
    assert st.peak_bytes <= 1 << 23 and (st.peak_bytes > 0 or not done)
    assert limiting.get_allocated_bytes() == 0
    assert pool.allocation_count() == 0
    check_pool_tiles(pool)
    pool.release()
    assert up.outstanding == 0 and pool.pool_size() == 0
    if not cut:  # a whole run: the limit was reached, and refused cleanly
        assert failed > 0 and allocated > 0


class _AlignmentCheck:
    """Forwards to an AlignedResource and records every pointer not aligned as promised."""

    def __init__(self, inner, alignment):
        self.inner, self.alignment, self.bad = inner, alignment, []

    def _seen(self, ptr):
        if ptr % self.alignment:
            self.bad.append(ptr)
        return ptr

    def allocate(self, size, alignment=256):
        return self._seen(self.inner.allocate(size, alignment))

    def allocate_async(self, size, alignment, stream):
        return self._seen(self.inner.allocate_async(size, alignment, stream))

    def deallocate(self, ptr, size, alignment=256):
        self.inner.deallocate(ptr, size, alignment)

    def deallocate_async(self, ptr, size, alignment, stream):
        self.inner.deallocate_async(ptr, size, alignment, stream)


def test_sixteen_threads_on_an_aligned_pool(streams):
    """AlignedResource over the pool takes the pool's own aligned blocks: under 16 threads
    every block is aligned, none overlaps another, and the pool tiles its chunks after."""
    from hipmr_ctypes.adaptors import AlignedResource
    pool = PoolResource(HostMemoryResource())
    checked = _AlignmentCheck(AlignedResource(pool, 512), 512)
    run_threads(checked, streams, writable=True)
    assert checked.bad == []
    assert pool.allocation_count() == 0
    check_pool_tiles(pool)
    pool.release()
    assert pool.pool_size() == 0

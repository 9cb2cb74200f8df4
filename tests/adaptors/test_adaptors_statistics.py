"""StatisticsResource: exact counters after mixed workloads, the counter stack (RMM's
push/pop semantics), nested adaptors counting independently, failures not counted."""
import random

import pytest

from hipmr_ctypes import OutOfMemoryError
from hipmr_ctypes.adaptors import (LimitingResource, PoolResource, Statistics,
                                   StatisticsResource)
from hipmr_ctypes.resources import HostMemoryResource

from support import AddressSpaceResource


@pytest.mark.parametrize("read_every", [1, 7, 97, 1000])
def test_exact_after_a_mixed_workload(read_every):
    """Read after every operation, or rarely (peaks then reached between two reads, several
    frees then settled by one allocation)."""
    rng = random.Random(3 + read_every)
    stats = StatisticsResource(PoolResource(AddressSpaceResource()))
    live, cur, peak, total, n, npeak, ntotal = [], 0, 0, 0, 0, 0, 0
    for i in range(3000):
        if live and rng.random() < 0.45:
            p, size, stream = live.pop(rng.randrange(len(live)))
            if stream is None:
                stats.deallocate(p, size)
            else:
                stats.deallocate_async(p, size, 256, rng.randrange(3))
            cur -= size
            n -= 1
        else:
            size = rng.choice([0, rng.randint(1, 300), rng.randint(1, 1 << 20)])
            stream = rng.choice([None, 0, 1, 2])
            p = (stats.allocate(size) if stream is None
                 else stats.allocate_async(size, 256, stream))
            live.append((p, size, stream))
            cur += size
            n += 1
            total += size
            ntotal += 1
            peak, npeak = max(peak, cur), max(npeak, n)
        if i % read_every == 0 or i == 2999:
            assert stats.statistics == Statistics(cur, n, peak, npeak, total, ntotal)


def test_failures_and_refused_frees_are_not_counted():
    stats = StatisticsResource(LimitingResource(AddressSpaceResource(), 1000))
    p = stats.allocate(600)
    before = stats.statistics
    with pytest.raises(OutOfMemoryError):
        stats.allocate(600)
    with pytest.raises(ValueError):
        stats.allocate(-1)
    assert stats.statistics == before
    pool_stats = StatisticsResource(PoolResource(AddressSpaceResource()))
    q = pool_stats.allocate(100)
    pool_stats.deallocate(q, 100)
    before = pool_stats.statistics
    with pytest.raises(ValueError):
        pool_stats.deallocate(q, 100)           # double free, refused by the pool
    assert pool_stats.statistics == before
    stats.deallocate(p, 600)


def test_counter_stack_follows_rmm():
    stats = StatisticsResource(HostMemoryResource())
    a = stats.allocate(1000)
    assert stats.depth == 0
    before = stats.push_counters()
    assert before == Statistics(1000, 1, 1000, 1, 1000, 1) and stats.depth == 1
    assert stats.statistics == Statistics()
    b = stats.allocate(500)
    c = stats.allocate(300)
    stats.deallocate(b, 500)
    stats.deallocate(a, 1000)                     # allocated before the push
    assert stats.statistics == Statistics(-700, 0, 800, 2, 800, 2)
    popped = stats.pop_counters()
    assert popped == Statistics(-700, 0, 800, 2, 800, 2) and stats.depth == 0
    # below: current += popped current, peak = max(peak, current + popped peak)
    assert stats.statistics == Statistics(300, 1, 1800, 3, 1800, 3)
    stats.deallocate(c, 300)
    with pytest.raises(IndexError, match="no counters were pushed"):
        stats.pop_counters()
    assert stats.allocation_counts == stats.statistics


def test_nested_statistics_count_independently():
    inner = StatisticsResource(HostMemoryResource())
    outer = StatisticsResource(inner)
    p = outer.allocate(100)
    q = inner.allocate(50)
    assert outer.statistics.current_bytes == 100
    assert inner.statistics.current_bytes == 150 and inner.statistics.total_count == 2
    outer.deallocate(p, 100)
    inner.deallocate(q, 50)
    assert inner.statistics == Statistics(0, 0, 150, 2, 150, 2)
    assert outer.statistics == Statistics(0, 0, 100, 1, 100, 1)


def test_statistics_is_a_frozen_dataclass():
    st = Statistics(1, 2, 3, 4, 5, 6)
    with pytest.raises(AttributeError):
        st.current_bytes = 0
    assert st == Statistics(current_bytes=1, current_count=2, peak_bytes=3, peak_count=4,
                            total_bytes=5, total_count=6)


@pytest.mark.parametrize("seed", range(4))
def test_exact_with_refused_frees_pushes_and_several_frees_between_allocations(seed):
    """Frees piling up between two allocations (several settled by one), frees the upstream
    refuses (double frees, which the pool refuses: counted back), zero-byte calls and the
    counter stack, read at random moments, against a model that applies each operation in
    program order."""
    rng = random.Random(seed)
    stats = StatisticsResource(PoolResource(AddressSpaceResource()))
    model = [[0] * 6]   # per pushed set: cur bytes, cur count, peak b, peak n, total b, n
    live, dead = [], []

    def count(nbytes, n):
        m = model[-1]
        m[0] += nbytes
        m[1] += n
        if n > 0:
            m[4] += nbytes
            m[5] += 1
        m[2], m[3] = max(m[2], m[0]), max(m[3], m[1])

    for _ in range(2500):
        r = rng.random()
        if r < 0.35 or not live:
            size = rng.choice([0, 256, rng.randint(1, 5000)])
            p = (stats.allocate(size) if rng.random() < 0.3
                 else stats.allocate_async(size, 256, 0))
            live.append((p, size))
            count(size, 1)
        elif r < 0.75:
            for _ in range(rng.randint(1, 4)):   # several frees before the next allocation
                if not live:
                    break
                p, size = live.pop(rng.randrange(len(live)))
                stats.deallocate_async(p, size, 256, 0)
                dead.append((p, size))
                count(-size, -1)
        elif r < 0.85 and dead:
            p, size = rng.choice(dead)
            if size and all(q != p for q, _ in live):  # freed, not handed out again
                with pytest.raises(ValueError):
                    stats.deallocate(p, size)     # refused by the pool: nothing counted
        elif r < 0.92:
            assert stats.push_counters() == Statistics(*model[-1])
            model.append([0] * 6)
        elif len(model) > 1:
            top = model.pop()
            assert stats.pop_counters() == Statistics(*top)
            below = model[-1]
            below[2] = max(below[2], below[0] + top[2])
            below[3] = max(below[3], below[1] + top[3])
            for i, j in ((0, 0), (1, 1), (4, 4), (5, 5)):
                below[i] += top[j]
        if rng.random() < 0.2:
            assert stats.statistics == Statistics(*model[-1])
    assert stats.statistics == Statistics(*model[-1]) and stats.depth == len(model) - 1


@pytest.mark.parametrize("call", ["allocate", "allocate_async"])
def test_frees_left_logged_never_hide_a_peak(call):
    """An allocation of the size last freed leaves the other frees logged; one that may set a
    peak subtracts them first: current, peaks and totals are exact at every step."""
    from hipmr_ctypes.adaptors import StatisticsResource
    st = StatisticsResource(AddressSpaceResource())

    def alloc(n):
        return st.allocate(n) if call == "allocate" else st.allocate_async(n, 256, 0)

    a, b, c = alloc(100), alloc(100), alloc(100)
    for p in (a, b, c):
        st.deallocate(p, 100)
    d = alloc(100)                   # the last free's size: two frees stay logged
    e = alloc(250)                   # 350 outstanding: a new peak, the logged frees first
    s = st.statistics
    assert (s.current_bytes, s.current_count, s.peak_bytes, s.peak_count,
            s.total_bytes, s.total_count) == (350, 2, 350, 3, 650, 5)
    st.deallocate(e, 250)
    f = alloc(200)                   # 300 outstanding: no new peak
    g = alloc(50)
    s = st.statistics
    assert (s.current_bytes, s.current_count, s.peak_bytes, s.peak_count) == (350, 3, 350, 3)
    for p, n in ((d, 100), (f, 200), (g, 50)):
        st.deallocate_async(p, n, 256, 0)
    h = alloc(0)
    s = st.statistics
    assert (s.current_bytes, s.current_count, s.peak_bytes, s.peak_count,
            s.total_bytes, s.total_count) == (0, 1, 350, 3, 900, 8)
    st.deallocate(h, 0)


class _AllocatesThenRefuses(AddressSpaceResource):
    """An upstream whose first free allocates through the statistics adaptor over it (as a
    callback might) and then refuses: the free was taken by that allocation before the
    refusal came."""

    def __init__(self) -> None:
        super().__init__()
        self.stats = None
        self.inner = []

    def _deallocate(self, ptr, bytes, alignment, stream):
        if not self.inner:
            self.inner.append(self.stats.allocate(bytes))
            raise RuntimeError("refused")
        super()._deallocate(ptr, bytes, alignment, stream)


@pytest.mark.parametrize("read_first", [True, False])
@pytest.mark.parametrize("call", ["deallocate", "deallocate_async"])
def test_a_refusal_after_its_free_was_taken_is_counted_back(call, read_first):
    up = _AllocatesThenRefuses()
    st = up.stats = StatisticsResource(up)
    a = st.allocate(100)
    with pytest.raises(RuntimeError, match="refused"):
        getattr(st, call)(a, 100, *((256, 0) if call == "deallocate_async" else ()))
    if read_first:
        s = st.statistics
        assert (s.current_bytes, s.current_count, s.peak_bytes, s.peak_count,
                s.total_bytes, s.total_count) == (200, 2, 200, 2, 200, 2)
    b = st.allocate_async(50, 256, 0)      # takes the refusal first
    s = st.statistics
    assert (s.current_bytes, s.current_count, s.peak_bytes, s.peak_count,
            s.total_bytes, s.total_count) == (250, 3, 250, 3, 250, 3)
    for p, n in ((a, 100), (up.inner[0], 100), (b, 50)):
        st.deallocate(p, n)
    s = st.statistics
    assert (s.current_bytes, s.current_count, s.peak_bytes) == (0, 0, 250)

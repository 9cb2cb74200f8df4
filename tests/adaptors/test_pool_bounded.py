"""PoolResource's per-stream state stays bounded by what is live."""
from __future__ import annotations

import pytest

import hipmr_ctypes as hmr

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("size_growth_pickle_cases")


def test_a_pool_forgets_streams_it_no_longer_needs(emulator):
    """20,000 short-lived streams: the pool's per-stream state is bounded by what is live."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    for i in range(2000):
        with hmr.Stream() as s:
            p = pool.allocate_async(1000 + 256 * (i % 3), 256, s)
            pool.deallocate_async(p, 1000 + 256 * (i % 3), 256, s)
        if i % 100 == 99:
            q = pool.allocate(1 << 20)   # a miss: the slow path flushes every stream's lists
            pool.deallocate(q, 1 << 20)
    arena = pool._arena
    from hipmr_ctypes.adaptors.pool import _Keyed, _OwnLists  # the special handles' entries
    keyed = sum(1 for v in arena.free.values() if isinstance(v, (_Keyed, _OwnLists)))
    assert keyed <= 3
    assert len(arena.free) - keyed <= 101 and len(arena.classes) <= 101
    assert len(arena.streams.events) <= 101
    pool.release()
    assert len(arena.free) - keyed == 1 and len(arena.streams.events) == 0
    assert pool.pool_size() == 0

"""PoolResource's fast view (``PoolView``): the contract an adaptor directly over a pool builds
its own fast paths from (AlignedResource does), pinned field by field."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes.adaptors import AlignedResource, PoolResource
from hipmr_ctypes.adaptors.aligned import _pool_paths
from hipmr_ctypes.adaptors.pool import PoolView
from hipmr_ctypes._stream_order import SYNC

from support import AddressSpaceResource


def test_the_view_names_its_fields():
    assert PoolView._fields == ("free", "live", "stream_key", "allocate_slow",
                                "deallocate_slow", "aligned_key", "max_alignment",
                                "largest_aligned")
    assert PoolView.__doc__ and "append" in PoolView.__doc__   # the rules are written down


def test_the_view_is_the_pools_own_state_for_its_life():
    pool = PoolResource(AddressSpaceResource())
    first, second = pool._fast_view(), pool._fast_view()
    assert first.free is second.free and first.live is second.live
    p = pool.allocate(1000)
    assert first.live == {p: 1000}                      # a live block: its requested size
    pool.deallocate(p, 1000)
    assert first.live == {} and list(first.free[SYNC][1000]) == [p]   # its free list
    assert first.allocate_slow(1000, 256, SYNC) == p   # the checked path serves it again
    first.deallocate_slow(p, 1000, 256, SYNC)
    assert pool.allocation_count() == 0
    assert first.stream_key(5) == 5                     # a created stream's key: its handle
    with pytest.raises(KeyError):                       # a stream the pool never saw: a miss
        first.free[7]


def test_aligned_keys_name_the_lists_of_aligned_blocks():
    pool = PoolResource(AddressSpaceResource())
    view = pool._fast_view()
    r = pool.allocate(3000, 512)
    pool.deallocate(r, 3000, 512)       # the slow path files it with the blocks aligned so
    key = view.aligned_key(3000, 512)
    assert key < 0 and list(view.free[SYNC][key]) == [r]
    assert view.aligned_key(3000, 1024) != key and view.aligned_key(3072, 512) != key
    assert view.max_alignment == 1 << 31 and view.largest_aligned == (1 << 25) - 256
    pool.allocate(3000, 512)   # (served from that list)
    assert not view.free[SYNC][key]


def test_aligned_resource_builds_its_paths_from_the_view():
    pool = PoolResource(AddressSpaceResource())
    view = pool._fast_view()
    a = AlignedResource(pool, 4096)
    p = a.allocate_async(1000, 256, 0)
    assert p % 4096 == 0
    assert pool.get_allocated_bytes() == 1024           # nothing over-allocated
    a.deallocate_async(p, 1000, 256, 0)                 # to the pool's list of such blocks
    key = view.aligned_key(1000, 4096)
    assert list(view.free[0][key]) == [p]
    assert a.allocate_async(1000, 256, 0) == p          # popped back by the adaptor's path,
    assert view.live[p] == key                          # recorded under its size's key
    a.deallocate_async(p, 1000, 256, 0)
    assert pool.allocation_count() == 0


def test_an_alignment_with_no_lists_gets_no_paths():
    view = PoolResource(AddressSpaceResource())._fast_view()
    assert _pool_paths(view, view.max_alignment, 0, {}, None, None) is not None
    assert _pool_paths(view, view.max_alignment * 2, 0, {}, None, None) is None
    assert _pool_paths(view, 256, 0, {}, None, None) is None   # the pool aligns those itself


def test_only_the_pool_offers_a_view():
    assert not hasattr(hmr.AsyncMemoryResource(), "_fast_view")
    assert isinstance(PoolResource(AddressSpaceResource())._fast_view().free[SYNC], dict)

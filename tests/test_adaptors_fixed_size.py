"""FixedSizeResource: blocks and chunks, stream ordering, misuse."""

import pytest

from hipmr_ctypes.adaptors import FixedSizeResource, StatisticsResource

from support import AddressSpaceResource, recording_events


def test_fixed_size_blocks_and_chunks():
    up = AddressSpaceResource()
    fx = FixedSizeResource(up, block_size=1000, blocks_to_preallocate=4)
    assert fx.block_size == 1024 and fx.blocks_to_preallocate == 4
    assert fx.pool_size() == 4096 == up.outstanding
    ptrs = [fx.allocate(1000) for _ in range(5)]          # the fifth needs a new chunk
    assert fx.pool_size() == 8192 and len(set(ptrs)) == 5
    with pytest.raises(ValueError, match="larger than the block size 1024"):
        fx.allocate(1025)
    with pytest.raises(ValueError, match="larger than 256"):
        fx.allocate(10, 512)
    for p in ptrs:
        fx.deallocate(p, 1000)
    assert fx.allocate(1000) == ptrs[-1]                  # last freed, first reused
    fx.deallocate(ptrs[-1], 1000)
    assert fx.release() == 8192 and up.outstanding == 0


def test_fixed_size_stream_ordering(monkeypatch):
    calls = recording_events(monkeypatch.setattr)
    fx = FixedSizeResource(AddressSpaceResource(), block_size=256, blocks_to_preallocate=1)
    p = fx.allocate_async(100, 256, 1)       # the only block (freed synchronously: clean)
    assert calls == []
    fx.deallocate_async(p, 100, 256, 1)
    assert fx.allocate_async(100, 256, 1) == p and calls == []
    fx.deallocate_async(p, 100, 256, 1)
    assert fx.allocate_async(100, 256, 2) == p
    assert calls == [("record", 1), ("wait", 2)]
    fx.deallocate_async(p, 100, 256, 2)
    calls.clear()
    assert fx.allocate(100) == p
    assert calls == [("record", 2), ("synchronize",), ("close",)]  # a fresh event, waited
    # for without the lock
    fx.deallocate(p, 100)


def test_fixed_size_misuse():
    fx = FixedSizeResource(AddressSpaceResource(), block_size=512, blocks_to_preallocate=2)
    p = fx.allocate(300)
    with pytest.raises(ValueError, match="300 bytes, not bytes=200"):
        fx.deallocate(p, 200)
    fx.deallocate(p, 300)
    with pytest.raises(ValueError, match="already deallocated"):
        fx.deallocate(p, 300)
    assert fx.allocate(0) == 0
    stats = StatisticsResource(fx)
    q = stats.allocate(512)
    stats.deallocate(q, 512)
    assert fx.allocation_count() == 0

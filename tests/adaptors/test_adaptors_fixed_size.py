"""FixedSizeResource: blocks and chunks, stream ordering, misuse."""

import pytest

import hipmr_ctypes as hmr

from hipmr_ctypes.adaptors import FixedSizeResource, StatisticsResource

from support import (AddressSpaceResource, held_by_another_thread, recording_events,
                     run_in_thread)


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


class _OtherLibraryStream:
    """A stream object of another library: only the protocol."""

    def __init__(self, handle):
        self.handle_value = handle

    def __cuda_stream__(self):
        return (0, self.handle_value)


def test_fixed_size_takes_every_kind_of_stream_object_on_its_fast_paths():
    """A ``Stream``, its ``stream_ref`` and another library's object for the same handle all
    reach that handle's free list: a block freed through one is reused through another."""
    stream = hmr.Stream()
    other = _OtherLibraryStream(stream.handle)
    fx = FixedSizeResource(AddressSpaceResource(), block_size=256, blocks_to_preallocate=2)
    p = fx.allocate_async(100, 256, stream)
    for freed_on, taken_on in ((stream, stream.ref), (stream.ref, other), (other, stream.handle),
                               (stream.handle, stream)):
        fx.deallocate_async(p, 100, 256, freed_on)
        assert fx.allocate_async(100, 256, taken_on) == p
    fx.deallocate_async(p, 100, 256, stream)
    stream.close()


@pytest.mark.parametrize("bad", ["closed", "0", True, 0.0, object(), None, -1])
def test_fixed_size_refuses_what_is_no_stream_and_changes_nothing(bad):
    if bad == "closed":
        bad = hmr.Stream()
        bad.close()
    fx = FixedSizeResource(AddressSpaceResource(), block_size=256, blocks_to_preallocate=2)
    p = fx.allocate_async(100, 256, 0)
    error = ValueError if type(bad) is int and bad == -1 else TypeError
    if isinstance(bad, hmr.Stream):
        error = ValueError
    with pytest.raises(error) as info:
        fx.allocate_async(100, 256, bad)
    if isinstance(bad, hmr.Stream):
        assert "closed" in str(info.value)
    with pytest.raises(error):
        fx.deallocate_async(p, 100, 256, bad)
    assert fx.allocation_count() == 1              # p still live, the other block still free
    fx.deallocate_async(p, 100, 256, 0)
    assert fx.allocate_async(100, 256, 0) == p
    fx.deallocate_async(p, 100, 256, 0)
    assert fx.allocation_count() == 0


def test_fast_allocations_never_wait_for_a_thread_in_a_slow_path():
    # Another thread in a slow path (growing through a slow upstream, moving blocks between
    # streams) holds the resource's lock: an allocation with a free block at hand is still
    # served at once, without the lock, on the host's list and on a stream's, and the counts
    # stay exact.  (A fast path that took the lock could also be entered by a finalizer the
    # collector runs inside it, and that finalizer could never get the lock.)
    fx = FixedSizeResource(AddressSpaceResource(), block_size=1024, blocks_to_preallocate=8)
    s = hmr.stream_ref(0)
    warm = fx.allocate_async(1024, 256, s)
    fx.deallocate_async(warm, 1024, 256, s)       # the null stream's list now holds a block
    with held_by_another_thread(fx._state.lock, 120):   # (a wait fails run_in_thread)
        _, got = run_in_thread(lambda: [fx.allocate(512), fx.allocate_async(1024, 256, s)])
        assert got[1] == warm and len(set(got)) == 2 and fx.allocation_count() == 2
    fx.deallocate(got[0], 512)
    fx.deallocate_async(got[1], 1024, 256, s)
    assert fx.allocation_count() == 0

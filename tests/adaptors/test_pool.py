"""PoolResource: exact-fit reuse, best-fit with coalescing, growth and its limits, release,
alignment, misuse detection, stream ordering (with fake events and with the emulated
runtime's real ones), and the CPython-specific fast paths."""
import gc

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import OutOfMemoryError, async_resource_ref, device_accessible, stream_ref
from hipmr_ctypes.adaptors import PoolResource, StatisticsResource
from hipmr_ctypes.adaptors import pool as pool_module
from hipmr_ctypes._stream_order import SYNC
from hipmr_ctypes.resources import AsyncMemoryResource, HostMemoryResource

from support import (AddressSpaceResource, HostBufferResource, check_pool_tiles,
                     recording_events)

MiB = 1 << 20


class Events:
    """Fake events recording every call the pool makes (``calls``)."""

    def __init__(self, monkeypatch):
        self.calls = recording_events(monkeypatch.setattr)


@pytest.fixture
def events(monkeypatch):
    return Events(monkeypatch)


def test_exact_size_reused_at_once():
    pool = PoolResource(AddressSpaceResource())
    p = pool.allocate(1000)
    pool.deallocate(p, 1000)
    assert pool.allocate(1000) == p
    pool.deallocate(p, 1000)
    assert pool.allocate(1024) == p          # same 256-byte size class
    pool.deallocate(p, 1024)
    assert pool.allocate(900) == p
    check_pool_tiles(pool)


def test_blocks_are_carved_from_one_chunk_and_coalesce():
    up = AddressSpaceResource()
    pool = PoolResource(up, initial_pool_size=MiB, maximum_pool_size=MiB)
    quarter = MiB // 4
    ptrs = [pool.allocate(quarter) for _ in range(4)]
    start = min(ptrs)  # the one chunk, cut into its four quarters exactly
    assert sorted(ptrs) == [start + i * quarter for i in range(4)]
    assert pool.pool_size() == MiB
    with pytest.raises(OutOfMemoryError):
        pool.allocate(1)
    for p in ptrs:
        pool.deallocate(p, quarter)
    # the four free quarters merge back into the whole chunk
    whole = pool.allocate(MiB)
    assert whole == min(ptrs)
    check_pool_tiles(pool)
    pool.deallocate(whole, MiB)
    assert up.calls == 1                      # never went back to the upstream


def test_best_fit_picks_the_smallest_block_that_fits():
    pool = PoolResource(AddressSpaceResource(), initial_pool_size=4 * MiB,
                        maximum_pool_size=4 * MiB)
    a = pool.allocate(MiB)
    guard1 = pool.allocate(256)
    b = pool.allocate(2 * MiB)
    rest = pool.allocate(MiB - 256)               # the chunk is now full
    pool.deallocate(b, 2 * MiB)
    pool.deallocate(a, MiB)
    # nothing fits in the best-fit structure: the free lists are flushed into it, and a
    # request that fits both holes goes into the smaller one
    assert pool.allocate(MiB // 2 + 1000) == a
    check_pool_tiles(pool)
    assert pool.allocate(MiB) == b                # the rest of the first hole is too small
    assert pool.pool_size() == 4 * MiB
    del guard1, rest


def test_grows_on_demand_doubling_and_peak():
    up = AddressSpaceResource()
    pool = PoolResource(up)
    assert pool.pool_size() == 0 and pool.peak_pool_size == 0
    first = pool.allocate(256)
    assert pool.pool_size() == MiB            # the smallest growth
    big = [pool.allocate(MiB) for _ in range(3)]
    assert pool.pool_size() >= 4 * MiB and pool.pool_size() == up.outstanding
    peak = pool.peak_pool_size
    assert peak == pool.pool_size()
    for p in big:
        pool.deallocate(p, MiB)
    pool.deallocate(first, 256)
    assert pool.release() == peak and pool.pool_size() == 0 and up.outstanding == 0
    assert pool.peak_pool_size == peak


def test_maximum_pool_size_then_out_of_memory_changes_nothing():
    up = AddressSpaceResource()
    pool = PoolResource(up, maximum_pool_size=4 * MiB)
    stats = StatisticsResource(pool)
    p = stats.allocate(3 * MiB)
    before = (pool.pool_size(), stats.statistics, up.calls)
    with pytest.raises(OutOfMemoryError) as info:
        stats.allocate(2 * MiB)
    assert isinstance(info.value, MemoryError) and info.value.size == 2 * MiB
    assert "maximum_pool_size" in str(info.value)
    assert (pool.pool_size(), stats.statistics, up.calls) == before
    q = stats.allocate(MiB)                   # what fits still works
    stats.deallocate(q, MiB)
    stats.deallocate(p, 3 * MiB)


def test_free_chunks_given_back_to_make_room_under_the_maximum():
    up = AddressSpaceResource()
    pool = PoolResource(up, maximum_pool_size=3 * MiB)
    a = pool.allocate(MiB)
    b = pool.allocate(MiB)                    # second chunk (1 MiB, the first is full)
    pool.deallocate(a, MiB)
    pool.deallocate(b, MiB)
    # 2.5 MiB fits in no chunk; the free chunks go back so that one big chunk fits
    c = pool.allocate(5 * MiB // 2)
    assert pool.pool_size() <= 3 * MiB and up.outstanding == pool.pool_size()
    pool.deallocate(c, 5 * MiB // 2)


def test_a_fragmented_pool_grows_by_an_eighth_a_short_one_doubles():
    up = AddressSpaceResource()
    pool = PoolResource(up, initial_pool_size=64 * MiB)
    blocks = [pool.allocate(MiB) for _ in range(64)]
    assert pool.pool_size() == 64 * MiB
    for p in blocks[::2]:                      # 32 MiB free, in 1 MiB holes
        pool.deallocate(p, MiB)
    big = pool.allocate(2 * MiB)               # fits no hole: fragmented, not short
    assert pool.pool_size() == 64 * MiB + 8 * MiB
    rest = [pool.allocate(MiB) for _ in range(32 + 6)]   # every free byte taken again
    huge = pool.allocate(16 * MiB)             # short of free bytes: doubles
    assert pool.pool_size() == 2 * (72 * MiB)
    for p in blocks[1::2] + rest:
        pool.deallocate(p, MiB)
    pool.deallocate(big, 2 * MiB)
    pool.deallocate(huge, 16 * MiB)
    assert pool.release() == pool.peak_pool_size and up.outstanding == 0


def test_no_lock_is_held_while_the_upstream_takes_chunks_back_on_the_way_to_oom():
    """Growth that would pass the maximum first gives fully free chunks back; the upstream's
    free may block (hipFree synchronizes the device), so the pool's lock is let go for it:
    another thread allocates from the pool meanwhile."""
    import threading

    got = []

    class SlowFree(AddressSpaceResource):
        def deallocate(self, ptr, nbytes, alignment=256):
            if not got:  # the first chunk given back: allocate from another thread now
                t = threading.Thread(target=lambda: got.append(pool.allocate(512 * 1024)))
                t.start()
                t.join(10)   # would time out if the pool's lock were held here
                assert not t.is_alive(), "the pool held its lock during the upstream's free"
            super().deallocate(ptr, nbytes, alignment)

    up = SlowFree()
    pool = PoolResource(up, maximum_pool_size=8 * MiB)
    a = pool.allocate(4 * MiB)
    b = pool.allocate(2 * MiB)
    c = pool.allocate(MiB)
    assert pool.pool_size() == 8 * MiB
    pool.deallocate(a, 4 * MiB)                # a whole chunk free
    with pytest.raises(OutOfMemoryError):
        pool.allocate(6 * MiB)                 # gives that chunk back, still cannot fit
    assert len(got) == 1 and pool.pool_size() == 4 * MiB == up.outstanding
    for p, n in ((got[0], 512 * 1024), (b, 2 * MiB), (c, MiB)):
        pool.deallocate(p, n)
    pool.release()
    assert up.outstanding == 0


def test_upstream_failure_halves_the_growth_then_raises():
    up = AddressSpaceResource(capacity=3 * MiB)
    pool = PoolResource(up, initial_pool_size=2 * MiB)
    p = pool.allocate(2 * MiB)
    q = pool.allocate(MiB // 2)               # wants >= 2 MiB, gets what the upstream has
    assert pool.pool_size() <= 3 * MiB
    with pytest.raises(OutOfMemoryError, match="upstream") as info:
        pool.allocate(2 * MiB)
    assert isinstance(info.value.__cause__, MemoryError)
    pool.deallocate(q, MiB // 2)
    pool.deallocate(p, 2 * MiB)


def test_release_keeps_chunks_in_use():
    up = AddressSpaceResource()
    pool = PoolResource(up)
    keep = pool.allocate(100)
    other = [pool.allocate(2 * MiB) for _ in range(2)]
    for p in other:
        pool.deallocate(p, 2 * MiB)
    given = pool.release()
    assert given > 0 and pool.pool_size() == up.outstanding > 0
    pool.deallocate(keep, 100)
    pool.release()
    assert pool.pool_size() == 0 and up.outstanding == 0


def test_alignment_above_256():
    pool = PoolResource(AddressSpaceResource())
    ptrs = []
    for alignment in (512, 4096, 65536, MiB):
        p = pool.allocate(1000, alignment)
        assert p % alignment == 0
        ptrs.append((p, alignment))
    check_pool_tiles(pool)
    for p, alignment in ptrs:
        pool.deallocate(p, 1000, alignment)
    again = pool.allocate(1000, 65536)
    assert again % 65536 == 0
    check_pool_tiles(pool)


def test_zero_bytes():
    up = AddressSpaceResource()
    pool = PoolResource(up)
    assert pool.allocate(0) == 0 and pool.allocate_async(0, 256, 0) == 0
    pool.deallocate(0, 0)
    pool.deallocate_async(0, 0, 256, 0)
    assert up.calls == 0


def test_misuse_raises_value_error_and_changes_nothing():
    up = AddressSpaceResource()
    pool = PoolResource(up)
    p = pool.allocate(1000)
    with pytest.raises(ValueError, match=hex(p + 256)):
        pool.deallocate(p + 256, 1000)             # inside a live block
    with pytest.raises(ValueError, match="1000 bytes, not bytes=2000"):
        pool.deallocate(p, 2000)
    with pytest.raises(ValueError, match="1000 bytes, not bytes=999"):
        pool.deallocate_async(p, 999, 256, 0)
    with pytest.raises(ValueError, match=hex(12345 << 8)):
        pool.deallocate(12345 << 8, 1000)          # foreign
    assert pool.allocation_count() == 1
    pool.deallocate(p, 1000)
    with pytest.raises(ValueError, match="already deallocated"):
        pool.deallocate(p, 1000)                   # double free
    with pytest.raises(ValueError, match="already deallocated"):
        pool.deallocate_async(p, 1000, 256, 1)
    assert pool.allocation_count() == 0
    assert pool.allocate(1000) == p                # the free list is intact
    check_pool_tiles(pool)


def test_float_and_bool_sizes_never_take_the_fast_path():
    pool = PoolResource(AddressSpaceResource())
    p = pool.allocate(256)
    pool.deallocate(p, 256)
    for bad in (256.0, True):
        with pytest.raises(TypeError):
            pool.allocate(bad)
        with pytest.raises(TypeError):
            pool.allocate(256, float(256) if bad is True else 256.0)
    assert pool.allocate(256) == p


def test_numpy_like_integers_are_accepted_on_the_checked_path():
    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    pool = PoolResource(AddressSpaceResource())
    p = pool.allocate(Index(1000), Index(512))
    assert p % 512 == 0
    pool.deallocate(p, Index(1000), Index(512))
    assert pool.allocation_count() == 0


def test_stream_arguments_of_every_kind_share_one_free_list():
    stream = hmr.Stream()
    pool = PoolResource(AsyncMemoryResource())
    for as_arg in (stream, stream.ref, stream.handle, stream_ref(stream)):
        p = pool.allocate_async(5000, 256, as_arg)
        pool.deallocate_async(p, 5000, 256, as_arg)
        assert pool.allocate_async(5000, 256, stream.handle) == p
        pool.deallocate_async(p, 5000, 256, stream)
    pool.release()
    stream.close()


class _OtherLibraryStream:
    """A stream object of another library: only the protocol, counted."""

    def __init__(self, handle):
        self.handle_value = handle
        self.reads = 0

    def __cuda_stream__(self):
        self.reads += 1
        return (0, self.handle_value)


def test_a_stream_object_of_another_library_uses_the_free_list_of_its_handle():
    stream = hmr.Stream()
    other = _OtherLibraryStream(stream.handle)
    pool = PoolResource(AsyncMemoryResource())
    p = pool.allocate_async(5000, 256, stream)
    pool.deallocate_async(p, 5000, 256, other)         # its handle's list: reused at once
    other.reads = 0
    for _ in range(3):
        assert pool.allocate_async(5000, 256, other) == p
        pool.deallocate_async(p, 5000, 256, other)
    assert other.reads == 6                            # one read per call, no more
    assert pool.allocate_async(5000, 256, stream.ref) == p
    pool.deallocate_async(p, 5000, 256, stream.handle)
    assert pool.allocation_count() == 0
    pool.release()
    stream.close()


@pytest.mark.parametrize("bad", ["0", True, 0.0, object(), None, -1])
def test_what_is_no_stream_is_refused_by_the_fast_paths_and_changes_nothing(bad):
    pool = PoolResource(AsyncMemoryResource())
    p = pool.allocate_async(5000, 256, 0)
    pool.deallocate_async(p, 5000, 256, 0)
    q = pool.allocate_async(256, 256, 0)
    error = ValueError if bad == -1 and type(bad) is int else TypeError
    with pytest.raises(error):
        pool.allocate_async(5000, 256, bad)
    with pytest.raises(error):
        pool.deallocate_async(q, 256, 256, bad)
    assert pool.allocation_count() == 1                # q still live, p still free
    assert pool.allocate_async(5000, 256, 0) == p
    pool.deallocate_async(p, 5000, 256, 0)
    pool.deallocate_async(q, 256, 256, 0)
    assert pool.allocation_count() == 0
    pool.release()


def test_same_stream_reuse_needs_no_event(events):
    pool = PoolResource(AddressSpaceResource())
    p = pool.allocate_async(4096, 256, 7)
    pool.deallocate_async(p, 4096, 256, 7)
    assert pool.allocate_async(4096, 256, 7) == p
    assert events.calls == []


def test_other_stream_waits_for_an_event_on_the_freeing_stream(events):
    pool = PoolResource(AddressSpaceResource(), initial_pool_size=MiB, maximum_pool_size=MiB)
    p = pool.allocate_async(MiB, 256, 5)
    pool.deallocate_async(p, MiB, 256, 5)
    assert events.calls == []
    q = pool.allocate_async(MiB, 256, 9)          # the only memory was freed on stream 5
    assert q == p
    assert events.calls == [("record", 5), ("wait", 9)]


def test_synchronous_allocation_waits_on_the_host(events):
    pool = PoolResource(AddressSpaceResource(), initial_pool_size=MiB, maximum_pool_size=MiB)
    p = pool.allocate_async(MiB, 256, 5)
    pool.deallocate_async(p, MiB, 256, 5)
    assert pool.allocate(MiB) == p
    # a fresh event, waited for on the host with the pool's lock let go, then destroyed
    assert events.calls == [("record", 5), ("synchronize",), ("close",)]
    pool.deallocate(p, MiB)                        # a synchronous free is clean
    events.calls.clear()
    q = pool.allocate_async(MiB, 256, 9)
    assert q == p and events.calls == []


def test_chunks_grown_on_a_stream_are_ordered_for_other_streams(events):
    pool = PoolResource(AddressSpaceResource())
    pool.allocate_async(1000, 256, 3)             # grows with allocate_async on stream 3
    events.calls.clear()
    pool.allocate_async(1000, 256, 4)             # the rest of that chunk, on stream 4
    assert events.calls == [("record", 3), ("wait", 4)]


def test_release_synchronizes_tagged_streams_and_drops_events(events):
    up = AddressSpaceResource()
    pool = PoolResource(up)
    ptrs = [(pool.allocate_async(2000, 256, s), s) for s in (1, 2, 3)]
    for p, s in ptrs:
        pool.deallocate_async(p, 2000, 256, s)
    events.calls.clear()
    assert pool.release() == MiB and up.outstanding == 0
    records = sorted(c[1] for c in events.calls if c[0] == "record")
    assert records == [1, 2, 3]
    # three fresh events waited for without the lock, then closed, and the pool's reusable
    # events closed too
    assert events.calls.count(("synchronize",)) == 3 and events.calls.count(("close",)) >= 3
    before = len(events.calls)
    assert pool.release() == 0 and events.calls[before:] == []  # nothing left to wait for


def test_sync_upstream_pool_never_uses_events(events):
    up = HostBufferResource()
    pool = PoolResource(up)
    assert not hmr.is_async_resource(pool)
    ptrs = [pool.allocate(n) for n in (10, 1000, 100000)]
    for p, n in zip(ptrs, (10, 1000, 100000)):
        pool.deallocate(p, n)
    pool.release()
    assert events.calls == [] and up.live == {}


def test_many_streams_and_real_events_on_the_emulated_runtime():
    streams = [hmr.Stream() for _ in range(3)]
    up = AsyncMemoryResource()
    pool = PoolResource(up, maximum_pool_size=8 * MiB)
    ref = async_resource_ref[device_accessible](pool)
    live = []
    for i in range(300):
        s = streams[i % 3]
        n = 1 + (i * 104729) % (MiB // 2)
        if len(live) > 8:
            p, m, _ = live.pop(i % len(live))
            ref.deallocate_async(p, m, 256, streams[(i + 1) % 3])
        live.append((ref.allocate_async(n, 256, s), n, s))
    starts = sorted((p, n) for p, n, _ in live)
    for (p1, n1), (p2, _) in zip(starts, starts[1:]):
        assert p1 + n1 <= p2
    for p, n, s in live:
        ref.deallocate_async(p, n, 256, s)
    check_pool_tiles(pool)
    pool.release()
    assert pool.pool_size() == 0
    for s in streams:
        s.close()


def test_distinct_sizes_beyond_the_per_stream_map(monkeypatch):
    monkeypatch.setattr(pool_module, "_MAX_SIZES_PER_STREAM", 8)
    pool = PoolResource(AddressSpaceResource())
    ptrs = [(pool.allocate(n), n) for n in range(100, 5000, 37)]
    for p, n in ptrs:
        pool.deallocate(p, n)
    assert len(pool._arena.free[SYNC]) <= 8
    again = [(pool.allocate(n), n) for n in range(100, 5000, 37)]
    assert sorted(p for p, _ in again) == sorted(p for p, _ in ptrs)
    check_pool_tiles(pool)


def test_garbage_collected_pool_gives_its_chunks_back():
    up = AddressSpaceResource()
    pool = PoolResource(up, initial_pool_size=MiB)
    pool.allocate(1000)
    assert up.outstanding == MiB
    del pool
    gc.collect()
    assert up.outstanding == 0


def test_upstream_with_misaligned_pointers_is_refused():
    class Misaligned(HostBufferResource):
        def allocate(self, bytes, alignment=256):
            return super().allocate(bytes + 256, 256) + 64

        def deallocate(self, ptr, bytes, alignment=256):
            super().deallocate(ptr - 64, bytes + 256, 256)

    up = Misaligned()
    pool = PoolResource(up)
    with pytest.raises(ValueError, match="aligned to 256"):
        pool.allocate(100)
    assert pool.pool_size() == 0 and up.live == {}   # the refused chunk went back


def test_accounting_helpers():
    pool = PoolResource(AddressSpaceResource(), initial_pool_size=MiB)
    a, b = pool.allocate(100), pool.allocate(1000)
    assert pool.allocation_count() == 2
    assert pool.get_allocated_bytes() == 256 + 1024
    assert pool.free_bytes() == MiB - 256 - 1024
    pool.deallocate(a, 100)
    pool.deallocate(b, 1000)
    assert pool.initial_pool_size == MiB and pool.maximum_pool_size is None
    assert "PoolResource" in repr(pool)


def test_through_async_resource_ref_the_hot_methods_are_the_pool_closures():
    pool = PoolResource(HostMemoryResource())
    ref = async_resource_ref[hmr.host_accessible](pool)
    assert ref.allocate_async is pool.allocate_async
    assert ref.deallocate is pool.deallocate
    p = ref.allocate(256)
    ref.deallocate(p, 256)


def test_a_finalizer_freeing_into_the_pool_inside_its_slow_path_is_deferred():
    """The garbage collector may run a finalizer (a pool over this one giving its chunks back)
    while this thread holds the pool's lock in its slow path: the free must neither deadlock
    nor run in the middle of the slow path's update; it runs when the lock is let go."""
    import threading
    from hipmr_ctypes import HostMemoryResource
    pool = PoolResource(HostMemoryResource(), initial_pool_size=MiB)
    p = pool.allocate(12345)            # a size whose free takes the slow path
    before = pool.allocation_count()
    done = []

    def inside():
        with pool._arena.lock:          # as if the collector ran inside the slow path
            pool.deallocate(p, 12345)
            done.append(pool.allocation_count())
    t = threading.Thread(target=inside)
    t.start()
    t.join(10)
    assert not t.is_alive(), "deadlock: a free re-entered the lock its thread holds"
    assert done == [before]             # deferred: still live while the lock is held...
    assert pool.allocation_count() == before - 1
    assert pool.allocate(12345) == p    # ...freed, onto the free list, once it was let go
    pool.deallocate(p, 12345)
    assert pool.release() > 0

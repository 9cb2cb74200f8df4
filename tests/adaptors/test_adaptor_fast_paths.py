"""The inline fast paths of BinningResource (its route cache) and AlignedResource (over the
package's own async upstreams): the same answers and checks as the checked paths."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes.adaptors import AlignedResource, BinningResource, PoolResource
from hipmr_ctypes.adaptors import binning as binning_module
from hipmr_ctypes.adaptors.aligned import _pool_paths
from hipmr_ctypes._stream_order import SYNC

from support import REPO


@pytest.fixture
def pool():
    return PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 22)


class CountingBin:
    """A user-written async bin over the pool: it checks nothing itself."""

    def __init__(self, upstream):
        self.up = upstream
        self.calls = []
        self.properties = (hmr.device_accessible,)

    def allocate(self, bytes, alignment=256):
        self.calls.append(("allocate", bytes))
        return self.up.allocate(bytes, alignment)

    def deallocate(self, ptr, bytes, alignment=256):
        self.calls.append(("deallocate", bytes))
        self.up.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes, alignment, stream):
        self.calls.append(("allocate_async", bytes))
        return self.up.allocate_async(bytes, alignment, stream)

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self.calls.append(("deallocate_async", bytes))
        self.up.deallocate_async(ptr, bytes, alignment, stream)

    def __eq__(self, other):
        return other is self

    __hash__ = object.__hash__


def test_binning_route_cache_follows_add_bin(pool):
    b = BinningResource(pool, [1024])
    first = b.bin_resources[1024]
    p1 = b.allocate_async(300, 256, 0)          # -> the 1 KiB bin (and cached)
    p2 = b.allocate_async(300, 256, 0)          # a cache hit
    assert first.allocation_count() == 2
    b.add_bin(512)
    p3 = b.allocate_async(300, 256, 0)          # the new cache: the new 512 B bin
    assert b.bin_resources[512].allocation_count() == 1 and first.allocation_count() == 2
    for p in (p1, p2):                           # still freed through the bin that gave them
        b.deallocate_async(p, 300, 256, 0)
    assert first.allocation_count() == 0
    b.deallocate_async(p3, 300, 256, 0)
    assert b.allocation_count() == 0


def test_binning_sync_and_async_share_the_routes(pool):
    b = BinningResource(pool, [1024, 65536])
    ptrs = [(b.allocate(n), n) for n in (1, 256, 1024, 1025, 65536, 65537)]
    ptrs += [(b.allocate_async(n, 256, 0), n) for n in (1, 256, 1024, 1025, 65536, 65537)]
    res = b.bin_resources
    assert res[1024].allocation_count() == 6 and res[65536].allocation_count() == 4
    assert b.allocation_count() == 12
    for i, (p, n) in enumerate(ptrs):
        if i % 2:
            b.deallocate(p, n)
        else:
            b.deallocate_async(p, n, 256, 0)
    assert b.allocation_count() == 0


def test_binning_fast_path_refuses_what_the_checked_path_refuses(pool):
    b = BinningResource(pool, [1024])
    b.allocate_async(256, 256, 0)                # the size 256 is now in the route cache
    for bad in (True, 256.0):
        with pytest.raises(TypeError):
            b.allocate_async(bad, 256, 0)
    with pytest.raises(TypeError):
        b.allocate_async(256, 256.0, 0)
    with pytest.raises(TypeError):
        b.allocate_async(256, [256], 0)
    with pytest.raises(ValueError):
        b.allocate_async(256, 3, 0)
    with pytest.raises((TypeError, ValueError)):
        b.allocate_async(256, 256, -1)           # the bin checks the stream
    with pytest.raises((TypeError, ValueError)):
        b.allocate_async(256, 256, "stream")
    assert b.allocation_count() == 1
    assert b.allocate_async(0, 256, 0) == 0


def test_binning_free_with_a_bad_stream_changes_nothing(pool):
    b = BinningResource(pool, [1024])
    p = b.allocate_async(256, 256, 0)
    with pytest.raises((TypeError, ValueError)):
        b.deallocate_async(p, 256, 256, -1)
    assert b.allocation_count() == 1
    with pytest.raises(ValueError):
        b.deallocate_async(p, 512, 256, 0)      # the wrong size
    assert b.allocation_count() == 1
    b.deallocate_async(p, 256, 256, 0)
    assert b.allocation_count() == 0


# ---- a fixed-size bin's lists, served by the adaptor's own fast paths -------------------------
def _served_inline(b, size):
    i = b._bins[0][0].index(size)
    return b._bins[0][1][i][4] is not None


def test_binning_serves_its_fixed_size_bins_as_they_serve_themselves(pool):
    b = BinningResource(pool, [1024])
    fixed = b.bin_resources[1024]
    assert _served_inline(b, 1024)
    with hmr.Stream() as s:
        for stream in (s, hmr.stream_ref(s), s.handle):
            p = b.allocate_async(1000, 256, stream)
            assert fixed.allocation_count() == 1 and b.allocation_count() == 1
            b.deallocate_async(p, 1000, 256, stream)
            assert fixed.allocation_count() == 0 and b.allocation_count() == 0
            assert b.allocate_async(1000, 256, stream) == p   # the stream's own block again
            b.deallocate_async(p, 1000, 256, stream)
        s.synchronize()
    for stream in (0, 2):                       # the null and the per-thread streams
        p = b.allocate_async(700, 256, stream)
        b.deallocate_async(p, 700, 256, stream)
        assert fixed.allocation_count() == 0
    p = b.allocate(1000)
    b.deallocate(p, 1000)
    assert b.allocate(1000) == p                # the host's list
    assert fixed.allocation_count() == 1
    b.deallocate(p, 1000)
    assert fixed.allocation_count() == b.allocation_count() == 0


def test_binning_inline_frees_refuse_what_the_bin_refuses(pool):
    b = BinningResource(pool, [1024])
    fixed = b.bin_resources[1024]
    b.deallocate_async(b.allocate_async(1000, 256, 0), 1000, 256, 0)  # stream 0's list made
    assert fixed._state.free.get(0) is not None
    b.deallocate(b.allocate(1), 1)              # the route of 1 (and True) cached
    for bad in (1000.0, True):
        with pytest.raises(TypeError):
            b.allocate_async(bad, 256, 0)
        with pytest.raises(TypeError):
            b.allocate(bad)
    assert b.allocation_count() == fixed.allocation_count() == 0
    p = b.allocate_async(1000, 256, 0)
    closed = hmr.Stream()
    closed.close()
    for args in ((p, 1000, [256], 0), (p, 1000, 256.0, 0), (p, 1000, 512, 0),
                 (p, 1000, 256, closed), (p, 1000, 256, -1), (float(p), 1000, 256, 0),
                 (p, 1000.0, 256, 0), (p, 999, 256, 0)):
        with pytest.raises((TypeError, ValueError)):
            b.deallocate_async(*args)
        assert b.allocation_count() == 1 and fixed.allocation_count() == 1, args
    q = b.allocate(1000)
    for args in ((q, 1000, [256]), (float(q), 1000), (q, True), (q, 1000, 512)):
        with pytest.raises((TypeError, ValueError)):
            b.deallocate(*args)
        assert b.allocation_count() == 2 and fixed.allocation_count() == 2, args
    b.deallocate_async(p, 1000, 256, 0)
    b.deallocate(q, 1000)
    assert b.allocation_count() == fixed.allocation_count() == 0


def test_binning_never_hands_out_a_block_freed_through_its_bin_behind_its_back(pool):
    b = BinningResource(pool, [1024])
    fixed = b.bin_resources[1024]
    p = b.allocate(1000)
    fixed.deallocate(p, 1000)                   # the bin has it back; the adaptor does not
    with pytest.raises(ValueError, match="not allocated|unknown|never"):
        b.deallocate(p, 1000)                   # the bin's claim fails: not freed twice
    assert list(fixed._state.free[SYNC]).count(p) == 1
    with pytest.raises(ValueError, match="handed out before"):
        b.allocate(1000)
    b.deallocate_async(b.allocate_async(1000, 256, 0), 1000, 256, 0)  # stream 0's list made
    q = b.allocate_async(1000, 256, 0)
    fixed.deallocate_async(q, 1000, 256, 0)
    with pytest.raises(ValueError, match="not allocated|unknown|never"):
        b.deallocate_async(q, 1000, 256, 0)
    assert list(fixed._state.free[0]).count(q) == 1
    with pytest.raises(ValueError, match="handed out before"):
        b.allocate_async(1000, 256, 0)


def test_binning_calls_a_bin_whose_blocks_are_smaller_than_the_bin(pool):
    small = hmr.FixedSizeResource(pool, block_size=1024)
    b = BinningResource(pool, [(2048, small)])
    assert not _served_inline(b, 2048)
    with pytest.raises(ValueError, match="larger than the block size"):
        b.allocate_async(1500, 256, 0)
    with pytest.raises(ValueError, match="larger than the block size"):
        b.allocate(1500)
    r = b.allocate_async(1000, 256, 0)
    assert small.allocation_count() == 1
    b.deallocate_async(r, 1000, 256, 0)
    assert b.allocation_count() == small.allocation_count() == 0


def test_binning_user_bin_gets_the_stream_checked_first(pool):
    user = CountingBin(pool)
    b = BinningResource(pool, [(1024, user)])
    for bad in (-1, 1 << 64, "stream", 1.5):
        with pytest.raises((TypeError, ValueError)):
            b.allocate_async(256, 256, bad)
    assert user.calls == []
    p = b.allocate_async(256, 256, 0)
    with pytest.raises((TypeError, ValueError)):
        b.deallocate_async(p, 256, 256, -1)
    assert user.calls == [("allocate_async", 256)] and b.allocation_count() == 1
    b.deallocate_async(p, 256, 256, 0)
    assert user.calls[-1] == ("deallocate_async", 256) and b.allocation_count() == 0


def test_binning_user_bin_gets_every_argument_checked_on_a_cached_route(pool):
    # the fast paths pass sizes and alignments on unchecked to the package's own bins, which
    # check them; a user-written bin's entry checks them first
    user = CountingBin(pool)
    b = BinningResource(pool, [(1024, user)])
    p = b.allocate_async(256, 256, 0)                 # 256 is now a cached route
    q = b.allocate(256)
    user.calls.clear()
    for bad in (True, 256.0):
        with pytest.raises(TypeError):
            b.allocate_async(bad, 256, 0)
        with pytest.raises(TypeError):
            b.allocate(bad)
        with pytest.raises(TypeError):
            b.deallocate_async(p, bad, 256, 0)
        with pytest.raises(TypeError):
            b.deallocate(q, bad)
    for bad_alignment in (3, 256.0, True):
        with pytest.raises((TypeError, ValueError)):
            b.deallocate_async(p, 256, bad_alignment, 0)
        with pytest.raises((TypeError, ValueError)):
            b.deallocate(q, 256, bad_alignment)
    with pytest.raises(TypeError):
        b.deallocate_async(float(p), 256, 256, 0)    # equal to a live pointer: not taken
    assert user.calls == [] and b.allocation_count() == 2
    b.deallocate_async(p, 256, 256, 0)
    b.deallocate(q, 256)
    assert b.allocation_count() == 0 and pool.allocation_count() == 0


def test_binning_fast_free_refuses_bad_arguments_and_keeps_the_record(pool):
    b = BinningResource(pool, [1024, 65536])
    ptrs = {n: b.allocate_async(n, 256, 0) for n in (256, 5000, 1 << 20)}  # two bins, upstream
    for n, p in ptrs.items():
        for bytes_, alignment, exc in ((256.0 if n == 256 else float(n), 256, TypeError),
                                       (n, 3, ValueError), (n, 256.0, TypeError),
                                       (n + 1, 256, ValueError), ([n], 256, TypeError)):
            with pytest.raises(exc):
                b.deallocate_async(p, bytes_, alignment, 0)
            with pytest.raises(exc):
                b.deallocate(p, bytes_, alignment)
        with pytest.raises(TypeError):
            b.deallocate_async(float(p), n, 256, 0)
        with pytest.raises(TypeError):
            b.deallocate([p], n)
        assert b.allocation_count() == 3
    for n, p in ptrs.items():
        b.deallocate_async(p, n, 256, 0)
    assert b.allocation_count() == 0
    b.release()                                  # the bins' chunks go back to the pool
    assert pool.allocation_count() == 0


def test_binning_route_cache_is_bounded(pool):
    b = BinningResource(pool, [1 << 16])
    for n in range(1, binning_module._ROUTES_CACHED + 50):
        b.deallocate_async(b.allocate_async(n, 256, 0), n, 256, 0)
    assert len(b._routes) == binning_module._ROUTES_CACHED
    assert b.allocation_count() == 0


@pytest.mark.parametrize("alignment", [512, 4096])
def test_aligned_fast_path_over_the_pool(pool, alignment):
    a = AlignedResource(pool, alignment)
    ptrs = [(a.allocate_async(n, 256, 0), n) for n in (1, 255, 256, 257, 5000)]
    assert all(p % alignment == 0 for p, _ in ptrs)
    assert len({p for p, _ in ptrs}) == len(ptrs)
    p = a.allocate_async(100, 64, 0)
    assert p % alignment == 0
    a.deallocate_async(p, 100, 64, 0)
    for p, n in ptrs:
        a.deallocate_async(p, n, 256, 0)
    assert pool.allocation_count() == 0


def test_aligned_threshold_and_small_default(pool):
    a = AlignedResource(pool, 1024, threshold=4096)
    small = a.allocate_async(100, 256, 0)       # under the threshold: passed through
    assert small % 256 == 0 and pool.allocation_count() == 1
    big = a.allocate_async(4096, 256, 0)
    assert big % 1024 == 0
    a.deallocate_async(small, 100, 256, 0)
    a.deallocate_async(big, 4096, 256, 0)
    assert pool.allocation_count() == 0
    b = AlignedResource(pool, 128)               # the upstream aligns it itself
    p = b.allocate_async(100, 8, 0)
    assert p % 128 == 0
    b.deallocate_async(p, 100, 8, 0)
    assert pool.allocation_count() == 0


def test_aligned_fast_path_refusals_change_nothing(pool):
    a = AlignedResource(pool, 512)
    p = a.allocate_async(256, 256, 0)
    for bad in (True, 256.0):
        with pytest.raises(TypeError):
            a.allocate_async(bad, 256, 0)
    with pytest.raises(TypeError):
        a.allocate_async(256, [256], 0)
    with pytest.raises((TypeError, ValueError)):
        a.allocate_async(256, 256, -1)
    with pytest.raises(ValueError):
        a.deallocate_async(p, 257, 256, 0)       # the wrong size
    with pytest.raises((TypeError, ValueError)):
        a.deallocate_async(p, 256, 256, -1)      # refused by the pool: the record is kept
    with pytest.raises(TypeError):
        a.deallocate_async(p, 256, 256.0, 0)
    assert pool.allocation_count() == 1
    a.deallocate_async(p, 256, 256, 0)
    assert pool.allocation_count() == 0
    with pytest.raises(ValueError):
        a.deallocate_async(p, 256, 256, 0)       # twice
    assert a.allocate_async(0, 256, 0) == 0


def test_aligned_fast_path_sizes_past_the_cache_and_the_compact_range(pool, monkeypatch):
    from hipmr_ctypes.adaptors import aligned as aligned_module
    monkeypatch.setattr(aligned_module, "_TOTALS_CACHED", 8)
    a = AlignedResource(pool, 4096)
    ptrs = [(a.allocate_async(n, 256, 0), n) for n in range(1, 40)]   # past the cache's 8
    ptrs += [(a.allocate_async(n, 256, 0), n) for n in range(1, 40)]  # hits and misses
    assert all(p % 4096 == 0 for p, _ in ptrs) and len({p for p, _ in ptrs}) == len(ptrs)
    assert pool.allocation_count() == len(ptrs)
    for p, n in ptrs:
        a.deallocate_async(p, n, 256, 0)
    with pytest.raises(hmr.OutOfMemoryError):   # above 2**30 - 1: the checked path
        a.allocate_async((1 << 63) - 100, 256, 0)
    assert pool.allocation_count() == 0


class _RaisingEq:
    """A size whose comparison raises."""

    def __eq__(self, other):
        raise RuntimeError("no comparison")

    __hash__ = object.__hash__


@pytest.mark.parametrize("kind", ["aligned", "binning"])
def test_a_size_whose_comparison_raises_loses_no_record(pool, kind):
    r = AlignedResource(pool, 512) if kind == "aligned" else BinningResource(pool, [1024])
    p = r.allocate_async(256, 256, 0)
    with pytest.raises((TypeError, RuntimeError)):
        r.deallocate_async(p, _RaisingEq(), 256, 0)
    r.deallocate_async(p, 256, 256, 0)           # the record was kept
    with pytest.raises(ValueError):
        r.deallocate_async(p, 256, 256, 0)


# ---- the pool's per-thread stream: exact counts across threads and streams

PER_THREAD = 2


def _per_thread_map(pool):
    """The arena's map of free lists for the calling thread's per-thread stream (or None)."""
    from hipmr_ctypes._stream_order import stream_key
    return pool._arena.free.get(stream_key(PER_THREAD))


def _pairs(pool, n, size=1000, stream=PER_THREAD):
    ptrs = set()
    for _ in range(n):
        p = pool.allocate_async(size, 256, stream)
        ptrs.add(p)
        pool.deallocate_async(p, size, 256, stream)
    return ptrs


def test_per_thread_and_other_streams_keep_exact_counts(emulator, pool):
    from support import run_in_thread
    s = hmr.Stream()
    live = []
    for i in range(20):
        stream = (PER_THREAD, 0, s)[i % 3]
        live.append((pool.allocate_async(256 * (1 + i % 4), 256, stream), 256 * (1 + i % 4),
                     stream))
    assert pool.allocation_count() == 20
    for p, n, stream in live[::2]:
        pool.deallocate_async(p, n, 256, stream)
    pool.release()
    for p, n, stream in live[1::2]:
        pool.deallocate_async(p, n, 256, stream)
    assert pool.allocation_count() == 0
    with pytest.raises(ValueError):                  # a double free on the cached path
        pool.deallocate_async(live[0][0], live[0][1], 256, live[0][2])
    results = [run_in_thread(lambda: len(_pairs(pool, 50, 512)))[1] for _ in range(3)]
    assert results == [1, 1, 1]
    assert pool.allocation_count() == 0 and pool.free_bytes() == pool.pool_size()
    s.close()


def test_bench_hotpaths_counts_instructions_under_callgrind(tmp_path):
    """``scripts/bench_hotpaths.py --callgrind``: one row per chosen name, a positive count
    (the instruction counts themselves are not bounded here)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    if shutil.which("valgrind") is None:
        if os.environ.get("HIPMR_REQUIRE_VALGRIND") == "1":
            pytest.fail("HIPMR_REQUIRE_VALGRIND=1 but valgrind is not installed")
        pytest.skip("valgrind is not installed (the --callgrind mode runs under it)")
    out = tmp_path / "cg.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_hotpaths.py"), "--callgrind",
         "--rows", "PoolResource direct,per-thread", "--warmup", "20", "--small", "10",
         "--large", "30", "--json", str(out)],
        cwd=REPO, env=dict(os.environ, HIPMR_PLATFORM="emulated"), capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data) == {"PoolResource direct", "PoolResource on the per-thread stream (2)",
                         "per-thread floor: two dict reads",
                         "per-thread floor: two threading.local reads",
                         "per-thread floor: two get_ident() look-ups"}
    assert all(v > 0 for v in data.values())


def test_each_thread_reads_its_own_per_thread_map_through_one_entry(emulator, pool):
    """With one device visible, ``free[2]`` gives each thread its own map (the arena's
    ``free[stream_key(2)]`` of that thread, the same dict), forgetting the key empties it
    without dropping it, and the fast path fills it again: counts exact all along."""
    import threading
    from hipmr_ctypes.adaptors import pool as pool_module
    from support import run_in_thread
    arena = pool._arena
    entry = arena.free[PER_THREAD]
    assert isinstance(entry, pool_module._OwnLists)
    assert len(_pairs(pool, 20)) == 1                # the fast path reuses one block
    mine = _per_thread_map(pool)
    assert mine is entry.sizes and 1000 in mine and entry[1000] is mine[1000]
    with arena.lock:
        arena._flush_all()                           # forgets every stream's lists
    assert _per_thread_map(pool) is None and mine == {}
    with pytest.raises(KeyError):
        entry[1000]                                  # a miss: the checked path serves it
    assert len(_pairs(pool, 20)) == 1
    assert _per_thread_map(pool) is mine and 1000 in mine   # the same dict, filled again
    p = pool.allocate_async(1000, 256, PER_THREAD)  # held by this thread: the other thread
    pool.deallocate_async(p, 1000, 256, PER_THREAD)  # must not get it from its own map

    def other():
        theirs = _per_thread_map(pool)
        assert theirs is None and arena.free[PER_THREAD].sizes == {}
        q = pool.allocate_async(1000, 256, PER_THREAD)
        pool.deallocate_async(q, 1000, 256, PER_THREAD)
        theirs = _per_thread_map(pool)
        return q, theirs is arena.free[PER_THREAD].sizes, theirs is not mine, \
            threading.get_ident()
    (_, (q, same, apart, ident)) = run_in_thread(other)
    assert same and apart and ident != threading.get_ident()
    assert list(mine[1000]) == [p]                   # this thread's block stayed its own
    assert pool.allocate_async(1000, 256, PER_THREAD) == p
    pool.deallocate_async(p, 1000, 256, PER_THREAD)
    assert pool.allocation_count() == 0 and pool.free_bytes() == pool.pool_size()


def test_several_devices_keep_the_keyed_entries():
    """With several devices visible the special handles' keys depend on the current device:
    their entries look the key up on each call (no per-thread map is kept)."""
    from hipmr_ctypes import _hip, _stream_order
    from hipmr_ctypes.adaptors import pool as pool_module
    from support import process_runtime
    with process_runtime(_hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})):
        two = PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 20)
        assert two._arena.own is None
        assert all(isinstance(two._arena.free[h], pool_module._Keyed) for h in (0, 1, 2))
        p = two.allocate_async(512, 256, PER_THREAD)
        two.deallocate_async(p, 512, 256, PER_THREAD)
        assert 512 in two._arena.free[_stream_order.stream_key(PER_THREAD)]
        assert two.allocate_async(512, 256, PER_THREAD) == p
        two.deallocate_async(p, 512, 256, PER_THREAD)
        two.release()


# ---- AlignedResource over the package's pool: the pool aligns the blocks itself

@pytest.mark.parametrize("alignment", [512, 4096, 1 << 20])
def test_aligned_over_the_pool_takes_aligned_blocks_of_the_pool(pool, alignment):
    """Nothing over-allocated and nothing recorded by the adaptor: the pool hands out a block
    of the requested size's class, aligned, and its list of such blocks serves the next
    request of that size on that stream (sync, stream 0, a created stream, per-thread)."""
    from support import check_pool_tiles
    a = AlignedResource(pool, alignment)
    s = hmr.Stream()
    for stream in (None, 0, s, hmr.stream_per_thread, PER_THREAD):
        for n in (1, 255, 256, 257, 5000, 70000):
            alloc = (lambda: a.allocate(n)) if stream is None else \
                (lambda: a.allocate_async(n, 256, stream))
            p = alloc()
            assert p % alignment == 0
            assert pool.get_allocated_bytes() == -(-n // 256) * 256   # not n + alignment
            if stream is None:
                a.deallocate(p, n)
            else:
                a.deallocate_async(p, n, 256, stream)
            assert alloc() == p   # its list served it
            if stream is None:
                a.deallocate(p, n)
            else:
                a.deallocate_async(p, n, 256, stream)
    assert pool.allocation_count() == 0 and pool.get_allocated_bytes() == 0
    check_pool_tiles(pool)
    s.close()


def test_aligned_over_the_pool_mixes_with_the_pool_and_the_checked_path(pool):
    """Blocks move between the adaptor and the pool itself either way, wrong frees are
    refused with nothing changed, and requests the pool's lists do not key (past 2**25 - 256
    bytes) are over-allocated as over any upstream."""
    a = AlignedResource(pool, 512)
    p = a.allocate_async(1000, 256, 0)
    with pytest.raises(ValueError):
        a.deallocate_async(p, 999, 256, 0)            # the wrong size: still live
    assert pool.allocation_count() == 1 and pool.get_allocated_bytes() == 1024
    pool.deallocate_async(p, 1000, 256, 0)            # the pool frees the adaptor's block
    with pytest.raises(ValueError):
        a.deallocate_async(p, 1000, 256, 0)           # twice
    q = pool.allocate_async(1000, 256, 0)             # the pool's block (256-aligned)
    a.deallocate_async(q, 1000, 256, 0)               # freed through the adaptor
    assert pool.allocation_count() == 0
    r = pool.allocate(3000, 512)                      # the pool's own aligned requests share
    pool.deallocate(r, 3000, 512)                     # the lists of aligned blocks
    assert a.allocate(3000) == r and r % 512 == 0
    a.deallocate(r, 3000)
    assert pool.allocate(3000, 512) == r              # and back
    pool.deallocate(r, 3000, 512)
    big = (1 << 25) - 255                             # no key: the over-allocating path
    b = a.allocate_async(big, 256, 0)
    assert b % 512 == 0 and pool.get_allocated_bytes() >= big + 256 - 1
    a.deallocate_async(b, big, 256, 0)
    view = pool._fast_view()
    assert _pool_paths(view, 1 << 31, 0, {}, None, None) is not None
    assert _pool_paths(view, 1 << 32, 0, {}, None, None) is None   # over-allocated then
    assert pool.allocation_count() == 0


def test_aligned_over_another_upstream_still_over_allocates():
    a = AlignedResource(hmr.AsyncMemoryResource(), 4096)
    p = a.allocate_async(100, 256, 0)
    assert p % 4096 == 0
    a.deallocate_async(p, 100, 256, 0)
    with pytest.raises(ValueError):
        a.deallocate_async(p, 100, 256, 0)

"""VirtualPoolResource on the emulated platform: one reserved range, pages mapped as the pool
grows and unmapped when fully free (under memory pressure, by release(), by the release
threshold), blocks that coalesce across pages, stream order, and every failure in the middle
(faults injected into each virtual-memory call, an interrupt, threads, bad input).  After each,
the books match the emulator's mappings and nothing leaks."""
from __future__ import annotations

import gc
import pickle
import random
import signal
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes._hip.exceptions import HipError, OutOfMemoryError
from hipmr_ctypes.adaptors import virtual_pool as vp_module
from hipmr_ctypes.adaptors.pool import block_size

from support import failing_nth, no_native_call, process_runtime, recording_events

MiB = 1 << 20
G = 2 * MiB     # the emulated granularity


@pytest.fixture
def emu(emulator):
    """The emulator, checked after the test: no reservation or physical memory left, the
    device's memory all free again."""
    with process_runtime():
        gc.collect()
        free_before = hmr.available_device_memory()[0]
        yield emulator
        emulator.clear_faults()
    gc.collect()
    space = emulator._vspace
    assert space.reservations == {} and space.physicals == {}, "virtual memory leaked"
    assert hmr.available_device_memory()[0] == free_before


@pytest.fixture
def pool(emu):
    made = hmr.VirtualPoolResource()
    yield made
    check_books(made, emu)
    made._space.close()   # (pytest holds the pool until the teardown is over)


def check_books(pool, emu):
    """The pool's books agree with themselves and with the emulator: the mapped runs are
    exactly the pages, every page is mapped in the emulator with access for the device,
    free and live blocks lie in mapped memory without overlapping, and cover it all."""
    arena, space = pool._arena, pool._space
    page = space.page
    pages = set(space.pages)
    assert pool.mapped_bytes == len(pages) * page
    covered = set()
    for start, size in space.runs.items():
        covered.update(range(start, start + size, page))
    assert covered == pages
    r = emu._vspace.reservations[space.base]
    assert {m.ptr for m in r.mappings.values()} == pages
    assert all(m.access.get(0) == 3 for m in r.mappings.values())
    with arena.lock:
        arena._flush_all()
        blocks = sorted([(s, n) for s, n in arena.fsize.items()] +
                        [(p, rounded(block_size(n))) for p, n in arena.live.items()])
    total = 0
    for (s1, n1), (s2, _) in zip(blocks, blocks[1:]):
        assert s1 + n1 <= s2, "blocks overlap"
    for s, n in blocks:
        assert s // page * page in pages and (s + n - 1) // page * page in pages
        total += n
    assert total == pool.mapped_bytes, "free and live blocks do not cover the mapped pages"


def rounded(n):
    return -(-n // 256) * 256


def test_blocks_coalesce_across_pages(pool, emu):
    assert pool.granularity == G and pool.device == 0
    assert hmr.is_async_resource_with(pool, hmr.device_accessible)
    assert pool.reserved_bytes >= 4 * emu.capacity()
    ptrs = [pool.allocate(G) for _ in range(4)]
    assert ptrs == [ptrs[0] + i * G for i in range(4)]          # one range, page after page
    assert pool.mapped_bytes == pool.pool_size() == 4 * G
    check_books(pool, emu)
    for p in ptrs:
        pool.deallocate(p, G)
    whole = pool.allocate(4 * G)           # the four pages' blocks are one block now
    assert whole == ptrs[0] and pool.mapped_bytes == 4 * G
    pool.deallocate(whole, 4 * G)
    # PoolResource keeps each chunk apart: the same pattern maps more
    chunked = hmr.PoolResource(hmr.VirtualMemoryResource())
    parts = [chunked.allocate(G) for _ in range(4)]
    for p in parts:
        chunked.deallocate(p, G)
    big = chunked.allocate(4 * G)
    assert chunked.pool_size() > 4 * G
    chunked.deallocate(big, 4 * G)
    chunked.release()


def test_allocation_from_mapped_memory_makes_no_runtime_call(pool, emu):
    p = pool.allocate(3 * G)
    pool.deallocate(p, 3 * G)
    with no_native_call(emu):
        q = pool.allocate(MiB)
        r = pool.allocate(2 * MiB + 256)
        s = pool.allocate_async(1000, 256, 0)
        pool.deallocate_async(s, 1000, 256, 0)
        pool.deallocate(q, MiB)
        pool.deallocate(r, 2 * MiB + 256)
        t = pool.allocate_async(3 * G, 256, 0)   # (coalesced with the block freed on 0)
        pool.deallocate_async(t, 3 * G, 256, 0)
    assert pool.mapped_bytes == 3 * G


def test_growth_maps_only_what_the_free_neighbour_lacks(pool, emu):
    a = pool.allocate(G + MiB)             # two pages; its second half page stays free
    free = hmr.available_device_memory()[0]
    b = pool.allocate(2 * MiB + MiB)       # the free MiB and one page more, contiguous
    assert b == a + G + MiB and pool.mapped_bytes == 3 * G
    assert free - hmr.available_device_memory()[0] == G
    pool.deallocate(a, G + MiB)
    pool.deallocate(b, 3 * MiB)


def test_maximum_pool_size_unmaps_free_pages_before_running_out(emu):
    pool = hmr.VirtualPoolResource(maximum_pool_size=4 * G)
    assert pool.maximum_pool_size == 4 * G
    a, b, c, d = (pool.allocate(G) for _ in range(4))
    pool.deallocate(a, G)
    pool.deallocate(c, G)                   # two free pages, not adjacent
    e = pool.allocate(2 * G)                # needs a contiguous 4 MiB: a and c are unmapped
    assert pool.mapped_bytes == 4 * G and e not in (a, c)
    check_books(pool, emu)
    with pytest.raises(OutOfMemoryError, match="maximum_pool_size"):
        pool.allocate(G)
    check_books(pool, emu)
    for p, n in ((b, G), (d, G), (e, 2 * G)):
        pool.deallocate(p, n)
    f = pool.allocate(4 * G)
    pool.deallocate(f, 4 * G)
    check_books(pool, emu)
    del pool


def test_pressure_unmaps_about_what_it_lacks_first(emu):
    pool = hmr.VirtualPoolResource(maximum_pool_size=6 * G)
    pages = [pool.allocate(G) for _ in range(6)]
    for i in (0, 2, 4):
        pool.deallocate(pages[i], G)
    e = pool.allocate(2 * G)                 # two pages lacking: the two highest free go
    assert e == pages[5] + G and pool.mapped_bytes == 6 * G
    assert pages[0] in pool._space.pages and pages[2] not in pool._space.pages
    with no_native_call(emu):                # pages[0]'s page still serves
        again = pool.allocate(G)
    assert again == pages[0]
    check_books(pool, emu)
    for p in (again, pages[1], pages[3], pages[5]):
        pool.deallocate(p, G)
    pool.deallocate(e, 2 * G)
    del pool


def test_the_device_running_out_unmaps_free_pages_then_raises(pool, emu):
    cap = emu.capacity()
    with pytest.raises(OutOfMemoryError):
        pool.allocate(cap + G)
    assert pool.mapped_bytes == 0
    a, b, c, d = (pool.allocate(G) for _ in range(4))
    pool.deallocate(a, G)
    pool.deallocate(c, G)                   # two free pages, not adjacent
    hog = hmr.VirtualMemoryResource()
    rest = hmr.available_device_memory()[0] // G * G
    q = hog.allocate(rest)                  # the device is full
    # two contiguous pages are needed: a's and c's are unmapped, two are mapped above d
    e = pool.allocate(2 * G)
    assert e == d + G and pool.mapped_bytes == 4 * G
    with pytest.raises(OutOfMemoryError, match="no room"):
        pool.allocate(G)
    check_books(pool, emu)
    hog.deallocate(q, rest)
    for p, n in ((b, G), (d, G), (e, 2 * G)):
        pool.deallocate(p, n)


def test_release_unmaps_whole_free_pages_only(pool, emu):
    a = pool.allocate(MiB)
    b = pool.allocate(3 * G)
    free = hmr.available_device_memory()[0]
    pool.deallocate(b, 3 * G)
    # b's first half page shares a's page: it stays; the rest goes
    assert pool.release() == 3 * G
    assert pool.mapped_bytes == G
    assert hmr.available_device_memory()[0] - free == 3 * G
    assert pool.release() == 0
    c = pool.allocate(MiB)                  # the half page left, no mapping
    assert c == a + MiB and pool.mapped_bytes == G
    pool.deallocate(a, MiB)
    pool.deallocate(c, MiB)
    assert pool.release() == G and pool.mapped_bytes == 0


def test_release_threshold_trims_before_growing(emu):
    pool = hmr.VirtualPoolResource(release_threshold=2 * G)
    assert pool.release_threshold == 2 * G
    x = pool.allocate(G)
    y = pool.allocate(G)
    pool.deallocate(x, G)                   # a free page below y
    z = pool.allocate(2 * G)                # mapped above y; x's page goes first
    assert pool.mapped_bytes == 3 * G and x not in pool._space.pages
    # the free block a growth extends is kept
    pool.deallocate(z, 2 * G)
    w = pool.allocate(3 * G)
    assert w == z and pool.mapped_bytes == 4 * G
    pool.deallocate(y, G)
    pool.deallocate(w, 3 * G)
    check_books(pool, emu)
    del pool


def test_bad_input_raises_before_any_native_call(pool, emu):
    with no_native_call(emu):
        for bad in (1.5, "2MiB", True):
            with pytest.raises(TypeError):
                hmr.VirtualPoolResource(granularity=bad)
        for bad in (0, -G):
            with pytest.raises(ValueError):
                hmr.VirtualPoolResource(granularity=bad)
        for bad in ("lots", -1, 1.5j):
            with pytest.raises((TypeError, ValueError)):
                hmr.VirtualPoolResource(maximum_pool_size=bad)
            with pytest.raises((TypeError, ValueError)):
                hmr.VirtualPoolResource(release_threshold=bad)
    with pytest.raises(ValueError):
        hmr.VirtualPoolResource(device=-1)
    with pytest.raises(ValueError, match="multiple"):
        hmr.VirtualPoolResource(granularity=G + 4096)
    p = pool.allocate(MiB)
    with no_native_call(emu):
        for args in ((-1,), (1.0,), (MiB, 3)):
            with pytest.raises((TypeError, ValueError)):
                pool.allocate(*args)
        with pytest.raises(ValueError):
            pool.deallocate(p + 256, MiB)
        with pytest.raises(ValueError):
            pool.deallocate(p, 3 * MiB)
        with pytest.raises(TypeError):
            pool.upstream.allocate(MiB)
    pool.deallocate(p, MiB)
    with pytest.raises(TypeError):
        pickle.dumps(pool)
    assert pool == pool and pool != hmr.VirtualPoolResource()
    assert "VirtualPoolResource(device=0" in repr(pool)


def test_no_virtual_memory_is_a_clear_error(emu, monkeypatch):
    monkeypatch.setattr(emu._vspace, "supported", False)
    with pytest.raises(hmr.NotSupportedError):
        hmr.VirtualPoolResource()


def test_a_reservation_refused_is_tried_smaller_then_fails_leaving_nothing(emu):
    emu.inject_failure(code=2, calls="hipMemAddressReserve")
    pool = hmr.VirtualPoolResource()
    assert pool.reserved_bytes == 2 * emu.capacity()
    del pool
    emu.inject_failure(code=2, calls="hipMemAddressReserve", count=3)
    with pytest.raises(OutOfMemoryError, match="address range"):
        hmr.VirtualPoolResource()
    emu.inject_failure(code=2, calls="hipMemAddressReserve")
    with pytest.raises(OutOfMemoryError, match="address range"):
        hmr.VirtualPoolResource(reserve_size="64MiB")     # a size given is tried alone
    pool = hmr.VirtualPoolResource(reserve_size="64MiB", maximum_pool_size="1GiB")
    assert pool.reserved_bytes == 64 << 20
    del pool


def test_buffers_and_data_across_pages(pool):
    bufs = []
    for i in range(6):
        buf = hmr.Buffer(G - 4096 + i * 1000, resource=pool)
        buf.fill(i + 1)
        bufs.append(buf)
    for i, buf in enumerate(bufs):
        assert set(buf.tobytes()) == {i + 1}
    del bufs[::2]
    big = hmr.Buffer(3 * G, resource=pool)
    big.copy_from_host(bytes(range(256)) * (3 * G // 256))
    assert big.tobytes() == bytes(range(256)) * (3 * G // 256)
    for i, buf in zip((1, 3, 5), bufs):
        assert set(buf.tobytes()) == {i + 1}
    del big, buf, bufs
    gc.collect()


# ---- streams -------------------------------------------------------------------------
def test_another_stream_waits_for_the_freeing_stream(pool, monkeypatch):
    calls = recording_events(monkeypatch.setattr)
    p = pool.allocate_async(G, 256, 5)
    assert calls == []                      # new pages: no stream has used them
    pool.deallocate_async(p, G, 256, 5)
    q = pool.allocate_async(G, 256, 9)
    assert q == p and calls == [("record", 5), ("wait", 9)]
    pool.deallocate_async(q, G, 256, 9)
    calls.clear()
    assert pool.release() == G
    assert ("record", 9) in calls and ("synchronize",) in calls
    assert calls.index(("synchronize",)) < len(calls)


def test_pressure_waits_for_the_streams_before_unmapping(emu, monkeypatch):
    pool = hmr.VirtualPoolResource(maximum_pool_size=3 * G)
    order = []
    rt = hmr._hip.get_runtime()
    real_unmap, real_wait = rt.fn.hipMemUnmap, vp_module.wait_all
    monkeypatch.setattr(rt.fn, "hipMemUnmap",
                        lambda *a: order.append("unmap") or real_unmap(*a))
    monkeypatch.setattr(vp_module, "wait_all",
                        lambda events: order.append(("wait", len(events))) or real_wait(events))
    s = hmr.Stream()
    d = pool.allocate_async(G, 256, s)
    e = pool.allocate(G)
    pool.deallocate_async(d, G, 256, s)      # d's page: free, used by stream s
    f = pool.allocate(2 * G)                 # 4 pages would pass the maximum: d's goes first
    assert order == [("wait", 1), "unmap"]
    assert pool.mapped_bytes == 3 * G and f == e + G
    pool.deallocate(e, G)
    pool.deallocate(f, 2 * G)
    check_books(pool, emu)
    s.close()
    del pool


def test_many_streams_with_real_events(pool, emu):
    streams = [hmr.Stream() for _ in range(3)]
    live = []
    for i in range(300):
        s = streams[i % 3]
        n = 1 + (i * 104729) % (3 * MiB)
        if len(live) > 8:
            p, m, _ = live.pop(i % len(live))
            pool.deallocate_async(p, m, 256, streams[(i + 1) % 3])
        live.append((pool.allocate_async(n, 256, s), n, s))
        if i % 50 == 49:
            pool.release()
    starts = sorted((p, rounded(n)) for p, n, _ in live)
    for (p1, n1), (p2, _) in zip(starts, starts[1:]):
        assert p1 + n1 <= p2
    check_books(pool, emu)
    for p, n, s in live:
        pool.deallocate_async(p, n, 256, s)
    pool.release()
    assert pool.mapped_bytes == 0
    for s in streams:
        s.close()


# ---- failures ------------------------------------------------------------------------
@pytest.mark.parametrize("call", ["hipMemCreate", "hipMemMap", "hipMemSetAccess"])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_failed_growth_leaves_nothing_mapped(pool, emu, call, nth):
    """Three growths of one page each (one call of each kind per growth): the nth fails and
    leaves the pool as it was; the others work."""
    rt = hmr._hip.get_runtime()
    real, count = getattr(rt.fn, call), [0]

    def flaky(*args):
        count[0] += 1
        return 2 if count[0] == nth else real(*args)
    got = []
    setattr(rt.fn, call, flaky)
    try:
        for i in range(3):
            if i + 1 == nth:
                with pytest.raises(OutOfMemoryError, match=call):
                    pool.allocate(G)
                assert pool.mapped_bytes == i * G and len(pool._space.pages) == i
                check_books(pool, emu)
            else:
                got.append(pool.allocate(G))
    finally:
        setattr(rt.fn, call, real)
    assert pool.mapped_bytes == 2 * G
    got.append(pool.allocate(G))             # works again
    for p in got:
        pool.deallocate(p, G)
    check_books(pool, emu)


@pytest.mark.parametrize("call", ["hipMemUnmap", "hipMemRelease"])
def test_a_failed_unmap_or_release_keeps_the_books(pool, emu, call):
    keep = hmr.Buffer(MiB, resource=pool)
    keep.fill(9)
    p = pool.allocate(4 * G)
    pool.deallocate(p, 4 * G)
    rt = hmr._hip.get_runtime()
    real, count = getattr(rt.fn, call), [0]

    def flaky(*args):
        count[0] += 1
        return 1 if count[0] == 2 else real(*args)
    setattr(rt.fn, call, flaky)
    try:
        with pytest.raises(HipError, match=call):
            pool.release()
    finally:
        setattr(rt.fn, call, real)
    check_books(pool, emu)
    pool.release()
    assert pool.mapped_bytes == G            # keep's page
    assert set(keep.tobytes()) == {9}
    q = pool.allocate(4 * G)
    pool.deallocate(q, 4 * G)
    del keep
    gc.collect()


def test_faults_in_every_call_keep_the_books_and_the_bytes(pool, emu):
    """Each virtual-memory call, failed at each of its first uses in a cycle of growth,
    frees, release and pressure: the books stay right, the data of the live blocks intact,
    and once the calls work again everything does."""
    calls = ["hipMemCreate", "hipMemMap", "hipMemSetAccess", "hipMemUnmap", "hipMemRelease",
             "hipEventSynchronize", "hipEventRecord"]
    small = hmr.VirtualPoolResource(maximum_pool_size=6 * G)
    keep = hmr.Buffer(MiB, resource=small)
    keep.copy_from_host(bytes(range(256)) * (MiB // 256))
    s = hmr.Stream()
    held = []

    def cycle():
        steps = [lambda: held.append((small.allocate(3 * G), 3 * G)),
                 lambda: held.append((small.allocate_async(G, 256, s), G)),
                 lambda: small.deallocate_async(*held.pop(), 256, s),
                 lambda: small.release(),
                 lambda: held.append((small.allocate(4 * G), 4 * G)),
                 lambda: [small.deallocate(*held.pop()) for _ in range(len(held))]]
        for step in steps:
            try:
                step()
            except (HipError, RuntimeError):
                pass

    rt = hmr._hip.get_runtime()
    for call in calls:
        for nth in (1, 2, 3):
            with failing_nth(rt, call, nth):
                cycle()
            for p, n in held:
                small.deallocate(p, n)
            held.clear()
            check_books(small, emu)
            assert keep.tobytes() == bytes(range(256)) * (MiB // 256), (call, nth)
            small.release()
            assert small.mapped_bytes == G, (call, nth)
            assert not small._space.stray, (call, nth)
    s.close()
    del keep, small
    gc.collect()


def test_an_interrupt_waits_for_the_books(pool, monkeypatch):
    rt = hmr._hip.get_runtime()
    real = rt.fn.hipMemMap

    def interrupted(*args):
        signal.raise_signal(signal.SIGINT)   # the handler runs after the mapping, not here
        return real(*args)
    monkeypatch.setattr(rt.fn, "hipMemMap", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.allocate(3 * G)
    monkeypatch.setattr(rt.fn, "hipMemMap", real)
    assert pool.mapped_bytes == 3 * G        # mapped and free: the allocation never returned
    assert len(pool._space.pages) == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    p = pool.allocate(3 * G)
    pool.deallocate(p, 3 * G)


def test_threads_allocate_free_and_release_together(emu):
    pool = hmr.VirtualPoolResource(maximum_pool_size=24 * G)
    errors = []
    stop = threading.Event()

    def worker(seed):
        rng = random.Random(seed)
        mine = []
        try:
            for _ in range(300):
                if mine and rng.random() < 0.45:
                    p, n, v = mine.pop(rng.randrange(len(mine)))
                    pool.deallocate(p, n)
                else:
                    n = rng.choice((256, 5000, MiB, G + 1, 3 * G))
                    try:
                        p = pool.allocate(n)
                    except OutOfMemoryError:
                        continue
                    mine.append((p, n, seed))
            for p, n, _ in mine:
                pool.deallocate(p, n)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def releaser():
        while not stop.is_set():
            try:
                pool.release()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    rel = threading.Thread(target=releaser)
    rel.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    rel.join()
    assert errors == []
    check_books(pool, emu)
    pool.release()
    assert pool.mapped_bytes == 0
    del pool


def test_the_finalizer_gives_everything_back(emu):
    pool = hmr.VirtualPoolResource()
    pool.allocate(5 * G)
    del pool      # the emu fixture checks that the range and its pages are gone


def test_initial_pool_size_is_mapped_at_once(emu):
    pool = hmr.VirtualPoolResource(initial_pool_size=3 * MiB, maximum_pool_size=8 * MiB)
    assert pool.initial_pool_size == 2 * G == pool.mapped_bytes
    with no_native_call(emu):
        p = pool.allocate(4 * MiB)
        pool.deallocate(p, 4 * MiB)
    with pytest.raises(ValueError, match="exceeds"):
        hmr.VirtualPoolResource(initial_pool_size=5 * G, maximum_pool_size=4 * G)
    del pool


def test_the_environment_names_it(emu, monkeypatch):
    from hipmr_ctypes import _config
    monkeypatch.setenv("HIPMR_DEVICE_RESOURCE",
                       "virtual_pool,pool=4MiB:50%,release_threshold=8MiB,statistics")
    made = _config.default_resource(0)
    pool = made.upstream
    assert isinstance(pool, hmr.VirtualPoolResource)
    assert (pool.mapped_bytes, pool.maximum_pool_size, pool.release_threshold) == (
        4 * MiB, emu.capacity() // 2, 8 * MiB)
    assert _config.describe(1)["detail"] == "StatisticsResource <- VirtualPoolResource"
    monkeypatch.setenv("HIPMR_DEVICE_RESOURCE", "device,release_threshold=1GiB")
    with pytest.raises(ValueError, match="async and virtual_pool only"):
        _config.default_resource(0)
    del made, pool


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_use_under_a_maximum_keeps_every_byte(emu, seed):
    """Allocations of random sizes, on random streams and synchronously, freed in random
    order, with release() now and then, under a maximum that forces unmapping: every block's
    bytes (written when it was handed out) are intact when it is freed, and the books agree."""
    rng = random.Random(seed)
    pool = hmr.VirtualPoolResource(maximum_pool_size=16 * G,
                                   release_threshold=None if seed != 2 else 8 * G)
    streams = [0, hmr.Stream(), hmr.Stream()]
    live = []
    for step in range(200):
        if live and (rng.random() < 0.45 or len(live) > 12):
            p, n, s, value = live.pop(rng.randrange(len(live)))
            view = hmr.Buffer.from_handle(p, n, owner=pool)
            assert set(view.tobytes()) == {value}, (seed, step)
            del view
            if s is None:
                pool.deallocate(p, n)
            else:
                pool.deallocate_async(p, n, 256, s)
        else:
            n = rng.choice((256, 4000, MiB, G, G + 256, 3 * G, 5 * G))
            s = rng.choice(streams)
            try:
                p = pool.allocate(n) if s == 0 else pool.allocate_async(n, 256, s)
            except OutOfMemoryError:
                continue
            value = step % 251 + 1
            view = hmr.Buffer.from_handle(p, n, owner=pool)
            view.fill(value)
            del view
            live.append((p, n, None if s == 0 else s, value))
        if step % 60 == 59:
            pool.release()
        assert pool.mapped_bytes <= 16 * G
    hmr.synchronize()
    check_books(pool, emu)
    for p, n, s, value in live:
        view = hmr.Buffer.from_handle(p, n, owner=pool)
        assert set(view.tobytes()) == {value}
        del view
        pool.deallocate(p, n)
    pool.release()
    assert pool.mapped_bytes == 0
    for s in streams[1:]:
        s.close()
    del pool


def test_a_library_without_the_calls_is_a_clear_error(emu, monkeypatch):
    from hipmr_ctypes._hip.runtime import missing_function
    rt = hmr._hip.get_runtime()
    for name in ("hipMemGetAllocationGranularity", "hipMemAddressReserve"):
        with monkeypatch.context() as m:
            m.setattr(rt.fn, name, missing_function(name, "libamdhip64.so.5"))
            with pytest.raises(hmr.NotSupportedError, match=name):
                hmr.VirtualPoolResource()


def _child_uses_the_pool(pool, ptr, out):
    seen = []
    for attempt in (lambda: pool.allocate(4096), lambda: pool.deallocate(ptr, 4096),
                    lambda: pool.allocate_async(3 * G, 256, 0), lambda: pool.release()):
        try:
            attempt()
            seen.append("allowed")
        except hmr.ForkedChildError:
            seen.append("refused")
        except Exception as exc:  # noqa: BLE001
            seen.append(repr(exc))
    del pool
    gc.collect()                                # its finalizer touches nothing of the parent's
    out.put(seen)


def test_a_forked_child_refuses_the_pool_and_leaves_its_pages(pool):
    import multiprocessing
    keep = hmr.Buffer(MiB, resource=pool)
    keep.fill(4)
    ptr = pool.allocate(4096)
    pool.deallocate(pool.allocate(G), G)        # a free block the child could take
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_child_uses_the_pool, args=(pool, ptr, out))
    proc.start()
    seen = out.get(timeout=120)
    proc.join(120)
    assert proc.exitcode == 0
    assert seen == ["refused"] * 4
    assert set(keep.tobytes()) == {4} and pool.mapped_bytes == 2 * G
    pool.deallocate(ptr, 4096)
    del keep
    gc.collect()


def test_access_set_page_by_page_where_one_call_may_not_span_mappings(pool, emu, monkeypatch):
    rt = hmr._hip.get_runtime()
    real = rt.fn.hipMemSetAccess
    calls = []

    def one_mapping_only(ptr, size, desc, count):
        calls.append(size)
        return 1 if size > pool.granularity else real(ptr, size, desc, count)
    monkeypatch.setattr(rt.fn, "hipMemSetAccess", one_mapping_only)
    p = pool.allocate(3 * G)
    assert calls == [3 * G, G, G, G]
    buf = hmr.Buffer.from_handle(p, 3 * G, owner=pool)
    buf.fill(6)
    assert set(buf.tobytes()) == {6}
    del buf
    pool.deallocate(p, 3 * G)


def test_the_range_goes_with_the_pool_not_with_a_later_collection(emu):
    gc.disable()
    try:
        pool = hmr.VirtualPoolResource()
        pool.allocate(3 * G)
        assert emu._vspace.reservations and emu._vspace.physicals
        del pool                  # no cycle collection: the pool's own death frees it all
        assert emu._vspace.reservations == {} and emu._vspace.physicals == {}
    finally:
        gc.enable()

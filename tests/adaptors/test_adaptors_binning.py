"""BinningResource: requests routed by size; bins must match the upstream."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import device_accessible, host_accessible
from hipmr_ctypes.adaptors import BinningResource, FixedSizeResource, PoolResource

from support import AddressSpaceResource, HostBufferResource


def test_binning_routes_by_size():
    up = AddressSpaceResource()
    big_bin = PoolResource(up)
    b = BinningResource(up, [512, (1 << 20, big_bin)], min_size_exponent=10,
                        max_size_exponent=12)
    sizes = [s for s, _ in b.bins]
    assert sizes == [512, 1024, 2048, 4096, 1 << 20]
    res = b.bin_resources
    assert isinstance(res[512], FixedSizeResource) and res[1 << 20] is big_bin
    p1 = b.allocate(100)      # -> 512 bin
    p2 = b.allocate(3000)     # -> 4096 bin
    p3 = b.allocate(70000)    # -> the pool bin
    p4 = b.allocate(2 << 20)  # -> upstream
    p5 = b.allocate(100, 1024)  # an alignment above 256 -> upstream
    assert res[512].allocation_count() == 1 and res[4096].allocation_count() == 1
    assert big_bin.allocation_count() == 1 and b.allocation_count() == 5
    assert p5 % 1024 == 0
    b.add_bin(1 << 16)
    first = b.bin_resources[1 << 16]
    b.add_bin(1 << 16)                          # as RMM: the existing bin is kept
    b.add_bin(1 << 16, PoolResource(up))
    assert b.bin_resources[1 << 16] is first
    p6 = b.allocate(60000)    # -> the new bin
    assert b.bin_resources[1 << 16].allocation_count() == 1
    # p3 (70000) was allocated by the pool bin and still goes back there
    for p, n, a in ((p1, 100, 256), (p2, 3000, 256), (p3, 70000, 256), (p4, 2 << 20, 256),
                    (p5, 100, 1024), (p6, 60000, 256)):
        b.deallocate(p, n, a)
    assert b.allocation_count() == 0 and big_bin.allocation_count() == 0
    with pytest.raises(ValueError, match="not a live allocation"):
        b.deallocate(p1, 100)
    b.release()
    big_bin.release()
    assert up.outstanding == 0


def test_binning_bins_must_match_the_upstream():
    up = AddressSpaceResource(properties=(device_accessible,))
    with pytest.raises(TypeError, match="lacks the upstream's properties device_accessible"):
        BinningResource(up, [(1024, HostBufferResource((host_accessible,)))])
    with pytest.raises(TypeError, match="async"):
        BinningResource(up, [(1024, HostBufferResource((device_accessible,)))])
    sync = BinningResource(HostBufferResource(), [(1024, HostBufferResource())])
    assert not hmr.is_async_resource(sync)


def test_binning_add_bin_while_threads_allocate_keeps_routes_and_counts_exact():
    # the route cache is emptied by add_bin while other threads fill it: afterwards every
    # size goes to its smallest bin, and every pointer went back to the bin that gave it
    import threading
    import time
    pool = PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 24)
    b = BinningResource(pool, [1 << 16])
    sizes = [100, 300, 700, 1500, 3000, 6000]
    stop = threading.Event()
    errors = []
    rounds = [0]

    def churn():
        try:
            while not stop.is_set():
                rounds[0] += 1   # (a count of progress only: races on it do not matter)
                held = [(b.allocate_async(n, 256, 0), n) for n in sizes]
                held += [(b.allocate(n), n) for n in sizes]
                for i, (p, n) in enumerate(held):
                    if i % 2:
                        b.deallocate_async(p, n, 256, 0)
                    else:
                        b.deallocate(p, n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    def some_rounds():
        seen = rounds[0]
        while rounds[0] < seen + 3 and not errors:
            time.sleep(0.001)

    try:
        for size in (8192, 512, 4096, 1024, 2048):
            some_rounds()           # the threads are allocating: add_bin meets them
            b.add_bin(size)
        some_rounds()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert b.allocation_count() == 0
    res = b.bin_resources
    assert all(r.allocation_count() == 0 for r in res.values())
    for n in sizes:
        p = b.allocate(n)
        smallest = min(s for s in res if s >= n)
        assert res[smallest].allocation_count() == 1, (n, smallest)
        b.deallocate(p, n)
        assert b.allocation_count() == 0
    b.release()
    assert pool.allocation_count() == 0

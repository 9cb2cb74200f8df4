"""TrackingResource: outstanding allocations, reports and stacks, frees it refuses."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes.adaptors import TrackingResource
from hipmr_ctypes.resources import HostMemoryResource

from support import AddressSpaceResource


def test_tracking_outstanding_report_and_stacks():
    tr = TrackingResource(AddressSpaceResource(), capture_stacks=True)
    a = tr.allocate(100)
    b = tr.allocate_async(200, 512, 3)
    out = tr.outstanding()
    assert set(out) == {a, b} and out[b].size == 200 and out[b].alignment == 512
    assert out[b].stream == 3 and out[a].stream is None
    for rec in (out[a], out[b]):    # the innermost frame is the caller's, none of ours
        assert rec.stack[-1].name == "test_tracking_outstanding_report_and_stacks"
    assert tr.get_allocated_bytes() == 300
    text = tr.report()
    assert "2 outstanding allocations, 300 bytes" in text
    assert f"ptr={a:#x} size=100" in text and "on stream 0x3" in text
    assert "test_tracking_outstanding_report_and_stacks" in text   # the captured stack
    rmm_text = tr.get_outstanding_allocations_str()
    assert rmm_text.startswith(f"{a:#x}: 100 B : callstack:\n") and f"\n{b:#x}: 200 B" in rmm_text
    tr.deallocate(a, 100)
    tr.deallocate_async(b, 200, 512, 3)
    assert tr.outstanding() == {} and tr.report().startswith("0 outstanding")
    assert tr.get_outstanding_allocations_str() == ""


def test_tracking_refuses_unknown_pointers_before_the_upstream():
    up = AddressSpaceResource()
    tr = TrackingResource(up)
    direct = up.allocate(64)
    calls = up.calls
    with pytest.raises(ValueError, match="not a live allocation"):
        tr.deallocate(direct, 64)
    p = tr.allocate(64)
    with pytest.raises(ValueError, match="64 bytes, not bytes=65"):
        tr.deallocate(p, 65)
    with pytest.raises(ValueError, match="alignment=256, not alignment=64"):
        tr.deallocate(p, 64, 64)
    assert up.calls == calls + 1 and tr.get_allocated_bytes() == 64
    assert tr.outstanding()[p].stack is None
    tr.deallocate(p, 64)


def test_nested_tracking_counts_independently():
    inner = TrackingResource(HostMemoryResource())
    outer = TrackingResource(inner)
    p = outer.allocate(10)
    q = inner.allocate(20)
    assert outer.get_allocated_bytes() == 10 and inner.get_allocated_bytes() == 30
    outer.deallocate(p, 10)
    inner.deallocate(q, 20)
    assert inner.outstanding() == outer.outstanding() == {}


def test_tracking_restores_its_record_when_the_upstream_refuses():
    class Refusing(AddressSpaceResource):
        def deallocate(self, ptr, bytes, alignment=256):
            raise RuntimeError("no")

    tr = TrackingResource(Refusing())
    p = tr.allocate(32)
    with pytest.raises(RuntimeError):
        tr.deallocate(p, 32)
    assert p in tr.outstanding()


class _Uncomparable:
    def __eq__(self, other):
        raise ValueError("cannot compare")

    __hash__ = None


@pytest.fixture
def pool():
    import hipmr_ctypes as hmr
    with hmr.AsyncMemoryResource() as a:
        p = hmr.PoolResource(a, initial_pool_size=1 << 20)
        yield p
        p.release()


def test_tracking_over_a_package_pool_records_streams_and_stacks(pool):
    import hipmr_ctypes as hmr
    tr = TrackingResource(pool, capture_stacks=True)
    with hmr.Stream() as s:
        ptrs = [tr.allocate(100), tr.allocate_async(200, 64, 0), tr.allocate_async(300, 256, s),
                tr.allocate_async(400, 256, hmr.stream_ref(s))]
        out = tr.outstanding()
        assert [out[p].stream for p in ptrs] == [None, 0, s.handle, s.handle]
        assert [out[p].size for p in ptrs] == [100, 200, 300, 400]
        for p in ptrs:    # the innermost frame is the caller's, none of ours
            assert out[p].stack[-1].name == \
                "test_tracking_over_a_package_pool_records_streams_and_stacks"
        tr.deallocate(ptrs[0], 100)
        tr.deallocate_async(ptrs[1], 200, 64, 0)
        tr.deallocate_async(ptrs[2], 300, 256, s)
        tr.deallocate_async(ptrs[3], 400, 256, s.handle)
        assert tr.outstanding() == {} and pool.allocation_count() == 0


def test_tracking_over_a_package_pool_keeps_its_record_when_a_free_is_refused(pool):
    """Over the package's own resources the fast path claims the record, lets the upstream
    check the arguments and puts the record back when it refuses: a refused free changes
    nothing, whatever the argument."""
    np = pytest.importorskip("numpy")
    tr = TrackingResource(pool)
    p = tr.allocate_async(64, 256, 0)
    q = tr.allocate(1)
    bad_frees = [
        (p, 64.0, 256, 0), (p, 64, 256.0, 0), (p, np.array([64, 64]), 256, 0),
        (p, _Uncomparable(), 256, 0), (p, 64, _Uncomparable(), 0), (p, 64, 256, -1),
        (p, 64, 256, 1 << 64), (p, 64, 256, "0"), (p, 64, 256, True), (p, 65, 256, 0),
        (p, 64, 128, 0), (p + 1, 64, 256, 0), (float(p), 64, 256, 0), (q, True, 256, 0),
        ([p], 64, 256, 0), (_Uncomparable(), 64, 256, 0), (str(p), 64, 256, 0),
    ]
    for args in bad_frees:
        with pytest.raises((TypeError, ValueError)):
            tr.deallocate_async(*args)
        assert set(tr.outstanding()) == {p, q}, args
        # put back under the int it was recorded with, not the pointer the free was given
        assert {type(ptr) for ptr in tr.outstanding()} == {int}, args
        assert pool.allocation_count() == 2, args
        if args[3] == 0:
            with pytest.raises((TypeError, ValueError)):
                tr.deallocate(*args[:3])
            assert {type(ptr) for ptr in tr.outstanding()} == {int}, args
            assert set(tr.outstanding()) == {p, q} and pool.allocation_count() == 2, args
    with pytest.raises(TypeError):
        tr.deallocate(q, True)
    tr.deallocate_async(np.uint64(p), np.int64(64), 256, 0)  # equal and an index: accepted
    tr.deallocate(q, 1)
    assert tr.outstanding() == {} and pool.allocation_count() == 0


def test_tracking_records_an_address_its_package_upstream_hands_out_again(pool):
    """An allocation freed behind the adaptor's back (straight to the pool) and handed out
    again is recorded anew: the package's resources never hand out a live address twice, so
    the address is not live any more."""
    tr = TrackingResource(pool)
    p = tr.allocate(64)
    pool.deallocate(p, 64)
    assert tr.allocate_async(64, 256, 0) == p
    assert tr.outstanding()[p].stream == 0
    tr.deallocate_async(p, 64, 256, 0)
    assert tr.outstanding() == {} and pool.allocation_count() == 0


def test_tracking_over_a_pool_frees_each_pointer_once_when_threads_race(pool):
    """Two threads free the same pointers through the fast path (claim by value, then the
    pool): every pointer is freed exactly once, the loser of each race gets ValueError."""
    import random
    import threading
    tr = TrackingResource(pool)
    ptrs = [tr.allocate_async(64 + i % 3, 256, 0) for i in range(2000)]
    sizes = {p: 64 + i % 3 for i, p in enumerate(ptrs)}
    freed, refused, errors = [], [], []
    start = threading.Barrier(2)

    def race(seed):
        order = ptrs[:]
        random.Random(seed).shuffle(order)
        start.wait()
        for p in order:
            try:
                tr.deallocate_async(p, sizes[p], 256, 0)
                freed.append(p)
            except ValueError:
                refused.append(p)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    import sys
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: many races
    try:
        threads = [threading.Thread(target=race, args=(seed,)) for seed in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert sorted(freed) == sorted(ptrs) and sorted(refused) == sorted(ptrs)
    assert tr.outstanding() == {} and pool.allocation_count() == 0


def test_tracking_records_of_every_shape_read_and_free_alike(pool):
    """Without stacks, an allocation with the default alignment on stream 0 is recorded as
    its size alone; every other one as a full record.  Both read back the same, free with
    sizes equal by value (an int or an integer-like, the same object or not), and refuse
    the same mismatches, keeping the record."""
    import hipmr_ctypes as hmr
    np = pytest.importorskip("numpy")
    tr = TrackingResource(pool)
    with hmr.Stream() as s:
        big = 1 << 20
        made = [(tr.allocate_async(64, 256, 0), 64, 256, 0),
                (tr.allocate_async(big, 256, 0), big, 256, 0),
                (tr.allocate_async(96, 512, 0), 96, 512, 0),
                (tr.allocate_async(128, 256, s.handle), 128, 256, s.handle),
                (tr.allocate(160), 160, 256, None)]
        out = tr.outstanding()
        assert {p: (a.size, a.alignment, a.stream, a.stack) for p, a in out.items()} == \
            {p: (n, al, st, None) for p, n, al, st in made}
        assert {type(a.size) for a in out.values()} == {int}
        assert tr.get_allocated_bytes() == 64 + big + 96 + 128 + 160
        for p, n, al, st in made:
            for bad in ((n + 1, al), (n, al * 2), (n, al // 2)):
                with pytest.raises(ValueError):
                    tr.deallocate_async(p, *bad, 0)
                with pytest.raises(ValueError):
                    tr.deallocate(p, *bad)
                assert tr.outstanding() == out and pool.allocation_count() == len(made)
        p, n, al, st = made[0]
        tr.deallocate_async(p, np.int64(n), al, 0)
        p, n, al, st = made[1]
        tr.deallocate(p, int(str(n)), al)          # equal, another int object
        p, n, al, st = made[2]
        tr.deallocate_async(p, n, np.int64(al), 0)
        p, n, al, st = made[3]
        tr.deallocate_async(p, np.int64(n), al, s.handle)
        p, n, al, st = made[4]
        tr.deallocate_async(p, n, al, 0)
    assert tr.outstanding() == {} and tr.get_allocated_bytes() == 0
    assert pool.allocation_count() == 0


# ---- TrackingResource's RMM text is empty when nothing is outstanding ------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("capture", [False, True])
def test_outstanding_allocations_str(capture):
    tr = hmr.TrackingResource(hmr.DeviceMemoryResource(), capture_stacks=capture)
    assert tr.get_outstanding_allocations_str() == ""
    p = tr.allocate(100)
    q = tr.allocate(300)
    text = tr.get_outstanding_allocations_str()
    assert f"{p:#x}: 100 B" in text and f"{q:#x}: 300 B" in text
    assert ("callstack" in text) is capture
    assert "test_outstanding_allocations_str" in text if capture else text.count("\n") == 2
    tr.deallocate(p, 100)
    assert f"{p:#x}" not in tr.get_outstanding_allocations_str()
    tr.deallocate(q, 300)
    assert not tr.get_outstanding_allocations_str()
    assert tr.report().startswith("0 outstanding allocations")   # the richer text stays

"""The other adaptors one by one: limiting, tracking, failure callback, aligned, prefetch,
callback, binning and fixed-size."""
import os
import sys

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import OutOfMemoryError, device_accessible, host_accessible
from hipmr_ctypes.adaptors import (AlignedResource, BinningResource, CallbackResource,
                                   FailureCallbackResource, FixedSizeResource,
                                   LimitingResource, PoolResource, PrefetchResource,
                                   StatisticsResource, TrackingResource)
from hipmr_ctypes.resources import HostMemoryResource, ManagedMemoryResource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))
from fuzz_pool import AddressSpaceResource, HostBufferResource, recording_events  # noqa: E402


# ------------------------------------------------------------------------------ limiting
def test_limiting_counts_exactly_and_refuses_past_the_limit():
    up = AddressSpaceResource()
    lim = LimitingResource(up, 1000)
    a = lim.allocate(600)
    b = lim.allocate_async(400, 256, 0)
    assert lim.get_allocated_bytes() == 1000 and lim.get_allocation_limit() == lim.limit == 1000
    calls = up.calls
    with pytest.raises(OutOfMemoryError, match="1000 of the limit 1000") as info:
        lim.allocate(1)
    assert isinstance(info.value, MemoryError) and info.value.size == 1
    assert up.calls == calls and lim.get_allocated_bytes() == 1000
    lim.deallocate(a, 600)
    c = lim.allocate(600)
    lim.deallocate(c, 600)
    lim.deallocate_async(b, 400, 256, 0)
    assert lim.get_allocated_bytes() == 0


def test_limiting_calls_an_impossible_size_a_bad_argument():
    lim = LimitingResource(AddressSpaceResource(), 1000)
    with pytest.raises(ValueError, match="bytes"):
        lim.allocate((1 << 64) + 1)
    assert lim.get_allocated_bytes() == 0


def test_limiting_gives_the_reservation_back_when_the_upstream_fails():
    lim = LimitingResource(AddressSpaceResource(capacity=500), 1000)
    with pytest.raises(OutOfMemoryError, match="capacity"):
        lim.allocate(800)
    assert lim.get_allocated_bytes() == 0


# ------------------------------------------------------------------------------ tracking
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


# ---------------------------------------------------------------------- failure callback
def test_failure_callback_retries_while_it_returns_true():
    up = AddressSpaceResource(capacity=1000)
    keep = [up.allocate(800)]
    seen = []

    def callback(nbytes):
        seen.append(nbytes)
        if keep:
            up.deallocate(keep.pop(), 800)   # free something, then ask for a retry
            return True
        return False

    fc = FailureCallbackResource(up, callback)
    p = fc.allocate(500)
    assert seen == [500]
    with pytest.raises(OutOfMemoryError):
        fc.allocate_async(900, 256, 0)
    assert seen == [500, 900]
    fc.deallocate(p, 500)


def test_failure_callback_exception_propagates():
    def callback(nbytes):
        raise KeyError("from the callback")

    fc = FailureCallbackResource(AddressSpaceResource(capacity=10), callback)
    with pytest.raises(KeyError, match="from the callback"):
        fc.allocate(100)


# ------------------------------------------------------------------------------- aligned
def test_aligned_over_an_upstream_capped_at_256():
    class Capped(HostBufferResource):
        def allocate(self, bytes, alignment=256):
            if alignment > 256:
                raise ValueError("alignment above 256")
            return super().allocate(bytes, alignment)

    up = Capped()
    al = AlignedResource(up, alignment=4096, threshold=1000)
    small = al.allocate(100)                    # below the threshold: as asked
    assert small % 256 == 0
    big = al.allocate(5000)
    assert big % 4096 == 0
    huge = al.allocate(10, 1 << 16)             # any alignment the caller asks for
    assert huge % (1 << 16) == 0
    with pytest.raises(ValueError, match="5000 bytes, not bytes=4000"):
        al.deallocate(big, 4000)
    for p, n, a in ((small, 100, 256), (big, 5000, 256), (huge, 10, 1 << 16)):
        al.deallocate(p, n, a)
    assert up.live == {}
    assert al.alignment == 4096 and al.threshold == 1000


# ------------------------------------------------------------------------------ prefetch
def test_prefetch_calls_the_device_helper(monkeypatch):
    from hipmr_ctypes import device
    calls = []
    monkeypatch.setattr(device, "prefetch_if_managed", lambda *a: calls.append(a))
    monkeypatch.setattr(device, "get_device", lambda: 0)
    up = ManagedMemoryResource()
    pf = PrefetchResource(up)
    p = pf.allocate(4096)
    q = pf.allocate_async(100, 256, hmr.stream_ref(0))
    z = pf.allocate(0)
    assert calls == [(p, 4096, 0, 0), (q, 100, 0, 0)] and z == 0
    pf.deallocate(p, 4096)
    pf.deallocate_async(q, 100, 256, 0)
    assert pf.device is None and PrefetchResource(up, 0).device == 0


def test_prefetch_is_not_tried_over_memory_the_host_cannot_reach(monkeypatch):
    from hipmr_ctypes import device
    calls = []
    monkeypatch.setattr(device, "prefetch_if_managed", lambda *a: calls.append(a))
    pf = PrefetchResource(AddressSpaceResource(), device=0)
    pf.deallocate(pf.allocate(100), 100)
    assert calls == []


def test_prefetch_failure_gives_the_memory_back(monkeypatch):
    from hipmr_ctypes import device

    def fail(*a):
        raise hmr.HipError(999, call="hipMemPrefetchAsync")

    monkeypatch.setattr(device, "prefetch_if_managed", fail)
    up = AddressSpaceResource(properties=(hmr.device_accessible, hmr.host_accessible))
    pf = PrefetchResource(up, device=0)
    with pytest.raises(hmr.HipError):
        pf.allocate(100)
    assert up.outstanding == 0


def test_prefetch_on_the_emulated_runtime():
    pf = PrefetchResource(ManagedMemoryResource())
    p = pf.allocate(1 << 16)
    pf.deallocate(p, 1 << 16)


# ------------------------------------------------------------------------------ callback
def test_callback_resource_sync_and_async():
    up = AddressSpaceResource()
    log = []

    def alloc(n, a):
        log.append(("a", n, a))
        return up.allocate(n, a)

    def dealloc(p, n, a):
        log.append(("d", n, a))
        up.deallocate(p, n, a)

    sync = CallbackResource(alloc, dealloc, properties=(device_accessible,))
    assert hmr.is_resource_with(sync, device_accessible)
    assert not hmr.is_async_resource(sync)
    p = sync.allocate(100)
    sync.deallocate(p, 100)
    assert log == [("a", 100, 256), ("d", 100, 256)]
    streams = []
    full = CallbackResource(alloc, dealloc,
                            lambda n, a, s: streams.append(s) or up.allocate(n, a),
                            lambda p, n, a, s: streams.append(s) or up.deallocate(p, n, a))
    assert hmr.is_async_resource(full)
    q = full.allocate_async(64, 256, hmr.stream_ref(7))
    full.deallocate_async(q, 64, 256, 7)
    assert streams == [7, 7]                     # streams arrive as int handles
    assert full == CallbackResource(*full.functions) and full != sync
    pool = PoolResource(sync)                    # usable as an upstream
    r = pool.allocate(10)
    pool.deallocate(r, 10)


def test_callback_result_must_be_an_address():
    cb = CallbackResource(lambda n, a: "nope", lambda p, n, a: None)
    with pytest.raises(TypeError, match="pointer returned"):
        cb.allocate(10)


# ------------------------------------------------------------------------------- binning
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
    with pytest.raises(ValueError, match="already a bin"):
        b.add_bin(1 << 16)
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


# ---------------------------------------------------------------------------- fixed size
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


@pytest.mark.parametrize("make", [
    lambda up: FixedSizeResource(up, block_size=512, blocks_to_preallocate=2),
    lambda up: BinningResource(up, bins=[512])], ids=["fixed-size", "binning"])
@pytest.mark.parametrize("stream", [None, 0])
def test_a_free_with_an_alignment_never_given_out_is_refused(make, stream):
    """Blocks come with an alignment of 256 at most: a free that claims 512 is a wrong
    argument, refused before anything changes (the block stays live and frees normally)."""
    r = make(AddressSpaceResource())
    p = r.allocate(300) if stream is None else r.allocate_async(300, 256, stream)
    with pytest.raises(ValueError, match="alignment=512"):
        if stream is None:
            r.deallocate(p, 300, 512)
        else:
            r.deallocate_async(p, 300, 512, stream)
    if stream is None:
        r.deallocate(p, 300, 256)
    else:
        r.deallocate_async(p, 300, 256, stream)
    with pytest.raises(ValueError, match="already deallocated|not a live"):
        r.deallocate(p, 300)


@pytest.mark.parametrize("make", [TrackingResource, lambda up: BinningResource(up, bins=[66]),
                                  lambda up: BinningResource(up, bins=[8]),
                                  lambda up: AlignedResource(PoolResource(up), 1024)],
                         ids=["tracking", "binning-bins", "binning-upstream", "aligned"])
def test_two_threads_freeing_the_same_pointers_free_each_once(make):
    """The claim of a free is one atomic dict.pop: of two threads freeing the same pointers,
    exactly one frees each, the other gets ValueError, and the upstream sees each free once."""
    import threading
    up = AddressSpaceResource()
    tr = make(up)
    ptrs = [tr.allocate(64 + i % 7) for i in range(3000)]
    sizes = {p: 64 + i % 7 for i, p in enumerate(ptrs)}
    freed, refused = [], []

    def free_all():
        for p in ptrs:
            try:
                tr.deallocate(p, sizes[p])
                freed.append(p)
            except ValueError:
                refused.append(p)

    threads = [threading.Thread(target=free_all) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(freed) == sorted(ptrs) and sorted(refused) == sorted(ptrs)
    if isinstance(tr, TrackingResource):
        assert tr.outstanding() == {}
    elif isinstance(tr, BinningResource):
        assert tr.allocation_count() == 0
    under = tr.upstream_resource()
    for r in (tr, getattr(under, "resource", under)):
        if hasattr(r, "release"):
            r.release()
    assert up.outstanding == 0

"""PrefetchResource: every new allocation prefetched; the memory given back when the
prefetch fails."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer
from hipmr_ctypes.adaptors import PrefetchResource
from hipmr_ctypes.resources import ManagedMemoryResource

from support import AddressSpaceResource


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


def test_prefetch_on_the_emulated_runtime(monkeypatch):
    from hipmr_ctypes import _hip, device
    rt = _hip.get_runtime()
    if rt.platform != "emulated":
        pytest.skip("needs HIPMR_PLATFORM=emulated")
    seen = []
    real = device.prefetch_if_managed

    def spy(*args):
        done = real(*args)
        seen.append((args[0], args[1], done))
        return done

    monkeypatch.setattr(device, "prefetch_if_managed", spy)
    before = rt.emulator.live_allocations()
    pf = PrefetchResource(ManagedMemoryResource())
    p = pf.allocate(1 << 16)
    assert seen == [(p, 1 << 16, True)]   # prefetched, all of it
    assert rt.emulator.live_allocations().count == before.count + 1
    pf.deallocate(p, 1 << 16)
    assert rt.emulator.live_allocations() == before


# ---- RMM's behaviours: PrefetchResource over memory that is not managed is a no-op ----------
def _resources():
    return {
        "device": lambda: hmr.DeviceMemoryResource(),
        "pool": lambda: hmr.PoolResource(hmr.DeviceMemoryResource(), 1 << 20),
        "managed": lambda: hmr.ManagedMemoryResource(),
        "managed pool": lambda: hmr.PoolResource(hmr.ManagedMemoryResource(), 1 << 20),
        "pinned": lambda: hmr.PinnedMemoryResource(),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(_resources()))
def test_prefetch_resource_over_any_memory(kind):
    up = _resources()[kind]()
    pf = hmr.PrefetchResource(up)
    with hmr.Stream() as s:
        for size in (1, 256, 1 << 20):
            p = pf.allocate(size)
            q = pf.allocate_async(size, 256, s)
            assert p and q and p != q
            pf.deallocate(p, size)
            pf.deallocate_async(q, size, 256, s)
        s.synchronize()
    buf = Buffer(4096, resource=pf)  # as the current resource would be used
    buf.copy_from_host(b"\x01" * 4096)
    assert buf.tobytes() == b"\x01" * 4096
    buf.close()


@pytest.mark.gpu
def test_prefetch_resource_as_the_current_resource():
    previous = hmr.get_current_device_resource()
    hmr.set_current_device_resource(hmr.PrefetchResource(previous))
    try:
        with Buffer(1000) as buf:
            buf.memset(7)
            assert buf.tobytes() == b"\x07" * 1000
    finally:
        hmr.set_current_device_resource(previous)


def test_prefetch_leaves_no_error_behind(emulator):
    from hipmr_ctypes import _hip
    rt = _hip.get_runtime()
    pf = hmr.PrefetchResource(hmr.PinnedMemoryResource())
    p = pf.allocate(64)
    assert rt.fn.hipGetLastError() == 0   # the refused prefetch was cleared
    pf.deallocate(p, 64)

"""PrefetchResource: every new allocation prefetched; the memory given back when the
prefetch fails."""

import pytest

import hipmr_ctypes as hmr
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
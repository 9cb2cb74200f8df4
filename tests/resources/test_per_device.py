"""The per-device resource: defaults, setting (with checks), restoring, threads."""
from __future__ import annotations

import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes.resources import (AsyncMemoryResource, DeviceMemoryResource,
                                    HostMemoryResource, PinnedMemoryResource,
                                    get_current_device_resource, get_per_device_resource,
                                    per_device, set_current_device_resource,
                                    set_per_device_resource)

from support import process_runtime


@pytest.fixture(autouse=True)
def clean_table():
    """Each test starts from an empty table and leaves the previous one as it was."""
    with process_runtime():
        yield


class SyncOnly:
    """A synchronous resource: no allocate_async."""
    properties = (hmr.device_accessible,)

    def allocate(self, bytes, alignment=256):
        return 0

    def deallocate(self, ptr, bytes, alignment=256):
        pass

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


def test_default_is_a_device_resource_made_once():
    r = get_current_device_resource()
    assert isinstance(r, DeviceMemoryResource) and r.device == hmr.get_device()
    assert get_current_device_resource() is r
    assert get_per_device_resource(hmr.get_device()) is r
    assert get_per_device_resource(hmr.Device(hmr.get_device())) is r


def test_set_returns_previous_and_restores():
    default = get_current_device_resource()
    pinned = PinnedMemoryResource()
    assert set_current_device_resource(pinned) is default
    assert get_current_device_resource() is pinned
    assert get_per_device_resource(0) is pinned
    with AsyncMemoryResource.from_default_pool() as a:
        assert set_per_device_resource(0, a) is pinned
        assert get_current_device_resource() is a
    assert set_current_device_resource(default) is a
    assert get_current_device_resource() is default


def test_set_before_any_get_returns_the_default():
    previous = set_per_device_resource(0, PinnedMemoryResource())
    assert isinstance(previous, DeviceMemoryResource) and previous.device == 0


def test_set_accepts_refs():
    ref = hmr.async_resource_ref[hmr.device_accessible](PinnedMemoryResource())
    set_current_device_resource(ref)
    assert get_current_device_resource() is ref


@pytest.mark.parametrize("bad,missing", [
    (object(), "async resource"),
    (SyncOnly(), "async resource"),
    (DeviceMemoryResource, "async resource"),   # a class, not an instance
    (None, "async resource"),
    (HostMemoryResource(), "device_accessible"),
    (hmr.async_resource_ref(HostMemoryResource()), "device_accessible"),
])
def test_set_rejects_what_lacks_something(bad, missing):
    before = get_current_device_resource()
    with pytest.raises(TypeError, match=missing):
        set_current_device_resource(bad)
    with pytest.raises(TypeError, match=missing):
        set_per_device_resource(0, bad)
    assert get_current_device_resource() is before


def test_bad_device():
    with pytest.raises(TypeError, match="device"):
        get_per_device_resource("0")
    with pytest.raises(ValueError, match="out of range"):
        get_per_device_resource(hmr.device_count())
    with pytest.raises(ValueError, match="out of range"):
        set_per_device_resource(-1, PinnedMemoryResource())


def test_threads_see_one_default():
    seen = []
    barrier = threading.Barrier(8)

    def work():
        barrier.wait()
        seen.append(get_current_device_resource())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(r is seen[0] for r in seen)


def test_threads_setting_concurrently():
    resources = [PinnedMemoryResource(f) for f in (0, 1, 2, 3)]
    previous = []
    barrier = threading.Barrier(len(resources))

    def work(r):
        barrier.wait()
        previous.append(set_per_device_resource(0, r))

    threads = [threading.Thread(target=work, args=(r,)) for r in resources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = get_per_device_resource(0)
    # every setting replaced exactly one other: the previous ones and the final one are
    # the default plus all four, each once
    chain = previous + [final]
    assert sorted(map(id, chain)) == sorted(set(map(id, chain)))
    assert final in resources and sum(isinstance(p, DeviceMemoryResource) for p in previous) == 1


def test_lock_not_held_while_making_the_default(monkeypatch):
    from hipmr_ctypes import _config
    made = []
    real = _config.default_resource

    def make(device):
        assert not per_device._lock.locked()
        made.append(device)
        return real(device)

    monkeypatch.setattr(_config, "default_resource", make)
    monkeypatch.setenv(_config.VARIABLE, "device")     # unset, _config is not consulted
    get_current_device_resource()
    assert made == [hmr.get_device()]


@pytest.fixture
def two_devices(emulator):
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(rt):
        yield rt


def test_per_device_with_two_devices(two_devices):
    r0, r1 = get_per_device_resource(0), get_per_device_resource(1)
    assert r0.device == 0 and r1.device == 1 and r0 != r1
    with hmr.Device(1):
        assert get_current_device_resource() is r1
    assert get_current_device_resource() is r0
    with pytest.raises(ValueError, match="device 1"):
        set_per_device_resource(0, DeviceMemoryResource(1))
    with pytest.raises(ValueError, match="device 0"):
        set_per_device_resource(1, AsyncMemoryResource.from_default_pool(0))
    a1 = AsyncMemoryResource.from_default_pool(1)
    assert set_per_device_resource(1, a1) is r1
    with hmr.Device(1):
        assert get_current_device_resource() is a1
    assert get_current_device_resource() is r0


@pytest.mark.gpu
def test_gpu_per_device(gpu_runtime):
    r = get_current_device_resource()
    assert isinstance(r, DeviceMemoryResource)
    p = r.allocate(1 << 20)
    r.deallocate(p, 1 << 20)
    with AsyncMemoryResource() as a:
        set_current_device_resource(a)
        from hipmr_ctypes.buffer import Buffer
        with Buffer(4096) as b:
            assert b.resource is a
            b.copy_from_host(bytes(range(256)) * 16)
            assert b.tobytes() == bytes(range(256)) * 16
        set_current_device_resource(r)

"""DeviceMemoryResource(fine_grained=..., uncached=...): AMD's hipExtMallocWithFlags."""
import ctypes
import pickle

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip

from support import process_runtime


def _spy(monkeypatch, rt, name):
    calls = []
    real = getattr(rt.fn, name)
    monkeypatch.setattr(rt.fn, name, lambda *a: calls.append(a[1:]) or real(*a))
    return calls


@pytest.mark.parametrize("kwargs, flags", [
    ({"fine_grained": True}, 1),
    ({"uncached": True}, 3),
    ({"fine_grained": True, "uncached": True}, 3),
])
def test_the_flags_reach_the_runtime(monkeypatch, emulator, kwargs, flags):
    rt = _hip.get_runtime()
    calls = _spy(monkeypatch, rt, "hipExtMallocWithFlags")
    freed = []
    real_free = rt.fn.hipFree
    monkeypatch.setattr(rt.fn, "hipFree",
                        lambda ptr: freed.append(ctypes.c_void_p(ptr).value) or real_free(ptr))
    mr = hmr.DeviceMemoryResource(**kwargs)
    assert mr.fine_grained and mr.uncached == (flags == 3)
    p = mr.allocate(4096)
    assert calls == [(4096, flags)]
    buf = hmr.Buffer.from_host(b"fine" * 100, resource=mr)
    assert buf.tobytes() == b"fine" * 100
    buf.close()
    mr.deallocate(p, 4096)
    assert p in freed        # given back to the runtime (counting every live allocation would
    #                          also count what other tests left to the collector)


def test_plain_memory_still_comes_from_hip_malloc(monkeypatch, emulator):
    rt = _hip.get_runtime()
    calls = _spy(monkeypatch, rt, "hipExtMallocWithFlags")
    mr = hmr.DeviceMemoryResource()
    assert not mr.fine_grained and not mr.uncached
    mr.deallocate(mr.allocate(256), 256)
    assert calls == []


def test_equality_repr_and_pickling():
    plain, fine, uncached = (hmr.DeviceMemoryResource(), hmr.DeviceMemoryResource(
        fine_grained=True), hmr.DeviceMemoryResource(uncached=True))
    assert plain != fine != uncached and plain != uncached
    assert fine == hmr.DeviceMemoryResource(0, fine_grained=True)
    assert hash(fine) == hash(hmr.DeviceMemoryResource(fine_grained=True))
    assert repr(plain) == "DeviceMemoryResource(device=0)"
    assert repr(fine) == "DeviceMemoryResource(device=0, fine_grained=True)"
    assert repr(uncached) == "DeviceMemoryResource(device=0, uncached=True)"
    for mr in (plain, fine, uncached):
        assert pickle.loads(pickle.dumps(mr)) == mr


@pytest.mark.parametrize("kwargs", [{"fine_grained": 1}, {"uncached": None}])
def test_bad_flags_are_refused(kwargs):
    with pytest.raises(TypeError):
        hmr.DeviceMemoryResource(**kwargs)


def test_the_error_names_the_call(emulator):
    mr = hmr.DeviceMemoryResource(fine_grained=True)
    emulator.inject_failure(2, calls="hipExtMallocWithFlags")
    with pytest.raises(hmr.OutOfMemoryError) as info:
        mr.allocate(4096)
    assert info.value.call == "hipExtMallocWithFlags"


def test_uncached_needs_hip_5_5(emulator):
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_VERSION": "5.2.3"})
    with process_runtime(rt):
        fine = hmr.DeviceMemoryResource(fine_grained=True)
        fine.deallocate(fine.allocate(256), 256)
        with pytest.raises(hmr.NotSupportedError, match="5.5"):
            hmr.DeviceMemoryResource(uncached=True)


def test_a_runtime_without_the_call(emulator):
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_MISSING": "hipExtMallocWithFlags"})
    with process_runtime(rt):
        with pytest.raises(hmr.NotSupportedError, match="AMD"):
            hmr.DeviceMemoryResource(fine_grained=True)
        hmr.DeviceMemoryResource()   # plain memory needs no such call


def test_the_nvidia_platform_refuses(monkeypatch, emulator):
    rt = _hip.get_runtime()
    monkeypatch.setattr(rt, "platform", "nvidia")
    calls = _spy(monkeypatch, rt, "hipExtMallocWithFlags")
    with pytest.raises(hmr.NotSupportedError, match="AMD"):
        hmr.DeviceMemoryResource(fine_grained=True)
    assert calls == []


@pytest.mark.gpu
def test_fine_grained_on_a_gpu(gpu_runtime):
    if gpu_runtime.platform == "nvidia":
        with pytest.raises(hmr.NotSupportedError):
            hmr.DeviceMemoryResource(fine_grained=True)
        with pytest.raises(hmr.NotSupportedError):
            hmr.DeviceMemoryResource(uncached=True)
        return
    for mr in (hmr.DeviceMemoryResource(fine_grained=True),
               hmr.DeviceMemoryResource(uncached=True)):
        buf = hmr.Buffer.from_host(bytes(range(256)) * 64, resource=mr)
        assert buf.tobytes() == bytes(range(256)) * 64
        buf.close()

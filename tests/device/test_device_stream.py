"""Device, Stream and Event: on the emulated platform, and (marked gpu) on a real GPU."""
import ctypes
import gc

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip


def test_platform_and_versions():
    assert hmr.platform() in ("amd", "nvidia", "emulated")
    v = hmr.runtime_version()
    assert len(v) == 3 and all(isinstance(x, int) for x in v)
    assert len(hmr.driver_version()) == 3


def test_device_basics():
    n = hmr.device_count()
    assert n >= 1
    d = hmr.Device(0)
    assert d.id == 0 and int(d) == 0 and d == hmr.Device(0) and hash(d) == hash(hmr.Device(0))
    assert isinstance(d.name, str) and d.name
    free, total = d.memory_info()
    assert 0 < free <= total
    assert d.attribute("warp_size") in (32, 64)
    assert d.attribute(87) == d.attribute("warp_size")
    assert isinstance(d.supports_memory_pools, bool)
    assert isinstance(d.supports_managed_memory, bool)
    assert "Device 0" in repr(d)


def test_device_bad_arguments():
    with pytest.raises(TypeError, match="device"):
        hmr.Device("0")
    with pytest.raises(TypeError):
        hmr.Device(1.0)
    with pytest.raises(TypeError):
        hmr.Device(True)
    with pytest.raises(ValueError, match="out of range"):
        hmr.Device(hmr.device_count())
    with pytest.raises(ValueError, match="out of range"):
        hmr.Device(-1)
    with pytest.raises(ValueError, match="unknown device attribute"):
        hmr.Device(0).attribute("no_such_thing")
    with pytest.raises(TypeError):
        hmr.Device(0).attribute(1.5)


def test_device_context_restores_on_error():
    before = hmr.get_device()
    last = hmr.device_count() - 1
    with pytest.raises(RuntimeError):
        with hmr.Device(last):
            assert hmr.get_device() == last
            raise RuntimeError("boom")
    assert hmr.get_device() == before
    hmr.set_device(before)
    with pytest.raises(ValueError):
        hmr.set_device(99)
    assert hmr.get_device() == before


def test_stream_lifecycle():
    s = hmr.Stream()
    h = s.handle
    assert h not in (0, 1, 2)
    assert s.ref == hmr.stream_ref(h) and s.ref.get() == h
    assert s.__hip_stream__() == (0, h) and s.__cuda_stream__() == (0, h)
    assert hmr.stream_ref(s).get() == h
    s.synchronize()
    assert s.query() is True
    assert isinstance(s.priority, int) and s.flags == 0 and s.device == hmr.get_device()
    s.close()
    s.close()  # idempotent
    assert s.closed
    for use in (lambda: s.handle, s.synchronize, s.query, lambda: s.ref, s.__hip_stream__):
        with pytest.raises(ValueError, match="closed"):
            use()


def test_stream_flags_priority_and_context_manager():
    with hmr.Stream(flags=1, priority=-1) as s:
        assert s.flags == 1
        out = ctypes.c_uint()
        rt = _hip.get_runtime()
        rt.check(rt.fn.hipStreamGetFlags(s.handle, out), "hipStreamGetFlags")
        assert out.value & 1
    assert s.closed


def test_stream_bad_arguments():
    with pytest.raises(ValueError, match="flags"):
        hmr.Stream(flags=5)
    with pytest.raises(TypeError, match="flags"):
        hmr.Stream(flags="1")
    with pytest.raises(TypeError, match="priority"):
        hmr.Stream(priority=0.5)
    with pytest.raises(ValueError):
        hmr.Stream(device=42)


def test_stream_finalizer_destroys_once():
    s = hmr.Stream()
    h = s.handle
    del s
    gc.collect()
    rt = _hip.get_runtime()
    if rt.platform == "emulated":  # the real runtimes may crash on a destroyed handle
        assert rt.fn.hipStreamDestroy(h) != 0


def test_event_record_query_elapsed():
    with hmr.Stream() as s:
        a, b = hmr.Event(), hmr.Event()
        assert a.record(s) is a
        b.record(s)
        b.synchronize()
        assert a.query() and b.query()
        ms = a.elapsed_time(b)
        assert ms >= 0.0
        s.wait_event(a)
        hmr.wait_event(0, b)
        a.close(); a.close(); b.close()
        with pytest.raises(ValueError, match="closed"):
            a.record(s)


def test_event_bad_arguments():
    with pytest.raises(ValueError):
        hmr.Event(flags=64)
    with pytest.raises(TypeError):
        hmr.Event(flags=None)
    e = hmr.Event(flags=2)
    with pytest.raises(ValueError, match="disable timing"):
        e.elapsed_time(hmr.Event())
    with pytest.raises(TypeError):
        e.elapsed_time("x")
    with pytest.raises(TypeError):
        hmr.wait_event(0, "not an event")
    with pytest.raises(TypeError):
        e.record(None)
    e.close()


def test_not_ready_surfaces(emulator):
    with hmr.Stream() as s:
        emulator.set_stream_busy(s.handle, 1)
        assert s.query() is False
        s.synchronize()
        assert s.query() is True


def test_stream_creation_failure_leaves_nothing(emulator):
    emulator.inject_failure(code=2, count=1, calls={"hipStreamCreateWithPriority"})
    with pytest.raises(hmr.OutOfMemoryError):
        hmr.Stream()
    with hmr.Stream() as s:
        assert s.query()


# ---- real GPU ---------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_devices_and_memory(gpu_runtime):
    n = hmr.device_count()
    assert n >= 1
    for i in range(n):
        d = hmr.Device(i)
        free, total = d.memory_info()
        assert total > (1 << 30) and 0 < free <= total
        assert d.name
        assert d.attribute("compute_capability_major") >= 1
        assert d.supports_memory_pools
    assert gpu_runtime.runtime_version()[0] >= 5


@pytest.mark.gpu
def test_gpu_malloc_memcpy_round_trip(gpu_runtime):
    fn = gpu_runtime.fn
    n = 64 << 20
    src = (ctypes.c_ubyte * n).from_buffer(bytearray((i * 7 + 3) % 256 for i in range(n)))
    dst = (ctypes.c_ubyte * n)()
    a, b = ctypes.c_void_p(), ctypes.c_void_p()
    gpu_runtime.check(fn.hipMalloc(a, n), "hipMalloc")
    gpu_runtime.check(fn.hipMalloc(b, n), "hipMalloc")
    try:
        gpu_runtime.check(fn.hipMemcpy(a.value, ctypes.addressof(src), n, 1), "hipMemcpy")
        with hmr.Stream() as s:
            gpu_runtime.check(fn.hipMemcpyAsync(b.value, a.value, n, 3, s.handle), "hipMemcpyAsync")
            s.synchronize()
        gpu_runtime.check(fn.hipMemcpy(ctypes.addressof(dst), b.value, n, 2), "hipMemcpy")
        assert bytes(dst) == bytes(src)
    finally:
        fn.hipFree(a.value)
        fn.hipFree(b.value)


@pytest.mark.gpu
def test_gpu_out_of_memory_is_clear(gpu_runtime):
    out = ctypes.c_void_p()
    total = hmr.Device(0).memory_info()[1]
    st = gpu_runtime.fn.hipMalloc(out, total * 4)
    assert st != 0
    err = gpu_runtime.error(st, "hipMalloc", size=total * 4, device=0)
    assert isinstance(err, hmr.OutOfMemoryError) and isinstance(err, MemoryError)
    assert str(total * 4) in str(err)
    gpu_runtime.fn.hipGetLastError()  # clear CUDA's sticky-free last error


@pytest.mark.gpu
def test_gpu_streams_events(gpu_runtime):
    with hmr.Stream(flags=1, priority=-1) as s, hmr.Event() as a, hmr.Event() as b:
        a.record(s)
        b.record(s)
        b.synchronize()
        assert a.elapsed_time(b) >= 0.0
        assert s.query()
        assert s.priority <= 0
        try:
            assert s.ref.device() == hmr.get_device()
        except hmr.NotSupportedError:
            pass


@pytest.mark.gpu
def test_gpu_attribute_map_matches_cuda_bindings(gpu_runtime):
    if gpu_runtime.platform != "nvidia":
        pytest.skip("nvidia mapping only")
    runtime = pytest.importorskip("cuda.bindings.runtime")
    from hipmr_ctypes._hip.nvidia import ATTRIBUTE_MAP
    names = {23: "cudaDevAttrComputeCapabilityMajor", 61: "cudaDevAttrComputeCapabilityMinor",
             63: "cudaDevAttrMultiProcessorCount", 87: "cudaDevAttrWarpSize",
             88: "cudaDevAttrMemoryPoolsSupported", 24: "cudaDevAttrManagedMemory",
             9: "cudaDevAttrConcurrentManagedAccess", 85: "cudaDevAttrUnifiedAddressing",
             67: "cudaDevAttrPciBusId", 91: "cudaDevAttrMemoryPoolSupportedHandleTypes",
             16: "cudaDevAttrIntegrated", 3: "cudaDevAttrCanMapHostMemory",
             19: "cudaDevAttrL2CacheSize", 56: "cudaDevAttrMaxThreadsPerBlock"}
    for hip, cuda_name in names.items():
        assert ATTRIBUTE_MAP[hip] == int(getattr(runtime.cudaDeviceAttr, cuda_name)), cuda_name


def test_device_count_is_zero_without_a_driver(monkeypatch):
    """hipErrorNoDevice and hipErrorInsufficientDriver (libcudart with no driver) mean 0."""
    rt = _hip.get_runtime()
    for code in (100, 35):
        monkeypatch.setattr(rt.fn, "hipGetDeviceCount", lambda out, code=code: code)
        assert hmr.device_count() == 0
    monkeypatch.setattr(rt.fn, "hipGetDeviceCount", lambda out: 3)  # hipErrorNotInitialized
    with pytest.raises(hmr.HipError) as info:
        hmr.device_count()
    assert info.value.code == 3


def test_with_one_device_visible_entering_it_asks_the_runtime_nothing(monkeypatch):
    """One device visible: it is the current one, so the copies' and memsets' device switch
    makes no runtime call at all."""
    from hipmr_ctypes import _hip
    from hipmr_ctypes.device import _NO_SWITCH, on_device_or_current
    if hmr.device_count() != 1:
        pytest.skip(f"needs exactly one visible device ({hmr.device_count()} here)")
    rt = _hip.get_runtime()
    from support import spy_runtime_calls
    calls = spy_runtime_calls(monkeypatch, rt, "hipGetDevice", "hipSetDevice")
    assert on_device_or_current(0) is _NO_SWITCH
    buf = hmr.Buffer(4096, resource=hmr.DeviceMemoryResource())
    calls.clear()
    buf.memset(3)
    buf.copy_from_host(bytes(4096))
    assert calls == []
    buf.close()

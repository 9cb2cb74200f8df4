"""Several devices in one process: peer access, copies between devices, the device of memory
behind adaptors, per-device pools driven from threads.

Every test runs twice: on a two-device emulated runtime (CI), and marked ``gpu`` +
``multi_gpu`` on the real platform with two GPUs, where it checks that the runtime behaves as
the emulation says (the emulated rules are only worth what this second run confirms).
"""
import ctypes
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.types import hipMemcpyDefault
from hipmr_ctypes._memory_query import memory_device

from support import process_runtime

REAL = pytest.param("real", marks=[pytest.mark.gpu, pytest.mark.multi_gpu])


@pytest.fixture(params=["emulated", REAL])
def rt(request):
    """The runtime of the test: a fresh two-device emulated one (made process-wide for the
    test), or the real one (two GPUs, checked by the ``multi_gpu`` marker)."""
    if request.param == "real":
        with process_runtime() as real:
            yield real
        return
    emulated = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2",
                                                    "HIPMR_EMULATED_MEMORY": "256MiB"})
    with process_runtime(emulated):
        yield emulated


def _resource(kind, device):
    if kind == "pool":
        return hmr.AsyncMemoryResource(device)
    if kind == "malloc":
        return hmr.DeviceMemoryResource(device)
    if kind == "pool_adaptor":
        return hmr.PoolResource(hmr.DeviceMemoryResource(device), initial_pool_size=1 << 20)
    raise AssertionError(kind)


def _pattern(n, seed=0):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


KINDS = ["pool", "malloc", "pool_adaptor"]


# ---- the runtime's own rules -----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pool", "malloc"])
def test_plain_copy_between_devices_pool_memory_is_refused_and_peer_copy_works(rt, kind):
    """hipMemcpy between memory-pool memory of two devices (no access granted) is
    hipErrorInvalidValue; the peer copy of the same bytes works for pool and hipMalloc
    memory."""
    n = 4096
    src = hmr.Buffer.from_host(_pattern(n), resource=_resource(kind, 0))
    dst = hmr.Buffer(n, resource=_resource(kind, 1))
    dst.memset(0)
    if kind == "pool":
        st = rt.fn.hipMemcpy(dst.ptr, src.ptr, n, hipMemcpyDefault)
        assert rt.hip_code(st) == 1, f"hipMemcpy between devices returned {st}"
        rt.clear_last_error()
        assert dst.tobytes() == bytes(n)   # nothing was copied
    assert rt.fn.hipMemcpyPeer(dst.ptr, 1, src.ptr, 0, n) == 0
    hmr.Device(1).synchronize()
    assert dst.tobytes() == _pattern(n)
    with hmr.Stream() as s:
        dst.memset(0)
        assert rt.fn.hipMemcpyPeerAsync(dst.ptr, 1, src.ptr, 0, n, s.handle) == 0
        s.synchronize()
    assert dst.tobytes() == _pattern(n)


def test_peer_copy_checks_its_devices(rt):
    a = hmr.Buffer(256, resource=hmr.DeviceMemoryResource(0))
    b = hmr.Buffer(256, resource=hmr.DeviceMemoryResource(1))
    assert rt.hip_code(rt.fn.hipMemcpyPeer(b.ptr, 7, a.ptr, 0, 256)) == 101
    rt.clear_last_error()
    assert rt.hip_code(rt.fn.hipMemcpyPeer(b.ptr, 1, a.ptr, -1, 256)) == 101
    rt.clear_last_error()


# ---- peer access --------------------------------------------------------------------------------
def test_peer_access_is_idempotent(rt):
    d0, d1 = hmr.Device(0), hmr.Device(1)
    assert d0.can_access_peer(d0) is False
    if not d0.can_access_peer(1):
        pytest.skip("these two devices cannot map each other's memory")
    assert isinstance(d1.can_access_peer(0), bool)
    d0.enable_peer_access(1)
    d0.enable_peer_access(d1)        # already enabled: not an error
    d0.disable_peer_access(1)
    d0.disable_peer_access(1)        # not enabled: not an error
    d0.enable_peer_access(1)         # and back
    assert hmr.get_device() == 0     # the current device is restored
    with hmr.Device(1):
        d0.enable_peer_access(1)
        assert hmr.get_device() == 1
    d0.disable_peer_access(1)


def test_peer_access_bad_arguments(rt):
    d0 = hmr.Device(0)
    with pytest.raises(ValueError, match="own peer"):
        d0.enable_peer_access(0)
    with pytest.raises(ValueError, match="own peer"):
        d0.disable_peer_access(d0)
    with pytest.raises(ValueError, match="peer=5 is out of range"):
        d0.can_access_peer(5)
    with pytest.raises(TypeError, match="peer must be"):
        d0.enable_peer_access("1")
    with pytest.raises(TypeError):
        d0.can_access_peer(1.0)


# ---- Buffer copies between devices -------------------------------------------------------------
@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("src_kind", KINDS)
@pytest.mark.parametrize("dst_kind", KINDS)
def test_copy_from_device_across_devices(rt, src_kind, dst_kind, current):
    n = 100_000
    src = hmr.Buffer.from_host(_pattern(n, 3), resource=_resource(src_kind, 0))
    dst = hmr.Buffer(n, resource=_resource(dst_kind, 1))
    with hmr.Device(current):
        dst.copy_from_device(src)
        assert dst.tobytes() == _pattern(n, 3)
        back = hmr.Buffer(n, resource=_resource(src_kind, 0))
        back.copy_from_device(dst)
        assert back.tobytes() == _pattern(n, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_copy_from_device_on_a_stream(rt, kind):
    n = 65536
    src = hmr.Buffer.from_host(_pattern(n, 5), resource=_resource(kind, 1))
    dst = hmr.Buffer(n, resource=_resource(kind, 0))
    with hmr.Stream() as s:             # a stream of device 0
        dst.copy_from_device(src, stream=s)
        s.synchronize()
    assert dst.tobytes() == _pattern(n, 5)
    with hmr.Device(1), hmr.Stream() as s1:   # a stream of the source's device
        dst.memset(0)
        dst.copy_from_device(src, stream=s1)
        s1.synchronize()
    assert dst.tobytes() == _pattern(n, 5)


@pytest.mark.parametrize("host_kind", ["pinned", "managed"])
@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_copies_between_host_accessible_memory_and_another_device(rt, host_kind, current, kind):
    """Pinned / managed memory (made with device 0 current) to and from memory of device 1,
    synchronous and on streams of either device, whichever device is current: the copies of
    pool memory must run with the pool's device current."""
    n = 8192
    host_res = (hmr.PinnedMemoryResource() if host_kind == "pinned"
                else hmr.ManagedMemoryResource())
    host = hmr.Buffer.from_host(_pattern(n, 9), resource=host_res)
    dev1 = hmr.Buffer(n, resource=_resource(kind, 1))
    with hmr.Device(current):
        dev1.copy_from_device(host)
        assert dev1.tobytes() == _pattern(n, 9)
        host.memset(0)
        host.copy_from_device(dev1)
        assert host.tobytes() == _pattern(n, 9)
        for stream_device in (0, 1):
            with hmr.Device(stream_device):
                s = hmr.Stream()
            with s:
                dev1.memset(0)
                dev1.copy_from_device(host, stream=s)
                out = bytearray(n)
                dev1.copy_to_host(out, stream=s)
                s.synchronize()
                assert out == _pattern(n, 9)
                host.memset(0)
                host.copy_from_device(dev1, stream=s)
                s.synchronize()
                assert host.tobytes() == _pattern(n, 9)
                dev1.copy_from_host(bytes(n), stream=s)
                s.synchronize()
                assert dev1.tobytes() == bytes(n)


@pytest.mark.parametrize("kind", KINDS)
def test_host_copies_and_memset_with_another_device_current(rt, kind):
    n = 50_000
    buf = hmr.Buffer(n, resource=_resource(kind, 1))
    with hmr.Device(0):
        buf.copy_from_host(_pattern(n, 1))
        assert buf.tobytes() == _pattern(n, 1)
        buf.memset(0xAB)
        assert buf.copy_to_host() == bytearray(b"\xab" * n)


@pytest.mark.parametrize("kind", KINDS)
def test_buffer_copy_to_another_device(rt, kind):
    n = 30_000
    src = hmr.Buffer.from_host(_pattern(n, 2), resource=_resource(kind, 0))
    same = src.copy()
    assert same.resource is src.resource and same.device == 0 and same.ptr != src.ptr
    assert same.tobytes() == _pattern(n, 2)
    other = _resource(kind, 1)
    moved = src.copy(other)
    assert moved.device == 1 and moved.resource is other
    assert moved.tobytes() == _pattern(n, 2)
    with hmr.Stream() as s:
        streamed = moved.copy(_resource(kind, 0), stream=s)
        s.synchronize()
        assert streamed.stream == s.ref
        assert streamed.device == 0 and streamed.tobytes() == _pattern(n, 2)
        streamed.close()
    empty = hmr.Buffer(0, resource=other).copy(_resource(kind, 0))
    assert empty.size == 0 and empty.tobytes() == b""


def test_buffer_copy_bad_input_allocates_nothing(rt):
    src = hmr.Buffer.from_host(b"abc" * 100, resource=hmr.DeviceMemoryResource(0))
    with pytest.raises(TypeError):
        src.copy(resource=42)
    with pytest.raises(TypeError):
        src.copy(stream="s")
    src.close()
    with pytest.raises(ValueError, match="closed"):
        src.copy()


def test_copy_of_host_memory(rt):
    src = hmr.Buffer.from_host(b"xyz" * 10, resource=hmr.HostMemoryResource())
    dup = src.copy()
    assert dup.device is None and dup.tobytes() == b"xyz" * 10
    on1 = src.copy(hmr.DeviceMemoryResource(1))
    assert on1.device == 1 and on1.tobytes() == b"xyz" * 10


# ---- the device of memory behind adaptors ------------------------------------------------------
@pytest.mark.parametrize("wrap", ["pool", "statistics", "tracking", "limiting", "logging",
                                  "stack"])
def test_device_through_adaptors(rt, wrap, tmp_path):
    base = hmr.DeviceMemoryResource(1)
    if wrap == "pool":
        res = hmr.PoolResource(base, initial_pool_size=1 << 20)
    elif wrap == "statistics":
        res = hmr.StatisticsResource(base)
    elif wrap == "tracking":
        res = hmr.TrackingResource(base)
    elif wrap == "limiting":
        res = hmr.LimitingResource(base, 1 << 30)
    elif wrap == "logging":
        res = hmr.LoggingResource(base, str(tmp_path / "log.csv"))
    else:
        res = hmr.StatisticsResource(hmr.TrackingResource(hmr.PoolResource(
            hmr.AsyncMemoryResource(1), initial_pool_size=1 << 20)))
    assert memory_device(res) == 1
    assert memory_device(hmr.async_resource_ref(res)) == 1
    buf = hmr.Buffer(1000, resource=res)     # device 0 is current
    assert buf.device == 1
    kind, device = buf.__dlpack_device__()
    if rt.platform != "emulated":            # emulated memory is host memory: kDLCPU 0
        assert device == 1
    buf.close()


def test_memory_device_of_unknown_stacks():
    class NoDevice:
        pass

    class Broken:
        def upstream_resource(self):
            raise RuntimeError("nope")

    class Loop:
        def upstream_resource(self):
            return self

    assert memory_device(NoDevice()) is None
    assert memory_device(Broken()) is None
    with pytest.raises(ValueError, match="cycle"):   # never a silent answer
        memory_device(Loop())


# ---- threads, one device each ------------------------------------------------------------------
def test_threads_each_driving_their_own_device(rt):
    errors = []
    rounds = 200

    def work(device):
        try:
            hmr.set_device(device)
            pool = hmr.AsyncMemoryResource(device)
            hmr.set_current_device_resource(pool)
            with hmr.Stream() as s:
                for i in range(rounds):
                    data = _pattern(4096 + i, device * 31 + i)
                    buf = hmr.Buffer.from_host(data, stream=s)
                    assert buf.device == device and buf.resource is pool
                    copy = buf.copy()
                    s.synchronize()
                    assert copy.tobytes() == data
                    buf.close()
                    copy.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append((device, exc))

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- on the two GPUs only: kernels of other libraries on the other device ----------------------
@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_pool_set_access_lets_a_kernel_on_the_peer_read_and_write():
    """After ``MemoryPool.set_access(1)``, a CuPy kernel on device 1 reads and writes memory of
    a device-0 pool."""
    cupy = pytest.importorskip("cupy")
    n = 1 << 20
    res = hmr.AsyncMemoryResource(0)
    buf = hmr.Buffer.from_host(bytes([3]) * n, resource=res)
    res.pool.set_access(1)
    assert res.pool.access(1) == "read_write"
    with cupy.cuda.Device(1):
        # CuPy is told the memory is device 1's, so its kernels run there and read it through
        # the access just granted
        mem = cupy.cuda.UnownedMemory(buf.ptr, n, buf, device_id=1)
        arr = cupy.ndarray((n,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
        assert int(arr.sum(dtype=cupy.uint64)) == 3 * n
        arr += 1
        cupy.cuda.Device(1).synchronize()
    assert buf.tobytes() == bytes([4]) * n
    res.pool.set_access(1, read_write=False)
    assert res.pool.access(1) == "none"


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_dlpack_tells_torch_the_device_behind_adaptors():
    torch = pytest.importorskip("torch")
    res = hmr.StatisticsResource(hmr.PoolResource(hmr.DeviceMemoryResource(1),
                                                  initial_pool_size=1 << 20))
    buf = hmr.Buffer.from_host(bytes(range(256)) * 4, resource=res)
    t = torch.from_dlpack(buf)
    assert t.device == torch.device("cuda", 1)
    assert int(t.to(torch.int64).sum()) == sum(range(256)) * 4


def _plain_copy_matrix(rt, mem, streams):
    """{(current device, how, dst, src): refused?} for every plain copy between two kinds."""
    result = {}
    for current in (0, 1):
        for how in ("sync", "null", "s0", "s1"):
            for dst in mem:
                for src in mem:
                    if dst == src:
                        continue
                    rt.check(rt.fn.hipSetDevice(current))
                    if how == "sync":
                        st = rt.fn.hipMemcpy(mem[dst], mem[src], 256, hipMemcpyDefault)
                    else:
                        handle = 0 if how == "null" else streams[int(how[1])]
                        st = rt.fn.hipMemcpyAsync(mem[dst], mem[src], 256, hipMemcpyDefault,
                                                  handle)
                        if not st:
                            rt.check(rt.fn.hipStreamSynchronize(handle))
                    if st:
                        assert rt.hip_code(st) == 1, (current, how, dst, src, st)
                        rt.clear_last_error()
                    result[(current, how, dst, src)] = bool(st)
    rt.check(rt.fn.hipSetDevice(0))
    return result


def test_memset_rules(rt):
    """hipMemset(Async) of memory-pool memory is refused (invalid value) unless the stream's
    device is the pool's (the current device for the null stream and the synchronous call):
    measured on two H200s, and what the emulation enforces."""
    bufs = [hmr.Buffer(4096, resource=hmr.AsyncMemoryResource(d)) for d in (0, 1)]
    streams = {}
    for d in (0, 1):
        with hmr.Device(d):
            streams[d] = hmr.Stream()
    for current in (0, 1):
        for how in ("sync", "null", "s0", "s1"):
            for d, buf in enumerate(bufs):
                rt.check(rt.fn.hipSetDevice(current))
                if how == "sync":
                    st = rt.fn.hipMemset(buf.ptr, 1, 4096)
                else:
                    handle = 0 if how == "null" else streams[int(how[1])].handle
                    st = rt.fn.hipMemsetAsync(buf.ptr, 1, 4096, handle)
                    if not st:
                        rt.check(rt.fn.hipStreamSynchronize(handle))
                stream_device = current if how in ("sync", "null") else int(how[1])
                assert rt.hip_code(st) == (0 if stream_device == d else 1), (current, how, d)
                rt.clear_last_error()
    rt.check(rt.fn.hipSetDevice(0))
    with hmr.Device(1):   # Buffer.memset sets its pool memory with its own device current
        bufs[0].memset(7)
        bufs[0].memset(9, stream=streams[0])
        streams[0].synchronize()
    assert bufs[0].tobytes() == bytes([9]) * 4096
    for obj in bufs + list(streams.values()):
        obj.close()


def test_plain_copy_rules(rt):
    """The rule the runtime applies to hipMemcpy / hipMemcpyAsync (measured on two H200s, and
    what the emulation enforces): memory-pool memory may be copied only while its pool's device
    is current, or a device its pool grants access; the stream's device does not matter, nor
    does the other side (hipMalloc memory of either device, pinned, managed or pageable host
    memory).  hipMalloc, pinned and managed memory copy with any device current."""
    from hipmr_ctypes._hip.types import hipMemAccessDesc
    mem, keep = {}, []
    for d in (0, 1):
        res = hmr.AsyncMemoryResource(d)
        keep.append(hmr.Buffer(256, resource=res))
        mem[f"pool{d}"] = keep[-1].ptr
        keep.append(hmr.Buffer(256, resource=hmr.DeviceMemoryResource(d)))
        mem[f"malloc{d}"] = keep[-1].ptr
    keep.append(hmr.Buffer(256, resource=hmr.PinnedMemoryResource()))
    mem["pinned"] = keep[-1].ptr
    keep.append(hmr.Buffer(256, resource=hmr.ManagedMemoryResource()))
    mem["managed"] = keep[-1].ptr
    host = ctypes.create_string_buffer(256)
    mem["pageable"] = ctypes.addressof(host)
    streams = {}
    for d in (0, 1):
        with hmr.Device(d):
            s = hmr.Stream()
        keep.append(s)
        streams[d] = s.handle
    refused = _plain_copy_matrix(rt, mem, streams)
    expected = {key: any(side.startswith("pool") and int(side[4:]) != key[0]
                         for side in key[2:])
                for key in refused}
    assert refused == expected
    assert sum(refused.values()) == 96   # of 336 copies
    for owner, other in ((0, 1), (1, 0)):   # grant each device access to the other's pool
        desc = hipMemAccessDesc()
        desc.location.type, desc.location.id, desc.flags = 1, other, 3
        pool = keep[0 if owner == 0 else 2].resource.pool.handle
        rt.check(rt.fn.hipMemPoolSetAccess(pool, desc, 1))
    assert not any(_plain_copy_matrix(rt, mem, streams).values())
    for buf in keep:
        buf.close()


def test_the_current_device_is_entered_without_a_runtime_call(rt, monkeypatch):
    """``on_device_or_current(d)`` for the current device changes nothing and asks the
    runtime nothing beyond the current device; for another device it switches for the block
    and switches back."""
    from hipmr_ctypes.device import _NO_SWITCH, on_device_or_current
    hmr.set_device(1)
    try:
        set_calls = []
        real_set = rt.fn.hipSetDevice
        monkeypatch.setattr(rt.fn, "hipSetDevice", lambda d: set_calls.append(d) or real_set(d))
        assert on_device_or_current(1) is _NO_SWITCH and on_device_or_current(None) is _NO_SWITCH
        with on_device_or_current(0):
            assert hmr.get_device() == 0
        assert hmr.get_device() == 1 and set_calls == [0, 1]
    finally:
        monkeypatch.undo()
        hmr.set_device(0)

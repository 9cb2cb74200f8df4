"""Foreign memory on a real GPU (marked ``gpu``): CuPy and PyTorch arrays through
Buffer.from_dlpack / Buffer.from_handle, CuPy's MemoryAsyncPool and a cuda-bindings pool through
AsyncMemoryResource.from_pool_handle, Buffer.fill on device memory, host views of pinned and
managed memory.  CuPy, PyTorch and cuda-bindings skip with the reason when missing, and fail
instead under HIPMR_REQUIRE_GPU=1 (the GPU machine has them)."""
import gc
import importlib
import os
import sys

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer

pytestmark = pytest.mark.gpu


def _need(module):
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA library that fails to load
        if os.environ.get("HIPMR_REQUIRE_GPU") == "1":
            pytest.fail(f"{module} is required on the GPU machine (HIPMR_REQUIRE_GPU=1): {exc}")
        pytest.skip(f"{module} not available: {exc}")


# ---- CuPy ---------------------------------------------------------------------------------------
def test_gpu_from_dlpack_cupy(gpu_runtime):
    cp = _need("cupy")
    a = cp.arange(3000, dtype=cp.int32).reshape(30, 100)
    base = sys.getrefcount(a)
    view = Buffer.from_dlpack(a)
    assert view.ptr == a.data.ptr and view.size == a.nbytes
    assert view._memory_kind() == "device" and view.device == a.device.id
    assert sys.getrefcount(a) > base
    assert view.tobytes() == a.get().tobytes()
    view.fill(0x01020304, 4)
    assert int((a == 0x01020304).sum()) == a.size
    view.fill(-1, 2)
    assert int((a == -1).sum()) == a.size
    del view
    gc.collect()
    assert sys.getrefcount(a) == base            # the deleter ran, once
    with pytest.raises(ValueError, match="C-contiguous"):
        Buffer.from_dlpack(a[:, ::2])
    gc.collect()
    assert sys.getrefcount(a) == base            # the refused capsule let it go too


def test_gpu_from_dlpack_cupy_keeps_the_array_alive(gpu_runtime):
    cp = _need("cupy")
    a = cp.full((1 << 20,), 7, dtype=cp.uint8)
    view = Buffer.from_dlpack(a)
    del a
    gc.collect()
    others = [cp.full((1 << 20,), 9, dtype=cp.uint8) for _ in range(4)]  # would reuse freed memory
    assert view.tobytes() == b"\x07" * (1 << 20)
    view.close()
    del others


def test_gpu_from_handle_cupy(gpu_runtime):
    cp = _need("cupy")
    a = cp.arange(256, dtype=cp.uint8)
    view = Buffer.from_handle(a.data.ptr, a.nbytes, owner=a)
    assert view.device == a.device.id and view._memory_kind() == "device"
    assert view.tobytes() == bytes(range(256))
    with pytest.raises(BufferError, match="device memory"):
        view.host_view()
    copy = view.copy(resource=hmr.DeviceMemoryResource())
    assert copy.tobytes() == bytes(range(256))
    view.close()
    copy.close()


def test_gpu_from_dlpack_cupy_pinned(gpu_runtime):
    cp = _need("cupy")
    import cupyx
    host = cupyx.empty_pinned((4096,), dtype="uint8")
    host[:] = 5
    view = Buffer.from_dlpack(host)
    assert view._memory_kind() == "pinned"
    with view.host_view() as mv:
        assert bytes(mv[:4]) == b"\x05" * 4
        mv[0] = 6
    assert host[0] == 6
    view.fill(0x0A0B, 2)
    assert host[:2].tobytes() == b"\x0b\x0a"
    device = cp.asarray(host)                    # the device reads what the view wrote
    assert int(device[1]) == 0x0A
    view.close()


def test_gpu_from_pool_handle_cupy_memory_async_pool(gpu_runtime):
    cp = _need("cupy")
    dev = hmr.get_device()
    pool = cp.cuda.MemoryAsyncPool()
    handle = pool._pools[dev]                    # CuPy's cudaMemPool_t of this device
    r = hmr.AsyncMemoryResource.from_pool_handle(handle)
    assert r.device == dev and not r.pool.owned
    used = pool.used_bytes()
    buf = Buffer(1 << 20, resource=r)
    assert pool.used_bytes() >= used + (1 << 20)  # the same pool CuPy counts
    buf.fill(3)
    assert buf.tobytes()[:3] == b"\x03" * 3
    buf.close()
    r.close()
    del r
    gc.collect()
    mem = pool.malloc(1024)                      # CuPy's pool still works
    del mem


def test_gpu_from_pool_handle_cuda_bindings_pool(gpu_runtime):
    if gpu_runtime.platform != "nvidia":
        pytest.skip("cuda-bindings pools are CUDA's")
    cudart = _need("cuda.bindings.runtime")
    dev = hmr.get_device()
    props = cudart.cudaMemPoolProps()
    props.allocType = cudart.cudaMemAllocationType.cudaMemAllocationTypePinned
    props.location.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
    props.location.id = dev
    err, pool = cudart.cudaMemPoolCreate(props)
    assert err == cudart.cudaError_t.cudaSuccess
    r = hmr.AsyncMemoryResource.from_pool_handle(pool)      # int(pool) is the handle
    assert r.device == dev and r.pool.handle == int(pool)
    with Buffer(4096, resource=r) as buf:
        buf.fill(0xCAFE, 2)
        assert buf.tobytes() == b"\xfe\xca" * 2048
    r.close()
    del r
    gc.collect()
    (err,) = cudart.cudaMemPoolDestroy(pool)                  # ours to destroy: still there
    assert err == cudart.cudaError_t.cudaSuccess


# ---- PyTorch ------------------------------------------------------------------------------------
def test_gpu_from_dlpack_torch(gpu_runtime):
    torch = _need("torch")
    dev = hmr.get_device()
    torch.cuda.synchronize()
    t = torch.arange(1 << 18, dtype=torch.int32, device=f"cuda:{dev}")
    expected = t.cpu().numpy().tobytes()
    held = torch.cuda.memory_allocated(dev)
    view = Buffer.from_dlpack(t)
    assert view.ptr == t.data_ptr() and view.size == t.numel() * 4
    assert view.device == dev and view._memory_kind() == "device"
    del t
    gc.collect()
    assert torch.cuda.memory_allocated(dev) == held    # the DLPack manager holds the tensor
    assert view.tobytes() == expected
    view.close()
    gc.collect()
    assert torch.cuda.memory_allocated(dev) == held - (1 << 20)   # released, once


def test_gpu_from_dlpack_torch_fill_and_refusals(gpu_runtime):
    torch = _need("torch")
    t = torch.zeros((64, 64), dtype=torch.int16, device="cuda")
    view = Buffer.from_dlpack(t)
    view.fill(0x7FFF, 2)
    assert bool((t == 0x7FFF).all())
    view.fill(0xFF)
    assert bool((t == -1).all())
    view.close()
    with pytest.raises(ValueError, match="C-contiguous"):
        Buffer.from_dlpack(t.T)
    pinned = torch.ones(1024, dtype=torch.uint8).pin_memory()
    host = Buffer.from_dlpack(pinned)
    assert host._memory_kind() == "pinned"
    with host.host_view() as mv:
        mv[0] = 2
    assert int(pinned[0]) == 2
    host.close()


def test_gpu_torch_and_buffer_round_trip(gpu_runtime):
    torch = _need("torch")
    buf = Buffer.from_host(bytes(range(256)) * 16)
    t = torch.from_dlpack(buf)
    back = Buffer.from_dlpack(t)
    assert back.ptr == buf.ptr and back.tobytes() == buf.tobytes()
    buf.close()                      # consumers still use it: freed when the last lets go
    back.fill(1)
    assert int(t.sum()) == 4096
    back.close()
    del t
    gc.collect()


# ---- fill and host views on the device ---------------------------------------------------------
@pytest.mark.parametrize("kind", ["device", "pool", "pinned", "managed"])
def test_gpu_fill_every_width(gpu_runtime, kind):
    resource = {"device": hmr.DeviceMemoryResource, "pool": hmr.AsyncMemoryResource,
                "pinned": hmr.PinnedMemoryResource, "managed": hmr.ManagedMemoryResource}[kind]()
    n = (1 << 20) + 4
    with hmr.Stream() as s:
        for stream in (None, s):
            with Buffer(n, resource=resource) as buf:
                for value, width, element in [(0x5A, 1, b"\x5a"), (0xBEEF, 2, b"\xef\xbe"),
                                              (0xDEADBEEF, 4, b"\xef\xbe\xad\xde"),
                                              (-2, 4, b"\xfe\xff\xff\xff")]:
                    buf.fill(value, width, stream=stream)
                    if stream is not None:
                        s.synchronize()
                    assert buf.tobytes() == element * (n // width), (value, width, stream)


def test_gpu_host_views_of_pinned_and_managed(gpu_runtime):
    for resource in (hmr.PinnedMemoryResource(), hmr.ManagedMemoryResource()):
        buf = Buffer.from_host(b"\x01" * 4096, resource=resource)
        with buf.host_view() as mv:
            assert bytes(mv[:2]) == b"\x01\x01"
            mv[:2] = b"ab"
            with pytest.raises(BufferError):
                buf.close()
        assert buf.tobytes()[:2] == b"ab"
        buf.close()
    with Buffer(16) as dev:
        with pytest.raises(BufferError):
            dev.host_view()


# ---- read-only device memory stays read-only --------------------------------------------------
@pytest.mark.reliability("copy_ownership_cases")
def test_gpu_read_only_device_memory_stays_read_only(gpu_runtime):
    """A view of device memory its producer marked read-only: its CUDA Array Interface says
    ``(ptr, True)``, its versioned DLPack capsule carries the read-only flag, a legacy capsule
    and every write are refused, and the memory is unchanged."""
    from hipmr_ctypes._buffer import dlpack as _dlpack
    from test_foreign_memory import Producer, _flags
    device_type = _dlpack.kDLROCM if gpu_runtime.platform == "amd" else _dlpack.kDLCUDA
    buf = Buffer.from_host(bytes(range(256)))
    ro = Buffer.from_dlpack(Producer((buf.ptr, 256), device=(device_type, 0), flags=1))
    assert ro._memory_kind() == "device" and ro.device == 0
    assert ro.__cuda_array_interface__["data"] == (buf.ptr, True)
    assert buf.__cuda_array_interface__["data"] == (buf.ptr, False)
    capsule = ro.__dlpack__(max_version=(1, 0))
    assert _flags(capsule) & _dlpack.FLAG_READ_ONLY
    del capsule
    with pytest.raises(BufferError, match="read-only"):
        ro.__dlpack__()
    for write in (lambda: ro.fill(1), lambda: ro.memset(1), lambda: ro.copy_from_host(b"x"),
                  lambda: ro.copy_from_device(Buffer(4))):
        with pytest.raises(BufferError, match="read-only"):
            write()
    assert Buffer.from_dlpack(ro).resource.readonly
    assert buf.tobytes() == bytes(range(256))
    ro.close()
    buf.close()

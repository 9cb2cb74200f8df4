"""Interop: the hooks are imported only on demand; on the GPU, CuPy's allocator, Numba's EMM
plugin, and DLPack / the CUDA array interface consumed by CuPy and PyTorch, each checked by
writing on one side and reading on the other."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _dlpack
from hipmr_ctypes.buffer import Buffer
from hipmr_ctypes.resources import (AsyncMemoryResource, DeviceMemoryResource,
                                    ManagedMemoryResource, get_current_device_resource,
                                    set_current_device_resource)

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_interop_is_imported_only_on_demand():
    out = run_python("""
        import sys
        import hipmr_ctypes
        import hipmr_ctypes.buffer, hipmr_ctypes.resources
        hipmr_ctypes.buffer.Buffer(8).close()
        assert not [m for m in sys.modules if m.startswith("hipmr_ctypes.interop")], sys.modules
        import hipmr_ctypes.interop
        heavy = [m for m in ("cupy", "numba", "torch") if m in sys.modules]
        assert not heavy, heavy
        print("ok")
    """, HIPMR_PLATFORM="emulated")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"


class Counting:
    """An async, device-accessible resource over another that counts live allocations."""
    properties = (hmr.device_accessible,)

    def __init__(self, upstream):
        self.up = upstream
        self.live = {}
        self.total = 0

    def allocate(self, bytes, alignment=256):
        return self.allocate_async(bytes, alignment, 0)

    def deallocate(self, ptr, bytes, alignment=256):
        self.deallocate_async(ptr, bytes, alignment, 0)

    def allocate_async(self, bytes, alignment, stream):
        ptr = self.up.allocate_async(bytes, alignment, stream)
        self.live[ptr] = bytes
        self.total += 1
        return ptr

    def deallocate_async(self, ptr, bytes, alignment, stream):
        assert self.live.pop(ptr) == bytes
        self.up.deallocate_async(ptr, bytes, alignment, stream)

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


# ---- CuPy ----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_cupy_allocator(gpu_runtime):
    cupy = pytest.importorskip("cupy")
    from hipmr_ctypes.interop.cupy import allocator
    previous = cupy.cuda.get_allocator()
    counting = Counting(AsyncMemoryResource.from_default_pool())
    try:
        cupy.cuda.set_allocator(allocator(counting))
        a = cupy.arange(1 << 20, dtype=cupy.float32)
        b = (a * 2).sum()
        assert float(b) == float(sum(range(1 << 20)) * 2)
        assert counting.total >= 2 and counting.live
        with cupy.cuda.Stream(non_blocking=True) as s:
            c = cupy.ones(1000, dtype=cupy.int64) * 3
            assert int(c.sum()) == 3000
            s.synchronize()
        empty = cupy.empty(0)
        assert empty.size == 0
        del a, b, c, empty
        gc.collect()
        cupy.cuda.Device().synchronize()
        assert not counting.live  # everything went back through the resource
        # default: the current device resource at each allocation
        saved = get_current_device_resource()
        per_device = Counting(DeviceMemoryResource())
        set_current_device_resource(per_device)
        try:
            cupy.cuda.set_allocator(allocator())
            x = cupy.zeros(4096, dtype=cupy.uint8)
            assert per_device.live
            del x
            gc.collect()
            assert not per_device.live
        finally:
            set_current_device_resource(saved)
        with pytest.raises(TypeError, match="device_accessible"):
            from hipmr_ctypes.resources import HostMemoryResource
            allocator(HostMemoryResource())
    finally:
        cupy.cuda.set_allocator(previous)


@pytest.mark.gpu
def test_gpu_cupy_array_interface_and_dlpack(gpu_runtime):
    cupy = pytest.importorskip("cupy")
    n = 1 << 16
    data = pattern(n)
    base = _dlpack.live_exports()
    for resource in (DeviceMemoryResource(), AsyncMemoryResource.from_default_pool(),
                     ManagedMemoryResource()):
        buf = Buffer.from_host(data, resource=resource)
        # CUDA array interface: read on the CuPy side, write there, read back here
        view = cupy.asarray(buf)
        assert view.dtype == cupy.uint8 and view.shape == (n,)
        assert bytes(cupy.asnumpy(view)) == data
        view[:] = 7
        cupy.cuda.Device().synchronize()
        assert buf.tobytes() == b"\x07" * n
        # DLPack: the same memory
        t = cupy.from_dlpack(buf)
        assert t.data.ptr == buf.ptr
        t[:5] = cupy.arange(5, dtype=cupy.uint8)
        cupy.cuda.Device().synchronize()
        assert buf.tobytes()[:6] == b"\x00\x01\x02\x03\x04\x07"
        buf.copy_from_host(data)
        assert bytes(cupy.asnumpy(t)) == data
        del view, t, buf
        gc.collect()
    assert _dlpack.live_exports() == base


# ---- PyTorch -------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_torch_dlpack(gpu_runtime):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    n = 1 << 16
    data = pattern(n, 3)
    base = _dlpack.live_exports()
    for resource in (DeviceMemoryResource(), AsyncMemoryResource.from_default_pool()):
        buf = Buffer.from_host(data, resource=resource)
        t = torch.from_dlpack(buf)
        assert t.dtype == torch.uint8 and t.shape == (n,) and t.is_cuda
        assert t.data_ptr() == buf.ptr
        assert bytes(t.cpu().numpy()) == data
        t.fill_(9)  # write on the torch side...
        torch.cuda.synchronize()
        assert buf.tobytes() == b"\x09" * n  # ...read here
        buf.memset(4)  # write here...
        assert int(t.sum()) == 4 * n  # ...read on the torch side
        del t
        gc.collect()
        buf.close()
    # a buffer on its own stream, consumed on torch's (different) current stream
    with hmr.Stream(flags=1) as s:
        buf = Buffer.from_host(data, stream=s)
        with torch.cuda.stream(torch.cuda.Stream()):
            t = torch.from_dlpack(buf)
            total = int(t.to(torch.int64).sum())
        assert total == sum(data)
        del t
        buf.close()
    gc.collect()
    assert _dlpack.live_exports() == base


@pytest.mark.gpu
def test_gpu_torch_and_cupy_share_through_buffer(gpu_runtime):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    buf = Buffer(1024)
    t = torch.from_dlpack(buf)
    c = cupy.from_dlpack(buf)
    t.fill_(200)
    torch.cuda.synchronize()
    assert int(c.astype(cupy.int64).sum()) == 200 * 1024
    c[:] = 1
    cupy.cuda.Device().synchronize()
    assert int(t.sum()) == 1024
    del t, c
    gc.collect()
    buf.close()


# ---- Numba ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_numba_memory_manager(gpu_runtime):
    pytest.importorskip("numba.cuda")
    out = run_python("""
        import gc
        import numpy as np
        from numba import cuda
        from hipmr_ctypes.interop.numba import HipmrNumbaManager
        ctx = cuda.current_context()
        mm = ctx.memory_manager
        assert type(mm) is HipmrNumbaManager, type(mm)
        host = np.arange(100_000, dtype=np.float64)
        dev = cuda.to_device(host)
        assert len(mm.allocations) >= 1
        assert (dev.copy_to_host() == host).all()
        other = cuda.device_array_like(dev)
        other.copy_to_device(dev)
        assert (other.copy_to_host() == host).all()
        free, total = ctx.get_memory_info()
        assert 0 < free <= total
        info = ctx.get_memory_info()            # Numba's MemoryInfo, read by field name
        assert type(info).__name__ == "MemoryInfo" and info.total == total and info.free > 0
        assert mm.get_memory_info().total == total
        from hipmr_ctypes.buffer import Buffer
        assert all(isinstance(b, Buffer) for b in mm.allocations.values())
        del dev, other
        gc.collect()
        ctx.deallocations.clear()
        assert not mm.allocations, mm.allocations
        empty = cuda.device_array(0)
        print("ok")
    """, NUMBA_CUDA_MEMORY_MANAGER="hipmr_ctypes.interop.numba")
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip().endswith("ok")


@pytest.mark.gpu
def test_gpu_numba_set_memory_manager(gpu_runtime):
    pytest.importorskip("numba.cuda")
    out = run_python("""
        import numpy as np
        from numba import cuda
        from hipmr_ctypes.interop import numba as plugin
        assert plugin._numba_memory_manager is plugin.HipmrNumbaManager
        cuda.set_memory_manager(plugin.HipmrNumbaManager)
        a = cuda.to_device(np.ones(1000, dtype=np.int32))
        assert a.copy_to_host().sum() == 1000
        assert type(cuda.current_context().memory_manager) is plugin.HipmrNumbaManager
        print("ok")
    """)
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip().endswith("ok")


@pytest.mark.gpu
def test_gpu_numba_ipc_through_the_plugin(gpu_runtime, tmp_path):
    """An array allocated through the plugin is shared with another process by Numba's own
    IPC (``get_ipc_handle`` -> the legacy handle of ``Buffer.export_ipc``).  No kernel runs
    (reads and the write back are copies), so the test does not depend on Numba's compiler."""
    pytest.importorskip("numba.cuda")
    path = tmp_path / "handle.pickle"
    out = run_python(f"""
        import pickle, subprocess, sys, textwrap
        import numpy as np
        from numba import cuda
        from hipmr_ctypes.interop.numba import HipmrNumbaManager
        assert type(cuda.current_context().memory_manager) is HipmrNumbaManager
        arr = cuda.to_device(np.arange(1000, dtype=np.int64))
        for handle, expected in ((arr.get_ipc_handle(), 499500),
                                 (arr[10:].get_ipc_handle(), 499500 - 45)):
            with open({str(path)!r}, "wb") as f:
                pickle.dump(handle, f)
            child = textwrap.dedent('''
                import pickle
                import numpy as np
                from numba import cuda
                with open({str(path)!r}, "rb") as f:
                    handle = pickle.load(f)
                with handle as darr:
                    print(int(darr.copy_to_host().sum()))
                    darr[0:1].copy_to_device(np.full(1, -1, dtype=darr.dtype))
                    cuda.synchronize()
            ''')
            done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            assert int(done.stdout.split()[-1]) == expected, done.stdout
        assert arr.copy_to_host()[10] == -1 and arr.copy_to_host()[0] == -1
        print("ok")
    """, NUMBA_CUDA_MEMORY_MANAGER="hipmr_ctypes.interop.numba")
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip().endswith("ok")

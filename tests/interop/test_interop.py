"""Interop: the hooks are imported only on demand; on the GPU, CuPy's allocator, Numba's EMM
plugin, and DLPack / the CUDA array interface consumed by CuPy and PyTorch, each checked by
writing on one side and reading on the other."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes._buffer import dlpack as _dlpack
from hipmr_ctypes.buffer import Buffer
from hipmr_ctypes.resources import (AsyncMemoryResource, DeviceMemoryResource,
                                    ManagedMemoryResource, get_current_device_resource,
                                    set_current_device_resource)
from support import REPO


def run_python(code: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
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
    """An async, device-accessible resource over another that counts live allocations (the
    count under a lock: ``+=`` is not atomic without the GIL)."""
    properties = (hmr.device_accessible,)

    def __init__(self, upstream):
        self.up = upstream
        self.live = {}
        self.total = 0
        self.lock = threading.Lock()

    def allocate(self, bytes, alignment=256):
        return self.allocate_async(bytes, alignment, 0)

    def deallocate(self, ptr, bytes, alignment=256):
        self.deallocate_async(ptr, bytes, alignment, 0)

    def allocate_async(self, bytes, alignment, stream):
        ptr = self.up.allocate_async(bytes, alignment, stream)
        self.live[ptr] = bytes
        with self.lock:
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


# ---- the hooks' own logic, over stand-ins for CuPy and Numba (tests/interop_doubles.py) ----------
class Recording(Counting):
    """A Counting resource that also records each call's stream and every free, and whose
    memory lives on ``device`` (None: it names no device)."""

    def __init__(self, upstream, device=None):
        super().__init__(upstream)
        if device is not None:
            self.device = device
        self.allocs = []
        self.frees = []

    def allocate_async(self, bytes, alignment, stream):
        ptr = super().allocate_async(bytes, alignment, stream)
        self.allocs.append((ptr, bytes, alignment, stream))
        return ptr

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self.frees.append((ptr, bytes, alignment, stream))
        super().deallocate_async(ptr, bytes, alignment, stream)


@pytest.fixture
def per_device_table():
    from support import process_runtime
    with process_runtime() as rt:
        yield rt


@pytest.fixture(params=["new", "old"])
def fake_cupy(request, monkeypatch, per_device_table):
    """The CuPy double (both forms of ``get_current_stream``) and the allocator module built
    over it."""
    from interop_doubles import install, make_cupy
    cupy = make_cupy(takes_device=request.param == "new")
    install(monkeypatch, cupy)
    import hipmr_ctypes.interop.cupy as hook
    return cupy, hook


def test_cupy_allocator_current_resource(fake_cupy):
    cupy, hook = fake_cupy
    res = Recording(DeviceMemoryResource())
    set_current_device_resource(res)
    allocate = hook.allocator()
    cupy.cuda.set_allocator(allocate)
    a = cupy.cuda.alloc(1000)
    b = cupy.cuda.alloc(24)
    assert res.live == {a.ptr: 1000, b.ptr: 24} and a.device_id == 0
    assert res.allocs == [(a.ptr, 1000, 256, 0), (b.ptr, 24, 256, 0)]
    view = cupy.cuda.MemoryPointer(a.mem, 8)  # CuPy's views hold the memory object
    del a
    assert res.frees == []
    del view
    assert res.frees == [(res.allocs[0][0], 1000, 256, 0)]
    del b
    assert not res.live and len(res.frees) == 2
    # the stream asked for is the current device's (the new form is given the device)
    assert cupy.state.stream_calls[0] in ((0,), ())
    assert len(set(cupy.state.stream_calls)) == 1


def test_cupy_allocator_follows_the_current_resource_and_stream(fake_cupy):
    cupy, hook = fake_cupy
    first, second = Recording(DeviceMemoryResource()), Recording(DeviceMemoryResource())
    allocate = hook.allocator()
    set_current_device_resource(first)
    a = allocate(256)
    set_current_device_resource(second)
    ours = hmr.Stream()
    stream = cupy.cuda.Stream(ours.handle)
    cupy.state.streams[0] = stream
    b = allocate(512)
    assert list(first.live.values()) == [256] and list(second.live.values()) == [512]
    assert second.allocs[0][3] == ours.handle
    watch = weakref.ref(stream)
    cupy.state.streams.clear()
    del stream
    assert watch() is not None          # the memory holds CuPy's stream until it is freed
    del a, b
    assert first.frees[0][3] == 0 and second.frees[0][3] == ours.handle  # freed where made
    assert not first.live and not second.live
    gc.collect()
    assert watch() is None
    # a resource replaced is not kept alive by the allocator
    third = Recording(DeviceMemoryResource())
    set_current_device_resource(third)
    allocate(64)
    gone = weakref.ref(second)
    del second
    gc.collect()
    assert gone() is None


def test_the_hooks_cache_holds_only_what_the_table_holds(fake_cupy, monkeypatch):
    """The hooks remember each device's resource (and its bound calls) until the per-device
    table changes: a replaced resource is let go at once, with no allocation in between; a
    change while the entry is being made is not overwritten by a stale entry."""
    cupy, hook = fake_cupy
    from hipmr_ctypes.interop import _current
    first = Recording(DeviceMemoryResource())
    set_current_device_resource(first)
    allocate = hook.allocator()
    allocate(256)                      # made and dropped: freed at once
    assert _current.current[0][0] is first and not first.live
    gone = weakref.ref(first)
    set_current_device_resource(Recording(DeviceMemoryResource()))
    assert 0 not in _current.current
    del first
    gc.collect()
    assert gone() is None
    # the table changes while resource_of learns the device: the entry is not kept
    later = Recording(DeviceMemoryResource())
    real_memory_device = _current.memory_device

    def memory_device_then_change(resource):
        found = real_memory_device(resource)
        set_current_device_resource(later)
        return found
    monkeypatch.setattr(_current, "memory_device", memory_device_then_change)
    allocate(64)
    monkeypatch.setattr(_current, "memory_device", real_memory_device)
    assert 0 not in _current.current
    m = allocate(32)
    assert later.live == {m.ptr: 32} and _current.current[0][0] is later
    del m


def test_cupy_allocator_gives_cupy_the_memory_device(fake_cupy):
    """CuPy is always told the device (else it would ask the runtime about every pointer): the
    device the resource names, else CuPy's current device; an empty allocation allocates
    nothing."""
    cupy, hook = fake_cupy
    on_one = Recording(DeviceMemoryResource(), device=1)
    m = hook.allocator(on_one)(64)
    assert m.device_id == 1 and on_one.live
    del m
    assert not on_one.live
    set_current_device_resource(Recording(DeviceMemoryResource(), device=1))
    assert hook.allocator()(32).device_id == 1
    res = Recording(DeviceMemoryResource())
    set_current_device_resource(res)
    for allocate in (hook.allocator(), hook.allocator(res)):
        empty = allocate(0)
        assert empty.ptr == 0 and empty.device_id == 0 and not res.allocs


def test_cupy_allocator_pinned_resource_is_checked_once(fake_cupy):
    cupy, hook = fake_cupy
    from hipmr_ctypes.resources import HostMemoryResource
    with pytest.raises(TypeError, match="device_accessible"):
        hook.allocator(HostMemoryResource())
    with pytest.raises(TypeError):
        hook.allocator(object())
    res = Recording(DeviceMemoryResource())
    allocate = hook.allocator(hmr.async_resource_ref[hmr.device_accessible](res))
    ms = [allocate(n) for n in (1, 300, 4096)]
    assert sorted(res.live.values()) == [1, 300, 4096]
    del ms
    assert not res.live and len(res.frees) == 3


def test_cupy_allocator_frees_once_from_many_threads(fake_cupy):
    cupy, hook = fake_cupy
    res = Recording(DeviceMemoryResource())
    allocate = hook.allocator(res)

    def work():
        for _ in range(300):
            m = allocate(128)
            del m
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not res.live and res.total == 1200 and len(res.frees) == 1200


def test_cupy_allocator_free_failure_is_a_warning(fake_cupy):
    cupy, hook = fake_cupy
    res = Recording(DeviceMemoryResource())
    m = hook.allocator(res)(64)
    real_free = res.deallocate_async

    def failing(*args):
        raise RuntimeError("boom")
    res.deallocate_async = failing  # the bound method taken at allocation still frees
    del m
    assert not res.live
    m = hook.allocator(res)(64)
    with pytest.warns(RuntimeWarning, match="freeing .* failed: boom"):
        del m
    ptr = next(iter(res.live))
    real_free(ptr, 64, 256, 0)


def test_interop_hooks_free_nothing_at_exit():
    """Memory still reachable at interpreter exit stays valid: neither the CuPy allocator's
    nor the Numba plugin's memory is freed by the collector after the exit hook (a module
    __del__ still reads it)."""
    out = run_python("""
        import sys
        sys.path.insert(0, "tests")
        from interop_doubles import make_cupy, make_numba, Context
        for package in (make_cupy(), make_numba()):
            sys.modules.update(package.modules)
        import hipmr_ctypes as hmr
        from hipmr_ctypes.interop.cupy import allocator
        from hipmr_ctypes.interop.numba import HipmrNumbaManager

        class Loud(hmr.DeviceMemoryResource):
            def deallocate_async(self, ptr, bytes, alignment, stream):
                print("freed", bytes, flush=True)
                super().deallocate_async(ptr, bytes, alignment, stream)

        hmr.set_current_device_resource(Loud())
        kept = allocator()(100)
        plugin = HipmrNumbaManager(context=Context())
        numba_kept = plugin.memalloc(200)
        allocator()(300)                      # dropped now: freed now
        plugin.memalloc(400)

        class Reader:
            def __del__(self):
                import ctypes
                ctypes.memset(kept.ptr, 1, 100)
                ctypes.memset(int(numba_kept.device_pointer), 2, 200)
                print("read at exit", flush=True)
        reader = Reader()
        print("end", flush=True)
    """, HIPMR_PLATFORM="emulated")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["freed 300", "freed 400", "end"], out.stdout
    assert "freed 100" not in out.stdout and "freed 200" not in out.stdout


@pytest.fixture
def fake_numba(monkeypatch, per_device_table):
    from interop_doubles import install, make_numba
    install(monkeypatch, make_numba())
    import hipmr_ctypes.interop.numba as hook
    return hook


def test_numba_plugin_memalloc_and_free(fake_numba):
    from interop_doubles import Context
    res = Recording(DeviceMemoryResource())
    set_current_device_resource(res)
    plugin = fake_numba.HipmrNumbaManager(context=Context())
    plugin.initialize()
    m = plugin.memalloc(1000)
    assert isinstance(m, sys.modules["numba.cuda"].MemoryPointer)
    assert res.live == {int(m.device_pointer): 1000} and m.size == 1000 and m.is_managed
    assert m.device_pointer_value == res.allocs[0][0] and res.allocs[0][3] == 0
    m.free()
    assert not res.live and len(res.frees) == 1
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        m.free()
    del m
    assert len(res.frees) == 1                # never twice
    m = plugin.memalloc(64)
    del m                                     # dropped: freed by the collector's refcount
    assert not res.live and len(res.frees) == 2
    empty = plugin.memalloc(0)
    assert empty.device_pointer_value is None and res.total == 2
    assert not plugin.allocations             # nothing kept in Numba's table


def test_numba_plugin_uses_the_context_device(fake_numba):
    from interop_doubles import Context
    from hipmr_ctypes.resources import set_per_device_resource
    emulated = hmr._hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2",
                                                        "HIPMR_EMULATED_MEMORY": "64MiB"})
    from support import process_runtime
    with process_runtime(emulated):
        zero, one = Recording(DeviceMemoryResource(0)), Recording(DeviceMemoryResource(1))
        set_per_device_resource(0, zero)
        set_per_device_resource(1, one)
        plugin = fake_numba.HipmrNumbaManager(context=Context(device=1))
        m = plugin.memalloc(128)
        assert one.live and not zero.live
        assert plugin.get_memory_info().total == hmr.Device(1).memory_info()[1]
        del m
        assert not one.live
        # set_memory_manager makes a dummy without a context: that works too
        dummy = fake_numba.HipmrNumbaManager(context=None)
        assert dummy.interface_version == 1


def test_numba_plugin_ipc_handle(fake_numba):
    from interop_doubles import Context, CUipcMemHandle
    from hipmr_ctypes.errors import NotSupportedError
    ctx = Context()
    plugin = fake_numba.HipmrNumbaManager(context=ctx)
    res = hmr.StatisticsResource(DeviceMemoryResource())  # legacy IPC through an adaptor
    set_current_device_resource(res)
    m = plugin.memalloc(4096)
    view = m.view(100)
    handle = plugin.get_ipc_handle(view)
    assert isinstance(handle.handle, CUipcMemHandle) and handle.offset == 100
    assert handle.handle.reserved != bytes(64)
    assert handle.size == 4096 - 100 and handle.source_info == {"device": 0}
    assert plugin.get_ipc_handle(m).offset == 0       # the same Buffer, made once
    del view, handle
    assert res.allocation_counts.current_count == 1
    m.free()                                           # closes the Buffer that owns it now
    counts = res.allocation_counts
    assert counts.current_count == 0 and counts.total_count == 1
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        m.free()
    m = plugin.memalloc(512)
    plugin.get_ipc_handle(m)
    del m                                              # dropped: the Buffer goes with it
    gc.collect()
    counts = res.allocation_counts
    assert counts.current_count == 0 and counts.total_count == 2
    foreign = sys.modules["numba.cuda"].MemoryPointer(ctx, 0x1000, 8, owner=object())
    assert plugin.get_ipc_handle(foreign) == ("numba's own handle", foreign)  # as Numba does
    pool = Recording(AsyncMemoryResource())
    set_current_device_resource(pool)
    p = plugin.memalloc(256)
    with pytest.raises(NotSupportedError, match="legacy IPC"):
        plugin.get_ipc_handle(p)
    del p
    assert not pool.live


def test_numba_plugin_free_failure_is_a_warning(fake_numba):
    from interop_doubles import Context
    plugin = fake_numba.HipmrNumbaManager(context=Context())
    res = Recording(DeviceMemoryResource())
    set_current_device_resource(res)
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("boom")
    res.deallocate_async = failing
    m = plugin.memalloc(64)
    with pytest.raises(RuntimeError, match="boom"):
        m.free()                                  # an explicit free raises, memory still owned
    with pytest.warns(RuntimeWarning, match="freeing .* failed: boom"):
        del m
    assert len(calls) == 2


def test_real_cupy_objects_without_a_device(monkeypatch, per_device_table):
    """Where CuPy is installed: the allocator builds CuPy's own objects (only CuPy's device and
    stream queries, which need a driver, are stood in for)."""
    cupy = pytest.importorskip("cupy")
    import hipmr_ctypes.interop.cupy as hook
    null = cupy.cuda.Stream.null
    monkeypatch.setattr(hook, "_device_id", lambda: 0)
    monkeypatch.setattr(hook, "_get_current_stream", lambda device=-1: null)
    monkeypatch.setattr(hook, "_current_stream", hook._first_stream)
    res = Recording(DeviceMemoryResource())
    set_current_device_resource(res)
    m = hook.allocator()(4096)
    assert isinstance(m, cupy.cuda.MemoryPointer) and m.device_id == 0
    assert isinstance(m.mem, cupy.cuda.UnownedMemory) and m.mem.size == 4096
    assert res.live == {m.ptr: 4096}
    view = m + 100
    del m
    assert res.live
    del view
    assert not res.live and len(res.frees) == 1


def test_real_numba_pointer_without_a_device(per_device_table):
    """Where numba-cuda is installed: the plugin's pointers are Numba's ``MemoryPointer`` with
    Numba's view and reference-count behaviour (views hold the memory)."""
    pytest.importorskip("numba.cuda")
    from numba.cuda import MemoryPointer
    from interop_doubles import Context
    from hipmr_ctypes.interop.numba import HipmrNumbaManager
    res = hmr.StatisticsResource(DeviceMemoryResource())
    set_current_device_resource(res)
    plugin = HipmrNumbaManager(context=Context())
    m = plugin.memalloc(1024)
    assert isinstance(m, MemoryPointer) and m.owner is m and m.device_pointer_value
    v = m.view(16)
    assert m.refct == 2 and v.owner is m
    del m
    assert res.allocation_counts.current_count == 1      # the view holds the memory
    del v
    gc.collect()
    assert res.allocation_counts.current_count == 0
    m = plugin.memalloc(64)
    m.free()
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        m.free()
    assert res.allocation_counts.total_count == 2


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
def test_gpu_cupy_and_numba_over_a_pool_serve_its_blocks(gpu_runtime):
    """CuPy and Numba over a PoolResource (the per-device resource and a pinned one): the
    hooks take and give back the pool's free blocks themselves on real streams; the values
    are right, a block freed on a stream comes back for that stream and size, and the pool's
    live table is empty once every array is gone."""
    pytest.importorskip("cupy")
    pytest.importorskip("numba.cuda")
    out = run_python("""
        import gc
        import numpy as np
        import cupy
        from numba import cuda
        import hipmr_ctypes as hmr
        from hipmr_ctypes.interop.cupy import allocator
        pool = hmr.PoolResource(hmr.AsyncMemoryResource(), "64MiB")
        hmr.set_current_device_resource(pool)
        live = pool._fast_view().live
        for make in (allocator(), allocator(pool)):
            cupy.cuda.set_allocator(make)
            a = cupy.arange(1 << 20, dtype=cupy.float32)
            first = a.data.ptr
            del a
            b = cupy.zeros(1 << 20, dtype=cupy.float32)    # the same stream and size
            assert b.data.ptr == first and first in live
            b += cupy.arange(1 << 20, dtype=cupy.float32)
            assert float((b * 2).sum()) == float(sum(range(1 << 20)) * 2)
            with cupy.cuda.Stream(non_blocking=True) as s:
                c = cupy.ones(1000, dtype=cupy.int64) * 3
                assert int(c.sum()) == 3000
                s.synchronize()
                del c
            del b
            gc.collect()
            cupy.cuda.Device().synchronize()
            assert live == {}, live
        cupy.cuda.set_allocator(None)
        host = np.arange(100_000, dtype=np.float64)
        dev = cuda.to_device(host)
        ptr = dev.device_ctypes_pointer.value
        assert (dev.copy_to_host() == host).all() and ptr in live
        del dev
        gc.collect()
        again = cuda.to_device(host)
        assert again.device_ctypes_pointer.value == ptr and (again.copy_to_host() == host).all()
        del again
        gc.collect()
        cuda.synchronize()
        assert live == {}, live
        pool.release()
        print("ok")
    """, NUMBA_CUDA_MEMORY_MANAGER="hipmr_ctypes.interop.numba")
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip().endswith("ok")


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
        import hipmr_ctypes as hmr
        from hipmr_ctypes.interop.numba import HipmrNumbaManager, _HipmrMemoryPointer
        stats = hmr.StatisticsResource(hmr.get_current_device_resource())
        hmr.set_current_device_resource(stats)
        ctx = cuda.current_context()
        mm = ctx.memory_manager
        assert type(mm) is HipmrNumbaManager, type(mm)
        host = np.arange(100_000, dtype=np.float64)
        dev = cuda.to_device(host)
        assert isinstance(dev.gpu_data, _HipmrMemoryPointer)
        assert stats.allocation_counts.current_count >= 1
        assert (dev.copy_to_host() == host).all()
        other = cuda.device_array_like(dev)
        other.copy_to_device(dev)
        assert (other[10:].copy_to_host() == host[10:]).all()   # a view of the memory
        assert (other.copy_to_host() == host).all()
        free, total = ctx.get_memory_info()
        assert 0 < free <= total
        info = ctx.get_memory_info()            # Numba's MemoryInfo, read by field name
        assert type(info).__name__ == "MemoryInfo" and info.total == total and info.free > 0
        assert mm.get_memory_info().total == total
        assert stats.allocation_counts.current_count >= 2
        del dev, other
        gc.collect()
        counts = stats.allocation_counts
        assert counts.current_count == 0 and counts.total_count >= 2, counts  # all freed
        assert not mm.allocations               # Numba's table is left to Numba's own memory
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

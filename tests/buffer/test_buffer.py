"""Buffer: round trips, copies, streams, lifetime (close, context manager, garbage collection,
interpreter exit), the CUDA array interface, DLPack, pickling, injected failures."""
from __future__ import annotations

import array
import ctypes
import gc
import os
import pickle
import subprocess
import sys

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._buffer import dlpack as _dlpack
from hipmr_ctypes._hip.exceptions import HipError, OutOfMemoryError
from hipmr_ctypes.buffer import Buffer
from hipmr_ctypes.resources import (AsyncMemoryResource, DeviceMemoryResource,
                                    HostMemoryResource, ManagedMemoryResource,
                                    PinnedMemoryResource, get_current_device_resource)

from support import REPO, no_native_call


FACTORIES = {
    "device": DeviceMemoryResource,
    "async": AsyncMemoryResource.from_default_pool,
    "pinned": PinnedMemoryResource,
    "managed": ManagedMemoryResource,
    "host": HostMemoryResource,
}
SIZES = (0, 1, 255, 4097, (1 << 20) + 3)


def pattern(n: int, seed: int = 5) -> bytes:
    return bytes((i * 13 + seed) & 0xFF for i in range(n))


@pytest.fixture(params=sorted(FACTORIES))
def resource(request):
    return FACTORIES[request.param]()


@pytest.fixture(params=["null", "Stream", "per_thread", "stream_ref"])
def stream(request):
    if request.param == "null":
        yield 0
    elif request.param == "per_thread":
        yield hmr.stream_per_thread
    else:
        with hmr.Stream() as s:
            yield s if request.param == "Stream" else hmr.stream_ref(s)


class Recording:
    """An async resource over a real one that records every call."""
    properties = (hmr.device_accessible,)

    def __init__(self, upstream=None, fail_free=False):
        self.up = upstream if upstream is not None else DeviceMemoryResource()
        self.calls = []
        self.fail_free = fail_free

    def allocate(self, bytes, alignment=256):
        return self.allocate_async(bytes, alignment, 0)

    def deallocate(self, ptr, bytes, alignment=256):
        self.deallocate_async(ptr, bytes, alignment, 0)

    def allocate_async(self, bytes, alignment, stream):
        ptr = self.up.allocate_async(bytes, alignment, stream)
        self.calls.append(("allocate", ptr, bytes, alignment, hmr.stream_ref(stream).get()))
        return ptr

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self.calls.append(("deallocate", ptr, bytes, alignment, hmr.stream_ref(stream).get()))
        if self.fail_free:
            raise RuntimeError("refusing to free")
        self.up.deallocate_async(ptr, bytes, alignment, stream)

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


# ---- round trips ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_round_trip(resource, n):
    data = pattern(n)
    with Buffer.from_host(data, resource=resource) as buf:
        assert buf.size == buf.nbytes == len(buf) == n
        assert buf.resource is resource
        assert buf.tobytes() == data and bytes(buf) == data
        out = bytearray(n)
        assert buf.copy_to_host(out) is out and out == data
        assert isinstance(buf.copy_to_host(), bytearray)
        buf.copy_from_host(bytearray(reversed(data)))
        assert buf.tobytes() == bytes(reversed(data))
        if n:
            assert buf.ptr and buf.ptr % 256 == 0
        else:
            assert buf.ptr == 0


def test_round_trip_every_stream_kind(resource, stream):
    n = 10_000
    data = pattern(n, 9)
    handle = hmr.stream_ref(stream).get()
    buf = Buffer(n, resource=resource, stream=stream)
    assert buf.stream == hmr.stream_ref(handle)
    buf.copy_from_host(data, stream=stream)
    out = buf.copy_to_host(stream=stream)
    hmr.stream_ref(handle).wait()
    assert out == data
    buf.memset(0xAB, stream=stream)
    hmr.stream_ref(handle).wait()
    assert buf.tobytes() == b"\xab" * n
    other = Buffer.from_host(data, resource=resource, stream=stream)
    buf.copy_from_device(other, stream=stream)
    hmr.stream_ref(handle).wait()
    assert buf.tobytes() == data
    other.close()
    buf.close(stream=stream)


def test_host_objects_of_every_shape():
    arr = array.array("i", range(100))
    raw = arr.tobytes()
    buf = Buffer.from_host(arr)
    assert buf.size == len(raw) and buf.tobytes() == raw
    out = array.array("i", [0] * 100)
    assert buf.copy_to_host(out) is out and out == arr
    buf.copy_from_host(memoryview(raw))
    m = memoryview(bytearray(len(raw)))
    buf.copy_to_host(m)
    assert m.tobytes() == raw
    buf.copy_from_host(memoryview(raw).cast("B", (20, 20)))  # C-contiguous 2-D is fine


def test_numpy_round_trip():
    np = pytest.importorskip("numpy")
    a = np.arange(1000, dtype=np.float64)
    buf = Buffer.from_host(a)
    b = np.empty_like(a)
    assert buf.copy_to_host(b) is b
    assert (a == b).all()
    with pytest.raises(ValueError, match="C-contiguous"):
        buf.copy_from_host(np.arange(2000, dtype=np.float64)[::2])
    with pytest.raises(TypeError, match="writable"):
        ro = np.zeros(1000)
        ro.setflags(write=False)
        buf.copy_to_host(ro)


def test_copy_checks(emulator):
    buf = Buffer.from_host(b"0123456789")
    small = Buffer.from_host(b"abc", resource=HostMemoryResource())
    with no_native_call(emulator):
        with pytest.raises(ValueError, match="obj has 11 bytes, more than the buffer's 10"):
            buf.copy_from_host(b"0123456789X")
        with pytest.raises(ValueError, match="out has 9 bytes, fewer than the buffer's 10"):
            buf.copy_to_host(bytearray(9))
        with pytest.raises(TypeError, match="obj must support the buffer protocol"):
            buf.copy_from_host("0123456789")
        with pytest.raises(TypeError, match="out must be writable"):
            buf.copy_to_host(b"0123456789")
        with pytest.raises(ValueError, match="C-contiguous"):
            buf.copy_from_host(memoryview(b"01234567890123456789")[::2])
        with pytest.raises(TypeError, match="stream"):
            buf.copy_from_host(b"0123456789", stream="s")
        with pytest.raises(ValueError, match="stream"):
            buf.copy_to_host(stream=-1)
        with pytest.raises(ValueError, match="other has 10 bytes, more than the buffer's 3"):
            small.copy_from_device(buf)
        with pytest.raises(TypeError, match="__cuda_array_interface__"):
            buf.copy_from_device(b"0123456789")
        with pytest.raises(TypeError, match="value"):
            buf.memset(1.0)
        with pytest.raises(TypeError, match="value"):
            buf.memset(True)
        with pytest.raises(ValueError, match="value=256"):
            buf.memset(256)
        with pytest.raises(ValueError, match="value=-1"):
            buf.memset(-1)
    assert buf.tobytes() == b"0123456789"


@pytest.mark.parametrize("src_kind", sorted(FACTORIES))
@pytest.mark.parametrize("dst_kind", ["device", "host", "managed"])
def test_copy_between_kinds(src_kind, dst_kind):
    data = pattern(3000, 1)
    src = Buffer.from_host(data, resource=FACTORIES[src_kind]())
    dst = Buffer(3000, resource=FACTORIES[dst_kind]())
    dst.copy_from_device(src)
    assert dst.tobytes() == data


class CAI:
    """A foreign device array: a uint32 view of a buffer through the array interface."""

    def __init__(self, buf, stream=None, strides=None, shape=None):
        self.buf = buf
        self.__cuda_array_interface__ = {
            "version": 3, "shape": shape or (buf.size // 4,), "typestr": "<u4",
            "data": (buf.ptr, False), "strides": strides, "stream": stream}


def test_copy_from_array_interface(emulator, monkeypatch):
    data = pattern(4000, 2)
    src = Buffer.from_host(data)
    dst = Buffer(4000)
    dst.copy_from_device(CAI(src))
    assert dst.tobytes() == data
    dst.copy_from_device(CAI(src, strides=(4,)))  # explicit C strides are fine
    with pytest.raises(ValueError, match="C-contiguous"):
        dst.copy_from_device(CAI(src, strides=(8,), shape=(1000,)))
    with pytest.raises(ValueError, match="other has 4004 bytes"):
        dst.copy_from_device(CAI(src, shape=(1001,)))
    rt = _hip.get_runtime()
    synced = []
    real = rt.fn.hipStreamSynchronize
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", lambda s: synced.append(s) or real(s))
    with hmr.Stream() as s:
        dst.copy_from_device(CAI(src, stream=s.handle))  # the producer's stream is waited for
        assert synced[0] == s.handle


def test_memset(resource):
    buf = Buffer(1000, resource=resource)
    for v in (0, 1, 0x7F, 0xFF):
        buf.memset(v)
        assert buf.tobytes() == bytes([v]) * 1000
    Buffer(0, resource=resource).memset(3)


# ---- construction --------------------------------------------------------------------------------
def test_defaults():
    buf = Buffer(64)
    assert buf.resource is get_current_device_resource()
    assert buf.stream == hmr.stream_ref(0) and buf.device == hmr.get_device()
    assert buf.alignment == 256
    assert Buffer(64, resource=HostMemoryResource()).device is None
    assert Buffer(64, resource=PinnedMemoryResource()).device == hmr.get_device()
    assert "size=64" in repr(buf) and "DeviceMemoryResource" in repr(buf)


def test_zero_size_allocates_nothing():
    rec = Recording()
    buf = Buffer(0, resource=rec)
    assert buf.ptr == 0 and buf.tobytes() == b"" and rec.calls == []
    buf.close()
    del buf
    gc.collect()
    assert rec.calls == []


def test_alignment():
    host = HostMemoryResource()
    for a in (1, 64, 4096):
        assert Buffer(100, resource=host, alignment=a).ptr % a == 0
    assert Buffer(100, alignment=128).alignment == 128


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"size": -1}, ValueError, "size"),
    ({"size": 1.5}, TypeError, "size"),
    ({"size": None}, TypeError, "size"),
    ({"size": "8"}, TypeError, "size"),
    ({"size": 8, "alignment": 3}, ValueError, "alignment"),
    ({"size": 8, "alignment": 2.0}, TypeError, "alignment"),
    ({"size": 8, "alignment": 512, "resource": "device"}, ValueError, "alignment"),
    ({"size": 8, "stream": "0"}, TypeError, "stream"),
    ({"size": 8, "stream": -2}, ValueError, "stream"),
    ({"size": 8, "resource": object()}, TypeError, "async_resource_ref"),
    ({"size": 8, "resource": DeviceMemoryResource}, TypeError, "resource"),
])
def test_bad_arguments(emulator, kwargs, exc, match):
    if kwargs.get("resource") == "device":
        kwargs = dict(kwargs, resource=DeviceMemoryResource())
    with no_native_call(emulator):
        with pytest.raises(exc, match=match):
            Buffer(**kwargs)


def test_injected_failures_leave_nothing(emulator, recwarn):
    before = emulator.live_allocations()
    emulator.inject_failure(code=2, calls="hipMalloc")
    with pytest.raises(OutOfMemoryError):
        Buffer(4096)
    emulator.inject_failure(code=1, calls="hipMemcpy")
    with pytest.raises(HipError, match="hipMemcpy"):
        Buffer.from_host(b"x" * 4096)
    with hmr.Stream() as s:
        emulator.inject_failure(code=1, calls="hipMemcpyAsync")
        with pytest.raises(HipError, match="hipMemcpyAsync"):
            Buffer.from_host(b"x" * 4096, stream=s)
    gc.collect()
    assert emulator.live_allocations() == before
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# ---- lifetime ------------------------------------------------------------------------------------
def test_close_is_idempotent_and_blocks_use(emulator):
    before = emulator.live_allocations()
    buf = Buffer.from_host(b"abcdef")
    assert emulator.live_allocations().count == before.count + 1
    buf.close()
    buf.close()
    assert buf.closed and emulator.live_allocations() == before
    for use in (lambda: buf.ptr, buf.tobytes, lambda: bytes(buf), lambda: buf.memset(0),
                lambda: buf.copy_from_host(b"abcdef"), buf.copy_to_host,
                lambda: buf.copy_from_device(buf), lambda: buf.__cuda_array_interface__,
                buf.__dlpack__, buf.__dlpack_device__, lambda: pickle.dumps(buf),
                lambda: buf.__enter__()):
        with pytest.raises(ValueError, match="closed"):
            use()
    assert buf.size == 6 and len(buf) == 6 and buf.device == 0
    assert buf.stream == 0 and buf.resource is get_current_device_resource()
    assert "closed" in repr(buf)


def test_context_manager_and_garbage_collection(emulator):
    before = emulator.live_allocations()
    with Buffer(1000) as buf:
        assert emulator.live_allocations().count == before.count + 1
    assert buf.closed and emulator.live_allocations() == before
    buf = Buffer(1000)
    del buf
    gc.collect()
    assert emulator.live_allocations() == before


def test_freed_on_the_allocation_stream_or_the_given_one():
    rec = Recording()
    with hmr.Stream() as s, hmr.Stream() as t:
        buf = Buffer(100, resource=rec, stream=s)
        assert rec.calls[-1][0] == "allocate" and rec.calls[-1][4] == s.handle
        ptr = buf.ptr
        buf.close()
        assert rec.calls[-1] == ("deallocate", ptr, 100, 256, s.handle)
        buf = Buffer(100, resource=rec, stream=s, alignment=64)
        ptr = buf.ptr
        buf.close(stream=t)
        assert rec.calls[-1] == ("deallocate", ptr, 100, 64, t.handle)
        buf = Buffer(100, resource=rec, stream=hmr.stream_per_thread)
        ptr = buf.ptr
        del buf
        gc.collect()
        assert rec.calls[-1] == ("deallocate", ptr, 100, 256, 2)
        s.synchronize()


def test_never_freed_twice():
    rec = Recording()
    buf = Buffer(100, resource=rec)
    buf.close()
    buf.close(stream=0)
    del buf
    gc.collect()
    assert [c[0] for c in rec.calls] == ["allocate", "deallocate"]
    buf = Buffer(100, resource=rec)
    with pytest.raises(TypeError):
        buf.close(stream="bad")  # a bad stream: nothing freed, still open
    assert not buf.closed
    buf.close()
    assert [c[0] for c in rec.calls].count("deallocate") == 2


def test_resource_and_stream_kept_alive(emulator, recwarn):
    before = emulator.live_allocations()
    r = AsyncMemoryResource()
    s = hmr.Stream()
    buf = Buffer.from_host(b"keep", resource=r, stream=s)
    s.synchronize()
    del r, s
    gc.collect()
    assert buf.tobytes() == b"keep"
    del buf
    gc.collect()
    assert emulator.live_allocations() == before
    assert not recwarn.list


def test_stream_closed_before_the_buffer(recwarn):
    rec = Recording()
    s = hmr.Stream()
    buf = Buffer(100, resource=rec, stream=s)
    ptr = buf.ptr
    s.close()
    del buf
    gc.collect()
    assert rec.calls[-1] == ("deallocate", ptr, 100, 256, 0)  # the null stream instead
    assert not recwarn.list


def test_resource_closed_before_the_buffer(recwarn):
    r = AsyncMemoryResource()
    buf = Buffer.from_host(b"abc", resource=r)
    r.close()
    assert buf.tobytes() == b"abc"
    buf.close()
    assert not recwarn.list


def test_failed_free_in_gc_is_a_warning():
    rec = Recording(fail_free=True)
    buf = Buffer(100, resource=rec)
    ptr = buf.ptr
    with pytest.warns(RuntimeWarning, match="refusing to free"):
        del buf
        gc.collect()
    rec.up.deallocate(ptr, 100)
    buf = Buffer(100, resource=rec)
    with pytest.raises(RuntimeError, match="refusing"):
        buf.close()  # an explicit close raises, and the buffer still owns the memory
    assert not buf.closed and buf.tobytes() == bytes(buf)
    rec.fail_free = False
    buf.close()  # a retry frees it
    assert buf.closed
    assert [c[0] for c in rec.calls[-2:]] == ["deallocate", "deallocate"]


def test_failed_close_then_garbage_collection(emulator):
    before = emulator.live_allocations()
    buf = Buffer(4096, resource=AsyncMemoryResource.from_default_pool())
    emulator.inject_failure(code=999, calls="hipFreeAsync")
    with pytest.raises(HipError, match="hipFreeAsync"):
        buf.close()
    assert not buf.closed
    del buf
    gc.collect()  # the finalizer frees it
    assert emulator.live_allocations() == before


EXIT_SCRIPT = r"""
import gc, sys
import hipmr_ctypes as hmr
from hipmr_ctypes.buffer import Buffer
from hipmr_ctypes.resources import *
keep = []
s = hmr.Stream()
for make in (DeviceMemoryResource, AsyncMemoryResource, PinnedMemoryResource,
             ManagedMemoryResource, HostMemoryResource):
    r = make()
    keep.append(Buffer.from_host(b"x" * 1000, resource=r, stream=s))
    keep.append(Buffer(4096, resource=r))
    del r                       # the resource is dropped before its buffers
a = AsyncMemoryResource()
keep.append(Buffer(100, resource=a, stream=hmr.stream_per_thread))
a.close()                       # closed before its buffer
t = hmr.Stream()
keep.append(Buffer(100, stream=t))
t.close()                       # the buffer's stream is gone
keep.append(Buffer(100).__dlpack__())   # a capsule nobody consumed
cycle = [Buffer(10)]
cycle.append(cycle)             # garbage in a cycle
del cycle
u = hmr.Stream()
keep.append(Buffer(100, stream=u))      # a live stream and a live buffer on it
"""


@pytest.mark.parametrize("ending", ["", "sys.exit(0)\n", "gc.collect()\n"])
def test_interpreter_exit_with_live_buffers_is_silent(ending):
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONWARNINGS="default")
    out = subprocess.run([sys.executable, "-X", "dev", "-c", EXIT_SCRIPT + ending], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""


# ---- the CUDA array interface --------------------------------------------------------------------
def test_cuda_array_interface():
    buf = Buffer(100)
    assert buf.__cuda_array_interface__ == {
        "version": 3, "shape": (100,), "typestr": "|u1", "data": (buf.ptr, False),
        "strides": None, "stream": None}
    with hmr.Stream() as s:
        b2 = Buffer(8, stream=s)
        assert b2.__cuda_array_interface__["stream"] == s.handle
        b2.close()
    assert Buffer(8, stream=hmr.stream_per_thread).__cuda_array_interface__["stream"] == 2
    assert hasattr(Buffer(8, resource=PinnedMemoryResource()), "__cuda_array_interface__")
    host = Buffer(8, resource=HostMemoryResource())
    assert not hasattr(host, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="host-only"):
        host.__cuda_array_interface__


# ---- DLPack --------------------------------------------------------------------------------------
_api = ctypes.PyDLL(None)
_IsValid = _api.PyCapsule_IsValid
_IsValid.restype, _IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_GetPointer = _api.PyCapsule_GetPointer
_GetPointer.restype, _GetPointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_SetName = _api.PyCapsule_SetName
_SetName.restype, _SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_USED = ctypes.create_string_buffer(b"used_dltensor")
_USED_VERSIONED = ctypes.create_string_buffer(b"used_dltensor_versioned")


def _consume(capsule, versioned=False):
    """What a consumer does: take the pointer, rename the capsule; returns the managed tensor."""
    name = b"dltensor_versioned" if versioned else b"dltensor"
    assert _IsValid(capsule, name)
    ptr = _GetPointer(capsule, name)
    _SetName(capsule, ctypes.cast(_USED_VERSIONED if versioned else _USED, ctypes.c_char_p))
    kind = _dlpack.DLManagedTensorVersioned if versioned else _dlpack.DLManagedTensor
    return kind.from_address(ptr), ptr


def _call_deleter(managed, ptr):
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(managed.deleter)(ptr)


@pytest.fixture
def exports():
    gc.collect()
    _dlpack.reap()
    base = _dlpack.live_exports()
    yield base
    gc.collect()
    assert _dlpack.live_exports() == base


def test_dlpack_device_on_emulated(emulator, resource):
    assert Buffer(16, resource=resource).__dlpack_device__() == (_dlpack.kDLCPU, 0)


@pytest.mark.parametrize("versioned", [False, True])
def test_dlpack_capsule_contents_and_deleter(exports, emulator, versioned):
    before = emulator.live_allocations()
    buf = Buffer.from_host(pattern(300))
    ptr = buf.ptr
    cap = buf.__dlpack__(max_version=(1, 0) if versioned else None)
    del buf
    gc.collect()
    assert _dlpack.live_exports() == exports + 1  # the capsule keeps the buffer alive
    assert emulator.live_allocations().count == before.count + 1
    managed, address = _consume(cap, versioned)
    t = managed.dl_tensor
    assert t.data == ptr and t.ndim == 1 and t.shape[0] == 300 and not t.strides
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1) and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (_dlpack.kDLCPU, 0)
    if versioned:
        assert (managed.version.major, managed.version.minor) == (1, 0)
        assert managed.flags == 0
    assert ctypes.string_at(t.data, 300) == pattern(300)
    del cap
    gc.collect()
    assert _dlpack.live_exports() == exports + 1  # consumed: only the deleter releases it
    _call_deleter(managed, address)
    gc.collect()
    assert _dlpack.live_exports() == exports
    assert emulator.live_allocations() == before


@pytest.mark.parametrize("versioned", [False, True])
def test_unconsumed_capsule_releases_the_buffer(exports, emulator, versioned):
    before = emulator.live_allocations()
    cap = Buffer.from_host(b"unused").__dlpack__(max_version=(1, 1) if versioned else (0, 8))
    assert _dlpack.live_exports() == exports + 1
    assert _IsValid(cap, b"dltensor_versioned" if versioned else b"dltensor")
    del cap
    gc.collect()
    assert _dlpack.live_exports() == exports
    assert emulator.live_allocations() == before


def test_capsule_dropped_while_an_exception_propagates(exports):
    buf = Buffer.from_host(b"exception")

    def consumer_that_fails():
        cap = buf.__dlpack__()  # noqa: F841
        raise KeyError("the consumer's own error")

    for _ in range(3):
        with pytest.raises(KeyError, match="the consumer's own error"):
            consumer_that_fails()
        with pytest.raises(ZeroDivisionError):
            [buf.__dlpack__(), 1 / 0]
    gc.collect()


def test_dlpack_arguments(exports):
    buf = Buffer(8)
    with pytest.raises(BufferError, match="copy=True"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        buf.__dlpack__(dl_device=(_dlpack.kDLCUDA, 0) if hmr.platform() == "emulated"
                       else (_dlpack.kDLCPU, 0))
    with pytest.raises(TypeError, match="stream"):
        buf.__dlpack__(stream="0")
    with pytest.raises(TypeError, match="max_version"):
        buf.__dlpack__(max_version=1)
    cap = buf.__dlpack__(stream=None, max_version=(1, 0), dl_device=buf.__dlpack_device__(),
                         copy=False)
    assert _IsValid(cap, b"dltensor_versioned")
    del cap


def test_numpy_from_dlpack(exports, emulator):
    np = pytest.importorskip("numpy")
    before = emulator.live_allocations()
    data = pattern(1000)
    for resource in (DeviceMemoryResource(), HostMemoryResource(), PinnedMemoryResource()):
        buf = Buffer.from_host(data, resource=resource)
        view = np.from_dlpack(buf)
        assert view.dtype == np.uint8 and view.shape == (1000,)
        assert view.tobytes() == data
        assert view.ctypes.data == buf.ptr  # the same memory, not a copy
        # numpy before 2.1 marks every DLPack import read-only (its DLPack 0.x import has no
        # read-only flag to read); from 2.1 a writable export gives a writable array
        numpy_version = tuple(int(x) for x in np.__version__.split(".")[:2])
        assert view.flags.writeable == (numpy_version >= (2, 1))
        if view.flags.writeable:
            view[:3] = 7
        else:
            buf.copy_from_host(b"\x07\x07\x07")
        assert buf.tobytes()[:4] == b"\x07\x07\x07" + data[3:4]
        assert view[:4].tobytes() == b"\x07\x07\x07" + data[3:4]
        del buf
        gc.collect()
        assert view[3] == data[3]  # still alive through the export
        del view
        gc.collect()
    assert np.from_dlpack(Buffer(0)).shape == (0,)
    gc.collect()
    assert emulator.live_allocations() == before


# ---- pickling ------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle(protocol):
    buf = Buffer.from_host(pattern(5000), resource=HostMemoryResource())
    copy = pickle.loads(pickle.dumps(buf, protocol=protocol))
    assert copy.tobytes() == buf.tobytes() and copy.ptr != buf.ptr
    assert copy.resource is get_current_device_resource()


def test_pickle_out_of_band():
    buf = Buffer.from_host(pattern(5000))
    buffers = []
    data = pickle.dumps(buf, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(data) < 1000
    copy = pickle.loads(data, buffers=buffers)
    assert copy.tobytes() == pattern(5000)


# ---- real GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_gpu_buffer_round_trips(gpu_runtime, kind):
    r = FACTORIES[kind]()
    data = pattern((4 << 20) + 1)
    with hmr.Stream() as s:
        for stream in (None, 0, s, hmr.stream_per_thread):
            buf = Buffer.from_host(data, resource=r, stream=stream)
            if stream is not None:
                hmr.stream_ref(stream).wait()
            assert buf.tobytes() == data
            other = Buffer(len(data), resource=FACTORIES["device"](), stream=stream)
            other.copy_from_device(buf)
            assert other.tobytes() == data
            buf.memset(0x5A)
            assert buf.tobytes() == b"\x5a" * len(data)
            buf.close()
            other.close()


@pytest.mark.gpu
def test_gpu_dlpack_device(gpu_runtime):
    gpu = _dlpack.kDLROCM if gpu_runtime.platform == "amd" else _dlpack.kDLCUDA
    dev = hmr.get_device()
    assert Buffer(8).__dlpack_device__() == (gpu, dev)
    assert Buffer(8, resource=AsyncMemoryResource.from_default_pool()).__dlpack_device__() \
        == (gpu, dev)
    assert Buffer(8, resource=HostMemoryResource()).__dlpack_device__() == (_dlpack.kDLCPU, 0)
    pinned = Buffer(8, resource=PinnedMemoryResource()).__dlpack_device__()
    managed = Buffer(8, resource=ManagedMemoryResource()).__dlpack_device__()
    if gpu_runtime.platform == "nvidia":
        assert pinned == (_dlpack.kDLCUDAHost, 0)
        assert managed == (_dlpack.kDLCUDAManaged, dev)
    else:
        assert pinned == (_dlpack.kDLROCMHost, 0)
        assert managed == (_dlpack.kDLROCM, dev)


@pytest.mark.gpu
def test_gpu_exit_with_live_buffers_is_silent(gpu_runtime):
    env = dict(os.environ, PYTHONWARNINGS="default")
    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""


class _Forwarding(hmr.forward_property):
    """An adaptor that names its upstream (forward_property)."""

    def __init__(self, upstream):
        self._up = upstream

    def upstream_resource(self):
        return self._up

    def allocate(self, bytes, alignment=256):
        return self._up.allocate(bytes, alignment)

    def deallocate(self, ptr, bytes, alignment=256):
        self._up.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes, alignment, stream):
        return self._up.allocate_async(bytes, alignment, stream)

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self._up.deallocate_async(ptr, bytes, alignment, stream)

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


class _Opaque(Recording):
    """Host- and device-accessible, but says nothing about its upstream."""
    properties = (hmr.device_accessible, hmr.host_accessible)


@pytest.mark.parametrize("make,expected", [
    (DeviceMemoryResource, "device"),
    (AsyncMemoryResource.from_default_pool, "device"),
    (HostMemoryResource, "host"),
    (PinnedMemoryResource, "pinned"),
    (ManagedMemoryResource, "managed"),
    (lambda: _Forwarding(ManagedMemoryResource()), "managed"),
    (lambda: _Forwarding(hmr.async_resource_ref[hmr.device_accessible, hmr.host_accessible](
        PinnedMemoryResource())), "pinned"),
    (lambda: _Opaque(ManagedMemoryResource()), "managed"),   # asks the runtime
    (lambda: _Opaque(PinnedMemoryResource()), "pinned"),
])
def test_memory_kind(emulator, make, expected):
    assert Buffer(64, resource=make())._memory_kind() == expected


def test_close_while_exported_defers_the_free(exports, emulator):
    before = emulator.live_allocations()
    buf = Buffer.from_host(b"shared memory")
    managed, address = _consume(buf.__dlpack__())
    buf.close()
    assert buf.closed
    with pytest.raises(ValueError, match="closed"):
        buf.tobytes()
    gc.collect()
    assert emulator.live_allocations().count == before.count + 1  # the consumer still reads
    assert ctypes.string_at(managed.dl_tensor.data, 13) == b"shared memory"
    del buf
    gc.collect()
    assert emulator.live_allocations().count == before.count + 1
    _call_deleter(managed, address)  # the consumer lets go: now it is freed
    gc.collect()
    assert emulator.live_allocations() == before


def test_close_after_numpy_export(exports, emulator):
    np = pytest.importorskip("numpy")
    before = emulator.live_allocations()
    buf = Buffer.from_host(b"numpy")
    view = np.from_dlpack(buf)
    buf.close()
    del buf
    gc.collect()
    assert view.tobytes() == b"numpy"
    del view
    gc.collect()
    assert emulator.live_allocations() == before


# ---- lifecycle: construction cache, garbage collection, interpreter exit --------------------------
TEARDOWN_SCRIPT = """
import sys
import hipmr_ctypes as h
from hipmr_ctypes import _hip

class User:
    def __init__(self, buf):
        self.buf = buf
    def __del__(self):
        try:
            data = self.buf.tobytes()
        except ValueError as exc:
            sys.stdout.write("closed: %s\\n" % exc)
        else:
            sys.stdout.write("read %r\\n" % data[:4])

pool = h.PoolResource(h.AsyncMemoryResource())
user = User(h.Buffer.from_host(b"user" * 16, resource=pool))   # a module global
cycle = User(h.Buffer.from_host(b"loop" * 16))
cycle.me = cycle                                                  # garbage in a cycle
del cycle
"""


def test_a_user_del_at_teardown_still_reads_its_buffer():
    """Nothing the package made is freed at exit while it may still be reachable: a user
    object's __del__ that runs during module teardown, or in the last garbage cycle, reads its
    buffer's real contents."""
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONWARNINGS="default")
    out = subprocess.run([sys.executable, "-X", "dev", "-c", TEARDOWN_SCRIPT], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert sorted(out.stdout.splitlines()) == ["read b'loop'", "read b'user'"], out.stdout


VIEW_SCRIPT = """
import sys
import numpy as np
import hipmr_ctypes as h

class User:
    def __init__(self, view):
        self.view = view
    def __del__(self):
        view = self.view                   # every 64 KiB page of the 64 MiB, read
        sys.stdout.write("sum %d\\n" % sum(int(view[i]) for i in range(255, len(view), 1 << 16)))

data = bytes(range(256)) * (1 << 18)                                 # 64 MiB
buf = h.Buffer.from_host(data, resource=h.HostMemoryResource())
user = User(np.from_dlpack(buf))        # a module global over the buffer's memory, no Buffer
del buf
"""


def test_a_numpy_view_of_a_buffer_is_readable_at_teardown():
    """A view the package cannot see (NumPy through DLPack over 64 MiB of host memory) read by
    a user __del__ during module teardown: the memory is still there, the process exits 0."""
    pytest.importorskip("numpy")
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    out = subprocess.run([sys.executable, "-c", VIEW_SCRIPT], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout == "sum %d\n" % (255 * 1024), out.stdout


def test_buffer_live_at_exit_stays_valid():
    code = ("import atexit, sys, hipmr_ctypes as h\n"
            "from hipmr_ctypes import _hip\n"
            "emu = _hip.get_runtime().emulator\n"
            "def report():\n"
            "    live = emu.live_allocations()\n"
            "    sys.stdout.write('%d %s %r\\n' % (live.count, keep.closed, keep.tobytes()[:2]))\n"
            "atexit.register(report)\n"   # registered first: runs after the package's hooks
            "keep = h.Buffer.from_host(b'ok' * 8, resource=h.AsyncMemoryResource())\n")
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "False", "b'ok'"]


def test_garbage_collection_frees_exactly_once_also_in_cycles(emulator):
    r = hmr.AsyncMemoryResource()
    before = emulator.live_allocations().count
    b = Buffer(1000, resource=r)
    assert emulator.live_allocations().count == before + 1
    del b
    assert emulator.live_allocations().count == before     # freed at once (refcount)

    class Holder:
        pass
    h = Holder()
    h.buf = Buffer(1000, resource=r)
    h.me = h
    del h
    gc.collect()
    assert emulator.live_allocations().count == before


def test_buffers_take_no_attributes_and_a_failed_init_leaves_nothing():
    b = Buffer(8)
    with pytest.raises(AttributeError):
        b.anything = 1
    with pytest.raises(TypeError):
        Buffer(8, resource=object())
    with pytest.raises(ValueError):
        Buffer(-1)
    gc.collect()  # the half-built buffers' __del__ ran silently


def test_concurrent_close_frees_exactly_once(emulator):
    import threading
    r = hmr.AsyncMemoryResource()
    before = emulator.live_allocations().count
    for _ in range(50):
        b = Buffer(256, resource=r)
        barrier = threading.Barrier(4)
        errors = []

        def close():
            barrier.wait()
            try:
                b.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        threads = [threading.Thread(target=close) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and b.closed
    del b
    gc.collect()
    assert emulator.live_allocations().count == before


def test_the_resource_check_is_cached_per_object_and_never_keeps_it_alive():
    import weakref
    from hipmr_ctypes._buffer import state as bm
    r = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(r)
    Buffer(64, resource=pool).close()
    assert id(pool) in bm._plans
    w = weakref.ref(pool)
    del pool
    gc.collect()
    assert w() is None                      # the cache held no strong reference
    assert all(entry[0] is None or entry[0]() is not None for entry in bm._plans.values())
    # a new object at a reused id is checked again, not mistaken for the old one
    host = HostMemoryResource()
    b = Buffer(64, resource=host)
    assert b.device is None and not hasattr(b, "__cuda_array_interface__")
    b.close()


def test_the_resource_seen_last_never_lends_its_facts_to_another():
    """Buffers on two devices' pools, directly and through refs of one class, in every order:
    each buffer gets the facts of its own resource (the state of the one seen last is reused
    only for that very resource, or a ref of a class seen with it to that very resource)."""
    from support import process_runtime
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(two):
        pools = [hmr.PoolResource(hmr.AsyncMemoryResource(d)) for d in (0, 1)]
        refs = [hmr.async_resource_ref[hmr.device_accessible](p) for p in pools]
        host = hmr.HostMemoryResource()
        order = [(0, "pool"), (0, "ref"), (1, "ref"), (1, "pool"), (0, "ref"), (1, "ref"),
                 (None, "host"), (0, "pool"), (0, "pool"), (1, "pool"), (1, "ref"), (0, "ref")]
        for d, how in order:
            resource = {"pool": pools[d] if d is not None else None,
                        "ref": refs[d] if d is not None else None, "host": host}[how]
            with Buffer(256, resource=resource) as buf:
                assert buf.device == d, (d, how)
                assert buf.resource is (host if how == "host" else pools[d])


def test_a_ref_and_its_resource_give_the_same_buffer_facts():
    r = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(r)
    ref = hmr.async_resource_ref[hmr.device_accessible](pool)
    a, b = Buffer(64, resource=pool), Buffer(64, resource=ref)
    assert a.resource is b.resource is pool
    assert a.device == b.device == r.device
    assert a.stream == b.stream == hmr.stream_ref(0)
    a.close()
    b.close()
    with pytest.raises(TypeError, match="synchronous"):
        Buffer(64, resource=hmr.resource_ref[hmr.device_accessible](pool))


def test_buffer_of_the_current_device_follows_the_device_and_the_runtime():
    """``Buffer(n)`` takes the resource of the calling thread's current device: with one
    device visible without asking the runtime (no other device can be current), with several
    by asking it on every buffer; a runtime loaded later is asked afresh; a failure of the
    question is the package's error and allocates nothing."""
    from support import process_runtime
    from hipmr_ctypes import device as device_module
    one = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1"})
    with process_runtime(one):
        one.emulator.inject_failure(code=999, count=1, calls="hipGetDevice")
        with Buffer(64) as buf:  # one device: the failure planted above is never reached
            assert buf.device == 0 and buf.resource is hmr.get_per_device_resource(0)
        assert one.fn.hipGetDevice(ctypes.c_int()) == 999  # still pending: it was not asked
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(two):
        pools = [hmr.AsyncMemoryResource(d) for d in (0, 1)]
        for d in (0, 1):
            hmr.set_per_device_resource(d, pools[d])
        for d in (1, 0, 1):
            with hmr.device.on_device(d):
                with Buffer(64) as buf:
                    assert buf.device == d and buf.resource is pools[d]
        live = two.emulator.live_allocations()
        # (asked again through the package's get_device to raise its error: fail both)
        two.emulator.inject_failure(code=101, count=2, calls="hipGetDevice")
        with pytest.raises(HipError):
            Buffer(64)
        assert two.emulator.live_allocations() == live
        assert device_module._devices[0] is two


def test_buffer_of_the_current_device_follows_every_change_of_its_resource(emulator):
    """``Buffer(n)`` remembers the current device's resource and what a buffer needs to know of
    it, and forgets both whenever the per-device table changes: each buffer comes from the
    resource set at the time, and a resource whose memory has no device of its own gets the
    current device every time."""
    from hipmr_ctypes._buffer import state as buffer_module
    first, second = hmr.PoolResource(AsyncMemoryResource()), AsyncMemoryResource()
    recording = Recording(hmr.PoolResource(AsyncMemoryResource()))  # names no device
    previous = hmr.set_current_device_resource(first)
    try:
        for resource in (first, first, second, recording, recording, first):
            hmr.set_current_device_resource(resource)
            for _ in range(2):
                with Buffer(512) as buf:
                    assert buf.resource is resource and buf.device == 0
            held = [entry[0] for entry in buffer_module._current.values()]
            assert held == ([] if resource is recording else [resource])
        assert [call[0] for call in recording.calls] == ["allocate", "deallocate"] * 4
    finally:
        hmr.set_current_device_resource(previous)
    assert not buffer_module._current


def test_buffers_alternating_resources_and_refs_get_each_its_own_facts():
    """A buffer recognises the resource seen last, and a ref of the class seen with it, by
    identity: alternating between two resources on two devices, directly and through refs of
    one class, every buffer has its own resource's device."""
    from support import process_runtime
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(two):
        pools = [hmr.PoolResource(AsyncMemoryResource(d)) for d in (0, 1)]
        ARef = hmr.async_resource_ref[hmr.device_accessible]
        refs = [ARef(p) for p in pools]
        for d in (0, 0, 1, 1, 0, 1, 0):
            for source in (pools[d], refs[d], refs[1 - d], pools[1 - d], refs[d]):
                with Buffer(256, resource=source) as buf:
                    expected = d if source in (pools[d], refs[d]) else 1 - d
                    assert buf.device == expected and buf.resource is pools[expected]


def test_buffers_of_one_resource_keep_their_own_facts(emulator):
    """Plain buffers of one resource share what they know of it; what one buffer changes
    (size, capacity, stream, closed) stays its own."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    a, b, c = Buffer(256, resource=pool), Buffer(256, resource=pool), Buffer(0, resource=pool)
    a.resize(100)                                    # within capacity
    assert (a.size, a.capacity(), b.size, b.capacity()) == (100, 256, 256, 256)
    b.reserve(1024)
    assert (b.capacity(), a.capacity(), c.capacity()) == (1024, 256, 0)
    with hmr.Stream() as s:
        c.reserve(64, stream=s)
        assert c.stream == s and a.stream == hmr.stream_ref(0)
        c.close()
    a.close()
    assert a.closed and not b.closed and c.closed
    assert b.ptr and b.alignment == 256 and a.device == b.device == c.device
    moved = b.release()
    assert (b.size, b.capacity(), moved.capacity(), b.closed) == (0, 0, 1024, False)
    del b
    gc.collect()
    assert not moved.closed
    moved.close()
    assert moved.closed and a.closed


def test_a_buffer_freed_by_another_thread_is_freed_once(emulator):
    """The claim is the deletion of the slot holding the free function: a second close()
    or the collector never frees again, and a failed free can be retried."""
    r = Recording(hmr.AsyncMemoryResource(), fail_free=True)

    def freed(since):  # the pointers of the frees that went through, since call ``since``
        return [c[1] for c in r.calls[since:] if c[0] == "deallocate"]

    b = Buffer(64, resource=r)
    with pytest.raises(RuntimeError):
        b.close()
    assert not b.closed and b.ptr
    r.fail_free = False
    start = len(r.calls)
    b.close()
    b.close()
    ptr = freed(start)[0]
    del b
    gc.collect()
    assert freed(start) == [ptr]
    start = len(r.calls)
    d = Buffer(64, resource=r)
    ptr = d.ptr
    del d
    gc.collect()
    assert freed(start) == [ptr]


def test_the_collector_finds_what_a_buffer_owns_without_an_exception(emulator):
    """__del__ tells an owning buffer from one that owns nothing (closed, empty, released)
    by its state, not by catching AttributeError, whichever way the buffer was made."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    with hmr.Stream() as s:
        def made():
            out = [Buffer(64, resource=pool, stream=s), Buffer(64, resource=pool, alignment=512),
                   Buffer(0, resource=pool), Buffer(0, resource=pool, stream=s),
                   Buffer(64, resource=pool)]
            out[4].resize(10)
            for b in out:
                b.close()
            e = Buffer(64, resource=pool)
            moved = e.release()
            moved.close()
            return out + [e, moved]
        raised = []

        def tracer(frame, event, arg):
            if frame.f_code.co_name == "__del__":
                return lambda f, ev, a: raised.append(a[0]) if ev == "exception" else None
            return None
        buffers = made()
        sys.settrace(tracer)
        try:
            del buffers
            gc.collect()
        finally:
            sys.settrace(None)
        assert raised == []


def test_device_to_device_copies_are_done_when_they_return(monkeypatch):
    """A plain hipMemcpy between device memory may return before the copy is done (CUDA's
    rule): copy_from_device and copy() on the null stream wait for it; a host copy does not
    need to."""
    rt = _hip.get_runtime()
    from support import spy_runtime_calls
    calls = spy_runtime_calls(monkeypatch, rt, "hipMemcpy", "hipStreamSynchronize")
    mr = hmr.DeviceMemoryResource()
    src = hmr.Buffer.from_host(b"\x07" * 4096, resource=mr)
    dst = hmr.Buffer(4096, resource=mr)
    calls.clear()
    dst.copy_from_device(src)
    assert calls == ["hipMemcpy", "hipStreamSynchronize"]
    calls.clear()
    copied = src.copy()
    assert calls == ["hipMemcpy", "hipStreamSynchronize"]
    calls.clear()
    assert dst.tobytes() == copied.tobytes() == b"\x07" * 4096
    assert "hipStreamSynchronize" not in calls   # device to host: done when hipMemcpy returns
    for b in (src, dst, copied):
        b.close()


@pytest.mark.parametrize("source, target, waits", [
    ("pinned", "device", False),    # from pinned memory: synchronous for the host
    ("device", "pinned", False),    # into host memory: done when hipMemcpy returns
    ("device", "host", False),
    ("host", "device", True),       # from pageable memory: may return once it is staged
    ("device", "device", True),
    ("managed", "device", True),
    ("device", "managed", True),
])
def test_copy_from_device_waits_only_where_the_copy_may_still_run(monkeypatch, source, target,
                                                                   waits):
    """``copy_from_device`` on the null stream waits for it after ``hipMemcpy`` unless the
    destination is pinned or host memory or the source is pinned memory; the bytes arrive
    either way."""
    rt = _hip.get_runtime()
    kinds = {"device": hmr.DeviceMemoryResource, "pinned": hmr.PinnedMemoryResource,
             "host": hmr.HostMemoryResource, "managed": hmr.ManagedMemoryResource}
    src = hmr.Buffer.from_host(b"\x05" * 8192, resource=kinds[source]())
    dst = hmr.Buffer(8192, resource=kinds[target]())
    assert (src._memory_kind(), dst._memory_kind()) == (source, target)
    calls = []
    real = rt.fn.hipStreamSynchronize
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", lambda s: calls.append(s) or real(s))
    dst.copy_from_device(src)
    assert (calls == [0]) is waits and (calls == []) is not waits
    monkeypatch.undo()
    assert dst.tobytes() == b"\x05" * 8192
    src.close()
    dst.close()

"""Foreign memory on the emulated platform: Buffer.from_handle, Buffer.from_dlpack (NumPy,
Buffers, DLPack test doubles with counting deleters), Buffer.fill, Buffer.host_view /
memoryview(buf), AsyncMemoryResource.from_pool_handle, and the nvidia memset shims."""
import ctypes
import gc
import os
import subprocess
import sys
import threading
import weakref

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer, _hip
from hipmr_ctypes._buffer import dlpack as _dlpack
from hipmr_ctypes._buffer.foreign import ForeignMemory
from hipmr_ctypes._hip.decls import DECL_BY_NAME

from support import REPO, process_runtime


def _pattern(n, seed=0):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


@pytest.fixture
def native_calls(monkeypatch):
    """Every HIP function called through the process-wide runtime, by name, in order."""
    rt = _hip.get_runtime()
    calls = []
    for name in DECL_BY_NAME:
        real = getattr(rt.fn, name)

        def spy(*args, _real=real, _name=name):
            calls.append(_name)
            return _real(*args)
        monkeypatch.setattr(rt.fn, name, spy)
    return calls


def _live(emulator):
    return emulator.live_allocations().count


class Owner:
    """An owner object whose life the tests watch."""


# ---- Buffer.from_handle ------------------------------------------------------------------------
def test_from_handle_view_of_host_memory_keeps_owner_until_close(emulator):
    data = bytearray(_pattern(100))
    raw = (ctypes.c_ubyte * 100).from_buffer(data)
    owner = Owner()
    owner.data = data
    alive = weakref.ref(owner)
    before = _live(emulator)
    view = Buffer.from_handle(ctypes.addressof(raw), 100, owner=owner)
    del owner
    gc.collect()
    assert alive() is not None
    assert isinstance(view.resource, ForeignMemory)
    assert view.device is None and view._memory_kind() == "host"
    assert view.tobytes() == _pattern(100)
    view.fill(3)
    assert bytes(data) == b"\x03" * 100
    view.close()
    gc.collect()
    assert alive() is None           # released at close
    assert view.closed and _live(emulator) == before   # freed nothing, allocated nothing
    view.close()                     # idempotent


def test_from_handle_view_released_when_dropped(emulator):
    dev = Buffer(64)
    owner = Owner()
    owner.buf = dev
    alive = weakref.ref(owner)
    view = Buffer.from_handle(dev.ptr, 64, owner=owner)
    del owner
    assert alive() is not None
    cycle = [view]
    cycle.append(cycle)
    del view, cycle
    gc.collect()
    assert alive() is None
    assert not dev.closed            # the view never frees the memory it views


def test_from_handle_finds_device_and_kind_from_the_pointer(emulator):
    cases = {"device": hmr.DeviceMemoryResource(), "pinned": hmr.PinnedMemoryResource(),
             "managed": hmr.ManagedMemoryResource(), "device_pool": hmr.AsyncMemoryResource()}
    for kind, resource in cases.items():
        with Buffer(256, resource=resource) as buf:
            view = Buffer.from_handle(buf.ptr + 16, 128, owner=buf)
            assert view._memory_kind() == kind.split("_")[0]
            assert view.device == 0
            assert view.size == 128 and view.ptr == buf.ptr + 16
            buf.fill(0x11223344, 4)
            assert view.tobytes() == bytes.fromhex("44332211") * 32
            view.close()


def test_from_handle_on_two_devices_reads_the_device_of_the_memory():
    emulated = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(emulated):
        buf = Buffer(64, resource=hmr.DeviceMemoryResource(1))
        view = Buffer.from_handle(buf.ptr, 64, owner=buf)
        assert view.device == 1 and view._memory_kind() == "device"
        assert Buffer.from_handle(buf.ptr, 64, owner=buf, device=0).device == 0  # as given
        view.close()
        buf.close()


def test_from_handle_with_resource_owns_and_frees_once_on_its_stream(emulator):
    stats = hmr.StatisticsResource(hmr.AsyncMemoryResource())
    with hmr.Stream() as s:
        ptr = stats.allocate_async(4096, 256, s)
        owner = Owner()
        alive = weakref.ref(owner)
        buf = Buffer.from_handle(ptr, 4096, resource=stats, stream=s, owner=owner)
        del owner
        assert buf.resource is stats and buf.stream == hmr.stream_ref(s)
        assert stats.allocation_counts.current_bytes == 4096
        buf.fill(7)
        assert buf.tobytes() == b"\x07" * 4096
        buf.close()
        buf.close()
        assert stats.allocation_counts.current_bytes == 0
        del buf
        gc.collect()
        assert alive() is None
        # dropped instead of closed: freed by the collector, once
        ptr = stats.allocate_async(100, 256, 0)
        buf = Buffer.from_handle(ptr, 100, resource=stats)
        del buf
        gc.collect()
        counts = stats.allocation_counts
        assert counts.current_bytes == 0 and counts.current_count == 0
        assert counts.total_count == 2


def test_from_handle_view_resize_and_copy_need_a_resource(emulator):
    src = Buffer(32)
    src.fill(9)
    view = Buffer.from_handle(src.ptr, 32, owner=src)
    with pytest.raises(BufferError, match="cannot allocate"):
        view.resize(64)
    assert view.size == 32 and view.tobytes() == b"\x09" * 32   # unchanged
    view.resize(16)                   # within the size: nothing moves
    assert view.tobytes() == b"\x09" * 16
    copy = view.copy(resource=hmr.DeviceMemoryResource())
    assert copy.tobytes() == b"\x09" * 16
    moved = view.release()            # the view moves into a new Buffer, owner and all
    assert view.size == 0 and moved.size == 16
    moved.close()


def test_from_handle_empty_view(emulator):
    owner = Owner()
    alive = weakref.ref(owner)
    view = Buffer.from_handle(0, 0, owner=owner)
    del owner
    assert view.size == 0 and view.ptr == 0 and view.tobytes() == b""
    view.close()
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("args, kwargs, error", [
    ((-1, 8), {}, ValueError),
    ((1.5, 8), {}, TypeError),
    ((True, 8), {}, TypeError),
    (("0x1000", 8), {}, TypeError),
    ((None, 8), {}, TypeError),
    ((0x1000, -8), {}, ValueError),
    ((0x1000, 8.0), {}, TypeError),
    ((0, 8), {}, ValueError),                       # NULL with a size
    ((1 << 64, 8), {}, ValueError),
    (((1 << 64) - 4, 8), {}, ValueError),           # runs past the address space
    ((0x1000, 8), {"device": 7}, ValueError),       # unknown device
    ((0x1000, 8), {"device": "0"}, TypeError),
    ((0x1000, 8), {"stream": "s"}, TypeError),
    ((0x1000, 8), {"stream": -1}, ValueError),
    ((0x1000, 8), {"resource": object()}, TypeError),
])
def test_from_handle_bad_input_raises_before_any_native_call(native_calls, args, kwargs,
                                                             error):
    with pytest.raises(error):
        Buffer.from_handle(*args, **kwargs)
    assert [c for c in native_calls if c not in ("hipGetDeviceCount",)] == []


def test_from_handle_refuses_a_closed_stream(native_calls):
    s = hmr.Stream()
    s.close()
    del native_calls[:]
    with pytest.raises(ValueError):
        Buffer.from_handle(0x1000, 8, stream=s)
    assert native_calls == []


# ---- DLPack test doubles ---------------------------------------------------------------------
_DELETER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DESTRUCTOR_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_py = ctypes.pythonapi
_new_capsule = _py.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_pointer = _py.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_valid = _py.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_records = {}        # managed address -> (record, producer, shape, strides): what a producer keeps
_deleted = []        # managed addresses, one entry per deleter call


def _deleter(managed):
    _deleted.append(managed)
    _records.pop(managed, None)


def _destructor(capsule):
    for name in (b"dltensor_versioned", b"dltensor"):
        if _capsule_valid(capsule, name):
            _deleter(_capsule_pointer(capsule, name))


_DELETER = _DELETER_T(_deleter)
_DESTRUCTOR = _DESTRUCTOR_T(_destructor)


class Producer:
    """A DLPack producer over ``memory`` (bytes-like, or (address, nbytes)), with the deleter
    above: each ``__dlpack__`` makes one capsule, and ``_deleted`` says how often its deleter
    ran."""

    def __init__(self, memory, shape=None, strides=None, bits=8, lanes=1, device=(1, 0),
                 version=(1, 0), flags=0, legacy_only=False, byte_offset=0):
        if isinstance(memory, tuple):
            self.address, self.nbytes = memory
        else:
            self.raw = (ctypes.c_ubyte * len(memory)).from_buffer(memory)
            self.address, self.nbytes = ctypes.addressof(self.raw), len(memory)
        self.shape = (self.nbytes,) if shape is None else shape
        self.strides, self.bits, self.lanes = strides, bits, lanes
        self.device, self.version, self.flags = device, version, flags
        self.legacy_only, self.byte_offset = legacy_only, byte_offset
        self.calls = []

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append(max_version)
        if self.legacy_only and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        versioned = max_version is not None and max_version[0] >= 1
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * max(ndim, 1))(
            *self.strides)
        record = (_dlpack.DLManagedTensorVersioned() if versioned
                  else _dlpack.DLManagedTensor())
        t = record.dl_tensor
        t.data = self.address
        t.device = _dlpack.DLDevice(*self.device)
        t.ndim = ndim
        t.dtype = _dlpack.DLDataType(1, self.bits, self.lanes)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = (ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
                     if strides is not None else None)
        t.byte_offset = self.byte_offset
        record.deleter = ctypes.cast(_DELETER, ctypes.c_void_p).value
        if versioned:
            record.version = _dlpack.DLPackVersion(*self.version)
            record.flags = self.flags
        address = ctypes.addressof(record)
        _records[address] = (record, self, shape, strides)
        name = b"dltensor_versioned" if versioned else b"dltensor"
        return _new_capsule(address, name, ctypes.cast(_DESTRUCTOR, ctypes.c_void_p).value)


@pytest.fixture
def deleted():
    del _deleted[:]
    yield _deleted
    gc.collect()


# ---- Buffer.from_dlpack --------------------------------------------------------------------------
def test_from_dlpack_versioned_view_calls_the_deleter_once(emulator, deleted):
    memory = bytearray(_pattern(64))
    producer = Producer(memory)
    alive = weakref.ref(producer)
    view = Buffer.from_dlpack(producer)
    assert producer.calls == [(1, 0)]
    del producer
    gc.collect()
    assert alive() is not None        # the producer's record holds it
    assert view.size == 64 and view.tobytes() == _pattern(64)
    assert deleted == []
    gc.collect()
    view.close()
    assert len(deleted) == 1
    view.close()
    del view
    gc.collect()
    assert len(deleted) == 1 and alive() is None


def test_from_dlpack_legacy_producer(emulator, deleted):
    memory = bytearray(_pattern(40))
    producer = Producer(memory, shape=(5, 2), bits=32, legacy_only=True)
    view = Buffer.from_dlpack(producer)
    assert producer.calls == [(1, 0), None]      # asked for 1.x first, then the legacy way
    assert view.size == 40 and view.tobytes() == _pattern(40)
    del view
    gc.collect()
    assert len(deleted) == 1


def test_from_dlpack_reads_shape_dtype_and_offset(emulator, deleted):
    memory = bytearray(_pattern(256))
    cases = [((4, 4, 2), None, 16, 1, 0, 4 * 4 * 2 * 2),
             ((3, 5), (5, 1), 8, 4, 0, 60),           # explicit C strides, 4 lanes
             ((2, 1, 3), (3, 99, 1), 8, 1, 8, 6),     # a stride of an extent-1 axis is free
             ((), None, 64, 1, 16, 8),                # 0-d
             ((0, 7), (7, 1), 32, 1, 0, 0)]           # empty
    for shape, strides, bits, lanes, offset, nbytes in cases:
        producer = Producer(memory, shape=shape, strides=strides, bits=bits, lanes=lanes,
                            byte_offset=offset)
        view = Buffer.from_dlpack(producer)
        assert view.size == nbytes, shape
        if nbytes:
            assert view.ptr == producer.address + offset
            assert view.tobytes() == bytes(memory[offset:offset + nbytes])
        view.close()
    assert len(deleted) == len(cases)


@pytest.mark.parametrize("kwargs, match", [
    ({"shape": (4, 4), "strides": (1, 4)}, "C-contiguous"),
    ({"shape": (4, 4), "strides": (8, 2)}, "C-contiguous"),
    ({"shape": (8,), "strides": (2,)}, "C-contiguous"),
    ({"bits": 4}, "whole number of bytes"),
    ({"bits": 1, "lanes": 3}, "whole number of bytes"),
    ({"lanes": 0}, "whole number of bytes"),
    ({"shape": (-4, 2)}, "negative"),
    ({"device": (4, 0)}, "device type 4"),           # kDLOpenCL
    ({"device": (2, 3)}, "out of range"),            # a device the runtime does not have
    ({"version": (2, 0)}, "DLPack 2.0"),
])
def test_from_dlpack_refuses_and_leaves_the_capsule_to_its_destructor(emulator, deleted,
                                                                      kwargs, match):
    memory = bytearray(64)
    producer = Producer(memory, **kwargs)
    with pytest.raises(ValueError, match=match):
        Buffer.from_dlpack(producer)
    gc.collect()
    assert len(deleted) == 1          # the unused capsule's destructor let the producer go


def test_from_dlpack_null_data_with_bytes_is_refused(emulator, deleted):
    with pytest.raises(ValueError, match="data pointer"):
        Buffer.from_dlpack(Producer((0, 16)))
    gc.collect()
    assert len(deleted) == 1


def test_from_dlpack_not_a_producer():
    with pytest.raises(TypeError, match="__dlpack__"):
        Buffer.from_dlpack(b"bytes")

    class Liar:
        def __dlpack__(self, **kwargs):
            return object()

    with pytest.raises(TypeError, match="not an unused DLPack capsule"):
        Buffer.from_dlpack(Liar())

    used = Producer(bytearray(8)).__dlpack__(max_version=(1, 0))
    ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ctypes.pythonapi.PyCapsule_SetName(used, b"used_dltensor_versioned")

    class Replayer:
        def __dlpack__(self, **kwargs):
            return used

    with pytest.raises(TypeError, match="not an unused DLPack capsule"):
        Buffer.from_dlpack(Replayer())


def test_from_dlpack_read_only_flag(emulator, deleted):
    memory = bytearray(_pattern(32))
    view = Buffer.from_dlpack(Producer(memory, flags=1))
    assert view.resource.readonly
    for write in (lambda: view.fill(1), lambda: view.memset(1),
                  lambda: view.copy_from_host(b"x"),
                  lambda: view.copy_from_device(Buffer(4))):
        with pytest.raises(BufferError, match="read-only"):
            write()
    assert bytes(memory) == _pattern(32)
    with view.host_view() as mv:
        assert mv.readonly and bytes(mv) == _pattern(32)
    assert view.tobytes() == _pattern(32)
    view.close()


def test_from_dlpack_numpy(emulator):
    np = pytest.importorskip("numpy")
    for a in (np.arange(24, dtype=np.int32).reshape(2, 3, 4), np.zeros((0, 3)),
              np.array(3.5), np.arange(10, dtype=np.uint8)[2:7],
              np.ones((3, 2), dtype=np.complex128), np.array([True, False])):
        base = sys.getrefcount(a)
        view = Buffer.from_dlpack(a)
        assert sys.getrefcount(a) > base     # the capsule's manager holds the array
        assert view.size == a.nbytes and view.tobytes() == a.tobytes()
        assert view._memory_kind() == "host" and view.device is None
        if a.size:
            assert view.ptr == a.ctypes.data
        del view
        gc.collect()
        assert sys.getrefcount(a) == base    # the deleter ran
    a = np.arange(16, dtype=np.uint16)
    view = Buffer.from_dlpack(a)
    view.fill(0xBEEF, 2)
    assert (a == 0xBEEF).all()
    with view.host_view() as mv:
        mv[0] = 1
    assert a[0] == (0xBEEF & 0xFF00) | 1
    view.close()
    b = np.arange(12).reshape(3, 4)
    base = sys.getrefcount(b)
    with pytest.raises(ValueError, match="C-contiguous"):
        Buffer.from_dlpack(b.T)
    gc.collect()
    assert sys.getrefcount(b) == base    # the refused capsule let its producer go
    ro = np.arange(4, dtype=np.int64)
    ro.flags.writeable = False
    try:
        view = Buffer.from_dlpack(ro)
    except (BufferError, TypeError):   # a NumPy that exports no read-only array
        pass
    else:
        with pytest.raises(BufferError):
            view.fill(0)
        view.close()
    assert ro.tolist() == [0, 1, 2, 3]


def test_from_dlpack_producer_kept_alive_through_gc_at_odd_moments(emulator):
    np = pytest.importorskip("numpy")
    a = np.arange(1000, dtype=np.float64)
    alive = weakref.ref(a)
    expected = a.tobytes()
    view = Buffer.from_dlpack(a)
    del a
    gc.collect()
    assert alive() is not None
    assert view.tobytes() == expected
    more = [Buffer.from_dlpack(view) for _ in range(3)]   # views of the view
    del view
    gc.collect()
    assert alive() is not None and more[0].tobytes() == expected
    more.append(more)
    del more
    gc.collect()
    gc.collect()
    assert alive() is None


@pytest.mark.reliability("copy_ownership_cases")
def test_from_dlpack_of_a_buffer_defers_its_free(emulator):
    before = _live(emulator)
    buf = Buffer.from_host(_pattern(300))
    view = Buffer.from_dlpack(buf)
    assert view.ptr == buf.ptr and view._memory_kind() == "device"
    buf.close()                       # a consumer uses it: only marked closed
    assert buf.closed and _live(emulator) == before + 1
    assert view.tobytes() == _pattern(300)
    view.close()                      # the last consumer let go: freed now, buf still held
    assert _live(emulator) == before
    assert _dlpack.live_exports() == 0 and buf.closed
    buf.close()
    del buf
    gc.collect()
    assert _live(emulator) == before


def test_from_dlpack_concurrent_closes_call_the_deleter_once(emulator, deleted):
    for _ in range(20):
        view = Buffer.from_dlpack(Producer(bytearray(8)))
        start = threading.Barrier(4)

        def close():
            start.wait()
            view.close()
        threads = [threading.Thread(target=close) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert view.closed
    gc.collect()
    assert len(deleted) == 20


# ---- Buffer.fill ------------------------------------------------------------------------------
FILL_RESOURCES = {"device": hmr.DeviceMemoryResource, "pool": hmr.AsyncMemoryResource,
                  "pinned": hmr.PinnedMemoryResource, "managed": hmr.ManagedMemoryResource,
                  "host": hmr.HostMemoryResource}


@pytest.mark.parametrize("kind", sorted(FILL_RESOURCES))
@pytest.mark.parametrize("stream", ["none", "null", "stream"])
def test_fill_every_width(emulator, kind, stream):
    resource = FILL_RESOURCES[kind]()
    with hmr.Stream() as s:
        arg = {"none": None, "null": 0, "stream": s}[stream]
        with Buffer(48, resource=resource, stream=s if stream == "stream" else None) as buf:
            for value, width, expected in [(0xAB, 1, b"\xab"), (0, 1, b"\x00"),
                                           (-1, 1, b"\xff"), (0x1234, 2, b"\x34\x12"),
                                           (-2, 2, b"\xfe\xff"),
                                           (0xDEADBEEF, 4, b"\xef\xbe\xad\xde"),
                                           (-(1 << 31), 4, b"\x00\x00\x00\x80"),
                                           (0x7FFFFFFF, 4, b"\xff\xff\xff\x7f")]:
                buf.fill(value, width, stream=arg)
                if arg is not None:
                    hmr.stream_ref(arg).wait()
                assert buf.tobytes() == expected * (48 // width), (value, width)


def test_fill_uses_the_element_memsets(native_calls):
    buf = Buffer(64)
    with hmr.Stream() as s:
        del native_calls[:]
        buf.fill(1, 1)
        buf.fill(1, 2)
        buf.fill(1, 4, stream=s)
        assert [c for c in native_calls if c.startswith("hipMemset")] == [
            "hipMemsetD8", "hipMemsetD16", "hipMemsetD32Async"]
    buf.close()


def test_fill_a_part_and_empty(emulator):
    with Buffer(64) as buf:
        buf.fill(0)
        part = Buffer.from_handle(buf.ptr + 8, 16, owner=buf)
        part.fill(0x0102, 2)
        assert buf.tobytes() == bytes(8) + b"\x02\x01" * 8 + bytes(40)
        part.close()
        empty = Buffer(0)
        empty.fill(5, 4)
        assert empty.tobytes() == b""


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((1,), {"width": 3}, ValueError, "width"),
    ((1,), {"width": 8}, ValueError, "width"),
    ((1,), {"width": 0}, ValueError, "width"),
    ((1,), {"width": True}, TypeError, "width"),
    ((1,), {"width": 2.0}, TypeError, "width"),
    ((256,), {}, ValueError, "fit"),
    ((-129,), {}, ValueError, "fit"),
    ((1 << 16,), {"width": 2}, ValueError, "fit"),
    ((1 << 32,), {"width": 4}, ValueError, "fit"),
    ((-(1 << 31) - 1,), {"width": 4}, ValueError, "fit"),
    ((1.0,), {}, TypeError, "value"),
    ((True,), {}, TypeError, "value"),
    (("1",), {}, TypeError, "value"),
    ((1,), {"stream": "x"}, TypeError, "stream"),
])
def test_fill_bad_input_raises_before_any_native_call(native_calls, args, kwargs, error, match):
    buf = Buffer(64)
    buf.fill(9)
    del native_calls[:]
    with pytest.raises(error, match=match):
        buf.fill(*args, **kwargs)
    assert native_calls == []
    assert buf.tobytes() == b"\x09" * 64
    buf.close()


def test_fill_size_and_alignment_checked_before_any_native_call(native_calls):
    buf = Buffer(64)
    odd = Buffer(6)
    del native_calls[:]
    with pytest.raises(ValueError, match="multiple of width=4"):
        odd.fill(1, 4)
    misaligned = Buffer.from_handle(buf.ptr + 2, 8, owner=buf)
    calls = len(native_calls)
    with pytest.raises(ValueError, match="aligned to width=4"):
        misaligned.fill(1, 4)
    misaligned.fill(0x0505, 2)     # 2-aligned: fine
    odd_address = Buffer.from_handle(buf.ptr + 1, 8, owner=buf)
    with pytest.raises(ValueError, match="aligned to width=2"):
        odd_address.fill(1, 2)
    assert [c for c in native_calls[calls:] if c.startswith("hipMemset")] == ["hipMemsetD16"]
    buf.close()
    with pytest.raises(ValueError, match="closed"):
        buf.fill(0)


# ---- host views ------------------------------------------------------------------------------
HOST_ACCESSIBLE = {"host": hmr.HostMemoryResource, "pinned": hmr.PinnedMemoryResource,
                   "managed": hmr.ManagedMemoryResource}


@pytest.mark.parametrize("kind", sorted(HOST_ACCESSIBLE))
def test_host_view_reads_and_writes(emulator, kind):
    buf = Buffer.from_host(_pattern(100), resource=HOST_ACCESSIBLE[kind]())
    with buf.host_view() as mv:
        assert not mv.readonly and mv.format == "B" and mv.shape == (100,)
        assert bytes(mv) == _pattern(100)
        mv[:4] = b"abcd"
    assert buf.tobytes()[:4] == b"abcd"
    with buf.host_view(readonly=True) as mv:
        assert mv.readonly
        with pytest.raises(TypeError):
            mv[0] = 1
    buf.close()


def test_host_view_of_device_memory_is_a_buffer_error(emulator):
    for resource in (hmr.DeviceMemoryResource(), hmr.AsyncMemoryResource()):
        with Buffer(8, resource=resource) as buf:
            with pytest.raises(BufferError, match="device memory"):
                buf.host_view()
            buf.close()           # nothing was pinned


@pytest.mark.parametrize("operation", ["close", "close_stream", "resize", "reserve", "release"])
def test_a_live_view_pins_the_buffer(emulator, operation):
    buf = Buffer.from_host(_pattern(64), resource=hmr.PinnedMemoryResource())
    mv = buf.host_view()
    part = mv[8:16]              # a view made from the view keeps the pin too
    mv.release()
    act = {"close": lambda: buf.close(), "close_stream": lambda: buf.close(stream=0),
           "resize": lambda: buf.resize(128), "reserve": lambda: buf.reserve(128),
           "release": lambda: buf.release()}[operation]
    with pytest.raises(BufferError, match="memoryview"):
        act()
    assert not buf.closed and buf.size == 64
    assert bytes(part) == _pattern(64)[8:16]
    part.release()
    act()                         # unpinned
    if operation == "release":
        assert buf.size == 0
    buf.close()


def test_a_dropped_view_unpins_at_collection(emulator):
    buf = Buffer(32, resource=hmr.HostMemoryResource())
    mv = buf.host_view()
    cycle = [mv]
    cycle.append(cycle)
    del mv, cycle
    gc.collect()
    buf.close()
    assert buf.closed


def test_host_view_holds_the_buffer(emulator):
    before = _live(emulator)
    buf = Buffer.from_host(_pattern(16), resource=hmr.PinnedMemoryResource())
    alive = weakref.ref(buf)
    mv = buf.host_view()
    del buf
    gc.collect()
    assert alive() is not None and bytes(mv) == _pattern(16)
    mv.release()
    gc.collect()
    assert alive() is None and _live(emulator) == before


def test_host_view_edge_cases(emulator):
    empty = Buffer(0, resource=hmr.HostMemoryResource())
    with empty.host_view() as mv:
        assert mv.nbytes == 0
    empty.close()
    with pytest.raises(ValueError, match="closed"):
        empty.host_view()
    with pytest.raises(TypeError):
        Buffer(8, resource=hmr.HostMemoryResource()).host_view(readonly=1)


def test_host_view_threads(emulator):
    buf = Buffer(4096, resource=hmr.PinnedMemoryResource())
    errors = []

    def work():
        try:
            for _ in range(200):
                with buf.host_view() as mv:
                    mv[0] = 1
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    gc.collect()
    buf.close()
    assert buf.closed


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the buffer protocol of Python classes "
                    "(__buffer__) exists from Python 3.12 on; host_view() is the way before")
def test_memoryview_of_a_buffer(emulator):
    buf = Buffer.from_host(_pattern(10), resource=hmr.PinnedMemoryResource())
    with memoryview(buf) as mv:
        assert bytes(mv) == _pattern(10) and not mv.readonly
        with pytest.raises(BufferError):
            buf.close()
    buf.close()
    with pytest.raises(BufferError):
        memoryview(Buffer(8))


_VERSIONS_SCRIPT = """
import sys, hipmr_ctypes as hmr
buf = hmr.Buffer.from_host(b"abc", resource=hmr.PinnedMemoryResource())
with buf.host_view() as v:
    v[0] = ord("x")
try:
    with memoryview(buf) as v:
        v[1] = ord("y")
    print("memoryview", bytes(buf))
except TypeError:
    print("no memoryview", bytes(buf))
try:
    buf.close()
    print("closed")
except BufferError:
    print("pinned")
"""


@pytest.mark.parametrize("version", ["3.9.18", "3.11.7", "3.13.0"])
def test_buffer_protocol_on_each_python(version):
    """What docs/interop.md says: host_view() everywhere, memoryview(buf) from 3.12 on."""
    python = f"/root/.pyenv/versions/{version}/bin/python"
    if not os.path.exists(python):
        pytest.skip(f"Python {version} is not installed here")
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO))
    env.pop("PYTHON_GIL", None)   # (set by a free-threaded run: a GIL build refuses it)
    out = subprocess.run([python, "-c", _VERSIONS_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if tuple(map(int, version.split(".")[:2])) >= (3, 12):
        assert out.stdout.split("\n")[:2] == ["memoryview b'xyc'", "closed"]
    else:
        assert out.stdout.split("\n")[:2] == ["no memoryview b'xbc'", "closed"]


# ---- AsyncMemoryResource.from_pool_handle ---------------------------------------------------------
def test_from_pool_handle_over_another_resources_pool(emulator):
    mine = hmr.AsyncMemoryResource()
    other = hmr.AsyncMemoryResource.from_pool_handle(mine.pool.handle)
    assert other.device == 0 and not other.pool.owned
    assert other == mine          # the same pool
    buf = Buffer.from_host(_pattern(1000), resource=other)
    assert mine.pool.used >= 1000
    buf.close()
    other.close()
    del other
    gc.collect()
    with Buffer(64, resource=mine) as still:   # the pool was not destroyed
        still.fill(1)
    mine.close()


def test_from_pool_handle_never_destroys_a_pool_made_elsewhere(emulator):
    rt = _hip.get_runtime()
    props = hmr._hip.types.hipMemPoolProps()
    props.allocType = hmr._hip.types.hipMemAllocationTypePinned
    props.location.type = hmr._hip.types.hipMemLocationTypeDevice
    props.location.id = 0
    out = ctypes.c_void_p()
    assert rt.fn.hipMemPoolCreate(out, props) == 0
    handle = out.value

    class CudaBindingsPool:          # cuda-bindings' handle objects: int() is the handle,
        def __int__(self):           # getPtr() the address of the object's own storage
            return handle

        def getPtr(self):
            return id(self)

    class HipPythonPool:             # hip-python's: int()
        def __int__(self):
            return handle

    for spelling in (handle, ctypes.c_void_p(handle), CudaBindingsPool(), HipPythonPool()):
        r = hmr.AsyncMemoryResource.from_pool_handle(spelling)
        assert r.pool.handle == handle and r.device == 0
        Buffer(100, resource=r).close()
        r.close()
        del r
        gc.collect()
    flags = ctypes.c_int()
    loc = hmr._hip.types.hipMemLocation(1, 0)
    assert rt.fn.hipMemPoolGetAccess(flags, handle, loc) == 0     # still there
    assert rt.fn.hipMemPoolDestroy(handle) == 0


def test_from_pool_handle_of_the_default_pool():
    emulated = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(emulated):
        default = hmr.AsyncMemoryResource.from_default_pool(1)
        r = hmr.AsyncMemoryResource.from_pool_handle(default.pool.handle)
        assert r.device == 1
        own = hmr.AsyncMemoryResource(0)
        own.pool.set_access(1)
        with pytest.raises(ValueError, match="pass device="):
            hmr.AsyncMemoryResource.from_pool_handle(own.pool.handle)
        assert hmr.AsyncMemoryResource.from_pool_handle(own.pool.handle, device=0).device == 0
        mine = hmr.AsyncMemoryResource(1)
        with pytest.raises(ValueError, match="cannot be used from device 0"):
            hmr.AsyncMemoryResource.from_pool_handle(mine.pool.handle, device=0)


@pytest.mark.parametrize("handle, error", [
    (None, TypeError), (True, TypeError), (1.0, TypeError), ("0x10", TypeError),
    (b"x", TypeError), (object(), TypeError), (-1, ValueError), (1 << 64, ValueError),
    (0, ValueError), (ctypes.c_void_p(), ValueError),
])
def test_from_pool_handle_bad_input_before_any_native_call(native_calls, handle, error):
    with pytest.raises(error):
        hmr.AsyncMemoryResource.from_pool_handle(handle)
    assert native_calls == []


def test_from_pool_handle_unknown_handle(emulator):
    with pytest.raises(ValueError, match="not a memory pool"):
        hmr.AsyncMemoryResource.from_pool_handle(0x12345678)
    with pytest.raises(ValueError):
        hmr.AsyncMemoryResource.from_pool_handle(0x1000, device=5)


# ---- the nvidia back end's memset shims ------------------------------------------------------------
def test_nvidia_memset_shims_call_the_driver_and_make_a_context_once():
    from hipmr_ctypes._hip.nvidia import _shims
    calls = []

    class FakeDriver:
        def __init__(self):
            self.fail_next = True

        def functions(self):
            def make(symbol):
                def call(*args):
                    calls.append((symbol,) + args)
                    if self.fail_next:
                        self.fail_next = False
                        return 201         # CUDA_ERROR_INVALID_CONTEXT
                    return 0
                return call
            return {s: make(s) for s in ("cuMemsetD8_v2", "cuMemsetD16_v2", "cuMemsetD32_v2",
                                         "cuMemsetD8Async", "cuMemsetD16Async",
                                         "cuMemsetD32Async")}

    contexts = []
    shims = _shims._context_shims(FakeDriver(), lambda: contexts.append(1) or 0)
    virtual_memory = ["hipMemAddressReserve", "hipMemAddressFree", "hipMemCreate",
                      "hipMemRelease", "hipMemMap", "hipMemUnmap", "hipMemSetAccess",
                      "hipMemGetAccess", "hipMemGetAllocationGranularity"]
    assert sorted(shims) == sorted([n for n in DECL_BY_NAME if n.startswith("hipMemsetD")]
                                   + ["hipMemGetAddressRange"] + virtual_memory)
    assert shims["hipMemsetD16"](0x1000, 0xABCD, 8) == 0
    assert calls == [("cuMemsetD16_v2", 0x1000, 0xABCD, 8)] * 2 and contexts == [1]
    assert shims["hipMemsetD32Async"](0x2000, -1, 4, 0x99) == 0
    assert calls[-1] == ("cuMemsetD32Async", 0x2000, -1, 4, 0x99) and contexts == [1]
    assert shims["hipMemsetD8"].__name__ == "hipMemsetD8"

    class NoDriver:
        def functions(self):
            return None
    with pytest.raises(hmr.NotSupportedError):
        _shims._context_shims(NoDriver(), lambda: 0)["hipMemsetD8"](0x1000, 1, 1)


def test_nvidia_back_end_maps_the_memsets_through_shims():
    from hipmr_ctypes._hip import nvidia
    for name in DECL_BY_NAME:
        if name.startswith("hipMemsetD"):
            assert name in nvidia._SHIMS and name not in nvidia.NAME_MAP


def test_collector_running_at_every_allocation(emulator, deleted):
    """gc at odd moments: with a threshold of 1 the collector runs inside the imports, the
    views, the weak-reference callbacks and the frees; every deleter still runs once."""
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        for i in range(25):
            memory = bytearray(_pattern(64, i))
            view = Buffer.from_dlpack(Producer(memory))
            mv = view.host_view()
            junk = [mv, view]
            junk.append(junk)             # a cycle holding both
            assert bytes(mv[:4]) == _pattern(64, i)[:4]
            del mv, view, junk
            if i % 7 == 0:
                gc.collect()
    finally:
        gc.set_threshold(*old)
    gc.collect()
    assert len(deleted) == 25


# ---- read-only memory stays read-only through every export ----------------------------------
def _flags(capsule):
    """The flags of a versioned DLPack capsule's tensor."""
    return _dlpack.DLManagedTensorVersioned.from_address(
        _capsule_pointer(id(capsule), b"dltensor_versioned")).flags


@pytest.mark.reliability("copy_ownership_cases")
def test_read_only_memory_stays_read_only_through_dlpack_and_cai(emulator, deleted):
    np = pytest.importorskip("numpy")
    frozen = bytes(_pattern(64))
    try:
        np.frombuffer(frozen, dtype=np.uint8).__dlpack__(max_version=(1, 0))
    except TypeError:
        pytest.skip(f"NumPy {np.__version__} has no versioned DLPack (2.1 and later): it "
                    f"cannot export read-only memory")
    view = Buffer.from_dlpack(np.frombuffer(frozen, dtype=np.uint8))
    assert view.resource.readonly
    capsule = view.__dlpack__(max_version=(1, 0))
    assert _flags(capsule) & _dlpack.FLAG_READ_ONLY
    del capsule
    with pytest.raises(BufferError, match="read-only"):
        view.__dlpack__()             # a legacy capsule cannot say read-only
    again = np.from_dlpack(view)     # NumPy asks for a versioned capsule
    assert not again.flags.writeable
    with pytest.raises(ValueError):
        again[0] = 1
    twice = Buffer.from_dlpack(view)
    assert twice.resource.readonly
    with pytest.raises(BufferError):
        twice.fill(0)
    del again
    twice.close()
    assert frozen == bytes(_pattern(64))
    # device memory a producer marked read-only: the CUDA Array Interface says so too
    buf = Buffer.from_host(_pattern(32))
    assert buf.__cuda_array_interface__["data"] == (buf.ptr, False)
    assert _flags(buf.__dlpack__(max_version=(1, 0))) == 0
    ro = Buffer.from_dlpack(Producer((buf.ptr, 32), device=(_dlpack.kDLCUDA, 0), flags=1))
    assert ro._memory_kind() == "device"
    assert ro.__cuda_array_interface__["data"] == (buf.ptr, True)
    with pytest.raises(BufferError, match="read-only"):
        ro.copy_from_device(buf)
    ro.close()
    view.close()
    buf.close()


# ---- a closed Buffer is freed when its last DLPack consumer lets go ------------------------
@pytest.mark.reliability("copy_ownership_cases")
def test_a_closed_buffer_is_freed_when_the_last_consumer_lets_go(emulator):
    np = pytest.importorskip("numpy")
    before = _live(emulator)
    buf = Buffer.from_host(_pattern(256), resource=hmr.PinnedMemoryResource())
    first, second = np.from_dlpack(buf), Buffer.from_dlpack(buf)
    buf.close()
    assert buf.closed and _live(emulator) == before + 1
    del first                          # one consumer left
    assert _live(emulator) == before + 1
    assert second.tobytes() == _pattern(256)
    second.close()                     # the last one: freed now, while buf is still held
    assert _live(emulator) == before and _dlpack.live_exports() == 0
    buf.close()                        # idempotent; nothing is freed twice
    del buf
    gc.collect()
    assert _live(emulator) == before


@pytest.mark.reliability("copy_ownership_cases")
def test_a_failed_free_when_the_last_consumer_lets_go_is_a_warning(emulator):
    before = _live(emulator)
    mr = hmr.AsyncMemoryResource()
    buf = Buffer.from_host(_pattern(64), resource=mr)
    view = Buffer.from_dlpack(buf)
    buf.close()
    emulator.inject_failure(calls="hipFreeAsync")
    with pytest.warns(RuntimeWarning):
        view.close()                   # the free inside the deleter fails: a warning
    assert _live(emulator) == before + 1   # still owned by buf
    del buf
    gc.collect()                       # the collector tries again
    assert _live(emulator) == before


# ---- release() keeps from_handle's owner with the memory ------------------------------------
@pytest.mark.reliability("copy_ownership_cases")
def test_release_moves_from_handles_owner_with_the_memory(emulator):
    mr = hmr.AsyncMemoryResource()
    ptr = mr.allocate_async(128, 256, 0)
    owner = Owner()
    alive = weakref.ref(owner)
    buf = Buffer.from_handle(ptr, 128, owner=owner, resource=mr)
    del owner
    moved = buf.release()
    del buf
    gc.collect()
    assert alive() is not None          # the moved Buffer owns the memory: the owner stays
    again = moved.release()             # and moves again
    del moved
    gc.collect()
    assert alive() is not None and again.size == 128
    again.close()
    del again
    gc.collect()
    assert alive() is None


# ---- from_dlpack applies from_handle's range checks ------------------------------------------
@pytest.mark.reliability("copy_ownership_cases")
@pytest.mark.parametrize("make, match", [
    (lambda m: Producer(m, shape=(2 ** 62, 2 ** 62)), "larger than 2\\*\\*63"),
    (lambda m: Producer(m, shape=(2 ** 31, 2 ** 31, 4)), "larger than 2\\*\\*63"),
    (lambda m: Producer((2 ** 64 - 100, 1000)), "past the end of the address space"),
    (lambda m: Producer((2 ** 64 - 4096, 100), byte_offset=4000), "past the end"),
])
def test_from_dlpack_refuses_memory_no_buffer_can_span(emulator, deleted, make, match):
    producer = make(bytearray(64))
    with pytest.raises(ValueError, match=match):
        Buffer.from_dlpack(producer)
    gc.collect()
    assert len(deleted) == 1            # the capsule was left to its own destructor


# ---- one answer for a Buffer's device ------------------------------------------------------
class Undeclared:
    """A resource that declares no properties, over ``allocate`` (host memory by default)."""

    def __init__(self, upstream=None):
        self.upstream = upstream
        self.blocks = {}

    def allocate(self, nbytes, alignment=256):
        if self.upstream is not None:
            return self.upstream.allocate(nbytes, alignment)
        block = ctypes.create_string_buffer(nbytes)
        self.blocks[ctypes.addressof(block)] = block
        return ctypes.addressof(block)

    def deallocate(self, ptr, nbytes, alignment=256):
        if self.upstream is not None:
            return self.upstream.deallocate(ptr, nbytes, alignment)
        del self.blocks[ptr]

    def allocate_async(self, nbytes, alignment, stream):
        return self.allocate(nbytes, alignment)

    def deallocate_async(self, ptr, nbytes, alignment, stream):
        self.deallocate(ptr, nbytes, alignment)

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


@pytest.mark.reliability("copy_ownership_cases")
def test_a_resource_that_declares_nothing_gets_one_answer_for_its_device(emulator):
    host = Buffer(64, resource=Undeclared())
    assert host.device is None               # before anything else asked
    assert host.__dlpack_device__() == (_dlpack.kDLCPU, 0) and host.device is None
    host.copy_from_host(_pattern(64))
    assert host.tobytes() == _pattern(64)
    other = Buffer(64, resource=Undeclared())
    assert other.__dlpack_device__() == (_dlpack.kDLCPU, 0) and other.device is None
    device = Buffer(64, resource=Undeclared(hmr.DeviceMemoryResource()))
    assert device.device == 0 and device._memory_kind() == "device"
    for buf in (host, other, device):
        buf.close()

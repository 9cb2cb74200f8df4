"""hmr.register_host / HostRegistration: pinning host memory that already exists
(hipHostRegister, hipHostUnregister, hipHostGetDevicePointer)."""
import array
import ctypes
import gc
import mmap

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._buffer import staging as _staging
from hipmr_ctypes._memory_query import pointer_kind


def _address(obj):
    return ctypes.addressof((ctypes.c_char * len(obj)).from_buffer(obj))


@pytest.fixture
def rt():
    return _hip.get_runtime()


# ---- what a registration is ----------------------------------------------------------------

def test_a_bytearray_is_pinned_while_registered(emulator):
    data = bytearray(range(256)) * 16
    gc.collect()   # what earlier tests left to the collector goes before the count
    before = emulator.live_allocations().count
    reg = hmr.register_host(data)
    assert isinstance(reg, hmr.HostRegistration)
    assert reg.ptr == _address(data) and reg.size == len(data)
    assert reg.obj is data and not reg.read_only and not reg.closed
    assert reg.device_ptr is None                       # not mapped
    assert pointer_kind(reg.ptr)[0] == "pinned"
    assert emulator.live_allocations().count == before + 1
    reg.close()
    assert reg.closed
    assert pointer_kind(_address(data))[0] is None
    assert emulator.live_allocations().count == before


def test_mapped_gives_the_device_address(emulator):
    data = bytearray(4096)
    with hmr.register_host(data, mapped=True) as reg:
        assert reg.device_ptr == reg.ptr   # one unified address space


def test_size_registers_the_leading_bytes():
    data = bytearray(8192)
    with hmr.register_host(data, 4096) as reg:
        assert reg.size == 4096
        assert pointer_kind(reg.ptr + 4095)[0] == "pinned"
        assert pointer_kind(reg.ptr + 4096)[0] is None


def test_an_int_address_with_a_size():
    host = (ctypes.c_char * 1024)()
    with hmr.register_host(ctypes.addressof(host), 1024) as reg:
        assert reg.ptr == ctypes.addressof(host) and reg.obj is None
        assert pointer_kind(reg.ptr)[0] == "pinned"


def test_close_is_idempotent_and_the_context_manager_closes():
    data = bytearray(100)
    with hmr.register_host(data) as reg:
        pass
    assert reg.closed
    reg.close()
    reg.close()
    with pytest.raises(ValueError, match="closed"):
        reg.ptr
    with pytest.raises(ValueError, match="closed"):
        reg.__enter__()
    assert "closed" in repr(reg)


def test_the_constructor_is_not_public():
    with pytest.raises(TypeError, match="register_host"):
        hmr.HostRegistration()


def test_garbage_collection_unregisters(emulator):
    data = bytearray(4096)
    gc.collect()   # what earlier tests left to the collector goes before the count
    before = emulator.live_allocations().count
    reg = hmr.register_host(data)
    del reg
    gc.collect()
    assert emulator.live_allocations().count == before
    data.extend(b"x")   # no export left


# ---- what cannot move while registered -----------------------------------------------------

def test_a_registered_bytearray_cannot_resize():
    data = bytearray(4096)
    reg = hmr.register_host(data)
    with pytest.raises(BufferError):
        data.extend(b"more")
    with pytest.raises(BufferError):
        del data[:10]
    assert len(data) == 4096
    reg.close()
    data.extend(b"more")
    assert len(data) == 4100


def test_a_registered_array_cannot_resize():
    data = array.array("d", [1.0] * 512)
    with hmr.register_host(data):
        with pytest.raises(BufferError):
            data.append(2.0)
    data.append(2.0)


def test_a_registered_mmap_cannot_close():
    m = mmap.mmap(-1, 1 << 16)
    with hmr.register_host(m) as reg:
        assert reg.size == 1 << 16
        with pytest.raises(BufferError):
            m.close()
    m.close()


def test_a_registered_numpy_array_cannot_resize():
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    a = np.zeros(1024, dtype=np.uint8)
    with hmr.register_host(a) as reg:
        assert reg.size == 1024
        with pytest.raises(ValueError):
            a.resize(2048)


# ---- refusals, before any native call ------------------------------------------------------

@pytest.mark.parametrize("call, error", [
    (lambda: hmr.register_host("text"), TypeError),
    (lambda: hmr.register_host(1.5), TypeError),
    (lambda: hmr.register_host(0x10000), TypeError),            # an address needs a size
    (lambda: hmr.register_host(0, 16), ValueError),
    (lambda: hmr.register_host(2 ** 64 - 8, 16), ValueError),
    (lambda: hmr.register_host(bytearray(8), 0), ValueError),
    (lambda: hmr.register_host(bytearray(8), -1), ValueError),
    (lambda: hmr.register_host(bytearray(8), 9), ValueError),
    (lambda: hmr.register_host(bytearray(8), 2.0), TypeError),
    (lambda: hmr.register_host(bytearray(8), True), TypeError),
    (lambda: hmr.register_host(bytearray()), ValueError),
    (lambda: hmr.register_host(bytearray(8), portable=1), TypeError),
    (lambda: hmr.register_host(bytearray(8), mapped=None), TypeError),
    (lambda: hmr.register_host(bytearray(8), read_only="no"), TypeError),
    (lambda: hmr.register_host(memoryview(bytearray(16))[::2]), ValueError),
    (lambda: hmr.register_host(b"read-only bytes"), TypeError),
])
def test_bad_arguments_are_refused_before_the_runtime(emulator, call, error):
    emulator.inject_failure(999, calls="hipHostRegister")
    with pytest.raises(error):
        call()
    assert emulator.pending_faults() == 1   # hipHostRegister was never called


def test_read_only_objects_need_read_only():
    data = b"x" * 4096
    with pytest.raises(TypeError, match="read_only=True"):
        hmr.register_host(data)
    with hmr.register_host(data, read_only=True) as reg:
        assert reg.read_only and reg.size == 4096


def test_double_and_overlapping_registrations_are_refused(emulator):
    data = bytearray(8192)
    with hmr.register_host(data, 4096) as reg:
        emulator.inject_failure(999, calls="hipHostRegister")
        with pytest.raises(ValueError, match="overlaps a live registration"):
            hmr.register_host(data)
        with pytest.raises(ValueError, match="overlaps"):
            hmr.register_host(reg.ptr + 100, 10)
        assert emulator.pending_faults() == 1
        emulator.clear_faults()
        # the bytes after the registered ones are free to register
        with hmr.register_host(reg.ptr + 4096, 4096):
            pass
    with hmr.register_host(data):   # once closed, the range can be registered again
        pass


def test_memory_the_runtime_knows_is_refused():
    pinned = hmr.PinnedMemoryResource()
    ptr = pinned.allocate(4096)
    try:
        with pytest.raises(ValueError, match="pinned memory"):
            hmr.register_host(ptr, 4096)
    finally:
        pinned.deallocate(ptr, 4096)
    device = hmr.DeviceMemoryResource()
    ptr = device.allocate(4096)
    try:
        with pytest.raises(ValueError, match="device memory"):
            hmr.register_host(ptr, 4096)
    finally:
        device.deallocate(ptr, 4096)


def test_a_runtime_refusal_raises_and_releases_the_object(emulator, rt):
    data = bytearray(4096)
    # another library registered the same memory: the package sees pinned memory
    assert rt.fn.hipHostRegister(_address(data), 4096, 0) == 0
    try:
        with pytest.raises(ValueError, match="pinned memory"):
            hmr.register_host(data)
    finally:
        assert rt.fn.hipHostUnregister(_address(data)) == 0
    # ... or some bytes inside it: the runtime says so
    assert rt.fn.hipHostRegister(_address(data) + 1024, 1024, 0) == 0
    try:
        with pytest.raises(hmr.HipError) as info:
            hmr.register_host(data)
        assert info.value.name == "hipErrorHostMemoryAlreadyRegistered"
    finally:
        assert rt.fn.hipHostUnregister(_address(data) + 1024) == 0
    data.extend(b"x")   # the export was released
    with hmr.register_host(data):   # and nothing stayed reserved
        pass


def test_a_failed_unregister_keeps_the_registration_open(emulator):
    data = bytearray(4096)
    reg = hmr.register_host(data)
    emulator.inject_failure(999, calls="hipHostUnregister")
    with pytest.raises(hmr.HipError):
        reg.close()
    assert not reg.closed
    with pytest.raises(BufferError):   # still pinned: still held
        data.extend(b"x")
    reg.close()
    assert reg.closed
    data.extend(b"x")


def test_a_failed_device_pointer_query_unregisters(emulator):
    data = bytearray(4096)
    emulator.inject_failure(999, calls="hipHostGetDevicePointer")
    with pytest.raises(hmr.HipError):
        hmr.register_host(data, mapped=True)
    assert pointer_kind(_address(data))[0] is None
    data.extend(b"x")


# ---- flags -----------------------------------------------------------------------------------

def test_flags_passed_to_the_runtime(monkeypatch, rt):
    seen = []
    real = rt.fn.hipHostRegister
    monkeypatch.setattr(rt.fn, "hipHostRegister",
                        lambda p, n, f: seen.append(f) or real(p, n, f))
    data = bytearray(64)
    for kwargs in ({}, {"portable": False}, {"mapped": True}, {"portable": False,
                                                                "mapped": True}):
        hmr.register_host(data, **kwargs).close()
    assert seen == [1, 0, 3, 2]
    hmr.register_host(bytes(64), read_only=True).close()
    # the read-only flag only where the runtime has one (not on AMD, whose headers give its
    # bit to hipExtHostRegisterCoarseGrained; the emulated platform models AMD)
    assert seen[-1] == (9 if rt.platform == "nvidia" else 1)


# ---- copies take the direct path; Buffer.from_handle sees pinned memory -----------------------

def test_copies_of_registered_memory_are_not_staged(monkeypatch):
    staged = []
    real_to_device = _staging.to_device
    monkeypatch.setattr(_staging, "to_device",
                        lambda *a: staged.append("to_device") or real_to_device(*a))
    n = max(_staging.threshold(_staging.to_device), 1 << 20)
    src = bytearray(b"\x5a") * n
    buf = hmr.Buffer(n)
    buf.copy_from_host(src)          # pageable: staged (the control)
    assert staged == ["to_device"]
    staged.clear()
    with hmr.register_host(src):
        buf.copy_from_host(src)
        buf.copy_from_host(src, stream=0)
    assert staged == []
    assert buf.tobytes() == bytes(src)


def test_a_copy_into_registered_memory():
    out = bytearray(4096)
    buf = hmr.Buffer(4096)
    buf.fill(7)
    with hmr.register_host(out):
        buf.copy_to_host(out)
    assert out == b"\x07" * 4096


def test_from_handle_sees_pinned_memory():
    data = bytearray(4096)
    with hmr.register_host(data) as reg:
        view = hmr.Buffer.from_handle(reg.ptr, reg.size, owner=reg)
        assert view._memory_kind() == "pinned"
        del view


# ---- on a GPU --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_registered_memory_round_trip_on_a_gpu(gpu_runtime):
    n = 64 << 20
    src = bytearray(b"\xa5\x3c") * (n // 2)
    out = bytearray(n)
    stream = hmr.Stream()
    with hmr.register_host(src) as a, hmr.register_host(out, mapped=True) as b:
        assert pointer_kind(a.ptr)[0] == "pinned"
        assert b.device_ptr
        buf = hmr.Buffer(n)
        buf.copy_from_host(src, stream=stream)
        buf.copy_to_host(out, stream=stream)
        stream.synchronize()
    assert out == src
    stream.close()


def test_an_interrupt_after_registering_undoes_it(monkeypatch, rt):
    data = bytearray(4096)

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(rt.fn, "hipHostGetDevicePointer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hmr.register_host(data, mapped=True)
    assert pointer_kind(_address(data))[0] is None
    data.extend(b"x")
    with hmr.register_host(data):
        pass

"""Unit tests of the emulated platform, call by call, through ``create_runtime("emulated")``.

Each test builds its own runtime (an ``env`` dict sets devices, memory and version), so tests
are independent of each other and of the process-wide runtime.
"""
from __future__ import annotations

import ctypes
import threading
import time
from ctypes import byref, c_float, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

import pytest

from hipmr_ctypes._hip import exceptions as errors
from hipmr_ctypes._hip.decls import DECLS
from hipmr_ctypes._hip.emulated import config_from_env, parse_size
from hipmr_ctypes._hip import create_runtime
from hipmr_ctypes._hip.types import (DEVICE_ATTRIBUTES, hipIpcMemHandle_t, hipMemAccessDesc,
                                     hipMemLocation, hipMemPoolProps, hipMemPoolPtrExportData,
                                     hipPointerAttribute_t)

pytestmark = pytest.mark.emulated

OK, INVALID, OOM, DIRECTION = 0, 1, 2, 21
NO_DEVICE, BAD_DEVICE, BAD_HANDLE, NOT_READY, PEER_ENABLED = 100, 101, 400, 600, 704
H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
MiB = 1 << 20
THRESHOLD, RESERVED, RESERVED_HIGH, USED, USED_HIGH = 4, 5, 6, 7, 8


def make(devices=1, memory="8MiB", **extra):
    env = {"HIPMR_EMULATED_DEVICES": str(devices), "HIPMR_EMULATED_MEMORY": str(memory)}
    env.update({f"HIPMR_EMULATED_{k.upper()}": v for k, v in extra.items()})
    return create_runtime("emulated", env=env)


@pytest.fixture
def rt():
    runtime = make()
    yield runtime
    runtime.emulator.reset()


def malloc(rt, size, call="hipMalloc", *args):
    out = c_void_p()
    rt.check(getattr(rt.fn, call)(out, size, *args), call)
    return out.value


def host_buffer(data: bytes):
    buf = ctypes.create_string_buffer(data, len(data))
    return buf, ctypes.addressof(buf)


def pool_attr(rt, pool, attr):
    value = c_uint64()
    rt.check(rt.fn.hipMemPoolGetAttribute(pool, attr, byref(value)))
    return value.value


def default_pool(rt, device=0):
    pool = c_void_p()
    rt.check(rt.fn.hipDeviceGetDefaultMemPool(pool, device))
    return pool.value


def free_bytes(rt):
    free, total = c_size_t(), c_size_t()
    rt.check(rt.fn.hipMemGetInfo(free, total))
    return free.value


def new_stream(rt, flags=0, priority=0):
    s = c_void_p()
    rt.check(rt.fn.hipStreamCreateWithPriority(s, flags, priority))
    return s.value


def new_event(rt, flags=0):
    e = c_void_p()
    rt.check(rt.fn.hipEventCreateWithFlags(e, flags))
    return e.value


def make_pool(rt, device=0, handle_types=0, max_size=0):
    props = hipMemPoolProps()
    props.allocType, props.handleTypes = 1, handle_types
    props.location.type, props.location.id = 1, device
    props.maxSize = max_size
    pool = c_void_p()
    rt.check(rt.fn.hipMemPoolCreate(pool, byref(props)))
    return pool.value


# ---- configuration, versions, errors ---------------------------------------------------------
def test_runtime_has_every_declared_function(rt):
    assert rt.platform == "emulated" and rt.library_path is None
    for decl in DECLS:
        assert callable(getattr(rt.fn, decl.name)), decl.name
    assert rt.emulator.device_count == 1 and rt.emulator.capacity(0) == 8 * MiB


@pytest.mark.parametrize("text, value", [
    ("1024", 1024), ("64MiB", 64 * MiB), ("2GiB", 2 << 30),
    ("1.5GiB", 3 << 29), ("10KB", 10_000), (" 3 kib ", 3072)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["512M", " 3 k ", "1_000", "80%", "0.5"])
def test_parse_size_is_the_package_grammar_without_fractions(text):
    # the one size grammar: no single-letter unit (1000 or 1024?), no fraction of a device
    with pytest.raises(ValueError, match="Could not parse"):
        parse_size(text)
    with pytest.raises(ValueError, match="HIPMR_EMULATED_MEMORY"):
        config_from_env({"HIPMR_EMULATED_MEMORY": text})


@pytest.mark.parametrize("env", [
    {"HIPMR_EMULATED_MEMORY": "lots"}, {"HIPMR_EMULATED_MEMORY": "5 parsecs"},
    {"HIPMR_EMULATED_DEVICES": "two"}, {"HIPMR_EMULATED_DEVICES": "-1"},
    {"HIPMR_EMULATED_VERSION": "six"}, {"HIPMR_EMULATED_MISSING": "hipMalloc"}])
def test_bad_configuration_is_a_value_error(env):
    with pytest.raises(ValueError):
        create_runtime("emulated", env=env)


def test_defaults():
    config = config_from_env({})
    assert (config.devices, config.memory, config.version) == (1, 1 << 30, (6, 2, 0))


def test_versions_and_init(rt):
    assert rt.runtime_version() == (6, 2, 0) and rt.driver_version() == (6, 2, 0)
    raw = c_int()
    assert rt.fn.hipRuntimeGetVersion(raw) == OK and raw.value == 60200000
    assert rt.fn.hipInit(0) == OK and rt.fn.hipInit(1) == INVALID
    assert make(version="7.1").runtime_version() == (7, 1, 0)


def test_missing_optional_function():
    rt = make(missing="hipStreamGetId, hipExtGetLastError")
    with pytest.raises(errors.NotSupportedError):
        rt.fn.hipStreamGetId(0, c_ulonglong())
    assert rt.fn.hipStreamGetDevice(0, c_int()) == OK


def test_error_names_and_strings(rt):
    assert rt.fn.hipGetErrorName(2) == b"hipErrorOutOfMemory"
    assert rt.fn.hipGetErrorName(12345) == b"hipErrorUnknown"
    assert rt.fn.hipGetErrorString(2) == b"out of memory"
    assert rt.fn.hipGetErrorName("x") == b"hipErrorUnknown"
    err = rt.error(OOM, "hipMalloc", size=10)
    assert isinstance(err, errors.OutOfMemoryError) and "out of memory" in str(err)


@pytest.mark.parametrize("status, cls", [
    (OOM, errors.OutOfMemoryError), (INVALID, errors.InvalidValueError),
    (BAD_HANDLE, errors.InvalidHandleError), (NOT_READY, errors.NotReadyError),
    (NO_DEVICE, errors.NoDeviceError)])
def test_statuses_become_the_right_exceptions(rt, status, cls):
    with pytest.raises(cls) as info:
        rt.check(status, "hipSomething")
    assert info.value.code == status and info.value.call == "hipSomething"


# ---- devices ----------------------------------------------------------------------------------
def test_devices_and_current_device_per_thread():
    rt = make(devices=3)
    count, dev = c_int(), c_int()
    assert rt.fn.hipGetDeviceCount(count) == OK and count.value == 3
    assert rt.fn.hipSetDevice(2) == OK and rt.fn.hipGetDevice(dev) == OK and dev.value == 2
    seen = []
    worker = threading.Thread(target=lambda: (rt.fn.hipGetDevice(dev), seen.append(dev.value)))
    worker.start()
    worker.join()
    assert seen == [0]
    assert rt.fn.hipSetDevice(3) == BAD_DEVICE and rt.fn.hipSetDevice(-1) == BAD_DEVICE
    rt.fn.hipGetDevice(dev)
    assert dev.value == 2


def test_device_name_total_mem_and_attributes():
    rt = make(devices=2, memory="3GiB")
    name = ctypes.create_string_buffer(64)
    assert rt.fn.hipDeviceGetName(name, len(name), 1) == OK
    assert name.value == b"HIPMR Emulated Device 1"
    short = ctypes.create_string_buffer(6)
    assert rt.fn.hipDeviceGetName(short, 6, 0) == OK and short.value == b"HIPMR"
    assert rt.fn.hipDeviceGetName(name, 64, 2) == BAD_DEVICE
    assert rt.fn.hipDeviceGetName(name, 0, 0) == INVALID
    assert rt.fn.hipDeviceGetName(b"immutable", 9, 0) == INVALID
    total = c_size_t()
    assert rt.fn.hipDeviceTotalMem(total, 1) == OK and total.value == 3 << 30
    value = c_int()
    for attr in DEVICE_ATTRIBUTES.values():
        assert rt.fn.hipDeviceGetAttribute(value, attr, 1) == OK, attr
    expected = {"warp_size": 64, "memory_pools_supported": 1, "managed_memory": 1,
                "concurrent_managed_access": 1, "compute_capability_major": 9,
                "multiprocessor_count": 4, "pci_bus_id": 1}
    for key, want in expected.items():
        rt.fn.hipDeviceGetAttribute(value, DEVICE_ATTRIBUTES[key], 1)
        assert value.value == want, key
    rt.fn.hipDeviceGetAttribute(value, 84, 0)   # TotalGlobalMem is clamped to INT32_MAX
    assert value.value == 2**31 - 1
    assert rt.fn.hipDeviceGetAttribute(value, 4242, 0) == INVALID
    assert rt.fn.hipDeviceGetAttribute(value, 87, 5) == BAD_DEVICE
    assert rt.fn.hipDeviceGetAttribute(None, 87, 0) == INVALID


def test_memory_pools_supported_follows_version():
    value = c_int()
    make(version="6.1.0").fn.hipDeviceGetAttribute(value, 88, 0)
    assert value.value == 0


def test_peer_access():
    rt = make(devices=2)
    can = c_int()
    assert rt.fn.hipDeviceCanAccessPeer(can, 0, 1) == OK and can.value == 1
    assert rt.fn.hipDeviceCanAccessPeer(can, 1, 1) == OK and can.value == 0
    assert rt.fn.hipDeviceCanAccessPeer(can, 0, 2) == BAD_DEVICE
    assert rt.fn.hipDeviceEnablePeerAccess(1, 0) == OK
    assert rt.fn.hipDeviceEnablePeerAccess(1, 0) == PEER_ENABLED
    assert rt.fn.hipDeviceEnablePeerAccess(0, 0) == BAD_DEVICE
    assert rt.fn.hipDeviceEnablePeerAccess(1, 7) == INVALID


def test_no_devices():
    rt = make(devices=0)
    count = c_int(5)
    assert rt.fn.hipGetDeviceCount(count) == NO_DEVICE and count.value == 0
    assert rt.fn.hipMalloc(c_void_p(), 16) == NO_DEVICE
    assert rt.fn.hipGetDevice(c_int()) == NO_DEVICE
    assert rt.runtime_version() == (6, 2, 0)
    with pytest.raises(errors.NoDeviceError):
        rt.check(rt.fn.hipSetDevice(0), "hipSetDevice")


# ---- plain memory -----------------------------------------------------------------------------
def test_bytes_round_trip_through_two_device_buffers(rt):
    payload = bytes(range(256)) * 4
    src = bytearray(payload)
    src_addr = ctypes.addressof((ctypes.c_char * len(src)).from_buffer(src))
    a, b = malloc(rt, len(payload)), malloc(rt, len(payload))
    assert a % 256 == 0 and b % 256 == 0 and a != b
    rt.check(rt.fn.hipMemcpy(a, src_addr, len(payload), H2D))
    rt.check(rt.fn.hipMemcpyAsync(b, a, len(payload), D2D, 0))
    back = ctypes.create_string_buffer(len(payload))
    rt.check(rt.fn.hipMemcpy(back, b, len(payload), D2H))
    assert back.raw == payload
    rt.check(rt.fn.hipMemset(b + 10, 0xAB, 5))
    rt.check(rt.fn.hipMemsetAsync(c_void_p(b), 0x101, 2, 0))   # value is taken modulo 256
    rt.check(rt.fn.hipMemcpy(back, b, 16, DEFAULT))
    assert back.raw[:16] == b"\x01\x01" + payload[2:10] + b"\xab" * 5 + payload[15:16]
    rt.check(rt.fn.hipFree(a))
    rt.check(rt.fn.hipFree(c_void_p(b)))
    assert rt.emulator.live_allocations() == (0, 0)


def test_size_zero_and_free_null(rt):
    out = c_void_p(1234)
    assert rt.fn.hipMalloc(out, 0) == OK and out.value is None
    assert rt.fn.hipHostMalloc(out, 0, 0) == OK and out.value is None
    assert rt.fn.hipFree(0) == OK and rt.fn.hipFree(None) == OK and rt.fn.hipHostFree(0) == OK
    assert rt.fn.hipMalloc(None, 16) == INVALID
    assert rt.emulator.live_allocations() == (0, 0)


def test_out_of_memory_at_capacity_leaves_state_unchanged(rt):
    capacity = rt.emulator.capacity(0)
    assert rt.fn.hipMalloc(c_void_p(), capacity + 1) == OOM
    whole = malloc(rt, capacity)
    assert free_bytes(rt) == 0
    out = c_void_p(99)
    assert rt.fn.hipMalloc(out, 1) == OOM and out.value is None
    assert rt.emulator.live_allocations() == (1, capacity)
    with pytest.raises(errors.OutOfMemoryError) as info:
        rt.check(rt.fn.hipMalloc(out, 1), "hipMalloc", size=1, device=0)
    assert isinstance(info.value, MemoryError) and info.value.size == 1
    rt.check(rt.fn.hipFree(whole))
    assert free_bytes(rt) == capacity
    assert rt.fn.hipMalloc(c_void_p(), 2**64 - 1) == OOM


def test_sizes_are_rounded_to_256_bytes(rt):
    capacity = rt.emulator.capacity(0)
    malloc(rt, 1)
    assert free_bytes(rt) == capacity - 256


def test_bad_frees(rt):
    ptr = malloc(rt, 1024)
    foreign, foreign_addr = host_buffer(b"x" * 64)
    assert rt.fn.hipFree(ptr + 256) == INVALID          # interior pointer
    assert rt.fn.hipFree(foreign_addr) == INVALID       # never given out
    assert rt.fn.hipFree(0xDEAD0000) == INVALID
    assert rt.fn.hipHostFree(ptr) == INVALID            # device memory is not pinned memory
    assert rt.fn.hipFree(ptr) == OK
    assert rt.fn.hipFree(ptr) == INVALID                # double free
    pinned = malloc(rt, 64, "hipHostMalloc", 0)
    assert rt.fn.hipFree(pinned) == INVALID
    assert rt.fn.hipHostFree(pinned) == OK and rt.fn.hipHostFree(pinned) == INVALID
    with pytest.raises(errors.InvalidValueError):
        rt.check(rt.fn.hipFree(ptr), "hipFree")


def test_copy_checks(rt):
    dev = malloc(rt, 512)
    host, host_addr = host_buffer(b"\0" * 1024)
    assert rt.fn.hipMemcpy(dev, host_addr, 513, H2D) == INVALID        # past the allocation
    assert rt.fn.hipMemcpy(dev + 500, host_addr, 12, H2D) == OK
    assert rt.fn.hipMemcpy(host_addr, dev, 512, H2D) == INVALID        # dst is not device memory
    assert rt.fn.hipMemcpy(dev, host_addr, 16, D2H) == INVALID         # src is not device memory
    assert rt.fn.hipMemcpy(host_addr, dev, 16, H2H) == INVALID         # device-only as host
    assert rt.fn.hipMemcpy(dev, 0, 16, H2D) == INVALID
    assert rt.fn.hipMemcpy(dev, 64, 16, H2D) == INVALID                # near NULL
    assert rt.fn.hipMemcpy(dev, host_addr, 16, 7) == DIRECTION
    assert rt.fn.hipMemcpy(dev, host_addr, 0, H2D) == OK
    assert rt.fn.hipMemcpy(dev, dev + 256, 256, 1024) == OK             # DeviceToDeviceNoCU
    assert rt.fn.hipMemcpyAsync(dev, host_addr, 16, H2D, 0xBAD0) == BAD_HANDLE
    assert rt.fn.hipMemset(host_addr, 0, 16) == INVALID
    assert rt.fn.hipMemset(dev, 0, 513) == INVALID
    assert rt.fn.hipMemsetAsync(dev, 0, 16, 0xBAD0) == BAD_HANDLE
    # a host range running into an emulated allocation is refused
    assert rt.fn.hipMemcpy(dev - 16, dev, 32, DEFAULT) == INVALID


def test_host_buffers_that_know_their_size_are_checked(rt):
    dev = malloc(rt, 512)
    small = ctypes.create_string_buffer(16)
    assert rt.fn.hipMemcpy(small, dev, 17, D2H) == INVALID
    assert rt.fn.hipMemcpy(byref(small, 8), dev, 9, D2H) == INVALID
    assert rt.fn.hipMemcpy(small, dev, 16, D2H) == OK
    assert rt.fn.hipMemcpy(dev, b"abcd", 4, H2D) == OK
    assert rt.fn.hipMemcpy(dev, b"abcd", 100, H2D) == INVALID
    assert rt.fn.hipMemcpy(b"immutable", dev, 4, D2H) == INVALID
    attrs = hipPointerAttribute_t()
    assert rt.fn.hipMemcpyAsync(byref(attrs), dev, ctypes.sizeof(attrs) + 1, D2H, 0) == INVALID
    assert rt.fn.hipMemcpyAsync(byref(attrs), dev, ctypes.sizeof(attrs), D2H, 0) == OK
    assert rt.fn.hipMemcpy(attrs, dev, 8, D2H) == INVALID   # a bare structure is not a void*


def test_pinned_and_managed_memory(rt):
    assert rt.fn.hipHostMalloc(c_void_p(), 64, 0x8) == INVALID                 # unknown flag
    assert rt.fn.hipHostMalloc(c_void_p(), 64, 0xC0000000) == INVALID          # both coherences
    pinned = malloc(rt, 4096, "hipHostMalloc", 2)
    free_before = free_bytes(rt)
    assert rt.fn.hipMallocManaged(c_void_p(), 64, 0) == INVALID
    assert rt.fn.hipMallocManaged(c_void_p(), 64, 4) == INVALID
    managed = malloc(rt, 4096, "hipMallocManaged", 1)
    assert free_bytes(rt) == free_before - 4096                  # managed counts, pinned not
    # both are host- and device-accessible
    ctypes.memset(pinned, 0x5A, 4096)
    rt.check(rt.fn.hipMemcpy(managed, pinned, 4096, H2D))
    assert ctypes.string_at(managed, 4) == b"ZZZZ"
    rt.check(rt.fn.hipMemcpy(pinned, managed, 4096, D2H))
    rt.check(rt.fn.hipMemPrefetchAsync(managed, 4096, 0, 0))
    rt.check(rt.fn.hipMemPrefetchAsync(managed + 64, 64, -1, 0))        # to the host
    assert rt.fn.hipMemPrefetchAsync(managed, 4097, 0, 0) == INVALID
    assert rt.fn.hipMemPrefetchAsync(pinned, 64, 0, 0) == INVALID
    assert rt.fn.hipMemPrefetchAsync(managed, 64, 3, 0) == BAD_DEVICE
    assert rt.fn.hipMemPrefetchAsync(managed, 64, 0, 0xBAD0) == BAD_HANDLE
    assert rt.fn.hipFree(managed) == OK
    assert rt.fn.hipHostFree(pinned) == OK


def test_pinned_host_cap():
    rt = make(host_memory="1MiB")
    p = malloc(rt, MiB, "hipHostMalloc", 0)
    assert rt.fn.hipHostMalloc(c_void_p(), 1, 0) == OOM
    rt.check(rt.fn.hipHostFree(p))


def test_pointer_attributes(rt):
    dev = malloc(rt, 1024)
    pinned = malloc(rt, 64, "hipHostMalloc", 1)
    managed = malloc(rt, 64, "hipMallocManaged", 2)
    attrs = hipPointerAttribute_t()
    rt.check(rt.fn.hipPointerGetAttributes(attrs, dev + 8))
    assert (attrs.type, attrs.device, attrs.devicePointer, attrs.hostPointer) == (2, 0, dev + 8,
                                                                                   None)
    rt.check(rt.fn.hipPointerGetAttributes(byref(attrs), pinned))
    assert (attrs.type, attrs.hostPointer, attrs.isManaged, attrs.allocationFlags) == (
        1, pinned, 0, 1)
    rt.check(rt.fn.hipPointerGetAttributes(attrs, managed))
    assert (attrs.type, attrs.isManaged, attrs.allocationFlags) == (3, 1, 2)
    _, foreign = host_buffer(b"abc")
    assert rt.fn.hipPointerGetAttributes(attrs, foreign) == INVALID
    assert rt.fn.hipPointerGetAttributes(attrs, dev + 1024) == INVALID
    assert rt.fn.hipPointerGetAttributes(None, dev) == INVALID
    old = make(version="5.7.1")
    ptr = malloc(old, 16)
    old.check(old.fn.hipPointerGetAttributes(attrs, ptr))
    assert attrs.type == 1   # hipMemoryTypeDevice in HIP 5 numbering


def test_ipc_handle_and_pool_export(rt):
    import os
    dev = malloc(rt, 1024)
    h1, h2 = hipIpcMemHandle_t(), hipIpcMemHandle_t()
    rt.check(rt.fn.hipIpcGetMemHandle(h1, dev))
    rt.check(rt.fn.hipIpcGetMemHandle(byref(h2), dev))
    assert bytes(h1)[:8] == b"HIPMRIPC" and bytes(h1) == bytes(h2)
    assert rt.fn.hipIpcGetMemHandle(h1, 0xDEAD0000) == INVALID
    assert rt.fn.hipIpcGetMemHandle(h1, malloc(rt, 64, "hipHostMalloc", 0)) == INVALID
    export = hipMemPoolPtrExportData()
    plain_pool_ptr = malloc(rt, 64, "hipMallocAsync", 0)
    assert rt.fn.hipMemPoolExportPointer(export, plain_pool_ptr) == INVALID
    assert rt.fn.hipMemPoolExportPointer(export, dev) == INVALID
    fd_pool = make_pool(rt, handle_types=1)
    shared = malloc(rt, 64, "hipMallocFromPoolAsync", fd_pool, 0)
    # as in CUDA: only a pointer of a pool that was itself exported ("already shared")
    assert rt.fn.hipMemPoolExportPointer(export, shared) == INVALID
    fd = c_int(-1)
    rt.check(rt.fn.hipMemPoolExportToShareableHandle(byref(fd), fd_pool, 1, 0))
    os.close(fd.value)   # the pool stays shared once exported
    rt.check(rt.fn.hipMemPoolExportPointer(export, shared))
    assert bytes(export)[:8] == b"HMRPTR01"


def test_pool_sharing_functions():
    """Export a pool's descriptor, import it (in this process: it maps the same pages at
    another address), import a pointer, unmap it; each refusal the real runtimes make."""
    import os
    rt = make(devices=2)
    plain = make_pool(rt)
    shared = make_pool(rt, handle_types=1)
    fd = c_int(-1)
    assert rt.fn.hipMemPoolExportToShareableHandle(byref(fd), plain, 1, 0) == INVALID
    assert rt.fn.hipMemPoolExportToShareableHandle(byref(fd), shared, 2, 0) == INVALID
    assert rt.fn.hipMemPoolExportToShareableHandle(byref(fd), shared, 1, 1) == INVALID
    rt.check(rt.fn.hipMemPoolExportToShareableHandle(byref(fd), shared, 1, 0))
    ptr = malloc(rt, 1000, "hipMallocFromPoolAsync", shared, 0)
    ctypes.memset(ptr, 0x42, 1000)
    export = hipMemPoolPtrExportData()
    rt.check(rt.fn.hipMemPoolExportPointer(export, ptr))
    assert rt.fn.hipMemPoolExportPointer(export, ptr + 256) == INVALID   # not a start
    imported = c_void_p()
    r, w = os.pipe()
    assert rt.fn.hipMemPoolImportFromShareableHandle(imported, r, 1, 0) == INVALID
    os.close(r)
    os.close(w)
    assert rt.fn.hipMemPoolImportFromShareableHandle(imported, fd.value, 0, 0) == INVALID
    rt.check(rt.fn.hipMemPoolImportFromShareableHandle(imported, fd.value, 1, 0))
    os.close(fd.value)   # the import keeps its own mapping
    mapped = c_void_p()
    assert rt.fn.hipMemPoolImportPointer(mapped, shared, export) == INVALID   # not imported
    forged = hipMemPoolPtrExportData.from_buffer_copy(bytes(export)[:8] + b"\0" * 56)
    assert rt.fn.hipMemPoolImportPointer(mapped, imported, forged) == INVALID
    rt.check(rt.fn.hipMemPoolImportPointer(mapped, imported, export))
    assert mapped.value != ptr and ctypes.string_at(mapped.value, 4) == b"BBBB"
    assert rt.fn.hipMemPoolImportPointer(c_void_p(), imported, export) == INVALID  # mapped
    out = c_void_p()
    assert rt.fn.hipMallocFromPoolAsync(out, 256, imported, 0) == INVALID
    assert rt.fn.hipDeviceSetMemPool(0, imported) == INVALID
    assert rt.fn.hipMemPoolExportToShareableHandle(byref(fd), imported, 1, 0) == INVALID
    desc = hipMemAccessDesc()
    desc.location.type, desc.location.id, desc.flags = 1, 1, 3
    rt.check(rt.fn.hipMemPoolSetAccess(imported, desc, 1))
    ctypes.memset(mapped.value, 0x43, 10)
    assert ctypes.string_at(ptr, 2) == b"CC"
    rt.check(rt.fn.hipFreeAsync(mapped, 0))                # unmaps
    assert ctypes.string_at(ptr, 2) == b"CC"               # the exporter's memory stays
    rt.check(rt.fn.hipMemPoolDestroy(imported))
    rt.check(rt.fn.hipFreeAsync(ptr, 0))
    rt.check(rt.fn.hipMemPoolDestroy(shared))


def test_legacy_handles_cannot_be_opened():
    rt = make()
    handle = hipIpcMemHandle_t()
    rt.check(rt.fn.hipIpcGetMemHandle(handle, malloc(rt, 512)))
    out = c_void_p()
    assert rt.fn.hipIpcOpenMemHandle(out, handle, 0) == INVALID    # 6.x needs flag 1
    assert rt.fn.hipIpcOpenMemHandle(out, handle, 1) == 801
    assert rt.fn.hipIpcOpenMemHandle(out, hipIpcMemHandle_t(), 1) == INVALID
    old = make(version="5.2.3")
    assert old.fn.hipIpcOpenMemHandle(out, handle, 1) == INVALID   # 5.x needs flag 0
    assert old.fn.hipIpcOpenMemHandle(out, handle, 0) == 801
    assert rt.fn.hipIpcCloseMemHandle(0x10000) == INVALID


# ---- streams ----------------------------------------------------------------------------------
def test_stream_lifecycle_and_properties():
    rt = make(devices=2)
    least, greatest = c_int(), c_int()
    rt.check(rt.fn.hipDeviceGetStreamPriorityRange(least, greatest))
    assert (least.value, greatest.value) == (0, -1)
    assert rt.fn.hipDeviceGetStreamPriorityRange(None, greatest) == OK
    s1 = new_stream(rt, 0, -5)
    rt.fn.hipSetDevice(1)
    s2 = new_stream(rt, 1, 7)
    assert len({s1, s2, 0, 1, 2}) == 5
    prio, flags, dev, sid1, sid2 = c_int(), c_uint(), c_int(), c_ulonglong(), c_ulonglong()
    rt.check(rt.fn.hipStreamGetPriority(s1, prio))
    assert prio.value == -1                      # clamped to the greatest priority
    rt.check(rt.fn.hipStreamGetPriority(s2, prio))
    assert prio.value == 0
    rt.check(rt.fn.hipStreamGetFlags(s2, flags))
    assert flags.value == 1
    rt.check(rt.fn.hipStreamGetDevice(s1, dev))
    assert dev.value == 0
    rt.check(rt.fn.hipStreamGetDevice(0, dev))   # the null stream of the current device
    assert dev.value == 1
    rt.check(rt.fn.hipStreamGetId(s1, sid1))
    rt.check(rt.fn.hipStreamGetId(s2, sid2))
    assert sid1.value != sid2.value
    assert rt.fn.hipStreamCreateWithPriority(c_void_p(), 2, 0) == INVALID
    assert rt.fn.hipStreamCreateWithPriority(None, 0, 0) == INVALID
    for special in (0, 1, 2, None):
        assert rt.fn.hipStreamSynchronize(special) == OK
        assert rt.fn.hipStreamQuery(special) == OK
        assert rt.fn.hipStreamDestroy(special) == BAD_HANDLE
    assert rt.fn.hipStreamDestroy(s1) == OK
    assert rt.fn.hipStreamDestroy(s1) == BAD_HANDLE
    for call in (rt.fn.hipStreamSynchronize, rt.fn.hipStreamQuery):
        assert call(s1) == BAD_HANDLE and call(0x1234) == BAD_HANDLE
    assert rt.fn.hipStreamGetPriority(s1, prio) == BAD_HANDLE
    with pytest.raises(errors.InvalidHandleError):
        rt.check(rt.fn.hipStreamDestroy(s1), "hipStreamDestroy")
    assert rt.fn.hipStreamDestroy(c_void_p(s2)) == OK


def test_stream_busy_hook(rt):
    s = new_stream(rt)
    rt.emulator.set_stream_busy(s, 2)
    assert rt.fn.hipStreamQuery(s) == NOT_READY
    with pytest.raises(errors.NotReadyError):
        rt.check(rt.fn.hipStreamQuery(s), "hipStreamQuery")
    assert rt.fn.hipStreamQuery(s) == OK
    rt.emulator.set_stream_busy(s, 100)
    assert rt.fn.hipStreamQuery(s) == NOT_READY
    assert rt.fn.hipStreamSynchronize(s) == OK and rt.fn.hipStreamQuery(s) == OK
    rt.emulator.set_stream_busy(0, 5)
    assert rt.fn.hipStreamQuery(0) == NOT_READY
    assert rt.fn.hipDeviceSynchronize() == OK and rt.fn.hipStreamQuery(0) == OK
    with pytest.raises(ValueError):
        rt.emulator.set_stream_busy(0xBAD0, 1)


def test_stream_wait_event(rt):
    s, e = new_stream(rt), new_event(rt)
    assert rt.fn.hipStreamWaitEvent(s, e, 0) == OK
    assert rt.fn.hipStreamWaitEvent(0, e, 0) == OK
    assert rt.fn.hipStreamWaitEvent(s, 0xBAD0, 0) == BAD_HANDLE
    assert rt.fn.hipStreamWaitEvent(0xBAD0, e, 0) == BAD_HANDLE
    assert rt.fn.hipStreamWaitEvent(s, e, 8) == INVALID


# ---- events -----------------------------------------------------------------------------------
def test_event_timing(rt):
    start, stop = new_event(rt), new_event(rt)
    ms = c_float()
    assert rt.fn.hipEventElapsedTime(ms, start, stop) == BAD_HANDLE    # never recorded
    assert rt.fn.hipEventQuery(start) == OK                            # unrecorded: success
    assert rt.fn.hipEventSynchronize(start) == OK
    rt.check(rt.fn.hipEventRecord(start, 0))
    time.sleep(0.02)
    rt.check(rt.fn.hipEventRecord(stop, 0))
    rt.check(rt.fn.hipEventSynchronize(stop))
    rt.check(rt.fn.hipEventElapsedTime(ms, start, stop))
    assert 15.0 <= ms.value < 2000.0
    rt.check(rt.fn.hipEventElapsedTime(byref(ms), stop, start))
    assert ms.value < 0
    assert rt.fn.hipEventElapsedTime(None, start, stop) == INVALID
    assert rt.fn.hipEventElapsedTime(ms, 0, stop) == BAD_HANDLE
    untimed = new_event(rt, 2)
    rt.check(rt.fn.hipEventRecord(untimed, 0))
    assert rt.fn.hipEventElapsedTime(ms, start, untimed) == BAD_HANDLE


def test_event_flags_and_destroy(rt):
    assert rt.fn.hipEventCreateWithFlags(c_void_p(), 4) == INVALID      # interprocess w/o 2
    assert rt.fn.hipEventCreateWithFlags(c_void_p(), 0x40000000 | 0x80000000) == INVALID
    assert rt.fn.hipEventCreateWithFlags(c_void_p(), 0x100) == INVALID
    assert rt.fn.hipEventCreateWithFlags(None, 0) == INVALID
    e = new_event(rt, 4 | 2)
    assert rt.fn.hipEventRecord(e, 0xBAD0) == BAD_HANDLE
    assert rt.fn.hipEventRecord(0xBAD0, 0) == BAD_HANDLE
    assert rt.fn.hipEventDestroy(e) == OK
    for call in (rt.fn.hipEventDestroy, rt.fn.hipEventQuery, rt.fn.hipEventSynchronize):
        assert call(e) == BAD_HANDLE
    assert rt.fn.hipEventRecord(e, 0) == BAD_HANDLE


def test_event_on_another_device_stream():
    rt = make(devices=2)
    e = new_event(rt)
    rt.fn.hipSetDevice(1)
    s = new_stream(rt)
    assert rt.fn.hipEventRecord(e, s) == BAD_HANDLE


def test_event_not_ready_while_stream_busy(rt):
    s = new_stream(rt)
    before, pending, after = new_event(rt), new_event(rt), new_event(rt)
    rt.check(rt.fn.hipEventRecord(before, s))
    rt.emulator.set_stream_busy(s, 3)
    rt.check(rt.fn.hipEventRecord(pending, s))
    assert rt.fn.hipEventQuery(before) == OK          # recorded before the work: complete
    assert rt.fn.hipEventQuery(pending) == NOT_READY
    ms = c_float()
    assert rt.fn.hipEventElapsedTime(ms, before, pending) == NOT_READY
    assert rt.fn.hipStreamQuery(s) == NOT_READY
    rt.check(rt.fn.hipEventSynchronize(pending))      # completes the stream's work
    assert rt.fn.hipEventQuery(pending) == OK and rt.fn.hipStreamQuery(s) == OK
    rt.emulator.set_stream_busy(s, 1)
    assert rt.fn.hipEventQuery(pending) == OK         # later work does not affect it
    rt.check(rt.fn.hipEventRecord(after, s))
    rt.check(rt.fn.hipStreamSynchronize(s))
    assert rt.fn.hipEventQuery(after) == OK
    rt.emulator.set_stream_busy(s, 1)
    rt.check(rt.fn.hipEventRecord(after, s))
    rt.check(rt.fn.hipFree(malloc(rt, 16)))           # hipFree waits for the device
    assert rt.fn.hipEventQuery(after) == OK


# ---- memory pools -----------------------------------------------------------------------------
def test_default_pools_are_per_device_and_current():
    rt = make(devices=2)
    p0, p1 = default_pool(rt, 0), default_pool(rt, 1)
    current = c_void_p()
    rt.check(rt.fn.hipDeviceGetMemPool(current, 1))
    assert p0 and p1 and p0 != p1 and current.value == p1
    assert rt.fn.hipDeviceGetDefaultMemPool(current, 2) == BAD_DEVICE
    assert rt.fn.hipDeviceGetMemPool(current, 2) == INVALID
    assert rt.fn.hipMemPoolDestroy(p0) == INVALID      # default pools cannot be destroyed
    assert rt.fn.hipMemPoolDestroy(0xBAD0) == INVALID
    assert rt.fn.hipDeviceSetMemPool(0, p1) == BAD_DEVICE
    assert rt.fn.hipDeviceSetMemPool(0, 0xBAD0) == INVALID


def test_pool_caches_and_releases_at_synchronize(rt):
    pool = default_pool(rt)
    capacity = rt.emulator.capacity(0)
    a = malloc(rt, 1000, "hipMallocAsync", 0)
    assert pool_attr(rt, pool, USED) == 1024 and pool_attr(rt, pool, RESERVED) == 1024
    assert free_bytes(rt) == capacity - 1024
    rt.check(rt.fn.hipFreeAsync(a, 0))
    assert pool_attr(rt, pool, USED) == 0 and pool_attr(rt, pool, RESERVED) == 1024
    assert free_bytes(rt) == capacity - 1024           # cached memory stays reserved
    assert rt.fn.hipMemcpy(a, a, 8, D2D) == INVALID     # a cached block is not live memory
    assert malloc(rt, 1024, "hipMallocAsync", 0) == a  # reused
    assert pool_attr(rt, pool, RESERVED) == 1024
    rt.check(rt.fn.hipFreeAsync(a, 0))
    rt.check(rt.fn.hipStreamSynchronize(0))            # threshold 0: the cache goes back
    assert pool_attr(rt, pool, RESERVED) == 0 and free_bytes(rt) == capacity
    assert pool_attr(rt, pool, RESERVED_HIGH) == 1024 and pool_attr(rt, pool, USED_HIGH) == 1024


def test_reuse_only_for_close_sizes(rt):
    pool = default_pool(rt)
    big = malloc(rt, 4096, "hipMallocAsync", 0)
    rt.check(rt.fn.hipFreeAsync(big, 0))
    small = malloc(rt, 1024, "hipMallocAsync", 0)     # 4096 > 1024 * 9/8: a new block
    assert small != big and pool_attr(rt, pool, RESERVED) == 5120
    near = malloc(rt, 3700, "hipMallocAsync", 0)      # 3840 <= 4096 <= 3840 * 9/8: reuse
    assert near == big and pool_attr(rt, pool, USED) == 4096 + 1024


def test_release_threshold_and_trim(rt):
    pool = default_pool(rt)
    threshold = c_uint64(4096)
    rt.check(rt.fn.hipMemPoolSetAttribute(pool, THRESHOLD, byref(threshold)))
    assert pool_attr(rt, pool, THRESHOLD) == 4096
    ptrs = [malloc(rt, 2048, "hipMallocAsync", 0) for _ in range(4)]
    for p in ptrs[:3]:
        rt.check(rt.fn.hipFreeAsync(p, 0))
    rt.check(rt.fn.hipDeviceSynchronize())
    assert pool_attr(rt, pool, RESERVED) == 4096      # 8192 -> down to the threshold
    rt.check(rt.fn.hipMemPoolTrimTo(pool, 0))
    assert pool_attr(rt, pool, RESERVED) == 2048      # trim never goes below what is used
    rt.check(rt.fn.hipFreeAsync(ptrs[3], 0))
    rt.check(rt.fn.hipMemPoolTrimTo(pool, 1 << 40))
    assert pool_attr(rt, pool, RESERVED) == 2048
    rt.check(rt.fn.hipMemPoolTrimTo(pool, 0))
    assert pool_attr(rt, pool, RESERVED) == 0
    e = new_event(rt)
    for p in [malloc(rt, 4096, "hipMallocAsync", 0) for _ in range(2)]:
        rt.check(rt.fn.hipFreeAsync(p, 0))
    rt.check(rt.fn.hipEventRecord(e, 0))
    rt.check(rt.fn.hipEventSynchronize(e))             # also a synchronize point
    assert pool_attr(rt, pool, RESERVED) == 4096


def test_pool_attributes(rt):
    pool = default_pool(rt)
    value, flag = c_uint64(), c_int()
    for attr in (1, 2, 3):
        rt.check(rt.fn.hipMemPoolGetAttribute(pool, attr, byref(flag)))
        assert flag.value == 1
        rt.check(rt.fn.hipMemPoolSetAttribute(pool, attr, byref(c_int(0))))
        rt.check(rt.fn.hipMemPoolGetAttribute(pool, attr, byref(flag)))
        assert flag.value == 0
    assert rt.fn.hipMemPoolSetAttribute(pool, RESERVED, byref(c_uint64(0))) == INVALID
    assert rt.fn.hipMemPoolSetAttribute(pool, USED, byref(c_uint64(0))) == INVALID
    assert rt.fn.hipMemPoolSetAttribute(pool, USED_HIGH, byref(c_uint64(5))) == INVALID
    assert rt.fn.hipMemPoolGetAttribute(pool, 9, byref(value)) == INVALID
    assert rt.fn.hipMemPoolGetAttribute(pool, THRESHOLD, byref(flag)) == INVALID  # 4 bytes
    assert rt.fn.hipMemPoolGetAttribute(pool, 1, byref(value)) == INVALID         # 8 bytes
    assert rt.fn.hipMemPoolGetAttribute(pool, THRESHOLD, None) == INVALID
    assert rt.fn.hipMemPoolGetAttribute(0xBAD0, THRESHOLD, byref(value)) == INVALID
    a = malloc(rt, 4096, "hipMallocAsync", 0)
    b = malloc(rt, 4096, "hipMallocAsync", 0)
    rt.check(rt.fn.hipFreeAsync(a, 0))
    rt.check(rt.fn.hipStreamSynchronize(0))
    assert pool_attr(rt, pool, USED_HIGH) == 8192 and pool_attr(rt, pool, RESERVED_HIGH) == 8192
    rt.check(rt.fn.hipMemPoolSetAttribute(pool, USED_HIGH, byref(c_uint64(0))))
    rt.check(rt.fn.hipMemPoolSetAttribute(pool, RESERVED_HIGH, byref(c_uint64(0))))
    assert pool_attr(rt, pool, USED_HIGH) == 4096 and pool_attr(rt, pool, RESERVED_HIGH) == 4096
    rt.check(rt.fn.hipFreeAsync(b, 0))


def test_pool_create_validation(rt):
    props = hipMemPoolProps()
    out = c_void_p()
    assert rt.fn.hipMemPoolCreate(out, props) == INVALID                 # allocType 0
    props.allocType = 1
    assert rt.fn.hipMemPoolCreate(out, props) == INVALID                 # location type 0
    props.location.type, props.location.id = 1, 1
    assert rt.fn.hipMemPoolCreate(out, props) == INVALID                 # no device 1
    props.location.id, props.handleTypes = 0, 2
    assert rt.fn.hipMemPoolCreate(out, props) == INVALID                 # win32 handles
    props.handleTypes = 0
    assert rt.fn.hipMemPoolCreate(None, props) == INVALID
    assert rt.fn.hipMemPoolCreate(out, None) == INVALID
    assert rt.fn.hipMemPoolCreate(out, byref(props)) == OK and out.value


def test_created_pool_lifecycle(rt):
    pool = make_pool(rt)
    rt.check(rt.fn.hipDeviceSetMemPool(0, pool))
    live = malloc(rt, 2048, "hipMallocAsync", 0)                      # from the current pool
    assert pool_attr(rt, pool, USED) == 2048
    cached = malloc(rt, 4096, "hipMallocFromPoolAsync", pool, 0)
    rt.check(rt.fn.hipFreeAsync(cached, 0))
    assert free_bytes(rt) == rt.emulator.capacity(0) - 6144
    rt.check(rt.fn.hipMemPoolDestroy(pool))
    assert free_bytes(rt) == rt.emulator.capacity(0) - 2048          # cache released at once
    current = c_void_p()
    rt.check(rt.fn.hipDeviceGetMemPool(current, 0))
    assert current.value == default_pool(rt)                         # back to the default
    assert rt.fn.hipMemPoolDestroy(pool) == INVALID
    assert rt.fn.hipMemPoolGetAttribute(pool, USED, byref(c_uint64())) == INVALID
    assert rt.fn.hipMallocFromPoolAsync(c_void_p(), 64, pool, 0) == INVALID
    rt.check(rt.fn.hipMemset(live, 1, 2048))                         # still valid memory
    assert rt.fn.hipFree(live) == OK and rt.fn.hipFree(live) == INVALID
    assert free_bytes(rt) == rt.emulator.capacity(0)
    assert rt.emulator.live_allocations() == (0, 0)


def test_pool_out_of_memory_releases_its_cache_first(rt):
    pool = default_pool(rt)
    threshold = c_uint64(1 << 40)
    rt.check(rt.fn.hipMemPoolSetAttribute(pool, THRESHOLD, byref(threshold)))
    capacity = rt.emulator.capacity(0)
    half = malloc(rt, capacity // 2, "hipMallocAsync", 0)
    rt.check(rt.fn.hipFreeAsync(half, 0))
    rt.check(rt.fn.hipStreamSynchronize(0))
    assert pool_attr(rt, pool, RESERVED) == capacity // 2            # kept: under the threshold
    plain = malloc(rt, capacity // 4)
    assert rt.fn.hipMalloc(c_void_p(), capacity // 2) == OOM         # hipMalloc does not trim
    out = c_void_p(7)
    assert rt.fn.hipMallocAsync(out, capacity, 0) == OOM and out.value is None
    assert pool_attr(rt, pool, RESERVED) == capacity // 2            # nothing released
    big = malloc(rt, capacity // 2 + capacity // 8, "hipMallocAsync", 0)
    assert pool_attr(rt, pool, RESERVED) == capacity // 2 + capacity // 8
    rt.check(rt.fn.hipFreeAsync(big, 0))
    rt.check(rt.fn.hipFree(plain))


def test_pool_max_size(rt):
    pool = make_pool(rt, max_size=4096)
    a = malloc(rt, 4096, "hipMallocFromPoolAsync", pool, 0)
    assert rt.fn.hipMallocFromPoolAsync(c_void_p(), 256, pool, 0) == OOM
    rt.check(rt.fn.hipFreeAsync(a, 0))
    malloc(rt, 2048, "hipMallocFromPoolAsync", pool, 0)              # the cache makes room
    assert pool_attr(rt, pool, RESERVED) == 2048


def test_async_allocation_arguments(rt):
    out = c_void_p(5)
    assert rt.fn.hipMallocAsync(out, 0, 0) == OK and out.value is None
    assert rt.fn.hipMallocAsync(out, 64, 0xBAD0) == INVALID          # clr: invalid value
    assert rt.fn.hipMallocAsync(None, 64, 0) == INVALID
    assert rt.fn.hipMallocFromPoolAsync(out, 64, 0, 0) == INVALID
    assert rt.fn.hipFreeAsync(0, 0) == INVALID                       # ROCm < 7.0
    assert make(version="7.0.0").fn.hipFreeAsync(0, 0) == OK
    p = malloc(rt, 64, "hipMallocAsync", new_stream(rt, 1))
    assert rt.fn.hipFreeAsync(p, 0xBAD0) == INVALID
    assert rt.fn.hipFreeAsync(p + 8, 0) == INVALID
    assert rt.fn.hipFreeAsync(p, 2) == OK and rt.fn.hipFreeAsync(p, 0) == INVALID
    plain = malloc(rt, 64)
    assert rt.fn.hipFreeAsync(plain, 0) == OK                        # hipMalloc memory too
    pinned = malloc(rt, 64, "hipHostMalloc", 0)
    assert rt.fn.hipFreeAsync(pinned, 0) == INVALID


def test_pool_access():
    rt = make(devices=2)
    pool = default_pool(rt, 0)
    descs = (hipMemAccessDesc * 2)()
    descs[0].location.type, descs[0].location.id, descs[0].flags = 1, 1, 3
    descs[1].location.type, descs[1].location.id, descs[1].flags = 1, 0, 1
    flags, loc = c_int(), hipMemLocation(1, 1)
    rt.check(rt.fn.hipMemPoolGetAccess(flags, pool, loc))
    assert flags.value == 0
    rt.check(rt.fn.hipMemPoolSetAccess(pool, descs, 2))
    rt.check(rt.fn.hipMemPoolGetAccess(flags, pool, byref(loc)))
    assert flags.value == 3
    rt.check(rt.fn.hipMemPoolGetAccess(flags, pool, hipMemLocation(1, 0)))
    assert flags.value == 3                                          # the owner keeps RW
    descs[1].flags = 2                                               # not a hipMemAccessFlags
    descs[0].flags = 0
    assert rt.fn.hipMemPoolSetAccess(pool, descs, 2) == INVALID
    rt.check(rt.fn.hipMemPoolGetAccess(flags, pool, loc))
    assert flags.value == 3                                          # all or nothing
    assert rt.fn.hipMemPoolSetAccess(pool, descs, 3) == INVALID      # past the array
    assert rt.fn.hipMemPoolSetAccess(pool, descs[0], 1) == OK
    assert rt.fn.hipMemPoolSetAccess(pool, None, 1) == INVALID
    assert rt.fn.hipMemPoolGetAccess(flags, pool, hipMemLocation(1, 9)) == INVALID
    assert rt.fn.hipMemPoolGetAccess(flags, pool, hipMemLocation(0, 0)) == INVALID


# ---- fault injection, last error, robustness ---------------------------------------------------
def test_injected_failures_change_nothing(rt):
    emu = rt.emulator
    emu.inject_failure()
    out = c_void_p(42)
    assert rt.fn.hipMalloc(out, 64) == OOM and out.value == 42
    assert emu.live_allocations() == (0, 0) and free_bytes(rt) == emu.capacity(0)
    p = malloc(rt, 64)                                               # one failure only
    emu.inject_failure(code=BAD_HANDLE, count=2, calls={"hipStreamCreateWithPriority"})
    assert rt.fn.hipMalloc(c_void_p(), 64) == OK
    assert rt.fn.hipStreamCreateWithPriority(out, 0, 0) == BAD_HANDLE
    assert rt.fn.hipStreamCreateWithPriority(out, 0, 0) == BAD_HANDLE
    assert emu.pending_faults() == 0
    s = new_stream(rt)
    for call, args in [("hipMallocAsync", (c_void_p(), 64, s)),
                       ("hipMemcpy", (p, p, 8, D2D)), ("hipEventCreateWithFlags", (out, 0)),
                       ("hipMemPoolCreate", (out, hipMemPoolProps())),
                       ("hipHostMalloc", (out, 8, 0)), ("hipMallocManaged", (out, 8, 1))]:
        emu.inject_failure(code=999)
        assert getattr(rt.fn, call)(*args) == 999, call
    emu.inject_failure(count=5, calls="hipFree")
    assert rt.fn.hipFree(p) == OOM and emu.pending_faults() == 4
    emu.clear_faults()
    assert rt.fn.hipFree(p) == OK
    with pytest.raises(ValueError):
        emu.inject_failure(code=0)
    with pytest.raises(ValueError):
        emu.inject_failure(calls={"hipNoSuchCall"})
    with pytest.raises(ValueError):
        emu.inject_failure(count=0)


def test_last_error_hip6_semantics(rt):
    assert rt.fn.hipMalloc(c_void_p(), 1 << 40) == OOM
    assert rt.fn.hipPeekAtLastError() == OOM and rt.fn.hipPeekAtLastError() == OOM
    assert rt.fn.hipGetLastError() == OOM and rt.fn.hipGetLastError() == OK
    assert rt.fn.hipFree(0xDEAD0000) == INVALID
    assert rt.fn.hipGetDevice(c_int()) == OK
    assert rt.fn.hipGetLastError() == OK            # HIP 6: the result of the last call
    assert rt.fn.hipSetDevice(9) == BAD_DEVICE
    assert rt.fn.hipExtGetLastError() == BAD_DEVICE and rt.fn.hipGetLastError() == OK
    seen = []
    worker = threading.Thread(target=lambda: seen.append(rt.fn.hipGetLastError()))
    rt.fn.hipSetDevice(9)
    worker.start()
    worker.join()
    assert seen == [OK] and rt.fn.hipGetLastError() == BAD_DEVICE   # per thread


def test_last_error_hip7_semantics():
    rt = make(version="7.0.0")
    assert rt.fn.hipMalloc(c_void_p(), 1 << 40) == OOM
    assert rt.fn.hipGetDevice(c_int()) == OK
    rt.emulator.set_stream_busy(0, 1)
    assert rt.fn.hipStreamQuery(0) == NOT_READY
    assert rt.fn.hipExtGetLastError() == NOT_READY   # the last call
    assert rt.fn.hipGetLastError() == OOM            # the last real error, kept
    assert rt.fn.hipGetLastError() == OK


@pytest.mark.parametrize("call, args", [
    ("hipMalloc", (c_void_p(), 1.5)), ("hipMalloc", (c_int(), 16)), ("hipMalloc", ("x", 16)),
    ("hipMalloc", (c_void_p(),)), ("hipFree", ("pointer",)), ("hipFree", (3.0,)),
    ("hipMemcpy", (b"dst", None, "n", 1)), ("hipSetDevice", ("0",)),
    ("hipGetDevice", (c_uint(),)), ("hipMemGetInfo", (c_size_t(), None)),
    ("hipDeviceGetName", ("buffer", 10, 0)), ("hipStreamCreateWithPriority", (c_void_p(), 0.5, 0)),
    ("hipEventElapsedTime", (c_int(), 0, 0)), ("hipMemPoolCreate", (c_void_p(), hipMemLocation())),
    ("hipPointerGetAttributes", (hipMemPoolProps(), 0)), ("hipStreamGetId", (0, c_float())),
    ("hipMemPoolSetAttribute", (0, 4, 12)), ("hipMemPoolSetAccess", (0, object(), 1)),
    ("hipDeviceTotalMem", (ctypes.pointer(c_size_t()), object())),
    ("hipStreamQuery", (object(),)), ("hipInit", (None,)),
])
def test_wrong_types_are_invalid_value_never_exceptions(rt, call, args):
    assert getattr(rt.fn, call)(*args) == INVALID


def test_output_arguments_accept_byref_and_pointer(rt):
    out = c_void_p()
    assert rt.fn.hipMalloc(byref(out), 16) == OK and out.value
    assert rt.fn.hipMalloc(ctypes.pointer(out), 16) == OK and out.value
    assert rt.fn.hipMalloc(ctypes.POINTER(c_void_p)(), 16) == INVALID     # NULL pointer
    free = (c_size_t * 2)()
    assert rt.fn.hipMemGetInfo(byref(free, 8), c_size_t()) == INVALID     # offsets refused


def test_reset():
    rt = make(devices=2)
    emu = rt.emulator
    pool, s, e = default_pool(rt), new_stream(rt), new_event(rt)
    created = make_pool(rt)
    malloc(rt, 4096)
    malloc(rt, 4096, "hipMallocAsync", 0)
    malloc(rt, 64, "hipHostMalloc", 0)
    rt.fn.hipSetDevice(1)
    emu.inject_failure(count=3)
    emu.reset()
    assert emu.live_allocations() == (0, 0) and emu.pending_faults() == 0
    assert free_bytes(rt) == emu.capacity(0)
    dev = c_int()
    rt.fn.hipGetDevice(dev)
    assert dev.value == 0
    assert default_pool(rt) == pool and pool_attr(rt, pool, RESERVED_HIGH) == 0
    assert rt.fn.hipStreamQuery(s) == BAD_HANDLE and rt.fn.hipEventQuery(e) == BAD_HANDLE
    assert rt.fn.hipMemPoolDestroy(created) == INVALID


def test_threads_hammering_allocations():
    rt = make(memory="64MiB")
    fn, emu = rt.fn, rt.emulator
    errors_seen = []
    barrier = threading.Barrier(16)

    def work(index):
        try:
            barrier.wait()
            stream = new_stream(rt)
            data = bytes([index]) * 512
            host, host_addr = host_buffer(data)
            back = ctypes.create_string_buffer(512)
            for i in range(150):
                p, q = c_void_p(), c_void_p()
                assert fn.hipMalloc(p, 512 + i) == OK
                assert fn.hipMallocAsync(q, 512 + 64 * (i % 5), stream) == OK
                assert fn.hipMemcpy(p, host_addr, 512, H2D) == OK
                assert fn.hipMemcpyAsync(q, p, 512, D2D, stream) == OK
                assert fn.hipMemcpy(back, q, 512, D2H) == OK
                assert back.raw == data
                assert fn.hipFreeAsync(q, stream) == OK
                assert fn.hipFree(p) == OK
                if i % 50 == 0:
                    assert fn.hipStreamSynchronize(stream) == OK
            assert fn.hipStreamSynchronize(stream) == OK
            assert fn.hipStreamDestroy(stream) == OK
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors_seen.append((index, exc))

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads hung"
    assert not errors_seen, errors_seen[:3]
    assert emu.live_allocations() == (0, 0)
    rt.check(fn.hipDeviceSynchronize())
    assert free_bytes(rt) == emu.capacity(0)


def test_a_call_from_a_finalizer_inside_the_emulator_is_deferred_not_deadlocked(rt):
    """The garbage collector can run a finalizer (hipFree, hipMemPoolDestroy...) while this
    thread is inside the emulator holding its lock: the call must neither deadlock nor run in
    the middle of the other update; it runs as soon as the lock is let go."""
    ptr = malloc(rt, 4096)
    before = rt.emulator.live_allocations()
    done = []

    def inside():
        with rt.emulator._lock:  # as if the collector ran while a call held the lock
            done.append(rt.fn.hipFree(ptr))
            assert rt.emulator._lock._deferred  # queued, not run yet
    t = threading.Thread(target=inside)
    t.start()
    t.join(10)
    assert not t.is_alive(), "deadlock: a re-entrant call waited for the lock its thread holds"
    assert done == [0]
    assert rt.emulator.live_allocations()[0] == before[0] - 1  # freed once the lock was let go
    assert rt.fn.hipFree(ptr) == errors.HIP_ERROR_INVALID_VALUE  # and only once


def test_the_emulators_memory_is_not_freed_while_the_interpreter_exits():
    """The emulator's finalizer gives its host memory back to libc when the emulator is
    collected, but not during the interpreter's exit, when a daemon thread may still be
    using it (the emulator can be collected while modules are torn down)."""
    from hipmr_ctypes._hip.emulated import _core
    heap = _core.HostHeap()
    a, b = heap.alloc(4096), heap.alloc(64)
    assert a and b
    _core._release_unless_exiting(heap, exiting=lambda: True)
    assert set(heap._outstanding) == {a, b}          # left to the operating system
    _core._release_unless_exiting(heap, exiting=lambda: False)
    assert heap._outstanding == {}

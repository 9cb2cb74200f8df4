"""The virtual-memory rows of the table: the emulated platform's model (reserved ranges, physical
memory mapped at fixed addresses, per-device access, accounting) and the nvidia back end's
mapping onto the driver's ``cuMem*`` calls.  The headers' layouts are test_abi.py's."""
from __future__ import annotations

import ctypes

import pytest

from hipmr_ctypes import _hip
from hipmr_ctypes._hip import nvidia, types

MiB = 1 << 20
G = 2 * MiB    # the emulated granularity


@pytest.fixture
def rt():
    runtime = _hip.create_runtime("emulated", {"HIPMR_EMULATED_DEVICES": "2"})
    if not runtime.emulator._vspace.supported:
        pytest.skip("no memfd_create / mmap on this host: the emulated calls answer not supported")
    yield runtime
    runtime.emulator.reset()


def prop(rt, device=0):
    major, minor, _ = rt.runtime_version()
    p = types.allocation_prop_type(major, minor)()
    p.type = types.hipMemAllocationTypePinned
    p.location.type = types.hipMemLocationTypeDevice
    p.location.id = device
    return p


def reserve(rt, size):
    ptr = ctypes.c_void_p()
    assert rt.fn.hipMemAddressReserve(ptr, size, 0, None, 0) == 0
    return ptr.value


def create(rt, size, device=0):
    handle = ctypes.c_void_p()
    assert rt.fn.hipMemCreate(handle, size, ctypes.byref(prop(rt, device)), 0) == 0
    return handle.value


def grant(rt, ptr, size, *devices, flags=3):
    descs = (types.hipMemAccessDesc * len(devices))()
    for d, device in zip(descs, devices):
        d.location.type, d.location.id, d.flags = 1, device, flags
    return rt.fn.hipMemSetAccess(ptr, size, descs, len(devices))


def free_bytes(rt, device=0):
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    rt.fn.hipSetDevice(device)
    assert rt.fn.hipMemGetInfo(free, total) == 0
    return free.value


def test_granularity_and_attribute(rt):
    g = ctypes.c_size_t()
    assert rt.fn.hipMemGetAllocationGranularity(g, ctypes.byref(prop(rt)), 1) == 0
    assert g.value == G
    assert rt.fn.hipMemGetAllocationGranularity(g, ctypes.byref(prop(rt, 5)), 0) == 1
    assert rt.fn.hipMemGetAllocationGranularity(g, ctypes.byref(prop(rt)), 7) == 1
    flag = ctypes.c_int()
    assert rt.fn.hipDeviceGetAttribute(flag, 89, 0) == 0 and flag.value == 1


def test_same_address_across_unmap_and_remap_and_data_lives_with_the_handle(rt):
    base = reserve(rt, 2 * G)
    handle = create(rt, G)
    assert rt.fn.hipMemMap(base, G, 0, handle, 0) == 0
    assert grant(rt, base, G, 0) == 0
    data = bytes(range(256)) * 16
    assert rt.fn.hipMemcpy(base + 100, data, len(data), 1) == 0
    assert rt.fn.hipMemUnmap(base, G) == 0
    back = ctypes.create_string_buffer(len(data))
    assert rt.fn.hipMemcpy(back, base + 100, len(data), 2) == 1   # unmapped: refused
    assert rt.fn.hipMemsetD8(base, 0, 16) == 1
    # mapped again, at the same address or another offset of the range: the same bytes
    assert rt.fn.hipMemMap(base + G, G, 0, handle, 0) == 0
    assert grant(rt, base + G, G, 0) == 0
    assert rt.fn.hipMemcpy(back, base + G + 100, len(data), 2) == 0 and back.raw == data
    assert rt.fn.hipMemUnmap(base + G, G) == 0
    assert rt.fn.hipMemRelease(handle) == 0
    assert rt.fn.hipMemAddressFree(base, 2 * G) == 0


def test_accounting_follows_release_and_unmap(rt):
    before = free_bytes(rt)
    base = reserve(rt, G)
    assert free_bytes(rt) == before          # a reservation holds no memory
    handle = create(rt, G)
    assert free_bytes(rt) == before - G
    assert rt.fn.hipMemMap(base, G, 0, handle, 0) == 0
    assert rt.fn.hipMemRelease(handle) == 0
    assert free_bytes(rt) == before - G      # still mapped: still held
    assert grant(rt, base, G, 0) == 0
    assert rt.fn.hipMemsetD32(base, 7, 4) == 0   # and usable
    assert rt.fn.hipMemRelease(handle) == 1  # released once only
    assert rt.fn.hipMemUnmap(base, G) == 0
    assert free_bytes(rt) == before
    assert rt.fn.hipMemAddressFree(base, G) == 0


def test_out_of_memory_and_bad_arguments(rt):
    cap = rt.emulator.capacity()
    h = ctypes.c_void_p()
    assert rt.fn.hipMemCreate(h, cap + G, ctypes.byref(prop(rt)), 0) == 2
    assert rt.fn.hipMemCreate(h, G + 4096, ctypes.byref(prop(rt)), 0) == 1   # not granular
    assert rt.fn.hipMemCreate(h, G, None, 0) == 1
    assert rt.fn.hipMemCreate(h, G, ctypes.byref(prop(rt)), 1) == 1          # flags
    p = ctypes.c_void_p()
    assert rt.fn.hipMemAddressReserve(p, 4096, 0, None, 0) == 1
    assert rt.fn.hipMemAddressReserve(p, G, 3, None, 0) == 1                 # alignment
    base = reserve(rt, 2 * G)
    handle = create(rt, G)
    assert rt.fn.hipMemMap(base, 2 * G, 0, handle, 0) == 1       # larger than the memory
    assert rt.fn.hipMemMap(base + 3 * G, G, 0, handle, 0) == 1   # outside the range
    assert rt.fn.hipMemMap(base, G, 0, 12345, 0) == 1            # no such handle
    assert rt.fn.hipMemMap(base, G, 0, handle, 0) == 0
    assert rt.fn.hipMemMap(base, G, 0, handle, 0) == 1           # over a mapping
    assert rt.fn.hipMemAddressFree(base, 2 * G) == 1             # still mapped
    assert rt.fn.hipMemUnmap(base, 2 * G) == 1                   # not whole mappings
    assert grant(rt, base, 2 * G, 0) == 1
    assert grant(rt, base, G, 0, flags=2) == 1                   # no such flag
    assert rt.fn.hipMemUnmap(base, G) == 0
    assert rt.fn.hipMemRelease(handle) == 0
    assert rt.fn.hipMemAddressFree(base, G) == 1                 # not the whole reservation
    assert rt.fn.hipMemAddressFree(base, 2 * G) == 0


def test_access_is_per_device_and_read_only_is_read_only(rt):
    base = reserve(rt, G)
    handle = create(rt, G)
    assert rt.fn.hipMemMap(base, G, 0, handle, 0) == 0
    flags, loc = ctypes.c_ulonglong(), types.hipMemLocation(1, 1)
    assert rt.fn.hipMemGetAccess(flags, loc, base) == 0 and flags.value == 0
    assert grant(rt, base, G, 0) == 0 and grant(rt, base, G, 1, flags=1) == 0
    assert rt.fn.hipMemGetAccess(flags, loc, base) == 0 and flags.value == 1
    data = b"abcd" * 64
    out = ctypes.create_string_buffer(len(data))
    assert rt.fn.hipMemcpy(base, data, len(data), 1) == 0           # device 0 writes
    rt.fn.hipSetDevice(1)
    assert rt.fn.hipMemcpy(out, base, len(data), 2) == 0 and out.raw == data   # 1 reads
    assert rt.fn.hipMemcpy(base, data, len(data), 1) == 1           # and may not write
    attrs = types.hipPointerAttribute_t()
    assert rt.fn.hipPointerGetAttributes(attrs, base + 8) == 0 and attrs.device == 0
    assert grant(rt, base, G, 0, flags=0) == 0                      # device 0's access gone
    rt.fn.hipSetDevice(0)
    assert rt.fn.hipMemcpy(out, base, len(data), 2) == 1
    assert rt.fn.hipMemUnmap(base, G) == 0 and rt.fn.hipMemRelease(handle) == 0
    assert rt.fn.hipMemAddressFree(base, G) == 0


def test_host_pointer_running_into_a_reservation_is_refused(rt):
    base = reserve(rt, G)
    handle = create(rt, G)
    assert rt.fn.hipMemMap(base, G, 0, handle, 0) == 0 and grant(rt, base, G, 0) == 0
    src = ctypes.create_string_buffer(64)
    assert rt.fn.hipMemcpy(base - 32, src, 64, 4) == 1   # starts before the reservation
    assert rt.fn.hipMemcpy(base + G - 32, src, 64, 4) == 1   # runs past the mapping
    assert rt.fn.hipMemcpy(src, base, 64, 2) == 0
    rt.emulator.reset()   # unmaps and frees everything, the memory counted free again
    assert free_bytes(rt) == rt.emulator.capacity()
    assert rt.emulator._vspace.reservations == {} and rt.emulator._vspace.physicals == {}


def test_the_5_2_layout_is_read_on_a_5_2_runtime():
    rt = _hip.create_runtime("emulated", {"HIPMR_EMULATED_VERSION": "5.2.3"})
    g = ctypes.c_size_t()
    old = prop(rt)
    assert type(old) is types.hipMemAllocationProp_5_2
    assert rt.fn.hipMemGetAllocationGranularity(g, ctypes.byref(old), 0) == 0
    new = types.hipMemAllocationProp(type=1, location=types.hipMemLocation(1, 0))
    assert rt.fn.hipMemGetAllocationGranularity(g, ctypes.byref(new), 0) == 1


class _FakeDriver:
    """A libcuda whose every function records its call and returns ``results`` (default 0)."""

    def __init__(self, results=None):
        self.calls = []
        self.results = dict(results or {})

    def __getattr__(self, symbol):
        if symbol.startswith("_"):
            raise AttributeError(symbol)

        def function(*args):
            self.calls.append((symbol,) + args)
            result = self.results.get(symbol, 0)
            return result.pop(0) if isinstance(result, list) else result
        setattr(self, symbol, function)
        return function


class _FakeRuntimeLibrary(_FakeDriver):
    def __getattr__(self, symbol):
        function = super().__getattr__(symbol)
        if symbol == "cudaRuntimeGetVersion":
            def version(out):
                out.value = 13000
                return 0
            setattr(self, symbol, version)
            return version
        return function


def test_nvidia_maps_each_call_to_the_driver_one_to_one(monkeypatch):
    """Each virtual-memory row is the driver's cuMem* call with the same arguments; a thread
    with no current context gets the primary one (cudaFree(NULL)) and the call once more; a
    driver status comes back as HIP's."""
    cudart, libcuda = _FakeRuntimeLibrary(), _FakeDriver({"cuMemMap": [201, 0],
                                                          "cuMemCreate": 2})
    monkeypatch.setattr(nvidia, "load_first", lambda *a: (cudart, "/fake/libcudart.so.13"))
    monkeypatch.setattr(nvidia, "_open_libcuda", lambda: libcuda)
    rt = nvidia.create_nvidia_runtime({})
    out, size = ctypes.c_void_p(), ctypes.c_size_t()
    p = types.hipMemAllocationProp()
    calls = [
        ("hipMemAddressReserve", "cuMemAddressReserve", (out, G, 0, None, 0)),
        ("hipMemAddressFree", "cuMemAddressFree", (0x1000, G)),
        ("hipMemRelease", "cuMemRelease", (0x77,)),
        ("hipMemUnmap", "cuMemUnmap", (0x1000, G)),
        ("hipMemSetAccess", "cuMemSetAccess", (0x1000, G, types.hipMemAccessDesc(), 1)),
        ("hipMemGetAccess", "cuMemGetAccess", (ctypes.c_ulonglong(), types.hipMemLocation(),
                                               0x1000)),
        ("hipMemGetAllocationGranularity", "cuMemGetAllocationGranularity",
         (size, ctypes.byref(p), 0)),
    ]
    for hip_name, cu_name, args in calls:
        assert getattr(rt.fn, hip_name)(*args) == 0, hip_name
        assert libcuda.calls[-1][0] == cu_name and libcuda.calls[-1][1:] == args
    assert rt.fn.hipMemMap(0x1000, G, 0, 0x77, 0) == 0
    assert [c[0] for c in libcuda.calls[-2:]] == ["cuMemMap", "cuMemMap"]
    assert cudart.calls[-1] == ("cudaFree", None)
    assert rt.fn.hipMemCreate(out, G, ctypes.byref(p), 0) == 2   # out of memory, as HIP's


@pytest.mark.amd_library
def test_the_real_library_exports_every_virtual_memory_call(amd_runtime):
    """Every release CI runs (ROCm 5.2 on) has the virtual-memory calls: none is a stand-in."""
    names = ["hipMemAddressReserve", "hipMemAddressFree", "hipMemCreate", "hipMemRelease",
             "hipMemMap", "hipMemUnmap", "hipMemSetAccess", "hipMemGetAccess",
             "hipMemGetAllocationGranularity"]
    missing = [n for n in names if getattr(getattr(amd_runtime.fn, n), "missing", False)]
    assert missing == []


def test_a_library_without_the_calls_says_so():
    from hipmr_ctypes._hip.exceptions import NotSupportedError
    import hipmr_ctypes as hmr
    from support import process_runtime
    for missing in ("hipMemGetAllocationGranularity", "hipMemCreate"):
        rt = _hip.create_runtime("emulated", {"HIPMR_EMULATED_MISSING": missing})
        with process_runtime(rt):
            with pytest.raises(NotSupportedError, match=missing):
                hmr.VirtualMemoryResource().allocate(1)

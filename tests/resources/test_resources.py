"""The concrete resources (device, async, pinned, managed, host): concepts and properties,
allocate / write / read back / free on every stream kind, argument checks that make no native
call, equality, out of memory and injected failures.  The tests without the ``emulator``
fixture run on any platform; the ones marked ``gpu`` need a real device."""
from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.exceptions import (HipError, InvalidValueError, NotSupportedError,
                                      OutOfMemoryError)
from hipmr_ctypes.resources import (MAX_RELEASE_THRESHOLD, AsyncMemoryResource,
                                    DeviceMemoryResource, HostMemoryResource,
                                    ManagedMemoryResource, MemoryPool, PinnedMemoryResource)

from support import REPO, no_native_call, process_runtime


FACTORIES = {
    "device": DeviceMemoryResource,
    "async": AsyncMemoryResource,
    "async_default_pool": AsyncMemoryResource.from_default_pool,
    "pinned": PinnedMemoryResource,
    "managed": ManagedMemoryResource,
    "host": HostMemoryResource,
}
PROPERTIES = {
    "device": {hmr.device_accessible},
    "async": {hmr.device_accessible},
    "async_default_pool": {hmr.device_accessible},
    "pinned": {hmr.device_accessible, hmr.host_accessible},
    "managed": {hmr.device_accessible, hmr.host_accessible},
    "host": {hmr.host_accessible},
}
SIZES = (1, 7, 256, 1000, 65536 + 3)
ALIGNMENTS = (1, 8, 64, 256)


@pytest.fixture(params=sorted(FACTORIES))
def kind(request):
    return request.param


@pytest.fixture
def resource(kind):
    r = FACTORIES[kind]()
    yield r
    if isinstance(r, AsyncMemoryResource):
        r.close()


@pytest.fixture(params=["null", "Stream", "per_thread", "stream_ref"])
def stream(request):
    if request.param == "null":
        yield 0
    elif request.param == "per_thread":
        yield hmr.stream_per_thread
    else:
        with hmr.Stream() as s:
            yield s if request.param == "Stream" else hmr.stream_ref(s)


def host_only(r) -> bool:
    return not hmr.has_property(r, hmr.device_accessible)


def pattern(n: int, seed: int = 3) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def write_read(r, ptr: int, n: int, seed: int = 3) -> None:
    """Write a pattern to [ptr, ptr+n), read it back, compare (hipMemcpy or memmove)."""
    data = pattern(n, seed)
    src = ctypes.create_string_buffer(data, n)
    dst = ctypes.create_string_buffer(n)
    if host_only(r):
        ctypes.memmove(ptr, src, n)
        ctypes.memmove(dst, ptr, n)
    else:
        rt = _hip.get_runtime()
        rt.check(rt.fn.hipMemcpy(ptr, src, n, 4), "hipMemcpy")
        rt.check(rt.fn.hipMemcpy(dst, ptr, n, 4), "hipMemcpy")
    assert dst.raw == data


@pytest.fixture
def two_devices(emulator):
    """A 2-device emulated runtime as the process-wide one for the test (and a clean per-device
    table); the previous runtime and table come back after."""
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2",
                                              "HIPMR_EMULATED_MEMORY": "64MiB"})
    with process_runtime(rt):
        yield rt


# ---- concepts, properties ------------------------------------------------------------------------
def test_concepts_and_properties(kind, resource):
    assert hmr.is_resource(resource) and hmr.is_async_resource(resource)
    assert set(resource.properties) == PROPERTIES[kind]
    assert set(type(resource).properties) == PROPERTIES[kind]
    for prop in (hmr.device_accessible, hmr.host_accessible):
        declared = prop in PROPERTIES[kind]
        assert hmr.has_property(resource, prop) is declared
        assert hmr.is_async_resource_with(resource, prop) is declared
        if declared:
            assert hmr.get_property(resource, prop) is None
        else:
            with pytest.raises(TypeError):
                hmr.get_property(resource, prop)
    ref = hmr.async_resource_ref[tuple(PROPERTIES[kind])](resource)
    assert ref.resource is resource and ref == resource
    # a canonical signature: the ref binds the resource's own methods
    assert ref.allocate_async == resource.allocate_async
    assert ref.deallocate == resource.deallocate


def test_device_attribute(kind, resource):
    if kind in ("device", "async", "async_default_pool"):
        assert resource.device == hmr.get_device()
        assert f"device={resource.device}" in repr(resource)
    else:
        assert not hasattr(resource, "device")


# ---- allocate / write / read / free ------------------------------------------------------------
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_allocate_write_read_free(resource, alignment):
    for n in SIZES:
        ptr = resource.allocate(n, alignment)
        assert isinstance(ptr, int) and ptr and ptr % alignment == 0
        write_read(resource, ptr, n)
        resource.deallocate(ptr, n, alignment)
    ptr = resource.allocate(100)  # default alignment 256
    assert ptr % 256 == 0
    resource.deallocate(ptr, 100)


def test_allocate_async_every_stream_kind(resource, stream):
    handle = hmr.stream_ref(stream).get()
    ptrs = []
    for i, n in enumerate(SIZES):
        ptr = resource.allocate_async(n, 256, stream)
        assert ptr and ptr % 256 == 0
        ptrs.append((ptr, n))
    hmr.stream_ref(handle).wait()
    for i, (ptr, n) in enumerate(ptrs):
        write_read(resource, ptr, n, seed=i)
    for ptr, n in ptrs:
        resource.deallocate_async(ptr, n, 256, stream)
    hmr.stream_ref(handle).wait()


def test_many_live_allocations_are_distinct(resource):
    ptrs = [resource.allocate(512) for _ in range(32)]
    assert len(set(ptrs)) == 32
    for i, p in enumerate(ptrs):
        write_read(resource, p, 512, seed=i)
    for p in ptrs:
        resource.deallocate(p, 512)


def test_zero_bytes(resource, stream):
    assert resource.allocate(0) == 0
    assert resource.allocate(0, 1) == 0
    assert resource.allocate_async(0, 256, stream) == 0
    resource.deallocate(0, 0)
    resource.deallocate(0, 0, 256)
    resource.deallocate_async(0, 0, 256, stream)


def test_numpy_integer_sizes(resource):
    np = pytest.importorskip("numpy")
    ptr = resource.allocate(np.int64(300), np.uint32(64))
    assert ptr % 64 == 0
    resource.deallocate(ptr, np.int64(300), np.uint32(64))


# ---- bad arguments: raise before any native call ------------------------------------------------
BAD_SIZES = [(1.5, TypeError), ("8", TypeError), (None, TypeError), (True, TypeError),
             (b"8", TypeError), (-1, ValueError), ((1 << 63) + 1, ValueError)]
BAD_ALIGNMENTS = [(3, ValueError), (0, ValueError), (-8, ValueError), (48, ValueError),
                  (256.0, TypeError), (True, TypeError), ("256", TypeError), (None, TypeError)]
BAD_PTRS = [(-1, ValueError), (1 << 64, ValueError), (1.0, TypeError), ("0x10", TypeError),
            (None, TypeError)]
BAD_STREAMS = [("0", TypeError), (-1, ValueError), (1.5, TypeError), (None, TypeError),
               (object(), TypeError), (1 << 64, ValueError), (False, TypeError)]


def _calls(r, ptr=4096):
    """Every entry point, each as (name of the argument under test, call(bad) -> None)."""
    s = 0
    return {
        "bytes": [lambda b: r.allocate(b), lambda b: r.allocate(b, 256),
                  lambda b: r.allocate_async(b, 256, s), lambda b: r.deallocate(ptr, b),
                  lambda b: r.deallocate_async(ptr, b, 256, s)],
        "alignment": [lambda a: r.allocate(64, a), lambda a: r.allocate_async(64, a, s),
                      lambda a: r.deallocate(ptr, 64, a),
                      lambda a: r.deallocate_async(ptr, 64, a, s)],
        "ptr": [lambda p: r.deallocate(p, 64), lambda p: r.deallocate_async(p, 64, 256, s)],
        "stream": [lambda st: r.allocate_async(64, 256, st),
                   lambda st: r.deallocate_async(ptr, 64, 256, st)],
    }


@pytest.mark.parametrize("arg,bad", [("bytes", b) for b in BAD_SIZES]
                         + [("alignment", a) for a in BAD_ALIGNMENTS]
                         + [("ptr", p) for p in BAD_PTRS]
                         + [("stream", s) for s in BAD_STREAMS])
def test_bad_arguments_raise_before_any_native_call(emulator, kind, resource, arg, bad):
    value, exc = bad
    if kind == "host" and arg == "alignment" and value == 48:
        exc = ValueError  # not a power of two either
    live = resource.allocate(128)  # state that must survive
    for call in _calls(resource)[arg]:
        with no_native_call(emulator):
            with pytest.raises(exc, match=arg):
                call(value)
    write_read(resource, live, 128)
    resource.deallocate(live, 128)


def test_alignment_limits(emulator, kind, resource):
    if kind == "host":
        for a in (512, 4096, 1 << 16):
            p = resource.allocate(100, a)
            assert p % a == 0
            write_read(resource, p, 100)
            resource.deallocate(p, 100, a)
        return
    with no_native_call(emulator):
        with pytest.raises(ValueError, match="alignment=512 is larger than 256"):
            resource.allocate(100, 512)
        with pytest.raises(ValueError, match="alignment"):
            resource.allocate_async(100, 4096, 0)


# ---- equality, hash, repr ------------------------------------------------------------------------
def test_equality_and_hash():
    d0, d0b = DeviceMemoryResource(), DeviceMemoryResource(0)
    assert d0 == d0b and not d0 != d0b and hash(d0) == hash(d0b)
    a1, a2 = AsyncMemoryResource(), AsyncMemoryResource()
    try:
        assert a1 == a1 and a1 != a2 and hash(a1) != hash(a2)
        assert AsyncMemoryResource.from_default_pool() == AsyncMemoryResource.from_default_pool()
        assert hash(AsyncMemoryResource.from_default_pool(0)) == hash(
            AsyncMemoryResource.from_default_pool())
        assert a1 != AsyncMemoryResource.from_default_pool()
    finally:
        a1.close()
        a2.close()
    assert PinnedMemoryResource() == PinnedMemoryResource(0)
    assert PinnedMemoryResource(1) != PinnedMemoryResource(0)
    assert hash(PinnedMemoryResource(2)) == hash(PinnedMemoryResource(2))
    assert ManagedMemoryResource() == ManagedMemoryResource(1)
    assert ManagedMemoryResource(2) != ManagedMemoryResource(1)
    assert HostMemoryResource() == HostMemoryResource()
    assert hash(HostMemoryResource()) == hash(HostMemoryResource())
    # different types are never equal
    every = [DeviceMemoryResource(), PinnedMemoryResource(), ManagedMemoryResource(),
             HostMemoryResource(), AsyncMemoryResource.from_default_pool()]
    for i, x in enumerate(every):
        for j, y in enumerate(every):
            assert (x == y) is (i == j)
    # through refs
    ref = hmr.async_resource_ref[hmr.device_accessible]
    assert ref(DeviceMemoryResource()) == ref(DeviceMemoryResource(0))
    assert ref(DeviceMemoryResource()) != ref(PinnedMemoryResource())


def test_repr_names_device_and_settings():
    assert repr(DeviceMemoryResource()) == f"DeviceMemoryResource(device={hmr.get_device()})"
    assert repr(PinnedMemoryResource(3)) == "PinnedMemoryResource(flags=0x3)"
    assert repr(ManagedMemoryResource(2)) == "ManagedMemoryResource(flags=hipMemAttachHost)"
    assert repr(HostMemoryResource()) == "HostMemoryResource()"
    with AsyncMemoryResource(initial_pool_size=1 << 16, release_threshold=1 << 20) as a:
        text = repr(a)
        for part in ("device=", "initial_pool_size=65536", "release_threshold=1048576",
                     "enable_ipc=False", "pool 0x"):
            assert part in text
    assert "closed" in repr(a)
    assert "default_pool=True" in repr(AsyncMemoryResource.from_default_pool())


# ---- constructors -------------------------------------------------------------------------------
def test_constructor_arguments(emulator):
    with no_native_call(emulator):
        with pytest.raises(TypeError, match="flags"):
            PinnedMemoryResource(1.0)
        with pytest.raises(ValueError, match="flags"):
            PinnedMemoryResource(0x100)
        with pytest.raises(ValueError, match="Coherent"):
            PinnedMemoryResource(0x40000000 | 0x80000000)
        with pytest.raises(TypeError, match="flags"):
            ManagedMemoryResource(None)
        with pytest.raises(ValueError, match="hipMemAttachGlobal"):
            ManagedMemoryResource(4)
        with pytest.raises(ValueError, match="initial_pool_size: 1.5 as a fraction"):
            AsyncMemoryResource(initial_pool_size=1.5)
        with pytest.raises(TypeError, match="initial_pool_size"):
            AsyncMemoryResource(initial_pool_size=b"1")
        with pytest.raises(ValueError, match="initial_pool_size"):
            AsyncMemoryResource(initial_pool_size=-1)
        with pytest.raises(TypeError, match="release_threshold"):
            AsyncMemoryResource(release_threshold=b"1")
        with pytest.raises(ValueError, match="release_threshold: Could not parse"):
            AsyncMemoryResource(release_threshold="1 lot")
        with pytest.raises(ValueError, match="release_threshold"):
            AsyncMemoryResource(release_threshold=1 << 64)
        with pytest.raises(TypeError, match="enable_ipc"):
            AsyncMemoryResource(enable_ipc=1)
        with pytest.raises(TypeError, match="device"):
            DeviceMemoryResource("0")
        with pytest.raises(TypeError, match="device"):
            AsyncMemoryResource(1.0)
    with pytest.raises(ValueError, match="out of range"):
        DeviceMemoryResource(hmr.device_count())
    with pytest.raises(ValueError, match="out of range"):
        AsyncMemoryResource(-1)
    assert DeviceMemoryResource(hmr.Device(0)).device == 0


def test_pinned_flags_reach_the_runtime(emulator):
    r = PinnedMemoryResource(0x2 | 0x1)
    p = r.allocate(64)
    attrs = _hip.types.hipPointerAttribute_t()
    rt = _hip.get_runtime()
    rt.check(rt.fn.hipPointerGetAttributes(attrs, p))
    assert attrs.allocationFlags == 3
    r.deallocate(p, 64)
    m = ManagedMemoryResource(2)
    p = m.allocate(64)
    rt.check(rt.fn.hipPointerGetAttributes(attrs, p))
    assert attrs.isManaged and attrs.allocationFlags == 2
    m.deallocate(p, 64)


# ---- out of memory, injected failures ------------------------------------------------------------
@pytest.mark.parametrize("kind_name", ["device", "async", "async_default_pool", "managed"])
def test_out_of_memory(emulator, kind_name):
    r = FACTORIES[kind_name]()
    before = emulator.live_allocations()
    too_much = emulator.capacity(0) + (1 << 20)
    for call in (lambda: r.allocate(too_much), lambda: r.allocate_async(too_much, 256, 0)):
        with pytest.raises(OutOfMemoryError) as info:
            call()
        err = info.value
        assert isinstance(err, MemoryError) and err.size == too_much
        assert str(too_much) in str(err) and "on device 0" in str(err)
        assert err.device == 0
    assert emulator.live_allocations() == before
    p = r.allocate(1024)  # still usable
    r.deallocate(p, 1024)


def test_out_of_memory_pinned_and_host(emulator):
    with pytest.raises(OutOfMemoryError) as info:
        PinnedMemoryResource().allocate(1 << 50)
    assert info.value.size == 1 << 50
    with pytest.raises(OutOfMemoryError) as info:
        HostMemoryResource().allocate(1 << 62)
    assert info.value.size == 1 << 62 and info.value.call == "posix_memalign"
    assert isinstance(info.value, MemoryError)


@pytest.mark.parametrize("kind_name,call", [("device", "hipMalloc"),
                                            ("async", "hipMallocFromPoolAsync"),
                                            ("pinned", "hipHostMalloc"),
                                            ("managed", "hipMallocManaged")])
def test_injected_failure_leaves_nothing(emulator, kind_name, call):
    r = FACTORIES[kind_name]()
    before = emulator.live_allocations()
    emulator.inject_failure(code=2, count=2, calls=call)
    for attempt in (lambda: r.allocate(4096), lambda: r.allocate_async(4096, 256, 0)):
        with pytest.raises(OutOfMemoryError, match=call):
            attempt()
    assert emulator.live_allocations() == before
    emulator.inject_failure(code=1, calls=call)
    with pytest.raises(InvalidValueError):
        r.allocate(16)
    assert emulator.live_allocations() == before
    p = r.allocate(4096)
    write_read(r, p, 4096)
    r.deallocate(p, 4096)
    assert emulator.live_allocations() == before


def test_failures_reset_the_last_error(emulator):
    """A failure we raise leaves no stale error for the next library that checks (RMM and
    CCCL reset it too)."""
    rt = _hip.get_runtime()
    for kind_name, call in (("device", "hipMalloc"), ("async", "hipMallocFromPoolAsync"),
                            ("pinned", "hipHostMalloc"), ("managed", "hipMallocManaged")):
        r = FACTORIES[kind_name]()
        emulator.inject_failure(code=2, calls=call)
        with pytest.raises(OutOfMemoryError):
            r.allocate(64)
        assert rt.fn.hipPeekAtLastError() == 0
    with pytest.raises(InvalidValueError):
        DeviceMemoryResource().deallocate(4096 * 4096, 64)
    assert rt.fn.hipPeekAtLastError() == 0


def test_failed_free_raises(emulator):
    r = DeviceMemoryResource()
    p = r.allocate(64)
    r.deallocate(p, 64)
    with pytest.raises(InvalidValueError, match=f"hipFree.*ptr={p:#x}"):
        r.deallocate(p, 64)  # double free: the runtime says so
    a = AsyncMemoryResource.from_default_pool()
    with pytest.raises(InvalidValueError, match=f"hipFreeAsync.*ptr={p:#x}"):
        a.deallocate_async(p, 64, 256, 0)
    with pytest.raises(InvalidValueError, match="hipHostFree.*ptr="):
        PinnedMemoryResource().deallocate(p, 64)


def test_host_resource_refuses_what_it_did_not_allocate(emulator):
    r, other = HostMemoryResource(), HostMemoryResource()
    p = r.allocate(1000)
    foreign = ctypes.create_string_buffer(1000)
    with no_native_call(emulator):
        for bad_ptr, bad_size, match in ((ctypes.addressof(foreign), 1000, "ptr=0x"),
                                         (p + 256, 744, "ptr=0x"),
                                         (p, 999, "bytes=999")):
            with pytest.raises(ValueError, match=match):
                r.deallocate(bad_ptr, bad_size)
            with pytest.raises(ValueError, match=match):
                r.deallocate_async(bad_ptr, bad_size, 256, 0)
    write_read(r, p, 1000)
    other.deallocate(p, 1000)  # all host resources are equal: any of them frees it
    for call in (lambda: r.deallocate(p, 1000), lambda: r.deallocate_async(p, 1000, 256, 0)):
        with pytest.raises(ValueError, match="freed already"):
            call()


# ---- DeviceMemoryResource: current device -------------------------------------------------------
def test_device_resource_single_device_never_asks(emulator, monkeypatch):
    rt = _hip.get_runtime()
    calls = []
    real = rt.fn.hipGetDevice
    monkeypatch.setattr(rt.fn, "hipGetDevice", lambda out: calls.append(1) or real(out))
    r = DeviceMemoryResource(0)
    calls.clear()
    p = r.allocate(100)
    r.deallocate(p, 100)
    assert calls == []


def test_device_resource_switches_and_restores(two_devices, monkeypatch):
    rt = two_devices
    sets = []
    real_set = rt.fn.hipSetDevice
    monkeypatch.setattr(rt.fn, "hipSetDevice", lambda d: sets.append(d) or real_set(d))
    r1 = DeviceMemoryResource(1)
    assert hmr.get_device() == 0
    p = r1.allocate(1000)
    assert sets == [1, 0] and hmr.get_device() == 0
    attrs = _hip.types.hipPointerAttribute_t()
    rt.check(rt.fn.hipPointerGetAttributes(attrs, p))
    assert attrs.device == 1
    write_read(r1, p, 1000)
    sets.clear()
    with hmr.Device(1):  # already current: no switch at all
        sets.clear()
        r1.deallocate(p, 1000)
        assert sets == []
    # a failed allocation restores the device too
    rt.emulator.inject_failure(code=2, calls="hipMalloc")
    with pytest.raises(OutOfMemoryError) as info:
        r1.allocate(10)
    assert info.value.device == 1 and hmr.get_device() == 0
    assert DeviceMemoryResource(0) != r1


# ---- AsyncMemoryResource and its pool -----------------------------------------------------------
def test_async_pool_statistics():
    with AsyncMemoryResource() as a:
        pool = a.pool
        assert isinstance(pool, MemoryPool) and pool.owned and pool.device == a.device
        assert pool.release_threshold == MAX_RELEASE_THRESHOLD
        base_used = pool.used
        p = a.allocate(1 << 20)
        assert pool.used >= base_used + (1 << 20)
        assert pool.reserved >= pool.used
        assert pool.used_high >= pool.used and pool.reserved_high >= pool.reserved
        a.deallocate(p, 1 << 20)
        assert pool.used == base_used
        assert pool.reserved >= 1 << 20  # kept: the release threshold is the maximum
        pool.trim_to(0)
        assert pool.reserved <= pool.used + (1 << 21)
        pool.release_threshold = 0
        assert pool.release_threshold == 0
        pool.reset_high()
        assert pool.used_high == pool.used
        assert pool.access(a.device) == "read_write"
        pool.set_access(a.device)  # the owner keeps read-write access
        with pytest.raises(TypeError, match="read_write"):
            pool.set_access(a.device, read_write=1)
        with pytest.raises(ValueError, match="release_threshold"):
            pool.release_threshold = -1
        with pytest.raises(TypeError, match="bytes"):
            pool.trim_to(1.0)


def test_async_initial_pool_size_primes_the_pool():
    with AsyncMemoryResource(initial_pool_size=4 << 20) as a:
        assert a.pool.reserved >= 4 << 20
        assert a.pool.used == 0
    with AsyncMemoryResource(initial_pool_size=0) as a:
        assert a.pool.used == 0


def test_async_release_threshold(emulator):
    with AsyncMemoryResource(release_threshold=0) as a:
        assert a.pool.release_threshold == 0
        p = a.allocate(1 << 20)
        a.deallocate(p, 1 << 20)  # waits: the pool gives everything back
        assert a.pool.reserved == 0


def _pool_alive(rt, handle) -> bool:
    value = ctypes.c_uint64()
    return rt.fn.hipMemPoolGetAttribute(handle, 4, ctypes.byref(value)) == 0


def test_async_close(emulator):
    a = AsyncMemoryResource()
    rt = _hip.get_runtime()
    handle = a.pool.handle
    p = a.allocate(4096)
    q = a.allocate_async(512, 256, hmr.stream_per_thread)
    a.close()
    a.close()  # idempotent
    assert a.pool.closed and "closed" in repr(a.pool)
    with pytest.raises(ValueError, match="closed"):
        a.allocate(16)
    with pytest.raises(ValueError, match="closed"):
        a.allocate_async(16, 256, 0)
    for use in (lambda: a.pool.used, lambda: a.pool.handle, lambda: a.pool.trim_to(0),
                lambda: a.pool.release_threshold):
        with pytest.raises(ValueError, match="closed"):
            use()
    # destroyed only once nothing allocated from it is outstanding
    assert _pool_alive(rt, handle)
    a.deallocate(p, 4096)  # what it handed out can still be freed
    assert _pool_alive(rt, handle)
    a.deallocate_async(q, 512, 256, hmr.stream_per_thread)
    assert rt.fn.hipPeekAtLastError() == 0
    assert not _pool_alive(rt, handle)


def test_async_close_with_nothing_outstanding_destroys_at_once(emulator):
    a = AsyncMemoryResource(initial_pool_size=1 << 20)
    handle = a.pool.handle
    p = a.allocate(100)
    a.deallocate(p, 100)
    a.close()
    assert not _pool_alive(_hip.get_runtime(), handle)


def test_async_default_pool_is_not_owned(emulator):
    a = AsyncMemoryResource.from_default_pool()
    rt = _hip.get_runtime()
    out = ctypes.c_void_p()
    rt.check(rt.fn.hipDeviceGetMemPool(out, 0))
    assert a.pool.handle == out.value and not a.pool.owned
    a.close()
    value = ctypes.c_uint64()
    assert rt.fn.hipMemPoolGetAttribute(out.value, 4, ctypes.byref(value)) == 0  # still alive
    b = AsyncMemoryResource.from_default_pool(0)
    p = b.allocate(64)
    b.deallocate(p, 64)


def test_async_pool_destroyed_by_garbage_collection(emulator, monkeypatch):
    rt = _hip.get_runtime()
    destroyed = []
    real = rt.fn.hipMemPoolDestroy
    monkeypatch.setattr(rt.fn, "hipMemPoolDestroy", lambda h: destroyed.append(h) or real(h))
    a = AsyncMemoryResource()
    handle = a.pool.handle
    del a
    gc.collect()
    assert destroyed == [handle]


@pytest.mark.parametrize("failing", ["hipMemPoolSetAttribute", "hipMallocFromPoolAsync",
                                     "hipStreamSynchronize"])
def test_async_construction_failure_destroys_the_pool(emulator, monkeypatch, failing):
    rt = _hip.get_runtime()
    created, destroyed = [], []
    real_create, real_destroy = rt.fn.hipMemPoolCreate, rt.fn.hipMemPoolDestroy

    def create(out, props):
        st = real_create(out, props)
        created.append(out.value)
        return st
    monkeypatch.setattr(rt.fn, "hipMemPoolCreate", create)
    monkeypatch.setattr(rt.fn, "hipMemPoolDestroy",
                        lambda h: destroyed.append(h) or real_destroy(h))
    before = emulator.live_allocations()
    emulator.inject_failure(code=2 if failing == "hipMallocFromPoolAsync" else 1,
                            calls=failing)
    with pytest.raises(HipError, match=failing):
        AsyncMemoryResource(initial_pool_size=1 << 20)
    assert created and destroyed == created
    assert emulator.live_allocations() == before


def test_async_hot_path_passes_exactly_what_it_checked(emulator):
    """The native calls receive the checked size, pool and stream handle, whether the call
    takes the inline test (an int size, alignment 256, the stream validated last time, passed
    again) or the checked path (any other stream, alignment or size); a stream validated once
    does not let a bad one through afterwards."""
    a = AsyncMemoryResource()
    calls = []
    a._malloc = lambda out, n, pool, stream: calls.append(("malloc", n, pool, stream)) or 0
    a._free_fn = lambda ptr, stream: calls.append(("free", ptr, stream)) or 0
    pool = a.pool.handle
    with hmr.Stream() as s:
        h = s.handle
        big = (1 << 63) + 4096  # a valid address above 2**63
        for stream in (0, h, h, s, hmr.stream_ref(s), h, 0):
            for size, alignment in ((256, 256), (7, 1), (1 << 30, 256), (1 << 40, 64)):
                calls.clear()
                a.allocate_async(size, alignment, stream)
                a.deallocate_async(big, size, alignment, stream)
                a.deallocate_async(4096, size, alignment, stream)
                handle = hmr.stream_ref(stream).handle
                assert calls == [("malloc", size, pool, handle), ("free", big, handle),
                                 ("free", 4096, handle)]
        calls.clear()
        for bad in (-1, 1 << 64, True, 1.0, None, "0"):
            with pytest.raises((TypeError, ValueError), match="stream"):
                a.allocate_async(256, 256, bad)
            with pytest.raises((TypeError, ValueError), match="stream"):
                a.deallocate_async(4096, 256, 256, bad)
            a.allocate_async(256, 256, h)  # the last good one, again
        for size in (-1, 1.0, True, (1 << 63) + 1):
            with pytest.raises((TypeError, ValueError), match="bytes"):
                a.allocate_async(size, 256, h)
            with pytest.raises((TypeError, ValueError), match="bytes"):
                a.deallocate_async(4096, size, 256, h)
        for alignment in (256.0, True, 512, 3, None):
            with pytest.raises((TypeError, ValueError), match="alignment"):
                a.allocate_async(256, alignment, h)
            with pytest.raises((TypeError, ValueError), match="alignment"):
                a.deallocate_async(4096, 256, alignment, h)
        for ptr in (-1, 1 << 64, 4096.0, True):
            with pytest.raises((TypeError, ValueError), match="ptr"):
                a.deallocate_async(ptr, 256, 256, h)
        assert calls == [("malloc", 256, pool, h)] * 6
        calls.clear()
        assert a.allocate_async(0, 256, h) == 0 and a.deallocate_async(0, 256, 256, h) is None
        assert calls == []
    a.close()


def test_async_free_of_the_pointer_just_allocated_still_checks_everything_else(emulator):
    """A free of the int object the last allocation returned skips only the pointer's tests
    (an address the runtime gave); everything else is checked as always, an equal int made
    otherwise takes the full test, and before any allocation no pointer is let through."""
    import copy
    a = AsyncMemoryResource()
    frees = []
    real_free = a._free_fn
    a._free_fn = lambda ptr, stream: frees.append(ptr) or real_free(ptr, stream)
    for ptr in (None, 0.0, "0", True, -1):
        with pytest.raises((TypeError, ValueError), match="ptr"):
            a.deallocate_async(ptr, 256, 256, 0)
    a.deallocate_async(0, 256, 256, 0)               # a null pointer does nothing
    assert frees == []
    before = emulator.live_allocations().count
    p = a.allocate_async(256, 256, 0)
    for bytes_, alignment, stream, what in ((1.0, 256, 0, "bytes"), (-1, 256, 0, "bytes"),
                                            (256, 256.0, 0, "alignment"),
                                            (256, 3, 0, "alignment"), (256, 256, -1, "stream"),
                                            (256, 256, None, "stream")):
        with pytest.raises((TypeError, ValueError), match=what):
            a.deallocate_async(p, bytes_, alignment, stream)
    assert frees == [] and emulator.live_allocations().count == before + 1
    a.deallocate_async(p, 256, 256, 0)
    q = a.allocate_async(256, 256, 0)
    twin = copy.copy(a)                              # the same pool (and free function)
    same = int(str(q))                               # equal, another object: tested in full
    assert same == q and same is not q
    twin.deallocate_async(same, 256, 256, 0)
    assert frees == [p, q] and emulator.live_allocations().count == before
    with pytest.raises(TypeError, match="ptr"):
        a.deallocate_async(None, 256, 256, 0)
    a.close()


def test_async_size_known_by_identity_is_only_ever_a_size_once_tested(emulator):
    """The int object the last allocation took skips the size's tests (it passed them then);
    an equal int made otherwise takes them in full, and what is no valid size is refused
    before any native call, before and after allocations, on both paths."""
    import copy
    a = AsyncMemoryResource()
    calls = []
    real_malloc, real_free = a._malloc, a._free_fn
    a._malloc = lambda *args: calls.append("malloc") or real_malloc(*args)
    a._free_fn = lambda ptr, stream: calls.append("free") or real_free(ptr, stream)
    bad_sizes = (None, 1.5, "70000", True, -1, 1 << 64)
    for bad in bad_sizes:
        with pytest.raises((TypeError, ValueError), match="bytes|size"):
            a.allocate_async(bad, 256, 0)
    size = int("70000")                              # not one of CPython's cached ints
    p = a.allocate_async(size, 256, 0)
    assert a._bytes is size and calls == ["malloc"]
    before = emulator.live_allocations().count
    for bad in bad_sizes:
        with pytest.raises((TypeError, ValueError), match="bytes|size"):
            a.allocate_async(bad, 256, 0)
        with pytest.raises((TypeError, ValueError), match="bytes|size"):
            a.deallocate_async(p, bad, 256, 0)
    assert calls == ["malloc"] and emulator.live_allocations().count == before
    equal = int(str(size))                           # equal, another object: tested in full
    assert equal == size and equal is not size
    a.deallocate_async(p, equal, 256, 0)
    q = a.allocate_async(size, 256, 0)               # the same object again
    twin = copy.copy(a)
    assert twin._bytes is size
    twin.deallocate_async(q, size, 256, 0)
    assert calls == ["malloc", "free", "malloc", "free"]
    assert emulator.live_allocations().count == before - 1
    a.close()


def test_async_needs_memory_pool_support(emulator):
    old = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_VERSION": "6.1.0"})
    previous = _hip.set_runtime(old)
    try:
        assert not hmr.Device(0).supports_memory_pools
        for make in (AsyncMemoryResource, AsyncMemoryResource.from_default_pool):
            with pytest.raises(NotSupportedError, match="HIP_MEM_POOL_SUPPORT=1"):
                make()
        assert old.emulator.live_allocations().count == 0
    finally:
        _hip.set_runtime(previous)


def test_async_ipc(emulator):
    with AsyncMemoryResource(enable_ipc=True) as a:
        p = a.allocate(256)
        data = _hip.types.hipMemPoolPtrExportData()
        rt = _hip.get_runtime()
        # a pointer is exported only from a pool exported already
        assert rt.hip_code(rt.fn.hipMemPoolExportPointer(data, p)) == 1
        rt.clear_last_error()
        with a.pool.export_handle():
            rt.check(rt.fn.hipMemPoolExportPointer(data, p), "hipMemPoolExportPointer")
        a.deallocate(p, 256)
        assert "enable_ipc=True" in repr(a)


def test_async_on_another_device(two_devices):
    with AsyncMemoryResource(1, initial_pool_size=1 << 20) as a:
        assert a.device == 1 and a.pool.device == 1 and hmr.get_device() == 0
        p = a.allocate_async(4096, 256, 0)
        attrs = _hip.types.hipPointerAttribute_t()
        two_devices.check(two_devices.fn.hipPointerGetAttributes(attrs, p))
        assert attrs.device == 1
        a.deallocate_async(p, 4096, 256, 0)
        a.pool.set_access(0)
        assert a.pool.access(0) == "read_write"
        a.pool.set_access(0, read_write=False)
        assert a.pool.access(0) == "none"


# ---- sync resources wait for the stream before freeing -------------------------------------------
@pytest.mark.parametrize("kind_name", ["device", "pinned", "managed", "host"])
def test_deallocate_async_waits_for_the_stream(emulator, kind_name, monkeypatch):
    rt = _hip.get_runtime()
    synced = []
    real = rt.fn.hipStreamSynchronize
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", lambda s: synced.append(s) or real(s))
    r = FACTORIES[kind_name]()
    with hmr.Stream() as s:
        p = r.allocate_async(100, 256, s)
        assert synced == []  # allocation is immediate
        emulator.set_stream_busy(s.handle, 3)
        r.deallocate_async(p, 100, 256, s)
        assert synced == [s.handle]
        assert s.query()  # the synchronize made it idle


def test_host_resource_needs_no_hip_library():
    code = ("import hipmr_ctypes\n"
            "from hipmr_ctypes.resources import HostMemoryResource\n"
            "r = HostMemoryResource()\n"
            "p = r.allocate(1 << 16, 4096)\n"
            "assert p % 4096 == 0\n"
            "import ctypes; ctypes.memset(p, 7, 1 << 16)\n"
            "r.deallocate(p, 1 << 16, 4096)\n"
            "p = r.allocate_async(100, 64, 0); r.deallocate_async(p, 100, 64, 0)\n"
            "from hipmr_ctypes import _hip\n"
            "assert _hip.load_error() is not None\n"
            "print('ok')\n")
    env = dict(os.environ, HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n" and out.stderr == ""


def test_resources_are_picklable():
    import pickle
    for r in (DeviceMemoryResource(), PinnedMemoryResource(2), ManagedMemoryResource(2),
              HostMemoryResource()):
        assert pickle.loads(pickle.dumps(r)) == r


# ---- real GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind_name", sorted(FACTORIES))
def test_gpu_every_resource(gpu_runtime, kind_name):
    r = FACTORIES[kind_name]()
    try:
        assert set(r.properties) == PROPERTIES[kind_name]
        for alignment in ALIGNMENTS:
            for n in (1, 1000, 1 << 20, (8 << 20) + 5):
                p = r.allocate(n, alignment)
                assert p % alignment == 0
                write_read(r, p, n)
                r.deallocate(p, n, alignment)
        with hmr.Stream() as s:
            for st in (0, s, hmr.stream_per_thread, s.ref):
                ptrs = [(r.allocate_async(n, 256, st), n) for n in (256, 1 << 16, 3 << 20)]
                hmr.stream_ref(st).wait()
                for i, (p, n) in enumerate(ptrs):
                    write_read(r, p, n, seed=i)
                for p, n in ptrs:
                    r.deallocate_async(p, n, 256, st)
                hmr.stream_ref(st).wait()
        assert r.allocate(0) == 0
    finally:
        if isinstance(r, AsyncMemoryResource):
            r.close()


@pytest.mark.gpu
def test_gpu_host_access_of_pinned_and_managed(gpu_runtime):
    for r in (PinnedMemoryResource(), ManagedMemoryResource()):
        n = 1 << 16
        p = r.allocate(n)
        data = pattern(n, 11)
        ctypes.memmove(p, data, n)  # host writes directly
        dst = ctypes.create_string_buffer(n)
        gpu_runtime.check(gpu_runtime.fn.hipMemcpy(dst, p, n, 4))
        assert dst.raw == data
        r.deallocate(p, n)


@pytest.mark.gpu
def test_gpu_out_of_memory(gpu_runtime):
    free, total = hmr.Device(0).memory_info()
    too_much = total * 4
    for r in (DeviceMemoryResource(0), AsyncMemoryResource.from_default_pool(0)):
        with pytest.raises(OutOfMemoryError) as info:
            r.allocate(too_much)
        assert info.value.size == too_much and info.value.device == 0
        assert gpu_runtime.fn.hipPeekAtLastError() == 0  # no stale error left for others
        p = r.allocate(1 << 20)
        r.deallocate(p, 1 << 20)


@pytest.mark.gpu
def test_gpu_async_pool(gpu_runtime):
    with AsyncMemoryResource(0, initial_pool_size=64 << 20) as a:
        assert a.pool.reserved >= 64 << 20
        assert a.pool.release_threshold == MAX_RELEASE_THRESHOLD
        with hmr.Stream() as s:
            p = a.allocate_async(1 << 20, 256, s)
            assert a.pool.used >= 1 << 20
            write_read(a, p, 1 << 20)
            a.deallocate_async(p, 1 << 20, 256, s)
            s.synchronize()
        a.pool.trim_to(0)
        assert a.pool.reserved <= 64 << 20
        a.pool.release_threshold = 1 << 20
        assert a.pool.release_threshold == 1 << 20
        assert a.pool.access(0) == "read_write"
    d = AsyncMemoryResource.from_default_pool(0)
    assert not d.pool.owned and d == AsyncMemoryResource.from_default_pool(0)

"""Buffer as RMM's DeviceBuffer grows and moves: Buffer(), capacity / reserve / resize,
release, prefetch, tobytes(stream), __sizeof__, copies of smaller sources (RMM's test_rmm.py
DeviceBuffer tests in our names, plus failure and stream-order cases)."""
from __future__ import annotations

import copy
import sys

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer

pytestmark = pytest.mark.gpu   # every test allocates: run them on the GPU too


def data(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


RESOURCES = {
    "device": lambda: hmr.DeviceMemoryResource(),
    "pool": lambda: hmr.PoolResource(hmr.DeviceMemoryResource(), 1 << 20),
    "managed": lambda: hmr.ManagedMemoryResource(),
    "pinned": lambda: hmr.PinnedMemoryResource(),
    "host": lambda: hmr.HostMemoryResource(),
    "async": lambda: hmr.AsyncMemoryResource.from_default_pool(),
}


def test_empty_buffer():
    b = Buffer()
    assert b.size == 0 and len(b) == 0 and b.capacity() == 0 and b.ptr == 0
    assert b.tobytes() == b"" and bytes(b) == b""
    b.close()


@pytest.mark.parametrize("kind", sorted(RESOURCES))
@pytest.mark.parametrize("size", [0, 1, 10, 1000, (1 << 20) + 3])
def test_size_capacity_and_sizeof(kind, size):
    b = Buffer(size, resource=RESOURCES[kind]())
    assert b.size == len(b) == b.nbytes == size and b.capacity() == size
    assert sys.getsizeof(b) >= size and b.__sizeof__() == object.__sizeof__(b) + size
    b.close()


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_resize_keeps_the_contents(kind):
    b = Buffer.from_host(data(1000), resource=RESOURCES[kind]())
    ptr = b.ptr
    b.resize(400)                               # within capacity: nothing moves
    assert (b.size, b.capacity(), b.ptr) == (400, 1000, ptr)
    assert b.tobytes() == data(1000)[:400]
    b.resize(1000)
    assert b.ptr == ptr and b.tobytes()[:400] == data(1000)[:400]
    b.resize(5000)                              # beyond: a new allocation of exactly 5000
    assert (b.size, b.capacity()) == (5000, 5000)
    assert b.tobytes()[:1000] == data(1000)
    b.resize(0)
    assert b.size == 0 and b.capacity() == 5000 and b.tobytes() == b""
    b.close()


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_reserve(kind):
    b = Buffer.from_host(data(300), resource=RESOURCES[kind]())
    b.reserve(100)                              # smaller: nothing happens
    assert b.capacity() == 300
    b.reserve(4096)
    assert (b.size, b.capacity()) == (300, 4096) and b.tobytes() == data(300)
    b.resize(4096)                              # now within capacity
    assert b.capacity() == 4096 and b.tobytes()[:300] == data(300)
    b.close()


def test_growing_an_empty_buffer():
    b = Buffer()
    b.resize(16)
    b.copy_from_host(data(16))
    assert b.tobytes() == data(16) and b.capacity() == 16
    c = Buffer()
    c.reserve(64)
    assert (c.size, c.capacity()) == (0, 64) and c.ptr != 0
    c.close()
    b.close()


def test_growth_gives_the_old_memory_back_through_the_resource():
    tracked = hmr.TrackingResource(hmr.DeviceMemoryResource())
    b = Buffer.from_host(data(100), resource=tracked)
    old = b.ptr
    b.resize(10_000)
    assert list(tracked.outstanding()) == [b.ptr] and b.ptr != old
    assert tracked.get_allocated_bytes() == 10_000
    b.close()
    assert tracked.get_outstanding_allocations_str() == ""


def test_growth_is_stream_ordered_and_moves_the_buffer_to_the_stream():
    tracked = hmr.TrackingResource(hmr.DeviceMemoryResource())
    with hmr.Stream() as s:
        b = Buffer.from_host(data(256), resource=tracked)
        b.resize(1 << 16, stream=s)
        assert b.stream == s and tracked.outstanding()[b.ptr].stream == s.handle
        s.synchronize()
        assert b.tobytes()[:256] == data(256)
        b.reserve(1 << 17)           # stream=None: the buffer's own stream, now s
        assert tracked.outstanding()[b.ptr].stream == s.handle and b.stream == s
        b.resize(10, stream=0)       # within capacity: only the stream changes
        assert b.stream == 0 and b.capacity() == 1 << 17
        b.close()
        assert tracked.outstanding() == {}
        # an explicit stream for tobytes: copied there and waited for
        c = Buffer.from_host(data(64), stream=s)
        assert c.tobytes(stream=s) == data(64) and c.tobytes(s.handle) == data(64)
        c.close()


def test_failed_growth_leaves_the_buffer_as_it_was():
    limited = hmr.LimitingResource(hmr.DeviceMemoryResource(), 4096)
    b = Buffer.from_host(data(1000), resource=limited)
    ptr = b.ptr
    with pytest.raises(hmr.OutOfMemoryError):
        b.resize(8192)
    with pytest.raises(hmr.OutOfMemoryError):
        b.reserve(5000)
    assert (b.ptr, b.size, b.capacity()) == (ptr, 1000, 1000)
    assert b.tobytes() == data(1000) and limited.get_allocated_bytes() == 1000
    b.resize(3000)   # fits (the old memory is freed after the copy)
    assert limited.get_allocated_bytes() == 3000
    b.close()
    assert limited.get_allocated_bytes() == 0


def test_failed_free_of_the_old_memory_keeps_it(emulator):
    up = hmr.DeviceMemoryResource()
    refuse = [False]

    def alloc(n, a, s):
        return up.allocate_async(n, a, s)

    def free(p, n, a, s):
        if refuse[0]:          # refuse once: the old memory's free
            refuse[0] = False
            raise RuntimeError("refused")
        up.deallocate_async(p, n, a, s)

    mr = hmr.CallbackResource(lambda n, a: alloc(n, a, 0), lambda p, n, a: free(p, n, a, 0),
                              alloc, free, properties=(hmr.device_accessible,))
    b = Buffer.from_host(data(100), resource=mr)
    ptr = b.ptr
    live = emulator.live_allocations()
    refuse[0] = True
    with pytest.raises(RuntimeError, match="refused"):
        b.resize(1000)
    assert (b.ptr, b.size, b.capacity()) == (ptr, 100, 100) and b.tobytes() == data(100)
    assert emulator.live_allocations() == live   # the new allocation was given back
    b.close()


def test_bad_arguments_change_nothing():
    b = Buffer.from_host(data(10))
    for bad, exc in [(-1, ValueError), (1.5, TypeError), ("10", TypeError), (None, TypeError),
                     (True, TypeError)]:
        with pytest.raises(exc):
            b.resize(bad)
        with pytest.raises(exc):
            b.reserve(bad)
    with pytest.raises(TypeError):
        b.resize(20, stream="s")
    with pytest.raises(ValueError):
        b.reserve(20, stream=-1)
    assert (b.size, b.capacity(), b.tobytes()) == (10, 10, data(10))
    b.close()
    for call in (lambda: b.resize(1), lambda: b.reserve(1), b.release, b.prefetch):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_release_moves_the_allocation():
    tracked = hmr.TrackingResource(hmr.DeviceMemoryResource())
    b = Buffer.from_host(data(500), resource=tracked)
    ptr = b.ptr
    moved = b.release()
    assert (moved.ptr, moved.size, moved.capacity()) == (ptr, 500, 500)
    assert moved.resource is tracked and moved.tobytes() == data(500)
    assert (b.size, b.capacity(), b.ptr, b.closed) == (0, 0, 0, False)
    assert b.tobytes() == b""
    del b                                  # the old one owns nothing any more
    assert list(tracked.outstanding()) == [ptr]
    del moved                              # the new one frees it
    assert tracked.outstanding() == {}


def test_release_refused_while_exported():
    np = pytest.importorskip("numpy")
    b = Buffer.from_host(data(64), resource=hmr.HostMemoryResource())
    view = np.from_dlpack(b)
    for call in (b.release, lambda: b.resize(128), lambda: b.reserve(128)):
        with pytest.raises(BufferError, match="DLPack"):
            call()
    assert bytes(view) == data(64)
    del view


@pytest.mark.parametrize("kind", ["device", "pool", "managed", "pinned", "host"])
def test_prefetch_on_any_memory(kind):
    b = Buffer.from_host(data(4096), resource=RESOURCES[kind]())
    b.prefetch()
    b.prefetch(hmr.get_device())
    with hmr.Stream() as s:
        b.prefetch(stream=s)
        s.synchronize()
    assert b.tobytes() == data(4096)
    with pytest.raises(ValueError):
        b.prefetch(device=64)
    with pytest.raises(TypeError):
        b.prefetch(stream="s")
    Buffer().prefetch()
    b.close()


def test_copies_of_smaller_sources_fill_the_start():
    b = Buffer.from_host(bytes(10))
    b.copy_from_host(b"abc")
    assert b.tobytes() == b"abc" + bytes(7)
    src = Buffer.from_host(b"XY")
    b.copy_from_device(src)
    assert b.tobytes() == b"XYc" + bytes(7)
    out = bytearray(b"-" * 12)
    b.copy_to_host(out)          # a larger destination: its start is written
    assert out == b"XYc" + bytes(7) + b"--"
    with pytest.raises(ValueError, match="more than the buffer's 10"):
        b.copy_from_host(bytes(11))
    with pytest.raises(ValueError, match="more than the buffer's 2"):
        src.copy_from_device(b)
    assert b.tobytes() == b"XYc" + bytes(7)


def test_copy_and___copy__():
    b = Buffer.from_host(data(100))
    for c in (b.copy(), copy.copy(b)):
        assert c.tobytes() == data(100) and c.ptr != b.ptr and c.resource == b.resource
        c.close()
    b.close()

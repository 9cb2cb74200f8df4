"""Stream-ordered sub-allocators and streams that end: a closed (or collected) Stream is
forgotten by every pool / fixed-size resource before its handle is destroyed, the ordering
path never asks the runtime about a stream that may be gone, and the state kept per stream
stays bounded by the streams alive.

The emulator records every call made with a destroyed stream handle
(``destroyed_stream_calls``): on CUDA some of them crash the process (``cudaStreamGetDevice``).
"""
from __future__ import annotations

import ctypes
import gc

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer, _hip
from hipmr_ctypes._stream_order import SYNC


def _pool():
    return hmr.PoolResource(hmr.DeviceMemoryResource(), 1 << 20)


def _fixed():
    return hmr.FixedSizeResource(hmr.DeviceMemoryResource(), block_size=1 << 16)


def _state(mr):
    return mr._arena if isinstance(mr, hmr.PoolResource) else mr._state


@pytest.fixture
def calls(emulator):
    del emulator.destroyed_stream_calls[:]
    yield emulator.destroyed_stream_calls
    del emulator.destroyed_stream_calls[:]


def test_the_emulator_records_calls_on_destroyed_streams(calls):
    rt = _hip.get_runtime()
    s = hmr.Stream()
    handle = s.handle
    s.close()
    with pytest.raises(hmr.HipError):
        hmr.stream_ref(handle).device()
    ev = hmr.Event(flags=2)
    with pytest.raises(hmr.HipError):
        ev.record(handle)
    ev.close()
    assert [name for name, h in calls] == ["hipStreamGetDevice", "hipEventRecord"]
    assert all(h == handle for _, h in calls)
    assert rt.fn.hipStreamDestroy(handle) != 0
    assert calls[-1] == ("hipStreamDestroy", handle)


@pytest.mark.parametrize("make", [_pool, _fixed], ids=["pool", "fixed_size"])
def test_blocks_freed_on_a_closed_stream_are_reused_without_touching_it(make, calls):
    # the sequence that crashed on CUDA: free on `with Stream() as s`, allocate after it
    mr = make()
    pf = hmr.PrefetchResource(mr)
    sizes = (1, 256, 1 << 16)
    with hmr.Stream() as s:
        handle = s.handle
        for size in sizes:
            p = pf.allocate(size)
            q = pf.allocate_async(size, 256, s)
            assert p and q and p != q
            pf.deallocate(p, size)
            pf.deallocate_async(q, size, 256, s)
        assert _state(mr).holds_stream(handle)
    assert not _state(mr).holds_stream(handle)
    assert handle not in _state(mr).free
    with hmr.Stream() as t:  # another stream, and the host, take the blocks
        ptrs = [pf.allocate_async(size, 256, t) for size in sizes]
        ptrs += [pf.allocate(size) for size in sizes]
        for ptr, size in zip(ptrs, sizes + sizes):
            pf.deallocate(ptr, size)
    buf = Buffer(4096, resource=pf)
    buf.copy_from_host(b"\x01" * 4096)
    assert buf.tobytes() == b"\x01" * 4096
    buf.close()
    assert calls == []


def test_a_collected_stream_is_forgotten_too(calls):
    mr = _pool()
    s = hmr.Stream()
    handle = s.handle
    p = mr.allocate_async(5000, 256, s)
    mr.deallocate_async(p, 5000, 256, s)
    del s
    gc.collect()
    arena = _state(mr)
    assert handle not in arena.free and not arena.holds_stream(handle)
    assert all(handle not in tag for tag in arena.ftag.values())
    with hmr.Stream() as t:
        q = mr.allocate_async(5000, 256, t)
        mr.deallocate_async(q, 5000, 256, t)
    assert mr.allocate(1 << 19)  # through the best-fit structure
    assert calls == []


def test_a_chunk_grown_on_a_stream_is_clean_once_it_closes(calls):
    mr = hmr.PoolResource(hmr.DeviceMemoryResource())
    with hmr.Stream() as s:
        p = mr.allocate_async(1 << 12, 256, s)  # the chunk starts tagged with s
    assert all(not tag for tag in _state(mr).ftag.values())
    mr.deallocate(p, 1 << 12)
    assert mr.allocate(1 << 12)
    assert calls == []


@pytest.mark.parametrize("make", [_pool, _fixed], ids=["pool", "fixed_size"])
def test_state_per_stream_stays_bounded_with_many_short_lived_streams(make, calls):
    mr = make()
    state = _state(mr)
    for i in range(300):
        with hmr.Stream() as s:
            p = mr.allocate_async(1000, 256, s)
            mr.deallocate_async(p, 1000, 256, s)
            q = mr.allocate(1000)  # the host takes a block the stream freed before
            mr.deallocate(q, 1000)
    from hipmr_ctypes.adaptors.pool import _Keyed, _OwnLists  # the special handles' entries
    assert [k for k, v in state.free.items() if not isinstance(v, (_Keyed, _OwnLists))] == [SYNC]
    assert state.streams.devices == {} and state.streams.events == {}
    assert calls == []


def test_a_foreign_stream_destroyed_behind_the_pool_is_never_asked_its_device(calls):
    # the documented limit for raw handles: the pool still holds the key, but the ordering
    # path only records an event on it (an error code, not a crash) and waits device-wide
    rt = _hip.get_runtime()
    out = ctypes.c_void_p()
    rt.check(rt.fn.hipStreamCreateWithPriority(out, 0, 0), "hipStreamCreateWithPriority")
    raw = out.value
    mr = _pool()
    p = mr.allocate_async(1 << 19, 256, raw)
    mr.deallocate_async(p, 1 << 19, 256, raw)
    rt.check(rt.fn.hipStreamDestroy(raw), "hipStreamDestroy")
    with hmr.Stream() as t:
        big = mr.allocate_async(3 << 18, 256, t)  # misses: flush, the block moves to t
        mr.deallocate_async(big, 3 << 18, 256, t)
    assert "hipStreamGetDevice" not in [name for name, _ in calls]


def test_a_closed_stream_object_is_refused_by_the_pool_fast_paths(emulator):
    """The pool's fast paths read a package Stream's handle without a call; once the Stream
    is closed they take the checked path, which says so, and nothing changes."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    s = hmr.Stream()
    p = pool.allocate_async(512, 256, s)
    pool.deallocate_async(p, 512, 256, s)
    q = pool.allocate_async(512, 256, s)
    assert q == p          # the fast path: the block freed on s, for s
    pool.deallocate_async(q, 512, 256, s)
    s.close()
    with pytest.raises(ValueError, match="Stream is closed"):
        pool.allocate_async(512, 256, s)
    r = pool.allocate_async(512, 256, 0)
    with pytest.raises(ValueError, match="Stream is closed"):
        pool.deallocate_async(r, 512, 256, s)
    pool.deallocate_async(r, 512, 256, 0)   # still live: the refused free changed nothing
    assert pool.get_allocated_bytes() == 0

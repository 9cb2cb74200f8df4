"""PoolResource over AsyncMemoryResource on a real GPU with several streams: memory freed on a
stream with work still queued is reused on another stream only after an event wait, and by a
synchronous allocation only once that work is done.  (Skips on the emulated platform; run
with HIPMR_PLATFORM=nvidia or amd.)"""
import ctypes

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes.adaptors import PoolResource

SIZE = 256 << 20      # large enough that many memsets keep a stream busy for a while
QUEUED = 200


def _memset(rt, ptr, value, nbytes, stream):
    rt.check(rt.fn.hipMemsetAsync(ptr, value, nbytes, stream), "hipMemsetAsync")


def _bytes_at(rt, ptr, offsets):
    out = []
    for off in offsets:
        b = ctypes.c_ubyte()
        rt.check(rt.fn.hipMemcpy(ctypes.addressof(b), ptr + off, 1, 2), "hipMemcpy")
        out.append(b.value)
    return out


@pytest.mark.gpu
def test_cross_stream_reuse_waits_for_the_freeing_stream(gpu_runtime):
    rt = gpu_runtime
    s1, s2 = hmr.Stream(flags=1), hmr.Stream(flags=1)      # non-blocking: no implicit sync
    pool = PoolResource(hmr.AsyncMemoryResource())
    p = pool.allocate_async(SIZE, 256, s1)
    for _ in range(QUEUED):                                 # s1 stays busy writing 1s
        _memset(rt, p, 1, SIZE, s1.handle)
    pool.deallocate_async(p, SIZE, 256, s1)
    q = pool.allocate_async(SIZE, 256, s2)
    assert q == p                                           # the freed block is reused ...
    _memset(rt, q, 2, SIZE, s2.handle)                      # ... after s2 waited for s1
    s2.synchronize()
    assert s1.query()                                       # s2 could only finish after s1
    assert _bytes_at(rt, q, [0, SIZE // 2, SIZE - 1]) == [2, 2, 2]
    pool.deallocate_async(q, SIZE, 256, s2)
    pool.release()
    s1.close()
    s2.close()


@pytest.mark.gpu
def test_synchronous_allocation_waits_on_the_host(gpu_runtime):
    rt = gpu_runtime
    s1 = hmr.Stream(flags=1)
    pool = PoolResource(hmr.AsyncMemoryResource())
    p = pool.allocate_async(SIZE, 256, s1)
    for _ in range(QUEUED):
        _memset(rt, p, 3, SIZE, s1.handle)
    pool.deallocate_async(p, SIZE, 256, s1)
    q = pool.allocate(SIZE)
    assert q == p and s1.query()                            # the work on s1 is done
    rt.check(rt.fn.hipMemset(q, 4, SIZE), "hipMemset")
    assert _bytes_at(rt, q, [0, SIZE - 1]) == [4, 4]
    pool.deallocate(q, SIZE)
    pool.release()
    s1.close()


@pytest.mark.gpu
def test_many_streams_many_blocks(gpu_runtime):
    rt = gpu_runtime
    streams = [hmr.Stream(flags=1) for _ in range(4)]
    pool = PoolResource(hmr.AsyncMemoryResource(), maximum_pool_size=1 << 30)
    live = []
    for i in range(400):
        s = streams[i % 4]
        n = (1 + i % 7) << 16
        if len(live) > 12:       # freed on the stream that used it, reused on any
            ptr, m, _, used_on = live.pop(0)
            pool.deallocate_async(ptr, m, 256, used_on)
        ptr = pool.allocate_async(n, 256, s)
        value = 1 + i % 250
        _memset(rt, ptr, value, n, s.handle)
        live.append((ptr, n, value, s))
    for s in streams:
        s.synchronize()
    for ptr, n, value, _ in live:                           # no live block was overwritten
        assert _bytes_at(rt, ptr, [0, n - 1]) == [value, value]
    for ptr, n, _, s in live:
        pool.deallocate_async(ptr, n, 256, s)
    pool.release()
    assert pool.pool_size() == 0
    for s in streams:
        s.close()

"""Graph capture through the binding (hipStreamBeginCapture ... hipGraphLaunch) with the pool and
the async resource: what they do on a capturing stream is captured, never refused, and the
graph replays it; what capture forbids raises HipError.

Each test runs on the emulated platform and, marked ``gpu``, on a real device
(``HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1 python -m pytest -m gpu
tests/device/test_capture.py``).
"""
import ctypes
import threading
from ctypes import byref, c_int, c_void_p

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes.adaptors import PoolResource

GLOBAL, RELAXED = 0, 2
D2D, D2H, DEFAULT = 3, 2, 4
N = 4096
MiB = 1 << 20
#: what a capture-safe allocator never calls while a stream captures
FORBIDDEN = ("hipEventRecord", "hipStreamWaitEvent", "hipEventSynchronize", "hipEventQuery",
             "hipStreamSynchronize", "hipStreamQuery", "hipDeviceSynchronize")


@pytest.fixture(params=["emulated", pytest.param("gpu", marks=pytest.mark.gpu)])
def rt(request):
    if request.param == "gpu":
        return request.getfixturevalue("gpu_runtime")
    runtime = _hip.get_runtime()
    if runtime.platform != "emulated":
        pytest.skip("on a real platform the [gpu] case runs")
    return runtime


@pytest.fixture
def spy(rt, monkeypatch):
    """The forbidden calls made while ``spy.on`` (through ``rt.fn``)."""
    class Spy:
        on = False
        calls = []
        args = []
    for name in FORBIDDEN:
        real = getattr(rt.fn, name)

        def counted(*args, _real=real, _name=name):
            if Spy.on:
                Spy.calls.append(_name)
                Spy.args.append(args)
            return _real(*args)
        monkeypatch.setattr(rt.fn, name, counted)
    return Spy


def begin(rt, stream, mode=GLOBAL):
    rt.check(rt.fn.hipStreamBeginCapture(stream.handle, mode), "hipStreamBeginCapture")


def end(rt, stream):
    graph = c_void_p()
    rt.check(rt.fn.hipStreamEndCapture(stream.handle, byref(graph)), "hipStreamEndCapture")
    return graph.value


def end_anyway(rt, stream):
    """End a capture that failed midway (its graph, if any, destroyed)."""
    graph = c_void_p()
    if rt.fn.hipStreamEndCapture(stream.handle, byref(graph)) == 0 and graph.value:
        rt.fn.hipGraphDestroy(graph.value)
    rt.clear_last_error()


def instantiate(rt, graph):
    ex = c_void_p()
    rt.check(rt.fn.hipGraphInstantiate(byref(ex), graph, None, None, 0), "hipGraphInstantiate")
    return ex.value


def destroy(rt, graph, ex):
    rt.check(rt.fn.hipGraphExecDestroy(ex), "hipGraphExecDestroy")
    rt.check(rt.fn.hipGraphDestroy(graph), "hipGraphDestroy")


def memset(rt, ptr, value, nbytes, stream):
    rt.check(rt.fn.hipMemsetAsync(ptr, value, nbytes, stream.handle), "hipMemsetAsync")


def copy(rt, dst, src, nbytes, kind, stream):
    rt.check(rt.fn.hipMemcpyAsync(dst, src, nbytes, kind, stream.handle), "hipMemcpyAsync")


def launch_twice(rt, graph, stream, host, expected):
    ex = instantiate(rt, graph)
    for _ in range(2):
        ctypes.memset(host, 0, N)
        rt.check(rt.fn.hipGraphLaunch(ex, stream.handle), "hipGraphLaunch")
        stream.synchronize()
        assert ctypes.string_at(host, N) == expected
    destroy(rt, graph, ex)


def test_pool_over_the_async_resource_is_captured_and_replayed(rt, spy):
    """Blocks of the capturing stream's own are reused with no event; a block another stream
    freed is passed over (no event wait); a miss is the upstream's graph allocation, freed in
    the graph; the capture stays valid and the graph gives the same bytes at every launch."""
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s, other = hmr.Stream(flags=1), hmr.Stream(flags=1)
    pool = PoolResource(hmr.AsyncMemoryResource())
    theirs = pool.allocate_async(MiB, 256, other)   # one chunk each (the smallest growth)
    own = pool.allocate_async(MiB, 256, s)
    pool.deallocate_async(theirs, MiB, 256, other)
    pool.deallocate_async(own, MiB, 256, s)
    pool._arena._flush_all()   # both into the best-fit structure, tagged with their streams
    size_before = pool.pool_size()
    begin(rt, s)
    spy.on = True
    a = pool.allocate_async(MiB, 256, s)            # its own block, never `other`'s
    assert a == own
    memset(rt, a, 7, N, s)
    b = pool.allocate_async(2 * MiB, 256, s)        # a miss: the upstream's graph allocation
    assert pool.pool_size() == size_before and b in pool._arena.graph_blocks
    copy(rt, b, a, N, D2D, s)
    copy(rt, host, b, N, D2H, s)
    pool.deallocate_async(b, 2 * MiB, 256, s)       # a free node
    pool.deallocate_async(a, MiB, 256, s)
    assert s.is_capturing
    spy.on = False
    graph = end(rt, s)
    assert not s.is_capturing
    assert spy.calls == []
    launch_twice(rt, graph, s, host, b"\x07" * N)
    assert pool.allocate_async(MiB, 256, other) == theirs   # still there for its stream
    pool.deallocate_async(theirs, MiB, 256, other)
    assert pool._arena.graph_blocks == {}
    pool.release()
    pinned.deallocate(host, N)


def test_pool_over_a_synchronous_upstream_grows_in_relaxed_mode(rt, spy):
    """A pool over hipMalloc memory grows during a Global-mode capture (the upstream's
    allocation made in Relaxed mode, as CUDA allows), and the capture stays valid."""
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s = hmr.Stream(flags=1)
    pool = PoolResource(hmr.DeviceMemoryResource())
    begin(rt, s)
    spy.on = True
    a = pool.allocate_async(N, 256, s)
    assert pool.pool_size() >= N
    memset(rt, a, 3, N, s)
    copy(rt, host, a, N, D2H, s)
    spy.on = False
    graph = end(rt, s)
    assert spy.calls == []
    launch_twice(rt, graph, s, host, b"\x03" * N)
    pool.deallocate_async(a, N, 256, s)
    s.synchronize()
    pool.release()
    pinned.deallocate(host, N)


@pytest.mark.parametrize("kind", ["AsyncMemoryResource", "AsyncPinnedMemoryResource",
                                  "AsyncManagedMemoryResource"])
def test_async_resource_allocations_become_graph_allocations(rt, spy, kind):
    try:
        mr = getattr(hmr, kind)()
    except (hmr.NotSupportedError, ValueError) as exc:
        pytest.skip(f"{kind}: {exc}")
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s = hmr.Stream(flags=1)
    begin(rt, s)
    spy.on = True
    try:
        a = mr.allocate_async(N, 256, s)
    except hmr.HipError as exc:
        end_anyway(rt, s)
        if kind == "AsyncMemoryResource":
            raise
        pytest.skip(f"the runtime captures no allocation from a {kind}'s pool: {exc}")
    memset(rt, a, 5, N, s)
    copy(rt, host, a, N, DEFAULT, s)
    mr.deallocate_async(a, N, 256, s)
    spy.on = False
    graph = end(rt, s)
    assert spy.calls == []
    launch_twice(rt, graph, s, host, b"\x05" * N)
    pinned.deallocate(host, N)


def test_what_capture_forbids_raises_hip_error(rt):
    s = hmr.Stream(flags=1)
    begin(rt, s)
    assert s.is_capturing
    with pytest.raises(hmr.HipError) as info:
        s.synchronize()
    assert info.value.code == 900   # hipErrorStreamCaptureUnsupported
    status = c_int()
    rt.check(rt.fn.hipStreamIsCapturing(s.handle, byref(status)), "hipStreamIsCapturing")
    assert status.value == 2        # invalidated
    with pytest.raises(hmr.HipError) as info:
        end(rt, s)
    assert info.value.code == 901   # hipErrorStreamCaptureInvalidated
    assert not s.is_capturing
    ev = hmr.Event()
    begin(rt, s)
    ev.record(s)
    with pytest.raises(hmr.HipError) as info:
        ev.synchronize()
    assert info.value.code in (900, 907)   # CapturedEvent (CUDA may say Unsupported)
    graph = c_void_p()   # invalidated or not, the capture ends
    st = rt.fn.hipStreamEndCapture(s.handle, byref(graph))
    if st == 0:
        rt.check(rt.fn.hipGraphDestroy(graph.value), "hipGraphDestroy")
    else:
        assert rt.hip_code(st) == 901
        rt.clear_last_error()
    assert not s.is_capturing


def test_other_threads_keep_allocating_on_their_streams_during_a_capture(rt, spy):
    """A capture in Global mode on one stream; other threads allocate from the same pool on
    their own streams meanwhile (their own blocks: no event, no synchronization)."""
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s = hmr.Stream(flags=1)
    pool = PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 20)
    streams = [hmr.Stream(flags=1) for _ in range(3)]
    errors = []
    started = threading.Barrier(len(streams) + 1)

    def work(t):
        try:
            started.wait()
            for _ in range(200):
                p = pool.allocate_async(N, 256, t)
                pool.deallocate_async(p, N, 256, t)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(t,)) for t in streams]
    for t in threads:
        t.start()
    begin(rt, s)
    started.wait()
    a = pool.allocate_async(2 * N, 256, s)
    memset(rt, a, 9, N, s)
    copy(rt, host, a, N, D2H, s)
    pool.deallocate_async(a, 2 * N, 256, s)
    for t in threads:
        t.join()
    graph = end(rt, s)
    assert errors == []
    launch_twice(rt, graph, s, host, b"\x09" * N)
    for t in streams:
        t.synchronize()
    pool.release()
    pinned.deallocate(host, N)


def test_stream_capture_methods_and_graph(rt, spy):
    """The public surface: ``Stream.begin_capture`` / ``end_capture`` give a ``Graph`` that
    ``launch`` replays; bad input raises before any native call; a closed graph refuses."""
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s = hmr.Stream(flags=1)
    pool = PoolResource(hmr.AsyncMemoryResource())
    with pytest.raises(ValueError, match="mode"):
        s.begin_capture("sometimes")
    assert not s.is_capturing
    s.begin_capture()
    with pytest.raises(hmr.HipError):
        s.begin_capture("relaxed")                 # already capturing
    spy.on = True
    a = pool.allocate_async(N, 256, s)
    memset(rt, a, 0x42, N, s)
    copy(rt, host, a, N, D2H, s)
    pool.deallocate_async(a, N, 256, s)
    spy.on = False
    with s.end_capture() as graph:
        assert spy.calls == []
        with pytest.raises(TypeError):
            graph.launch("stream")
        for _ in range(2):
            ctypes.memset(host, 0, N)
            graph.launch(s)
            s.synchronize()
            assert ctypes.string_at(host, N) == b"\x42" * N
    assert graph.closed
    with pytest.raises(ValueError, match="closed"):
        graph.launch(s)
    with pytest.raises(TypeError):
        hmr.Graph()
    with pytest.raises(hmr.HipError):
        s.end_capture()                            # not capturing
    pool.release()
    pinned.deallocate(host, N)


def test_fixed_size_resource_is_captured_without_events(rt, spy):
    """FixedSizeResource over the async resource: a block another stream freed is passed
    over, and the resource grows with the upstream's synchronous allocation (Relaxed mode)."""
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s, other = hmr.Stream(flags=1), hmr.Stream(flags=1)
    fixed = hmr.FixedSizeResource(hmr.AsyncMemoryResource(), block_size=N,
                                  blocks_to_preallocate=1)
    theirs = fixed.allocate_async(N, 256, other)
    fixed.deallocate_async(theirs, N, 256, other)
    size_before = fixed.pool_size()
    begin(rt, s)
    spy.on = True
    a = fixed.allocate_async(N, 256, s)
    assert a != theirs and fixed.pool_size() > size_before
    memset(rt, a, 0x11, N, s)
    copy(rt, host, a, N, D2H, s)
    fixed.deallocate_async(a, N, 256, s)
    spy.on = False
    graph = end(rt, s)
    # the one wait is the upstream's own synchronous allocation (the null stream, which
    # a capture on a non-blocking stream allows), never the capturing stream
    made = [(name, args[0]) for name, args in zip(spy.calls, spy.args)]
    assert made == [("hipStreamSynchronize", 0)]
    launch_twice(rt, graph, s, host, b"\x11" * N)
    fixed.release()
    pinned.deallocate(host, N)


def test_virtual_pool_grows_in_a_capture_and_unmaps_nothing(rt, spy):
    """The pool that grows in place maps pages during a Global-mode capture (in Relaxed
    mode, as the synchronous pool does) and unmaps none while the stream captures, even at
    its maximum: there it raises OutOfMemoryError and the capture stays valid."""
    pinned = hmr.PinnedMemoryResource()
    host = pinned.allocate(N)
    s = hmr.Stream(flags=1)
    pool = hmr.VirtualPoolResource(maximum_pool_size=8 * MiB)
    spare = pool.allocate_async(2 * MiB, 256, s)      # a free mapped page to keep
    pool.deallocate_async(spare, 2 * MiB, 256, s)
    s.synchronize()
    mapped = pool.mapped_bytes
    begin(rt, s)
    spy.on = True
    a = pool.allocate_async(4 * MiB, 256, s)          # more than is mapped: grows
    assert pool.mapped_bytes > mapped
    with pytest.raises(hmr.OutOfMemoryError):
        pool.allocate_async(6 * MiB, 256, s)          # past the maximum: nothing unmapped
    memset(rt, a, 5, N, s)
    copy(rt, host, a, N, D2H, s)
    spy.on = False
    graph = end(rt, s)
    assert spy.calls == []
    launch_twice(rt, graph, s, host, b"\x05" * N)
    pool.deallocate_async(a, 4 * MiB, 256, s)
    s.synchronize()
    pool.release()
    assert pool.mapped_bytes == 0
    pinned.deallocate(host, N)

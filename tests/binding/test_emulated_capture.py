"""Stream capture on the emulated platform, call by call (docs/emulated.md, "Stream capture"):
work queued on a capturing stream becomes a graph instead of running, a launch replays it,
allocation nodes keep their address for the graph's life, and what capture forbids fails as
HIP and CUDA fail it.  Each test builds its own runtime."""
from __future__ import annotations

import ctypes
import threading
from ctypes import byref, c_int, c_ulonglong, c_void_p

import pytest

from hipmr_ctypes._hip import create_runtime

pytestmark = pytest.mark.emulated

NONE, ACTIVE, INVALIDATED = 0, 1, 2
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
UNSUPPORTED, INVALIDATED_ERR, MERGE, UNMATCHED, UNJOINED = 900, 901, 902, 903, 904
IMPLICIT, CAPTURED_EVENT, WRONG_THREAD, ILLEGAL_STATE = 906, 907, 908, 401
D2H, H2D = 2, 1


@pytest.fixture
def rt():
    return create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1",
                                           "HIPMR_EMULATED_MEMORY": "8MiB"})


def stream(rt, flags=0):
    s = c_void_p()
    assert rt.fn.hipStreamCreateWithPriority(s, flags, 0) == 0
    return s.value


def event(rt):
    e = c_void_p()
    assert rt.fn.hipEventCreateWithFlags(e, 2) == 0
    return e.value


def status(rt, s):
    st = c_int(-1)
    assert rt.fn.hipStreamIsCapturing(s, byref(st)) == 0
    return st.value


def end(rt, s):
    g = c_void_p()
    code = rt.fn.hipStreamEndCapture(s, byref(g))
    return code, g.value


def instantiate(rt, g):
    e = c_void_p()
    assert rt.fn.hipGraphInstantiate(byref(e), g, None, None, 0) == 0
    return e.value


def test_captured_work_runs_only_when_the_graph_is_launched(rt):
    fn, s = rt.fn, stream(rt)
    host = (ctypes.c_ubyte * 512)()
    assert status(rt, s) == NONE
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert status(rt, s) == ACTIVE
    ident = c_ulonglong()
    st = c_int()
    assert fn.hipStreamGetCaptureInfo(s, byref(st), byref(ident)) == 0
    assert st.value == ACTIVE and ident.value > 0
    p = c_void_p()
    assert fn.hipMallocAsync(byref(p), 512, s) == 0 and p.value
    assert fn.hipMemsetAsync(p, 0x5A, 512, s) == 0
    assert fn.hipMemcpyAsync(host, p, 512, D2H, s) == 0
    assert fn.hipFreeAsync(p, s) == 0
    assert bytes(host) == bytes(512)               # nothing ran
    code, g = end(rt, s)
    assert code == 0 and g
    assert status(rt, s) == NONE
    ex = instantiate(rt, g)
    for _ in range(2):                               # replayed at every launch
        ctypes.memset(host, 0, 512)
        assert fn.hipGraphLaunch(ex, s) == 0
        assert bytes(host) == b"\x5a" * 512
    assert fn.hipGraphExecDestroy(ex) == 0 and fn.hipGraphDestroy(g) == 0
    assert rt.emulator.live_allocations().count == 0
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert fn.hipMemGetInfo(byref(free), byref(total)) == 0 and free.value == total.value


def test_an_allocation_node_keeps_its_address_and_must_be_freed_before_the_next_launch(rt):
    fn, s = rt.fn, stream(rt)
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    p = c_void_p()
    assert fn.hipMallocAsync(byref(p), 256, s) == 0
    assert fn.hipMemsetAsync(p, 1, 256, s) == 0
    code, g = end(rt, s)
    assert code == 0
    host = (ctypes.c_ubyte * 256)()
    # not allocated before the graph runs
    assert fn.hipMemcpy(host, p, 256, D2H) == 1
    ex = instantiate(rt, g)
    assert fn.hipGraphLaunch(ex, s) == 0
    assert fn.hipMemcpy(host, p, 256, D2H) == 0 and host[255] == 1
    assert fn.hipGraphLaunch(ex, s) == 1             # its allocation is still live
    assert fn.hipFreeAsync(p, s) == 0                # freed outside the graph
    assert fn.hipGraphLaunch(ex, s) == 0             # the same address again
    assert fn.hipMemcpy(host, p, 256, D2H) == 0
    assert fn.hipFree(p) == 0
    assert fn.hipGraphExecDestroy(ex) == 0 and fn.hipGraphDestroy(g) == 0


def test_synchronizing_a_capturing_stream_invalidates_the_capture(rt):
    fn, s = rt.fn, stream(rt)
    assert fn.hipStreamBeginCapture(s, RELAXED) == 0
    assert fn.hipStreamSynchronize(s) == UNSUPPORTED
    assert status(rt, s) == INVALIDATED
    p = c_void_p()
    assert fn.hipMallocAsync(byref(p), 256, s) == INVALIDATED_ERR
    assert end(rt, s) == (INVALIDATED_ERR, None)
    assert status(rt, s) == NONE
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert fn.hipStreamQuery(s) == UNSUPPORTED
    assert end(rt, s)[0] == INVALIDATED_ERR


def test_the_legacy_stream_invalidates_a_blocking_streams_capture(rt):
    fn = rt.fn
    blocking, non_blocking = stream(rt), stream(rt, 1)
    assert fn.hipStreamBeginCapture(non_blocking, RELAXED) == 0
    assert status(rt, non_blocking) == ACTIVE        # a non-blocking stream is not joined
    assert end(rt, non_blocking)[0] == 0
    assert fn.hipStreamBeginCapture(blocking, RELAXED) == 0
    assert fn.hipStreamSynchronize(0) == IMPLICIT
    assert status(rt, blocking) == INVALIDATED
    assert end(rt, blocking)[0] == INVALIDATED_ERR


def test_capture_modes_decide_the_unsafe_calls(rt):
    fn, s = rt.fn, stream(rt)
    p = c_void_p()
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert fn.hipMalloc(byref(p), 256) == UNSUPPORTED
    mode = c_int(RELAXED)
    assert fn.hipThreadExchangeStreamCaptureMode(byref(mode)) == 0 and mode.value == GLOBAL
    assert fn.hipMalloc(byref(p), 256) == 0          # allowed in Relaxed mode
    assert fn.hipThreadExchangeStreamCaptureMode(byref(mode)) == 0 and mode.value == RELAXED
    assert status(rt, s) == ACTIVE                   # an unsafe call left it as it was
    codes = []

    def other_thread():                             # Global: another thread's global capture
        q = c_void_p()
        codes.append(fn.hipMalloc(byref(q), 256))
        m = c_int(THREAD_LOCAL)
        fn.hipThreadExchangeStreamCaptureMode(byref(m))
        codes.append(fn.hipMalloc(byref(q), 256))   # ThreadLocal: only its own captures
        codes.append(fn.hipFree(q))                   # waits for the device: refused anyway
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert codes == [UNSUPPORTED, 0, UNSUPPORTED]
    assert end(rt, s)[0] == 0
    assert fn.hipFree(p) == 0
    assert fn.hipThreadExchangeStreamCaptureMode(byref(c_int(7))) == 1


def test_an_event_recorded_in_a_capture_joins_a_waiting_stream(rt):
    fn = rt.fn
    origin, side = stream(rt), stream(rt)
    fork, join = event(rt), event(rt)
    host = (ctypes.c_ubyte * 256)()
    assert fn.hipStreamBeginCapture(origin, GLOBAL) == 0
    p = c_void_p()
    assert fn.hipMallocAsync(byref(p), 256, origin) == 0
    assert fn.hipEventRecord(fork, origin) == 0
    assert fn.hipEventSynchronize(fork) == CAPTURED_EVENT   # (invalidates): start again
    assert end(rt, origin)[0] == INVALIDATED_ERR
    assert fn.hipStreamBeginCapture(origin, GLOBAL) == 0
    assert fn.hipMallocAsync(byref(p), 256, origin) == 0
    assert fn.hipEventRecord(fork, origin) == 0
    assert fn.hipStreamWaitEvent(side, fork, 0) == 0
    assert status(rt, side) == ACTIVE                 # joined the capture
    assert fn.hipMemsetAsync(p, 9, 256, side) == 0
    assert end(rt, origin)[0] == UNJOINED             # its work was never joined back
    assert status(rt, side) == NONE
    assert fn.hipStreamBeginCapture(origin, GLOBAL) == 0
    assert fn.hipMallocAsync(byref(p), 256, origin) == 0
    assert fn.hipEventRecord(fork, origin) == 0
    assert fn.hipStreamWaitEvent(side, fork, 0) == 0
    assert fn.hipMemsetAsync(p, 9, 256, side) == 0
    assert fn.hipEventRecord(join, side) == 0
    assert fn.hipStreamEndCapture(side, byref(c_void_p())) == UNMATCHED
    assert fn.hipStreamWaitEvent(origin, join, 0) == 0
    assert fn.hipMemcpyAsync(host, p, 256, D2H, origin) == 0
    assert fn.hipFreeAsync(p, origin) == 0
    code, g = end(rt, origin)
    assert code == 0
    ex = instantiate(rt, g)
    assert fn.hipGraphLaunch(ex, origin) == 0 and bytes(host) == b"\x09" * 256
    assert fn.hipEventSynchronize(fork) == 0          # a plain event again


def test_waiting_for_an_event_recorded_outside_the_capture_is_allowed(rt):
    fn, s, other = rt.fn, stream(rt), stream(rt)
    ev = event(rt)
    assert fn.hipEventRecord(ev, other) == 0
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert fn.hipStreamWaitEvent(s, ev, 0) == 0
    assert status(rt, other) == NONE and status(rt, s) == ACTIVE
    assert end(rt, s)[0] == 0


def test_begin_and_end_refuse_what_hip_refuses(rt):
    fn, s = rt.fn, stream(rt)
    assert fn.hipStreamBeginCapture(0, GLOBAL) == UNSUPPORTED
    assert fn.hipStreamBeginCapture(s, 3) == 1
    assert end(rt, s)[0] == ILLEGAL_STATE
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert fn.hipStreamBeginCapture(s, GLOBAL) == ILLEGAL_STATE
    codes = []
    t = threading.Thread(target=lambda: codes.append(end(rt, s)[0]))
    t.start()
    t.join()
    assert codes == [WRONG_THREAD]
    assert end(rt, s)[0] == 0
    assert fn.hipGraphLaunch(0x1234, s) == 1
    assert fn.hipGraphDestroy(0x1234) == 1


def test_merging_two_captures_is_refused(rt):
    fn = rt.fn
    a, b = stream(rt), stream(rt)
    ev = event(rt)
    assert fn.hipStreamBeginCapture(a, RELAXED) == 0
    assert fn.hipStreamBeginCapture(b, RELAXED) == 0
    assert fn.hipEventRecord(ev, a) == 0
    assert fn.hipStreamWaitEvent(b, ev, 0) == MERGE
    assert end(rt, b)[0] == INVALIDATED_ERR
    assert end(rt, a)[0] == 0


def test_a_free_node_frees_graph_memory_only(rt):
    fn, s = rt.fn, stream(rt)
    outside = c_void_p()
    assert fn.hipMallocAsync(byref(outside), 256, s) == 0
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert fn.hipFreeAsync(outside, s) == 1          # not graph memory: invalid value
    assert status(rt, s) == ACTIVE
    inside = c_void_p()
    assert fn.hipMallocAsync(byref(inside), 256, s) == 0
    code, g = end(rt, s)
    assert code == 0
    ex = instantiate(rt, g)
    assert fn.hipGraphLaunch(ex, s) == 0
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0   # another graph frees the first's memory
    assert fn.hipFreeAsync(inside, s) == 0
    code, g2 = end(rt, s)
    ex2 = instantiate(rt, g2)
    assert fn.hipGraphLaunch(ex2, s) == 0
    assert fn.hipGraphLaunch(ex, s) == 0              # freed: the first can run again
    assert fn.hipFreeAsync(inside, s) == 0 and fn.hipFreeAsync(outside, s) == 0
    for handle in (ex, ex2):
        assert fn.hipGraphExecDestroy(handle) == 0
    assert fn.hipGraphDestroy(g) == 0 and fn.hipGraphDestroy(g2) == 0
    assert rt.emulator.live_allocations().count == 0


@pytest.mark.parametrize("version, query", [("6.2.0", 0), ("7.0.0", UNSUPPORTED)])
def test_other_streams_and_events_may_be_waited_for_during_a_capture(version, query):
    """Only the capture's own streams and events (and the legacy stream) are refused: a
    synchronization of another stream, or of an event recorded outside the capture, is not;
    hipEventQuery is a potentially unsafe call from HIP 7.0 on."""
    rt = create_runtime("emulated", env={"HIPMR_EMULATED_VERSION": version})
    fn, s, other = rt.fn, stream(rt), stream(rt, 1)
    ev = event(rt)
    assert fn.hipEventRecord(ev, other) == 0
    assert fn.hipStreamBeginCapture(s, GLOBAL) == 0
    assert fn.hipStreamSynchronize(other) == 0
    assert fn.hipStreamQuery(other) == 0
    assert fn.hipEventSynchronize(ev) == 0
    assert fn.hipEventQuery(ev) == query
    assert status(rt, s) == ACTIVE
    assert end(rt, s)[0] == 0

"""Interprocess events: Event(interprocess=True), export_ipc / IpcEventHandle, Event.from_ipc
(hipIpcGetEventHandle / hipIpcOpenEventHandle).

The cross-process tests start a real second process (``spawn``): on the emulated platform the
event's signal lives in shared memory, so a consumer there waits on the producer's work as on a
GPU; marked ``gpu``, the same protocol on the real platform.
"""
import ctypes
import multiprocessing
import os
import pickle
import time

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.types import hipIpcEventHandle_t

TIMEOUT = 120
REAL = pytest.param("real", marks=[pytest.mark.gpu])


# ---- the event and its handle, in one process ------------------------------------------------

def test_interprocess_sets_the_flag_and_disables_timing():
    with hmr.Event(interprocess=True) as e:
        assert e.interprocess and e.flags == 6
    with hmr.Event(flags=1, interprocess=True) as e:
        assert e.flags == 7
    with hmr.Event(flags=6) as e:
        assert e.interprocess
    with hmr.Event() as e:
        assert not e.interprocess


@pytest.mark.parametrize("kwargs, error", [
    ({"flags": 4}, ValueError),                 # interprocess needs timing disabled
    ({"flags": 5}, ValueError),
    ({"interprocess": 1}, TypeError),
    ({"interprocess": None}, TypeError),
])
def test_bad_event_arguments_are_refused_before_the_runtime(emulator, kwargs, error):
    emulator.inject_failure(999, calls="hipEventCreateWithFlags")
    with pytest.raises(error):
        hmr.Event(**kwargs)
    assert emulator.pending_faults() == 1


def test_only_an_interprocess_event_exports(emulator):
    emulator.inject_failure(999, calls="hipIpcGetEventHandle")
    with hmr.Event(flags=2) as e:
        with pytest.raises(ValueError, match="interprocess"):
            e.export_ipc()
    e = hmr.Event(interprocess=True)
    e.close()
    with pytest.raises(ValueError, match="closed"):
        e.export_ipc()
    assert emulator.pending_faults() == 1


def test_the_handle_is_immutable_picklable_and_compares_by_value():
    with hmr.Event(interprocess=True) as e:
        h = e.export_ipc()
        assert isinstance(h, hmr.IpcEventHandle)
        assert len(h.data) == 64 and h.device == 0 and h.pid == os.getpid()
        assert e.export_ipc() == h and hash(e.export_ipc()) == hash(h)
        back = pickle.loads(pickle.dumps(h))
        assert back == h and back is not h
        with pytest.raises(AttributeError):
            h.device = 1
        assert "IpcEventHandle" in repr(h)


@pytest.mark.parametrize("args", [(b"x" * 63, 0, 1), ("x" * 64, 0, 1), (b"x" * 64, -1, 1),
                                  (b"x" * 64, 0, 1.0), (b"x" * 64, True, 1)])
def test_a_malformed_handle_is_refused(args):
    with pytest.raises(ValueError):
        hmr.IpcEventHandle(*args)


def test_from_ipc_refuses_before_the_runtime(emulator):
    emulator.inject_failure(999, calls="hipIpcOpenEventHandle")
    with pytest.raises(TypeError):
        hmr.Event.from_ipc(b"x" * 64)
    with hmr.Event(interprocess=True) as e:
        with pytest.raises(ValueError, match="this process"):
            hmr.Event.from_ipc(e.export_ipc())
    with pytest.raises(ValueError):   # a device this machine does not have
        hmr.Event.from_ipc(hmr.IpcEventHandle(b"x" * 64, 7, os.getpid() + 1))
    assert emulator.pending_faults() == 1


def test_a_forged_handle_is_an_error_not_a_crash():
    forged = hmr.IpcEventHandle(b"HMREVT01/dev/shm/../etc/passwd".ljust(64, b"\0"), 0,
                                os.getpid() + 1)
    with pytest.raises(hmr.HipError):
        hmr.Event.from_ipc(forged)
    with pytest.raises(hmr.HipError):
        hmr.Event.from_ipc(hmr.IpcEventHandle(bytes(64), 0, os.getpid() + 1))


def test_emulated_rules_of_the_runtime(emulator):
    """clr's answers: a plain event has no handle (invalid configuration), a handle opened in
    the process that made it is an invalid context; the signal's name goes with the event."""
    rt = _hip.get_runtime()
    plain, shared = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.fn.hipEventCreateWithFlags(plain, 2) == 0
    assert rt.fn.hipEventCreateWithFlags(shared, 6) == 0
    raw = hipIpcEventHandle_t()
    assert rt.fn.hipIpcGetEventHandle(raw, plain.value) == 9
    assert rt.fn.hipIpcGetEventHandle(raw, shared.value) == 0
    path = bytes(raw)[8:].rstrip(b"\0").decode()
    assert os.path.exists(path)
    opened = ctypes.c_void_p()
    assert rt.fn.hipIpcOpenEventHandle(opened, raw) == 201
    assert rt.fn.hipEventDestroy(shared.value) == 0
    assert not os.path.exists(path)
    assert rt.fn.hipEventDestroy(plain.value) == 0
    rt.clear_last_error()


# ---- across processes ----------------------------------------------------------------------

@pytest.fixture(params=["emulated", REAL])
def platform(request):
    rt = _hip.get_runtime()
    if request.param == "emulated":
        if rt.platform != "emulated":
            pytest.skip("the emulated variant runs where the process-wide platform is emulated")
        return "emulated"
    if rt.platform == "emulated" or hmr.device_count() < 1:
        if os.environ.get("HIPMR_REQUIRE_GPU") == "1":
            pytest.fail("a GPU is required (HIPMR_REQUIRE_GPU=1) but missing")
        pytest.skip("needs a real GPU")
    return "real"


def child_consumer(handle, go, out):
    """Open the producer's event, report whether it is complete, wait for the word, then
    wait on the event (a stream of this process, then the host) and report again."""
    import hipmr_ctypes as hmr
    try:
        event = hmr.Event.from_ipc(handle)
        out.put(("opened", event.query(), event.flags))
        go.get(timeout=TIMEOUT)
        with hmr.Stream() as stream:
            stream.wait_event(event)          # queued: no host synchronization
            event.synchronize()
            stream.synchronize()
        out.put(("done", event.query()))
        event.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(("error", repr(exc)))


def child_open_only(handle, out):
    import hipmr_ctypes as hmr
    try:
        hmr.Event.from_ipc(handle)
        out.put("opened")
    except hmr.HipError as exc:
        out.put(exc.name)


def _busy(stream):
    """Keep the work on ``stream`` pending until it is synchronized (emulated: a test hook;
    a GPU: none, the copies are short, so only the done state is checked there)."""
    rt = _hip.get_runtime()
    if rt.platform == "emulated":
        rt.emulator.set_stream_busy(stream.handle, 1 << 40)
        return True
    return False


def test_a_consumer_process_waits_on_the_producers_work(platform):
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Queue(), ctx.Queue()
    stream = hmr.Stream()
    event = hmr.Event(interprocess=True)
    buf = hmr.Buffer(1 << 20, stream=stream)
    pending = _busy(stream)
    buf.fill(3, stream=stream)
    event.record(stream)
    handle = event.export_ipc()
    proc = ctx.Process(target=child_consumer, args=(handle, go, out))
    proc.start()
    try:
        opened = out.get(timeout=TIMEOUT)
        assert opened[0] == "opened", opened
        assert opened[2] == 6
        if pending:
            assert opened[1] is False          # the producer's work is not done
        go.put("go")
        if pending:
            time.sleep(0.2)
            assert out.empty()                 # still waiting on the producer
            stream.synchronize()               # the producer's work completes
        done = out.get(timeout=TIMEOUT)
        assert done == ("done", True), done
    finally:
        proc.join(TIMEOUT)
    assert proc.exitcode == 0
    event.close()
    del buf
    stream.close()


def test_a_handle_of_a_destroyed_event_cannot_be_opened():
    if _hip.get_runtime().platform != "emulated":
        pytest.skip("what the emulated runtime answers (a real one may keep the event)")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    event = hmr.Event(interprocess=True)
    handle = event.export_ipc()
    event.close()
    proc = ctx.Process(target=child_open_only, args=(handle, out))
    proc.start()
    assert out.get(timeout=TIMEOUT) == "hipErrorInvalidValue"
    proc.join(TIMEOUT)
    assert proc.exitcode == 0

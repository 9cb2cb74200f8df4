"""stream_ref: ports of upstream stream_ref.{constructor,equality,get,ready,wait}.pass.cpp and
HEAD's sync / is_done (reference §5 items 27-30), with a fake runtime, plus GPU tests."""
import copy
import ctypes
import os
import pickle
import subprocess
import sys
import time

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer
from hipmr_ctypes._hip.exceptions import HipError, InvalidHandleError, NotSupportedError
from hipmr_ctypes._hip.failure import make_error
from hipmr_ctypes.stream_refs import stream_per_thread, stream_ref
from support import REPO

_hip = sys.modules["hipmr_ctypes._hip"]


class FakeFn:
    """The stream functions of a runtime, over a fake stream that has ``pending`` work."""

    def __init__(self):
        self.calls = []
        self.pending = {}          # handle -> queued work items
        self.status = {}           # function name -> forced status
        self.priority = -2
        self.device = 3

    def hipStreamSynchronize(self, handle):
        self.calls.append(("hipStreamSynchronize", handle))
        if "hipStreamSynchronize" in self.status:
            return self.status["hipStreamSynchronize"]
        self.pending[handle] = 0   # blocks until the work is done
        return 0

    def hipStreamQuery(self, handle):
        self.calls.append(("hipStreamQuery", handle))
        if "hipStreamQuery" in self.status:
            return self.status["hipStreamQuery"]
        return 600 if self.pending.get(handle) else 0

    def hipStreamGetPriority(self, handle, out):
        self.calls.append(("hipStreamGetPriority", handle))
        out.value = self.priority
        return self.status.get("hipStreamGetPriority", 0)

    def hipStreamGetDevice(self, handle, out):
        self.calls.append(("hipStreamGetDevice", handle))
        out.value = self.device
        return self.status.get("hipStreamGetDevice", 0)


class FakeRuntime:
    platform = "fake"

    def __init__(self):
        self.fn = FakeFn()

    def error(self, status, call=None):
        return make_error(status, call)

    def is_not_ready(self, status):
        return status == 600


@pytest.fixture
def fake(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(_hip, "get_runtime", lambda: rt, raising=False)
    return rt


# 27. construction
def test_default_is_the_null_stream():
    assert stream_ref().get() == 0
    assert stream_ref().handle == 0
    assert stream_ref() == stream_ref(0)
    assert stream_ref.value_type is int


def test_from_handle():
    assert stream_ref(0x1234).get() == 0x1234
    assert stream_ref(handle=0x1234) == stream_ref(0x1234)
    assert stream_ref((1 << 64) - 1).get() == (1 << 64) - 1


def test_from_c_void_p():
    assert stream_ref(ctypes.c_void_p(0x42)).get() == 0x42
    assert stream_ref(ctypes.c_void_p()).get() == 0


def test_from_another_stream_ref():
    s = stream_ref(7)
    assert stream_ref(s) == s and stream_ref(s).get() == 7


def test_from_owning_stream_like_objects():
    class with_ref:
        ref = stream_ref(11)

    class with_handle:
        handle = 12

    class with_void_p_handle:
        handle = ctypes.c_void_p(13)
    assert stream_ref(with_ref()).get() == 11
    assert stream_ref(with_handle()).get() == 12
    assert stream_ref(with_void_p_handle()).get() == 13


def test_from_stream_protocols():
    class hip_stream:
        def __hip_stream__(self):
            return (0, 21)

    class cuda_stream:                     # cuda.core / CuPy
        def __cuda_stream__(self):
            return (0, 22)
    assert stream_ref(hip_stream()).get() == 21
    assert stream_ref(cuda_stream()).get() == 22
    assert stream_ref(stream_ref(23)).__cuda_stream__() == (0, 23)


def test_bad_protocol_results_raise():
    class bad_tuple:
        def __cuda_stream__(self):
            return 22

    class bad_handle:
        def __hip_stream__(self):
            return (0, "22")
    with pytest.raises(TypeError):
        stream_ref(bad_tuple())
    with pytest.raises(TypeError):
        stream_ref(bad_handle())


def test_none_is_rejected():
    with pytest.raises(TypeError, match="stream_ref()"):
        stream_ref(None)


@pytest.mark.parametrize("bad", [True, False, 1.0, "0", b"0", [0], object()])
def test_bad_types_rejected(bad):
    with pytest.raises(TypeError):
        stream_ref(bad)


@pytest.mark.parametrize("bad", [-1, 1 << 64])
def test_out_of_range_handles_rejected(bad):
    with pytest.raises(ValueError):
        stream_ref(bad)
    with pytest.raises(ValueError):
        stream_ref(type("owning", (), {"handle": bad})())


def test_stream_per_thread():
    assert stream_per_thread.get() == 2
    assert isinstance(stream_per_thread, stream_ref)


# 28. equality, hashing, immutability
def test_equality_compares_handles():
    assert stream_ref(42) == stream_ref(42)
    assert stream_ref(42) != stream_ref(1337)
    assert not (stream_ref(42) == stream_ref(1337))
    assert not (stream_ref(42) != stream_ref(42))


def test_equality_with_raw_handles():
    assert stream_ref(42) == 42 and 42 == stream_ref(42)
    assert stream_ref(42) != 43
    assert stream_ref(1) != True  # noqa: E712  (bools are not handles)
    assert stream_ref(42) != "42"


def test_hash_agrees_with_equality():
    assert hash(stream_ref(42)) == hash(stream_ref(42)) == hash(42)
    assert len({stream_ref(42), stream_ref(42), 42, stream_ref(7)}) == 2


def test_immutable_with_slots():
    s = stream_ref(5)
    with pytest.raises(AttributeError):
        s._handle = 6
    with pytest.raises(AttributeError):
        s.anything = 6
    with pytest.raises(AttributeError):
        del s._handle
    assert not hasattr(s, "__dict__")
    assert s.get() == 5
    with pytest.raises(AttributeError):               # the fast paths' alias is read-only too
        s._hipmr_handle = 6
    assert s._hipmr_handle == 5


def test_protocols_repr_copy_pickle():
    s = stream_ref(0xABC)
    assert s.__hip_stream__() == (0, 0xABC)
    assert s.__cuda_stream__() == (0, 0xABC)
    assert repr(s) == "stream_ref(0xabc)" and repr(stream_ref()) == "stream_ref(0)"
    assert eval(repr(s), {"stream_ref": stream_ref}) == s
    assert copy.copy(s) is s and copy.deepcopy(s) is s
    assert pickle.loads(pickle.dumps(s)) == s


def test_passes_to_ctypes_as_a_stream_handle():
    fn = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)(lambda p: p or 0)
    assert fn(stream_ref(0x77)) == 0x77


# 29 / 30. ready / wait through the runtime (fake)
def test_ready_on_idle_stream(fake):
    assert stream_ref(5).ready() is True
    assert stream_ref(5).is_done() is True
    assert fake.fn.calls == [("hipStreamQuery", 5)] * 2


def test_ready_false_while_work_is_pending(fake):
    fake.fn.pending[5] = 3
    assert stream_ref(5).ready() is False
    assert stream_ref(6).ready() is True


def test_wait_synchronizes_instead_of_querying(fake):
    """libhipcxx 2.2's wait() queried the stream and threw when it was busy."""
    fake.fn.pending[5] = 3
    stream_ref(5).wait()
    assert fake.fn.calls == [("hipStreamSynchronize", 5)]
    assert stream_ref(5).ready() is True
    stream_ref(5).sync()
    assert fake.fn.calls[-1] == ("hipStreamSynchronize", 5)


def test_wait_on_idle_and_default_streams(fake):
    stream_ref().wait()
    stream_per_thread.wait()
    assert fake.fn.calls == [("hipStreamSynchronize", 0), ("hipStreamSynchronize", 2)]


def test_wait_error_raises_hip_error(fake):
    fake.fn.status["hipStreamSynchronize"] = 400
    with pytest.raises(InvalidHandleError) as info:
        stream_ref(9).wait()
    assert info.value.code == 400 and info.value.call == "hipStreamSynchronize"


def test_ready_other_errors_raise(fake):
    fake.fn.status["hipStreamQuery"] = 1
    with pytest.raises(HipError) as info:
        stream_ref(9).ready()
    assert info.value.code == 1 and info.value.call == "hipStreamQuery"


def test_priority(fake):
    assert stream_ref(9).priority() == -2
    fake.fn.status["hipStreamGetPriority"] = 400
    with pytest.raises(HipError):
        stream_ref(9).priority()


def test_device(fake):
    assert stream_ref(9).device() == 3
    fake.fn.status["hipStreamGetDevice"] = 801
    with pytest.raises(NotSupportedError):
        stream_ref(9).device()


def test_device_not_supported_by_runtime(fake):
    class fn_without_device:
        pass
    fake.fn = fn_without_device()
    with pytest.raises(NotSupportedError):
        stream_ref(9).device()


def test_runtime_is_looked_up_at_call_time(monkeypatch):
    calls = []
    first, second = FakeRuntime(), FakeRuntime()
    monkeypatch.setattr(_hip, "get_runtime", lambda: calls.append(1) or first, raising=False)
    stream_ref(1).wait()
    monkeypatch.setattr(_hip, "get_runtime", lambda: second, raising=False)
    stream_ref(1).wait()
    assert first.fn.calls == second.fn.calls == [("hipStreamSynchronize", 1)]
    assert calls == [1]


def test_missing_library_surfaces_only_on_call(monkeypatch):
    from hipmr_ctypes._hip.exceptions import LibraryNotFoundError

    def no_library():
        raise LibraryNotFoundError("no HIP library (tried: nothing)")
    monkeypatch.setattr(_hip, "get_runtime", no_library, raising=False)
    s = stream_ref(3)   # building and comparing need no library
    assert s == 3
    with pytest.raises(LibraryNotFoundError):
        s.wait()
    with pytest.raises(LibraryNotFoundError):
        s.ready()


def test_model_layer_imports_no_library_and_works_without_one():
    """Import the four modules bypassing the package __init__: no ctypes, no binding."""
    code = f"""
import sys, types
pkg = types.ModuleType("hipmr_ctypes")
pkg.__path__ = [{str(REPO / "hipmr_ctypes")!r}]
sys.modules["hipmr_ctypes"] = pkg
from hipmr_ctypes.properties import device_accessible, get_property
from hipmr_ctypes.concepts import is_resource
from hipmr_ctypes.resource_refs import resource_ref
from hipmr_ctypes.stream_refs import stream_ref
bad = sorted(m for m in sys.modules if m == "ctypes" or m.startswith("_ctypes")
             or m.startswith("hipmr_ctypes._hip"))
assert not bad, bad
class R:
    properties = (device_accessible,)
    def allocate(self, bytes, alignment=256): return 1
    def deallocate(self, ptr, bytes, alignment=256): pass
ref = resource_ref[device_accessible](R())
assert is_resource(ref) and ref.allocate(1) == 1 and stream_ref(4) == 4
bad = sorted(m for m in sys.modules if m == "ctypes" or m.startswith("hipmr_ctypes._hip"))
assert not bad, bad
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# integration with the package's owning Stream on the process-wide (emulated) runtime
def test_with_owning_stream_on_emulated_runtime(emulator):
    from hipmr_ctypes.stream import Stream
    with Stream() as s:
        ref = stream_ref(s)
        assert ref == s.ref and ref.get() != 0
        ref.wait()
        assert ref.ready() is True
        assert isinstance(ref.priority(), int)
        assert s._hipmr_handle == ref._hipmr_handle == s.handle  # what the fast paths read
    assert s._hipmr_handle is None                    # closed: their checked path says so


# GPU: wait() really blocks, ready() really reports pending work
GIB = 1 << 30


@pytest.mark.gpu
def test_gpu_wait_blocks_until_queued_copies_finish(gpu_runtime):
    rt = gpu_runtime
    src, dst, handle = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    rt.check(rt.fn.hipMalloc(src, GIB), "hipMalloc")
    try:
        rt.check(rt.fn.hipMalloc(dst, GIB), "hipMalloc")
        try:
            rt.check(rt.fn.hipStreamCreateWithPriority(handle, 1, 0),
                     "hipStreamCreateWithPriority")
            try:
                ref = stream_ref(handle)
                assert ref.get() == handle.value != 0
                assert ref.ready() is True                      # item 29: idle stream
                ref.wait()                                      # item 30: idle, no throw
                for _ in range(20):                             # ~20 ms of copies
                    rt.check(rt.fn.hipMemcpyAsync(dst.value, src.value, GIB, 3,
                                                  handle.value), "hipMemcpyAsync")
                assert ref.ready() is False
                assert ref.is_done() is False
                start = time.perf_counter()
                ref.wait()
                waited = time.perf_counter() - start
                assert ref.ready() is True
                assert waited > 0.001
                ref.sync()
            finally:
                rt.check(rt.fn.hipStreamDestroy(handle.value), "hipStreamDestroy")
        finally:
            rt.check(rt.fn.hipFree(dst.value), "hipFree")
    finally:
        rt.check(rt.fn.hipFree(src.value), "hipFree")


@pytest.mark.gpu
def test_gpu_priority_device_and_default_streams(gpu_runtime):
    rt = gpu_runtime
    least, greatest = ctypes.c_int(), ctypes.c_int()
    rt.check(rt.fn.hipDeviceGetStreamPriorityRange(least, greatest),
             "hipDeviceGetStreamPriorityRange")
    handle = ctypes.c_void_p()
    rt.check(rt.fn.hipStreamCreateWithPriority(handle, 0, greatest.value),
             "hipStreamCreateWithPriority")
    try:
        ref = stream_ref(handle)
        assert ref.priority() == greatest.value
        current = ctypes.c_int()
        rt.check(rt.fn.hipGetDevice(current), "hipGetDevice")
        try:
            assert ref.device() == current.value
        except NotSupportedError:
            pass
    finally:
        rt.check(rt.fn.hipStreamDestroy(handle.value), "hipStreamDestroy")
    for s in (stream_ref(), stream_per_thread):
        s.wait()
        assert s.ready() is True


def test_the_per_thread_handle_is_named_once():
    import importlib
    module = importlib.import_module("hipmr_ctypes.stream_refs")
    from hipmr_ctypes import _stream_order, _thread_exit
    from hipmr_ctypes._buffer import staging as _staging
    from hipmr_ctypes.resources import async_memory
    assert module.PER_THREAD_HANDLE == 2 == stream_per_thread.handle
    for user in (_stream_order, _staging, _thread_exit, async_memory):
        assert user.PER_THREAD_HANDLE is module.PER_THREAD_HANDLE, user.__name__
        assert not hasattr(user, "_PER_THREAD") and not hasattr(user, "PER_THREAD")


# ---- only version 0 of the stream protocol --------------------------------------------------
class _Proto:
    def __init__(self, version, handle, name="__cuda_stream__"):
        setattr(self, name, lambda: (version, handle))


@pytest.mark.parametrize("name", ["__cuda_stream__", "__hip_stream__"])
def test_stream_protocol_version_other_than_zero_is_refused(name):
    assert stream_ref(_Proto(0, 0x40, name)).get() == 0x40
    for version in (1, 2, -1):
        with pytest.raises(NotImplementedError, match=f"version {version}"):
            stream_ref(_Proto(version, 0x40, name))
    with pytest.raises(NotImplementedError, match="version '0'"):
        stream_ref(_Proto("0", 0x40, name))
    with pytest.raises(NotImplementedError):
        Buffer(8, stream=_Proto(1, 0, name))


# ---- stream_ref equals (and hashes as) any object naming the same stream ---------------------
@pytest.mark.gpu
def test_stream_ref_equals_the_stream():
    with hmr.Stream() as s:
        ref = stream_ref(s)
        assert ref == s and s == ref and not (ref != s) and not (s != ref)
        assert hash(ref) == hash(s) and {ref: 1}[s] == 1 and s in {ref}
        assert Buffer(8, stream=s).stream == s
        assert stream_ref(0) != s and s != stream_ref(0)
        with hmr.Stream() as t:
            assert s != t and stream_ref(t) != s
    assert ref != s    # a closed Stream names no stream any more


def test_stream_ref_equals_other_libraries_streams():
    class Foreign:
        def __cuda_stream__(self):
            return (0, 0x1234)

    class Handle:
        handle = 0x1234

    assert stream_ref(0x1234) == Foreign() and Foreign() == stream_ref(0x1234)
    assert stream_ref(0x1234) == Handle()
    assert stream_ref(0x1235) != Foreign()
    assert stream_ref(0x1234) != _Proto(1, 0x1234)   # a version we cannot read is not equal
    assert stream_ref(0) != None and stream_ref(0) != "0" and stream_ref(1) != True  # noqa: E711,E712

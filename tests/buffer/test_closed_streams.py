"""A Buffer whose :class:`Stream` was closed never hands the stream's destroyed handle to the
runtime (HIP 7 and CUDA crash on one): every method that would use it, and ``buf.stream``
(the ``stream_ref`` through which other code, such as ``interop.mpi``, reaches the handle),
raises ValueError before any native call; ``close()`` frees on the null stream after
synchronizing the device, and ``repr`` still works."""
import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip

pytestmark = pytest.mark.reliability("copy_ownership_cases")

STREAM_CALLS = ("hipMemcpyAsync", "hipMemsetAsync", "hipMemsetD8Async", "hipMemsetD16Async",
                "hipMemsetD32Async", "hipStreamSynchronize", "hipEventRecord",
                "hipStreamWaitEvent", "hipMemPrefetchAsync", "hipMemcpyPeerAsync",
                "hipMallocAsync", "hipFreeAsync")


@pytest.fixture
def dead(monkeypatch):
    """A Buffer on a Stream closed since, and a record of every native call that was given
    the stream's old handle."""
    s = hmr.Stream()
    buf = hmr.Buffer(64, resource=hmr.AsyncMemoryResource(), stream=s)
    handle = s.handle
    s.close()
    rt = _hip.get_runtime()
    used = []
    for name in STREAM_CALLS:
        real = getattr(rt.fn, name, None)
        if real is None:
            continue

        def call(*args, _real=real, _name=name):
            if any(type(a) is int and a == handle for a in args[1:]) or (
                    args and type(args[-1]) is int and args[-1] == handle):
                used.append(_name)
            return _real(*args)

        monkeypatch.setattr(rt.fn, name, call)
    yield buf, used
    monkeypatch.undo()
    buf.close(stream=0)
    assert buf.closed


OTHER = lambda: hmr.Buffer(64, resource=hmr.AsyncMemoryResource())   # noqa: E731

CALLS = {
    "stream": lambda b: b.stream,
    "stream.wait": lambda b: b.stream.wait(),
    "fill": lambda b: b.fill(1),
    "fill(width=4)": lambda b: b.fill(7, width=4),
    "memset": lambda b: b.memset(1),
    "copy_from_host": lambda b: b.copy_from_host(b"x" * 64),
    "copy_to_host": lambda b: b.copy_to_host(),
    "tobytes": lambda b: b.tobytes(),
    "copy_from_device": lambda b: b.copy_from_device(OTHER()),
    "copy_from_device(source)": lambda b: OTHER().copy_from_device(b),
    "copy": lambda b: b.copy(),
    "__cuda_array_interface__": lambda b: b.__cuda_array_interface__,
    "__dlpack__": lambda b: b.__dlpack__(),
    "prefetch": lambda b: b.prefetch(),
    "resize": lambda b: b.resize(128),
    "reserve": lambda b: b.reserve(128),
    "release": lambda b: b.release(),
    "export_ipc": lambda b: b.export_ipc(),
}


@pytest.mark.parametrize("what", list(CALLS))
def test_every_path_to_the_handle_refuses_a_closed_stream(dead, what):
    buf, used = dead
    with pytest.raises(ValueError, match="closed"):
        CALLS[what](buf)
    assert used == [] and not buf.closed


def test_close_frees_on_the_null_stream_after_the_device_is_synchronized(dead):
    buf, used = dead
    buf.close()
    assert buf.closed and used == []


def test_repr_and_the_other_attributes_stay_readable(dead):
    buf, used = dead
    assert "closed" in repr(buf) and buf.size == 64 and buf.device == 0
    assert used == []


def test_a_stream_ref_of_a_closed_stream_is_refused_too():
    s = hmr.Stream()
    s.close()
    for make in (hmr.stream_ref, lambda x: hmr.Buffer(8, stream=x),
                 lambda x: hmr.Buffer(8).copy_from_host(b"x" * 8, stream=x)):
        with pytest.raises(ValueError, match="closed"):
            make(s)


@pytest.mark.gpu
def test_on_a_gpu_no_path_hands_the_destroyed_handle_to_the_runtime(gpu_runtime, dead):
    """The same on a real runtime, where the destroyed handle would crash the process."""
    buf, used = dead
    for what, call in CALLS.items():
        with pytest.raises(ValueError, match="closed"):
            call(buf)
        assert used == [], what
    buf.close()
    assert buf.closed and used == []

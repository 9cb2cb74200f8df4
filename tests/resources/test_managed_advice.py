"""Managed-memory control: Buffer.advise (hipMemAdvise), Buffer.prefetch to the host, and
Buffer.discard (hipMemDiscardBatchAsync)."""
import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip

from support import process_runtime


@pytest.fixture
def rt():
    return _hip.get_runtime()


def _spy(monkeypatch, rt, name):
    calls = []
    real = getattr(rt.fn, name)
    monkeypatch.setattr(rt.fn, name, lambda *a: calls.append(a) or real(*a))
    return calls


@pytest.fixture
def managed():
    buf = hmr.Buffer(8192, resource=hmr.ManagedMemoryResource())
    yield buf
    buf.close()


# ---- advise -------------------------------------------------------------------------------------

@pytest.mark.parametrize("advice, device, unset, code, target", [
    ("read_mostly", None, False, 1, 0),
    ("read_mostly", None, True, 2, 0),
    ("preferred_location", None, False, 3, 0),
    ("preferred_location", "host", False, 3, -1),
    ("preferred_location", 0, True, 4, 0),
    ("accessed_by", 0, False, 5, 0),
    ("accessed_by", "host", True, 6, -1),
    ("coarse_grain", None, False, 100, 0),
    ("coarse_grain", 0, True, 101, 0),
])
def test_advice_codes(monkeypatch, rt, managed, advice, device, unset, code, target):
    calls = _spy(monkeypatch, rt, "hipMemAdvise")
    managed.advise(advice, device, unset=unset)
    assert calls == [(managed.ptr, 8192, code, target)]


def test_a_device_object_names_the_device(monkeypatch, rt, managed):
    calls = _spy(monkeypatch, rt, "hipMemAdvise")
    managed.advise("accessed_by", hmr.Device(0))
    assert calls[0][3] == 0


@pytest.mark.parametrize("args, kwargs, error", [
    ((1,), {}, TypeError),
    (("fast",), {}, ValueError),
    (("preferred_location", "gpu"), {}, TypeError),
    (("read_mostly", "host"), {}, TypeError),           # read-mostly names no place
    (("preferred_location", 5), {}, ValueError),
    (("preferred_location", 1.0), {}, TypeError),
    (("coarse_grain", "host"), {}, ValueError),
    (("read_mostly",), {"unset": 1}, TypeError),
])
def test_bad_advice_is_refused_before_the_runtime(emulator, managed, args, kwargs, error):
    emulator.inject_failure(999, calls="hipMemAdvise")
    with pytest.raises(error):
        managed.advise(*args, **kwargs)
    assert emulator.pending_faults() == 1


@pytest.mark.parametrize("make", [
    lambda: hmr.Buffer(4096),
    lambda: hmr.Buffer(4096, resource=hmr.PinnedMemoryResource()),
    lambda: hmr.Buffer(4096, resource=hmr.HostMemoryResource()),
])
def test_advise_and_discard_refuse_memory_that_is_not_managed(emulator, make):
    buf = make()
    emulator.inject_failure(999, calls=["hipMemAdvise", "hipMemDiscardBatchAsync"])
    with pytest.raises(ValueError, match="needs managed memory"):
        buf.advise("read_mostly")
    with pytest.raises(ValueError, match="needs managed memory"):
        buf.discard()
    assert emulator.pending_faults() == 1
    buf.close()


def test_advise_on_a_closed_buffer(managed):
    managed.close()
    with pytest.raises(ValueError):
        managed.advise("read_mostly")
    with pytest.raises(ValueError):
        managed.discard()


def test_an_empty_buffer_needs_no_call(monkeypatch, rt):
    calls = _spy(monkeypatch, rt, "hipMemAdvise")
    buf = hmr.Buffer(0, resource=hmr.ManagedMemoryResource())
    buf.advise("read_mostly")
    assert calls == []


def test_the_runtime_checks_the_range(emulator, managed):
    emulator.inject_failure(1, calls="hipMemAdvise")
    with pytest.raises(hmr.HipError) as info:
        managed.advise("preferred_location")
    assert info.value.call == "hipMemAdvise"


def test_coarse_grain_is_amds_alone(monkeypatch, rt, managed):
    monkeypatch.setattr(rt, "platform", "nvidia")
    calls = _spy(monkeypatch, rt, "hipMemAdvise")
    with pytest.raises(hmr.NotSupportedError, match="coarse_grain"):
        managed.advise("coarse_grain")
    assert calls == []


# ---- prefetch to the host ----------------------------------------------------------------------

def test_prefetch_to_the_host(monkeypatch, rt, managed):
    calls = _spy(monkeypatch, rt, "hipMemPrefetchAsync")
    managed.prefetch("host")
    managed.prefetch(0)
    assert [c[2] for c in calls] == [-1, 0]
    with pytest.raises(TypeError, match="'host'"):
        managed.prefetch("cpu")


def test_prefetch_keeps_its_no_op_for_other_memory(monkeypatch, rt):
    calls = _spy(monkeypatch, rt, "hipMemPrefetchAsync")
    buf = hmr.Buffer(4096)
    buf.prefetch("host")
    assert calls == []
    buf.close()


# ---- discard ------------------------------------------------------------------------------------

def test_discard_on_the_buffers_stream_and_on_another(monkeypatch, rt):
    with hmr.Stream() as s, hmr.Stream() as other:
        buf = hmr.Buffer(4096, resource=hmr.ManagedMemoryResource(), stream=s)
        calls = _spy(monkeypatch, rt, "hipMemDiscardBatchAsync")
        buf.discard()
        buf.discard(other)
        assert [(list(p), list(n), c, f, h) for p, n, c, f, h in calls] == [
            ([buf.ptr], [4096], 1, 0, s.handle), ([buf.ptr], [4096], 1, 0, other.handle)]
        with pytest.raises(TypeError):
            buf.discard("stream")
        buf.close()


def test_discard_where_the_runtime_lacks_it(emulator):
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_MISSING":
                                               "hipMemDiscardBatchAsync"})
    with process_runtime(rt):
        buf = hmr.Buffer(4096, resource=hmr.ManagedMemoryResource())
        with pytest.raises(hmr.NotSupportedError, match="hipMemDiscardBatchAsync"):
            buf.discard()
        buf.close()


def test_system_memory_takes_advice_on_an_apu(emulator):
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_APU": "1"})
    with process_runtime(rt):
        buf = hmr.Buffer(4096, resource=hmr.SystemMemoryResource())
        buf.advise("preferred_location", "host")
        buf.discard()
        buf.prefetch()
        buf.close()


# ---- on a GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
def test_advice_and_prefetch_on_a_gpu(gpu_runtime):
    buf = hmr.Buffer(1 << 20, resource=hmr.ManagedMemoryResource())
    buf.fill(5)
    buf.advise("read_mostly")
    buf.advise("read_mostly", unset=True)
    buf.advise("preferred_location", 0)
    buf.advise("preferred_location", "host")
    buf.advise("accessed_by", 0)
    buf.prefetch("host")
    buf.prefetch(0)
    hmr.synchronize()
    assert buf.tobytes() == b"\x05" * (1 << 20)
    if gpu_runtime.platform == "nvidia":
        with pytest.raises(hmr.NotSupportedError):
            buf.advise("coarse_grain")
    try:
        buf.discard()
    except hmr.NotSupportedError:
        pass   # a runtime without hipMemDiscardBatchAsync / cudaMemDiscardBatchAsync
    buf.close()

"""Behaviours an RMM / hipMM user relies on: prefetch over any memory, the stream protocol's
version, an empty outstanding-allocations text, and streams equal to their references."""
from __future__ import annotations

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import Buffer, stream_ref

from support import TESTS


def _resources():
    return {
        "device": lambda: hmr.DeviceMemoryResource(),
        "pool": lambda: hmr.PoolResource(hmr.DeviceMemoryResource(), 1 << 20),
        "managed": lambda: hmr.ManagedMemoryResource(),
        "managed pool": lambda: hmr.PoolResource(hmr.ManagedMemoryResource(), 1 << 20),
        "pinned": lambda: hmr.PinnedMemoryResource(),
    }


# ---- PrefetchResource over memory that is not managed is a no-op -----------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(_resources()))
def test_prefetch_resource_over_any_memory(kind):
    up = _resources()[kind]()
    pf = hmr.PrefetchResource(up)
    with hmr.Stream() as s:
        for size in (1, 256, 1 << 20):
            p = pf.allocate(size)
            q = pf.allocate_async(size, 256, s)
            assert p and q and p != q
            pf.deallocate(p, size)
            pf.deallocate_async(q, size, 256, s)
        s.synchronize()
    buf = Buffer(4096, resource=pf)  # as the current resource would be used
    buf.copy_from_host(b"\x01" * 4096)
    assert buf.tobytes() == b"\x01" * 4096
    buf.close()


@pytest.mark.gpu
def test_prefetch_resource_as_the_current_resource():
    previous = hmr.get_current_device_resource()
    hmr.set_current_device_resource(hmr.PrefetchResource(previous))
    try:
        with Buffer(1000) as buf:
            buf.memset(7)
            assert buf.tobytes() == b"\x07" * 1000
    finally:
        hmr.set_current_device_resource(previous)


def test_prefetch_leaves_no_error_behind(emulator):
    from hipmr_ctypes import _hip
    rt = _hip.get_runtime()
    pf = hmr.PrefetchResource(hmr.PinnedMemoryResource())
    p = pf.allocate(64)
    assert rt.fn.hipGetLastError() == 0   # the refused prefetch was cleared
    pf.deallocate(p, 64)


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


# ---- TrackingResource's RMM text is empty when nothing is outstanding ------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("capture", [False, True])
def test_outstanding_allocations_str(capture):
    tr = hmr.TrackingResource(hmr.DeviceMemoryResource(), capture_stacks=capture)
    assert tr.get_outstanding_allocations_str() == ""
    p = tr.allocate(100)
    q = tr.allocate(300)
    text = tr.get_outstanding_allocations_str()
    assert f"{p:#x}: 100 B" in text and f"{q:#x}: 300 B" in text
    assert ("callstack" in text) is capture
    assert "test_outstanding_allocations_str" in text if capture else text.count("\n") == 2
    tr.deallocate(p, 100)
    assert f"{p:#x}" not in tr.get_outstanding_allocations_str()
    tr.deallocate(q, 300)
    assert not tr.get_outstanding_allocations_str()
    assert tr.report().startswith("0 outstanding allocations")   # the richer text stays


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


# ---- the log is RMM's, failures included --------------------------------------------------
def test_log_lines_read_like_a_log_rmm_wrote():
    """Every line of tests/fixtures/rmm_log.csv (written by RMM itself) and of ours matches
    one pattern; a failed allocation's pointer is ``(nil)`` in both."""
    import io
    import re

    line = re.compile(r"^\d+,\d\d:\d\d:\d\d\.\d{6},(allocate|allocate failure|free),"
                      r"(0x[0-9a-f]+|\(nil\)),\d+,(0x[0-9a-f]+|0)$")   # the null stream: 0
    fixture = TESTS / "fixtures" / "rmm_log.csv"
    with open(fixture) as f:
        theirs = f.read().splitlines()
    out = io.StringIO()
    log = hmr.LoggingResource(hmr.LimitingResource(hmr.DeviceMemoryResource(), 4096), out)
    log.deallocate(log.allocate(100), 100)
    with pytest.raises(hmr.OutOfMemoryError):
        log.allocate_async(1 << 20, 256, 0x5000)
    ours = out.getvalue().splitlines()
    assert ours[0] == theirs[0]
    for text in theirs[1:] + ours[1:]:
        assert line.match(text), text
    fail_theirs = [t.split(",")[3] for t in theirs if ",allocate failure," in t]
    fail_ours = [t.split(",")[3] for t in ours if ",allocate failure," in t]
    assert fail_theirs and fail_theirs == ["(nil)"] * len(fail_theirs) and fail_ours == ["(nil)"]

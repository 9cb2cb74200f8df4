"""``hipmr_ctypes.interop.torch.memory_snapshot``: our memory in PyTorch's snapshot format, read
by PyTorch's own viewer code (``torch.cuda._memory_viz``), on any PyTorch build (the CPU one
does).  The snapshot itself needs no PyTorch; the checks that PyTorch reads it do."""
import io
import os
import pickle

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes.interop.torch_snapshot import memory_snapshot
from hipmr_ctypes.logfile import read_log
from support import REPO

try:
    from torch.cuda import _memory_viz as viz
except ImportError:
    if os.environ.get("HIPMR_REQUIRE_TORCH") == "1":
        raise  # required (HIPMR_REQUIRE_TORCH=1, set by .ci/run where it installs PyTorch)
    viz = None

needs_torch = pytest.mark.skipif(viz is None, reason="PyTorch is not installed (pip install "
                                                     "torch==2.13.0: the CPU build will do)")
RMM_LOG = os.path.join(REPO, "tests", "fixtures", "rmm_log.csv")
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


def check_format(snap):
    """What ``torch.cuda.memory._snapshot()`` documents, and the sums PyTorch's viewer
    asserts: every segment's blocks tile it exactly, in address order."""
    assert set(snap) == {"segments", "device_traces"}
    for seg in snap["segments"]:
        for key in ("device", "address", "total_size", "stream", "segment_type",
                    "segment_pool_id", "allocated_size", "active_size", "blocks"):
            assert key in seg, key
        at = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == at and b["size"] > 0
            assert b["state"] in ("active_allocated", "active_awaiting_free", "inactive")
            assert 0 <= b["requested_size"] <= b["size"] and isinstance(b["frames"], list)
            at += b["size"]
        assert at == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"]
                                            if b["state"] == "active_allocated")
        assert seg["segment_type"] == ("large" if seg["total_size"] > 1 << 20 else "small")
    for trace in snap["device_traces"]:
        for e in trace:
            assert e["action"] in ACTIONS and "size" in e and "stream" in e
            assert ("addr" in e) != (e["action"] == "oom")
            if e["action"] == "oom":
                assert "device_free" in e


def read_by_pytorch(snap):
    """Every viewer function of PyTorch's accepts it, and a pickle of it (what the viewer page
    opens) gives it back."""
    if viz is None:
        return None
    summary = viz.segsum(snap)
    text = viz.trace(snap)
    for html in (viz.trace_plot(snap), viz.trace_plot(snap, plot_segments=True),
                 viz.segment_plot(snap)):
        assert html.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in html
    viz.segments(snap, format_flamegraph=lambda lines: lines)
    viz.memory(snap, format_flamegraph=lambda lines: lines)
    assert pickle.loads(pickle.dumps(snap)) == snap
    return summary, text


def test_the_torch_module_exports_it():
    torch_module = pytest.importorskip("hipmr_ctypes.interop.torch",
                                       reason="PyTorch is not installed")
    assert torch_module.memory_snapshot is memory_snapshot
    assert "memory_snapshot" in torch_module.__all__ and memory_snapshot.__doc__


def test_a_pool_live_and_free_blocks():
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), "4MiB")
    sizes = [1000, 5000, 1 << 20, 100, 256]
    ptrs = [pool.allocate(n) for n in sizes]
    pool.deallocate(ptrs[1], 5000)
    before = (pool.pool_size(), pool.get_allocated_bytes(), pool.allocation_count())
    snap = memory_snapshot(pool)
    assert (pool.pool_size(), pool.get_allocated_bytes(), pool.allocation_count()) == before
    check_format(snap)
    assert snap["device_traces"] == [[]]  # a pool keeps no history
    [seg] = snap["segments"]
    assert seg["total_size"] == 4 << 20 and seg["device"] == 0
    blocks = {b["address"]: b for b in seg["blocks"]}
    for ptr, n in zip(ptrs, sizes):
        b = blocks[ptr]
        if ptr == ptrs[1]:
            assert b["state"] == "inactive"
        else:
            assert b["state"] == "active_allocated" and b["requested_size"] == n
            assert b["size"] == -(-n // 256) * 256
    assert seg["requested_size"] == sum(sizes) - 5000
    read = read_by_pytorch(snap)
    if read:
        summary, _ = read
        assert "segments: 1" in summary and "total_reserved: 4.0MiB" in summary
    for ptr, n in zip(ptrs, sizes):
        if ptr != ptrs[1]:
            pool.deallocate(ptr, n)
    after = memory_snapshot(pool)
    assert all(b["state"] == "inactive" for s in after["segments"] for b in s["blocks"])


def test_a_pool_with_stream_free_lists_and_several_chunks():
    with hmr.Stream() as s:
        pool = hmr.PoolResource(hmr.AsyncMemoryResource())
        small = [pool.allocate_async(n, 256, s) for n in (300, 700, 300)]
        big = pool.allocate_async(3 << 20, 256, s)
        pool.deallocate_async(small[0], 300, 256, s)   # to the stream's free list
        snap = memory_snapshot(pool)
        check_format(snap)
        assert len(snap["segments"]) >= 2
        states = {b["address"]: b["state"] for seg in snap["segments"] for b in seg["blocks"]}
        assert states[small[0]] == "inactive"
        assert states[small[1]] == states[small[2]] == states[big] == "active_allocated"
        read_by_pytorch(snap)
        for ptr, n in zip(small[1:], (700, 300)):
            pool.deallocate_async(ptr, n, 256, s)
        pool.deallocate_async(big, 3 << 20, 256, s)
        s.wait()


def test_a_resource_above_the_pool_gives_the_pools():
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), "1MiB")
    stats = hmr.StatisticsResource(hmr.LimitingResource(pool, "8MiB"))
    ptr = stats.allocate(4096)
    assert memory_snapshot(stats) == memory_snapshot(pool)
    assert memory_snapshot(stats, device=2)["segments"][0]["device"] == 2
    assert len(memory_snapshot(stats, device=2)["device_traces"]) == 3
    stats.deallocate(ptr, 4096)


def test_tracking_with_stacks():
    tracked = hmr.TrackingResource(hmr.AsyncMemoryResource(), capture_stacks=True)
    with hmr.Stream() as s:
        a = tracked.allocate(3000)
        b = tracked.allocate_async(1 << 21, 256, s)
        snap = memory_snapshot(tracked)
        check_format(snap)
        segs = {seg["address"]: seg for seg in snap["segments"]}
        assert set(segs) == {a, b}
        assert segs[a]["total_size"] == 3000 and segs[a]["stream"] == 0
        assert segs[b]["stream"] == s.ref.get() and segs[b]["segment_type"] == "large"
        frames = segs[a]["blocks"][0]["frames"]
        assert frames[0]["name"] == "test_tracking_with_stacks"       # innermost first
        assert frames[0]["filename"] == __file__ and frames[0]["line"] > 0
        read = read_by_pytorch(snap)
        if read:
            assert "total_allocated: 2.0MiB" in read[0]
        tracked.deallocate(a, 3000)
        tracked.deallocate_async(b, 1 << 21, 256, s)
        s.wait()
    assert memory_snapshot(tracked)["segments"] == []
    plain = hmr.TrackingResource(hmr.AsyncMemoryResource())
    c = plain.allocate(512)
    assert memory_snapshot(plain)["segments"][0]["blocks"][0]["frames"] == []
    plain.deallocate(c, 512)


def test_our_log_as_a_trace():
    log = io.StringIO()
    logged = hmr.LoggingResource(hmr.LimitingResource(hmr.AsyncMemoryResource(), "1MiB"), log)
    a = logged.allocate(1000)
    b = logged.allocate(2000)
    with pytest.raises(hmr.OutOfMemoryError):
        logged.allocate(2 << 20)
    logged.deallocate(a, 1000)
    for snap in (memory_snapshot(logged), memory_snapshot(io.StringIO(log.getvalue())),
                 memory_snapshot(read_log(io.StringIO(log.getvalue()))),
                 memory_snapshot(iter(read_log(io.StringIO(log.getvalue()))))):
        check_format(snap)
        [trace] = snap["device_traces"]
        assert [(e["action"], e.get("addr"), e["size"]) for e in trace] == [
            ("segment_alloc", a, 1000), ("alloc", a, 1000),
            ("segment_alloc", b, 2000), ("alloc", b, 2000),
            ("oom", None, 2 << 20),
            ("free_requested", a, 1000), ("free_completed", a, 1000), ("segment_free", a, 1000)]
        times = [e["time_us"] for e in trace]
        assert times == sorted(times)
        [seg] = snap["segments"]                      # b is still live at the end
        assert (seg["address"], seg["total_size"]) == (b, 2000)
        read = read_by_pytorch(snap)
        if read:
            assert "raise OutOfMemoryError # 2.0MiB requested" in read[1]
    logged.deallocate(b, 2000)


def test_a_named_log_file(tmp_path):
    path = tmp_path / "run.csv"
    logged = hmr.LoggingResource(hmr.AsyncMemoryResource(), str(path))
    ptr = logged.allocate(4096)
    snap = memory_snapshot(logged)         # flushed and read back
    assert [e["action"] for e in snap["device_traces"][0]] == ["segment_alloc", "alloc"]
    assert memory_snapshot(path, device=1)["device_traces"][1] == snap["device_traces"][0]
    logged.deallocate(ptr, 4096)
    logged.close()


def test_rmms_log():
    snap = memory_snapshot(RMM_LOG)
    check_format(snap)
    events = read_log(RMM_LOG)
    trace = snap["device_traces"][0]
    allocs = [e for e in events if e.action == "allocate"]
    frees = [e for e in events if e.action == "free"]
    assert sum(e["action"] == "alloc" for e in trace) == len(allocs)
    assert sum(e["action"] == "free_completed" for e in trace) == len(frees)
    assert {e["stream"] for e in trace} == {e.stream for e in events}
    live = {e.ptr for e in allocs} - {e.ptr for e in frees}
    assert {seg["address"] for seg in snap["segments"]} <= {e.ptr for e in allocs}
    assert len(snap["segments"]) <= len(live) + len(allocs)
    read = read_by_pytorch(snap)
    if read:
        assert f"{len(trace)} entries" in read[1]
    if viz is not None:  # what the viewer does with "show only what is still live"
        kept = viz.filter_alloc_free_pairs(memory_snapshot(RMM_LOG))
        assert not any(e["action"] == "free_requested" for e in kept["device_traces"][0])


@pytest.mark.parametrize("bad", [object(), 3, None, b"log", hmr.AsyncMemoryResource(),
                                 hmr.StatisticsResource(hmr.AsyncMemoryResource())])
def test_what_it_cannot_read_is_a_type_error(bad):
    with pytest.raises(TypeError, match="memory_snapshot needs"):
        memory_snapshot(bad)


def test_bad_devices_and_logs():
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    for device, error in ((-1, ValueError), (1.0, TypeError), (True, TypeError),
                          ("0", TypeError)):
        with pytest.raises(error, match="device must be"):
            memory_snapshot(pool, device=device)
    with pytest.raises(ValueError, match="not a LoggingResource log"):
        memory_snapshot(io.StringIO("a,b,c\n"))
    for events in ([1, 2], (None,), iter(["x"])):
        with pytest.raises(TypeError, match="LogEvents in a list"):
            memory_snapshot(events)
    unreadable = hmr.LoggingResource(hmr.AsyncMemoryResource(), _WriteOnly())
    with pytest.raises(TypeError, match="named file or to an io.StringIO"):
        memory_snapshot(unreadable)


class _WriteOnly(io.TextIOBase):
    """A text file that can only be written to."""

    def writable(self):
        return True

    def write(self, text):
        return len(text)


@needs_torch
def test_pytorchs_own_loader_reads_a_dumped_file(tmp_path):
    """The file the memory-viewer page opens: a pickle of the dict, as
    ``torch.cuda.memory._dump_snapshot`` writes it."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), "2MiB")
    ptr = pool.allocate(123456)
    path = tmp_path / "snapshot.pickle"
    with open(path, "wb") as f:
        pickle.dump(memory_snapshot(pool), f)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert "total_allocated: 120.6KiB" in viz.segsum(loaded)
    pool.deallocate(ptr, 123456)

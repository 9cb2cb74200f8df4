"""LoggingResource writes RMM's CSV log; scripts/replay_log.py replays it against any resource
and reports the same statistics."""
import csv
import io
import random
import re
import sys
import threading
import types

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import OutOfMemoryError, stream_ref
from hipmr_ctypes.adaptors import (LOG_HEADER, LimitingResource, LoggingResource,
                                   PoolResource, Statistics, StatisticsResource)
from hipmr_ctypes.resources import HostMemoryResource

from support import REPO, TESTS, AddressSpaceResource

sys.path.insert(0, str(REPO / "scripts"))
import replay_log  # noqa: E402

LINE = re.compile(r"^(\d+),(\d\d:\d\d:\d\d\.\d{6}),(allocate|allocate failure|free),"
                  r"(0x[0-9a-f]+|\(nil\)),(\d+),(0x[0-9a-f]+|0)$")


def test_csv_lines_as_rmm_writes_them():
    out = io.StringIO()
    log = LoggingResource(LimitingResource(AddressSpaceResource(), 10000), out)
    p = log.allocate(1000)
    q = log.allocate_async(2000, 256, 0x5000)
    with pytest.raises(OutOfMemoryError):
        log.allocate_async(9000, 256, stream_ref(0x6000))
    log.deallocate_async(q, 2000, 256, 0x5000)
    log.deallocate(p, 1000)
    lines = out.getvalue().splitlines()
    assert lines[0] == LOG_HEADER == "Thread,Time,Action,Pointer,Size,Stream"
    rows = [LINE.match(line) for line in lines[1:]]
    assert all(rows), lines
    tid = str(threading.get_native_id())
    assert all(r.group(1) == tid for r in rows)
    assert [(r.group(3), r.group(4), r.group(5), r.group(6)) for r in rows] == [
        ("allocate", hex(p), "1000", "0"),            # RMM writes a null stream as "0"
        ("allocate", hex(q), "2000", "0x5000"),
        ("allocate failure", "(nil)", "9000", "0x6000"),   # and a null pointer as "(nil)"
        ("free", hex(q), "2000", "0x5000"),
        ("free", hex(p), "1000", "0"),
    ]
    # and csv reads it back
    records = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [r["Action"] for r in records] == ["allocate", "allocate", "allocate failure",
                                              "free", "free"]


def test_log_file_by_path_flush_and_close(tmp_path):
    path = tmp_path / "run.csv"
    log = LoggingResource(HostMemoryResource(), path)
    assert log.get_file_name() == str(path)
    p = log.allocate(64)
    log.flush()
    assert path.read_text().count("\n") == 2
    log.deallocate(p, 64)
    log.close()
    log.close()
    assert len(path.read_text().splitlines()) == 3
    with pytest.raises(ValueError, match="closed"):
        log.allocate(64)


def test_auto_flush_and_a_file_object_is_not_closed(tmp_path):
    with open(tmp_path / "x.csv", "w") as f:
        log = LoggingResource(HostMemoryResource(), f, auto_flush=True)
        p = log.allocate(10)
        assert (tmp_path / "x.csv").read_text().count("allocate") == 1
        log.deallocate(p, 10)
        log.close()
        assert not f.closed


def test_free_is_logged_before_the_upstream_frees():
    order = []

    class Up(AddressSpaceResource):
        def deallocate(self, ptr, bytes, alignment=256):
            order.append(("upstream free", out.getvalue().count("free,")))
            super().deallocate(ptr, bytes, alignment)

    out = io.StringIO()
    log = LoggingResource(Up(), out)
    p = log.allocate(100)
    log.deallocate(p, 100)
    assert order == [("upstream free", 1)]


def workload(resource, seed=0, steps=2000):
    """A mixed workload through ``resource``; returns nothing, leaves a few blocks live."""
    rng = random.Random(seed)
    live = []
    for _ in range(steps):
        if live and rng.random() < 0.48:
            p, n, s = live.pop(rng.randrange(len(live)))
            if s is None:
                resource.deallocate(p, n)
            else:
                resource.deallocate_async(p, n, 256, s)
        else:
            n = rng.choice([0, rng.randint(1, 4096), rng.randint(1, 1 << 20)])
            s = rng.choice([None, 0])
            try:
                p = resource.allocate(n) if s is None else resource.allocate_async(n, 256, s)
            except OutOfMemoryError:
                continue
            live.append((p, n, s))
    return live


def test_replay_reports_the_same_statistics(tmp_path):
    path = tmp_path / "run.csv"
    with LoggingResource(LimitingResource(PoolResource(HostMemoryResource()), 8 << 20),
                         path) as log:
        stats = StatisticsResource(log)
        live = workload(stats)
        original = stats.statistics
        for p, n, _ in live:
            stats.deallocate(p, n)
        final = stats.statistics
    report = replay_log.replay(path)
    assert report.failures_in_log > 0 and report.unmatched_frees == 0
    assert report.replayed == report.from_log == final
    assert report.replayed.peak_bytes == original.peak_bytes
    assert report.peak_pool_size >= report.replayed.peak_bytes
    assert report.fragmentation >= 1.0
    # against a user-specified resource
    other = replay_log.replay(path, AddressSpaceResource())
    assert other.replayed == final and other.peak_pool_size is None


def test_replay_command_line(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.csv"
    with LoggingResource(PoolResource(HostMemoryResource()), path) as log:
        live = workload(log, seed=4, steps=500)   # leave some live: replayed, then freed
    assert live
    assert replay_log.main([str(path), "--initial", "4MiB", "--maximum", "1GiB"]) == 0
    text = capsys.readouterr().out
    assert "statistics match" in text and "peak pool size" in text
    assert f"{len(live)} allocations live at the end" in text
    assert replay_log.main([str(path), "--resource", "host", "--json"]) == 0
    assert '"peak_pool_size": null' in capsys.readouterr().out
    module = types.ModuleType("replay_target_for_test")
    module.make = lambda: AddressSpaceResource()
    monkeypatch.setitem(sys.modules, "replay_target_for_test", module)
    assert replay_log.main([str(path), "--resource", "replay_target_for_test:make"]) == 0


def test_replay_rejects_what_is_not_a_log():
    with pytest.raises(ValueError, match="first line"):
        replay_log.replay(io.StringIO("a,b,c\n"))
    with pytest.raises(ValueError, match="unknown action"):
        replay_log.replay(io.StringIO(LOG_HEADER + "\n1,00:00:00.000000,grow,0x10,5,0x0\n"))
    with pytest.raises(ValueError, match="single-letter unit is ambiguous"):
        replay_log.parse_bytes("2k")
    assert replay_log.parse_bytes("2kb") == 2000 and replay_log.parse_bytes("1GiB") == 1 << 30


def test_free_without_allocation_is_counted_not_replayed():
    text = LOG_HEADER + "\n1,00:00:00.000000,free,0x1000,64,0x0\n" \
        "1,00:00:00.000001,allocate,0x2000,64,0x0\n"
    report = replay_log.replay(io.StringIO(text), AddressSpaceResource())
    assert report.unmatched_frees == 1 and report.live_at_end == 1
    assert report.replayed == Statistics(64, 1, 64, 1, 64, 1) == report.from_log


def test_close_with_a_file_object_stops_logging_without_closing_it():
    buf = io.StringIO()
    log = LoggingResource(HostMemoryResource(), buf)
    p = log.allocate(64)
    log.close()
    assert not buf.closed  # the caller's file stays open
    with pytest.raises(ValueError, match="closed"):
        log.allocate(64)
    log.deallocate(p, 64)  # memory handed out before close() can still be freed, unlogged
    with pytest.raises(ValueError, match="not allocated"):
        log.upstream.deallocate(p, 64)  # it really was freed
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].split(",")[2] == "allocate"


def test_the_time_is_local_time_to_the_microsecond_format():
    """The stamp is cached per second (strftime once a second): it must still be the local
    time now, with six digits of microseconds, and never run backwards within a log."""
    import datetime
    out = io.StringIO()
    r = LoggingResource(AddressSpaceResource(), out)
    before = datetime.datetime.now()
    for _ in range(300):
        r.deallocate(r.allocate(64), 64)
    after = datetime.datetime.now()
    stamps = [LINE.match(line).group(2) for line in out.getvalue().splitlines()[1:]]
    assert len(stamps) == 600

    def seconds(hms):
        h, m, s = hms.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    values = [seconds(s) for s in stamps]
    lo = before.hour * 3600 + before.minute * 60 + before.second + before.microsecond / 1e6
    hi = after.hour * 3600 + after.minute * 60 + after.second + after.microsecond / 1e6
    if hi >= lo:  # not across midnight
        assert all(lo - 0.001 <= v <= hi + 0.001 for v in values)
        assert values == sorted(values)


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

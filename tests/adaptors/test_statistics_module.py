"""hipmr_ctypes.statistics: RMM's test_statistics.py in our names (our StatisticsResource counts
the sizes asked for, so the byte counts are the request sizes), plus the profiler under
threads and when statistics are not enabled."""
from __future__ import annotations

import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes.resources import per_device
from hipmr_ctypes.statistics import (ProfilerRecords, Statistics, default_profiler_records,
                                     enable_statistics, get_descriptive_name_of_object,
                                     get_statistics, pop_statistics, profiler, push_statistics,
                                     statistics)

from support import process_runtime

pytestmark = pytest.mark.gpu   # every test allocates: run them on the GPU too


def S(cb, cn, pb, pn, tb, tn):
    return Statistics(current_bytes=cb, current_count=cn, peak_bytes=pb, peak_count=pn,
                      total_bytes=tb, total_count=tn)


@pytest.fixture(autouse=True)
def fresh_resource():
    """The current device's resource is a plain DeviceMemoryResource during each test."""
    with process_runtime():
        hmr.set_current_device_resource(hmr.DeviceMemoryResource())
        default_profiler_records.clear()
        yield
    default_profiler_records.clear()


@pytest.fixture
def stats_mr():
    mr = hmr.StatisticsResource(hmr.get_current_device_resource())
    hmr.set_current_device_resource(mr)
    return mr


def test_context():
    mr0 = hmr.get_current_device_resource()
    assert get_statistics() is None
    with statistics():
        mr1 = hmr.get_current_device_resource()
        assert isinstance(mr1, hmr.StatisticsResource)
        b1 = hmr.Buffer(size=20)
        assert get_statistics() == S(20, 1, 20, 1, 20, 1)
        with statistics():
            assert hmr.get_current_device_resource() is mr1
            b2 = hmr.Buffer(size=10)
            assert get_statistics() == S(10, 1, 10, 1, 10, 1)
        assert get_statistics() == S(30, 2, 30, 2, 30, 2)
        del b1
        del b2
    assert hmr.get_current_device_resource() is mr0
    assert get_statistics() is None


def test_context_refuses_a_resource_swapped_inside():
    mr0 = hmr.get_current_device_resource()
    with pytest.raises(ValueError, match="replaced inside"):
        with statistics():
            hmr.set_current_device_resource(hmr.DeviceMemoryResource())
    hmr.set_current_device_resource(mr0)


def test_multiple_mr(stats_mr):
    buffers = [hmr.Buffer(size=1000) for _ in range(10)]
    for i in range(9, 0, -2):
        del buffers[i]
    assert stats_mr.allocation_counts == S(5000, 5, 10000, 10, 10000, 10)
    mr2 = hmr.StatisticsResource(stats_mr)   # a second one on top
    hmr.set_current_device_resource(mr2)
    try:
        for _ in range(2):
            buffers.append(hmr.Buffer(size=1000))
        assert mr2.allocation_counts == S(2000, 2, 2000, 2, 2000, 2)
        assert stats_mr.allocation_counts == S(7000, 7, 10000, 10, 12000, 12)
        del buffers
        assert mr2.allocation_counts == S(0, 0, 2000, 2, 2000, 2)
        assert stats_mr.allocation_counts == S(0, 0, 10000, 10, 12000, 12)
    finally:
        hmr.set_current_device_resource(stats_mr)


def test_counter_stack(stats_mr):
    buffers = [hmr.Buffer(size=10) for _ in range(10)]
    assert stats_mr.push_counters() == S(100, 10, 100, 10, 100, 10)   # level 0, before the push
    b1 = hmr.Buffer(size=10)
    assert stats_mr.push_counters() == S(10, 1, 10, 1, 10, 1)         # level 1
    del b1
    assert stats_mr.pop_counters() == S(-10, -1, 0, 0, 0, 0)          # level 2 (may go negative)
    b1 = hmr.Buffer(size=10)
    assert stats_mr.push_counters() == S(10, 1, 10, 1, 20, 2)         # level 1
    b2 = hmr.Buffer(size=10)
    assert stats_mr.pop_counters() == S(10, 1, 10, 1, 10, 1)          # level 2
    assert stats_mr.pop_counters() == S(20, 2, 20, 2, 30, 3)          # level 1
    del b1
    del b2
    assert stats_mr.allocation_counts == S(100, 10, 120, 12, 130, 13)
    del buffers
    with pytest.raises(IndexError):
        stats_mr.pop_counters()


def test_current_statistics(stats_mr):
    b1 = hmr.Buffer(size=10)
    assert get_statistics() == S(10, 1, 10, 1, 10, 1)
    b2 = hmr.Buffer(size=20)
    assert push_statistics() == S(30, 2, 30, 2, 30, 2)
    del b1
    assert pop_statistics() == S(-10, -1, 0, 0, 0, 0)
    del b2
    assert get_statistics() == S(0, 0, 30, 2, 30, 2)


def test_statistics_disabled():
    assert get_statistics() is None
    assert push_statistics() is None
    assert pop_statistics() is None
    assert get_statistics() is None


def test_enable_statistics_is_idempotent():
    base = hmr.get_current_device_resource()
    enable_statistics()
    mr = hmr.get_current_device_resource()
    assert isinstance(mr, hmr.StatisticsResource) and mr.upstream is base
    enable_statistics()
    assert hmr.get_current_device_resource() is mr


def test_profiler(stats_mr):
    records = ProfilerRecords()
    assert len(records.records) == 0
    assert "No data" in records.report() and "No data" in str(records)

    @profiler(records=records)
    def f1():
        b1 = hmr.Buffer(size=10)
        b2 = hmr.Buffer(size=10)
        del b1
        return b2

    b1 = f1()
    b2 = f1()

    @profiler(records=records)
    def f2():
        b1 = hmr.Buffer(size=10)

        @profiler(records=records, name="g2")
        def g2(b1):
            b2 = hmr.Buffer(size=10)
            del b1
            return b2

        return g2(b1)

    f2()
    f2()
    del b1
    del b2
    f2()

    @profiler(records=records)
    def f3():
        return [hmr.Buffer(size=100) for _ in range(100)]

    f3()
    got = records.records
    M = ProfilerRecords.MemoryRecord
    assert got[get_descriptive_name_of_object(f1)] == M(num_calls=2, memory_total=40,
                                                        memory_peak=20)
    assert got[get_descriptive_name_of_object(f2)] == M(num_calls=3, memory_total=60,
                                                        memory_peak=20)
    assert got["g2"] == M(num_calls=3, memory_total=30, memory_peak=10)
    assert got[get_descriptive_name_of_object(f3)] == M(num_calls=1, memory_total=10000,
                                                        memory_peak=10000)
    assert "f1" in get_descriptive_name_of_object(f1)

    @profiler()  # the default records
    def f4():
        return [hmr.Buffer(size=10) for _ in range(10)]

    f4()
    with profiler(name="b1 and b2"):   # as a context manager
        b1 = hmr.Buffer(size=100)
        b2 = hmr.Buffer(size=100)
        with profiler(name="del b1 and b2"):
            del b1
            del b2
    got = default_profiler_records.records
    assert got[get_descriptive_name_of_object(f4)] == M(num_calls=1, memory_total=100,
                                                        memory_peak=100)
    assert got["b1 and b2"] == M(num_calls=1, memory_total=200, memory_peak=200)
    assert got["del b1 and b2"] == M(num_calls=1, memory_total=0, memory_peak=0)
    text = default_profiler_records.report(ordered_by="num_calls")
    assert "Ordered by:   num_calls" in text and "b1 and b2" in text
    assert stats_mr.depth == 0


def test_profiler_arguments():
    with pytest.raises(ValueError, match="needs a name"):
        with profiler():
            pass
    with pytest.raises(TypeError, match="records"):
        profiler(records={})
    with pytest.raises(TypeError, match="name"):
        profiler(name=3)
    with pytest.raises(TypeError, match="callable"):
        profiler()(42)
    with pytest.raises(ValueError, match="ordered_by"):
        ProfilerRecords().report(ordered_by="size")


def test_profiler_records_on_exceptions_and_keeps_the_function(stats_mr):
    records = ProfilerRecords()

    @profiler(records=records, name="boom")
    def boom(n):
        """doc"""
        keep = hmr.Buffer(n)  # noqa: F841
        raise KeyError(n)

    with pytest.raises(KeyError):
        boom(64)
    assert records.records["boom"] == ProfilerRecords.MemoryRecord(1, 64, 64)
    assert boom.__name__ == "boom" and boom.__doc__ == "doc" and boom.__wrapped__
    assert stats_mr.depth == 0


def test_profiler_costs_nothing_when_statistics_are_not_enabled(monkeypatch):
    records = ProfilerRecords()

    @profiler(records=records)
    def f(x):
        return hmr.Buffer(x)

    def refuse():
        raise AssertionError("looked up the current resource")

    monkeypatch.setattr(per_device, "get_current_device_resource", refuse)
    assert f(8).size == 8
    with profiler(records=records, name="block"):
        hmr.Buffer(8, resource=hmr.DeviceMemoryResource())
    assert records.records == {}


def test_profiler_under_threads(stats_mr):
    """Profiled calls in many threads at once: every call is counted, nothing raises, the
    counter stack is left as found, and the resource's own counters stay exact."""
    records = ProfilerRecords()
    threads_n, calls_n = 8, 50

    @profiler(records=records)
    def work(size):
        bufs = [hmr.Buffer(size) for _ in range(3)]
        return sum(b.size for b in bufs)

    errors = []
    start = threading.Barrier(threads_n)

    def run(i):
        try:
            start.wait()
            for _ in range(calls_n):
                assert work(100 + i) == 3 * (100 + i)
                with profiler(records=records, name=f"block {i % 2}"):
                    hmr.Buffer(7)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and errors == []
    got = records.records
    assert got[get_descriptive_name_of_object(work)].num_calls == threads_n * calls_n
    assert got["block 0"].num_calls + got["block 1"].num_calls == threads_n * calls_n
    assert stats_mr.depth == 0
    total = sum(3 * (100 + i) + 7 for i in range(threads_n)) * calls_n
    assert stats_mr.statistics == S(0, 0, stats_mr.statistics.peak_bytes,
                                     stats_mr.statistics.peak_count, total,
                                     4 * threads_n * calls_n)

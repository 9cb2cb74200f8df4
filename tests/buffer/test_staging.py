"""Large pageable host <-> device copies staged through pinned memory (``_staging``).

On the emulated platform with small chunks, so that every shape of the pipeline (one chunk,
many, a partial last one, a busy set, a failure in the middle) runs on a few KiB; the GPU test
at the end copies real device memory on both paths and compares them."""
import ctypes
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._buffer import staging as _staging
from hipmr_ctypes.errors import HipError

CHUNK = 4096


@pytest.fixture
def staging(monkeypatch):
    """Small chunks, a low threshold, two pipelines of a chunk or more, a set table of this
    test's own (closed afterwards), and the calls of the staged copies counted."""
    monkeypatch.setattr(_staging, "CHUNK", CHUNK)
    monkeypatch.setattr(_staging, "THRESHOLD", 2 * CHUNK)
    monkeypatch.setattr(_staging, "TO_HOST_THRESHOLD", 2 * CHUNK)
    monkeypatch.setattr(_staging, "TO_EXISTING_HOST_THRESHOLD", 2 * CHUNK)
    monkeypatch.setattr(_staging, "WORKERS", 2)   # (the default depends on the CPUs)
    monkeypatch.setattr(_staging, "MIN_PART", CHUNK)
    sets = {}
    monkeypatch.setattr(_staging, "_sets", sets)
    calls = {"to_device": 0, "to_host": 0, "to_existing_host": 0}
    for name in calls:
        real = getattr(_staging, name)

        def counted(*args, _real=real, _name=name):
            staged = _real(*args)
            calls[_name] += staged
            return staged

        monkeypatch.setattr(_staging, name, counted)
    yield calls
    for _, made in sets.values():
        for one in made:
            one.close()


def _pattern(n: int) -> bytes:
    return bytes((i * 7 + i // 251) & 0xFF for i in range(n))


SIZES = [2 * CHUNK, 2 * CHUNK + 1, 3 * CHUNK - 1, 5 * CHUNK, 7 * CHUNK + 123]


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("n", SIZES)
def test_every_host_to_device_and_back_path_is_exact(staging, monkeypatch, n, workers):
    monkeypatch.setattr(_staging, "WORKERS", workers)
    data = _pattern(n)
    mr = hmr.AsyncMemoryResource()
    buf = hmr.Buffer.from_host(data, resource=mr)
    assert staging["to_device"] == 1
    assert buf.tobytes() == data
    assert bytes(buf.copy_to_host()) == data
    out = bytearray(n + 3)
    buf.copy_to_host(out)
    assert bytes(out[:n]) == data and out[n:] == b"\0\0\0"
    # into existing memory: staged only when two pipelines can run
    assert staging["to_host"] == 2 and staging["to_existing_host"] == (workers >= 2)
    other = hmr.Buffer(n, resource=mr)
    other.copy_from_host(bytes(reversed(data)))
    assert other.tobytes() == bytes(reversed(data))
    assert staging == {"to_device": 2, "to_host": 3, "to_existing_host": workers >= 2}
    buf.close()
    other.close()


def _threads_of(monkeypatch):
    """The threads each pipeline ran in."""
    seen = []
    for name in ("_into_device", "_into_host"):
        real = getattr(_staging, name)

        def spy(*args, _real=real):
            seen.append(threading.get_ident())
            return _real(*args)

        monkeypatch.setattr(_staging, name, spy)
    return seen


def test_the_parts_run_in_threads_of_their_own_but_not_on_the_per_thread_stream(
        staging, monkeypatch):
    n = 6 * CHUNK
    seen = _threads_of(monkeypatch)
    mr = hmr.AsyncMemoryResource()
    buf = hmr.Buffer.from_host(_pattern(n), resource=mr)
    assert len(seen) == 2 and threading.get_ident() in seen and len(set(seen)) == 2
    seen.clear()
    own = hmr.Buffer(n, resource=mr, stream=hmr.stream_per_thread)
    own.copy_from_host(_pattern(n))
    assert own.tobytes() == _pattern(n)
    assert seen == [threading.get_ident()] * 2     # one pipeline each, in this thread
    own.close()
    buf.close()


def test_a_short_copy_runs_fewer_pipelines(staging, monkeypatch):
    seen = _threads_of(monkeypatch)
    monkeypatch.setattr(_staging, "WORKERS", 4)
    monkeypatch.setattr(_staging, "MIN_PART", 3 * CHUNK)
    mr = hmr.AsyncMemoryResource()
    for n, pipelines in ((5 * CHUNK, 1), (6 * CHUNK, 2), (12 * CHUNK + 1, 4), (40 * CHUNK, 4)):
        seen.clear()
        buf = hmr.Buffer.from_host(_pattern(n), resource=mr)
        assert len(seen) == pipelines, n
        assert buf.tobytes() == _pattern(n)
        buf.close()
    seen.clear()
    buf = hmr.Buffer.from_host(_pattern(5 * CHUNK), resource=mr)
    out = bytearray(5 * CHUNK)
    buf.copy_to_host(out)            # one pipeline only: an existing destination is not staged
    assert bytes(out) == _pattern(5 * CHUNK) and staging["to_existing_host"] == 0
    buf.close()


def test_an_existing_host_destination_needs_two_pipelines(staging, monkeypatch):
    n = 4 * CHUNK
    monkeypatch.setattr(_staging, "WORKERS", 2)
    buf = hmr.Buffer.from_host(_pattern(n), resource=hmr.AsyncMemoryResource())
    out = bytearray(n)
    (_, made), = _staging._sets.values()
    made[1].lock.acquire()                  # one pipeline free only: the runtime copies
    try:
        buf.copy_to_host(out)
    finally:
        made[1].lock.release()
    assert bytes(out) == _pattern(n)
    assert staging == {"to_device": 1, "to_host": 0, "to_existing_host": 0}
    assert not made[0].lock.locked()
    out[:] = bytes(n)
    buf.copy_to_host(out)                   # both free: staged
    assert bytes(out) == _pattern(n)
    assert staging == {"to_device": 1, "to_host": 0, "to_existing_host": 1}
    buf.close()


def test_memory_of_another_device_than_the_current_one():
    """The workers make the buffer's device current (the emulator, like the runtime,
    refuses a plain copy of pool memory while another device is current)."""
    from support import process_runtime
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    n = 3 * _staging.CHUNK + 5
    data = _pattern(n)
    saved = dict(_staging._sets)
    try:
        with process_runtime(two):
            mr = hmr.AsyncMemoryResource(device=1)
            with hmr.Device(0):
                buf = hmr.Buffer(n, resource=mr)
                before = _staging.THRESHOLD, _staging.TO_HOST_THRESHOLD
                _staging.THRESHOLD = _staging.TO_HOST_THRESHOLD = 2 * _staging.CHUNK
                try:
                    buf.copy_from_host(data)
                    assert buf.tobytes() == data
                finally:
                    _staging.THRESHOLD, _staging.TO_HOST_THRESHOLD = before
                assert hmr.get_device() == 0
            assert (id(two), 1) in _staging._sets and _staging._sets[(id(two), 1)][1]
            buf.close()
    finally:
        entry = _staging._sets.pop((id(two), 1), None)
        for one in entry[1] if entry else ():
            one.close()
        assert dict(_staging._sets) == saved


def test_copies_to_the_host_have_a_threshold_of_their_own(staging, monkeypatch):
    monkeypatch.setattr(_staging, "TO_HOST_THRESHOLD", 8 * CHUNK)
    mr = hmr.AsyncMemoryResource()
    for n, staged in ((8 * CHUNK - 1, 0), (8 * CHUNK, 1)):
        buf = hmr.Buffer.from_host(_pattern(n), resource=mr)
        assert buf.tobytes() == _pattern(n) and bytes(buf.copy_to_host()) == _pattern(n)
        buf.close()
        assert staging["to_host"] == 2 * staged
    assert staging["to_device"] == 2


def test_copies_into_memory_in_use_have_a_threshold_of_their_own(staging, monkeypatch):
    monkeypatch.setattr(_staging, "TO_EXISTING_HOST_THRESHOLD", 8 * CHUNK)
    mr = hmr.AsyncMemoryResource()
    for n, staged in ((8 * CHUNK - 1, 0), (8 * CHUNK, 1)):
        buf = hmr.Buffer.from_host(_pattern(n), resource=mr)
        out = bytearray(n)
        assert buf.copy_to_host(out) is out and bytes(out) == _pattern(n)
        assert bytes(buf.copy_to_host()) == _pattern(n)      # fresh: its own threshold
        buf.close()
        assert staging["to_existing_host"] == staged
    assert staging["to_host"] == 2


def test_small_copies_and_async_copies_are_not_staged(staging):
    mr = hmr.AsyncMemoryResource()
    small = hmr.Buffer.from_host(_pattern(2 * CHUNK - 1), resource=mr)
    assert small.tobytes() == _pattern(2 * CHUNK - 1)
    with hmr.Stream() as s:
        big = hmr.Buffer.from_host(_pattern(4 * CHUNK), resource=mr, stream=s)
        out = bytearray(4 * CHUNK)
        big.copy_to_host(out, stream=s)
        s.synchronize()
        assert bytes(out) == _pattern(4 * CHUNK)
        big.close()
    assert staging == {"to_device": 0, "to_host": 0, "to_existing_host": 0}
    small.close()


def test_the_copy_is_ordered_after_the_work_on_the_buffers_stream(staging):
    n = 6 * CHUNK
    with hmr.Stream() as s:
        buf = hmr.Buffer(n, resource=hmr.AsyncMemoryResource(), stream=s)
        buf.memset(0x3C, stream=s)            # queued on the buffer's own stream
        assert buf.tobytes() == b"\x3c" * n   # the staged copy runs after it
        buf.copy_from_host(_pattern(n))
        buf.memset(0x11, stream=s)
        assert bytes(buf.copy_to_host()) == b"\x11" * n
        buf.close()
    assert staging["to_host"] == 2 and staging["to_device"] == 1


def test_pinned_and_host_only_memory_is_not_staged(staging):
    n = 4 * CHUNK
    pinned_mr = hmr.PinnedMemoryResource()
    ptr = pinned_mr.allocate(n)
    try:
        pinned = (ctypes.c_char * n).from_address(ptr)
        pinned[:] = _pattern(n)
        buf = hmr.Buffer.from_host(pinned, resource=hmr.AsyncMemoryResource())
        assert buf.copy_to_host(memoryview(pinned)) is not None
        assert bytes(pinned) == _pattern(n)
        buf.close()
    finally:
        pinned_mr.deallocate(ptr, n)
    host = hmr.Buffer.from_host(_pattern(n), resource=hmr.PinnedMemoryResource())
    assert host.tobytes() == _pattern(n)
    host.close()
    assert staging == {"to_device": 0, "to_host": 0, "to_existing_host": 0}


def test_a_busy_set_leaves_the_copy_to_the_runtime(staging):
    n = 4 * CHUNK
    mr = hmr.AsyncMemoryResource()
    first = hmr.Buffer.from_host(_pattern(n), resource=mr)   # makes the sets
    (_, made), = _staging._sets.values()
    assert len(made) == _staging.WORKERS
    for one in made:                                         # other copies hold them all
        one.lock.acquire()
    try:
        second = hmr.Buffer.from_host(_pattern(n), resource=mr)
        assert second.tobytes() == _pattern(n)
    finally:
        for one in made:
            one.lock.release()
    assert staging == {"to_device": 1, "to_host": 0, "to_existing_host": 0}
    made[0].lock.acquire()                                   # one busy: the others serve
    try:
        third = hmr.Buffer.from_host(_pattern(n), resource=mr)
        assert third.tobytes() == _pattern(n)
    finally:
        made[0].lock.release()
    assert staging == {"to_device": 2, "to_host": 1, "to_existing_host": 0}
    third.close()
    first.close()
    second.close()


def test_a_set_that_cannot_be_made_is_not_retried_and_the_copy_still_works(staging, emulator):
    emulator.inject_failure(calls="hipHostMalloc", count=2)
    n = 4 * CHUNK
    mr = hmr.AsyncMemoryResource()
    buf = hmr.Buffer.from_host(_pattern(n), resource=mr)
    assert buf.tobytes() == _pattern(n)
    (_, made), = _staging._sets.values()
    assert made == () and staging == {"to_device": 0, "to_host": 0, "to_existing_host": 0}
    assert emulator.pending_faults() == 1     # asked once, not on every copy
    assert buf.tobytes() == _pattern(n)      # and the next copy works as well
    buf.close()


def test_a_failure_in_the_middle_raises_and_leaves_the_set_usable(staging, emulator):
    n = 6 * CHUNK
    mr = hmr.AsyncMemoryResource()
    buf = hmr.Buffer(n, resource=mr)
    buf.copy_from_host(_pattern(n))                           # the set exists
    emulator.inject_failure(calls="hipEventSynchronize")      # the third chunk's wait
    with pytest.raises(HipError, match="hipEventSynchronize"):
        buf.copy_from_host(bytes(n))
    (_, made), = _staging._sets.values()
    assert not any(one.lock.locked() for one in made)
    emulator.inject_failure(calls="hipMemcpyAsync")           # the first transfer back
    with pytest.raises(HipError, match="hipMemcpyAsync"):
        buf.tobytes()
    assert not any(one.lock.locked() for one in made)
    buf.copy_from_host(_pattern(n))
    assert buf.tobytes() == _pattern(n)
    buf.close()


def test_threads_copying_at_once_all_get_their_bytes(staging):
    n = 5 * CHUNK + 17
    mr = hmr.AsyncMemoryResource()
    errors = []

    def work(k):
        try:
            data = bytes([k]) * n
            for _ in range(20):
                buf = hmr.Buffer.from_host(data, resource=mr)
                assert buf.tobytes() == data
                buf.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert staging["to_device"] >= 1 and staging["to_host"] >= 1   # some staged, some not


def test_each_runtime_has_its_own_set(staging):
    from support import process_runtime
    data = _pattern(3 * CHUNK)
    first = hmr.Buffer.from_host(data, resource=hmr.AsyncMemoryResource())
    with process_runtime(_hip.create_runtime("emulated")) as rt:
        other = hmr.Buffer.from_host(data, resource=hmr.AsyncMemoryResource())
        assert other.tobytes() == data
        other.close()
    assert {entry[0] for entry in _staging._sets.values()} == {_hip.get_runtime(), rt}
    assert first.tobytes() == data
    first.close()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [_staging.THRESHOLD, _staging.TO_HOST_THRESHOLD,
                               _staging.TO_HOST_THRESHOLD + 3 * _staging.CHUNK + 4097,
                               256 << 20])
def test_staged_copies_on_a_gpu_match_the_runtimes(gpu_runtime, n):
    import numpy
    data = numpy.random.default_rng(n).integers(0, 256, n, dtype=numpy.uint8)
    mr = hmr.AsyncMemoryResource()
    staged = hmr.Buffer.from_host(data, resource=mr)
    plain = hmr.Buffer(n, resource=mr)
    plain.copy_from_device(staged)
    assert plain.tobytes() == data.tobytes()
    out = numpy.zeros(n, numpy.uint8)
    staged.copy_to_host(out)
    assert (out == data).all()
    with hmr.Stream() as s:
        own = hmr.Buffer(n, resource=mr, stream=s)
        own.memset(0xA5, stream=s)
        assert own.tobytes() == b"\xa5" * n    # ordered after the memset on its stream
        own.close()
    staged.close()
    plain.close()


def test_the_default_number_of_pipelines_is_half_the_cpus_up_to_four():
    assert [_staging._default_workers(n) for n in (1, 2, 3, 5, 8, 16, 128)] == [
        1, 1, 1, 2, 4, 4, 4]
    assert 1 <= _staging.WORKERS <= 4

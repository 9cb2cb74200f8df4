"""Stream-ordered free lists are keyed by the stream's real identity: the per-thread stream
(handle 2) is another stream in every thread, and the null stream (handle 0) of device 0 is
not that of device 1.  A block freed on one is handed to another only after an ordering step
(an event wait, or a device-wide wait where no event can be recorded)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support import REPO


import hipmr_ctypes as hmr
from hipmr_ctypes import _stream_order

from support import no_crash, run_in_thread

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("stream_identity_cases")

PER_THREAD = 2


def _spy(monkeypatch):
    """Count the ordering steps the sub-allocators take."""
    seen = []
    real_record, real_wait = _stream_order.record_or_synchronize, _stream_order.wait_event
    real_sync = _stream_order.DeviceWait.synchronize
    monkeypatch.setattr(_stream_order, "record_or_synchronize",
                        lambda ev, s: seen.append("record") or real_record(ev, s))
    monkeypatch.setattr(_stream_order, "wait_event", lambda st, ev: seen.append("wait") or
                        real_wait(st, ev))
    monkeypatch.setattr(_stream_order.DeviceWait, "synchronize",
                        lambda self: seen.append("device-wait") or real_sync(self))
    return seen


def _in_thread(fn):
    return run_in_thread(fn)[1]


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
def test_per_thread_stream_blocks_are_not_shared_between_threads(emulator, monkeypatch, kind):
    up = hmr.AsyncMemoryResource()
    r = hmr.PoolResource(up) if kind == "PoolResource" else hmr.FixedSizeResource(up, 4096, 4)
    seen = _spy(monkeypatch)
    # thread A allocates and frees on its per-thread stream
    a = _in_thread(lambda: r.deallocate_async(
        p := r.allocate_async(1000, 256, PER_THREAD), 1000, 256, PER_THREAD) or p)
    seen.clear()
    # thread B asks for the same size on its own per-thread stream
    b = _in_thread(lambda: r.allocate_async(1000, 256, PER_THREAD))
    assert b != a or seen, "a block freed on thread A's per-thread stream was handed to " \
                           "thread B's per-thread stream with no ordering step"
    _in_thread(lambda: r.deallocate_async(b, 1000, 256, PER_THREAD))
    r.release()


def test_the_same_thread_reuses_its_per_thread_block_at_once(emulator, monkeypatch):
    r = hmr.PoolResource(hmr.AsyncMemoryResource())
    seen = _spy(monkeypatch)

    def work():
        p = r.allocate_async(1000, 256, PER_THREAD)
        r.deallocate_async(p, 1000, 256, PER_THREAD)
        seen.clear()
        q = r.allocate_async(1000, 256, PER_THREAD)
        r.deallocate_async(q, 1000, 256, PER_THREAD)
        return p == q and not seen

    assert _in_thread(work)


def test_the_key_of_the_special_streams():
    from hipmr_ctypes._stream_order import handle_of, stream_key
    assert stream_key(12345) == 12345
    mine = stream_key(PER_THREAD)
    other = _in_thread(lambda: stream_key(PER_THREAD))
    assert mine != other and handle_of(mine) == handle_of(other) == PER_THREAD
    assert stream_key(0) == _in_thread(lambda: stream_key(0))  # one null stream per device


TWO_DEVICES = textwrap.dedent("""
    import hipmr_ctypes as hmr
    from hipmr_ctypes import _stream_order
    seen = []
    real = _stream_order.record_or_synchronize
    _stream_order.record_or_synchronize = lambda ev, s: seen.append(s) or real(ev, s)
    for kind in ("pool", "fixed"):
        with hmr.Device(0):
            base = hmr.AsyncMemoryResource(device=0)
        r = hmr.PoolResource(base) if kind == "pool" else hmr.FixedSizeResource(base, 4096, 4)
        with hmr.Device(0):
            p = r.allocate_async(1000, 256, 0)
            r.deallocate_async(p, 1000, 256, 0)      # freed on device 0's null stream
        seen.clear()
        with hmr.Device(1):
            q = r.allocate_async(1000, 256, 0)       # device 1's null stream
        assert q != p or seen, (kind, "device 0's null stream was taken for device 1's")
        with hmr.Device(1):
            r.deallocate_async(q, 1000, 256, 0)
        r.release()
    print("ok")
""")


def test_the_null_streams_of_two_devices_are_two_streams():
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", TWO_DEVICES], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=120)
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-3000:]


@pytest.mark.gpu
def test_per_thread_streams_on_a_gpu(gpu_runtime, monkeypatch):
    """The same on a real GPU: thread B's per-thread stream never gets thread A's block
    without an ordering step, and the memory it gets holds what B writes."""
    r = hmr.PoolResource(hmr.AsyncMemoryResource())
    seen = _spy(monkeypatch)

    def a():
        b = hmr.Buffer.from_host(b"a" * 4096, resource=r, stream=PER_THREAD)
        p = b.ptr
        b.close()
        return p

    pa = _in_thread(a)
    seen.clear()

    def b():
        buf = hmr.Buffer.from_host(b"b" * 4096, resource=r, stream=PER_THREAD)
        ok = buf.tobytes() == b"b" * 4096
        p = buf.ptr
        buf.close()
        return p, ok

    pb, ok = _in_thread(b)
    assert ok and (pb != pa or seen)
    r.release()


def test_the_key_function_follows_the_loaded_runtime():
    """``stream_keys()`` is made again for another runtime: with two devices visible the null
    stream's key names the current device (read in each thread on its own), with one it is
    the handle."""
    from hipmr_ctypes import _hip
    from hipmr_ctypes._stream_order import stream_key, stream_keys
    from support import process_runtime
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(two):
        keys = stream_keys()
        assert stream_keys() is keys
        assert keys(0) == stream_key(0) == (0, 0, 0) and keys(1) == (1, 0, 0)
        assert keys(77) == 77
        with hmr.Device(1):
            assert keys(0) == (0, 1, 0)
            assert _in_thread(lambda: keys(0)) == (0, 0, 0)   # a new thread starts on device 0
            mine = keys(PER_THREAD)
            assert mine[:2] == (PER_THREAD, 1) and _in_thread(lambda: keys(PER_THREAD)) != mine
    one = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1"})
    with process_runtime(one):
        assert stream_keys() is not keys
        assert stream_key(0) == 0 and stream_key(1) == 1


@pytest.mark.amd_library
def test_the_device_reader_calls_the_real_library_as_declared(amd_runtime):
    """The key function's cheap ``hipGetDevice`` (a prototype without argument conversion)
    gives what the declared function gives: with no AMD GPU, the same
    status; on a GPU machine, the same device."""
    import ctypes
    from hipmr_ctypes.device import _device_reader
    fn = amd_runtime.fn.hipGetDevice
    read = _device_reader(fn)
    assert read is not fn
    fn(ctypes.c_int())   # the first call may answer otherwise (libamdhip64 5.7: 101, then 100)
    a, b = ctypes.c_int(-7), ctypes.c_int(-7)
    assert read(ctypes.byref(a)) == fn(b)
    assert a.value == b.value


@pytest.mark.gpu
def test_the_device_reader_on_a_gpu(gpu_runtime):
    import ctypes
    from hipmr_ctypes.device import _device_reader
    read = _device_reader(gpu_runtime.fn.hipGetDevice)
    out = ctypes.c_int(-1)
    for device in range(hmr.device_count()):
        with hmr.Device(device):
            assert read(ctypes.byref(out)) == 0 and out.value == device


def test_with_two_devices_the_null_stream_keeps_its_fast_path():
    """With several devices visible the null and legacy handles are not their own keys: the
    pool's fast paths find their free lists through the calling thread's current device
    (``pool._Keyed``), without the checked path, and keep the devices apart."""
    from hipmr_ctypes import _hip
    from support import process_runtime
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(two):
        pool = hmr.PoolResource(hmr.AsyncMemoryResource(device=0))
        arena = pool._arena
        ptrs = {}
        for device in (0, 1):
            with hmr.Device(device):
                ptrs[device] = pool.allocate_async(512, 256, 0)
                pool.deallocate_async(ptrs[device], 512, 256, 0)
        slow = []
        real = arena.allocate_slow, arena.deallocate_slow
        arena.allocate_slow = lambda *a: slow.append(a) or real[0](*a)
        arena.deallocate_slow = lambda *a: slow.append(a) or real[1](*a)
        pool._bind(arena)   # the fast paths again, over the spies
        for device in (0, 1, 0, 1):
            with hmr.Device(device):
                assert pool.allocate_async(512, 256, 0) == ptrs[device]
                pool.deallocate_async(ptrs[device], 512, 256, 0)
        assert slow == []
        pool.release()


def test_wait_all_closes_every_event_also_when_a_wait_raises():
    """``wait_all`` is the host's wait for fresh events: each one is closed, whether the waits
    all succeed or one of them raises (the error comes through)."""
    from hipmr_ctypes._stream_order import wait_all

    class Event:
        def __init__(self, fails=False):
            self.fails, self.waited, self.closed = fails, False, False

        def synchronize(self):
            if self.fails:
                raise RuntimeError("sticky error")
            self.waited = True

        def close(self):
            self.closed = True

    events = [Event(), Event()]
    wait_all(events)
    assert all(e.waited and e.closed for e in events)
    events = [Event(), Event(fails=True), Event()]
    with pytest.raises(RuntimeError, match="sticky"):
        wait_all(events)
    assert [e.waited for e in events] == [True, False, False]
    assert all(e.closed for e in events)


def test_the_stream_order_has_one_home():
    """The stream keys and the ordering live in ``_stream_order`` only; ``stream`` keeps the
    owning objects and ``event_for``, and the adaptors import no alias of either."""
    from hipmr_ctypes import stream
    from hipmr_ctypes.adaptors import fixed_size, pool
    for name in ("stream_key", "stream_keys", "handle_of", "is_foreign", "DeviceWait",
                 "device_of", "record_or_synchronize", "LAST_SPECIAL_HANDLE", "SYNC"):
        assert hasattr(_stream_order, name) and not hasattr(stream, name), name
    assert _stream_order.event_for is stream.event_for
    assert pool.StreamOrder is fixed_size.StreamOrder is _stream_order.StreamOrder
    with pytest.raises(ImportError):
        __import__("hipmr_ctypes.adaptors._order")


def _alive_thread(work):
    """Run ``work()`` in a thread that stays alive until the returned ``finish()``; returns
    (its result, finish)."""
    import threading
    out, done = {}, threading.Event()

    def body():
        try:
            out["value"] = work()
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc
        out["ready"] = True
        done.wait(60)

    t = threading.Thread(target=body)
    t.start()
    while "ready" not in out:
        t.join(0.001)
    if "error" in out:
        raise out["error"]

    def finish():
        done.set()
        t.join()

    return out.get("value"), finish


def test_a_thread_that_moved_its_own_blocks_recorded_an_event_for_them(emulator, monkeypatch):
    """Thread A frees on its per-thread stream, then its own slow path moves its free lists
    into the shared structure (a request that nothing cached fits): it records an event on its
    stream for them, so thread B's per-thread stream waits for that event, not for the whole
    device."""
    r = hmr.PoolResource(hmr.AsyncMemoryResource())
    seen = _spy(monkeypatch)

    def a():
        p = r.allocate_async(1000, 256, PER_THREAD)
        r.deallocate_async(p, 1000, 256, PER_THREAD)
        big = r.allocate_async(4 << 20, 256, PER_THREAD)   # flushes A's lists, then grows
        return p, big

    (p, big), finish = _alive_thread(a)
    try:
        tags = [t for t in r._arena.ftag.values() if t]
        assert tags and all(type(e) is _stream_order.Recorded for t in tags for e in t)
        seen.clear()
        q = _in_thread(lambda: r.allocate_async(1000, 256, PER_THREAD))
        assert "wait" in seen and "device-wait" not in seen, seen
        _in_thread(lambda: r.deallocate_async(q, 1000, 256, PER_THREAD))
    finally:
        finish()
    _in_thread(lambda: r.deallocate_async(big, 4 << 20, 256, PER_THREAD))
    r.release()


def test_blocks_another_live_thread_freed_still_wait_for_the_device(emulator, monkeypatch):
    """Thread B moving thread A's free lists cannot record on A's per-thread stream: while A
    lives, a block of them reaches B's stream after a device-wide wait."""
    r = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 20)

    def a():
        p = r.allocate_async(1 << 20, 256, PER_THREAD)   # the whole initial chunk
        r.deallocate_async(p, 1 << 20, 256, PER_THREAD)
        return p

    p, finish = _alive_thread(a)
    try:
        seen = _spy(monkeypatch)
        q = _in_thread(lambda: r.allocate_async(1000, 256, PER_THREAD))
        assert q == p and "device-wait" in seen, seen
        _in_thread(lambda: r.deallocate_async(q, 1000, 256, PER_THREAD))
    finally:
        finish()
    r.release()


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
def test_blocks_of_a_thread_that_ended_need_no_wait(emulator, monkeypatch, kind):
    """A thread that used its per-thread stream with a sub-allocator waits for that stream as
    it ends: what it freed there is then clean, and another thread's stream takes it with no
    ordering step at all."""
    up = hmr.AsyncMemoryResource()
    r = (hmr.PoolResource(up, initial_pool_size=1 << 20) if kind == "PoolResource"
         else hmr.FixedSizeResource(up, 4096, 4))
    waited = []
    real = hmr.Device.synchronize
    seen = _spy(monkeypatch)
    monkeypatch.setattr(hmr.Device, "synchronize", lambda self: waited.append(1) or real(self))

    # thread A takes all the memory there is (the pool's chunk; the fixed-size chunk's four
    # blocks) and frees it on its per-thread stream
    sizes = [1 << 20] if kind == "PoolResource" else [4000] * 4

    def a():
        ps = [r.allocate_async(n, 256, PER_THREAD) for n in sizes]
        for p, n in zip(ps, sizes):
            r.deallocate_async(p, n, 256, PER_THREAD)
        return ps

    ps = _in_thread(a)            # joined: it has ended
    seen.clear()
    q = _in_thread(lambda: r.allocate_async(4000, 256, PER_THREAD))
    assert q in ps and "device-wait" not in seen and "wait" not in seen and not waited, seen
    _in_thread(lambda: r.deallocate_async(q, 4000, 256, PER_THREAD))
    r.release()


OWN_FLUSH_ON_ANOTHER_DEVICE = textwrap.dedent("""
    import threading
    import hipmr_ctypes as hmr
    from hipmr_ctypes import _stream_order
    made = []
    real = _stream_order.Recorded.__init__

    def spy(self, key, event):
        made.append((key, event.device, hmr.get_device()))
        real(self, key, event)

    _stream_order.Recorded.__init__ = spy
    with hmr.Device(1):
        pool = hmr.PoolResource(hmr.AsyncMemoryResource(device=1))

    def a():
        with hmr.Device(1):
            p = pool.allocate_async(1000, 256, 2)    # device 1's per-thread stream
            pool.deallocate_async(p, 1000, 256, 2)
        with hmr.Device(0):
            pool.release()   # this thread moves its own lists while device 0 is current

    t = threading.Thread(target=a)
    t.start()
    t.join()
    # the chunk's (device 1 current) and the moved lists' (device 0 current), both on device 1
    assert all(key[:2] == (2, 1) and device == 1 for key, device, _ in made), made
    assert [current for _, _, current in made] == [1, 0], made
    print("ok")
""")


def test_the_event_for_a_threads_own_blocks_is_recorded_on_their_device():
    """With two devices, a thread that moves the blocks it freed on device 1's per-thread
    stream while device 0 is current records their event on device 1 (where the event and
    the stream are), not on the current device's stream (which the runtime refuses)."""
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", OWN_FLUSH_ON_ANOTHER_DEVICE],
                          capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120)
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-3000:]

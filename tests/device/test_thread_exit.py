"""A thread that allocated on its per-thread stream waits for that stream when it ends.

CUDA 13's driver hangs the exit of a thread whose per-thread stream still has work queued after
a stream-ordered allocation, and every other thread's next runtime call with it
(docs/internals.md, "Thread exit").  ``AsyncMemoryResource`` arms a guard on every allocation
on the per-thread stream; the guard synchronizes that stream, on each device allocated on, in
the ending thread before ``Thread.join`` returns.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip

from support import REPO, no_crash, process_runtime, run_in_thread

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("stream_identity_cases")

PER_THREAD = 2


def _spy_syncs(monkeypatch, rt):
    """Record (thread, current device, handle) of every hipStreamSynchronize."""
    calls = []
    real = rt.fn.hipStreamSynchronize

    def sync(handle):
        calls.append((threading.get_ident(), hmr.get_device(), int(handle or 0)))
        return real(handle)
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", sync)
    return calls


_run = run_in_thread   # (the thread's ident, fn's result) once join returned


@pytest.mark.parametrize("stream", [PER_THREAD, hmr.stream_per_thread], ids=["int", "stream_ref"])
def test_the_ending_thread_waits_for_its_per_thread_stream(emulator, monkeypatch, stream):
    rt = _hip.get_runtime()
    r = hmr.AsyncMemoryResource()
    syncs = _spy_syncs(monkeypatch, rt)

    def work():
        ptr = r.allocate_async(4096, 256, stream)
        before = list(syncs)
        r.deallocate_async(ptr, 4096, 256, stream)
        return before

    ident, before = _run(work)
    assert before == []                      # nothing waits while the thread runs
    assert syncs == [(ident, 0, PER_THREAD)]  # once, in the ending thread, before join returned


def test_threads_that_did_not_allocate_on_it_do_not_wait(emulator, monkeypatch):
    rt = _hip.get_runtime()
    r = hmr.AsyncMemoryResource()
    syncs = _spy_syncs(monkeypatch, rt)
    with hmr.Stream() as s:
        _run(lambda: r.deallocate_async(r.allocate_async(64, 256, s), 64, 256, s))
    _run(lambda: r.deallocate_async(r.allocate_async(64, 256, 0), 64, 256, 0))
    # a free on the per-thread stream queues no allocation
    ptr = r.allocate_async(64, 256, 0)
    _run(lambda: r.deallocate_async(ptr, 64, 256, PER_THREAD))
    assert syncs == []


def test_every_thread_is_armed_not_only_the_first(emulator, monkeypatch):
    """The per-thread handle is never remembered as the last validated stream (that test is
    the same in every thread and would skip the guard)."""
    rt = _hip.get_runtime()
    r = hmr.AsyncMemoryResource()
    syncs = _spy_syncs(monkeypatch, rt)
    idents = []
    for stream in (PER_THREAD, PER_THREAD, hmr.stream_per_thread, hmr.stream_per_thread):
        ident, ptr = _run(lambda: r.allocate_async(256, 256, stream))
        idents.append(ident)
        r.deallocate_async(ptr, 256, 256, 0)
    assert [s[0] for s in syncs] == idents
    assert r._stream != PER_THREAD


def test_through_a_pool_and_a_buffer(emulator, monkeypatch):
    """The pool's upstream allocation on the per-thread stream arms it (a block the pool
    already holds queues no allocation)."""
    rt = _hip.get_runtime()
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    syncs = _spy_syncs(monkeypatch, rt)

    def work():
        buf = hmr.Buffer.from_host(b"x" * 4096, resource=pool, stream=PER_THREAD)
        buf.memset(1)
        buf.close()
    ident, _ = _run(work)
    assert (ident, 0, PER_THREAD) in syncs
    pool.release()


def test_each_device_allocated_on_is_waited_for(monkeypatch):
    """With several devices, the per-thread stream of every device the thread allocated on
    (that device current), and the thread's device is restored after."""
    two = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "3"})
    with process_runtime(two):
        syncs = _spy_syncs(monkeypatch, two)
        r0 = hmr.AsyncMemoryResource(device=0)
        r2 = hmr.AsyncMemoryResource(device=2)
        sets = []
        real_set = two.fn.hipSetDevice
        monkeypatch.setattr(two.fn, "hipSetDevice",
                            lambda d: sets.append((threading.get_ident(), d)) or real_set(d))

        def work():
            with hmr.Device(2):
                p2 = r2.allocate_async(64, 256, PER_THREAD)
                p0 = r0.allocate_async(64, 256, PER_THREAD)  # on device 2's stream too
            p = r0.allocate_async(64, 256, PER_THREAD)        # device 0's
            for ptr, r in ((p2, r2), (p0, r0), (p, r0)):
                r.deallocate_async(ptr, 64, 256, 0)
            del sets[:]
        ident, _ = _run(work)
        assert syncs == [(ident, 2, PER_THREAD), (ident, 0, PER_THREAD)]
        assert sets == [(ident, 2), (ident, 0)]   # to device 2, then back to 0


def test_a_failing_wait_at_thread_exit_is_silent(emulator, monkeypatch, capfd):
    rt = _hip.get_runtime()
    r = hmr.AsyncMemoryResource()

    def boom(handle):
        raise RuntimeError("runtime gone")
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", boom)
    _run(lambda: r.deallocate_async(r.allocate_async(64, 256, PER_THREAD), 64, 256, 0))
    assert capfd.readouterr().err == ""


def test_a_runtime_replaced_in_the_thread(monkeypatch):
    """Allocations on two runtimes in one thread: each runtime's stream is waited for."""
    one = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1"})
    other = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1"})
    seen = []
    for rt in (one, other):
        real = rt.fn.hipStreamSynchronize
        monkeypatch.setattr(rt.fn, "hipStreamSynchronize",
                            lambda h, rt=rt, real=real: seen.append(rt) or real(h))

    def work():
        for rt in (one, other):
            with process_runtime(rt):
                r = hmr.AsyncMemoryResource()
                r.deallocate_async(r.allocate_async(64, 256, PER_THREAD), 64, 256, 0)
    _run(work)
    assert seen == [one, other]


def test_a_runtime_replaced_in_a_thread_that_goes_on_does_not_end_it(monkeypatch):
    """The guard of the first runtime waits as the second one replaces it, but the thread
    goes on: its per-thread stream key is not taken for one of a thread that ended (which
    would make the blocks it frees later count as clean), until the thread does end."""
    from hipmr_ctypes import _stream_order
    one = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1"})
    other = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "1"})

    def work():
        token = _stream_order._thread_token()
        for rt in (one, other):
            with process_runtime(rt):
                pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 20)
                p = pool.allocate_async(64, 256, PER_THREAD)
                pool.deallocate_async(p, 64, 256, PER_THREAD)   # notes the key: arms
                assert token not in _stream_order._finished
        return token
    _, token = _run(work)
    assert token in _stream_order._finished   # ended, having waited


GPU_SCRIPT = textwrap.dedent("""
    import threading, hipmr_ctypes as hmr
    r = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    def a(res):
        buf = hmr.Buffer.from_host(b"a" * 65536, resource=res, stream=hmr.stream_per_thread)
        buf.memset(7)            # more work after the allocation, not waited for
        del buf                  # freed to the pool; the thread ends with the work queued
    def b():
        hmr.get_device()
        hmr.Buffer(256, resource=r, stream=0).close()
    for i in range(20):
        for target, args in ((a, (r,)), (a, (pool,)), (b, ())):
            t = threading.Thread(target=target, args=args)
            t.start(); t.join(30)
            assert not t.is_alive(), f"round {i}: {target.__name__} hung"
    print("ok")
""")


@pytest.mark.gpu
def test_threads_ending_with_queued_work_do_not_hang_on_a_gpu(gpu_runtime):
    """The driver hang this guards against: threads that allocate on their per-thread stream
    and end with work queued after it, followed by another thread's runtime calls (the
    process is killed after 120 s if it hangs)."""
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", GPU_SCRIPT], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=120)
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-3000:]


EXIT_SCRIPT = textwrap.dedent("""
    import threading, time, hipmr_ctypes as hmr
    r = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    kept = [hmr.Buffer.from_host(b"m" * 4096, resource=r, stream=hmr.stream_per_thread)]
    started = threading.Event()
    def daemon():                     # still running at exit, its guard armed
        kept.append(hmr.Buffer.from_host(b"d" * 4096, resource=pool,
                                         stream=hmr.stream_per_thread))
        started.set()
        while True:
            time.sleep(0.01)
    threading.Thread(target=daemon, daemon=True).start()
    assert started.wait(30)
    def ending():                     # ends while the interpreter shuts down
        time.sleep(0.2)
        hmr.Buffer.from_host(b"e" * 4096, resource=r, stream=hmr.stream_per_thread).memset(1)
    threading.Thread(target=ending).start()
    print("ok")
""")


def test_guards_at_interpreter_exit():
    """The main thread's guard (waited for in the package's atexit hook), a daemon thread's
    (never waits: the finalizing thread clears it, and waits only in the thread that armed
    it) and a thread that ends during shutdown: the process exits cleanly, with nothing on
    stderr."""
    env = dict(os.environ, PYTHONWARNINGS="default")
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=120)
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == "ok\n" and proc.stderr == "", proc.stderr


@pytest.mark.gpu
def test_guards_at_interpreter_exit_on_a_gpu(gpu_runtime):
    env = dict(os.environ, PYTHONWARNINGS="default")
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=120)
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == "ok\n" and proc.stderr == "", proc.stderr

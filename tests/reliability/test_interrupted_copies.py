"""A copy interrupted by a signal handler that raises (Ctrl-C's ``KeyboardInterrupt``, or any
other exception) touches no caller memory after it raised: the staged copies' pipelines stop
and are waited for, and so is every queued async copy, before the exception leaves the call.

On the emulated platform with three pipelines of small chunks, a real signal
(``signal.pthread_kill`` of the main thread, whose handler raises) lands at each place the
calling thread waits: between its own pipeline's chunks, while it waits for the other
pipelines, at the stream's synchronization, and a second one while it waits after the first.
Every CPU copy of the pipelines is logged; none may happen after the call raised, and the
caller's destination must not change afterwards.  The GPU test does the same on a real
runtime."""
import signal
import threading
import time
import types

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._buffer import staging as _staging

pytestmark = pytest.mark.reliability("copy_ownership_cases")

CHUNK = 4096
N = 12 * CHUNK          # three parts of four chunks


class Interrupt(Exception):
    """What the test's signal handler raises."""


@pytest.fixture
def interrupts(monkeypatch):
    """SIGUSR1's handler raises Interrupt (in the main thread, as Python runs handlers)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")

    def handler(signum, frame):
        raise Interrupt(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    yield lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, old)


@pytest.fixture
def staged(monkeypatch):
    """Three pipelines over small chunks, a set table of the test's own (closed after)."""
    monkeypatch.setattr(_staging, "CHUNK", CHUNK)
    for name in ("THRESHOLD", "TO_HOST_THRESHOLD", "TO_EXISTING_HOST_THRESHOLD"):
        monkeypatch.setattr(_staging, name, 2 * CHUNK)
    monkeypatch.setattr(_staging, "WORKERS", 3)
    monkeypatch.setattr(_staging, "MIN_PART", CHUNK)
    sets = {}
    monkeypatch.setattr(_staging, "_sets", sets)
    yield sets
    for _, made in sets.values():
        for one in made:
            assert not one.lock.locked()     # every set was given back
            one.close()


class Log:
    """The pipelines' CPU copies, logged; worker threads' copies are slow (so that they are
    still running when the calling thread is interrupted); ``left`` marks the raise."""

    def __init__(self, monkeypatch, on_main_chunk=None, delay=0.02, gate=None):
        self.copies = []
        self.after = []
        self.left = False
        self.main_chunks = 0
        real = _staging._memmove
        main = threading.main_thread()

        def memmove(dst, src, m):
            if self.left:
                self.after.append((threading.current_thread().name, dst, m))
            if threading.current_thread() is main:
                self.main_chunks += 1
                if on_main_chunk is not None:
                    on_main_chunk(self.main_chunks)
            elif gate is not None:   # workers hold on until the test's signals were sent
                gate.wait(10)
            else:
                time.sleep(delay)
            self.copies.append((threading.current_thread().name, dst, m))
            return real(dst, src, m)

        monkeypatch.setattr(_staging, "_memmove", memmove)

    def settle(self):
        """Wait long enough for any copy still running to show up in ``after``."""
        time.sleep(0.3)


def _pattern(n, seed=1):
    cycle = bytes((i * 7 + seed) & 0xFF for i in range(251))
    return (cycle * (n // 251 + 1))[:n]


def _operations():
    """(name, setup, call, what the caller's memory must still be afterwards)."""

    def to_device(buf):
        src = bytearray(_pattern(N, 3))
        return (lambda: buf.copy_from_host(src)), None

    def to_existing_host(buf):
        out = bytearray(N)
        return (lambda: buf.copy_to_host(out)), out

    def to_host(buf):
        return (lambda: buf.tobytes()), None

    def fresh(buf):
        return (lambda: buf.copy_to_host()), None

    return {"copy_from_host": to_device, "copy_to_host(out)": to_existing_host,
            "tobytes": to_host, "copy_to_host()": fresh}


OPERATIONS = _operations()


def _run(buf, op, log):
    call, out = OPERATIONS[op](buf)
    with pytest.raises(Interrupt):
        call()
    log.left = True
    snapshot = None if out is None else bytes(out)
    log.settle()
    assert log.after == [], "a pipeline copied after the call raised"
    if out is not None:
        assert bytes(out) == snapshot, "the caller's destination changed after the raise"
    return call


def _after_the_interrupt_the_next_copy_is_exact(buf):
    buf.copy_from_host(_pattern(N, 9))
    assert buf.tobytes() == _pattern(N, 9)
    out = bytearray(N)
    buf.copy_to_host(out)
    assert bytes(out) == _pattern(N, 9)


@pytest.mark.parametrize("op", list(OPERATIONS))
def test_an_interrupt_between_the_callers_own_chunks(staged, interrupts, monkeypatch, op):
    """The calling thread runs the first pipeline: the signal lands after its second chunk."""
    def on_main_chunk(k):
        if k == 2:   # once another pipeline has copied too (however loaded the machine)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                    name != "MainThread" for name, _, _ in log.copies):
                time.sleep(0.005)
            interrupts()

    buf = hmr.Buffer.from_host(_pattern(N), resource=hmr.AsyncMemoryResource())
    log = Log(monkeypatch, on_main_chunk=on_main_chunk)
    _run(buf, op, log)
    assert any(name != "MainThread" for name, _, _ in log.copies)   # several pipelines ran
    log.left = False
    _after_the_interrupt_the_next_copy_is_exact(buf)
    buf.close()


@pytest.mark.parametrize("op", list(OPERATIONS))
@pytest.mark.parametrize("signals", [1, 2])
def test_an_interrupt_while_the_caller_waits_for_the_other_pipelines(
        staged, interrupts, monkeypatch, op, signals):
    """The calling thread has done its part and waits for the slow workers: the signal
    interrupts that wait (a second one interrupts the wait that follows)."""

    # the workers wait until every signal was sent, so that however loaded the machine, each
    # signal lands while the caller still waits for them (never after the call raised)
    gate = threading.Event()

    def on_main_chunk(k):
        if k == 4:      # the caller's last chunk: it waits for the workers next
            def kick():
                for _ in range(signals):
                    interrupts()
                    time.sleep(0.01)
                time.sleep(0.05)
                gate.set()
            threading.Timer(0.01, kick).start()

    buf = hmr.Buffer.from_host(_pattern(N), resource=hmr.AsyncMemoryResource())
    log = Log(monkeypatch, on_main_chunk=on_main_chunk, gate=gate)
    _run(buf, op, log)
    log.left = False
    _after_the_interrupt_the_next_copy_is_exact(buf)
    buf.close()


@pytest.mark.parametrize("op", list(OPERATIONS))
def test_an_interrupt_at_the_streams_synchronization(staged, interrupts, monkeypatch, op):
    """The signal lands at the final wait for the stream: the wait is made again, and the
    interrupt raised after it."""
    rt = _hip.get_runtime()
    real = rt.fn.hipStreamSynchronize
    done = []
    fired = []

    def synchronize(stream):
        if log.copies and not fired:
            fired.append(True)
            interrupts()
        status = real(stream)
        done.append(stream)
        return status

    buf = hmr.Buffer.from_host(_pattern(N), resource=hmr.AsyncMemoryResource())
    log = Log(monkeypatch, delay=0.0)
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", synchronize)
    _run(buf, op, log)
    assert fired and done      # the synchronization ran to its end
    monkeypatch.setattr(rt.fn, "hipStreamSynchronize", real)
    log.left = False
    _after_the_interrupt_the_next_copy_is_exact(buf)
    buf.close()


def _threads(monkeypatch, thread_class):
    """``_staging`` starts its pipeline threads from ``thread_class``."""
    monkeypatch.setattr(_staging, "threading", types.SimpleNamespace(
        Thread=thread_class, RLock=threading.RLock, Event=threading.Event,
        Lock=threading.Lock))


def test_a_pipeline_thread_slow_to_begin_still_copies_its_part(staged, monkeypatch):
    """The caller may finish its own part before another pipeline's thread has begun: it
    waits for that thread, which then copies its part (nothing is skipped)."""

    class Late(threading.Thread):
        def run(self):
            time.sleep(0.1)
            super().run()

    buf = hmr.Buffer(N, resource=hmr.AsyncMemoryResource())
    log = Log(monkeypatch, delay=0.0)
    _threads(monkeypatch, Late)
    buf.copy_from_host(_pattern(N, 5))
    assert buf.tobytes() == _pattern(N, 5)
    out = bytearray(N)
    buf.copy_to_host(out)
    assert bytes(out) == _pattern(N, 5)
    assert {name for name, _, _ in log.copies} != {"MainThread"}
    buf.close()


@pytest.mark.parametrize("begun", [False, True])
def test_an_interrupt_while_a_pipeline_thread_is_started(staged, monkeypatch, begun):
    """The interrupt lands inside ``Thread.start()``: before the thread exists, or once it
    exists but has not begun its part.  The copy raises, and the thread (if any) copies
    nothing afterwards."""

    class Interrupted(threading.Thread):
        def run(self):
            time.sleep(0.1)
            super().run()

        def start(self):
            if begun:
                super().start()
            raise Interrupt("in start()")

    buf = hmr.Buffer.from_host(_pattern(N), resource=hmr.AsyncMemoryResource())
    log = Log(monkeypatch, delay=0.0)
    _threads(monkeypatch, Interrupted)
    for op in OPERATIONS:
        log.left = False
        _run(buf, op, log)
    monkeypatch.setattr(_staging, "threading", threading)
    log.left = False
    _after_the_interrupt_the_next_copy_is_exact(buf)
    buf.close()


def test_an_interrupted_async_copy_on_the_buffers_stream_is_waited_for(interrupts,
                                                                       monkeypatch):
    """A copy the runtime makes (not staged) on a buffer's own stream: an interrupt after
    the async copy was queued still waits for the stream before it leaves."""
    rt = _hip.get_runtime()
    real = rt.fn.hipStreamSynchronize
    order = []

    def copy_async(*args):
        order.append("queued")
        interrupts()
        return real_copy(*args)

    def synchronize(stream):
        order.append("synchronized")
        return real(stream)

    real_copy = rt.fn.hipMemcpyAsync
    with hmr.Stream() as s:
        buf = hmr.Buffer(64, resource=hmr.AsyncMemoryResource(), stream=s)
        monkeypatch.setattr(rt.fn, "hipMemcpyAsync", copy_async)
        monkeypatch.setattr(rt.fn, "hipStreamSynchronize", synchronize)
        with pytest.raises(Interrupt):
            buf.copy_from_host(b"x" * 64)
        assert order[-1] == "synchronized"
        order.clear()
        with pytest.raises(Interrupt):
            buf.copy_to_host(bytearray(64))
        assert order[-1] == "synchronized"
        monkeypatch.setattr(rt.fn, "hipMemcpyAsync", real_copy)
        monkeypatch.setattr(rt.fn, "hipStreamSynchronize", real)
        buf.copy_from_host(b"y" * 64)
        assert buf.tobytes() == b"y" * 64
        buf.close()


@pytest.mark.parametrize("call", ["tobytes", "copy_to_host()", "copy_to_host(out)",
                                  "copy_from_host"])
def test_an_interrupted_copy_on_a_callers_stream_is_waited_for_before_it_raises(
        interrupts, monkeypatch, call):
    """A copy on a stream the caller passed is asynchronous; but when the call raises (the
    interrupt lands after the copy was queued), the caller never gets the fresh destination
    and does not know the copy was queued: the stream is waited for before the raise."""
    rt = _hip.get_runtime()
    real_copy, real_sync = rt.fn.hipMemcpyAsync, rt.fn.hipStreamSynchronize
    order = []

    def copy_async(*args):
        order.append("queued")
        interrupts()
        return real_copy(*args)

    def synchronize(stream):
        order.append("synchronized")
        return real_sync(stream)

    with hmr.Stream() as s:
        buf = hmr.Buffer.from_host(b"z" * 64, resource=hmr.AsyncMemoryResource())
        calls = {"tobytes": lambda: buf.tobytes(stream=s),
                 "copy_to_host()": lambda: buf.copy_to_host(stream=s),
                 "copy_to_host(out)": lambda: buf.copy_to_host(bytearray(64), stream=s),
                 "copy_from_host": lambda: buf.copy_from_host(b"w" * 64, stream=s)}
        monkeypatch.setattr(rt.fn, "hipMemcpyAsync", copy_async)
        monkeypatch.setattr(rt.fn, "hipStreamSynchronize", synchronize)
        with pytest.raises(Interrupt):
            calls[call]()
        assert order[0] == "queued" and order[-1] == "synchronized"
        monkeypatch.setattr(rt.fn, "hipMemcpyAsync", real_copy)
        order.clear()
        if call == "tobytes":   # the interrupt at the wait itself: waited for again
            def interrupted_once(stream):
                order.append("synchronized")
                if len(order) == 1:
                    interrupts()
                return real_sync(stream)
            monkeypatch.setattr(rt.fn, "hipStreamSynchronize", interrupted_once)
            with pytest.raises(Interrupt):
                buf.tobytes(stream=s)
            assert order == ["synchronized", "synchronized"]
        monkeypatch.setattr(rt.fn, "hipStreamSynchronize", real_sync)
        buf.close()


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(OPERATIONS))
def test_an_interrupted_staged_copy_on_a_gpu_touches_nothing_afterwards(
        gpu_runtime, interrupts, monkeypatch, op):
    """The same on a real runtime, with the real chunk size and at least two pipelines: the
    signal lands while the caller waits for the other pipelines."""
    monkeypatch.setattr(_staging, "WORKERS", max(2, _staging.WORKERS))
    n = 64 << 20

    def on_main_chunk(k):
        if k == 1:
            threading.Timer(0.001, interrupts).start()

    monkeypatch.setitem(globals(), "N", n)
    buf = hmr.Buffer.from_host(_pattern(n), resource=hmr.AsyncMemoryResource())
    log = Log(monkeypatch, on_main_chunk=on_main_chunk, delay=0.005)
    _run(buf, op, log)
    assert any(name != "MainThread" for name, _, _ in log.copies)
    log.left = False
    _after_the_interrupt_the_next_copy_is_exact(buf)
    buf.close()

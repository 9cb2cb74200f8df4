"""Threads without the GIL: every resource, adaptor, ``Buffer``, the interop allocators,
logging and the per-device table from 16 threads at once, on any build of CPython (with the
GIL, and free-threaded with it off), and the ownership protocols that must hold there.

Each test counts what it can count exactly: every block handed out is distinct while live
(an overlap check) and keeps its bytes until freed; every upstream allocation is freed exactly
once (a counting upstream refuses a second free); the adaptors' counters balance at the end;
after ``release()`` a pool or a fixed-size resource holds nothing (a lost free block would keep
its chunk); each exactly-once claim (``Buffer.close``, ``Finalizer``, the interop allocations)
frees once however many threads race for it.  Threads are joined with a timeout (a thread still
alive is a deadlock).

Bounded: a few seconds in all.  ``HIPMR_STRESS=N`` multiplies the operations (CI's longer
stress run under the free-threaded build uses it); ``HIPMR_REQUIRE_NO_GIL=1`` makes the GIL
check fail instead of skip.
"""
from __future__ import annotations

import ctypes
import gc
import io
import os
import random
import sys
import threading
import time
from typing import Any, Callable, Dict, List

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes._exit import Finalizer
from hipmr_ctypes.adaptors import _dead
from hipmr_ctypes._stream_order import SYNC

from support import REPO, HostBufferResource, LiveRanges, process_runtime

THREADS = 16
SCALE = max(1, int(os.environ.get("HIPMR_STRESS", "1") or 1))
OPS = 200 * SCALE          # per thread, in the hammer tests
JOIN = 120.0               # seconds: a thread still alive after this is deadlocked

pytestmark = pytest.mark.emulated


def run_threads(target: Callable[[int], Any], n: int = THREADS) -> List[str]:
    """Run ``target(i)`` in ``n`` threads started together; the errors they raised."""
    errors: List[str] = []
    start = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            start.wait(JOIN)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            import traceback
            where = "".join(traceback.format_tb(exc.__traceback__)[-3:])
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}\n{where}")

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # with the GIL: switch often, more interleavings
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + JOIN
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(interval)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"deadlock: {len(alive)} threads still running after {JOIN} s"
    return errors


class Counting:
    """An async upstream over an ``AsyncMemoryResource`` that records every live block and
    refuses (and counts) a free of a block it does not hold: a double free or a free of a
    block never given is an error, not a silent corruption."""

    properties = (hmr.device_accessible,)

    def __init__(self) -> None:
        self.up = hmr.AsyncMemoryResource()
        self.lock = threading.Lock()
        self.live: Dict[int, int] = {}
        self.allocations = 0
        self.bad_frees: List[int] = []

    def allocate_async(self, nbytes: int, alignment: int, stream: Any) -> int:
        ptr = self.up.allocate_async(nbytes, alignment, stream)
        with self.lock:
            self.live[ptr] = nbytes
            self.allocations += 1
        return ptr

    def deallocate_async(self, ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
        with self.lock:
            if self.live.pop(ptr, None) != nbytes:
                self.bad_frees.append(ptr)
                return
        self.up.deallocate_async(ptr, nbytes, alignment, stream)

    def allocate(self, nbytes: int, alignment: int = 256) -> int:
        return self.allocate_async(nbytes, alignment, 0)

    def deallocate(self, ptr: int, nbytes: int, alignment: int = 256) -> None:
        self.deallocate_async(ptr, nbytes, alignment, 0)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__


@pytest.fixture
def emu(emulator: Any) -> Any:
    gc.collect()
    before = emulator.live_allocations()
    yield emulator
    gc.collect()
    assert emulator.live_allocations() == before, "leaked device memory"


@pytest.fixture
def streams() -> Any:
    made = [hmr.Stream() for _ in range(4)]
    yield made
    for s in made:
        s.close()


def hammer(resource: Any, streams: List[Any], ranges: LiveRanges, seed: int,
           max_size: int, count: List[int]) -> None:
    """OPS random allocations and frees, synchronous and on streams; every block is filled
    and checked before it is freed."""
    rng = random.Random(seed)
    mine: List[Any] = []
    choices = streams + [0, None]  # Stream objects, the null stream, host-synchronous
    allocated = 0
    for _ in range(OPS):
        if mine and (len(mine) > 12 or rng.random() < 0.45):
            ptr, size, fill, on = mine.pop(rng.randrange(len(mine)))
            if ctypes.string_at(ptr, size) != fill * size:
                raise AssertionError(f"block {ptr:#x} was overwritten while live")
            ranges.remove(ptr)
            if on is None:
                resource.deallocate(ptr, size)
            else:
                resource.deallocate_async(ptr, size, 256, on)
            continue
        size = rng.choice([rng.randint(1, 300), 256, 4096, rng.randint(1, max_size)])
        on = rng.choice(choices)
        ptr = (resource.allocate(size) if on is None
               else resource.allocate_async(size, 256, on))
        allocated += 1
        ranges.add(ptr, size)
        fill = bytes([rng.randrange(1, 256)])
        ctypes.memset(ptr, fill[0], size)
        if on is not None and on != 0:
            on.synchronize()  # the fill came from the host: later users of the stream see it
        mine.append((ptr, size, fill, on))
    for ptr, size, fill, on in mine:
        assert ctypes.string_at(ptr, size) == fill * size
        ranges.remove(ptr)
        resource.deallocate(ptr, size)
    with ranges.lock:
        count[0] += allocated


def _pool(up: Any) -> Any:
    return hmr.PoolResource(up)


def _log_target() -> Any:
    return io.StringIO()


# (name, builds the resource over the counting upstream, largest request)
STACKS: List[Any] = [
    ("pool", _pool, 1 << 18),
    ("fixed_size", lambda up: hmr.FixedSizeResource(up, block_size=1 << 16,
                                                    blocks_to_preallocate=8), 1 << 16),
    ("binning", lambda up: hmr.BinningResource(_pool(up), bins=[1024, 1 << 16]), 1 << 18),
    ("tracking", lambda up: hmr.TrackingResource(_pool(up)), 1 << 18),
    ("statistics", lambda up: hmr.StatisticsResource(_pool(up)), 1 << 18),
    ("limiting", lambda up: hmr.LimitingResource(_pool(up), 1 << 40), 1 << 18),
    ("aligned", lambda up: hmr.AlignedResource(_pool(up), 4096), 1 << 18),
    ("failure_callback", lambda up: hmr.FailureCallbackResource(_pool(up), lambda n: False),
     1 << 18),
    ("logging", lambda up: hmr.LoggingResource(_pool(up), _log_target()), 1 << 18),
    ("statistics_limiting_pool", lambda up: hmr.StatisticsResource(
        hmr.LimitingResource(_pool(up), 1 << 40)), 1 << 18),
    ("async_memory", lambda up: up.up, 1 << 18),          # the counting upstream's own
    ("counting_upstream", lambda up: up, 1 << 18),          # a user-written resource itself
]


@pytest.mark.parametrize("name,make,max_size", STACKS, ids=[s[0] for s in STACKS])
def test_every_resource_and_adaptor_from_sixteen_threads(emu, streams, name, make, max_size):
    up = Counting()
    resource = make(up)
    ranges, count = LiveRanges(), [0]
    errors = run_threads(lambda i: hammer(resource, streams, ranges, 7000 + i, max_size,
                                          count))
    assert errors == [], errors[:3]
    assert ranges.errors == [], ranges.errors[:3]
    assert ranges.starts == []
    assert count[0] > THREADS * OPS // 3
    for s in streams:
        s.synchronize()
    if name == "statistics":
        st = resource.statistics
        assert (st.current_bytes, st.current_count) == (0, 0)
        assert st.total_count == count[0]
    if name == "statistics_limiting_pool":
        st = resource.statistics
        assert (st.current_bytes, st.total_count) == (0, count[0])
        assert resource.upstream_resource().resource.get_allocated_bytes() == 0  # the limit's
    if name == "tracking":
        assert resource.get_allocated_bytes() == 0 and resource.outstanding() == {}
    if name == "limiting":
        assert resource.get_allocated_bytes() == 0
    if name == "logging":
        resource.flush()
        assert len(resource.file.getvalue().splitlines()) == 1 + 2 * count[0]
        assert resource.lines_dropped == 0
    if name in ("pool", "fixed_size"):
        assert resource.allocation_count() == 0
        resource.release()
        assert resource.pool_size() == 0  # no free block was lost (it would keep its chunk)
    del resource
    gc.collect()
    assert up.bad_frees == []
    if name != "async_memory":   # (the test used the counting upstream's own resource)
        assert up.live == {}, f"{len(up.live)} upstream blocks never given back"
    del up   # the async resources' memory pools go too (the fixture checks the device)
    gc.collect()


def test_logging_writes_one_whole_line_per_event_from_sixteen_threads(emu, tmp_path):
    path = tmp_path / "log.csv"
    up = Counting()
    log = hmr.LoggingResource(hmr.PoolResource(up), str(path))
    per = 50 * SCALE

    def churn(i: int) -> None:
        rng = random.Random(i)
        for _ in range(per):
            n = rng.randint(1, 5000)
            p = log.allocate(n)
            log.deallocate(p, n)

    assert run_threads(churn) == []
    log.flush()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 2 * THREADS * per
    width = lines[0].count(",")
    assert all(line.count(",") == width for line in lines[1:]), "interleaved lines"
    assert log.lines_dropped == 0


def test_pools_lose_no_block_while_streams_come_and_go(emu):
    """Short-lived streams freed into from many threads, while other threads flush (misses of
    a large size) and release: each flush forgets the streams' free lists that a lock-free free
    may still hold.  A block freed into a list at that moment must not be lost: afterwards
    ``release()`` gives every chunk back."""
    up = Counting()
    pool = hmr.PoolResource(up)
    fixed = hmr.FixedSizeResource(up, block_size=4096, blocks_to_preallocate=16)
    per = 40 * SCALE

    def churn(i: int) -> None:
        rng = random.Random(i)
        for k in range(per):
            if i % 4 == 0:   # the flushing threads
                for mr, n in ((pool, rng.randint(1 << 20, 1 << 21)), (fixed, 4096)):
                    p = mr.allocate(n)
                    mr.deallocate(p, n)
                if k % 8 == 0:
                    pool.release()
                    fixed.release()
                continue
            with hmr.Stream() as s:
                held = []
                for _ in range(rng.randint(1, 6)):
                    for mr, n in ((pool, rng.choice([256, 1000, 4096])), (fixed, 4096)):
                        held.append((mr, mr.allocate_async(n, 256, s), n))
                rng.shuffle(held)
                for mr, p, n in held:
                    mr.deallocate_async(p, n, 256, s)

    errors = run_threads(churn)
    assert errors == [], errors[:3]
    assert pool.allocation_count() == 0 and fixed.allocation_count() == 0
    pool.release()
    fixed.release()
    assert pool.pool_size() == 0, "the pool lost free blocks (their chunks stay held)"
    assert fixed.pool_size() == 0, "the fixed-size resource lost free blocks"
    assert up.bad_frees == []


# ---- the moment a free holds a list the resource lets go, made to happen every time ---------
def _at_line(func_name: str, line_text: str, action: Callable[[], None]) -> Any:
    """A trace function that runs ``action`` once, in the traced thread, just before the first
    line of a function named ``func_name`` whose source contains ``line_text``."""
    import linecache
    done = [False]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and not done[0]:
            text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if line_text in text:
                done[0] = True
                action()
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == func_name and not done[0]:
            return local
        return None

    return tracer, done


def _traced(tracer: Any, call: Callable[[], None]) -> None:
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(previous)


def test_a_pool_free_into_a_list_let_go_meanwhile_keeps_its_block(emu):
    """``deallocate_async`` has fetched its stream's free list; before it appends, another
    thread's flush forgets the stream (here: run at that line by a trace function).  The block
    appended to the forgotten list is put back into the pool, not lost."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    arena = pool._arena
    with hmr.Stream() as s:
        p = pool.allocate_async(1000, 256, s)
        q = pool.allocate_async(1000, 256, s)
        pool.deallocate_async(q, 1000, 256, s)     # the stream's list and size are known now
        assert pool.allocate_async(1000, 256, s) == q
        lst = arena.free[s.handle][1000]

        def flush() -> None:
            with arena.lock:
                arena._flush_all()                 # forgets the stream's lists
            assert s.handle not in arena.free and id(lst) in _dead.DEAD

        tracer, done = _at_line("deallocate_async", "live_pop(ptr)", flush)
        _traced(tracer, lambda: pool.deallocate_async(p, 1000, 256, s))
        assert done[0]
        assert len(lst) == 0                       # the free saw the entry and moved its block
        pool.deallocate_async(q, 1000, 256, s)
        s.synchronize()
    key = id(lst)
    del lst
    assert key not in _dead.DEAD      # the entry lived as long as the list
    assert pool.allocation_count() == 0
    pool.release()
    assert pool.pool_size() == 0


def test_a_pool_grows_while_another_thread_gives_chunks_back(emu):
    """A thread gives two chunks back (``release``): it takes each out of the chunks on their
    way back, without the lock, just before the upstream frees it.  Another thread grows the
    pool meanwhile, and its check of the new chunk looks through those chunks; here the first
    thread takes the second one out while that check is halfway through (run there by a trace
    function).  The growth succeeds and both chunks go back."""
    go, second = threading.Event(), threading.Event()
    calls = [0]

    class Upstream(HostBufferResource):
        def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
            calls[0] += 1
            if calls[0] == 1:
                assert go.wait(JOIN)
            elif calls[0] == 2:
                second.set()
            super().deallocate(ptr, bytes, alignment)

    up = Upstream()
    pool = hmr.PoolResource(up)
    p = pool.allocate(1 << 20)
    q = pool.allocate(1 << 20)                        # a second chunk
    pool.deallocate(p, 1 << 20)
    pool.deallocate(q, 1 << 20)
    returning = pool._arena.returning
    giver = threading.Thread(target=pool.release, daemon=True)
    giver.start()
    deadline = time.monotonic() + JOIN
    while not returning and time.monotonic() < deadline:   # the first free is under way
        time.sleep(0.001)
    (waiting,) = returning                            # the chunk still on its way back
    armed = [False]
    resumes = [0]

    def let_the_giver_go_on() -> None:
        go.set()
        assert second.wait(JOIN)                      # it has taken the second chunk out

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        if frame.f_code.co_name == "overlaps" and waiting in frame.f_locals["chunks"]:
            armed[0] = True                           # the check of the chunks on their way
        elif frame.f_code.co_name == "<genexpr>" and armed[0]:
            resumes[0] += 1                           # back: after it looked at one
            if resumes[0] == 2:
                let_the_giver_go_on()
        return None

    _traced(tracer, lambda: pool.deallocate(pool.allocate(1 << 20), 1 << 20))
    assert resumes[0] >= 2 and second.is_set()
    giver.join(JOIN)
    assert not giver.is_alive()
    pool.release()
    assert pool.pool_size() == 0 and up.live == {}


def _fixed_size(through: str) -> Any:
    """A ``FixedSizeResource`` of four 4 KiB blocks, and what the test calls: itself, or a
    ``BinningResource`` with it as its bin (whose fast paths serve its lists themselves)."""
    fixed = hmr.FixedSizeResource(hmr.AsyncMemoryResource(), block_size=4096,
                                  blocks_to_preallocate=4)
    if through == "itself":
        return fixed, fixed
    binning = hmr.BinningResource(hmr.AsyncMemoryResource(), bins=[(4096, fixed)])
    assert binning._bins[0][1][0][4] is not None, "the bin's lists are not served inline"
    return fixed, binning


@pytest.mark.parametrize("through", ["itself", "a binning resource"])
def test_a_fixed_size_free_into_a_list_let_go_meanwhile_keeps_its_block(emu, through):
    """The same for ``FixedSizeResource``, freed directly or by a ``BinningResource`` over
    it: the stream is forgotten by ``release()`` (its list was empty) while a free holds its
    list; the block goes back to the stream's list."""
    fixed, mr = _fixed_size(through)
    state = fixed._state
    with hmr.Stream() as s:
        p = mr.allocate_async(4096, 256, s)
        q = mr.allocate_async(4096, 256, s)
        mr.deallocate_async(q, 4096, 256, s)
        assert mr.allocate_async(4096, 256, s) == q   # the stream's list exists, empty
        lst = state.free[s.handle]
        assert not lst

        def forget() -> None:
            with state.lock:
                state.forget_streams()
            assert s.handle not in state.free and _dead.owner(lst) == s.handle

        tracer, done = _at_line("deallocate_async", "pop(ptr, _NONE)", forget)
        _traced(tracer, lambda: mr.deallocate_async(p, 4096, 256, s))
        assert done[0]
        assert not lst and list(state.free[s.handle]) == [p]   # rescued onto a list anew
        mr.deallocate_async(q, 4096, 256, s)
        s.synchronize()
    assert mr.allocation_count() == 0
    mr.release()
    assert fixed.pool_size() == 0


@pytest.mark.parametrize("through", ["itself", "a binning resource"])
def test_a_fixed_size_free_into_a_closed_streams_list_keeps_its_block(emu, through):
    """A stream destroyed while a free holds its list: the block becomes the host's."""
    fixed, mr = _fixed_size(through)
    state = fixed._state
    s = hmr.Stream()
    p = mr.allocate_async(4096, 256, s)
    q = mr.allocate_async(4096, 256, s)
    mr.deallocate_async(q, 4096, 256, s)
    assert mr.allocate_async(4096, 256, s) == q
    lst = state.free[s.handle]
    handle = s.handle

    def closed() -> None:
        s.synchronize()
        state.stream_closed(handle)
        assert _dead.owner(lst) is SYNC

    tracer, done = _at_line("deallocate_async", "pop(ptr, _NONE)", closed)
    _traced(tracer, lambda: mr.deallocate_async(p, 4096, 256, handle))
    assert done[0]
    assert not lst and p in state.free[SYNC]
    mr.deallocate_async(q, 4096, 256, s)
    s.close()
    mr.release()
    assert fixed.pool_size() == 0


# ---- exactly-once claims ------------------------------------------------------------------
@pytest.mark.parametrize("threads", [2, THREADS])
def test_a_buffer_closed_by_many_threads_at_once_is_freed_once(emu, threads):
    """Every buffer closed by every thread: one free each (a second free of a pool block is a
    ValueError in the closing thread; of the counting upstream's, a recorded bad free)."""
    up = Counting()
    pool = hmr.PoolResource(up)
    n = 4000 * SCALE
    bufs = [hmr.Buffer(256, resource=pool if k % 4 else up) for k in range(n)]
    # each thread closes every buffer, in one of four orders; a third of the closes on
    # another stream (the slower path)
    with hmr.Stream() as s:
        def close_all(i: int) -> None:
            order = (bufs if i % 2 or threads == 2 else bufs[::-1])[(i // 2) % 2::2]
            for k, b in enumerate(order):
                b.close(stream=s if (k + i) % 3 == 0 else None)
            for b in (bufs if i % 2 or threads == 2 else bufs[::-1]):
                b.close()

        errors = run_threads(close_all, threads)
        assert errors == [], errors[:3]
        s.synchronize()
    assert up.bad_frees == [], f"{len(up.bad_frees)} buffers freed twice"
    assert all(b.closed for b in bufs) and pool.allocation_count() == 0
    pool.release()
    assert up.live == {}


def test_buffers_made_closed_and_dropped_from_sixteen_threads(emu):
    up = Counting()
    pool = hmr.PoolResource(up)
    per = 100 * SCALE

    def churn(i: int) -> None:
        rng = random.Random(i)
        for _ in range(per):
            b = hmr.Buffer(rng.randint(1, 4096), resource=rng.choice([pool, up]))
            if rng.random() < 0.5:
                b.close()
            del b   # else freed by its refcount, on this thread

    assert run_threads(churn) == []
    gc.collect()
    assert pool.allocation_count() == 0
    pool.release()
    assert up.bad_frees == [] and up.live == {}


def test_a_finalizer_called_from_many_threads_runs_once(emu):
    class Owner:
        pass

    ran: List[int] = []
    owners = [Owner() for _ in range(200 * SCALE)]
    fins = [Finalizer(o, ran.append, k) for k, o in enumerate(owners)]

    def call_all(i: int) -> None:
        for f in (fins if i % 2 else fins[::-1]):
            f()

    assert run_threads(call_all) == []
    assert sorted(ran) == list(range(len(fins)))
    assert not any(f.alive for f in fins)


def test_numba_memory_freed_from_two_threads_is_freed_once(emu, monkeypatch):
    from interop_doubles import Context, install, make_numba
    with process_runtime():
        up = Counting()
        hmr.set_current_device_resource(up)
        install(monkeypatch, make_numba())
        import hipmr_ctypes.interop.numba as hook
        plugin = hook.HipmrNumbaManager(context=Context())
        made = []
        made_lock = threading.Lock()

        def alloc(i: int) -> None:
            mine = [plugin.memalloc(1 + 97 * k) for k in range(25 * SCALE)]
            with made_lock:
                made.extend(mine)

        assert run_threads(alloc) == []
        refused = [0]

        def free_all(i: int) -> None:
            for m in (made if i % 2 else made[::-1]):
                try:
                    m.free()
                except RuntimeError:   # "Freeing dead memory": the other thread freed it
                    with made_lock:
                        refused[0] += 1

        assert run_threads(free_all, 2) == []
        assert refused[0] == len(made)
        del made
        gc.collect()
        assert up.bad_frees == [] and up.live == {}


def test_cupy_allocations_from_sixteen_threads(emu, monkeypatch):
    from interop_doubles import install, make_cupy
    with process_runtime():
        up = Counting()
        install(monkeypatch, make_cupy())
        import hipmr_ctypes.interop.cupy as hook
        allocate = hook.allocator(up)

        def churn(i: int) -> None:
            rng = random.Random(i)
            held = []
            for _ in range(50 * SCALE):
                held.append(allocate(rng.randint(1, 5000)))
                if len(held) > 8:
                    held.pop(rng.randrange(len(held)))   # CuPy lets it go: freed once
            held.clear()

        assert run_threads(churn) == []
        gc.collect()
        assert up.bad_frees == [] and up.live == {}


def test_the_per_device_table_from_sixteen_threads(emu):
    made = [hmr.PoolResource(hmr.AsyncMemoryResource()) for _ in range(3)]
    with process_runtime():
        first: List[Any] = []
        assert run_threads(lambda i: first.append(hmr.get_current_device_resource())) == []
        assert len({id(r) for r in first}) == 1    # one default, however many ask at once

        def churn(i: int) -> None:
            rng = random.Random(i)
            for _ in range(50 * SCALE):
                if rng.random() < 0.3:
                    hmr.set_current_device_resource(rng.choice(made))
                r = hmr.get_current_device_resource()
                b = hmr.Buffer(rng.randint(1, 3000))   # the current device's resource
                assert b.resource in made or b.resource is first[0]
                b.close()
                n = rng.randint(1, 3000)
                r.deallocate(r.allocate(n), n)

        assert run_threads(churn) == []
    for m in made:
        assert m.allocation_count() == 0
        m.release()


# ---- the build ----------------------------------------------------------------------------
def test_the_gil_is_off_on_a_free_threaded_build():
    """CI runs the thread tests on a free-threaded build with ``-X gil=0``: the GIL must stay
    off (an extension module that does not declare free-threading support would turn it on,
    and the tests would then prove nothing about running without it)."""
    required = os.environ.get("HIPMR_REQUIRE_NO_GIL") == "1"
    enabled = getattr(sys, "_is_gil_enabled", None)
    from hipmr_ctypes._locks import FREE_THREADED
    if enabled is None or not FREE_THREADED:
        assert not required, "HIPMR_REQUIRE_NO_GIL=1 but this is not a free-threaded build"
        pytest.skip("not a free-threaded build of CPython")
    if required:
        assert not enabled(), "the GIL is on"
    elif enabled():
        pytest.skip("free-threaded build running with the GIL on (PYTHON_GIL=0 turns it off)")


def test_the_buffer_claim_is_atomic_on_this_build(emu):
    """The claim ``del buf._free`` succeeds once: on a free-threaded build through the locked
    deleter that ``_locks.atomic_slot`` installs (3.13t tests the slot outside the object's
    lock), with the GIL through the slot itself."""
    from hipmr_ctypes._locks import FREE_THREADED
    slot = hmr.Buffer.__dict__["_free"]
    assert isinstance(slot, property) == FREE_THREADED
    b = hmr.Buffer(256, resource=hmr.PoolResource(hmr.AsyncMemoryResource()))
    free = b._free
    del b._free
    with pytest.raises(AttributeError):
        del b._free
    b._free = free   # still the owner's to give back
    b.close()
    assert b.closed


def test_nothing_is_reported_ignored_at_exit(tmp_path):
    """Objects alive at exit whose finalizers run while the interpreter clears module globals
    (a pool's ``Finalizer``, a buffer's weak-reference callback on its resource's plan, threads
    that used them): no "Exception ignored" (3.13t reported ``_registry`` being None)."""
    import subprocess
    code = ("import threading, hipmr_ctypes as hmr\n"
            "class R(hmr.PoolResource):\n"
            "    pass\n"
            "pools = [R(hmr.AsyncMemoryResource()) for _ in range(8)]\n"
            "bufs = []\n"
            "def work(i):\n"
            "    for k in range(50):\n"
            "        b = hmr.Buffer(256 + k, resource=pools[(i + k) % 8])\n"
            "        bufs.append(b) if k % 7 == 0 else b.close()\n"
            "ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n"
            "[t.start() for t in ts]\n"
            "[t.join() for t in ts]\n"
            "a, b = R(hmr.AsyncMemoryResource()), R(hmr.AsyncMemoryResource())\n"
            "a.other, b.other = b, a   # a cycle: collected during teardown\n"
            "print('ok')\n")
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
        assert "Exception ignored" not in out.stderr, out.stderr[-2000:]

"""Shutdown and lifetime: programs that exit with everything still alive, in every order.

Each scenario runs in a child process (``HIPMR_PLATFORM=emulated``, cwd the repository root)
that exits with live buffers, streams, events, pools, refs and adaptor stacks: resources
dropped before their buffers, pools whose ``AsyncMemoryResource`` was closed or dropped
first, reference cycles, module globals, daemon threads still allocating.  It must print
nothing at all and exit 0.

A prelude, run before anything is built (hot paths cache function pointers), wraps every
runtime function to record each call that failed (a double free, a free through a destroyed
pool, a destroyed stream used again all fail on the emulated runtime), and registers, before
the package loads, an exit hook that runs after every finalizer and writes what it saw to a
file: the failed calls and the emulator's live allocations.  Both must be empty: nothing was
freed twice or through something already destroyed, and nothing the program still held was
leaked at exit (except in the daemon-thread scenario, where a thread still holds blocks).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from support import DAEMON_EXIT_HANGS, DAEMON_EXIT_REASON, REPO, Leak, no_crash

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability()


#: The harness, imported first by every scenario.  It lives in a module of its own, not in
#: ``__main__``: code of ``__main__`` called while ``__main__`` itself is torn down at exit
#: (a finalizer calling a wrapper) would report errors of the harness, not of the package.
HARNESS = textwrap.dedent("""
    import atexit, gc, json, os, sys, types
    _REPORT = os.environ["HIPMR_TEST_REPORT"]
    _DROP = os.environ.get("HIPMR_TEST_DROP") == "1"
    FAILED = []
    SEEN = {}

    def _live():
        from hipmr_ctypes import _hip
        live = _hip.get_runtime().emulator.live_allocations()
        return [live.count, live.bytes]

    def _write_report():
        SEEN.update(failed=FAILED, end=_live())
        with open(_REPORT, "w") as fh:
            json.dump(SEEN, fh)

    def _at_exit_begins():
        # the first hook to run: what is live when the exit begins; with HIPMR_TEST_DROP=1
        # the program's objects are dropped first (then nothing may be left allocated)
        if _DROP:
            main = sys.modules["__main__"]
            for name in [n for n in vars(main) if not n.startswith("__")]:
                delattr(main, name)
            for name, mod in list(sys.modules.items()):
                if isinstance(mod, types.ModuleType) and getattr(mod, "__spec__", 1) is None \\
                        and not hasattr(mod, "__file__") and name != "__main__":
                    del sys.modules[name]
            mod = None
            import hipmr_ctypes as hmr
            hmr.set_current_device_resource(hmr.DeviceMemoryResource())
            gc.collect()
        SEEN["begin"] = _live()

    atexit.register(_write_report)  # registered before the package: runs after its hooks

    import hipmr_ctypes
    from hipmr_ctypes import _hip
    _rt = _hip.get_runtime()
    _OK = {"hipStreamQuery": 600, "hipEventQuery": 600}

    def _watch(name, func):
        def call(*args):
            st = func(*args)
            if st and st != _OK.get(name):
                FAILED.append([name, st])
            return st
        return call

    for _name, _func in list(vars(_rt.fn).items()):
        if not _name.startswith("hipGetError") and "LastError" not in _name:
            setattr(_rt.fn, _name, _watch(_name, _func))
""")


PRELUDE = textwrap.dedent("""
    import hipmr_shutdown_harness
    import hipmr_ctypes as hmr
    import atexit as _atexit
    import hipmr_ctypes._exit  # (imported on first use otherwise) its exit hook, then ours:
    _atexit.register(hipmr_shutdown_harness._at_exit_begins)  # runs before the package's hook
    from hipmr_ctypes import _hip
    emulator = _hip.get_runtime().emulator
    MiB = 1 << 20
""")

SCENARIOS = {}


def scenario(name, leaks_ok=False):
    def register(body):
        SCENARIOS[name] = (textwrap.dedent(body), leaks_ok)
        return body
    return register


scenario("live-buffers-of-every-resource")("""
    a = hmr.AsyncMemoryResource()
    buffers = [hmr.Buffer.from_host(b"x" * 1000, resource=r) for r in (
        None, a, hmr.AsyncMemoryResource.from_default_pool(), hmr.DeviceMemoryResource(),
        hmr.PinnedMemoryResource(), hmr.ManagedMemoryResource(), hmr.HostMemoryResource(),
        hmr.PoolResource(a), hmr.FixedSizeResource(a, 4096, 4),
        hmr.BinningResource(a, [256, 8192]))]
    empty = hmr.Buffer(0)
""")

scenario("live-streams-and-events")("""
    streams = [hmr.Stream(flags=f, priority=p) for f in (0, 1) for p in (0, -1)]
    events = [hmr.Event(flags=f) for f in (0, 1, 2)]
    for e, s in zip(events, streams):
        e.record(s)
        streams[-1].wait_event(e)
    emulator.set_stream_busy(streams[0].handle, 1000)
    pending = hmr.Event().record(streams[0])
    closed = hmr.Stream()
    closed.close()
""")

scenario("pools-with-live-and-cached-blocks")("""
    a = hmr.AsyncMemoryResource(initial_pool_size=4 * MiB)
    pool = hmr.PoolResource(a, initial_pool_size=2 * MiB)
    s = hmr.Stream()
    live = [pool.allocate(n) for n in (100, 5000, 3 * MiB)]
    live += [pool.allocate_async(n, 256, s) for n in (100, 70000)]
    for n in (300, 9000):
        pool.deallocate_async(pool.allocate_async(n, 256, s), n, 256, s)
    fixed = hmr.FixedSizeResource(pool, 4096, 8)
    held = [fixed.allocate(4096) for _ in range(5)]
""")

scenario("refs-and-adaptor-stacks")("""
    import io
    a = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(a)
    stack = hmr.StatisticsResource(hmr.LimitingResource(pool, 64 * MiB))
    tracking = hmr.TrackingResource(stack, capture_stacks=True)
    log = hmr.LoggingResource(tracking, io.StringIO())
    aligned = hmr.AlignedResource(log, 4096)
    binning = hmr.BinningResource(aligned, [512, 65536])
    failure = hmr.FailureCallbackResource(binning, lambda n: False)
    prefetch = hmr.PrefetchResource(hmr.ManagedMemoryResource())
    ref = hmr.async_resource_ref[hmr.device_accessible](failure)
    sref = hmr.resource_ref[hmr.device_accessible](ref)
    ptrs = [(ref.allocate(n), n) for n in (1, 500, 5000, 100000)]
    b = hmr.Buffer.from_host(b"stack" * 100, resource=ref)
    m = prefetch.allocate(1000)
    prefetch.deallocate(m, 1000)
    hmr.set_current_device_resource(failure)
    c = hmr.Buffer(777)
""")

scenario("resource-dropped-before-its-buffers")("""
    buffers = []
    for make in (lambda: hmr.PoolResource(hmr.AsyncMemoryResource()),
                 lambda: hmr.AsyncMemoryResource(),
                 lambda: hmr.StatisticsResource(hmr.PoolResource(hmr.DeviceMemoryResource())),
                 lambda: hmr.FixedSizeResource(hmr.AsyncMemoryResource(), 8192, 2)):
        r = make()
        buffers += [hmr.Buffer.from_host(bytes([i]) * 5000, resource=r) for i in range(3)]
        del r
    import gc
    gc.collect()
    assert all(b.tobytes()[:1] == bytes([i % 3]) for i, b in enumerate(buffers))
""")

scenario("async-resource-closed-or-dropped-first")("""
    import gc
    a = hmr.AsyncMemoryResource()
    b1 = hmr.Buffer.from_host(b"a" * 1000, resource=a)
    pool = hmr.PoolResource(a)
    b2 = hmr.Buffer.from_host(b"b" * 1000, resource=pool)
    raw = pool.allocate(5000)
    a.close()                    # the pool is closed while b1, b2 and the pool's chunks live
    assert a.pool.closed
    b3 = hmr.Buffer.from_host(b"c" * 100, resource=pool)   # served from the pool's cache
    d = hmr.AsyncMemoryResource()
    b4 = hmr.Buffer.from_host(b"d" * 1000, resource=d)
    d.close()
    del d
    e = hmr.AsyncMemoryResource()
    b5 = hmr.Buffer.from_host(b"e" * 1000, resource=e)
    del e
    gc.collect()
    b1.close()                   # freed after its pool was closed
    assert b2.tobytes() == b"b" * 1000 and b5.tobytes() == b"e" * 1000
""")

scenario("reference-cycles")("""
    import gc
    gc.disable()                 # keep the cycles until exit
    class Node:
        pass
    for i in range(20):
        n = Node()
        n.self = n
        n.stream = hmr.Stream()
        n.event = hmr.Event().record(n.stream)
        n.pool = hmr.PoolResource(hmr.AsyncMemoryResource())
        n.buffer = hmr.Buffer.from_host(b"z" * 3000, resource=n.pool, stream=n.stream)
        n.ref = hmr.async_resource_ref(n.pool)
        n.pool.node = n           # the pool refers back to its owner
        n.stats = hmr.StatisticsResource(n.pool)
        n.raw = n.stats.allocate(4000)
    del n
""")

scenario("cycles-collected-mid-run")("""
    import gc
    class Node:
        pass
    for round in range(5):
        nodes = []
        for i in range(10):
            n = Node()
            n.self = n
            n.stream = hmr.Stream()
            n.pool = hmr.PoolResource(hmr.AsyncMemoryResource())
            n.buffer = hmr.Buffer.from_host(b"z" * 3000, resource=n.pool, stream=n.stream)
            n.other = hmr.Buffer(100, stream=n.stream)
            nodes.append(n)
        del nodes, n
        gc.collect()
        live = emulator.live_allocations()
        assert live.count == 0, live
""")

scenario("module-globals")("""
    import sys, types
    mod = types.ModuleType("holder")
    mod.pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    mod.buffers = [hmr.Buffer.from_host(b"g" * 2000, resource=mod.pool) for _ in range(3)]
    mod.stream = hmr.Stream()
    mod.event = hmr.Event().record(mod.stream)
    mod.stack = hmr.TrackingResource(hmr.StatisticsResource(mod.pool))
    mod.ptr = mod.stack.allocate(12345)
    sys.modules["holder"] = mod
    GLOBAL_BUFFER = hmr.Buffer.from_host(b"global", stream=mod.stream)
    GLOBAL_STREAM = mod.stream
""")

scenario("daemon-threads-still-running", leaks_ok=True)("""
    import threading, time, random
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    stats = hmr.StatisticsResource(pool)
    started = threading.Barrier(9)
    def work(i):
        rng = random.Random(i)
        s = hmr.Stream()
        mine = []
        started.wait()
        while True:
            n = rng.randint(1, 50000)
            b = hmr.Buffer(n, resource=stats if i % 2 else None, stream=s if i % 3 else None)
            mine.append(b)
            if len(mine) > 8:
                mine.pop(0).close()
            p = stats.allocate_async(n, 256, s)
            stats.deallocate_async(p, n, 256, s)
            e = hmr.Event().record(s)
            e.synchronize()
    for i in range(8):
        threading.Thread(target=work, args=(i,), daemon=True).start()
    started.wait()
    time.sleep(0.05)
""")

scenario("stream-closed-before-its-buffers")("""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    s = hmr.Stream()
    bufs = [hmr.Buffer.from_host(b"s" * 100, resource=r, stream=s)
            for r in (None, hmr.AsyncMemoryResource())]
    s.close()
    t = hmr.Stream()
    later = hmr.Buffer.from_host(b"t" * 100, stream=t)
    t.close()
    later.close()
""")

scenario("dlpack-export-alive-at-exit")("""
    b = hmr.Buffer.from_host(b"d" * 64)
    capsule = b.__dlpack__()
    c = hmr.Buffer.from_host(b"e" * 64)
    capsule2 = c.__dlpack__(max_version=(1, 0))
    c.close()                   # closed while exported: freed when the export goes
""")

scenario("dlpack-capsules-of-a-user-resource-alive-at-exit")("""
    # the capsules outlive the package's modules at exit: their destructor (a ctypes
    # callback) must still exist when the interpreter finally drops them
    a = hmr.AsyncMemoryResource()
    r = hmr.CallbackResource(lambda n, al, a=a: a.allocate(n, al),
                             lambda p, n, al, a=a: a.deallocate(p, n, al),
                             lambda n, al, s, a=a: a.allocate_async(n, al, s),
                             lambda p, n, al, s, a=a: a.deallocate_async(p, n, al, s),
                             properties=(hmr.device_accessible,))
    b = hmr.Buffer.from_host(b"u" * 64, resource=r)
    capsules = [b.__dlpack__(), b.__dlpack__(max_version=(1, 0)), hmr.Buffer(0).__dlpack__()]
""")

scenario("exit-from-inside-with-blocks")("""
    import sys
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    with hmr.Stream() as s, hmr.Event() as e, hmr.Buffer(100, resource=pool, stream=s) as b:
        e.record(s)
        sys.exit(0)
""")

scenario("per-device-resource-replaced-while-in-use")("""
    a = hmr.AsyncMemoryResource()
    first = hmr.Buffer(1000)                     # from the default per-device resource
    previous = hmr.set_current_device_resource(hmr.PoolResource(a))
    second = hmr.Buffer(1000)
    hmr.set_current_device_resource(previous)
    del previous
    third = hmr.Buffer(1000)
""")


def _run(name, tmp_path, drop=False):
    body, leaks_ok = SCENARIOS[name]
    report = tmp_path / "report.json"
    (tmp_path / "hipmr_shutdown_harness.py").write_text(HARNESS)
    env = dict(os.environ, HIPMR_PLATFORM="emulated",
               PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]),
               HIPMR_EMULATED_MEMORY="2GiB", HIPMR_TEST_REPORT=str(report),
               HIPMR_TEST_DROP="1" if drop else "0", PYTHONWARNINGS="default")
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True,
                          text=True, env=env, cwd=str(REPO), timeout=120)
    return proc, report, leaks_ok


scenario("control-double-free-is-seen")("""
    r = hmr.DeviceMemoryResource()
    p = r.allocate(100)
    r.deallocate(p, 100)
    try:
        r.deallocate(p, 100)
    except hmr.HipError:
        pass
    leaked = r.allocate(100)
""")


def test_the_harness_sees_failed_calls_and_leaks(tmp_path):
    """The checks below can fail: a double free and a leak are both reported."""
    proc, report, _ = _run("control-double-free-is-seen", tmp_path, drop=True)
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == proc.stderr == ""
    seen = json.loads(report.read_text())
    assert seen["failed"] == [["hipFree", 1]] and seen["begin"] == seen["end"] == [1, 100]


@pytest.mark.parametrize("name", [n for n in SCENARIOS if not n.startswith("control")])
@pytest.mark.reliability("exit_scenarios")
def test_exit_with_everything_alive(name, tmp_path):
    """Exit with everything alive: nothing fails, nothing is printed."""
    if name.startswith("daemon") and DAEMON_EXIT_HANGS:
        pytest.skip(DAEMON_EXIT_REASON)
    proc, report, _ = _run(name, tmp_path)
    no_crash(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "", proc.stdout[-2000:]
    assert proc.stderr == "", proc.stderr[-3000:]
    seen = json.loads(report.read_text())
    assert seen["failed"] == [], f"runtime calls failed (double free? freed too late?): " \
                                 f"{seen['failed'][:10]}"
    # (nothing live at exit is freed then: tests/reliability/test_exit.py checks that it stays
    # usable)


@pytest.mark.parametrize("name", [n for n, (_, leaks_ok) in SCENARIOS.items()
                                  if not n.startswith("control") and not leaks_ok])
@pytest.mark.reliability("exit_scenarios")
def test_everything_dropped_before_exit_frees_everything(name, tmp_path):
    """The same programs, their objects dropped just before the exit (every global, the
    per-device resource, then a collection): every allocation was given back."""
    proc, report, _ = _run(name, tmp_path, drop=True)
    no_crash(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "" and proc.stderr == "", (proc.stdout + proc.stderr)[-3000:]
    seen = json.loads(report.read_text())
    assert seen["failed"] == [], f"runtime calls failed: {seen['failed'][:10]}"
    if seen["begin"] != [0, 0]:
        raise Leak(f"still allocated once everything was dropped (a leak): {seen['begin']}")


def test_buffer_garbage_collection_frees_exactly_once(emulator):
    """In this process: buffers collected in every order relative to their resources and
    streams free each allocation once, on a live pool (the emulator fails any other free)."""
    import gc
    import random

    import hipmr_ctypes as hmr
    from hipmr_ctypes import _hip
    rt = _hip.get_runtime()
    failures = []
    saved = {}
    for name in ("hipFree", "hipFreeAsync", "hipHostFree", "hipMemPoolDestroy",
                 "hipStreamDestroy", "hipEventDestroy", "hipEventRecord"):
        func = saved[name] = getattr(rt.fn, name)

        def watch(*args, _f=func, _n=name):
            st = _f(*args)
            if st:
                failures.append((_n, st))
            return st
        setattr(rt.fn, name, watch)
    gc.collect()
    before = emulator.live_allocations()
    # what exists now is left out of every collection below (gc.freeze): each one then walks
    # only the objects made since, which are the ones under test, instead of the whole heap
    # of a process that has run the rest of the suite; no garbage is older than this point
    gc.freeze()
    try:
        rng = random.Random(7)
        for _ in range(30):
            things = []
            a = hmr.AsyncMemoryResource()
            pool = hmr.PoolResource(a)
            s = hmr.Stream()
            things += [a, pool, s]
            for r in (None, a, pool, hmr.StatisticsResource(pool),
                      hmr.DeviceMemoryResource()):
                things.append(hmr.Buffer.from_host(b"q" * rng.randint(1, 9000), resource=r,
                                                   stream=rng.choice([None, s])))
            if rng.random() < 0.5:
                a.close()
            if rng.random() < 0.5:
                s.close()
            rng.shuffle(things)
            while things:
                things.pop()
                if rng.random() < 0.3:
                    gc.collect()
            del a, pool, s
            gc.collect()
            assert emulator.live_allocations() == before
    finally:
        gc.unfreeze()
        for name, func in saved.items():
            setattr(rt.fn, name, func)
    assert failures == []


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource", "BinningResource"])
@pytest.mark.parametrize("then", ["host", "other-stream", "release"])
def test_stream_destroyed_after_freeing_into_a_pool(emulator, kind, then):
    """The common ``with Stream() as s:`` pattern: memory freed on ``s`` into a pool, then
    ``s`` destroyed.  The pool must go on serving that memory (it cannot record an event on a
    destroyed stream: it waits device-wide instead) and give everything back."""
    import gc

    import hipmr_ctypes as hmr
    gc.collect()
    before = emulator.live_allocations()
    up = hmr.AsyncMemoryResource()
    make = {"PoolResource": lambda: hmr.PoolResource(up),
            "FixedSizeResource": lambda: hmr.FixedSizeResource(up, 4096, 4),
            "BinningResource": lambda: hmr.BinningResource(up, [4096])}[kind]
    pool = make()
    with hmr.Stream() as s:
        for n in (1000, 3000):
            p = pool.allocate_async(n, 256, s)
            pool.deallocate_async(p, n, 256, s)
        with hmr.Buffer.from_host(b"b" * 2000, resource=pool, stream=s) as b:
            assert b.tobytes() == b"b" * 2000
    assert s.closed
    for _ in range(3):
        if then == "host":
            pool.deallocate(pool.allocate(1000), 1000)
        elif then == "other-stream":
            with hmr.Stream() as t:
                q = pool.allocate_async(1000, 256, t)
                pool.deallocate_async(q, 1000, 256, t)
                t.synchronize()
                pool.release()
        else:
            pool.release()
    pool.release()
    if hasattr(pool, "pool_size"):
        assert pool.pool_size() == 0
    del pool
    up.close()
    gc.collect()
    assert emulator.live_allocations() == before

"""Faults: out of memory, injected runtime failures, a missing or unusable library.

After every fault the resources go on serving and nothing is half-made or leaked: the
emulator's live allocations, the pools' sizes, the statistics and limits are exactly as
before.  Injected failures use the emulator's hook (``inject_failure``): the failing call
returns its status and touches no state, as a real runtime failure would.  The ``gpu``
tests do the out-of-memory part on a real device (``HIPMR_PLATFORM=nvidia``).
"""
from __future__ import annotations

import ctypes.util
import gc
import os
import subprocess
import sys

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.exceptions import HipError, OutOfMemoryError

from support import REPO, Leak, no_crash, process_runtime

MiB = 1 << 20

#: how many failures the tests here injected (read by scripts/reliability_report.py)
FAULTS_INJECTED = [0]
#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability(counters={"faults_injected": FAULTS_INJECTED})


def inject(emulator, code=2, count=1, calls=None):
    FAULTS_INJECTED[0] += count
    emulator.inject_failure(code=code, count=count, calls=calls)


def provoked(n=1):
    """Count a fault a test provoked without the hook (out of memory, a broken library)."""
    FAULTS_INJECTED[0] += n


@pytest.fixture
def clean(emulator):
    """The emulator, with a fresh per-device table; checks that the test leaked nothing."""
    with process_runtime():
        gc.collect()
        before = emulator.live_allocations()
        try:
            yield emulator
        finally:
            emulator.clear_faults()
    gc.collect()
    if emulator.live_allocations() != before:
        raise Leak("the test leaked device memory")


def serves(r, nbytes=MiB, stream=None):
    """``r`` hands out ``nbytes`` of writable memory and takes it back."""
    p = r.allocate(nbytes) if stream is None else r.allocate_async(nbytes, 256, stream)
    assert type(p) is int and p and p % 256 == 0
    rt = _hip.get_runtime()
    data = bytes(range(256)) * (min(nbytes, 4096) // 256)
    rt.check(rt.fn.hipMemcpy(p, data, len(data), 4), "hipMemcpy")
    back = ctypes.create_string_buffer(len(data))
    rt.check(rt.fn.hipMemcpy(back, p, len(data), 4), "hipMemcpy")
    assert back.raw == data
    if stream is None:
        r.deallocate(p, nbytes)
    else:
        r.deallocate_async(p, nbytes, 256, stream)


def assert_oom_message(exc, nbytes, device=0):
    provoked()
    text = str(exc.value)
    assert str(nbytes) in text, text
    assert f"device {device}" in text, text


# ================================================================ out of memory (emulated)
OOM_FACTORIES = {
    "DeviceMemoryResource": lambda: hmr.DeviceMemoryResource(),
    "AsyncMemoryResource": lambda: hmr.AsyncMemoryResource(),
    "AsyncMemoryResource.from_default_pool": lambda: hmr.AsyncMemoryResource.from_default_pool(),
    "PoolResource(AsyncMemoryResource)": lambda: hmr.PoolResource(
        hmr.AsyncMemoryResource(), initial_pool_size=4 * MiB),
    "PoolResource(DeviceMemoryResource)": lambda: hmr.PoolResource(
        hmr.DeviceMemoryResource(), initial_pool_size=4 * MiB),
    "StatisticsResource(PoolResource)": lambda: hmr.StatisticsResource(
        hmr.PoolResource(hmr.AsyncMemoryResource())),
    "current device resource": lambda: hmr.get_current_device_resource(),
}


@pytest.mark.parametrize("name", sorted(OOM_FACTORIES))
def test_out_of_memory_names_size_and_device_then_serves(clean, name):
    r = OOM_FACTORIES[name]()
    size = clean.capacity(0) + 4096
    keep = r.allocate(3 * MiB)  # a live allocation that must survive

    def state():
        return (clean.live_allocations(),
                r.pool_size() if hasattr(r, "pool_size") else None,
                r.statistics if hasattr(r, "statistics") else None)

    before = state()
    with pytest.raises(OutOfMemoryError) as info:
        r.allocate(size)
    assert isinstance(info.value, MemoryError)
    assert_oom_message(info, size)
    assert state() == before
    if hmr.is_async_resource(r):
        with hmr.Stream() as s:
            with pytest.raises(OutOfMemoryError) as info:
                r.allocate_async(size, 256, s)
            assert_oom_message(info, size)
            assert state() == before
            serves(r, MiB, s)
            pool = r if hasattr(r, "release") else getattr(r, "upstream", None)
            if hasattr(pool, "release"):
                pool.release()  # before the stream goes: the pool no longer refers to it
    serves(r)
    serves(r, 64 * MiB)
    r.deallocate(keep, 3 * MiB)
    if hasattr(r, "release"):
        r.release()


@pytest.mark.parametrize("kind", ["PinnedMemoryResource", "ManagedMemoryResource"])
def test_out_of_memory_pinned_and_managed(clean, kind):
    """Host-side memory has no device: the message names the size."""
    r = getattr(hmr, kind)()
    size = 1 << 50
    before = clean.live_allocations()
    with pytest.raises(OutOfMemoryError) as info:
        r.allocate(size)
    assert str(size) in str(info.value)
    provoked()
    assert clean.live_allocations() == before
    serves(r)


def test_out_of_memory_buffer(clean):
    size = clean.capacity(0) * 2
    with pytest.raises(OutOfMemoryError) as info:
        hmr.Buffer(size)
    assert_oom_message(info, size)
    with hmr.Buffer.from_host(b"still here") as b:
        assert b.tobytes() == b"still here"


def test_out_of_memory_does_not_poison_the_per_device_resource(clean):
    r = hmr.get_current_device_resource()
    for _ in range(3):
        with pytest.raises(OutOfMemoryError):
            r.allocate(clean.capacity(0) + 1)
    assert hmr.get_current_device_resource() is r
    serves(r)


def test_pool_at_maximum_size_refuses_then_serves(clean):
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=2 * MiB,
                            maximum_pool_size=8 * MiB)
    live = [pool.allocate(MiB) for _ in range(8)]
    with pytest.raises(OutOfMemoryError) as info:
        pool.allocate(MiB)
    assert str(MiB) in str(info.value) and "maximum_pool_size" in str(info.value)
    provoked()
    assert pool.pool_size() <= 8 * MiB
    for p in live:
        pool.deallocate(p, MiB)
    serves(pool, 8 * MiB)
    pool.release()


def test_failure_callback_frees_a_cache_and_retries(clean):
    """Memory cached in a pool starves another resource; the callback releases the pool's
    unused blocks (and trims the memory pool under it) and the allocation is retried."""
    cap = clean.capacity(0)
    amr = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(amr)
    big = cap * 3 // 4
    p = pool.allocate(big)
    pool.deallocate(p, big)          # cached in the pool: still held from the device
    assert pool.pool_size() >= big
    calls = []

    def free_cache(nbytes):
        calls.append(nbytes)
        if len(calls) > 1:
            return False             # nothing more to free: give up
        pool.release()
        amr.pool.trim_to(0)
        return True

    r = hmr.FailureCallbackResource(hmr.DeviceMemoryResource(), free_cache)
    q = r.allocate(cap // 2)
    assert calls == [cap // 2]
    assert pool.pool_size() == 0
    r.deallocate(q, cap // 2)
    # a callback that cannot help: the error comes through after one call
    calls.clear()
    with pytest.raises(OutOfMemoryError):
        r.allocate(cap * 2)
    assert calls == [cap * 2, cap * 2]
    provoked(3)
    serves(r)
    serves(pool)
    pool.release()


def test_failure_callback_exception_propagates_and_changes_nothing(clean):
    def boom(nbytes):
        raise RuntimeError(f"callback saw {nbytes}")

    r = hmr.FailureCallbackResource(hmr.AsyncMemoryResource(), boom)
    size = clean.capacity(0) + 1
    before = clean.live_allocations()
    with pytest.raises(RuntimeError, match=str(size)):
        r.allocate(size)
    assert clean.live_allocations() == before
    serves(r)


def test_limiting_refusal_changes_nothing(clean):
    stats = hmr.StatisticsResource(hmr.LimitingResource(hmr.AsyncMemoryResource(), 4 * MiB))
    p = stats.allocate(3 * MiB)
    before = (stats.statistics, stats.upstream.get_allocated_bytes(), clean.live_allocations())
    with pytest.raises(OutOfMemoryError) as info:
        stats.allocate(2 * MiB)
    assert str(2 * MiB) in str(info.value)
    provoked()
    assert (stats.statistics, stats.upstream.get_allocated_bytes(),
            clean.live_allocations()) == before
    stats.deallocate(p, 3 * MiB)
    serves(stats, 4 * MiB)


# ================================================================ out of memory (GPU)
GPU_FACTORIES = {
    "DeviceMemoryResource": lambda: hmr.DeviceMemoryResource(),
    "AsyncMemoryResource": lambda: hmr.AsyncMemoryResource(),
    "PoolResource(AsyncMemoryResource)": lambda: hmr.PoolResource(hmr.AsyncMemoryResource()),
    "current device resource": lambda: hmr.get_current_device_resource(),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_FACTORIES))
def test_gpu_out_of_memory_then_serves(gpu_runtime, name):
    r = GPU_FACTORIES[name]()
    device = hmr.get_device()
    _, total = hmr.Device(device).memory_info()
    size = 4 * total
    with pytest.raises(OutOfMemoryError) as info:
        r.allocate(size)
    assert_oom_message(info, size, device)
    if hmr.is_async_resource(r):
        with hmr.Stream() as s:
            with pytest.raises(OutOfMemoryError) as info:
                r.allocate_async(size, 256, s)
            assert_oom_message(info, size, device)
            serves(r, MiB, s)
            s.synchronize()
            if hasattr(r, "release"):
                r.release()
    serves(r, MiB)
    if hasattr(r, "release"):
        r.release()
    if isinstance(r, hmr.AsyncMemoryResource):
        r.close()


# ================================================================ injected failures
def stack_over(upstream):
    return hmr.StatisticsResource(hmr.LimitingResource(upstream, 256 * MiB))


@pytest.mark.parametrize("code", [2, 999], ids=["oom", "unknown-error"])
@pytest.mark.parametrize("upstream,call", [
    ("AsyncMemoryResource", "hipMallocFromPoolAsync"),
    ("DeviceMemoryResource", "hipMalloc")])
@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_pool_growth_failure_leaves_no_half_made_state(clean, upstream, call, code, mode):
    up = getattr(hmr, upstream)()
    pool = hmr.PoolResource(up, initial_pool_size=MiB)
    top = stack_over(pool)
    with hmr.Stream() as s:
        keep = top.allocate(512 * 1024)
        snapshot = (pool.pool_size(), pool.allocation_count(), pool.free_bytes(), top.statistics,
                    top.upstream.get_allocated_bytes(), clean.live_allocations())
        inject(clean, code=code, count=64, calls=call)  # every growth attempt fails
        with pytest.raises(HipError) as info:
            if mode == "sync":
                top.allocate(8 * MiB)
            else:
                top.allocate_async(8 * MiB, 256, s)
        clean.clear_faults()
        assert info.value.code == code or isinstance(info.value, OutOfMemoryError)
        assert (pool.pool_size(), pool.allocation_count(), pool.free_bytes(), top.statistics,
                top.upstream.get_allocated_bytes(), clean.live_allocations()) == snapshot
        # one failed attempt only: an out-of-memory makes the pool ask for less (it wanted a
        # whole MiB for 768 KiB), another error comes through
        inject(clean, code=code, count=1, calls=call)
        if code == 2:
            serves(top, 768 * 1024, None if mode == "sync" else s)
        else:
            with pytest.raises(HipError):
                top.allocate(768 * 1024)
        clean.clear_faults()
        serves(top, 8 * MiB, None if mode == "sync" else s)
        top.deallocate(keep, 512 * 1024)
        assert top.statistics.current_bytes == 0
        pool.release()
    assert pool.pool_size() == 0


@pytest.mark.parametrize("kind", ["fixed", "binning"])
def test_sub_allocator_construction_failure_leaks_nothing(clean, kind):
    up = hmr.AsyncMemoryResource()
    inject(clean, count=1, calls="hipMallocFromPoolAsync")
    if kind == "fixed":
        with pytest.raises(OutOfMemoryError):
            hmr.FixedSizeResource(up, 4096, 16)
    else:  # the first bin is made, the second fails: the first gives its chunk back
        clean.clear_faults()
        made = []

        def second_fails(nbytes, alignment):
            made.append(nbytes)
            if len(made) == 2:
                raise OutOfMemoryError(call="test", size=nbytes, device=0)
            return up.allocate(nbytes, alignment)

        flaky = hmr.CallbackResource(second_fails, up.deallocate,
                                     properties=(hmr.device_accessible,))
        with pytest.raises(OutOfMemoryError):
            hmr.BinningResource(flaky, [256, 4096, 65536])
        assert len(made) == 2
    gc.collect()
    assert up.pool.used == 0
    fixed = hmr.FixedSizeResource(up, 4096, 4)
    serves(fixed, 4096)
    fixed.release()


def test_pool_release_failure_keeps_the_pool_consistent(clean):
    up = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(up)
    ptrs = [pool.allocate(3 * MiB) for _ in range(3)]  # several chunks
    for p in ptrs:
        pool.deallocate(p, 3 * MiB)
    held = pool.pool_size()
    inject(clean, code=999, count=1, calls="hipFreeAsync")
    with pytest.raises(HipError):
        pool.release()
    clean.clear_faults()
    assert 0 < pool.pool_size() <= held
    serves(pool, 3 * MiB)
    pool.release()
    assert pool.pool_size() == 0 and up.pool.used == 0


@pytest.mark.parametrize("adaptor", ["statistics", "tracking", "limiting", "aligned"])
def test_failed_free_through_an_adaptor_is_undone(clean, adaptor):
    up = hmr.AsyncMemoryResource()
    r = {"statistics": hmr.StatisticsResource, "tracking": hmr.TrackingResource,
         "limiting": lambda u: hmr.LimitingResource(u, 64 * MiB),
         "aligned": lambda u: hmr.AlignedResource(u, 4096)}[adaptor](up)
    p = r.allocate(MiB)
    before = _adaptor_state(r)
    inject(clean, code=999, count=1, calls="hipFreeAsync")
    with pytest.raises(HipError):
        r.deallocate(p, MiB)
    clean.clear_faults()
    assert _adaptor_state(r) == before
    r.deallocate(p, MiB)  # the retry frees it
    assert up.pool.used == 0
    serves(r)


def _adaptor_state(r):
    out = []
    for attr in ("statistics",):
        if hasattr(r, attr):
            out.append(getattr(r, attr))
    if hasattr(r, "outstanding"):
        out.append(sorted(r.outstanding()))
    if hasattr(r, "get_allocated_bytes"):
        out.append(r.get_allocated_bytes())
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["sync", "stream"])
def test_buffer_copy_failure(clean, stream):
    call = "hipMemcpyAsync" if stream else "hipMemcpy"
    s = hmr.Stream() if stream else None
    before = clean.live_allocations()
    inject(clean, code=999, calls=call)
    with pytest.raises(HipError):
        hmr.Buffer.from_host(b"x" * 1000, stream=s)
    clean.clear_faults()
    gc.collect()
    if clean.live_allocations() != before:
        raise Leak("from_host leaked its buffer")
    b = hmr.Buffer.from_host(b"a" * 1000)
    out = bytearray(b"z" * 1000)
    for op in (lambda: b.copy_from_host(b"b" * 1000, stream=s),
               lambda: b.copy_to_host(out, stream=s)):
        inject(clean, code=999, calls=call)
        with pytest.raises(HipError):
            op()
        clean.clear_faults()
        if s is not None:
            s.synchronize()
        assert b.tobytes() == b"a" * 1000 and out == bytearray(b"z" * 1000)
    other = hmr.Buffer(1000)
    inject(clean, code=999, calls=call)
    with pytest.raises(HipError):
        other.copy_from_device(b, stream=s)
    clean.clear_faults()
    other.copy_from_device(b)
    assert other.tobytes() == b"a" * 1000
    b.close()
    other.close()
    if s is not None:
        s.close()
    assert clean.live_allocations() == before


def test_buffer_allocation_failure_leaves_no_finalizer(clean):
    before = clean.live_allocations()
    inject(clean, count=1)
    with pytest.raises(OutOfMemoryError):
        hmr.Buffer(4096)
    gc.collect()
    assert clean.live_allocations() == before
    assert hmr.Buffer.from_host(b"ok").tobytes() == b"ok"


def test_buffer_close_failure_can_be_retried(clean):
    """A free the runtime refuses must not lose the memory: close() raises, and the buffer
    still owns it (a later close(), or garbage collection, frees it)."""
    r = hmr.AsyncMemoryResource()
    before = clean.live_allocations()
    b = hmr.Buffer(4096, resource=r)
    inject(clean, code=999, calls="hipFreeAsync")
    with pytest.raises(HipError):
        b.close()
    clean.clear_faults()
    b.close()
    del b
    gc.collect()
    assert clean.live_allocations() == before


def _handles(emulator):
    gc.collect()
    with emulator._lock:  # test-only look at the emulator's tables
        return len(emulator._streams), len(emulator._events), len(emulator._pools)


def test_stream_creation_failure(clean):
    before = _handles(clean)
    inject(clean, code=999, calls="hipStreamCreateWithPriority")
    with pytest.raises(HipError):
        hmr.Stream()
    gc.collect()
    assert _handles(clean) == before
    with hmr.Stream() as s:
        s.synchronize()
    assert _handles(clean) == before


def test_event_creation_failure(clean):
    before = _handles(clean)
    inject(clean, code=999, calls="hipEventCreateWithFlags")
    with pytest.raises(HipError):
        hmr.Event()
    gc.collect()
    assert _handles(clean) == before
    with hmr.Event() as e:
        e.record().synchronize()
    assert _handles(clean) == before


def test_pool_cross_stream_event_failure_changes_nothing(clean):
    """The pool needs an event to hand a block freed on one stream to another; if the event
    cannot be made, the allocation fails and the block stays where it was."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=MiB)
    with hmr.Stream() as s1, hmr.Stream() as s2:
        p = pool.allocate_async(MiB, 256, s1)
        pool.deallocate_async(p, MiB, 256, s1)
        state = (pool.pool_size(), pool.allocation_count(), pool.free_bytes())
        inject(clean, code=999, calls="hipEventCreateWithFlags")
        with pytest.raises(HipError):
            pool.allocate_async(MiB, 256, s2)
        clean.clear_faults()
        assert (pool.pool_size(), pool.allocation_count(), pool.free_bytes()) == state
        q = pool.allocate_async(MiB, 256, s2)
        assert q == p  # the same block, now ordered after s1
        pool.deallocate_async(q, MiB, 256, s2)
        pool.release()


@pytest.mark.parametrize("call", ["hipMemPoolCreate", "hipMemPoolSetAttribute",
                                  "hipMallocFromPoolAsync"])
def test_async_resource_construction_failure(clean, call):
    before = _handles(clean)
    inject(clean, code=999 if call != "hipMallocFromPoolAsync" else 2, calls=call)
    with pytest.raises(HipError):
        hmr.AsyncMemoryResource(initial_pool_size=MiB)
    clean.clear_faults()
    gc.collect()
    assert _handles(clean) == before, "a pool was left behind"
    with hmr.AsyncMemoryResource(initial_pool_size=MiB) as r:
        serves(r)
    gc.collect()
    assert _handles(clean) == before


def test_injected_faults_sweep(clean):
    """A failure at each allocating or copying call of a typical program in turn (the first,
    then the second, ...): each run raises a HipError and leaves nothing behind."""
    from hipmr_ctypes._hip.emulated import DEFAULT_FAULT_CALLS

    def program():
        with hmr.Stream() as s:
            pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=MiB)
            b = hmr.Buffer.from_host(b"q" * 5000, resource=pool, stream=s)
            out = b.copy_to_host(stream=s)
            s.synchronize()
            assert bytes(out) == b"q" * 5000
            b.close()
            c = hmr.Buffer.from_host(b"w" * 3000)
            c.copy_from_device(hmr.Buffer.from_host(b"e" * 3000))
            c.close()
            for r in (hmr.DeviceMemoryResource(), hmr.ManagedMemoryResource(),
                      hmr.PinnedMemoryResource()):
                r.deallocate(r.allocate(1000), 1000)
            with hmr.Event() as e:
                e.record(s)
            pool.release()

    program()
    gc.collect()
    baseline = (clean.live_allocations(), _handles(clean))
    rt = _hip.get_runtime()
    failed = 0
    for i in range(1, 200):
        seen = [0]
        saved = {name: getattr(rt.fn, name) for name in DEFAULT_FAULT_CALLS}

        def hook(name, func):
            def call(*args):
                seen[0] += 1
                if seen[0] == i:
                    clean.inject_failure(code=999, count=1, calls=name)
                return func(*args)
            return call

        for name, func in saved.items():
            setattr(rt.fn, name, hook(name, func))
        try:
            program()
            done = True
        except HipError as exc:
            assert exc.code == 999, exc
            done = False
            failed += 1
        finally:
            for name, func in saved.items():
                setattr(rt.fn, name, func)
            clean.clear_faults()
        gc.collect()
        if (clean.live_allocations(), _handles(clean)) != baseline:
            raise Leak(f"fault #{i} leaked")
        if done:
            break
    assert failed >= 10, failed
    FAULTS_INJECTED[0] += failed


# ================================================================ the library
def _child(code, **env):
    full = dict(os.environ, PYTHONPATH=str(REPO), **env)
    for key in ("HIPMR_REQUIRE_GPU", "HIP_PLATFORM"):
        full.pop(key, None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, cwd=str(REPO), timeout=120)


def _cli(**env):
    full = dict(os.environ, PYTHONPATH=str(REPO), **env)
    full.pop("HIP_PLATFORM", None)
    return subprocess.run([sys.executable, "-m", "hipmr_ctypes"], capture_output=True,
                          text=True, env=full, cwd=str(REPO), timeout=120)


_PROBE = """
import hipmr_ctypes as hmr
from hipmr_ctypes._hip.exceptions import HipError
try:
    hmr.device_count()
except HipError as exc:
    print("ERROR", type(exc).__name__, "|", str(exc).replace("\\n", " "))
else:
    print("LOADED")
for call in (lambda: hmr.DeviceMemoryResource(), lambda: hmr.Stream(), lambda: hmr.Buffer(8)):
    try:
        call()
    except HipError as exc:
        print("AGAIN", type(exc).__name__)
# what needs no HIP library still works
h = hmr.HostMemoryResource()
p = h.allocate(100)
h.deallocate(p, 100)
with hmr.Buffer.from_host(b"host", resource=h) as b:
    assert b.tobytes() == b"host"
assert hmr.stream_ref(0) == 0 and hmr.is_resource(h)
print("HOST OK")
"""


def _libraries(tmp_path):
    text = tmp_path / "libamdhip64.so"
    text.write_text("this is not a shared library\n")
    libc = ctypes.util.find_library("c") or "libc.so.6"
    return {
        "missing-file": (str(tmp_path / "nope" / "libamdhip64.so"), "LibraryNotFoundError",
                         "no such file"),
        "not-a-library": (str(text), "LibraryNotFoundError", str(text)),
        "lacks-symbols": (libc, "NotSupportedError", "not a "),  # a HIP / CUDA runtime library
    }


@pytest.mark.parametrize("platform", ["amd", "nvidia"])
@pytest.mark.parametrize("which", ["missing-file", "not-a-library", "lacks-symbols"])
def test_library_missing_or_unusable(tmp_path, platform, which):
    path, error, words = _libraries(tmp_path)[which]
    provoked()
    proc = _child(_PROBE, HIPMR_PLATFORM=platform, HIPMR_LIBRARY=path)
    no_crash(proc)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"ERROR {error} |"), proc.stdout
    assert words in lines[0], lines[0]
    assert path in lines[0] or which == "lacks-symbols"
    assert lines[1:4] == [f"AGAIN {error}"] * 3, proc.stdout
    assert lines[-1] == "HOST OK"
    assert proc.stderr == ""
    cli = _cli(HIPMR_PLATFORM=platform, HIPMR_LIBRARY=path)
    no_crash(cli)
    assert cli.returncode == 2, cli.stderr  # a configuration error: one line and a hint
    error_line, hint_line = cli.stderr.splitlines()
    assert words in error_line and hint_line.startswith("hint: "), cli.stderr
    if which == "lacks-symbols":
        assert "point HIPMR_LIBRARY at" in hint_line and "newer" not in hint_line
    assert "Traceback" not in cli.stdout + cli.stderr


def test_missing_symbol_names_it(tmp_path):
    proc = _child(_PROBE, HIPMR_PLATFORM="amd",
                  HIPMR_LIBRARY=ctypes.util.find_library("c") or "libc.so.6")
    assert "hipInit" in proc.stdout.splitlines()[0], proc.stdout


_UNSUPPORTED = """
import gc
import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.exceptions import NotSupportedError
emu = _hip.get_runtime().emulator
try:
    {call}
except NotSupportedError as exc:
    print("NotSupportedError", str(exc).replace("\\n", " "))
gc.collect()
assert emu.live_allocations().count == 0
r = hmr.DeviceMemoryResource()
p = r.allocate(1000)
r.deallocate(p, 1000)
pool = hmr.PoolResource(r)
pool.deallocate(pool.allocate(1000), 1000)
pool.release()
print("DEVICE OK")
"""


@pytest.mark.parametrize("env,call,needle", [
    ({"HIPMR_EMULATED_MISSING": "hipStreamGetDevice"}, "hmr.stream_ref(0).device()",
     "hipStreamGetDevice"),
    ({"HIPMR_EMULATED_VERSION": "5.2.0"}, "hmr.AsyncMemoryResource()", "HIP_MEM_POOL_SUPPORT"),
], ids=["optional-symbol-missing", "version-without-pools"])
def test_unsupported_runtime_features_are_clear_errors(env, call, needle):
    provoked()
    proc = _child(_UNSUPPORTED.format(call=call), HIPMR_PLATFORM="emulated", **env)
    no_crash(proc)
    assert proc.returncode == 0, proc.stderr
    first, last = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
    assert first.startswith("NotSupportedError") and needle in first, proc.stdout
    assert last == "DEVICE OK" and proc.stderr == ""


def test_bad_platform_variable_is_a_clear_error():
    proc = _child("import hipmr_ctypes as hmr\ntry:\n    hmr.device_count()\n"
                  "except ValueError as exc:\n    print('ValueError', exc)\n",
                  HIPMR_PLATFORM="cuda")
    no_crash(proc)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "HIPMR_PLATFORM" in proc.stdout
    cli = _cli(HIPMR_PLATFORM="cuda")
    no_crash(cli)
    assert cli.returncode == 2 and "HIPMR_PLATFORM='cuda'" in cli.stderr.splitlines()[0]

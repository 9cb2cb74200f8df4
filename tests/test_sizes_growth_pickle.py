"""Integer-like sizes, bounded growth, picklable exceptions, copies of resources, and errors
that name the numbers the caller passed."""
from __future__ import annotations

import copy
import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hipmr_ctypes as hmr

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("size_growth_pickle_cases")

ROOT = Path(__file__).resolve().parent.parent


class Index:
    """An integer-like size (as numpy's integers are): only ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def _stacks():
    host = hmr.HostMemoryResource
    return {
        "statistics-over-host": lambda: hmr.StatisticsResource(host()),
        "statistics-over-pool": lambda: hmr.StatisticsResource(hmr.PoolResource(host())),
        "limiting-over-host": lambda: hmr.LimitingResource(host(), 1 << 20),
        "limiting-over-pool": lambda: hmr.LimitingResource(hmr.PoolResource(host()), 1 << 20),
        "tracking": lambda: hmr.TrackingResource(host()),
        "fixed-size": lambda: hmr.FixedSizeResource(host(), 4096, 2),
        "binning": lambda: hmr.BinningResource(host(), [4096]),
        "aligned": lambda: hmr.AlignedResource(host(), 4096),
        "pool": lambda: hmr.PoolResource(host()),
    }


@pytest.mark.parametrize("name", list(_stacks()))
def test_index_sizes_are_ints_everywhere(name):
    r = _stacks()[name]()
    for n in (Index(100), Index(4096)):
        p = r.allocate(n)
        r.deallocate(p, n)
    if hasattr(r, "statistics"):
        s = r.statistics
        assert s.current_bytes == 0 and type(s.total_bytes) is int and s.total_bytes == 4196
    if hasattr(r, "get_allocated_bytes"):
        assert r.get_allocated_bytes() == 0 and type(r.get_allocated_bytes()) is int
    if hasattr(r, "allocation_count"):
        assert r.allocation_count() == 0


@pytest.mark.parametrize("name", list(_stacks()))
@pytest.mark.parametrize("bad", [512.0, "512", None])
def test_non_integer_sizes_are_refused_before_anything_changes(name, bad):
    r = _stacks()[name]()
    p = r.allocate(512)
    with pytest.raises(TypeError, match="bytes"):
        r.deallocate(p, bad)
    with pytest.raises(TypeError, match="bytes"):
        r.allocate(bad)
    r.deallocate(p, 512)   # still live, freed once
    with pytest.raises(ValueError):
        r.deallocate(p, 512) if name not in ("statistics-over-host", "limiting-over-host",
                                             "aligned") else hmr.HostMemoryResource(
        ).deallocate(p, 512)


def test_fixed_size_refuses_a_float_and_a_bool_size_on_free():
    r = hmr.FixedSizeResource(hmr.HostMemoryResource(), 512, 2)
    p = r.allocate(512)
    for bad in (512.0, True):
        with pytest.raises(TypeError):
            r.deallocate(p, bad)
    assert r.allocation_count() == 1
    r.deallocate(p, 512)


@pytest.mark.parametrize("alignment", [256, 4096])
@pytest.mark.parametrize("make", ["PoolResource", "AlignedResource"])
def test_errors_near_2_63_name_the_callers_numbers(make, alignment):
    r = getattr(hmr, make)(hmr.HostMemoryResource())
    for n in ((1 << 63) - 1, 1 << 63):
        with pytest.raises((MemoryError, ValueError)) as info:
            r.allocate(n, alignment)
        import re
        numbers = {int(x) for x in re.findall(r"\d{15,}", str(info.value))}
        assert numbers <= {n, 1 << 63}, str(info.value)


def test_every_exception_class_survives_a_pickle_round_trip():
    from hipmr_ctypes import errors
    made = [errors.HipError(1, "hipErrorInvalidValue", "bad", "hipMalloc"),
            errors.OutOfMemoryError(call="PoolResource.allocate", size=5, detail="d"),
            errors.LibraryNotFoundError("no library", tried=("/a", "/b")),
            errors.ForkedChildError("hipMalloc")]
    for name in ("NotReadyError", "NoDeviceError", "InvalidValueError", "InvalidHandleError",
                 "NotSupportedError"):
        made.append(getattr(errors, name)(1, name, "m", "call"))
    classes = {c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, BaseException)}
    assert classes <= {type(e) for e in made}, classes - {type(e) for e in made}
    for e in made:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
        assert getattr(back, "tried", None) == getattr(e, "tried", None)


def test_a_worker_process_can_send_back_the_missing_library_error():
    code = textwrap.dedent("""
        import concurrent.futures as cf
        import hipmr_ctypes as hmr
        def work():
            hmr.Buffer(10)
        if __name__ == "__main__":
            with cf.ProcessPoolExecutor(1) as ex:
                try:
                    ex.submit(work).result()
                except hmr.LibraryNotFoundError as exc:
                    print("ok", type(exc).__name__)
    """)
    path = ROOT / "build" / "tmp_worker.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(code)
    try:
        env = dict(os.environ, HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so",
                   PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                              env=env, timeout=120)
    finally:
        path.unlink()
    assert proc.stdout == "ok LibraryNotFoundError\n", proc.stderr[-2000:]


def test_the_stored_load_error_does_not_grow():
    code = textwrap.dedent("""
        import hipmr_ctypes as hmr
        from hipmr_ctypes import _hip
        def depth(exc):
            n, tb = 0, exc.__traceback__
            while tb is not None:
                n, tb = n + 1, tb.tb_next
            return n
        seen = []
        for i in range(20000):
            b = hmr.Buffer.from_host(b"x" * 16, resource=hmr.HostMemoryResource())
            b.close()
            try:
                _hip.get_runtime()
            except hmr.LibraryNotFoundError as exc:
                if i in (10, 19999):
                    seen.append(depth(exc))
        print(seen[0] == seen[1], seen)
    """)
    env = dict(os.environ, HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.stdout.startswith("True"), (proc.stdout, proc.stderr[-2000:])


def test_a_pool_forgets_streams_it_no_longer_needs(emulator):
    """20,000 short-lived streams: the pool's per-stream state is bounded by what is live."""
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    for i in range(2000):
        with hmr.Stream() as s:
            p = pool.allocate_async(1000 + 256 * (i % 3), 256, s)
            pool.deallocate_async(p, 1000 + 256 * (i % 3), 256, s)
        if i % 100 == 99:
            q = pool.allocate(1 << 20)   # a miss: the slow path flushes every stream's lists
            pool.deallocate(q, 1 << 20)
    arena = pool._arena
    from hipmr_ctypes.adaptors.pool import _Keyed  # the special handles' fixed entries
    keyed = sum(1 for v in arena.free.values() if isinstance(v, _Keyed))
    assert keyed <= 3
    assert len(arena.free) - keyed <= 101 and len(arena.classes) <= 101
    assert len(arena.streams.events) <= 101
    pool.release()
    assert len(arena.free) - keyed == 1 and len(arena.streams.events) == 0
    assert pool.pool_size() == 0


def test_a_copied_async_resource_is_closed_with_its_pool(emulator):
    a = hmr.AsyncMemoryResource()
    copies = [copy.copy(a), copy.deepcopy(a)]
    held = [(c, c.allocate(100)) for c in copies]
    a.close()
    for c in copies:
        with pytest.raises(ValueError, match="closed"):
            c.allocate(100)
    for c, p in held:
        c.deallocate(p, 100)
    gc.collect()

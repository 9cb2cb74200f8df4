"""The ``check`` and ``bench`` commands of ``python -m hipmr_ctypes``."""
from __future__ import annotations

import json
import statistics
import time
from typing import Callable, Dict, List, Tuple

import hipmr_ctypes as hmr

PATTERN = bytes(range(256)) * 16  # 4 KiB of known data


def _roundtrip(resource) -> str:
    buf = hmr.Buffer.from_host(PATTERN, resource=resource)
    try:
        if buf.tobytes() != PATTERN:
            raise AssertionError("data read back differs from data written")
        twin = hmr.Buffer(len(PATTERN), resource=resource)
        twin.copy_from_device(buf)
        if twin.tobytes() != PATTERN:
            raise AssertionError("device-to-device copy differs")
        twin.close()
    finally:
        buf.close()
    return f"{len(PATTERN)} bytes written, copied and read back"


def _stream_ordered(resource) -> str:
    with hmr.Stream() as s:
        p = resource.allocate_async(1 << 20, 256, s)
        resource.deallocate_async(p, 1 << 20, 256, s)
        s.synchronize()
    return "allocate_async/deallocate_async on a new stream"


def _checks() -> List[Tuple[str, Callable[[], str]]]:
    checks: List[Tuple[str, Callable[[], str]]] = [
        ("HostMemoryResource", lambda: _roundtrip(hmr.HostMemoryResource())),
    ]
    if hmr.device_count() == 0:
        return checks
    checks += [
        ("DeviceMemoryResource", lambda: _roundtrip(hmr.DeviceMemoryResource())),
        ("PinnedMemoryResource", lambda: _roundtrip(hmr.PinnedMemoryResource())),
        ("AsyncMemoryResource", lambda: _roundtrip(hmr.AsyncMemoryResource())
         + "; " + _stream_ordered(hmr.AsyncMemoryResource())),
        ("PoolResource(AsyncMemoryResource)",
         lambda: _roundtrip(hmr.PoolResource(hmr.AsyncMemoryResource()))),
        ("ManagedMemoryResource", lambda: _roundtrip(hmr.ManagedMemoryResource())),
        ("Event timing", _event_timing),
    ]
    return checks


def _event_timing() -> str:
    with hmr.Stream() as s, hmr.Event() as a, hmr.Event() as b:
        buf = hmr.Buffer(64 << 20, stream=s)
        a.record(s)
        buf.memset(7, stream=s)
        b.record(s)
        b.synchronize()
        ms = a.elapsed_time(b)
        buf.close()
    return f"64 MiB memset timed at {ms:.3f} ms"


def check(as_json: bool = False) -> int:
    """Run each check; print a line (or JSON) per check; exit status 1 if any failed."""
    results: Dict[str, Dict[str, str]] = {}
    print_lines = not as_json
    if print_lines:
        print(f"platform: {hmr.platform()}")
    for name, fn in _checks():
        try:
            detail = fn()
            results[name] = {"ok": "yes", "detail": detail}
        except NotImplementedError as exc:
            results[name] = {"ok": "skipped", "detail": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a check reports every failure
            results[name] = {"ok": "no", "detail": f"{type(exc).__name__}: {exc}"}
        if print_lines:
            r = results[name]
            print(f"  {r['ok']:>7}  {name}: {r['detail']}")
    if as_json:
        print(json.dumps({"platform": hmr.platform(), "checks": results}, indent=2))
    return 0 if all(r["ok"] != "no" for r in results.values()) else 1


def _time_pairs(alloc, free, size: int, pairs: int = 20000, repeats: int = 5) -> float:
    runs = []
    for i in range(repeats + 1):
        t0 = time.perf_counter_ns()
        for _ in range(pairs):
            p = alloc(size, 256, 0)
            free(p, size, 256, 0)
        t1 = time.perf_counter_ns()
        if i:
            runs.append((t1 - t0) / pairs)
    return statistics.median(runs)


def bench(as_json: bool = False) -> int:
    """Median ns per allocate+deallocate pair of the package's own resources (no peers)."""
    table: Dict[str, Dict[str, float]] = {}
    candidates = [("HostMemoryResource", hmr.HostMemoryResource)]
    if hmr.device_count():
        candidates += [("AsyncMemoryResource", hmr.AsyncMemoryResource),
                       ("PoolResource(AsyncMemoryResource)",
                        lambda: hmr.PoolResource(hmr.AsyncMemoryResource()))]
    else:
        candidates += [("PoolResource(HostMemoryResource)",
                        lambda: hmr.PoolResource(hmr.HostMemoryResource()))]
    for name, make in candidates:
        r = make()
        ref = hmr.async_resource_ref[()](r)
        table[name] = {f"{s} B": _time_pairs(ref.allocate_async, ref.deallocate_async, s)
                       for s in (256, 65536)}
    if as_json:
        print(json.dumps({"platform": hmr.platform(), "ns_per_pair": table}, indent=2))
    else:
        print(f"platform: {hmr.platform()} (median ns per allocate+deallocate pair through "
              f"async_resource_ref; scripts/bench_alloc.py compares with peers)")
        for name, row in table.items():
            print(f"  {name}: " + ", ".join(f"{k}: {v:,.0f} ns" for k, v in row.items()))
    return 0

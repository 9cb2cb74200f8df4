"""The ``check`` and ``bench`` commands of ``python -m hipmr_ctypes``."""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import hipmr_ctypes as hmr
from hipmr_ctypes.properties import DEFAULT_ALIGNMENT
from hipmr_ctypes._hip.failure import no_device_hint

PATTERN = bytes(range(256)) * 16  # 4 KiB of known data


def _roundtrip(resource: Any) -> str:
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


def _stream_ordered(resource: Any) -> str:
    with hmr.Stream() as s:
        p = resource.allocate_async(1 << 20, DEFAULT_ALIGNMENT, s)
        resource.deallocate_async(p, 1 << 20, DEFAULT_ALIGNMENT, s)
        s.synchronize()
    return "allocate_async/deallocate_async on a new stream"


#: the checks that need a device: on a machine without one they are reported, not run
_DEVICE_CHECKS: List[Tuple[str, Callable[[], str]]] = [
    ("DeviceMemoryResource", lambda: _roundtrip(hmr.DeviceMemoryResource())),
    ("PinnedMemoryResource", lambda: _roundtrip(hmr.PinnedMemoryResource())),
    ("AsyncMemoryResource", lambda: _roundtrip(hmr.AsyncMemoryResource())
     + "; " + _stream_ordered(hmr.AsyncMemoryResource())),
    ("PoolResource(AsyncMemoryResource)",
     lambda: _roundtrip(hmr.PoolResource(hmr.AsyncMemoryResource()))),
    ("ManagedMemoryResource", lambda: _roundtrip(hmr.ManagedMemoryResource())),
    ("Event timing", lambda: _event_timing()),
    ("AsyncMemoryResource reuse across streams", lambda: _pool_reuse()),
    ("register_host", lambda: _registered()),
    ("SystemMemoryResource", lambda: _system_memory()),
]

#: check outcome -> (text column, whether it is a failure)
_STATUS = {"passed": "yes", "failed": "no", "skipped": "skipped", "no device": "no device"}


def _checks() -> List[Tuple[str, Optional[Callable[[], str]]]]:
    """Every check; a device check is ``(name, None)`` when the runtime sees no device."""
    checks: List[Tuple[str, Optional[Callable[[], str]]]] = [
        ("HostMemoryResource", lambda: _roundtrip(hmr.HostMemoryResource())),
        ("PoolResource(HostMemoryResource)",
         lambda: _roundtrip(hmr.PoolResource(hmr.HostMemoryResource()))),
    ]
    have_device = hmr.device_count() > 0
    checks += [(name, fn if have_device else None) for name, fn in _DEVICE_CHECKS]
    from ._config import VARIABLE
    if os.environ.get(VARIABLE, "").strip():
        checks.append((VARIABLE, _configured if have_device else None))
    return checks


def _configured() -> str:
    """The resource HIPMR_DEVICE_RESOURCE describes, built for device 0 and round-tripped."""
    from ._config import build, spec_from_environment
    spec = spec_from_environment()
    assert spec is not None
    mr = build(spec, 0)
    try:
        return f"{spec.text!r} on device 0: {type(mr).__name__}; " + _roundtrip(mr)
    finally:
        close = getattr(mr, "close", None)  # the outermost: a log closed, a runtime pool freed
        if close is not None:
            close()


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


#: the pool self-test: bytes per block, rounds, and fills that keep the writer's stream busy
_REUSE_BYTES = 16 << 20
_REUSE_ROUNDS = 4
_REUSE_STALE_FILLS = 8


def _pool_reuse() -> str:
    """The stream-ordered pool orders reuse across streams: a block written on one stream,
    freed there and taken on another is read there only after the writer's work (the reader
    sees the writer's bytes, never zeros or what was there before), as some HIP releases on
    consumer GPUs got wrong."""
    import ctypes
    from hipmr_ctypes import _hip
    from hipmr_ctypes._hip.types import hipMemcpyDefault
    rt = _hip.get_runtime()
    n = _REUSE_BYTES
    mr = hmr.AsyncMemoryResource()
    reused = 0
    try:
        with hmr.Stream() as writer, hmr.Stream() as reader:
            for r in range(_REUSE_ROUNDS):
                value = (37 * r + 11) & 0xFF
                stale = value ^ 0xFF
                p = mr.allocate_async(n, DEFAULT_ALIGNMENT, writer)
                for _ in range(_REUSE_STALE_FILLS):     # keep the writer's stream busy
                    rt.check(rt.fn.hipMemsetD8Async(p, stale, n, writer.handle),
                             "hipMemsetD8Async")
                rt.check(rt.fn.hipMemsetD8Async(p, value, n, writer.handle),
                         "hipMemsetD8Async")
                mr.deallocate_async(p, n, DEFAULT_ALIGNMENT, writer)
                q = mr.allocate_async(n, DEFAULT_ALIGNMENT, reader)
                try:
                    if q == p:
                        reused += 1
                        out = bytearray(n)
                        host = (ctypes.c_char * n).from_buffer(out)
                        rt.check(rt.fn.hipMemcpyAsync(host, q, n, hipMemcpyDefault,
                                                      reader.handle), "hipMemcpyAsync")
                        reader.synchronize()
                        del host
                        if out.count(value) != n:
                            raise AssertionError(_reuse_failure(out, value, stale))
                finally:
                    mr.deallocate_async(q, n, DEFAULT_ALIGNMENT, reader)
                    writer.synchronize()
                    reader.synchronize()
    finally:
        mr.close()
    if not reused:
        return ("the pool did not hand a block freed on one stream to another here "
                "(nothing to order)")
    return (f"{reused} of {_REUSE_ROUNDS} blocks written on one stream, freed there and "
            "taken on another: the reader saw the writer's bytes")


def _reuse_failure(seen: bytearray, value: int, stale: int) -> str:
    zeros, old = seen.count(0), seen.count(stale)
    what = ", ".join(f"{count} bytes {name}" for count, name in (
        (zeros, "zero"), (old, "of the writer's earlier fills"),
        (len(seen) - zeros - old - seen.count(value), "of other data")) if count)
    return ("the memory pool handed a block freed on one stream to another stream before the "
            f"writer's work was done: the reader saw {what} instead of the writer's "
            f"{len(seen)} bytes of {value:#04x}; use PoolResource over DeviceMemoryResource "
            "instead (HIPMR_DEVICE_RESOURCE=device,pool)")


def _registered() -> str:
    """Host memory pinned where it is (``register_host``): copied in and out directly."""
    data = bytearray(PATTERN)
    out = bytearray(len(PATTERN))
    with hmr.register_host(data), hmr.register_host(out):
        buf = hmr.Buffer.from_host(data)
        buf.copy_to_host(out)
        buf.close()
    if out != data:
        raise AssertionError("data read back differs from data written")
    return f"{len(PATTERN)} bytes of registered host memory copied in and out"


def _system_memory() -> str:
    """System memory used by device 0 (skipped where it has no pageable memory access)."""
    dev = hmr.Device(0)
    if not dev.pageable_memory_access:
        raise NotImplementedError(
            f"device 0 has no pageable memory access (integrated: "
            f"{'yes' if dev.integrated else 'no'}): not an APU, or XNACK / HMM is off")
    return _roundtrip(hmr.SystemMemoryResource(0))


def check(as_json: bool = False) -> int:
    """Run each check; print a line (or JSON) per check; exit status 1 if any failed.

    JSON: ``{"platform", "ok", "checks": {name: {"status", "ok", "ran", "detail"}}}`` where
    ``status`` is ``"passed"``, ``"failed"``, ``"skipped"`` (not supported here) or
    ``"no device"``; ``ok`` is False only for a failure and ``ran`` says whether it ran.
    """
    results: Dict[str, Dict[str, Any]] = {}
    print_lines = not as_json
    platform = hmr.platform()
    if print_lines:
        print(f"platform: {platform}")
    for name, fn in _checks():
        if fn is None:
            status, detail = "no device", no_device_hint(platform)
        else:
            try:
                status, detail = "passed", fn()
            except NotImplementedError as exc:
                status, detail = "skipped", str(exc)
            except Exception as exc:  # noqa: BLE001 - a check reports every failure
                status, detail = "failed", f"{type(exc).__name__}: {exc}"
        results[name] = {"status": status, "ok": status != "failed",
                         "ran": status in ("passed", "failed"), "detail": detail}
        if print_lines:
            print(f"  {_STATUS[status]:>9}  {name}" + (": " + detail if fn else ""))
    ok = all(r["ok"] for r in results.values())
    if print_lines and any(r["status"] == "no device" for r in results.values()):
        print(f"hint: {no_device_hint(platform)}")
    if as_json:
        print(json.dumps({"platform": platform, "ok": ok, "checks": results}, indent=2))
    return 0 if ok else 1


def _time_pairs(alloc: Callable[..., int], free: Callable[..., None], size: int,
                pairs: int = 5000, repeats: int = 5) -> float:
    runs = []
    for i in range(repeats + 1):
        t0 = time.perf_counter_ns()
        for _ in range(pairs):
            p = alloc(size, DEFAULT_ALIGNMENT, 0)
            free(p, size, DEFAULT_ALIGNMENT, 0)
        t1 = time.perf_counter_ns()
        if i:
            runs.append((t1 - t0) / pairs)
    return statistics.median(runs)


def bench(as_json: bool = False) -> int:
    """Median ns per allocate+deallocate pair of the package's own resources (no peers).

    On a machine without a device the device rows say so (JSON: ``null`` rows, listed in
    ``"no_device"``); the host rows are measured everywhere.  A row whose resource cannot be
    made or cannot allocate (a nearly full device) is ``null`` with its error in
    ``"errors"``, the other rows are still measured, and the exit status is 1.
    """
    platform = hmr.platform()
    table: Dict[str, Optional[Dict[str, float]]] = {}
    candidates: List[Tuple[str, Callable[[], Any]]] = [
        ("HostMemoryResource", hmr.HostMemoryResource),
        ("PoolResource(HostMemoryResource)", lambda: hmr.PoolResource(hmr.HostMemoryResource())),
    ]
    device_rows: List[Tuple[str, Callable[[], Any]]] = [
        ("AsyncMemoryResource", hmr.AsyncMemoryResource),
        ("PoolResource(AsyncMemoryResource)", lambda: hmr.PoolResource(hmr.AsyncMemoryResource())),
    ]
    have_device = hmr.device_count() > 0
    no_device = [] if have_device else [name for name, _ in device_rows]
    errors: Dict[str, str] = {}
    for name, make in candidates + (device_rows if have_device else []):
        try:
            r = make()
            ref = hmr.async_resource_ref[()](r)
            table[name] = {f"{s} B": _time_pairs(ref.allocate_async, ref.deallocate_async, s)
                           for s in (256, 65536)}
        except (hmr.HipError, MemoryError) as exc:  # a nearly full device: that row failed
            table[name] = None
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    for name in no_device:
        table[name] = None
    if as_json:
        print(json.dumps({"platform": platform, "ns_per_pair": table, "no_device": no_device,
                          "errors": errors}, indent=2))
    else:
        print(f"platform: {platform} (median ns per allocate+deallocate pair through "
              f"async_resource_ref; scripts/bench_alloc.py compares with peers)")
        for name, row in table.items():
            if name in errors:
                print(f"  {name}: failed: {errors[name]}")
            elif row is None:
                print(f"  {name}: no device")
            else:
                print(f"  {name}: " + ", ".join(f"{k}: {v:,.0f} ns" for k, v in row.items()))
        if no_device:
            print(f"hint: {no_device_hint(platform)}")
    return 1 if errors else 0

#!/usr/bin/env python3
"""One producer and N consumer processes sharing GPU memory through IPC.

The producer (this process, device 0) makes an IPC-enabled pool and one buffer per consumer,
filled with that consumer's pattern.  Each consumer (a ``spawn`` process, on device
``i % device_count``) receives the pool handle and its buffer's descriptor through a queue,
imports the pool, maps the buffer, checks the data, writes it back inverted and unmaps.  The
producer then checks every write-back.  Where the platform can (not on emulated), the same is
done with a legacy ``hipMalloc`` buffer per consumer.

Prints a table of what each process saw and the time to export, send, import, map and first
read; ``--json`` saves it.  Exit status 1 when any check failed.

    HIPMR_PLATFORM=nvidia python3 scripts/ipc_demo.py --consumers 4 --size 64MiB --json out.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402


def pattern(n: int, seed: int) -> bytes:
    block = bytes((i * 7 + seed * 31) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def inverted(data: bytes) -> bytes:
    return bytes(b ^ 0xFF for b in data)


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def consumer(index: int, device: int, inbox: Any, outbox: Any, ready: Any) -> None:
    """Runs in a spawned process."""
    report: Dict[str, Any] = {"process": f"consumer {index}", "pid": os.getpid(),
                              "device": device}
    try:
        hmr.set_device(device)
        import hipmr_ctypes.adaptors  # noqa: F401 - loaded now, not inside the timings
        import hipmr_ctypes.ipc  # noqa: F401
        hmr.Buffer(256).close()   # the runtime and the device's context are up
        ready.put(index)
        handle, descriptor, legacy, sent_at = inbox.get(timeout=300)
        report["send_ms"] = (time.time() - sent_at) * 1e3
        t0 = time.perf_counter()
        res = hmr.AsyncMemoryResource.from_ipc(handle, device=device)
        report["import_pool_ms"] = ms(t0)
        t0 = time.perf_counter()
        buf = hmr.Buffer.from_ipc(descriptor, res)
        report["map_ms"] = ms(t0)
        t0 = time.perf_counter()
        data = buf.tobytes()
        report["first_read_ms"] = ms(t0)
        report["pool_ok"] = data == pattern(descriptor.size, index)
        buf.copy_from_host(inverted(data))
        buf.close()
        res.close()
        handle.close()
        if legacy is not None:
            t0 = time.perf_counter()
            try:
                lbuf = hmr.Buffer.from_ipc(legacy)
            except hmr.NotSupportedError:
                report["legacy_ok"] = "not supported here"
            else:
                report["legacy_open_ms"] = ms(t0)
                ldata = lbuf.tobytes()
                report["legacy_first_read_ms"] = ms(t0)
                report["legacy_ok"] = ldata == pattern(legacy.size, index + 100)
                lbuf.copy_from_host(inverted(ldata))
                lbuf.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the producer
        report["error"] = f"{type(exc).__name__}: {exc}"
    outbox.put(report)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumers", type=int, default=0,
                        help="consumer processes (default: 2 per device, at least 2)")
    parser.add_argument("--size", default="16MiB", help="bytes per buffer (default 16MiB)")
    parser.add_argument("--no-legacy", action="store_true", help="skip the hipMalloc buffers")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    size = parse_bytes(args.size)
    ndev = hmr.device_count()
    n = args.consumers or max(2, 2 * ndev)
    platform = hmr.platform()

    t0 = time.perf_counter()
    mr = hmr.AsyncMemoryResource(0, enable_ipc=True)
    bufs = [hmr.Buffer.from_host(pattern(size, i), resource=mr) for i in range(n)]
    legacy_bufs = [] if args.no_legacy else [
        hmr.Buffer.from_host(pattern(size, i + 100), resource=hmr.DeviceMemoryResource(0))
        for i in range(n)]
    fill_ms = ms(t0)
    t0 = time.perf_counter()
    handle = mr.pool.export_handle()
    export_handle_ms = ms(t0)
    descriptors, times = [], []
    for b in bufs:
        t0 = time.perf_counter()
        descriptors.append(b.export_ipc())
        times.append(ms(t0))
    export_buffer_ms = statistics.median(times)
    legacy_descs = [b.export_ipc() for b in legacy_bufs]

    ctx = mp.get_context("spawn")
    outbox, ready = ctx.Queue(), ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(n)]
    procs = [ctx.Process(target=consumer, args=(i, i % ndev, inboxes[i], outbox, ready))
             for i in range(n)]
    for p in procs:
        p.start()
    for _ in procs:   # every consumer started and set up: the timings below are IPC only
        ready.get(timeout=300)
    for i, box in enumerate(inboxes):
        box.put((handle, descriptors[i], legacy_descs[i] if legacy_descs else None, time.time()))
    reports = [outbox.get(timeout=600) for _ in range(n)]
    for p in procs:
        p.join(60)
    handle.close()
    reports.sort(key=lambda r: r["process"])

    failures = 0
    for r in reports:
        i = int(r["process"].split()[-1])
        r["pool_written_back"] = bufs[i].tobytes() == inverted(pattern(size, i))
        if legacy_bufs and r.get("legacy_ok") is True:
            r["legacy_written_back"] = legacy_bufs[i].tobytes() == inverted(
                pattern(size, i + 100))
        bad = ("error" in r or r.get("pool_ok") is not True or not r["pool_written_back"]
               or r.get("legacy_ok") is False or r.get("legacy_written_back") is False)
        failures += bool(bad)
    for p in procs:
        failures += p.exitcode != 0

    print(f"IPC demo: platform={platform}, devices={ndev}, {n} consumers, "
          f"{size} bytes per buffer")
    print(f"producer pid {os.getpid()} on device 0: fill {fill_ms:.1f} ms, export handle "
          f"{export_handle_ms:.3f} ms, export one buffer {export_buffer_ms:.3f} ms (median)")
    cols = ["process", "device", "pool_ok", "pool_written_back", "legacy_ok", "send_ms",
            "import_pool_ms", "map_ms", "first_read_ms", "legacy_open_ms"]
    print(" | ".join(f"{c:>17}" for c in cols))
    for r in reports:
        cells = []
        for c in cols:
            v = r.get(c, "-")
            cells.append(f"{v:>17.3f}" if isinstance(v, float) else f"{str(v):>17}")
        print(" | ".join(cells))
        if "error" in r:
            print(f"   {r['process']} error: {r['error']}")
    print("all checks passed" if not failures else f"{failures} FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"platform": platform, "devices": ndev, "consumers": n, "size": size,
                       "export_handle_ms": export_handle_ms,
                       "export_buffer_ms": export_buffer_ms, "reports": reports,
                       "failures": failures}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Sleep and wake: pause / resume of a ``VirtualMemoryResource`` allocation, beside the pinned
copy bandwidth measured in the same run.

For each ``--sizes`` entry, one allocation of that many bytes is filled, then each round takes
turns (``_timing.take_turns``) between:

* ``backup, new blocks``: the first cycle of a resource: its spare pinned blocks are freed
  first (``release_backup_memory()``, not timed), then ``pause()`` (device synchronize,
  pinned blocks allocated and copied into, unmap, release) and ``resume()`` (new memory
  mapped, copies back, blocks kept as spares), each timed; the first and last MiB are checked
  after every resume;
* ``backup, blocks kept``: every later cycle: the same with the blocks the resume before kept
  (the pause allocates no host memory);
* ``pause + resume, discard``: the same with ``backup=False`` (resume zero-fills);
* ``pinned copies``: ``hipMemcpyAsync`` of the whole allocation into a pinned buffer made once
  (not timed) and back, each timed: the bandwidth a backup can at best reach;
* ``pinned allocation``: ``hipHostMalloc`` + ``hipHostFree`` of the same bytes in the blocks a
  backup uses, timed: what a backup pays to get its host memory.

The table gives medians over ``--rounds`` rounds: seconds and GB/s, and each backup row's GB/s
as a share of the pinned copy's.  The device's free memory is read before and after each pause
(the bytes it gained).  ``--json`` saves every sample.

    HIPMR_PLATFORM=nvidia python3 scripts/bench_vmm.py --sizes 1GiB,16GiB --json vmm.json
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes import _hip  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402
from hipmr_ctypes.resources import virtual  # noqa: E402

from _timing import save_json, take_turns  # noqa: E402

MiB = 1 << 20
#: the rows of cycles with a backup: the first of a resource, and every later one
BACKUP_ROWS = ("backup, new blocks", "backup, blocks kept")


def _check(rt: Any, ptr: int, size: int, value: int) -> None:
    """The first and last MiB at ``ptr`` hold ``value`` (the bytes survived)."""
    n = min(MiB, size)
    out = ctypes.create_string_buffer(n)
    for at in (ptr, ptr + size - n):
        rt.check(rt.fn.hipMemcpy(out, at, n, 2), "hipMemcpy")
        if out.raw != bytes([value]) * n:
            raise SystemExit(f"bench_vmm: the bytes at {at:#x} did not survive")


def _free() -> int:
    hmr.synchronize()
    return hmr.available_device_memory()[0]


def bench(size: int, rounds: int) -> Dict[str, Any]:
    rt = _hip.get_runtime()
    fn = rt.fn
    vmm = hmr.VirtualMemoryResource()
    buf = hmr.Buffer(size, resource=vmm)
    buf.fill(0x5A)
    host = ctypes.c_void_p()
    rt.check(fn.hipHostMalloc(host, size, 1), "hipHostMalloc", size=size)
    gained: List[int] = []

    def timed(op: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        op()
        return time.perf_counter() - t0

    def cycle(backup: bool, kept: bool = False) -> Dict[str, float]:
        if backup and not kept:
            vmm.release_backup_memory()
        elif backup and vmm.backup_bytes < size:   # no cycle before this one: one, not timed
            vmm.pause()
            vmm.resume()
        before = _free()
        pause = timed(lambda: vmm.pause(backup=backup))
        gained.append(_free() - before)
        resume = timed(vmm.resume)
        _check(rt, buf.ptr, size, 0x5A if backup else 0)
        if not backup:
            buf.fill(0x5A)
        return {"pause_s": pause, "resume_s": resume}

    def copies() -> Dict[str, float]:
        def d2h() -> None:
            rt.check(fn.hipMemcpyAsync(host.value, buf.ptr, size, 2, 0), "hipMemcpyAsync")
            rt.check(fn.hipStreamSynchronize(0), "hipStreamSynchronize")

        def h2d() -> None:
            rt.check(fn.hipMemcpyAsync(buf.ptr, host.value, size, 1, 0), "hipMemcpyAsync")
            rt.check(fn.hipStreamSynchronize(0), "hipStreamSynchronize")
        return {"to_host_s": timed(d2h), "to_device_s": timed(h2d)}

    def pinned_allocation() -> Dict[str, float]:
        def make_and_free() -> None:
            blocks = []
            for offset in range(0, size, virtual.BACKUP_CHUNK):
                out = ctypes.c_void_p()
                rt.check(fn.hipHostMalloc(out, min(virtual.BACKUP_CHUNK, size - offset), 1),
                         "hipHostMalloc")
                blocks.append(out.value)
            for block in blocks:
                fn.hipHostFree(block)
        return {"allocate_and_free_s": timed(make_and_free)}

    try:
        samples = take_turns({"backup, new blocks": lambda: cycle(True),
                              "backup, blocks kept": lambda: cycle(True, kept=True),
                              "discard": lambda: cycle(False),
                              "pinned copies": copies, "pinned allocation": pinned_allocation},
                             rounds)
    finally:
        fn.hipHostFree(host.value)
        del buf
        kept = vmm.backup_bytes               # the blocks the last resume kept
        vmm.release_backup_memory()
    medians = {row: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
               for row, runs in samples.items()}
    gbs = {row: {k.replace("_s", "_gbs"): size / v / 1e9 for k, v in m.items() if v > 0}
           for row, m in medians.items()}
    pinned = gbs["pinned copies"]
    share = {row: {"pause vs to_host": gbs[row]["pause_gbs"] / pinned["to_host_gbs"],
                   "resume vs to_device": gbs[row]["resume_gbs"] / pinned["to_device_gbs"]}
             for row in BACKUP_ROWS}
    return {"size": size, "rounds": rounds, "granularity": vmm.granularity,
            "medians_s": medians, "gbs": gbs, "backup_share_of_pinned": share,
            "free_memory_gained": gained, "backup_bytes_kept": kept, "samples": samples}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1GiB,16GiB")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if hmr.device_count() < 1:
        print("bench_vmm: no device", file=sys.stderr)
        return 2
    results = [bench(parse_bytes(s.strip()), args.rounds) for s in args.sizes.split(",")]
    print(f"pause / resume of one allocation, median of {args.rounds} rounds "
          f"({hmr.platform()} platform)")
    print(f"{'size':>8} | {'row':>20} | {'pause s':>9} | {'resume s':>9} | {'GB/s':>14} | note")
    for r in results:
        size, m, g = r["size"], r["medians_s"], r["gbs"]
        label = f"{size / (1 << 30):.3g}GiB" if size >= 1 << 30 else f"{size / MiB:.3g}MiB"
        for row in BACKUP_ROWS + ("discard",):
            note = f"gained {min(r['free_memory_gained']) / (1 << 30):.3g} GiB (least)"
            if row in BACKUP_ROWS:
                share = r["backup_share_of_pinned"][row]
                note += (f"; {share['pause vs to_host']:.0%} / "
                         f"{share['resume vs to_device']:.0%} of pinned copies")
            print(f"{label:>8} | {row:>20} | {m[row]['pause_s']:>9.4f} | "
                  f"{m[row]['resume_s']:>9.4f} | {g[row]['pause_gbs']:>6.1f} {g[row]['resume_gbs']:>7.1f}"
                  f" | {note}")
        print(f"{label:>8} | {'pinned copies':>20} | {m['pinned copies']['to_host_s']:>9.4f} | "
              f"{m['pinned copies']['to_device_s']:>9.4f} | "
              f"{g['pinned copies']['to_host_gbs']:>6.1f} {g['pinned copies']['to_device_gbs']:>7.1f} | "
              f"the bound")
        print(f"{label:>8} | {'pinned allocation':>20} | "
              f"{m['pinned allocation']['allocate_and_free_s']:>9.4f} | {'':>9} | "
              f"{g['pinned allocation']['allocate_and_free_gbs']:>6.1f} {'':>7} | "
              f"hipHostMalloc + hipHostFree in {virtual.BACKUP_CHUNK >> 20} MiB blocks")
    save_json(args.json, {"platform": hmr.platform(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

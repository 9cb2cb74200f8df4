#!/usr/bin/env python3
"""Draw the fragmentation a PoolResource pays: live bytes against the pool's size over time.

    HIPMR_PLATFORM=nvidia python scripts/plot_fragmentation.py --svg out/fragmentation.svg
    HIPMR_PLATFORM=emulated python scripts/plot_fragmentation.py --ops 1500 --cap 1GiB \\
        --svg docs/observability-fragmentation.svg

Runs the fragmentation workload of ``scripts/bench_alloc.py`` (random sizes 1 KiB-64 MiB with
random lifetimes, a fixed seed) on stream 0 through
``hipmr_ctypes.plot.record(PoolResource(AsyncMemoryResource()))`` and writes the picture
(``--svg``, ``--html``) and the CSV log (``--log``).  Prints the platform, the device, the peak
live bytes, the peak pool size and their ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hipmr_ctypes as hmr  # noqa: E402
from bench_alloc import fragmentation_workload  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ops", type=int, default=4000, help="allocations and frees")
    parser.add_argument("--cap", type=parse_bytes, default=6 << 30,
                        help="free while more than this is live (default 6GiB)")
    parser.add_argument("--svg", default=None, help="write the picture as SVG here")
    parser.add_argument("--html", default=None, help="write the page (picture + statistics)")
    parser.add_argument("--log", default=None, help="write the CSV log here")
    args = parser.parse_args(argv)
    device = hmr.Device(0)
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    recording = hmr.plot.record(pool)
    start = time.perf_counter()
    peak_pool, peak_live = fragmentation_workload(
        args.seed, args.ops, lambda n: recording.allocate_async(n, 256, 0),
        lambda p, n: recording.deallocate_async(p, n, 256, 0), pool.pool_size, args.cap)
    elapsed = time.perf_counter() - start
    title = (f"PoolResource over AsyncMemoryResource on {device.name} ({hmr.platform()}): "
             f"fragmentation workload, seed {args.seed}")
    for path, fmt in ((args.svg, "svg"), (args.html, "html")):
        if path:
            hmr.plot.timeline(recording, path, format=fmt, title=title, width=1100, height=460)
    if args.log:
        with open(args.log, "w", encoding="ascii") as fh:
            fh.write(recording.file.getvalue())
    pool.release()
    print(f"platform {hmr.platform()}, device {device.name}; {args.ops} operations in "
          f"{elapsed:.2f} s; peak live {peak_live:,} bytes, peak pool {peak_pool:,} bytes, "
          f"ratio {peak_pool / max(peak_live, 1):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

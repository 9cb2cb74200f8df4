#!/usr/bin/env python3
"""The hot paths' own cost, without a GPU: median ns per allocate + deallocate pair of the pool
(direct, through ``async_resource_ref``, with a ``stream_ref`` argument), the statistics and
limiting adaptors over it, and ``AsyncMemoryResource``'s Python part (its two native calls
replaced by no-ops), the loops taking turns over many short rounds.

    HIPMR_PLATFORM=emulated python scripts/bench_hotpaths.py [--rounds 41] [--json out.json]

Use it to measure a change to a hot path before and after (run both versions alternately on
the same machine); ``scripts/bench_alloc.py`` on the GPU machine is the number to report.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._hip import get_runtime  # noqa: E402


def loops() -> Dict[str, Callable[[int], None]]:
    amr = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(amr, initial_pool_size=64 << 20)
    ref = hmr.async_resource_ref[hmr.device_accessible](pool)
    stats = hmr.StatisticsResource(pool)
    lim = hmr.LimitingResource(pool, 1 << 40)
    bare = hmr.AsyncMemoryResource()
    bare._malloc = lambda out, n, pool_handle, stream: 0     # no native call: Python only
    bare._free_fn = lambda ptr, stream: 0

    def pair(alloc: Any, free: Any, stream: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                p = alloc(256, 256, stream)
                free(p or 4096, 256, 256, stream)
        return run

    out = {
        "PoolResource direct": pair(pool.allocate_async, pool.deallocate_async, 0),
        "PoolResource via async_resource_ref": pair(ref.allocate_async, ref.deallocate_async, 0),
        "... with a stream_ref argument": pair(ref.allocate_async, ref.deallocate_async,
                                               hmr.stream_ref(0)),
        "StatisticsResource over the pool": pair(stats.allocate_async, stats.deallocate_async,
                                                 0),
        "LimitingResource over the pool": pair(lim.allocate_async, lim.deallocate_async, 0),
        "AsyncMemoryResource, Python part": pair(bare.allocate_async, bare.deallocate_async, 0),
    }
    for name, res in {
            "TrackingResource over the pool": hmr.TrackingResource(pool),
            "FailureCallbackResource over the pool":
                hmr.FailureCallbackResource(pool, lambda n: False),
            "AlignedResource(512) over the pool": hmr.AlignedResource(pool, 512),
            "BinningResource over the pool": hmr.BinningResource(pool, bins=[1024, 65536]),
            "FixedSizeResource over AsyncMemoryResource":
                hmr.FixedSizeResource(amr, block_size=1 << 20, blocks_to_preallocate=4)}.items():
        out[name] = pair(res.allocate_async, res.deallocate_async, 0)
    return out


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--pairs", type=int, default=4000, help="pairs per timed run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    runs = loops()
    samples: Dict[str, List[float]] = {name: [] for name in runs}
    for run in runs.values():
        run(1000)
    for _ in range(args.rounds):
        for name, run in runs.items():
            t0 = time.perf_counter_ns()
            run(args.pairs)
            samples[name].append((time.perf_counter_ns() - t0) / args.pairs)
    result = {name: statistics.median(v) for name, v in samples.items()}
    print(f"median ns per pair, {args.rounds} rounds, Python {sys.version.split()[0]}, "
          f"platform {get_runtime().platform}")
    for name, ns in result.items():
        print(f"  {name:40s} {ns:7.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

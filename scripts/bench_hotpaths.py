#!/usr/bin/env python3
"""The hot paths' own cost, without a GPU: median ns per allocate + deallocate pair of the pool
(direct, through ``async_resource_ref``, with a ``stream_ref`` or ``Stream`` argument), the
adaptors over it, and ``AsyncMemoryResource``'s Python part (its two native calls replaced by
no-ops); then the everyday paths, ns per operation: a ``Buffer`` made and closed (or dropped)
over the pool passed directly, through a ref and as the current device resource, the concept
checks and ref construction over the pool, an adaptor and a class of the user's.  The loops take
turns over many short rounds.

    HIPMR_PLATFORM=emulated python scripts/bench_hotpaths.py [--rounds 41] [--json out.json]

Use it to measure a change to a hot path before and after (run both versions alternately on
the same machine); ``scripts/bench_alloc.py`` on the GPU machine is the number to report.

``--callgrind`` counts instructions instead (repeatable on a loaded machine): the script runs
itself under ``valgrind --tool=callgrind`` once, and for each row (``--rows`` picks the rows
whose name contains one of its comma-separated words) counts a run of ``--small`` and one of
``--large`` operations after a warm-up, between marker calls (``os.getppid()``, dumped with
``--dump-before=getppid``: the C library's function, whose name a distribution's stripped
interpreter keeps, unlike CPython's own ``os_getppid``); a row's number is the difference
divided by the difference of the counts (the loop included, no start-up or warm-up).
When ``sys.executable`` is a script that execs the real interpreter (as CI's CPython 3.14 and
ROCm-release pythons are), ``--trace-children=yes`` follows it there.

    HIPMR_PLATFORM=emulated python scripts/bench_hotpaths.py --callgrind --rows Binning,Fixed
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import tempfile
import sys
import threading
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._hip import get_runtime  # noqa: E402

from _adaptor_rows import adaptors_over  # noqa: E402
from _timing import ns_per_op, print_rows, save_json  # noqa: E402


def loops() -> Dict[str, Callable[[int], None]]:
    amr = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(amr, initial_pool_size=64 << 20)
    ref = hmr.async_resource_ref[hmr.device_accessible](pool)
    stats = hmr.StatisticsResource(pool)
    lim = hmr.LimitingResource(pool, 1 << 40)
    try:
        vpool: Any = hmr.VirtualPoolResource()
        vpool.deallocate(vpool.allocate(64 << 20), 64 << 20)  # mapped once, as the pool's chunk
    except hmr.NotSupportedError:   # no virtual memory here: the row is left out
        vpool = None
    bare = hmr.AsyncMemoryResource()
    bare._malloc = lambda out, n, pool_handle, stream: 0     # no native call: Python only
    bare._free_fn = lambda ptr, stream: 0

    out = {
        "PoolResource direct": pair(pool.allocate_async, pool.deallocate_async, 0),
        "PoolResource via async_resource_ref": pair(ref.allocate_async, ref.deallocate_async, 0),
        "... with a stream_ref argument": pair(ref.allocate_async, ref.deallocate_async,
                                               hmr.stream_ref(0)),
        "StatisticsResource over the pool": pair(stats.allocate_async, stats.deallocate_async,
                                                 0),
        "LimitingResource over the pool": pair(lim.allocate_async, lim.deallocate_async, 0),
        "PoolResource on the per-thread stream (2)": pair(pool.allocate_async,
                                                          pool.deallocate_async, 2),
        "AsyncMemoryResource, Python part": pair(bare.allocate_async, bare.deallocate_async, 0),
    }
    if vpool is not None:
        out["VirtualPoolResource, mapped memory"] = pair(vpool.allocate_async,
                                                         vpool.deallocate_async, 0)
    others = adaptors_over(pool, "the pool")
    others.update({
            "FixedSizeResource(1 KiB) over the pool": hmr.FixedSizeResource(pool, 1024),
            "FixedSizeResource over AsyncMemoryResource":
                hmr.FixedSizeResource(amr, block_size=1 << 20, blocks_to_preallocate=4)})
    for name, res in others.items():
        out[name] = pair(res.allocate_async, res.deallocate_async, 0)
    out.update(everyday(pool, stats))
    out.update(thread_lookups())
    return out


def thread_lookups() -> Dict[str, Callable[[int], None]]:
    """The per-thread stream's floor: a pair on it must find the calling thread's free lists
    twice (once per call).  Two such look-ups per iteration with the cheapest thread-aware
    primitives there are, beside two plain dict reads (what the stream-0 pair does instead):
    a row minus the dict row is what any per-thread pair costs on top of the stream-0 pair,
    before anything else it does."""
    sizes: Dict[int, Any] = {}
    plain = {0: sizes}
    local = threading.local()
    local.sizes = sizes
    by_ident = {threading.get_ident(): sizes}
    get_ident = threading.get_ident

    def dict_reads(n: int) -> None:
        for _ in range(n):
            plain[0]
            plain[0]

    def local_reads(n: int) -> None:
        for _ in range(n):
            local.sizes
            local.sizes

    def ident_reads(n: int) -> None:
        for _ in range(n):
            by_ident[get_ident()]
            by_ident[get_ident()]

    return {"per-thread floor: two dict reads": dict_reads,
            "per-thread floor: two threading.local reads": local_reads,
            "per-thread floor: two get_ident() look-ups": ident_reads}


class _UserResource:
    """A resource written the way a user would, over the pool."""

    def __init__(self, upstream: Any) -> None:
        self._up = upstream

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        return int(self._up.allocate(bytes, alignment))

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        self._up.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        return int(self._up.allocate_async(bytes, alignment, stream))

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        self._up.deallocate_async(ptr, bytes, alignment, stream)

    def __eq__(self, other: object) -> bool:
        return other is self

    __hash__ = object.__hash__
    properties = (hmr.device_accessible,)


def everyday(pool: Any, stats: Any) -> Dict[str, Callable[[int], None]]:
    """The paths users take: one operation per iteration."""
    Buffer = hmr.Buffer
    ref = hmr.async_resource_ref[hmr.device_accessible](pool)
    ARef = hmr.async_resource_ref[hmr.device_accessible]
    user = _UserResource(pool)
    hmr.set_current_device_resource(pool)
    stream = hmr.Stream()

    def buffer_close(resource: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                Buffer(256, resource=resource).close()
        return run

    def buffer_drop(resource: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                Buffer(256, resource=resource)
        return run

    def repeat(fn: Callable[[Any], Any], arg: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                fn(arg)
        return run

    def new_stats_ref(n: int) -> None:
        for _ in range(n):
            ARef(hmr.StatisticsResource(pool))

    return {
        "... with a Stream argument": pair(ref.allocate_async, ref.deallocate_async, stream),
        "Buffer(256, resource=pool) + close()": buffer_close(pool),
        "Buffer(256, resource=pool), dropped": buffer_drop(pool),
        "Buffer(256, resource=ref) + close()": buffer_close(ref),
        "Buffer(256, resource=ref), dropped": buffer_drop(ref),
        "Buffer(256), pool current + close()": buffer_close(None),
        "Buffer(256), pool current, dropped": buffer_drop(None),
        "is_async_resource(pool)": repeat(hmr.is_async_resource, pool),
        "is_async_resource(StatisticsResource)": repeat(hmr.is_async_resource, stats),
        "is_async_resource(user class)": repeat(hmr.is_async_resource, user),
        "async_resource_ref[d_a](pool)": repeat(ARef, pool),
        "async_resource_ref[d_a](StatisticsResource)": repeat(ARef, stats),
        "async_resource_ref[d_a](user class)": repeat(ARef, user),
        "ref of a new StatisticsResource(pool)": new_stats_ref,
    }


def pair(alloc: Any, free: Any, stream: Any) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            p = alloc(256, 256, stream)
            free(p or 4096, 256, 256, stream)
    return run


#: the everyday rows: ``--ops`` operations per timed run (the pair rows: ``--pairs`` pairs)
_EVERYDAY_KEYS = ("Buffer(256, resource=pool) + close()", "Buffer(256, resource=pool), dropped",
                  "Buffer(256, resource=ref) + close()", "Buffer(256, resource=ref), dropped",
                  "Buffer(256), pool current + close()", "Buffer(256), pool current, dropped",
                  "is_async_resource(pool)", "is_async_resource(StatisticsResource)",
                  "is_async_resource(user class)", "async_resource_ref[d_a](pool)",
                  "async_resource_ref[d_a](StatisticsResource)",
                  "async_resource_ref[d_a](user class)", "ref of a new StatisticsResource(pool)")


def _picked(names: Any, rows: Any) -> List[str]:
    words = [w for w in (rows or "").split(",") if w]
    return [n for n in names if not words or any(w in n for w in words)]


def _instrumented(args: Any) -> int:
    """Under callgrind: warm-up, marker, ``small`` ops, marker, ``large`` ops, marker, per
    row; the row names go to ``args.names_to`` in order."""
    runs = loops()
    names = _picked(runs, args.rows)
    with open(args.names_to, "w") as fh:
        fh.write("\n".join(names))
    marker = os.getppid
    for name in names:
        run = runs[name]
        run(args.warmup)
        marker()
        run(args.small)
        marker()
        run(args.large)
        marker()
    return 0


def _totals(path: str) -> int:
    with open(path) as fh:
        for line in fh:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"{path}: no instruction total")


def _callgrind(args: Any) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        names_to = os.path.join(tmp, "names")
        out = os.path.join(tmp, "cg.out")
        with open(sys.executable, "rb") as fh:
            wrapper = fh.read(2) == b"#!"  # a script: follow it into the interpreter it runs
        cmd = ["valgrind", "--tool=callgrind", "--dump-before=getppid",
               *(["--trace-children=yes"] if wrapper else []),
               f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
               "--instrumented", "--names-to", names_to, "--rows", args.rows or "",
               "--small", str(args.small), "--large", str(args.large),
               "--warmup", str(args.warmup)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(names_to) as fh:
            names = [n for n in fh.read().split("\n") if n]
        dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(re.sub(r".*\.", "", p)))
        counts = [_totals(p) for p in dumps]
        if len(counts) < 3 * len(names):
            raise RuntimeError(f"{len(counts)} dumps for {len(names)} rows")
        result = {}
        for i, name in enumerate(names):
            small, large = counts[3 * i + 1], counts[3 * i + 2]
            result[name] = (large - small) / (args.large - args.small)
    print_rows(f"callgrind instructions per pair (per operation for the everyday paths), "
               f"{args.large} - {args.small} operations, Python {sys.version.split()[0]}, "
               f"platform {get_runtime().platform}", result)
    save_json(args.json, result)
    return 0


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--callgrind", action="store_true",
                    help="count instructions under valgrind's callgrind instead of timing")
    ap.add_argument("--rows", default=None,
                    help="with --callgrind: only the rows whose name contains one of these "
                         "comma-separated words")
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--instrumented", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--names-to", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--pairs", type=int, default=4000, help="pairs per timed run")
    ap.add_argument("--ops", type=int, default=400,
                    help="operations per timed run of the everyday paths")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if hmr.device_count() == 0:  # one clear line, not a traceback from the first allocation
        print(f"bench_hotpaths.py: the {hmr.platform()} platform sees no device; "
              f"HIPMR_PLATFORM=emulated runs it on host memory", file=sys.stderr)
        return 2
    if args.instrumented:
        return _instrumented(args)
    if args.callgrind:
        return _callgrind(args)
    result = ns_per_op({name: (run, args.ops if name in _EVERYDAY_KEYS else args.pairs)
                        for name, run in loops().items()}, args.rounds, warmup=200)
    print_rows(f"median ns per pair (per operation below the pairs), {args.rounds} rounds, "
               f"Python {sys.version.split()[0]}, platform {get_runtime().platform}", result)
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

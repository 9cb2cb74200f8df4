#!/usr/bin/env python3
"""Copy bandwidth of Buffer beside CuPy and PyTorch doing the same thing, several sizes.

Each row is one thing a user does, in each library's own spelling:

========================  ================================  ===================  ==================
row                       ours                              CuPy                 PyTorch
========================  ================================  ===================  ==================
D2H new bytes             ``buf.tobytes()``                 ``arr.get()``        ``t.cpu()``
D2H new bytearray         ``buf.copy_to_host()``            ``arr.get()``        ``t.cpu()``
D2H into pageable         ``buf.copy_to_host(out)``         ``arr.get(out=out)``  ``out_t.copy_(t)``
H2D new (alloc + copy)    ``Buffer.from_host(a)``           ``cupy.asarray(a)``  ``torch.from_numpy(a).cuda()``
H2D from pageable         ``buf.copy_from_host(a)``         ``arr.set(a)``       ``t.copy_(a_t)``
H2D from pinned           ``buf.copy_from_device(pinned)``  ``arr.set(pinned)``  ``t.copy_(pinned_t)``
D2H into pinned           ``pinned.copy_from_device(buf)``  ``arr.get(out=pin)``  ``pin_t.copy_(t)``
D2D                       ``dst.copy_from_device(src)``     ``cupy.copyto``      ``d.copy_(s)``
pickle round trip         ``pickle.loads(pickle.dumps(b))``  the same             the same
========================  ================================  ===================  ==================

Every call ends with the data where it goes (device work synchronized).  The libraries take
turns within each round, each round in an order of its own; a cell is the median GB/s (bytes
moved / seconds) over ``--rounds`` rounds, each at least ``--min-ms`` long.  Missing peers are
left out.  ``--json`` saves it all.

    HIPMR_PLATFORM=nvidia python3 scripts/bench_copy.py --sizes 4KiB,1MiB,64MiB,256MiB,1GiB \\
        --json copy.json
"""
from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402

from _timing import save_json, seconds_per_call, take_turns  # noqa: E402

ROWS = ["D2H new bytes", "D2H new bytearray", "D2H into pageable", "H2D new (alloc + copy)",
        "H2D from pageable", "H2D from pinned", "D2H into pinned", "D2D", "pickle round trip"]
Op = Callable[[], Any]


def _ours(n: int) -> Dict[str, Op]:
    import numpy
    mr = hmr.AsyncMemoryResource()
    buf = hmr.Buffer.from_host(numpy.full(n, 7, dtype=numpy.uint8), resource=mr)
    dst = hmr.Buffer(n, resource=mr)
    pinned = hmr.Buffer(n, resource=hmr.PinnedMemoryResource())
    host = numpy.ones(n, dtype=numpy.uint8)
    out = numpy.empty(n, dtype=numpy.uint8)
    out.fill(0)

    def h2d_new() -> None:
        hmr.Buffer.from_host(host, resource=mr).close()

    return {"D2H new bytes": buf.tobytes, "D2H new bytearray": buf.copy_to_host,
            "D2H into pageable": lambda: buf.copy_to_host(out),
            "H2D new (alloc + copy)": h2d_new,
            "H2D from pageable": lambda: buf.copy_from_host(host),
            "H2D from pinned": lambda: dst.copy_from_device(pinned),
            "D2H into pinned": lambda: pinned.copy_from_device(buf),
            "D2D": lambda: dst.copy_from_device(buf),
            "pickle round trip": lambda: pickle.loads(pickle.dumps(buf, protocol=5))}


def _cupy(n: int) -> Optional[Dict[str, Op]]:
    try:
        import cupy
        import cupyx
        import numpy
    except ImportError:
        return None
    arr = cupy.full(n, 7, dtype=cupy.uint8)
    dst = cupy.empty(n, dtype=cupy.uint8)
    host = numpy.ones(n, dtype=numpy.uint8)
    out = numpy.empty(n, dtype=numpy.uint8)
    out.fill(0)
    pinned = cupyx.empty_pinned(n, dtype=numpy.uint8)
    pinned.fill(1)
    sync = cupy.cuda.Device().synchronize

    def d2d() -> None:
        cupy.copyto(dst, arr)
        sync()

    def h2d_pinned() -> None:
        dst.set(pinned)
        sync()

    def d2h_pinned() -> None:
        arr.get(out=pinned)
        sync()

    def set_pageable() -> None:
        dst.set(host)
        sync()

    def h2d_new() -> None:
        cupy.asarray(host)
        sync()

    return {"D2H new bytes": lambda: arr.get().tobytes(), "D2H new bytearray": arr.get,
            "D2H into pageable": lambda: arr.get(out=out),
            "H2D new (alloc + copy)": h2d_new, "H2D from pageable": set_pageable,
            "H2D from pinned": h2d_pinned, "D2H into pinned": d2h_pinned, "D2D": d2d,
            "pickle round trip": lambda: pickle.loads(pickle.dumps(arr, protocol=5))}


def _torch(n: int) -> Optional[Dict[str, Op]]:
    try:
        import numpy
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    t = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    host = numpy.ones(n, dtype=numpy.uint8)
    host_t = torch.from_numpy(host)
    out_t = torch.zeros(n, dtype=torch.uint8)
    pinned = torch.ones(n, dtype=torch.uint8).pin_memory()
    sync = torch.cuda.synchronize

    def run(fn: Callable[[], Any]) -> Op:
        def op() -> None:
            fn()
            sync()
        return op

    return {"D2H new bytes": lambda: t.cpu().numpy().tobytes(), "D2H new bytearray": t.cpu,
            "D2H into pageable": run(lambda: out_t.copy_(t)),
            "H2D new (alloc + copy)": run(lambda: torch.from_numpy(host).cuda()),
            "H2D from pageable": run(lambda: dst.copy_(host_t)),
            "H2D from pinned": run(lambda: dst.copy_(pinned)),
            "D2H into pinned": run(lambda: pinned.copy_(t)),
            "D2D": run(lambda: dst.copy_(t)),
            "pickle round trip": lambda: pickle.loads(pickle.dumps(t))}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB,256MiB,1GiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-ms", type=float, default=30.0)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    parser.add_argument("--json", default=None)
    parser.add_argument("--staging", default="on", choices=["on", "off"],
                        help="off: large pageable copies go to the runtime directly")
    parser.add_argument("--staging-chunk", default=None,
                        help="the pinned chunk of the staged copies (default: the package's)")
    parser.add_argument("--staging-workers", type=int, default=None,
                        help="pipelines per staged copy (default: the package's)")

    args = parser.parse_args(argv)
    from hipmr_ctypes._buffer import staging as _staging
    if args.staging == "off":
        _staging.THRESHOLD = _staging.TO_HOST_THRESHOLD = 1 << 62
        _staging.TO_EXISTING_HOST_THRESHOLD = 1 << 62
    if args.staging_chunk:
        _staging.CHUNK = parse_bytes(args.staging_chunk)
    if args.staging_workers:
        _staging.WORKERS = args.staging_workers

    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {', '.join(ROWS)}")
    makers = {"ours": _ours, "CuPy": _cupy, "PyTorch": _torch}
    results: List[Dict[str, Any]] = []
    min_s = args.min_ms / 1000
    print(f"{'row':24} {'size':>9} " + " ".join(f"{k:>9}" for k in makers) + "  ours/best")
    for n in sizes:
        libs = {name: make(n) for name, make in makers.items()}
        libs = {k: v for k, v in libs.items() if v is not None}
        for row in rows:
            for name, ops in libs.items():
                ops[row]()  # warm up (first-touch, allocator caches)
            times = take_turns({name: (lambda op=ops[row]: seconds_per_call(op, min_s))
                                for name, ops in libs.items()}, args.rounds, shuffle=True)
            gbs = {k: n / statistics.median(v) / 1e9 for k, v in times.items()}
            peers = [v for k, v in gbs.items() if k != "ours"]
            ratio = gbs["ours"] / max(peers) if peers else None
            results.append({"row": row, "bytes": n, "GB/s": gbs,
                            "ours/best peer": ratio})
            cells = " ".join(f"{gbs[k]:9.2f}" if k in gbs else f"{'-':>9}" for k in makers)
            print(f"{row:24} {n:9d} {cells}  " + (f"{ratio:.2f}" if ratio else "-"),
                  flush=True)
        del libs
    save_json(args.json, {"platform": hmr.platform(), "host": platform.node(),
                          "python": platform.python_version(), "rounds": args.rounds,
                          "min_ms": args.min_ms, "staging": args.staging,
                          "staging_threshold": _staging.THRESHOLD,
                          "staging_to_host_threshold": _staging.TO_HOST_THRESHOLD,
                          "staging_to_existing_host_threshold":
                              _staging.TO_EXISTING_HOST_THRESHOLD,
                          "staging_chunk": _staging.CHUNK,
                          "staging_workers": _staging.WORKERS, "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

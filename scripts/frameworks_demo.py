#!/usr/bin/env python3
"""One memory budget across PyTorch, CuPy and Numba in one process (see docs/interop.md).

    HIPMR_PLATFORM=nvidia python scripts/frameworks_demo.py OUTDIR [--limit 2GiB]

All three frameworks allocate through one stack::

    LimitingResource(StatisticsResource(PoolResource(AsyncMemoryResource())), limit)
      <- LoggingResource (one CSV log of every allocation and free)
        <- one StatisticsResource per framework (its own counters)

PyTorch through ``hipmr_ctypes.interop.torch.use``, CuPy through
``cupy.cuda.set_allocator(hipmr_ctypes.interop.cupy.allocator(...))``, Numba through the EMM
plugin (``HipmrNumbaManager``, over the per-device resource).  Each framework works on its
own stream (Numba on the null stream), which is what tells them apart in the log and the
picture.  They take turns in a few phases (a PyTorch training loop, CuPy FFTs, a Numba
kernel), then CuPy asks for more than the budget has left and is refused.

Writes to OUTDIR: ``memory.csv`` (the log), ``memory.html`` and ``memory.svg`` (the picture of
the three frameworks' memory over time, coloured by stream), ``streams.json`` (which stream
is which framework), ``statistics.json`` (the shared and per-framework counters), and prints
the statistics table.  Needs a GPU and the three frameworks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hipmr_ctypes as hmr  # noqa: E402


def _stats(resource: Any) -> Dict[str, int]:
    s = resource.statistics
    return {"current_bytes": s.current_bytes, "peak_bytes": s.peak_bytes,
            "total_bytes": s.total_bytes, "current_count": s.current_count,
            "peak_count": s.peak_count, "total_count": s.total_count}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("outdir", help="directory for the log, the picture and the tables")
    parser.add_argument("--limit", default="2GiB", help="the one budget (default 2GiB)")
    parser.add_argument("--steps", type=int, default=30, help="steps of each phase")
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    csv_path = os.path.join(args.outdir, "memory.csv")

    shared = hmr.StatisticsResource(hmr.PoolResource(hmr.AsyncMemoryResource(), "64MiB"))
    budget = hmr.LimitingResource(shared, args.limit)
    log = hmr.LoggingResource(budget, csv_path)
    per = {name: hmr.StatisticsResource(log) for name in ("pytorch", "cupy", "numba")}

    # every framework's hook before that framework touches the GPU
    from hipmr_ctypes.interop import torch as ht
    ht.use(per["pytorch"])
    hmr.set_current_device_resource(per["numba"])      # what the Numba plugin allocates from
    from numba import cuda as ncuda
    from hipmr_ctypes.interop.numba import HipmrNumbaManager
    ncuda.set_memory_manager(HipmrNumbaManager)
    import cupy
    from hipmr_ctypes.interop.cupy import allocator as cupy_allocator
    cupy.cuda.set_allocator(cupy_allocator(per["cupy"]))
    import numpy as np
    import torch

    torch_stream = torch.cuda.Stream()
    cupy_stream = cupy.cuda.Stream(non_blocking=True)
    streams = {"pytorch": torch_stream.cuda_stream, "cupy": cupy_stream.ptr, "numba": 0}

    @ncuda.jit
    def scale(a: Any, f: float) -> None:
        i = ncuda.grid(1)
        if i < a.size:
            a[i] *= f

    model = None
    compiles = True
    kept: Dict[str, list] = {"pytorch": [], "cupy": [], "numba": []}
    for step in range(args.steps):
        # PyTorch: a small training loop, keeping a few activations around
        with torch.cuda.stream(torch_stream):
            if model is None:
                model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                            torch.nn.Linear(4096, 1024)).cuda()
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            x = torch.randn(2048, 1024, device="cuda")
            loss = (model(x) - x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept["pytorch"].append(x)
            if len(kept["pytorch"]) > 8:
                kept["pytorch"].pop(0)
        # CuPy: FFTs of growing arrays, on its own stream
        with cupy_stream:
            a = cupy.random.random((1 << 20) + step * (1 << 16), dtype=cupy.float32)
            kept["cupy"].append(cupy.fft.rfft(a))
            if len(kept["cupy"]) > 6:
                kept["cupy"].pop(0)
        # Numba: a kernel over a device array, on the null stream (where this Numba cannot
        # compile kernels, a device-to-device copy into a second array, said once)
        d = ncuda.to_device(np.ones((1 << 21) + step * (1 << 17), dtype=np.float32))
        if compiles:
            try:
                scale[(d.size + 255) // 256, 256](d, 2.0)
            except Exception as exc:  # noqa: BLE001 - the installed Numba's own failure
                compiles = False
                print(f"Numba cannot compile kernels here ({type(exc).__name__}: {exc}); "
                      "its phase copies device arrays instead", file=sys.stderr)
        if not compiles:
            copy = ncuda.device_array_like(d)
            copy.copy_to_device(d)
            d = copy
        kept["numba"].append(d)
        if len(kept["numba"]) > 4:
            kept["numba"].pop(0)
    torch_stream.synchronize()
    cupy_stream.synchronize()
    ncuda.synchronize()

    # the one budget: CuPy asks for more than is left, whoever holds the rest
    left = budget.get_allocation_limit() - budget.get_allocated_bytes()
    refused = ""
    try:
        with cupy_stream:
            cupy.empty(left + (64 << 20), dtype=cupy.uint8)
    except MemoryError as exc:
        refused = f"{type(exc).__name__}: {exc}"
    print("CuPy asking for", left + (64 << 20), "bytes with", left, "left:",
          refused or "NOT refused")

    table = {"shared (all three)": _stats(shared),
             **{name: _stats(r) for name, r in per.items()}}
    print(f"{'':20} {'current':>14} {'peak':>14} {'total':>16} {'allocations':>12}")
    for name, row in table.items():
        print(f"{name:20} {row['current_bytes']:14,} {row['peak_bytes']:14,} "
              f"{row['total_bytes']:16,} {row['total_count']:12,}")
    print("limit", budget.get_allocation_limit(), "peak of all three",
          table["shared (all three)"]["peak_bytes"])

    del kept, model, opt, x, loss, a, d
    import gc
    gc.collect()
    torch.cuda.synchronize()
    log.flush()
    log.close()
    import hipmr_ctypes.plot as hplot
    hplot.timeline(csv_path, os.path.join(args.outdir, "memory.html"))
    hplot.timeline(csv_path, os.path.join(args.outdir, "memory.svg"))
    with open(os.path.join(args.outdir, "streams.json"), "w", encoding="utf-8") as fh:
        json.dump({name: hex(handle) for name, handle in streams.items()}, fh, indent=1)
    with open(os.path.join(args.outdir, "statistics.json"), "w", encoding="utf-8") as fh:
        json.dump({"limit": budget.get_allocation_limit(), "refused": refused,
                   "statistics": table}, fh, indent=1)
    print("streams:", {name: hex(handle) for name, handle in streams.items()})
    print("wrote", ", ".join(sorted(os.listdir(args.outdir))), "to", args.outdir)
    return 0 if refused else 1


if __name__ == "__main__":
    sys.exit(main())

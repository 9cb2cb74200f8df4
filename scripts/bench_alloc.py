#!/usr/bin/env python3
"""Allocation benchmark: median ns per allocate + deallocate pair, ours beside every peer that
imports here, in ONE run (see docs/performance.md).

    HIPMR_PLATFORM=nvidia python scripts/bench_alloc.py --json out.json
    HIPMR_PLATFORM=emulated python scripts/bench_alloc.py     # no GPU: the hot paths' own cost

Sizes 256 B / 64 KiB / 16 MiB; each figure is the median over ``--repeats`` timed loops of
``--pairs`` pairs after a warm-up, in ns per pair.  Stream-ordered frees are synchronized
once after each loop (outside the timing).  Peers that do not import are listed as missing.
The interop rows are timed as CuPy's own pool is: ``cupy.cuda.alloc(size)`` (CuPy's call of
the allocator set: our ``allocator()`` over the current device resource, our
``allocator(pool)``, or ``MemoryPool().malloc``) and the ``MemoryPointer`` dropped, which frees
it; Numba's plugin row is ``memalloc(size)`` and the pointer dropped (what a device array's
lifetime does).  The current device resource there is a ``PoolResource`` over
``AsyncMemoryResource``, so the pool pair itself is in each of them (its own row is
``PoolResource direct``).
Also runs a fragmentation workload (random sizes 1 KiB-64 MiB, random lifetimes, fixed seeds)
and reports peak pool size / peak live bytes for our PoolResource and RMM's pool.
Never used as a test: timing bounds do not belong in unit tests.  If a step fails, what was
measured until then is still printed (and saved), and the exit status is 1.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import signal
import os
import platform as _platform
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes import _hip  # noqa: E402

from _adaptor_rows import adaptors_over  # noqa: E402
from _timing import FLOOR, floor_loop, markdown_table, ns_per_op, save_json  # noqa: E402

SIZES = (256, 64 << 10, 16 << 20)
SIZE_NAMES = {256: "256 B", 64 << 10: "64 KiB", 16 << 20: "16 MiB"}


# ---------------------------------------------------------------------------------- loops
def ours(size: int, rt) -> Dict[str, Callable[[int], None]]:
    """Our allocators, each as a tight loop."""
    loops: Dict[str, Callable[[int], None]] = {}
    fn = rt.fn
    malloc_async, free_async = fn.hipMallocAsync, fn.hipFreeAsync
    c_void_p = ctypes.c_void_p

    def raw_async(n):
        for _ in range(n):
            out = c_void_p()
            malloc_async(out, size, 0)
            free_async(out.value, 0)
    # on the emulated platform the "raw" calls are the emulator's Python functions
    raw = "raw ctypes" if rt.platform != "emulated" else "emulator's"
    loops[f"{raw} hipMallocAsync/hipFreeAsync (default pool)"] = raw_async

    amr = hmr.AsyncMemoryResource()
    a_alloc, a_free = amr.allocate_async, amr.deallocate_async
    from_pool, pool_handle = fn.hipMallocFromPoolAsync, amr.pool.handle

    def raw_from_pool(n):
        for _ in range(n):
            out = c_void_p()
            from_pool(out, size, pool_handle, 0)
            free_async(out.value, 0)
    loops[f"{raw} hipMallocFromPoolAsync/hipFreeAsync (same pool)"] = raw_from_pool
    if rt.platform != "emulated":  # the same, bound with the header's types as users would
        from hipmr_ctypes._hip.decls import DECL_BY_NAME
        decl = DECL_BY_NAME["hipMallocFromPoolAsync"]
        from_pool_hdr = rt.lib._FuncPtr((from_pool.__name__, rt.lib))
        from_pool_hdr.restype, from_pool_hdr.argtypes = decl.restype, list(decl.argtypes)

        def raw_from_pool_hdr(n):
            for _ in range(n):
                out = c_void_p()
                from_pool_hdr(out, size, pool_handle, 0)
                free_async(out.value, 0)
        loops["raw ctypes hipMallocFromPoolAsync/hipFreeAsync, size as c_size_t "
              "(same pool)"] = raw_from_pool_hdr

    dflt = hmr.AsyncMemoryResource.from_default_pool(0)
    d_alloc, d_free = dflt.allocate_async, dflt.deallocate_async

    def default_direct(n):
        for _ in range(n):
            p = d_alloc(size, 256, 0)
            d_free(p, size, 256, 0)
    loops["AsyncMemoryResource.from_default_pool direct"] = default_direct

    def async_direct(n):
        for _ in range(n):
            p = a_alloc(size, 256, 0)
            a_free(p, size, 256, 0)
    loops["AsyncMemoryResource direct"] = async_direct

    pool = hmr.PoolResource(amr, initial_pool_size=256 << 20)
    p_alloc, p_free = pool.allocate_async, pool.deallocate_async

    def pool_direct(n):
        for _ in range(n):
            p = p_alloc(size, 256, 0)
            p_free(p, size, 256, 0)
    loops["PoolResource direct"] = pool_direct

    ref = hmr.async_resource_ref[hmr.device_accessible](pool)

    def pool_ref(n):
        for _ in range(n):
            p = ref.allocate_async(size, 256, 0)
            ref.deallocate_async(p, size, 256, 0)
    loops["PoolResource via async_resource_ref[device_accessible]"] = pool_ref

    sref = hmr.stream_ref(0)

    def pool_ref_sref(n):
        for _ in range(n):
            p = ref.allocate_async(size, 256, sref)
            ref.deallocate_async(p, size, 256, sref)
    loops["PoolResource via ref, stream_ref argument"] = pool_ref_sref

    created = hmr.Stream()   # a created stream's key is its handle: no device to read

    def pool_ref_stream(n):
        for _ in range(n):
            p = ref.allocate_async(size, 256, created)
            ref.deallocate_async(p, size, 256, created)
    loops["PoolResource via ref, Stream argument"] = pool_ref_stream
    handle = created.handle

    def pool_ref_handle(n):
        for _ in range(n):
            p = ref.allocate_async(size, 256, handle)
            ref.deallocate_async(p, size, 256, handle)
    loops["PoolResource via ref, created stream's handle"] = pool_ref_handle

    def pool_ref_per_thread(n):
        for _ in range(n):
            p = ref.allocate_async(size, 256, 2)
            ref.deallocate_async(p, size, 256, 2)
    loops["PoolResource via ref, the per-thread stream (handle 2)"] = pool_ref_per_thread

    stats = hmr.StatisticsResource(pool)
    s_alloc, s_free = stats.allocate_async, stats.deallocate_async

    def stats_loop(n):
        for _ in range(n):
            p = s_alloc(size, 256, 0)
            s_free(p, size, 256, 0)
    loops["StatisticsResource over PoolResource"] = stats_loop

    lim = hmr.LimitingResource(pool, 1 << 40)
    l_alloc, l_free = lim.allocate_async, lim.deallocate_async

    def lim_loop(n):
        for _ in range(n):
            p = l_alloc(size, 256, 0)
            l_free(p, size, 256, 0)
    loops["LimitingResource over PoolResource"] = lim_loop

    others = adaptors_over(pool, "PoolResource")
    others["FixedSizeResource(16 MiB blocks) over AsyncMemoryResource"] = (
        hmr.FixedSizeResource(amr, block_size=16 << 20, blocks_to_preallocate=4))
    if size <= 1024:   # the binning row's 1 KiB bin alone (its goal is this row + 150 ns)
        others["FixedSizeResource(1 KiB) over PoolResource"] = hmr.FixedSizeResource(pool, 1024)
    for name, res in others.items():
        def other_loop(n, a=res.allocate_async, d=res.deallocate_async):
            for _ in range(n):
                p = a(size, 256, 0)
                d(p, size, 256, 0)
        loops[name] = other_loop

    loops["_keep"] = (amr, dflt, pool, stats, lim, others)  # type: ignore[assignment]
    return loops


_EVERYDAY: List[Any] = []
#: the rows of the interop hooks and of CuPy's own pool they are compared with
CUPY_OURS = "CuPy allocator of ours: cupy.cuda.alloc + drop (current resource = pool)"
CUPY_OURS_PINNED = "CuPy allocator of ours: cupy.cuda.alloc + drop (allocator(pool))"
NUMBA_OURS = "Numba EMM plugin of ours: memalloc + drop (current resource = pool)"
NUMBA_OWN = "Numba's own memory manager: memalloc + drop"
CUPY_POOL = "CuPy MemoryPool (cupy.cuda.alloc)"


def everyday(size: int) -> Dict[str, Any]:
    """What users write: Buffer made and closed (or dropped) over a pool passed directly,
    through a ref and as the current device resource; at 256 B also the concept check and ref
    construction; the CuPy allocator and the Numba EMM plugin over the current resource."""
    loops: Dict[str, Any] = {}
    if not _EVERYDAY:  # one pool for every size, the current device resource from now on
        _EVERYDAY.append(hmr.PoolResource(hmr.AsyncMemoryResource()))
        hmr.set_current_device_resource(_EVERYDAY[0])
    pool = _EVERYDAY[0]
    ref = hmr.async_resource_ref[hmr.device_accessible](pool)
    Buffer = hmr.Buffer

    def closing(resource):
        def run(n):
            for _ in range(n):
                Buffer(size, resource=resource).close()
        return run

    def dropping(resource):
        def run(n):
            for _ in range(n):
                Buffer(size, resource=resource)
        return run
    class Minimal:
        """The least a buffer class can be (no checks, no stream, no device): what Python
        itself costs for an object made with keywords, closed, and finalized."""
        __slots__ = ("ptr", "size", "resource", "owned", "__weakref__")

        def __init__(self, size, *, resource=None):
            self.resource = resource
            self.size = size
            self.ptr = resource.allocate_async(size, 256, 0)
            self.owned = [resource.deallocate_async]

        def close(self):
            if self.owned:
                self.owned.pop()(self.ptr, self.size, 256, 0)

        def __del__(self):
            if self.owned:
                self.owned.pop()(self.ptr, self.size, 256, 0)

    def minimal(n):
        for _ in range(n):
            Minimal(size, resource=pool).close()
    loops["Buffer floor: a minimal slotted class over PoolResource, create + close"] = minimal
    loops["Buffer over PoolResource, create + close"] = closing(pool)
    loops["Buffer over PoolResource, create + drop"] = dropping(pool)
    loops["Buffer via async_resource_ref, create + close"] = closing(ref)
    loops["Buffer via async_resource_ref, create + drop"] = dropping(ref)

    def current_closing(n):  # as users write it: no resource argument at all
        for _ in range(n):
            Buffer(size).close()

    def current_dropping(n):
        for _ in range(n):
            Buffer(size)
    loops["Buffer over the current device resource (pool), create + close"] = current_closing
    loops["Buffer over the current device resource (pool), create + drop"] = current_dropping
    if size == SIZES[0]:
        stats = hmr.StatisticsResource(pool)
        iar = hmr.is_async_resource
        ARef = hmr.async_resource_ref[hmr.device_accessible]

        def check(obj):
            def run(n):
                for _ in range(n):
                    iar(obj)
            return run

        def make_ref(obj):
            def run(n):
                for _ in range(n):
                    ARef(obj)
            return run
        loops["is_async_resource(PoolResource) (one call)"] = check(pool)
        loops["is_async_resource(StatisticsResource) (one call)"] = check(stats)
        loops["async_resource_ref[device_accessible](PoolResource) (one ref)"] = make_ref(pool)
        loops["async_resource_ref[device_accessible](StatisticsResource) (one ref)"] = \
            make_ref(stats)
        loops["_keep_stats"] = stats
    loops.update(interop_loops(size, pool))
    return loops


def interop_loops(size: int, pool: Any) -> Dict[str, Any]:
    """The interop hooks' rows, timed exactly as CuPy's own pool is in
    :func:`cupy_pool_loops`: an allocation as CuPy makes it (``cupy.cuda.alloc``, which calls
    the allocator set) and the ``MemoryPointer`` dropped (freed when CuPy lets it go), each
    loop setting its allocator first (the loops take turns); Numba's plugin and Numba's own
    memory manager: ``memalloc`` and the pointer dropped.  ``pool`` must be the current device
    resource.  A framework that does not import gives a ``"missing: ..."`` row."""
    loops: Dict[str, Any] = {}
    try:
        import cupy
        from hipmr_ctypes.interop.cupy import allocator
        set_allocator, alloc = cupy.cuda.set_allocator, cupy.cuda.alloc

        def cupy_ours(fn):
            def run(n):
                set_allocator(fn)
                for _ in range(n):
                    m = alloc(size)
                    del m
            return run
        loops[CUPY_OURS] = cupy_ours(allocator())
        loops[CUPY_OURS_PINNED] = cupy_ours(allocator(pool))
        loops["_cupy"] = cupy
    except Exception as exc:  # noqa: BLE001
        loops[CUPY_OURS] = f"missing: {exc}"
    try:
        from numba import cuda as ncuda
        from hipmr_ctypes.interop.numba import HipmrNumbaManager
        ctx = ncuda.current_context()
        plugin = HipmrNumbaManager(context=ctx)
        plugin.initialize()

        def numba_ours(n):
            memalloc = plugin.memalloc
            for _ in range(n):
                m = memalloc(size)
                del m
        loops[NUMBA_OURS] = numba_ours

        def numba_own(n):  # the context's own manager (Numba's, deferred frees included)
            memalloc = ctx.memalloc
            for _ in range(n):
                m = memalloc(size)
                del m
        loops[NUMBA_OWN] = numba_own
    except Exception as exc:  # noqa: BLE001
        loops[NUMBA_OURS] = f"missing: {exc}"
    return loops


def cupy_pool_loops(size: int) -> Dict[str, Any]:
    """CuPy's own pools: ``MemoryPool`` through ``cupy.cuda.alloc`` (as the hooks' rows) and
    ``MemoryAsyncPool.malloc``, each allocation dropped."""
    loops: Dict[str, Any] = {}
    try:
        import cupy
        mp = cupy.cuda.MemoryPool()
        set_allocator, alloc, malloc = cupy.cuda.set_allocator, cupy.cuda.alloc, mp.malloc

        def cupy_pool(n):  # as our hooks' rows: through cupy.cuda.alloc, dropped
            set_allocator(malloc)
            for _ in range(n):
                m = alloc(size)
                del m
        loops[CUPY_POOL] = cupy_pool
        try:
            amp = cupy.cuda.MemoryAsyncPool()
            amalloc = amp.malloc

            def cupy_async(n):
                for _ in range(n):
                    m = amalloc(size)
                    del m
            loops["CuPy MemoryAsyncPool"] = cupy_async
        except Exception as exc:  # noqa: BLE001
            loops["CuPy MemoryAsyncPool"] = f"missing: {exc}"
    except Exception as exc:  # noqa: BLE001
        loops[CUPY_POOL] = f"missing: {exc}"
    return loops


def ours_slow(size: int) -> Dict[str, Callable[[int], None]]:
    loops = {}
    dmr = hmr.DeviceMemoryResource()

    def dev_loop(n):
        for _ in range(n):
            p = dmr.allocate(size)
            dmr.deallocate(p, size)
    loops["DeviceMemoryResource (hipMalloc/hipFree)"] = dev_loop
    return loops


def peers(size: int) -> Dict[str, Callable[[int], None]]:
    loops: Dict[str, Callable[[int], None]] = {}
    loops.update(cupy_pool_loops(size))
    try:
        import rmm
        import rmm.mr
        pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
        pa, pd = pool.allocate, pool.deallocate

        def rmm_pool(n):
            for _ in range(n):
                p = pa(size)
                pd(p, size)
        loops["RMM PoolMemoryResource"] = rmm_pool
        from rmm import DeviceBuffer

        def rmm_buf(n):
            for _ in range(n):
                b = DeviceBuffer(size=size, mr=pool)
                del b
        loops["RMM DeviceBuffer on the pool"] = rmm_buf
        amr = rmm.mr.CudaAsyncMemoryResource()
        aa, ad = amr.allocate, amr.deallocate

        def rmm_async(n):
            for _ in range(n):
                p = aa(size)
                ad(p, size)
        loops["RMM CudaAsyncMemoryResource"] = rmm_async
        adaptors = {}
        for label, make in (("StatisticsResourceAdaptor",
                             lambda: rmm.mr.StatisticsResourceAdaptor(pool)),
                            ("LimitingResourceAdaptor",
                             lambda: rmm.mr.LimitingResourceAdaptor(pool, 1 << 40)),
                            ("TrackingResourceAdaptor",
                             lambda: rmm.mr.TrackingResourceAdaptor(pool))):
            name = f"RMM {label} over its pool"
            try:
                mr = adaptors[label] = make()

                def rmm_adaptor(n, a=mr.allocate, d=mr.deallocate):
                    for _ in range(n):
                        p = a(size)
                        d(p, size)
                loops[name] = rmm_adaptor
            except Exception as exc:  # noqa: BLE001
                loops[name] = f"missing: {exc}"  # type: ignore[assignment]
        loops["_rmm_keep"] = (pool, amr, adaptors)  # type: ignore[assignment]
    except Exception as exc:  # noqa: BLE001
        loops["RMM PoolMemoryResource"] = f"missing: {exc}"  # type: ignore[assignment]
    try:
        import torch
        if torch.cuda.is_available():
            empty = torch.empty
            dev = torch.device("cuda")
            u8 = torch.uint8
            empty(size, dtype=u8, device=dev)

            def torch_loop(n):
                for _ in range(n):
                    t = empty(size, dtype=u8, device=dev)
                    del t
            loops["PyTorch caching allocator (torch.empty/del)"] = torch_loop
    except Exception as exc:  # noqa: BLE001
        loops["PyTorch caching allocator (torch.empty/del)"] = f"missing: {exc}"  # type: ignore
    try:
        from cuda.bindings import runtime as cudart

        def cb_loop(n):
            ma, fa = cudart.cudaMallocAsync, cudart.cudaFreeAsync
            for _ in range(n):
                err, p = ma(size, 0)
                fa(p, 0)
        loops["cuda-bindings cudaMallocAsync/cudaFreeAsync"] = cb_loop
    except Exception as exc:  # noqa: BLE001
        loops["cuda-bindings cudaMallocAsync/cudaFreeAsync"] = f"missing: {exc}"  # type: ignore
    try:
        try:
            from cuda.core import Device as CDevice
        except ImportError:
            from cuda.core.experimental import Device as CDevice
        d = CDevice()
        d.set_current()
        mr = d.memory_resource
        st = d.default_stream

        def cc_loop(n):
            for _ in range(n):
                b = mr.allocate(size, stream=st)
                b.close(st)
        loops["cuda.core DeviceMemoryResource allocate/Buffer.close"] = cc_loop
    except Exception as exc:  # noqa: BLE001
        loops["cuda.core DeviceMemoryResource allocate/Buffer.close"] = f"missing: {exc}"  # type: ignore
    return loops


# ---------------------------------------------------------------------------- fragmentation
def fragmentation_workload(seed: int, ops: int, alloc, free, pool_size,
                           cap: int = 6 << 30):
    """Random sizes 1 KiB-64 MiB with random lifetimes (45% frees, and frees while more than
    ``cap`` bytes are live); returns (peak pool size, peak live bytes).  Also drawn by
    scripts/plot_fragmentation.py."""
    rng = random.Random(seed)
    live: List = []
    live_bytes = peak_live = peak_pool = 0
    for _ in range(ops):
        if live and (rng.random() < 0.45 or live_bytes > cap):
            p, n = live.pop(rng.randrange(len(live)))
            free(p, n)
            live_bytes -= n
        else:
            n = int(2 ** rng.uniform(10, 26))
            live.append((alloc(n), n))
            live_bytes += n
            peak_live = max(peak_live, live_bytes)
        peak_pool = max(peak_pool, pool_size())
    for p, n in live:
        free(p, n)
    return peak_pool, peak_live


def fragmentation(seed: int, ops: int) -> Dict[str, object]:
    """Random sizes 1 KiB-64 MiB with random lifetimes; peak pool size / peak live bytes.
    Live bytes stay under 6 GiB, and under a third of a smaller device's memory (the emulated
    device has 1 GiB unless HIPMR_EMULATED_MEMORY says otherwise)."""
    total = hmr.Device(0).memory_info()[1]
    cap = min(6 << 30, total // 3)
    out: Dict[str, object] = {"seed": seed, "ops": ops, "live_cap": cap}

    def workload(alloc, free, pool_size):
        return fragmentation_workload(seed, ops, alloc, free, pool_size, cap)

    amr = hmr.AsyncMemoryResource()
    pool = hmr.PoolResource(amr)
    peak_pool, peak_live = workload(lambda n: pool.allocate_async(n, 256, 0),
                                    lambda p, n: pool.deallocate_async(p, n, 256, 0),
                                    pool.pool_size)
    out["hipmr PoolResource"] = {"peak_pool": peak_pool, "peak_live": peak_live,
                                 "ratio": peak_pool / peak_live}
    pool.release()
    try:
        import rmm.mr
        rpool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=0)
        peak_pool, peak_live = workload(lambda n: rpool.allocate(n),
                                        lambda p, n: rpool.deallocate(p, n), rpool.pool_size)
        out["RMM PoolMemoryResource"] = {"peak_pool": peak_pool, "peak_live": peak_live,
                                         "ratio": peak_pool / peak_live}
    except Exception as exc:  # noqa: BLE001
        out["RMM PoolMemoryResource"] = f"missing: {exc}"
    return out


# ------------------------------------------------------------------------------------ main
def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=20000,
                    help="allocate+deallocate pairs per timed loop (default 20000)")
    ap.add_argument("--repeats", type=int, default=11,
                    help="timed loops per allocator and size; the median is reported (default 11)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also save the results here")
    ap.add_argument("--no-peers", action="store_true",
                    help="time only this package's allocators (no CuPy, RMM, PyTorch, ...)")
    ap.add_argument("--rows", default=None, metavar="TEXT[,TEXT...]",
                    help="time only the rows whose name contains one of these (the floor rows "
                         "always), e.g. --rows 'CuPy,Numba,PoolResource direct'")
    ap.add_argument("--frag-ops", type=int, default=4000,
                    help="operations of each fragmentation workload (default 4000)")
    ap.add_argument("--frag-seeds", default="1234,7,42",
                    help="comma-separated seeds of the fragmentation workload (default "
                         "1234,7,42; empty: no fragmentation workload)")
    args = ap.parse_args(argv)
    if hmr.device_count() == 0:  # one clear line, not a traceback from the first allocation
        print(f"bench_alloc.py: the {hmr.platform()} platform sees no device; "
              f"HIPMR_PLATFORM=emulated runs it on host memory", file=sys.stderr)
        return 2
    rt = _hip.get_runtime()
    sync = (lambda: rt.fn.hipDeviceSynchronize())
    wanted = [w for w in (args.rows or "").split(",") if w]
    results: Dict[str, Dict[str, object]] = {}
    errors: List[str] = []
    frag: List[Dict[str, object]] = []
    floor = floor_loop()
    get_dev = rt.fn.hipGetDevice
    dev_out = ctypes.c_int()

    def one_ctypes(n):
        for _ in range(n):
            get_dev(dev_out)
    def stop(signum: int, frame: Any) -> None:  # a timeout's SIGTERM ends the run early
        raise SystemExit(124)
    signal.signal(signal.SIGTERM, stop)
    try:
        # the floor rows take their turns with each size's loops too (a size column each)
        for size in SIZES:
            col = SIZE_NAMES[size]
            groups = [ours(size, rt), ours_slow(size), everyday(size)]
            if not args.no_peers:
                groups.append(peers(size))
            timed: Dict[str, Any] = {FLOOR: (floor, args.pairs),
                                     "one ctypes call (hipGetDevice)": (one_ctypes, args.pairs)}
            for gi, loops in enumerate(groups):
                for name, loop in loops.items():
                    if name.startswith("_") or (wanted and not any(w in name for w in wanted)):
                        continue
                    if isinstance(loop, str):
                        results.setdefault(name, {})[col] = loop
                        continue
                    count = args.pairs if gi != 1 else max(200, args.pairs // 50)
                    if gi == 2 and name.startswith(("is_async", "async_resource_ref")):
                        count = max(20, args.pairs // 20)
                    timed[name] = (loop, count)
            for name, ns in ns_per_op(timed, args.repeats, sync=sync).items():
                results.setdefault(name, {})[col] = ns
            del groups, timed
            gc.collect()
        for seed in filter(None, args.frag_seeds.split(",")):
            frag.append(fragmentation(int(seed), args.frag_ops))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - what was measured is still
        errors.append(f"{type(exc).__name__}: {exc}")  # printed and saved
    dev_name = hmr.Device(0).name if hmr.device_count() else "none"
    meta = {"date": time.strftime("%Y-%m-%d"), "platform": rt.platform, "device": dev_name,
            "runtime_version": ".".join(map(str, rt.runtime_version())),
            "python": sys.version.split()[0], "cpu": _platform.processor() or _platform.machine(),
            "pairs": args.pairs, "repeats": args.repeats}
    print_table(results, results.get(FLOOR, {}).get("256 B"), meta, frag)
    save_json(args.json, {"meta": meta, "ns_per_pair": results, "fragmentation": frag,
                          "errors": errors})
    for err in errors:
        print(f"\nstopped early: {err} (the figures above are what was measured)",
              file=sys.stderr)
    return 1 if errors else 0


def print_table(results, floor, meta, frag) -> None:
    cols = list(SIZE_NAMES.values())
    print(f"\n# Allocation cost, median ns per allocate+deallocate pair "
          f"({meta['date']}, {meta['device']}, {meta['platform']} runtime "
          f"{meta['runtime_version']}, Python {meta['python']})\n")
    lines = []
    for name, row in results.items():
        cells = [name]
        for c in cols:
            v = row.get(c)
            cells.append(f"{v:,.0f}" if isinstance(v, float) else (str(v)[:40] if v else ""))
        v256 = row.get("256 B")
        cells.append(f"{v256 / floor:.1f}" if isinstance(v256, float) and floor else "")
        lines.append(cells)
    markdown_table(["allocator", *cols, "x floor (256 B)"], lines)
    ours_ref = results.get("PoolResource via async_resource_ref[device_accessible]", {})
    print("\n# Ratios: peer / our PoolResource via async_resource_ref (higher = we are faster)\n")
    lines = []
    for name, row in results.items():
        if name.startswith("PoolResource via") or "floor" in name or "ctypes call" in name:
            continue
        cells = [name]
        for c in cols:
            a, b = row.get(c), ours_ref.get(c)
            cells.append(f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) else "")
        lines.append(cells)
    markdown_table(["peer", *cols], lines)
    stacks = (("StatisticsResource over PoolResource", "RMM StatisticsResourceAdaptor over its pool"),
              ("LimitingResource over PoolResource", "RMM LimitingResourceAdaptor over its pool"),
              ("TrackingResource over PoolResource", "RMM TrackingResourceAdaptor over its pool"),
              ("Buffer over PoolResource, create + close", "RMM DeviceBuffer on the pool"),
              (CUPY_OURS, CUPY_POOL), (CUPY_OURS_PINNED, CUPY_POOL), (NUMBA_OURS, CUPY_POOL),
              (NUMBA_OURS, NUMBA_OWN),
              ("AsyncMemoryResource direct",
               "raw ctypes hipMallocFromPoolAsync/hipFreeAsync (same pool)"),
              ("AsyncMemoryResource direct", "raw ctypes hipMallocFromPoolAsync/hipFreeAsync, "
               "size as c_size_t (same pool)"))
    print("\n# Ours / the peer's equivalent (lower = we are faster)\n")
    lines = []
    for mine, theirs in stacks:
        a_row, b_row = results.get(mine, {}), results.get(theirs, {})
        if not isinstance(b_row, dict) or not b_row:
            continue
        cells = [mine, theirs]
        for c in cols:
            a, b = a_row.get(c), b_row.get(c)
            cells.append(f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) else "")
        lines.append(cells)
    markdown_table(["ours", "peer", *cols], lines)
    for one in frag:
        print("\n# Fragmentation (random sizes 1 KiB-64 MiB, random lifetimes, seed "
              f"{one['seed']}, {one['ops']} ops): peak pool size / peak live bytes\n")
        for k, v in one.items():
            if isinstance(v, dict):
                print(f"- {k}: {v['ratio']:.3f} (peak pool {v['peak_pool'] / 2**20:,.0f} MiB, "
                      f"peak live {v['peak_live'] / 2**20:,.0f} MiB)")
            elif k not in ("seed", "ops", "live_cap"):
                print(f"- {k}: {v}")

if __name__ == "__main__":
    sys.exit(main())

"""The adaptors that both ``bench_alloc.py`` and ``bench_hotpaths.py`` time over a pool, each
named ``"<Adaptor> over <what the pool is called>"``: one list, so that the GPU bench and the
instruction counts measure the same things."""
from __future__ import annotations

import os
from typing import Any, Dict

import hipmr_ctypes as hmr


def passthrough_callbacks(pool: Any) -> Any:
    """A ``CallbackResource`` whose four callbacks pass the calls on to ``pool``."""
    return hmr.CallbackResource(
        lambda n, a: pool.allocate(n, a), lambda p, n, a: pool.deallocate(p, n, a),
        lambda n, a, s: pool.allocate_async(n, a, s),
        lambda p, n, a, s: pool.deallocate_async(p, n, a, s),
        properties=(hmr.device_accessible,))


def adaptors_over(pool: Any, over: str) -> Dict[str, Any]:
    """Every adaptor with no row of its own in the callers, over ``pool``."""
    return {
        f"TrackingResource over {over}": hmr.TrackingResource(pool),
        f"FailureCallbackResource over {over}": hmr.FailureCallbackResource(pool,
                                                                           lambda n: False),
        f"LoggingResource over {over} (to os.devnull)": hmr.LoggingResource(pool, os.devnull),
        f"PrefetchResource over {over}": hmr.PrefetchResource(pool),
        f"CallbackResource over {over}": passthrough_callbacks(pool),
        f"AlignedResource(512) over {over}": hmr.AlignedResource(pool, 512),
        f"BinningResource (bins 1 KiB, 64 KiB) over {over}":
            hmr.BinningResource(pool, bins=[1024, 65536]),
    }

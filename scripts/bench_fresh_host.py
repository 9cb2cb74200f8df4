#!/usr/bin/env python3
"""Device-to-host copies into a fresh destination (``Buffer.copy_to_host()``, ``tobytes()``)
under several settings of the two thresholds that shape them, in turns in one process, beside
PyTorch's ``t.cpu()`` and CuPy's ``arr.get()`` (where they import).

The thresholds: from which size a fresh destination is advised as huge pages
(``_hugepages.THRESHOLD``) and from which size such a copy is staged through pinned memory
(``_staging.TO_HOST_THRESHOLD``).  Whether a new block of host memory is already faulted in
depends on the C library's allocator and on what the process freed before, so the settings are
compared in the same process, each size's settings and peers taking turns in every round (each
round in an order of its own); a cell is the median GB/s over ``--rounds`` rounds, each
``--min-ms`` long or more.

    HIPMR_PLATFORM=nvidia python3 scripts/bench_fresh_host.py --sizes 16MiB,20MiB,32MiB \\
        --settings "before=4MiB:64MiB,now" --json fresh.json

A setting is ``name=ADVISE:STAGED`` (sizes, or ``off``), or ``now``: the package's own.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._buffer import hugepages as _hugepages, staging as _staging  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402

from _timing import save_json, seconds_per_call, take_turns  # noqa: E402

OFF = 1 << 62
Op = Callable[[], Any]


def parse_settings(text: str) -> Dict[str, Tuple[int, int]]:
    """``{name: (advise from, staged from)}`` of ``--settings``."""
    settings: Dict[str, Tuple[int, int]] = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if item == "now":
            settings["now"] = (_hugepages.THRESHOLD, _staging.TO_HOST_THRESHOLD)
            continue
        name, sep, values = item.partition("=")
        advise, colon, staged = values.partition(":")
        if not sep or not colon or not name:
            raise ValueError(f"a setting is name=ADVISE:STAGED or now, not {item!r}")
        settings[name] = tuple(OFF if v.strip() == "off" else parse_bytes(v.strip())
                               for v in (advise, staged))  # type: ignore[assignment]
    if not settings:
        raise ValueError("no settings given")
    return settings


def _peers(n: int) -> Dict[str, Op]:
    peers: Dict[str, Op] = {}
    try:
        import torch
        if torch.cuda.is_available():
            t = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
            peers["PyTorch t.cpu()"] = t.cpu
    except ImportError:
        pass
    try:
        import cupy
        a = cupy.full(n, 7, dtype=cupy.uint8)
        peers["CuPy arr.get()"] = a.get
    except Exception:  # noqa: BLE001 - no CuPy, or no GPU for it
        pass
    return peers


def _sampler(op: Op, min_s: float) -> Callable[[], float]:
    """One round's sample of ``op``: its seconds per call over ``min_s`` or more."""
    return lambda: seconds_per_call(op, min_s)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8MiB,16MiB,20MiB,24MiB,32MiB,64MiB")
    parser.add_argument("--settings", default="before=4MiB:64MiB,now")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=150.0)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        settings = parse_settings(args.settings)
    except ValueError as exc:
        parser.error(str(exc))
    saved = (_hugepages.THRESHOLD, _staging.TO_HOST_THRESHOLD)
    rows: List[Dict[str, Any]] = []
    min_s = args.min_ms / 1000
    try:
        for n in (parse_bytes(s) for s in args.sizes.split(",")):
            buf = hmr.Buffer.from_host(bytes(n), resource=hmr.AsyncMemoryResource())
            ops: Dict[str, Op] = {}
            for name, (advise, staged) in settings.items():
                for what, call in (("copy_to_host()", buf.copy_to_host),
                                   ("tobytes()", buf.tobytes)):
                    def op(call: Op = call, advise: int = advise, staged: int = staged) -> Any:
                        _hugepages.THRESHOLD = advise
                        _staging.TO_HOST_THRESHOLD = staged
                        return call()
                    ops[f"{what} {name}"] = op
            peers = {} if args.no_peers else _peers(n)
            ops.update(peers)
            for run in ops.values():
                run()   # warm up
            seconds = take_turns({k: _sampler(run, min_s) for k, run in ops.items()},
                                 args.rounds, shuffle=True)
            gbs = {k: n / statistics.median(v) / 1e9 for k, v in seconds.items()}
            best_peer = max((gbs[k] for k in peers), default=None)
            print(f"== {n} bytes: GB/s, median of {args.rounds} rounds"
                  + (", / the best peer" if best_peer else ""))
            for k, v in gbs.items():
                print(f"  {k:40s} {v:8.2f}" + (f"  {v / best_peer:5.2f}" if best_peer else ""))
            rows.append({"bytes": n, "GB/s": gbs, "best peer": best_peer})
            buf.close()
    finally:
        _hugepages.THRESHOLD = saved[0]
        _staging.TO_HOST_THRESHOLD = saved[1]
    save_json(args.json, {"platform": hmr.platform(), "rounds": args.rounds,
                          "min_ms": args.min_ms,
                          "settings": {k: list(v) for k, v in settings.items()},
                          "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

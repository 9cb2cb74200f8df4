#!/usr/bin/env python3
"""PyTorch allocation benchmark: median ns per ``torch.empty(size)`` + ``del``, through our
allocator beside PyTorch's own caching allocator, in one run (see docs/performance.md).

    HIPMR_PLATFORM=nvidia python scripts/bench_torch.py --json torch.json

PyTorch's allocator is chosen once per process, so each variant runs in its own child
process, the children taking turns (``--rounds`` rounds, one run of each per round, so a slow
phase of a shared machine falls on every variant alike):

* ``pytorch``: PyTorch's caching allocator, as PyTorch ships;
* ``ours``: ``hipmr_ctypes.interop.torch.use(PoolResource(AsyncMemoryResource()))``, the
  pool route: PyTorch's caching allocator on top, its segments from our pool;
* ``allocator``: the same with ``route="allocator"``: every tensor allocated and freed
  through our pool by the two ctypes callbacks;
* ``mem_pool``: PyTorch's caching allocator inside ``torch.cuda.use_mem_pool`` over our pool
  (its segments come from our pool, its tensors from its cache).

Each child times ``--repeats`` loops of ``--pairs`` pairs per size after a warm-up (the sizes
taking turns too, ``scripts/_timing.py``), and reports the median loop in ns per pair; the figure printed is the median over the rounds.
The goal: ``ours`` at most 1.1x ``pytorch`` per tensor.  Never used as a test: timing bounds
do not belong in unit tests.  Exit status 2 when PyTorch sees no CUDA device.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Callable, Dict

from _timing import ChildFailed, ns_per_op, run_child, save_json, take_turns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (256, 64 << 10, 1 << 20, 16 << 20)
VARIANTS = ("pytorch", "ours", "allocator", "mem_pool")
#: the goal: ``ours`` at most this many times ``pytorch`` per tensor
GOAL = 1.1


def _name(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else (
        f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B")


def child(variant: str, pairs: int, repeats: int) -> Dict[str, Any]:
    """One variant in this process: {size: median ns per pair}."""
    sys.path.insert(0, REPO)
    import torch
    if not torch.cuda.is_available() or not hasattr(torch._C, "_cuda_customAllocator"):
        return {"error": f"PyTorch {torch.__version__} sees no CUDA device"}
    import hipmr_ctypes as hmr
    from hipmr_ctypes.interop import torch as ht
    scope: Any = None
    if variant == "ours":
        if ht.use(hmr.PoolResource(hmr.AsyncMemoryResource())).route != "pool":
            return {"error": "the pool route is not available (see the warning above)"}
    elif variant == "allocator":
        ht.use(hmr.PoolResource(hmr.AsyncMemoryResource()), route="allocator")
    elif variant == "mem_pool":
        pool = ht.mem_pool(hmr.PoolResource(hmr.AsyncMemoryResource()))
        scope = torch.cuda.use_mem_pool(pool)
        scope.__enter__()
    empty, u8, dev = torch.empty, torch.uint8, torch.device("cuda")

    def pairs_of(size: int) -> Callable[[int], None]:
        def loop(n: int) -> None:
            for _ in range(n):
                t = empty(size, dtype=u8, device=dev)
                del t
        return loop
    medians = ns_per_op({str(size): (pairs_of(size), pairs) for size in SIZES}, repeats,
                        sync=torch.cuda.synchronize)
    failed = [v for v in medians.values() if isinstance(v, str)]
    result: Dict[str, Any] = {"error": failed[0]} if failed else dict(medians)
    result["torch"] = torch.__version__
    if scope is not None:
        scope.__exit__(None, None, None)
    return result


def measure(pairs: int, repeats: int, rounds: int) -> Dict[str, Any]:
    """Every variant in its own child process, taking turns over ``rounds`` rounds: the
    median ns per pair of each variant and size (over the rounds), ``ours``' ratio to
    ``pytorch`` per size, and every run.  :class:`_timing.ChildFailed` naming the variant
    when one could not measure."""
    def one(variant: str) -> Dict[str, Any]:
        try:
            return run_child(__file__, ["--child", variant, "--pairs", str(pairs),
                                        "--repeats", str(repeats)])
        except ChildFailed as exc:
            raise ChildFailed(f"{variant}: {exc}") from None
    runs = take_turns({v: (lambda v=v: one(v)) for v in VARIANTS}, rounds)
    table = {v: {str(s): statistics.median(r[str(s)] for r in runs[v]) for s in SIZES}
             for v in VARIANTS}
    ratios = {str(s): table["ours"][str(s)] / table["pytorch"][str(s)] for s in SIZES}
    return {"ns_per_pair": table, "ratio_ours_to_pytorch": ratios, "runs": runs,
            "torch": runs["pytorch"][0]["torch"], "pairs": pairs, "repeats": repeats,
            "rounds": rounds}


def report(result: Dict[str, Any]) -> None:
    """Print :func:`measure`'s table and whether the goal is met."""
    table, ratios = result["ns_per_pair"], result["ratio_ours_to_pytorch"]
    print(f"PyTorch {result['torch']}, platform "
          f"{os.environ.get('HIPMR_PLATFORM', 'amd')}: median ns per torch.empty + del "
          f"({result['rounds']} rounds x {result['repeats']} loops x {result['pairs']} pairs)")
    print(f"{'size':>8} | {'pytorch':>9} | {'ours':>9} | {'allocator':>9} | {'mem_pool':>9} "
          f"| ours/pytorch")
    for s in SIZES:
        p, o, a, m = (table[v][str(s)] for v in VARIANTS)
        print(f"{_name(s):>8} | {p:9,.0f} | {o:9,.0f} | {a:9,.0f} | {m:9,.0f} "
              f"| {ratios[str(s)]:.2f}x")
    print(f"goal (ours at most {GOAL}x pytorch):",
          "met" if max(ratios.values()) <= GOAL else "NOT met")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.pairs, args.repeats)))
        return 0
    try:
        result = measure(args.pairs, args.repeats, args.rounds)
    except ChildFailed as exc:
        print(exc, file=sys.stderr)
        return 2
    report(result)
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Frameworks on our memory, every speed goal beside its peer in one run (see docs/interop.md).

    HIPMR_PLATFORM=nvidia python scripts/bench_frameworks.py --json frameworks.json

Three parts (``--parts``, default all), each in child processes of its own, since a framework
chooses its allocator once per process:

* ``empty``: ``torch.empty`` + ``del`` through ``interop.torch.use()`` beside PyTorch's
  caching allocator: ``scripts/bench_torch.py``'s measurement (its variants, its children).
  Goal: at most 1.1x.
* ``train``: training steps of a transformers Llama-style model (``LlamaConfig(hidden_size=
  1024, num_hidden_layers=8, num_attention_heads=16, vocab_size=32000)``, its other fields
  the defaults, random weights from a fixed seed), ``--batch`` sequences of ``--seq`` tokens
  (one fixed batch), ``--attn`` attention (``sdpa``), bf16 autocast, AdamW, in deterministic
  mode (``torch.use_deterministic_algorithms(True)``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``,
  fixed seeds), one child per variant and round, the variants taking turns:

  - ``native``: PyTorch's caching allocator as PyTorch ships;
  - ``use``: ``interop.torch.use()`` (the default route, the per-device resource);
  - ``use_async``: ``interop.torch.use(AsyncMemoryResource())``;
  - ``cudaMallocAsync``: PyTorch's own ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``.

  Each child times ``--steps`` steps after ``--warmup`` steps (each step ends in a device
  synchronize); its figure is the median step, and a variant's is the median of its rounds.
  Every step's loss is kept (as ``float.hex``): the losses of every run of every variant must
  be bit-identical to the first ``native`` run's.  Goals: ``use`` within 2 % of ``native``,
  ``use_async`` within 5 % of ``cudaMallocAsync``.
* ``alloc``: CuPy's and Numba's hooks: ``cupy.cuda.alloc`` + drop through our
  ``allocator()`` over a ``PoolResource`` beside CuPy's own ``MemoryPool``, Numba's plugin
  ``memalloc`` + drop beside Numba's own memory manager and CuPy's pool, median ns per
  pair (``scripts/bench_alloc.py``'s rows, timed by ``scripts/_timing.py``).  Goal: at most
  1.3x CuPy's ``MemoryPool``.

Prints one table of every goal (measured, peer, ratio, goal, met) after the parts' own
tables; ``--json`` saves everything.  Exit status 2 when PyTorch (or the part's framework)
sees no CUDA device; a part whose framework is not installed is reported as not measured.
Never used as a test: timing bounds do not belong in unit tests.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Tuple

from _timing import ChildFailed, markdown_table, ns_per_op, run_child, save_json, take_turns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("empty", "train", "alloc")
TRAIN_VARIANTS = ("native", "use", "use_async", "cudaMallocAsync")
#: the model of the ``train`` part (the rest of ``LlamaConfig`` its defaults)
LLAMA = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
         "vocab_size": 32000}
#: what each training variant's child gets in its environment
TRAIN_ENV = {"cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}}
ALLOC_SIZES = (256, 64 << 10, 16 << 20)
#: the goals: (name, measured row, peer row, the largest ratio that meets it)
GOALS: Tuple[Tuple[str, str, str, float], ...] = (
    ("torch.empty + del: use() / PyTorch caching allocator", "empty:ours", "empty:pytorch", 1.1),
    ("training step: use() / native", "train:use", "train:native", 1.02),
    ("training step: use(AsyncMemoryResource()) / backend:cudaMallocAsync", "train:use_async",
     "train:cudaMallocAsync", 1.05),
    ("CuPy alloc + drop: allocator() over a pool / CuPy MemoryPool", "alloc:cupy_ours",
     "alloc:cupy_pool", 1.3),
    ("CuPy alloc + drop: allocator(pool) / CuPy MemoryPool", "alloc:cupy_ours_pinned",
     "alloc:cupy_pool", 1.3),
    ("Numba memalloc + drop: our plugin / CuPy MemoryPool", "alloc:numba_ours",
     "alloc:cupy_pool", 1.3),
    ("Numba memalloc + drop: our plugin / Numba's own manager", "alloc:numba_ours",
     "alloc:numba_own", 1.3),
)


# ------------------------------------------------------------------------------ children
def _no_device() -> Optional[str]:
    """Why PyTorch cannot measure here (None: it sees a CUDA / ROCm device)."""
    try:
        import torch
    except ImportError as exc:
        return f"PyTorch is not installed ({exc})"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def train_child(variant: str, steps: int, warmup: int, batch: int, seq: int,
                attn: str) -> Dict[str, Any]:
    """One training variant in this process: every step's ms and loss."""
    sys.path.insert(0, REPO)
    problem = _no_device()
    if problem is not None:
        return {"error": problem}
    import time
    import torch
    try:
        import transformers
    except ImportError as exc:
        return {"error": f"transformers is not installed ({exc})"}
    import hipmr_ctypes as hmr
    from hipmr_ctypes.interop import torch as ht
    route = None
    if variant == "use":
        route = ht.use().route
    elif variant == "use_async":
        route = ht.use(hmr.AsyncMemoryResource()).route
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    backend = torch.cuda.get_allocator_backend()
    if (backend == "cudaMallocAsync") != (variant == "cudaMallocAsync"):
        return {"error": f"PyTorch's allocator backend is {backend!r} (PYTORCH_CUDA_ALLOC_CONF="
                         f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF')!r})"}
    config = transformers.LlamaConfig(**LLAMA, attn_implementation=attn)
    with torch.device("cuda"):   # the random weights made on the device (from its seed)
        model = transformers.LlamaForCausalLM(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(0, LLAMA["vocab_size"], (batch, seq), generator=gen).to("cuda")
    ms: List[float] = []
    losses: List[str] = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
        except RuntimeError as exc:   # e.g. an operation without a deterministic kernel
            return {"error": f"step {i}: {type(exc).__name__}: {exc} (try --attn eager)"}
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        losses.append(float(loss.detach().float().item()).hex())
        if i >= warmup:
            ms.append((t1 - t0) * 1e3)
    free, total = torch.cuda.mem_get_info()
    return {"median_ms": statistics.median(ms), "ms": ms, "losses": losses, "route": route,
            "device_used_bytes": total - free,
            "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "backend": backend, "torch": torch.__version__,
            "transformers": transformers.__version__}


def alloc_child(pairs: int, repeats: int) -> Dict[str, Any]:
    """CuPy's and Numba's rows in this process: {row: {size: median ns per pair}}."""
    sys.path.insert(0, REPO)
    import hipmr_ctypes as hmr
    if hmr.device_count() == 0:
        return {"error": f"the {hmr.platform()} platform sees no device"}
    import bench_alloc as ba
    from hipmr_ctypes import _hip
    pool = hmr.PoolResource(hmr.AsyncMemoryResource())
    hmr.set_current_device_resource(pool)
    names = {"cupy_ours": ba.CUPY_OURS, "cupy_ours_pinned": ba.CUPY_OURS_PINNED,
             "numba_ours": ba.NUMBA_OURS, "numba_own": ba.NUMBA_OWN, "cupy_pool": ba.CUPY_POOL}
    rows: Dict[str, Dict[str, Any]] = {key: {} for key in names}
    sync = _hip.get_runtime().fn.hipDeviceSynchronize
    for size in ALLOC_SIZES:
        loops = {**ba.interop_loops(size, pool), **ba.cupy_pool_loops(size)}
        timed = {}
        for key, name in names.items():
            loop = loops.get(name, "missing: its framework did not import")
            if isinstance(loop, str):
                rows[key][str(size)] = loop
            else:
                timed[key] = (loop, pairs)
        for key, ns in ns_per_op(timed, repeats, sync=sync).items():
            rows[key][str(size)] = ns
    return {"rows": rows, "names": names}


# ------------------------------------------------------------------------------- parts
def run_empty(args: argparse.Namespace) -> Dict[str, Any]:
    import bench_torch
    result = bench_torch.measure(args.empty_pairs, args.empty_repeats, args.rounds)
    bench_torch.report(result)
    return result


def run_train(args: argparse.Namespace) -> Dict[str, Any]:
    def one(variant: str) -> Dict[str, Any]:
        try:
            return run_child(__file__, ["--child", f"train:{variant}", "--steps",
                                        str(args.steps), "--warmup", str(args.warmup),
                                        "--batch", str(args.batch), "--seq", str(args.seq),
                                        "--attn", args.attn],
                             env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                  **TRAIN_ENV.get(variant, {})})
        except ChildFailed as exc:
            raise ChildFailed(f"train {variant}: {exc}") from None
    runs = take_turns({v: (lambda v=v: one(v)) for v in TRAIN_VARIANTS}, args.rounds,
                      shuffle=True)
    median = {v: statistics.median(r["median_ms"] for r in runs[v]) for v in TRAIN_VARIANTS}
    first = runs["native"][0]["losses"]
    identical = {v: all(r["losses"] == first for r in runs[v]) for v in TRAIN_VARIANTS}
    first_run = runs["native"][0]
    print(f"\nTraining step, Llama-style {LLAMA} (PyTorch {first_run['torch']}, transformers "
          f"{first_run['transformers']}), batch {args.batch} x {args.seq} tokens, bf16 "
          f"autocast, AdamW, deterministic: median ms per step ({args.rounds} rounds x "
          f"{args.steps} steps after {args.warmup})")
    markdown_table(["variant", "ms / step", "/ native", "losses as native's",
                    "device memory used at the end"],
                   [[v, f"{median[v]:.2f}", f"{median[v] / median['native']:.3f}x",
                     "bit-identical" if identical[v] else "DIFFER",
                     f"{statistics.median(r['device_used_bytes'] for r in runs[v]) / 2**30:.1f}"
                     f" GiB"] for v in TRAIN_VARIANTS])
    return {"median_ms": median, "losses_identical": identical, "runs": runs,
            "model": LLAMA, "attn": args.attn, "batch": args.batch, "seq": args.seq, "steps": args.steps,
            "warmup": args.warmup, "rounds": args.rounds}


def run_alloc(args: argparse.Namespace) -> Dict[str, Any]:
    got = run_child(__file__, ["--child", "alloc", "--alloc-pairs", str(args.alloc_pairs),
                               "--alloc-repeats", str(args.alloc_repeats)])
    rows, names = got["rows"], got["names"]
    print("\nCuPy and Numba hooks: median ns per allocation + drop "
          f"({args.alloc_repeats} loops x {args.alloc_pairs} pairs)")
    markdown_table(["row", *(_size(s) for s in ALLOC_SIZES)],
                   [[names[key], *(_cell(rows[key].get(str(s))) for s in ALLOC_SIZES)]
                    for key in names])
    return got


def _size(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else (
        f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B")


def _cell(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, float) else str(value or "")[:40]


def goals(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every goal: the measured ratio (the largest over sizes: each size's own ratio) and
    whether it is met (None where a part was not measured)."""
    out = []
    for name, mine, peer, bound in GOALS:
        part, row = mine.split(":")
        found = results.get(part)
        ratio: Optional[float] = None
        if isinstance(found, dict):
            if part == "train":
                ratio = found["median_ms"][row] / found["median_ms"][peer.split(":")[1]]
            else:
                table = found["ns_per_pair"] if part == "empty" else found["rows"]
                a, b = table[row], table[peer.split(":")[1]]
                per = [a[s] / b[s] for s in a
                       if isinstance(a.get(s), (int, float)) and isinstance(b.get(s), (int, float))]
                ratio = max(per) if per and len(per) == len(a) else None
        out.append({"goal": name, "ratio": ratio, "at_most": bound,
                    "met": None if ratio is None else ratio <= bound})
    train = results.get("train")
    if isinstance(train, dict):
        same = all(train["losses_identical"].values())
        out.append({"goal": "training losses bit-identical in every variant and run",
                    "ratio": None, "at_most": None, "met": same})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Parts and goals: see the module docstring (scripts/bench_frameworks.py).")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run (default {','.join(PARTS)})")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the empty and train parts' children (default 3)")
    parser.add_argument("--empty-pairs", type=int, default=10000,
                        help="torch.empty + del pairs per timed loop (default 10000)")
    parser.add_argument("--empty-repeats", type=int, default=5,
                        help="timed loops per size in each empty child (default 5)")
    parser.add_argument("--steps", type=int, default=20,
                        help="timed training steps per child (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="training steps before the timed ones (default 5)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    parser.add_argument("--seq", type=int, default=512, help="tokens per sequence (default 512)")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="the model's attention (transformers' attn_implementation; "
                             "default sdpa)")
    parser.add_argument("--alloc-pairs", type=int, default=20000,
                        help="CuPy / Numba allocations per timed loop (default 20000)")
    parser.add_argument("--alloc-repeats", type=int, default=7,
                        help="timed loops per row and size (default 7)")
    parser.add_argument("--json", metavar="FILE", help="also save the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts: unknown part(s) {', '.join(unknown) or '(none)'}; expected "
                     f"some of {', '.join(PARTS)}")
    for name in ("rounds", "empty_pairs", "empty_repeats", "steps", "batch", "seq",
                 "alloc_pairs", "alloc_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if args.child:
        if args.child.startswith("train:") and args.child[6:] in TRAIN_VARIANTS:
            got = train_child(args.child[6:], args.steps, args.warmup, args.batch, args.seq,
                              args.attn)
        elif args.child == "alloc":
            got = alloc_child(args.alloc_pairs, args.alloc_repeats)
        else:
            parser.error(f"unknown child {args.child!r}")
        print(json.dumps(got))
        return 0
    if {"empty", "train"} & set(parts):
        problem = _probe()
        if problem is not None:
            print(f"bench_frameworks.py: {problem}: the empty and train parts need a GPU",
                  file=sys.stderr)
            return 2
    results: Dict[str, Any] = {}
    runners = {"empty": run_empty, "train": run_train, "alloc": run_alloc}
    status = 0
    for part in parts:
        try:
            results[part] = runners[part](args)
        except ChildFailed as exc:
            print(f"\n{part}: not measured: {exc}", file=sys.stderr)
            results[part] = f"not measured: {exc}"
            status = 2 if "no CUDA device" in str(exc) or "sees no device" in str(exc) else 1
    table = goals(results)
    print("\nGoals (the ratio is the largest over sizes)")
    markdown_table(["goal", "ratio", "at most", "met"],
                   [[g["goal"], "" if g["ratio"] is None else f"{g['ratio']:.3f}x",
                     "" if g["at_most"] is None else f"{g['at_most']}x",
                     "not measured" if g["met"] is None else ("yes" if g["met"] else "NO")]
                    for g in table])
    save_json(args.json, {"platform": os.environ.get("HIPMR_PLATFORM", "amd"), "parts": parts,
                          "goals": table, **results})
    return status


def _probe() -> Optional[str]:
    """Why PyTorch cannot measure here, asked of a child process (this one never imports
    PyTorch: its allocator is chosen once per process)."""
    try:
        run_child(__file__, ["--child", "probe"], timeout=300)
    except ChildFailed as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    if sys.argv[1:3] == ["--child", "probe"]:
        problem = _no_device()
        print(json.dumps({"error": problem} if problem else {"ok": True}))
        sys.exit(0)
    sys.exit(main())

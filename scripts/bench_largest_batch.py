#!/usr/bin/env python3
"""Largest training batch under one memory cap: PyTorch's allocators beside ours, one process
per trial, and the training step's time at a batch every mode shares.

    HIPMR_PLATFORM=nvidia python3 scripts/bench_largest_batch.py --cap 16GiB --json batch.json

The workload: a Llama-style model built from ``transformers.LlamaConfig`` (``--layers`` 8,
``--hidden`` 1024, ``--heads`` 16, ``--vocab`` 32000, the config's default intermediate size,
random weights seeded the same in every trial), ``--seq`` 512-token sequences, bf16 autocast,
AdamW, ``--steps`` 3 training steps.  A trial is one child process (PyTorch chooses its
allocator once per process) that builds the model and runs the steps at one batch size; an
out-of-memory error (``torch.cuda.OutOfMemoryError``, ours, or a NULL from our allocator) is a
failed trial, a crash or a trial past ``--timeout`` seconds too (its stderr's tail is kept in the
JSON), any other error stops that mode.  Each mode's largest batch is found by bisection over
``--lo`` .. ``--hi`` (12 .. 36).

Modes (``--modes``, comma-separated), all under the same cap:

* ``native``: PyTorch's caching allocator, capped by
  ``torch.cuda.set_per_process_memory_fraction(cap / total)`` (a cap on the memory it reserves);
* ``expandable``: the same with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``;
* ``ours``: ``interop.torch.use(VirtualPoolResource(maximum_pool_size=cap))`` (the pool route:
  PyTorch's caching allocator on top of our pool that grows in place);
* ``ours-allocator``: the same pool with ``route="allocator"`` (every tensor one allocation of
  our pool);
* ``ours-pool``: the same pool with ``route="pool"`` asked for explicitly;
* ``default``: ``interop.torch.use()`` with no resource, ``HIPMR_DEVICE_RESOURCE`` set to
  ``--default-spec`` (default ``virtual_pool,pool=:CAP``);
* ``pool``: ``use(PoolResource(AsyncMemoryResource(), maximum_pool_size=cap))`` (reference);
* ``pool-allocator``: the same with ``route="allocator"``.

The step time: the median of the steps after the first (each between two device
synchronizations) of one trial of ``--time-steps`` steps per mode at a common batch: the
largest batch ``native`` fits (or ``--time-batch``); a mode's bisection starts with that trial.
Also recorded per trial: PyTorch's peak reserved and allocated bytes, the device's used memory
at the end, and our resource's figures (mapped / reserved / pool bytes).  Exit status 2 when
PyTorch (or transformers) is missing or sees no CUDA device.  Never used as a test: timing
bounds do not belong in unit tests.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("native", "expandable", "ours", "ours-allocator", "ours-pool", "default", "pool",
         "pool-allocator")
DEFAULT_MODES = "native,expandable,ours,ours-allocator,pool"
MARK = "@@bench_largest_batch "   # the line of a child's stdout that carries its result
TAIL = 3000                       # characters of a failed child's stderr kept


def _size(text: str) -> int:
    sys.path.insert(0, REPO)
    from hipmr_ctypes._sizes import parse_bytes
    try:
        return parse_bytes(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _modes(text: str) -> List[str]:
    got = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in got if m not in MODES]
    if bad or not got:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {', '.join(bad) or '(none)'}; "
                                         f"expected some of {', '.join(MODES)}")
    return list(dict.fromkeys(got))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--modes", type=_modes, default=_modes(DEFAULT_MODES),
                   help=f"comma-separated, of {', '.join(MODES)} (default {DEFAULT_MODES})")
    p.add_argument("--cap", type=_size, default=16 << 30, help="memory cap (default 16GiB)")
    p.add_argument("--lo", type=int, default=12, help="smallest batch tried (default 12)")
    p.add_argument("--hi", type=int, default=36, help="largest batch tried (default 36)")
    p.add_argument("--steps", type=int, default=3, help="training steps per trial (default 3)")
    p.add_argument("--time-steps", type=int, default=8,
                   help="steps of the timed trial (default 8; the first is not timed)")
    p.add_argument("--time-batch", type=int, default=None,
                   help="the common batch of the timed trials (default: native's largest)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--intermediate", type=int, default=None,
                   help="the MLP's size (default: LlamaConfig's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--default-spec", default=None,
                   help="HIPMR_DEVICE_RESOURCE of the 'default' mode (default "
                        "virtual_pool,pool=:CAP)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per trial")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", help=argparse.SUPPRESS)        # mode of a child trial
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p


def check_args(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the numbers of ``args``, or None."""
    if not 1 <= args.lo <= args.hi:
        return f"--lo {args.lo} --hi {args.hi}: expected 1 <= lo <= hi"
    for name in ("steps", "time_steps", "seq", "layers", "hidden", "heads", "vocab"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    if args.time_steps < 2:
        return "--time-steps must be at least 2 (the first step is not timed)"
    if args.cap <= 0:
        return "--cap must be positive"
    if args.timeout <= 0:
        return "--timeout must be positive"
    return None


# ---------------------------------------------------------------- bisection (no torch here)

class ModeError(Exception):
    """A trial failed for a reason other than memory: the mode cannot be measured."""


def largest(trial: Callable[[int], Dict[str, Any]], lo: int, hi: int,
            first: Optional[int] = None) -> Tuple[Optional[int], Dict[int, Dict[str, Any]]]:
    """The largest batch in ``lo`` .. ``hi`` whose ``trial(batch)`` has ``status == "ok"``
    (None when even ``lo`` fails), by bisection assuming that a batch that fits means every
    smaller one fits; ``first`` (within the range) is tried first.  Returns it and every trial
    made, by batch.  A trial of status ``"error"`` raises :class:`ModeError`; any other status
    (``"oom"``, ``"crash"``, ``"timeout"``) is a batch that does not fit."""
    tried: Dict[int, Dict[str, Any]] = {}

    def fits(batch: int) -> bool:
        got = trial(batch)
        tried[batch] = got
        if got.get("status") == "error":
            raise ModeError(f"batch {batch}: {got.get('error')}")
        return got.get("status") == "ok"

    good, bad = lo - 1, hi + 1          # every batch <= good fits, every one >= bad does not
    if first is not None and lo <= first <= hi:
        if fits(first):
            good = first
        else:
            bad = first
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return (good if good >= lo else None), tried


# ---------------------------------------------------------------- the child

def _emit(result: Dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


def _is_oom(exc: BaseException) -> bool:
    names = [t.__name__ for t in type(exc).__mro__]
    return ("OutOfMemoryError" in names or "MemoryError" in names
            or "out of memory" in str(exc).lower())


def probe() -> Dict[str, Any]:
    """What the GPU machine has: PyTorch, transformers, the device and its memory."""
    try:
        import torch
    except ImportError as exc:
        return {"error": f"PyTorch is not installed ({exc})"}
    if not torch.cuda.is_available():
        return {"error": f"PyTorch {torch.__version__} sees no CUDA device"}
    try:
        import transformers
    except ImportError as exc:
        return {"error": f"transformers is not installed ({exc})"}
    free, total = torch.cuda.mem_get_info()
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0), "total_bytes": total, "free_bytes": free}


def _install(mode: str, cap: int, default_spec: str) -> Dict[str, Any]:
    """Set up ``mode``'s allocator in this process (before PyTorch touches CUDA); returns
    what reports its figures: {"resource": our resource or None, "allocator": ours or None}."""
    import torch
    if mode in ("native", "expandable"):
        torch.cuda.init()
        total = torch.cuda.mem_get_info()[1]
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        return {"resource": None, "allocator": None}
    sys.path.insert(0, REPO)
    import hipmr_ctypes as hmr
    from hipmr_ctypes.interop import torch as ht
    resource: Any
    if mode == "default":
        os.environ["HIPMR_DEVICE_RESOURCE"] = default_spec
        made = ht.use()
        resource = hmr.get_per_device_resource(0)
    else:
        if mode.startswith("pool"):
            resource = hmr.PoolResource(hmr.AsyncMemoryResource(), maximum_pool_size=cap)
        else:
            vpool = getattr(hmr, "VirtualPoolResource", None)
            if vpool is None:
                raise ModeError("this hipmr_ctypes has no VirtualPoolResource")
            resource = vpool(maximum_pool_size=cap)
        route = {"ours": "auto", "ours-allocator": "allocator", "ours-pool": "pool",
                 "pool": "auto", "pool-allocator": "allocator"}[mode]
        made = ht.use(resource, route=route)
    return {"resource": resource, "allocator": made, "route": made.route}


def _ours_figures(resource: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {"resource": type(resource).__name__}
    for name in ("mapped_bytes", "peak_pool_size", "reserved_bytes", "pool_size"):
        try:
            value = getattr(resource, name)
            if callable(value):
                value = value()
        except Exception:  # noqa: BLE001 - a figure this resource lacks
            continue
        if isinstance(value, int):
            out[name] = int(value)
    return out


def child(args: argparse.Namespace) -> Dict[str, Any]:
    """One trial: ``args.child`` mode, ``args.batch`` batch, ``args.steps`` steps."""
    mode, batch = args.child, args.batch
    spec = args.default_spec or f"virtual_pool,pool=:{args.cap}"
    try:
        import torch
        import transformers
        setup = _install(mode, args.cap, spec)
    except ModeError as exc:
        return {"status": "error", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported
        return {"status": "error", "error": f"setting up: {type(exc).__name__}: {exc}"}
    result: Dict[str, Any] = {"mode": mode, "batch": batch, "route": setup.get("route")}
    times: List[float] = []
    try:
        torch.manual_seed(args.seed)
        options: Dict[str, Any] = dict(hidden_size=args.hidden, num_hidden_layers=args.layers,
                                       num_attention_heads=args.heads, vocab_size=args.vocab)
        if args.intermediate is not None:
            options["intermediate_size"] = args.intermediate
        config = transformers.LlamaConfig(**options)
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(config)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator(device="cuda").manual_seed(args.seed)
        for _ in range(args.steps):
            ids = torch.randint(0, args.vocab, (batch, args.seq), device="cuda",
                                generator=generator)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            del ids, loss
        made = setup.get("allocator")
        if made is not None and made.failures:   # a NULL PyTorch took without a word
            raise MemoryError(f"our allocator refused {made.failures} allocation(s): "
                              f"{made.last_error!r}")
        result["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - classified
        made = setup.get("allocator")
        refused = made is not None and getattr(made, "failures", 0) > 0
        result["status"] = "oom" if _is_oom(exc) or refused else "error"
        result["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    result["step_s"] = times
    if len(times) > 1:
        result["step_median_s"] = statistics.median(times[1:])
    try:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        result["device_used_bytes"] = total - free
    except Exception as exc:  # noqa: BLE001 - figures are best effort
        result["figures_error"] = f"{type(exc).__name__}: {exc}"
    if setup.get("resource") is not None:
        result["ours"] = _ours_figures(setup["resource"])
    return result


# ---------------------------------------------------------------- the parent

def _child_command(args: argparse.Namespace, mode: str, batch: int, steps: int) -> List[str]:
    command = [sys.executable, os.path.abspath(__file__), "--child", mode, "--batch",
               str(batch), "--steps", str(steps), "--cap", str(args.cap), "--seq",
               str(args.seq), "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--heads", str(args.heads), "--vocab", str(args.vocab), "--seed", str(args.seed)]
    if args.intermediate is not None:
        command += ["--intermediate", str(args.intermediate)]
    if args.default_spec is not None:
        command += ["--default-spec", args.default_spec]
    return command


def run_child(command: List[str], env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    """Run one child; its result, or ``{"status": "crash" / "timeout", "stderr": tail}``."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (
            exc.stderr or "")
        return {"status": "timeout", "error": f"past {timeout:g} s", "stderr": err[-TAIL:],
                "wall_s": time.perf_counter() - start}
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    got: Dict[str, Any]
    if lines:
        try:
            got = json.loads(lines[-1][len(MARK):])
        except ValueError:
            got = {"status": "crash", "error": "unreadable result"}
    else:
        got = {"status": "crash", "error": f"exit status {done.returncode}, no result"}
    if got.get("status") != "ok":
        got["stderr"] = done.stderr[-TAIL:]
    got["wall_s"] = time.perf_counter() - start
    return got


def _env(mode: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def _gib(n: Any) -> str:
    return f"{n / (1 << 30):.2f}" if isinstance(n, int) else "-"


def measure(args: argparse.Namespace, run: Callable[[str, int, int], Dict[str, Any]],
            done: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """Every mode's bisection and timed trial through ``run(mode, batch, steps)``;
    ``done(partial result)`` after each mode (the JSON written so far survives a kill)."""
    modes: Dict[str, Dict[str, Any]] = {}
    common = args.time_batch
    order = list(args.modes)
    if "native" in order:               # native first: its largest batch is the common one
        order.remove("native")
        order.insert(0, "native")
    for mode in order:
        timed: Dict[str, Any] = {}

        def trial(batch: int, mode: str = mode, timed: Dict[str, Any] = timed
                  ) -> Dict[str, Any]:
            steps = args.time_steps if batch == common and not timed else args.steps
            got = run(mode, batch, steps)
            print(f"  {mode:15s} batch {batch:4d}: {got.get('status')}"
                  f"{'' if got.get('status') == 'ok' else ' ' + str(got.get('error'))[:120]}",
                  flush=True)
            if steps == args.time_steps:
                timed.update(got)
            return got
        entry: Dict[str, Any] = {}
        try:
            best, tried = largest(trial, args.lo, args.hi, first=common)
            entry["largest_batch"] = best
            entry["at_hi"] = best == args.hi
        except ModeError as exc:
            entry["error"] = str(exc)
            best, tried = None, {}
        entry["trials"] = {str(b): t for b, t in sorted(tried.items())}
        if mode == "native" and common is None and best is not None:
            common = best
        entry["timed"] = timed
        modes[mode] = entry
        if done is not None:
            done({"modes": modes, "common_batch": common})
    if common is not None:              # modes whose bisection did not start at common
        for mode in order:
            entry = modes[mode]
            if not entry["timed"] and "error" not in entry:
                got = run(mode, common, args.time_steps)
                entry["timed"] = got
                print(f"  {mode:15s} batch {common:4d} (timed): {got.get('status')}",
                      flush=True)
    return {"modes": modes, "common_batch": common}


def table(result: Dict[str, Any]) -> List[str]:
    lines = []
    common = result["common_batch"]
    native = result["modes"].get("native", {}).get("timed", {}).get("step_median_s")
    lines.append(f"{'mode':15s} | largest | peak reserved GiB | ours peak GiB | "
                 f"step ms @ {common} | / native")
    for mode, entry in result["modes"].items():
        best = entry.get("largest_batch")
        best_text = (entry["error"][:40] if "error" in entry else
                     "< lo" if best is None else f"{best}{'+' if entry.get('at_hi') else ''}")
        top = entry["trials"].get(str(best), {}) if best is not None else {}
        ours = top.get("ours", {})
        mapped = ours.get("peak_pool_size", ours.get("mapped_bytes", ours.get("pool_size")))
        step = entry.get("timed", {}).get("step_median_s")
        ratio = f"{step / native:.3f}" if step and native else "-"
        step_text = f"{step * 1e3:.1f}" if step else str(entry.get("timed", {})
                                                           .get("status", "-"))
        lines.append(f"{mode:15s} | {best_text:>7s} | {_gib(top.get('peak_reserved_bytes')):>16s}"
                     f" | {_gib(mapped):>13s} | {step_text:>10s} | {ratio}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.probe:
        _emit(probe())
        return 0
    if args.child:
        if args.child not in MODES or args.batch is None:
            print("--child needs a mode and --batch", file=sys.stderr)
            return 2
        _emit(child(args))
        return 0
    problem = check_args(args)
    if problem:
        print(f"bench_largest_batch.py: {problem}", file=sys.stderr)
        return 2
    where = run_child([sys.executable, os.path.abspath(__file__), "--probe"], dict(os.environ),
                      args.timeout)
    if "error" in where or "total_bytes" not in where:
        print(f"bench_largest_batch.py: {where.get('error')}"
              f"{' ' + where.get('stderr', '')[-500:] if where.get('stderr') else ''}",
              file=sys.stderr)
        return 2
    print(f"PyTorch {where['torch']}, transformers {where['transformers']}, "
          f"{where['device']} ({_gib(where['total_bytes'])} GiB), platform "
          f"{os.environ.get('HIPMR_PLATFORM', 'amd')}; cap {_gib(args.cap)} GiB, batch "
          f"{args.lo}..{args.hi}, {args.steps} steps per trial", flush=True)

    def run(mode: str, batch: int, steps: int) -> Dict[str, Any]:
        return run_child(_child_command(args, mode, batch, steps), _env(mode), args.timeout)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _timing import save_json
    settings = {k: v for k, v in vars(args).items()
                if k not in ("child", "batch", "probe", "json")}

    def save(partial: Dict[str, Any]) -> None:
        save_json(args.json, dict(partial, machine=where, settings=settings))
    result = measure(args, run, save)
    save(result)
    print("\n".join(table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

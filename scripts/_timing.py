"""The timing harness the benchmark scripts share: one way to time, one floor, one writer.

* :func:`take_turns`: every row takes one turn per round, ``rounds`` rounds, so that a slow
  phase of a shared machine falls on every row alike instead of on whichever ran during it;
  with ``shuffle=True`` every round after the first takes the rows in an order of its own,
  so that no row always runs right after the same other one (and inherits what that one left
  behind: memory handed back to the C library, whose pages the next row faults in again).
* :func:`ns_per_op`: the median ns per operation of loops (``loop(n)`` runs ``n`` operations),
  taking turns, after a warm-up of each, with the garbage collector off while timing; a row
  that raises is reported as ``"failed: ..."`` and the others go on.
* :data:`FLOOR` / :func:`floor_loop`: two plain Python calls per operation, the least an
  allocate + deallocate pair can cost from Python (the ``x floor`` column of the tables).
* :func:`run_child`: one variant of a benchmark in a child process of its own (what a
  framework chooses once per process, its allocator, needs), answering one JSON line.
* :func:`print_rows`, :func:`markdown_table` and :func:`save_json`: the tables and the
  ``--json`` file.

The scripts import it as ``from _timing import ...`` (Python puts a script's folder on
``sys.path``).  Timing bounds never go into unit tests; ``tests/repo/test_bench_scripts.py`` only
runs the scripts in a quick mode.
"""
from __future__ import annotations

import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = ["FLOOR", "floor_loop", "take_turns", "seconds_per_call", "ns_per_op", "ChildFailed",
           "run_child", "print_rows", "markdown_table", "save_json"]

#: the floor row's name
FLOOR = "two plain Python calls (floor)"

Loop = Callable[[int], Any]


def floor_loop() -> Loop:
    """A loop of ``n`` operations of two plain Python calls each (what an allocate +
    deallocate pair costs at the least)."""
    def f(a: Any, b: Any = None) -> Any:
        return a

    def two_calls(n: int) -> None:
        for _ in range(n):
            p = f(1)
            f(p, 1)
    return two_calls


def take_turns(samplers: Mapping[str, Callable[[], Any]], rounds: int, *,
               shuffle: bool = False) -> Dict[str, List[Any]]:
    """Call each sampler once per round, in order, for ``rounds`` rounds; returns each one's
    samples (what it returned), in round order.  ``shuffle``: round ``r > 0`` calls them in
    an order drawn by ``random.Random(r)`` (the same orders in every run).  A rotation of one
    order would not do: it keeps every sampler's predecessor."""
    samples: Dict[str, List[Any]] = {name: [] for name in samplers}
    for r in range(rounds):
        order = list(samplers)
        if shuffle and r:
            random.Random(r).shuffle(order)
        for name in order:
            samples[name].append(samplers[name]())
    return samples


def seconds_per_call(op: Callable[[], Any], min_s: float) -> float:
    """Seconds per call of ``op``: as many calls as fill ``min_s`` (at least one)."""
    count, start = 0, time.perf_counter()
    while True:
        op()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / count


def ns_per_op(loops: Mapping[str, Tuple[Loop, int]], rounds: int, *, warmup: int = 2000,
              sync: Optional[Callable[[], Any]] = None) -> Dict[str, Any]:
    """Median ns per operation of each ``name: (loop, n)``: a warm-up run of each loop
    (``min(n, warmup)`` operations), then ``rounds`` rounds in which every loop runs ``n``
    operations in turn, timed, with the garbage collector off.  ``sync`` (a device
    synchronize) runs after each warm-up and each timed run, outside the timing.  A loop that
    raises is dropped from the later rounds and reported as ``"failed: Type: message"``."""
    for loop, n in loops.values():
        loop(min(n, warmup))
        if sync is not None:
            sync()
    failed: Dict[str, str] = {}

    def timed(name: str, loop: Loop, n: int) -> Callable[[], Optional[float]]:
        def sample() -> Optional[float]:
            if name in failed:
                return None
            try:
                t0 = time.perf_counter_ns()
                loop(n)
                t1 = time.perf_counter_ns()
                if sync is not None:
                    sync()
            except Exception as exc:  # noqa: BLE001 - one row fails, the others go on
                failed[name] = f"failed: {type(exc).__name__}: {exc}"
                return None
            return (t1 - t0) / n
        return sample

    enabled = gc.isenabled()
    gc.disable()
    try:
        samples = take_turns({name: timed(name, loop, n) for name, (loop, n) in loops.items()},
                             rounds)
    finally:
        if enabled:
            gc.enable()
    out: Dict[str, Any] = {}
    for name, got in samples.items():
        values = [v for v in got if v is not None]
        if values:
            out[name] = statistics.median(values)
    out.update(failed)
    return out


class ChildFailed(Exception):
    """A child process said why it could not measure (or died saying nothing useful)."""


def run_child(script: str, args: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
              timeout: float = 600) -> Dict[str, Any]:
    """Run ``python script *args`` (``env``: variables added to this process's environment)
    and return the JSON object its last line of output is.  :class:`ChildFailed` with the
    object's ``"error"``, or with the exit status and the end of the child's stderr when its
    last line is no JSON object."""
    full = None if env is None else dict(os.environ, **env)
    try:
        done = subprocess.run([sys.executable, os.path.abspath(script), *args],
                              capture_output=True, text=True, timeout=timeout, env=full)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"no answer within {timeout:g} s") from None
    try:
        got = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = None
    if not isinstance(got, dict):
        raise ChildFailed(f"exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    if "error" in got:
        raise ChildFailed(str(got["error"]))
    return got


def print_rows(header: str, rows: Mapping[str, float], width: int = 44,
               fmt: str = "9.0f") -> None:
    """Print ``header``, then one ``  name  value`` line per row (names padded to ``width``,
    values formatted with ``fmt``)."""
    print(header)
    for name, value in rows.items():
        print(f"  {name:{width}s} {value:{fmt}}")


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print a Markdown table: ``| a | b |``, the ``|---|`` line, then one line per row."""
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def save_json(path: Optional[str], data: Any) -> None:
    """Write ``data`` to ``path`` as indented JSON (nothing when ``path`` is None or empty)."""
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")

#!/usr/bin/env python3
"""What a block freed on another thread's per-thread stream costs the thread that takes it,
while unrelated work keeps the device busy.

Thread A allocates and frees on its per-thread stream through a ``PoolResource``; a created
stream then gets ``--busy-ms`` of memsets; thread B asks for memory on its own per-thread stream
and the pool hands it A's memory.  Three cases, each timed as the host time of B's
``allocate_async`` (median of ``--rounds``):

* ``A alive, B moves A's blocks``: B cannot record on A's stream: a device-wide wait, which
  also waits for the unrelated work;
* ``A moved its own blocks``: A's own slow path recorded an event for them: B's stream waits
  for that event, the host does not wait;
* ``A ended``: A waited for its stream as it ended: no wait at all.

    HIPMR_PLATFORM=nvidia python3 scripts/bench_per_thread_reuse.py --json reuse.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402

from _timing import save_json  # noqa: E402

PER_THREAD = 2
CHUNK = 1 << 20


def _busy(stream: Any, buf: Any, ms: float, per_memset_ms: float) -> None:
    """Queue about ``ms`` of memsets on ``stream`` (``per_memset_ms`` each, from
    :func:`_calibrate`)."""
    for _ in range(max(1, int(ms / per_memset_ms))):
        buf.memset(1, stream=stream)


def _calibrate(stream: Any, buf: Any) -> float:
    buf.memset(0, stream=stream)
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        buf.memset(1, stream=stream)
    stream.synchronize()
    return (time.perf_counter() - start) * 100.0   # ms per memset


class _Thread:
    """A thread that runs ``work()`` and stays alive until :meth:`finish`."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.ready = threading.Event()
        self.value: Any = None
        self.thread = threading.Thread(target=self._body, args=(work,))
        self.thread.start()
        self.ready.wait()

    def _body(self, work: Callable[[], Any]) -> None:
        self.value = work()
        self.ready.set()
        self.done.wait()

    def finish(self) -> None:
        self.done.set()
        self.thread.join()


def _one(case: str, busy_stream: Any, busy_buf: Any, busy_ms: float,
         per_memset_ms: float) -> float:
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=CHUNK)

    def a() -> None:
        p = pool.allocate_async(CHUNK, 256, PER_THREAD)   # all of it: B must take A's memory
        pool.deallocate_async(p, CHUNK, 256, PER_THREAD)
        if case == "A moved its own blocks":
            big = pool.allocate_async(4 * CHUNK, 256, PER_THREAD)   # A's lists moved: event
            pool.deallocate_async(big, 4 * CHUNK, 256, PER_THREAD)
            hmr.stream_per_thread.wait()

    holder = _Thread(a)
    if case == "A ended":
        holder.finish()
    result: Dict[str, float] = {}

    def b() -> None:
        _busy(busy_stream, busy_buf, busy_ms, per_memset_ms)
        start = time.perf_counter()
        q = pool.allocate_async(CHUNK // 2, 256, PER_THREAD)
        result["s"] = time.perf_counter() - start
        pool.deallocate_async(q, CHUNK // 2, 256, PER_THREAD)
        hmr.stream_per_thread.wait()

    t = threading.Thread(target=b)
    t.start()
    t.join()
    if case != "A ended":
        holder.finish()
    busy_stream.synchronize()
    pool.release()
    return result["s"]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--busy-ms", type=float, default=50.0)
    parser.add_argument("--busy-bytes", default="1GiB", help="the memset buffer")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    busy_buf = hmr.Buffer(parse_bytes(args.busy_bytes), resource=hmr.DeviceMemoryResource())
    busy_stream = hmr.Stream()
    per_memset_ms = _calibrate(busy_stream, busy_buf)
    cases = ["A alive, B moves A's blocks", "A moved its own blocks", "A ended"]
    rows = []
    print(f"unrelated work queued: {args.busy_ms:.0f} ms; B's allocate_async, median of "
          f"{args.rounds}:")
    for case in cases:
        times = [_one(case, busy_stream, busy_buf, args.busy_ms, per_memset_ms)
                 for _ in range(args.rounds)]
        ms = statistics.median(times) * 1e3
        rows.append({"case": case, "ms": ms, "all_ms": [t * 1e3 for t in times]})
        print(f"  {case:30} {ms:9.3f} ms", flush=True)
    save_json(args.json, {"platform": hmr.platform(), "busy_ms": args.busy_ms,
                          "rounds": args.rounds, "rows": rows})
    busy_buf.close()
    busy_stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How long a large log takes to draw, and to open in a browser.

    python scripts/bench_plot.py --events 1000000 [--browser chromium] [--json out.json]

Writes a synthetic log (three threads, three streams, sizes 256 B-64 MiB, up to 3,000 live
allocations) to a temporary folder, then times reading it (``read_columns``), drawing it
(``timeline`` to .html, with its stream and thread views, and to .svg) and, with
``--browser``, a headless browser loading the page until its script has run (``--dump-dom``;
the browser's own start is measured on an empty page and reported beside it).  Prints seconds
(wall clock, and this process's CPU time: on a shared machine the CPU time is the steadier
figure) and the files' sizes; ``--json`` saves them.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hipmr_ctypes.logfile import LOG_HEADER, read_columns  # noqa: E402
from hipmr_ctypes.plot import timeline  # noqa: E402

from _timing import save_json  # noqa: E402


def synthetic_log(path: str, events: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    live: List = []
    t = 10 * 3600.0
    ptr = 0x7F0000000000
    with open(path, "w", encoding="ascii") as f:
        f.write(LOG_HEADER + "\n")
        for _ in range(events):
            t += rng.random() * 2e-5
            h, rest = divmod(t, 3600)
            m, s = divmod(rest, 60)
            stamp = f"{int(h):02d}:{int(m):02d}:{s:09.6f}"
            thread = rng.choice((101, 102, 103))
            if live and (len(live) > 3000 or rng.random() < 0.5):
                p, size, stream = live.pop(rng.randrange(len(live)))
                f.write(f"{thread},{stamp},free,{p:#x},{size},{stream}\n")
            else:
                size = int(2 ** rng.uniform(8, 26))
                ptr += size + 256
                stream = rng.choice(("0", "0x5000", "0x6000"))
                live.append((ptr, size, stream))
                f.write(f"{thread},{stamp},allocate,{ptr:#x},{size},{stream}\n")


def _browser_seconds(browser: str, url: str, folder: str) -> float:
    profile = tempfile.mkdtemp(dir=folder)
    start = time.perf_counter()
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--no-first-run",
                    f"--user-data-dir={profile}", "--dump-dom", url],
                   capture_output=True, timeout=600, check=True)
    return time.perf_counter() - start


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--browser", default=None,
                        help="a Chromium-like browser to time (e.g. chromium)")
    parser.add_argument("--json", default=None, help="save the figures as JSON")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="hipmr-bench-plot-")
    results: Dict[str, object] = {"events": args.events}
    try:
        log = os.path.join(folder, "log.csv")
        synthetic_log(log, args.events)
        results["log_bytes"] = os.path.getsize(log)
        start, cpu = time.perf_counter(), time.process_time()
        read_columns(log)
        results["read_s"] = time.perf_counter() - start
        results["read_cpu_s"] = time.process_time() - cpu
        for fmt in ("html", "svg"):
            out = os.path.join(folder, f"timeline.{fmt}")
            start, cpu = time.perf_counter(), time.process_time()
            timeline(log, out)
            results[f"{fmt}_s"] = time.perf_counter() - start
            results[f"{fmt}_cpu_s"] = time.process_time() - cpu
            results[f"{fmt}_bytes"] = os.path.getsize(out)
        if args.browser:
            browser = shutil.which(args.browser) or args.browser
            empty = os.path.join(folder, "empty.html")
            with open(empty, "w") as f:
                f.write("<!DOCTYPE html><title>empty</title>")
            results["browser_empty_s"] = min(
                _browser_seconds(browser, "file://" + empty, folder) for _ in range(2))
            results["browser_html_s"] = min(
                _browser_seconds(browser, "file://" + os.path.join(folder, "timeline.html"),
                                 folder) for _ in range(2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for key, value in results.items():
        print(f"{key:18} {value:.2f}" if isinstance(value, float) else f"{key:18} {value:,}")
    save_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

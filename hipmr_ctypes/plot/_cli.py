"""``python -m hipmr_ctypes plot LOG.csv [-o memory.html] [...]``: draw a CSV log."""
from __future__ import annotations

import argparse
import io
import os
import sys
from typing import List, Optional

def parse_size(text: str) -> int:
    """``"64MiB"``, ``"2 GB"``, ``"4096"`` -> bytes (the package's size strings)."""
    from .._sizes import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hipmr_ctypes plot",
        description="Draw a LoggingResource (or RMM) CSV log as a timeline of live memory: "
                    "one self-contained HTML page (with statistics and a view per stream and "
                    "per thread) or SVG picture.")
    parser.add_argument("log", help="the CSV log (- for standard input)")
    parser.add_argument("-o", "--output", default=None,
                        help="the file to write: .html (default: LOG with .html) or .svg")
    parser.add_argument("--axis", choices=("time", "event"), default="time",
                        help="x axis: the log's clock (default) or one step per event")
    parser.add_argument("--color", choices=("auto", "size", "stream"), default="auto",
                        help="colour the bands by size or by stream (auto: stream when there "
                             "are several)")
    parser.add_argument("--pool", action="store_true",
                        help="replay the log against a PoolResource over host memory and draw "
                             "the pool's size")
    parser.add_argument("--initial", type=parse_size, default=None,
                        help="with --pool: the pool's initial size (e.g. 64MiB)")
    parser.add_argument("--maximum", type=parse_size, default=None,
                        help="with --pool: the pool's maximum size")
    parser.add_argument("--width", type=int, default=1200, help="picture width in pixels")
    parser.add_argument("--height", type=int, default=520, help="picture height in pixels")
    parser.add_argument("--max-bands", type=int, default=1000,
                        help="most allocations drawn as bands of their own")
    parser.add_argument("--title", default=None, help="the picture's title")
    args = parser.parse_args(argv)
    if (args.initial is not None or args.maximum is not None) and not args.pool:
        parser.error("--initial and --maximum need --pool")
    from . import timeline
    output = args.output
    if output is None:
        if args.log == "-":
            parser.error("-o is needed when the log comes from standard input")
        output = os.path.splitext(args.log)[0] + ".html"
    pool = None
    if args.pool:
        from ..adaptors.pool import PoolResource
        from ..resources.host import HostMemoryResource
        pool = PoolResource(HostMemoryResource(), args.initial, args.maximum)
    source = (io.TextIOWrapper(sys.stdin.buffer, newline="") if args.log == "-" else args.log)
    try:
        timeline(source, output, axis=args.axis, color=args.color, width=args.width,
                 height=args.height, max_bands=args.max_bands, title=args.title, pool=pool)
    except (OSError, ValueError, TypeError) as exc:
        print(f"plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {output}")
    return 0

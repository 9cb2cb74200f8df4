"""``python -m hipmr_ctypes plot LOG.csv [-o memory.html] [...]``: draw a CSV log.

Every error of the command (a log that cannot be read or is not a log, an output file that
cannot be written, is not a regular file or is the log itself, a suffix that names no format,
a pool that cannot be made or cannot replay the log) is one line on standard error, in the
command line's words, and exit status 2; a usage error is argparse's (also 2).  ``-o -``
writes the picture to standard output.  Long work (a log of many events) says what it is
doing on standard error.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import Any, Dict, List, Optional

PROG = "python -m hipmr_ctypes plot"
DESCRIPTION = ("Draw a LoggingResource (or RMM) CSV log as a timeline of live memory: one "
               "self-contained HTML page (with statistics and a view per stream and per "
               "thread) or SVG picture.")


def parse_size(text: str) -> int:
    """``"64MiB"``, ``"2 GB"``, ``"4096"`` -> bytes (the package's size strings)."""
    from .._sizes import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments, on ``parser`` (its own, or the subcommand's of
    ``python -m hipmr_ctypes``)."""
    parser.add_argument("log", help="the CSV log (- for standard input)")
    parser.add_argument("-o", "--output", default=None,
                        help="the file to write: .html (default: LOG with .html) or .svg; - for "
                             "standard output")
    parser.add_argument("--format", choices=("html", "svg"), default=None,
                        help="the picture's format (default: from the output's suffix; html "
                             "for -o -)")
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


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``plot`` on its own (``main``)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print what was written as JSON (errors too)")
    return parser


class PlotError(Exception):
    """One line for the user: what stopped the command."""


def _fail(message: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"ok": False, "error": message}, indent=2))
    print(f"plot: {message}", file=sys.stderr)
    return 2


def _progress(line: str) -> None:
    """What long work is doing, on standard error (standard output carries the result)."""
    print(f"plot: {line} ...", file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _make_pool(initial: Optional[int], maximum: Optional[int]) -> Any:
    """The PoolResource over host memory to replay against; PlotError when it cannot be
    made."""
    if initial is not None and maximum is not None and initial > maximum:
        raise PlotError(f"--initial ({initial:,} bytes) is larger than --maximum "
                        f"({maximum:,} bytes)")
    from ..adaptors.pool import PoolResource
    from ..errors import HipError
    from ..resources.host import HostMemoryResource
    try:
        return PoolResource(HostMemoryResource(), initial, maximum)
    except (ValueError, TypeError, OverflowError, MemoryError, HipError) as exc:
        size = f"--initial {initial:,} bytes" if initial is not None else "the pool"
        raise PlotError(f"cannot make a pool of {size} over host memory: "
                        f"{_first_line(exc)}") from None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser,
        as_json: bool = False) -> int:
    """Run the command for the parsed ``args`` (usage errors through ``parser.error``)."""
    if (args.initial is not None or args.maximum is not None) and not args.pool:
        parser.error("--initial and --maximum need --pool")
    output = args.output
    if output == "-" and as_json:
        parser.error("--json and -o - both write to standard output: choose one")
    if output is None:
        if args.log == "-":
            parser.error("-o is needed when the log comes from standard input")
        root, suffix = os.path.splitext(args.log)
        if suffix.lower() == ".html":   # the default picture would be the log itself
            return _fail(f"the log {args.log!r} is named .html, as its picture would be: "
                         f"name the picture with -o", as_json)
        output = root + ".html"
    from . import _FORMATS, _timeline
    fmt = args.format
    if fmt is None:
        suffix = "" if output == "-" else os.path.splitext(output)[1].lower()
        fmt = _FORMATS.get(suffix)
        if fmt is None:
            return _fail(f"cannot tell the format from the suffix {suffix!r} of "
                         f"{output!r}: name the file .html or .svg, or add --format html "
                         f"(or --format svg)", as_json)
    try:
        pool = _make_pool(args.initial, args.maximum) if args.pool else None
        source: Any = (io.TextIOWrapper(sys.stdin.buffer, newline="", encoding="utf-8",
                                        errors="replace") if args.log == "-" else args.log)
        text = _timeline(source, None if output == "-" else output, format=fmt,
                         axis=args.axis, color=args.color, width=args.width,
                         height=args.height, max_bands=args.max_bands, title=args.title,
                         pool=pool, progress=_progress)
        if output == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return 0
    except PlotError as exc:
        return _fail(str(exc), as_json)
    except (OSError, ValueError, TypeError, MemoryError) as exc:
        return _fail(_first_line(exc), as_json)
    if as_json:
        report: Dict[str, Any] = {"ok": True, "output": output, "format": fmt}
        print(json.dumps(report, indent=2))
    else:
        # a name that is not UTF-8 (argv decoded with surrogateescape) printed as best it can
        print("wrote " + output.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``plot`` on its own: parse ``argv`` and run."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return run(args, parser, as_json=args.json)

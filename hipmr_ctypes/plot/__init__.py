"""Pictures of memory over time, with the standard library alone.

    import hipmr_ctypes.plot as hplot

    hplot.timeline("run.csv", "memory.html")        # a LoggingResource (or RMM) CSV log
    hplot.timeline(tracking, "outstanding.svg")     # a TrackingResource's outstanding allocations
    rec = hplot.record(pool)                        # a live pool: use `rec` in its place ...
    hplot.timeline(rec, "pool.html")                # ... then draw live bytes and the pool's size

``timeline`` writes one self-contained file (``.html``: the picture, its statistics and a view
per stream and per thread; ``.svg``: the picture alone) that loads nothing from anywhere.
Each allocation is a band stacked on those made before it, as PyTorch's active-memory timeline
draws them; the peak is marked with its time and bytes.  ``python -m hipmr_ctypes plot LOG`` is
the command-line form.  See docs/observability.md.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Any, Callable, Dict, List, Optional, Union

from ._model import Source, View, build_view
from ._sources import Recording, find_pool, source_of
from ._svg import Layout, format_bytes, render_svg
from ._html import render_html

__all__ = ["timeline", "record", "Recording"]

#: Most views of single streams / threads a page gets (the busiest by bytes).
MAX_SPLIT_VIEWS = 8


#: The largest picture, in pixels each way (a larger one would only be a larger file).
MAX_PIXELS = 100_000


def _int_option(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, not {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high:,}, not {value:,}")
    return int(value)


def record(resource: Any, pool: Any = None) -> Any:
    """A ``LoggingResource`` over ``resource`` that keeps its log in memory (a
    :class:`Recording`) and, after each event, the size of ``pool`` (by default the first
    ``PoolResource`` among ``resource`` and its upstreams).  Allocate through it in place of
    ``resource``; ``timeline(recording)`` draws live bytes against the pool's size, and
    ``recording.file.getvalue()`` is the CSV log."""
    from ..adaptors.logging import LoggingResource
    if pool is None:
        pool = find_pool(resource)
    elif not callable(getattr(pool, "pool_size", None)):
        raise TypeError(f"pool must have a pool_size() method (a PoolResource), not "
                        f"{type(pool).__name__}")
    return LoggingResource(resource, Recording(pool))


def _views(src: Source, split: bool, **options: Any) -> List[View]:
    views = [build_view(src, "all allocations", with_pool=True, **options)]
    if not split:
        return views
    # each view of one stream or thread draws a quarter as much, to keep the page light
    options = dict(options, max_bands=options["max_bands"] // 4,
                   max_points=max(1000, options["max_points"] // 4))
    for label, column, index in (("stream", src.a_stream, 2), ("thread", src.a_thread, 3)):
        totals: Dict[int, int] = {}
        for value, size in zip(column, src.a_size):
            totals[value] = totals.get(value, 0) + size
        for failure in src.failures:
            totals.setdefault(failure[index], 0)
        if len(totals) < 2:
            continue
        for value in sorted(totals, key=lambda v: (-totals[v], v))[:MAX_SPLIT_VIEWS]:
            name = f"{label} {value:#x}" if label == "stream" and value else f"{label} {value}"
            views.append(build_view(src, name, [v == value for v in column],
                                    _failure_filter(index, value), with_pool=False, **options))
    return views


def _failure_filter(index: int, value: int) -> Callable[[int, int], bool]:
    """Keeps the failures of one stream (``index`` 2) or one thread (3)."""
    if index == 2:
        return lambda stream, thread: stream == value
    return lambda stream, thread: thread == value


def timeline(source: Any, path: Union[str, "os.PathLike[str]", None] = None, *,
             format: Optional[str] = None, axis: str = "time", color: str = "auto",
             width: int = 1200, height: int = 520, title: Optional[str] = None,
             max_bands: int = 1000, max_points: int = 40000, pool: Any = None,
             split: bool = True) -> str:
    """Draw the memory of ``source`` over time; return the document and write it to ``path``.

    ``source``: a CSV log (a path, an open text file, or ``LogEvent`` s from
    :func:`hipmr_ctypes.logfile.read_log`), a ``LoggingResource`` (its log is read back), a
    recording from :func:`record` (live bytes against the pool's size), or a
    ``TrackingResource`` (its outstanding allocations, with their stacks when captured).

    ``format``: ``"html"`` or ``"svg"`` (default: from ``path``'s suffix, else html).
    ``axis``: ``"time"`` (the log's clock) or ``"event"`` (one step per event, as PyTorch
    draws it).  ``color``: ``"size"``, ``"stream"`` or ``"auto"`` (stream when the source
    has several).  ``pool``: for a log, ``True`` or a ``PoolResource`` to replay it against,
    drawing the pool's size.  ``split``: in html, a view per stream and per thread where there
    are several.  ``max_bands`` / ``max_points`` bound what is drawn one by one (a quarter
    of them in each view of one stream or thread; see docs/observability.md).  Bad arguments
    raise ``TypeError`` / ``ValueError`` before any file is read or written: among them a
    ``path`` whose suffix names no format (without ``format``) and a ``path`` that is the log
    being drawn.  A bad log raises ``ValueError`` naming its line.  ``path`` must be a regular
    file or a new name (a symbolic link is followed, and its target written); anything else
    there (a FIFO, a device, a socket) is refused with ``ValueError`` before the log is read
    (``IsADirectoryError`` for a directory).  The file is replaced only by the complete
    document (written beside it, then renamed over it).
    """
    return _timeline(source, path, format=format, axis=axis, color=color, width=width,
                     height=height, title=title, max_bands=max_bands, max_points=max_points,
                     pool=pool, split=split)


#: Logs from this many events on (or files from this many bytes) are long work: the command
#: line says on standard error what it is doing.
LONG_EVENTS = 100_000
LONG_BYTES = 8 << 20


def _timeline(source: Any, path: Union[str, "os.PathLike[str]", None] = None, *,
              format: Optional[str] = None, axis: str = "time", color: str = "auto",
              width: int = 1200, height: int = 520, title: Optional[str] = None,
              max_bands: int = 1000, max_points: int = 40000, pool: Any = None,
              split: bool = True, progress: Optional[Callable[[str], None]] = None) -> str:
    """:func:`timeline`, telling ``progress`` (one line at a time) what it does when the work
    is long (:data:`LONG_EVENTS`, :data:`LONG_BYTES`)."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, not {type(path).__name__}")
    if format is None:
        shown = os.fsdecode(path) if path is not None else ""
        suffix = os.path.splitext(shown)[1].lower()
        format = _FORMATS.get(suffix)
        if format is None:
            raise ValueError(f"cannot tell the format from the suffix {suffix!r} of "
                             f"{shown!r}: name the file .html or .svg, or pass "
                             f"format='html' or format='svg'")
    if format not in ("html", "svg"):
        raise ValueError(f"format must be 'html' or 'svg', not {format!r}")
    if axis not in ("time", "event"):
        raise ValueError(f"axis must be 'time' or 'event', not {axis!r}")
    if color not in ("auto", "size", "stream"):
        raise ValueError(f"color must be 'auto', 'size' or 'stream', not {color!r}")
    width = _int_option("width", width, 400, MAX_PIXELS)
    height = _int_option("height", height, 240, MAX_PIXELS)
    max_bands = _int_option("max_bands", max_bands, 0)
    max_points = _int_option("max_points", max_points, 1000)
    if not isinstance(split, bool):
        raise TypeError(f"split must be a bool, not {type(split).__name__}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, not {type(title).__name__}")
    if path is not None:
        _not_the_log(source, path)
        _writable_target(path)
    layout = Layout(width, height)
    say = _long_work(source, progress)
    src = source_of(source, pool, axis, layout.plot_width)
    if progress is not None and len(src.xs) >= LONG_EVENTS:
        say = progress
    say(f"drawing {len(src.xs):,} events")
    if color == "auto":
        color = "stream" if len(set(src.a_stream)) > 1 else "size"
    options = dict(height=layout.plot_height, max_bands=max_bands, max_points=max_points,
                   min_band_px=0.5)
    views = _views(src, split and format == "html", **options)
    if title is None:
        name = os.path.basename(src.description.split(";")[0]) if src.kind == "log" else ""
        title = f"Memory over time: {name}" if name else "Memory over time"
    about = _about(src, views[0])
    if format == "svg":
        text = render_svg(views[0], layout, title=title, color=color)
    else:
        text = render_html(views, layout, title=title, about=about, color=color)
    if path is not None:
        say(f"writing {os.fsdecode(path)} ({len(text):,} characters)")
        _write_file(path, text)
    return text


def _quiet(line: str) -> None:
    """Says nothing (work that is not long)."""


def _long_work(source: Any, progress: Optional[Callable[[str], None]]) -> Callable[[str], None]:
    """``progress`` when ``source`` is a log file of :data:`LONG_BYTES` or more (saying so
    first), else a function that says nothing."""
    if progress is None or not isinstance(source, (str, os.PathLike)):
        return _quiet
    try:
        size = os.stat(source).st_size
    except (OSError, ValueError):
        return _quiet
    if size < LONG_BYTES:
        return _quiet
    progress(f"reading {os.fsdecode(source)} ({size / (1 << 20):,.0f} MiB)")
    return progress


#: The format each suffix of ``path`` names (no suffix: html).
_FORMATS = {"": "html", ".html": "html", ".htm": "html", ".svg": "svg"}


def _log_path(source: Any) -> Optional[str]:
    """The file ``source`` reads its log from, if it is one."""
    from ..adaptors.logging import LoggingResource
    if isinstance(source, LoggingResource):
        return source.get_file_name()
    if isinstance(source, (str, os.PathLike)):
        return os.fsdecode(source)
    return None


def _not_the_log(source: Any, path: Union[str, "os.PathLike[str]"]) -> None:
    """ValueError when ``path`` is the very file the log is read from (the picture would
    replace the log it draws)."""
    log = _log_path(source)
    if log is None:
        return
    out = os.fsdecode(path)
    try:
        same = os.path.samefile(log, out)
    except OSError:                      # one of them does not exist (yet)
        same = os.path.realpath(log) == os.path.realpath(out)
    if same:
        raise ValueError(f"the output file {out!r} is the log being drawn: name another "
                         f"output file")


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a loop of symbolic links"))


def _writable_target(path: Union[str, "os.PathLike[str]"]) -> str:
    """The file ``path`` names, symbolic links followed (a link's target is what is written,
    the link stays): a regular file or a new name.  ``IsADirectoryError`` for a directory,
    ``ValueError`` for anything else that is not a regular file (a FIFO, a device, a socket),
    whose replacement would destroy it or whose opening could block."""
    shown = os.fsdecode(path)            # round-trips any POSIX name (surrogateescape)
    target = os.path.realpath(shown)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:               # a loop of links, a folder that cannot be read ...
        raise type(exc)(exc.errno, f"cannot write {shown!r} ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "the output is a directory", shown)
    if not stat.S_ISREG(st.st_mode):
        what = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        via = f" (through a symbolic link to {target!r})" if target != os.path.abspath(shown) \
            else ""
        raise ValueError(f"the output {shown!r}{via} is {what}: a picture is written only to a "
                         f"regular file (or a new name)")
    return target


def _write_file(path: Union[str, "os.PathLike[str]"], text: str) -> None:
    """Write ``text`` (UTF-8) to the regular file ``path`` names (:func:`_writable_target`)
    so that it is replaced only by the complete document: it is written to a new file in the
    same directory first, then renamed over it (an error leaves an earlier file as it was,
    and no partial file)."""
    target = _writable_target(path)
    data = text.encode("utf-8")
    directory, base = os.path.split(target)
    for attempt in range(100):
        tmp = os.path.join(directory, f".{base}.{os.getpid()}-{attempt}.tmp")
        try:
            # mode 0o666 less the umask, as open() would give the file itself
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:           # name the file asked for, not the temporary one
            raise type(exc)(exc.errno, f"cannot write {target!r} ({exc.strerror})") from None
        break
    else:
        raise FileExistsError(f"cannot create a temporary file next to {target!r}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:                             # an existing file keeps its mode
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        except OSError:
            pass
        _writable_target(target)         # nothing else took its place meanwhile
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _about(src: Source, view: View) -> str:
    n = len(src.xs)
    what = src.description or "events"
    axis = ("time since the first event (the log's clock)" if src.axis == "time"
            else "allocation order" if src.kind == "tracking" else "event order")
    return (f"{n:,} events: {what}. The x axis is {axis}; each allocation is a band stacked on "
            f"those made before it, and falls when one below it is freed. Peak "
            f"{format_bytes(view.stats['peak_bytes'])}. Hover a band for its size, pointer, "
            f"stream, thread and lines in the log.")

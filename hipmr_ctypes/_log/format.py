"""The CSV log format ``LoggingResource`` (and RMM's ``LoggingResourceAdaptor``) write, and its
reader: one parser of a line's fields, one unwrap of the clock across midnight.

A log starts with the header ``Thread,Time,Action,Pointer,Size,Stream``; each line after it is
one event: the thread id (decimal), the local time ``HH:MM:SS.ffffff``, the action
(``allocate``, ``allocate failure`` or ``free``), the pointer (hex; RMM writes a failure's null
pointer as ``(nil)``), the size in bytes (decimal) and the stream handle (hex; ``0`` for the
null stream).  The public names are ``hipmr_ctypes.logfile``'s; ``logfile`` (replay) and
``plot`` are built on this module, which holds no resource.
"""
from __future__ import annotations

import csv
import functools
import io
import math
import operator
import os
from dataclasses import dataclass
from typing import (Dict, Generic, Iterable, Iterator, List, NamedTuple, Optional, TextIO, Tuple,
                    TypeVar, Union)

from .._limits import MAX_ADDRESS  # the largest size, pointer, stream or thread id of a line
from .header import LOG_HEADER   # the writer's header, spelled once

__all__ = ["LOG_HEADER", "ACTIONS", "MAX_SECONDS", "LogEvent", "LogSource", "LogColumns",
           "read_log", "read_columns", "iter_log", "Pairing"]

#: The three actions a log line can carry.
ACTIONS = ("allocate", "free", "allocate failure")

#: What :func:`read_log` and ``logfile.replay`` accept: a path, an open text file, or events.
LogSource = Union[str, "os.PathLike[str]", TextIO, Iterable["LogEvent"]]

_DAY = 86400.0

#: The largest time a line may carry as plain seconds (about 31,700 years): spans of such
#: times, and the picture's scale, stay finite.
MAX_SECONDS = 1e12


class LogEvent(NamedTuple):
    """One line of a log.  ``seconds`` is the time in seconds since midnight of the first
    event's day: it keeps growing across midnight, so it orders events within a log."""

    line: int
    thread: int
    time: str
    seconds: float
    action: str
    ptr: int
    size: int
    stream: int


def _clock(text: str) -> float:
    """``"HH:MM:SS.ffffff"`` -> seconds since midnight; a plain number is taken as seconds."""
    h, sep, rest = text.partition(":")
    if not sep:
        value = float(text)
        if not (math.isfinite(value) and 0.0 <= value <= MAX_SECONDS):   # nan, inf, -1
            raise ValueError(text)
        return value
    m, sep, s = rest.partition(":")
    if not sep:
        raise ValueError(text)
    whole, dot, fraction = s.partition(".")
    hours, minutes, seconds = int(h), int(m), int(whole)
    if not (0 <= hours < 24 and 0 <= minutes < 60 and 0 <= seconds < 61):
        raise ValueError(text)
    if dot and not (fraction.isascii() and fraction.isdigit()):    # not "1e999" nor "nan"
        raise ValueError(text)
    value = hours * 3600 + minutes * 60 + seconds      # the same sums as the fast path's
    return value + float(dot + fraction) if dot else float(value)


def _address(text: str) -> int:
    """A pointer or stream as RMM and this package write it: ``0x7f..``, ``0`` or ``(nil)``."""
    text = text.strip()
    if text == "(nil)":
        return 0
    value = int(text, 16)
    if not 0 <= value <= MAX_ADDRESS:
        raise ValueError(text)
    return value


#: Lines parsed together by the line-by-line path (a bad one is then found one line at a time).
_CHUNK = 4096
_Chunk = List[Tuple[int, List[str]]]


def _chunks(f: TextIO) -> Iterator[Tuple[_Chunk, Optional[ValueError]]]:
    """The lines after the header, ``(line number, its six fields)``, :data:`_CHUNK` at a
    time (the csv module splits them).  The last chunk comes with what ended the log early, or
    None: a line without six fields, or any error of the csv module (a quoted field longer
    than its limit, a NUL, a carriage return inside a field), a ValueError naming the line.
    A wrong header raises at once."""
    reader = csv.reader(f)
    chunk: _Chunk = []
    error: Optional[ValueError] = None
    start = 1
    try:
        header = next(reader, None)
        found = ",".join(h.strip() for h in header or []).lstrip("\ufeff")
        if found != LOG_HEADER:
            raise ValueError(f"not a LoggingResource log: the first line must be "
                             f"{LOG_HEADER!r}, not {_short(found)!r}")
        while True:
            start = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                break
            if not row:
                continue
            if len(row) != 6:
                error = ValueError(f"line {start}: expected 6 fields, got {len(row)}: "
                                   f"{_short(repr(row))}")
                break
            chunk.append((start, row))
            if len(chunk) == _CHUNK:
                yield chunk, None
                chunk = []
    except csv.Error as exc:
        error = ValueError(f"line {start}: not a line of a log ({exc})")
    yield chunk, error


def _short(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for a message (a bad line may be huge)."""
    return text if len(text) <= limit else text[:limit] + "..."


class _Unwrap:
    """Times of day -> seconds since midnight of the first event's day: once a time falls more
    than half a day below the one before it, the clock passed midnight (the one rule for every
    reader of a log)."""

    __slots__ = ("day", "last")

    def __init__(self) -> None:
        self.day = 0.0
        self.last: Optional[float] = None

    def __call__(self, clock: float) -> float:
        last = self.last
        if last is not None and clock + self.day < last - _DAY / 2:
            self.day += _DAY
        self.last = value = clock + self.day
        return value


def _events(f: TextIO) -> Iterator[LogEvent]:
    """The events of an open log, line by line, parsed a chunk at a time by :func:`_parse`;
    a line that cannot be read is a ValueError naming it, after the events before it."""
    unwrap = _Unwrap()
    for chunk, error in _chunks(f):
        events, bad = _parse_rows(chunk, unwrap)
        yield from events
        if bad is not None:
            raise bad
        if error is not None:
            raise error


def _parse_rows(chunk: _Chunk, unwrap: _Unwrap) -> Tuple[List[LogEvent], Optional[ValueError]]:
    """The events of ``chunk``, and None; when :func:`_parse` cannot read its lines together,
    it reads each alone: the events before the first bad line, and a ValueError naming it."""
    if not chunk:
        return [], None
    lines, rows = zip(*chunk)
    try:
        return _parse(list(lines), *map(list, zip(*rows)), unwrap=unwrap,
                      clean=False).events(), None
    except ValueError:
        pass
    events: List[LogEvent] = []
    for lineno, row in chunk:
        try:
            events += _parse([lineno], *([v] for v in row), unwrap=unwrap, clean=False).events()
        except ValueError as exc:
            return events, ValueError(f"line {lineno}: {exc}")
    raise AssertionError("a chunk that fails has a line that fails")  # pragma: no cover


def _open(source: LogSource) -> Optional[TextIO]:
    """The file a path names, opened here (the caller closes it); None for a source that is
    already a text file or events."""
    if isinstance(source, (str, os.PathLike)):
        return open(source, newline="", encoding="utf-8", errors="replace")
    if isinstance(source, (bytes, bytearray)):
        raise TypeError("a log is a path, an open text file or LogEvents, not bytes")
    if isinstance(source, io.TextIOBase) or callable(getattr(source, "readline", None)):
        return None
    raise TypeError(f"a log is a path, an open text file or LogEvents, not "
                    f"{type(source).__name__}")


def _check_event(event: LogEvent) -> None:
    """ValueError naming the line for a LogEvent made by hand that no log could hold."""
    seconds = event.seconds
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds)
            and 0 <= seconds <= 2 * MAX_SECONDS):
        raise ValueError(f"line {event.line}: bad time {_short(repr(seconds))} (finite "
                         f"seconds from 0 are needed)")
    if event.action not in ACTIONS:
        raise ValueError(f"line {event.line}: unknown action {_short(repr(event.action))}")
    for name in ("thread", "ptr", "size", "stream"):
        value = getattr(event, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ADDRESS:
            raise ValueError(f"line {event.line}: {name} {_short(repr(value))} is not an "
                             f"int from 0 to 2**64 - 1")


def iter_log(source: LogSource) -> Iterator[LogEvent]:
    """The events of a log, one at a time (see :func:`read_log`)."""
    if isinstance(source, (list, tuple)):
        for event in source:
            if not isinstance(event, LogEvent):
                raise TypeError(f"expected LogEvent items, not {type(event).__name__}")
            _check_event(event)
            yield event
        return
    f = _open(source)
    if f is None:
        yield from _events(source)  # type: ignore[arg-type]
        return
    with f:
        yield from _events(f)


@dataclass
class LogColumns:
    """A log as one list per field (what :func:`read_columns` returns; the plots use it):
    ``events()`` gives the same ``LogEvent`` s as :func:`read_log`."""

    line: List[int]
    thread: List[int]
    time: List[str]
    seconds: List[float]
    action: List[str]
    ptr: List[int]
    size: List[int]
    stream: List[int]

    def __len__(self) -> int:
        return len(self.line)

    def events(self) -> List[LogEvent]:
        return list(map(LogEvent, self.line, self.thread, self.time, self.seconds, self.action,
                        self.ptr, self.size, self.stream))


_hex = functools.partial(int, base=16)
_TIME_FORMS = f"HH:MM:SS.ffffff, or seconds from 0 to {MAX_SECONDS:g}"


def _clocks(stamps: List[str]) -> List[float]:
    """:func:`_clock` of each stamp; stamps all ``HH:MM:SS.ffffff`` are read in bulk (each
    whole second parsed once, the same sums)."""
    if {len(t) for t in stamps} == {15} and {t[8] for t in stamps} == {"."}:
        heads = [t[:8] for t in stamps]
        unique = set(heads)
        text = "".join(stamps)
        if all(h[2] == ":" == h[5] for h in unique) and text.isascii() and \
                text.encode().translate(None, b":.").isdigit():     # ASCII digits only
            cache = {h: _clock(h) for h in unique}
            return list(map(operator.add, map(cache.__getitem__, heads),
                            map(float, [t[8:] for t in stamps])))
    return list(map(_clock, stamps))


def _addresses(column: List[str]) -> List[int]:
    """Hex fields -> ints (``(nil)`` is 0, as RMM writes a null pointer)."""
    if "(nil)" in column:
        column = ["0" if text == "(nil)" else text for text in column]
    values = list(map(_hex, column))
    if values and (min(values) < 0 or max(values) > MAX_ADDRESS):
        raise ValueError("an address out of range")
    return values


def _parse(lines: List[int], thread: List[str], stamp: List[str], action: List[str],
           ptr: List[str], size: List[str], stream: List[str], *, unwrap: _Unwrap,
           clean: bool) -> LogColumns:
    """The one parser of a log's fields: the six text columns of some lines -> LogColumns,
    the times unwrapped across midnight by ``unwrap`` (carried from one call to the next, and
    changed only when every line is read).  ``clean``: no field has spaces around it (the bulk
    path's text).  ValueError at the first field it cannot read, checked in the order a line's
    fields are: its message says what is wrong in a single line's terms."""
    row = (f"{_short(repr([thread[0], stamp[0], action[0], ptr[0], size[0], stream[0]]))}"
           if len(lines) == 1 else "")
    if not clean:
        strip = str.strip
        action, stamp, ptr, stream = (list(map(strip, c)) for c in (action, stamp, ptr, stream))
    if not set(action) <= set(ACTIONS):
        bad = next(a for a in action if a not in ACTIONS)
        raise ValueError(f"unknown action {_short(repr(bad))}")
    try:
        seconds = _clocks(stamp)
    except ValueError:
        raise ValueError(f"bad time {_short(repr(stamp[0]))} (expected {_TIME_FORMS})") from None
    try:
        threads = list(map(int, thread))
        ptrs = _addresses(ptr)
        sizes = list(map(int, size))
        streams = _addresses(stream)
    except ValueError:
        raise ValueError(f"bad thread, pointer, size or stream in {row}") from None
    if min(sizes) < 0:
        raise ValueError(f"negative size in {row}")
    if max(sizes) > MAX_ADDRESS or min(threads) < 0 or max(threads) > MAX_ADDRESS:
        raise ValueError(f"a size or thread id above 2**64 - 1 in {row}")
    if unwrap.last is not None or max(seconds) - min(seconds) > _DAY / 2:
        seconds = list(map(unwrap, seconds))     # maybe past midnight: one by one
    else:                                        # within half a day of the first: no midnight
        unwrap.last = seconds[-1]
    return LogColumns(lines, threads, stamp, seconds, action, ptrs, sizes, streams)


def read_columns(source: LogSource) -> LogColumns:
    """A log as :class:`LogColumns`, read fast: the lines are split in bulk, and a log that
    fails the bulk path is read line by line for the precise error."""
    if isinstance(source, (list, tuple)):
        events = list(iter_log(source))
        return LogColumns(*(list(c) for c in zip(*events))) if events else \
            LogColumns([], [], [], [], [], [], [], [])
    f = _open(source)
    text = (source.read() if f is None else f.read())  # type: ignore[union-attr]
    if f is not None:
        f.close()
    try:
        return _bulk(text)
    except (ValueError, IndexError, TypeError, OverflowError):
        # newline="": lines end at \n, \r\n or \r, as csv expects (a log written with CR
        # line endings reads as one; a stray CR ends a line, which then has too few fields)
        events = list(_events(io.StringIO(text, newline="")))   # raises the precise error
        return LogColumns(*(list(c) for c in zip(*events))) if events else \
            LogColumns([], [], [], [], [], [], [], [])


def _bulk(text: str) -> LogColumns:
    """The fast path: one ``split`` of the whole text, every sixth field a column."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    head, _, body = text.partition("\n")
    if ",".join(h.strip() for h in head.split(",")).lstrip("\ufeff") != LOG_HEADER \
            or '"' in body or "\n\n" in body or " " in body:
        raise ValueError("header, quoting, blank lines or spaces: read line by line")
    body = body.rstrip("\n")
    if not body:
        return LogColumns([], [], [], [], [], [], [], [])
    n = body.count("\n") + 1
    fields = body.replace("\n", ",").split(",")
    if len(fields) != 6 * n:
        raise ValueError("a line without 6 fields")
    thread, stamp, action, ptr, size, stream = (fields[i::6] for i in range(6))
    # an unknown action also catches a line with too few or too many fields
    return _parse(list(range(2, n + 2)), thread, stamp, action, ptr, size, stream,
                  unwrap=_Unwrap(), clean=True)


def read_log(source: LogSource) -> List[LogEvent]:
    """Every event of a log: ``source`` is a path, an open text file or LogEvents.

    Raises ``ValueError`` naming the line for a file that is not such a log (wrong header,
    wrong number of fields, an unknown action, a bad number or time) and ``TypeError`` for a
    source of the wrong kind.
    """
    return read_columns(source).events()


#: what a :class:`Pairing` remembers an allocation under (``replay``: the new pointer)
_K = TypeVar("_K")


class Pairing(Generic[_K]):
    """Matches each ``free`` with the live ``allocate`` of the same pointer and size (the
    rule ``logfile.replay`` and the plots share).  ``allocate(key, ptr, size)`` remembers an
    allocation under ``key``; ``free(ptr, size)`` returns the key of its allocation, or None
    for a free without one."""

    def __init__(self) -> None:
        self.live: Dict[int, List[Tuple[_K, int]]] = {}

    def allocate(self, key: _K, ptr: int, size: int) -> None:
        entries = self.live.get(ptr)
        if entries is None:
            self.live[ptr] = [(key, size)]
        else:
            entries.append((key, size))

    def free(self, ptr: int, size: int) -> Optional[_K]:
        entries = self.live.get(ptr)
        if entries is None:
            return None
        for i, (key, s) in enumerate(entries):
            if s == size:
                del entries[i]
                if not entries:
                    del self.live[ptr]
                return key
        return None

    def remaining(self) -> Iterator[Tuple[_K, int]]:
        """``(key, size)`` of every allocation still live."""
        for entries in self.live.values():
            yield from entries

"""``LoggingResource``: one CSV line per allocation event, in RMM's log format."""
from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, List, Optional, TextIO, Tuple

from .._locks import DeferringLock
from ..properties import DEFAULT_ALIGNMENT
from .._checks import check_args, check_free_args, check_stream
from .._limits import MAX_ADDRESS
from .._log.header import LOG_HEADER   # the first line of every log (RMM's header)
from ._base import BoundAdaptor
from ._checked import must_check_arguments, upstream_calls

__all__ = ["LoggingResource", "LOG_HEADER"]


class _SharedFile:
    """One log file opened by a path, with the lock its lines are written under, shared by
    every live ``LoggingResource`` of this process given that file (``users``): one writer
    per file, so that no line of one overwrites or truncates another's."""

    def __init__(self, file: TextIO, key: Tuple[int, int]) -> None:
        self.file = file
        self.key = key
        self.lock = DeferringLock()  # a finalizer's free inside write() defers itself
        # id -> weak reference (adaptors compare by value: a WeakSet would merge equal ones)
        self.users: "dict[int, weakref.ref[LoggingResource]]" = {}

    def add(self, adaptor: "LoggingResource") -> None:
        self.users[id(adaptor)] = weakref.ref(adaptor)

    def discard(self, adaptor: "LoggingResource") -> int:
        """Forget ``adaptor`` (and users already collected); the live users left."""
        self.users = {k: r for k, r in self.users.items()
                      if k != id(adaptor) and r() is not None}
        return len(self.users)


#: (st_dev, st_ino) -> the _SharedFile writing that file; an entry goes with its last user.
#: Reentrant: a finalizer that closes a LoggingResource may run while a constructor holds it.
_shared_lock = threading.RLock()
_shared: "weakref.WeakValueDictionary[Tuple[int, int], _SharedFile]" = \
    weakref.WeakValueDictionary()


#: (the last whole second seen, its "HH:MM:SS." in local time): one atomic read of an immutable
#: pair, replaced once a second
_second: List[Tuple[int, str]] = [(-1, "")]
_clock = time.time_ns


def _stamp() -> str:
    """The local time as ``HH:MM:SS.ffffff``; strftime once a second, not per line."""
    s, us = divmod(_clock() // 1000, 1_000_000)
    cached = _second[0]
    if cached[0] != s:
        cached = (s, time.strftime("%H:%M:%S.", time.localtime(s)))
        _second[0] = cached
    return f"{cached[1]}{us:06d}"


def _handle_of(stream: Any) -> int:
    """The int handle of ``stream`` (the checked path for anything but a valid int)."""
    if type(stream) is int and 0 <= stream <= MAX_ADDRESS:
        return stream
    return check_stream(stream)


def _closed() -> ValueError:
    return ValueError("LoggingResource: this LoggingResource (or its log file) is closed")


def _file_key(name: str) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(name)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def _join_or_open(adaptor: "LoggingResource", name: str,
                  auto_flush: bool) -> _SharedFile:
    """The writer of ``name`` that a live LoggingResource of this process already has (joined,
    not truncated), or a new one: the file opened for writing, truncated, and its header
    written before any other LoggingResource can join it."""
    with _shared_lock:
        while True:
            key = _file_key(name)
            shared = _shared.get(key) if key is not None else None
            if shared is not None:
                shared.add(adaptor)
                if not getattr(shared.file, "closed", False):
                    return shared
                shared.discard(adaptor)              # closed meanwhile (by a finalizer)
                if _shared.get(shared.key) is shared:
                    del _shared[shared.key]
                continue
            file = open(name, "w", encoding="ascii", newline="\n")
            try:
                file.write(LOG_HEADER + "\n")
                if auto_flush:
                    file.flush()
                st = os.fstat(file.fileno())
                shared = _SharedFile(file, (st.st_dev, st.st_ino))
                shared.add(adaptor)
                _shared[shared.key] = shared
            except BaseException:
                file.close()
                raise
            return shared


def _leave(shared: _SharedFile, adaptor: "LoggingResource") -> bool:
    """``adaptor`` stops using ``shared``; True when it was the last live user (then the
    caller closes the file)."""
    with _shared_lock:
        if shared.discard(adaptor):
            return False
        if _shared.get(shared.key) is shared:
            del _shared[shared.key]
        return True


class LoggingResource(BoundAdaptor):
    """``LoggingResource(upstream, file, auto_flush=False)``: logs every event as CSV.

    ``file`` is a path (opened for writing, truncated, and closed by :meth:`close` or when the
    adaptor is garbage-collected; a path whose file another live LoggingResource of this
    process is writing joins that one's writer instead: the file is not truncated, no second
    header is written, the lines of both go through one lock so that none is lost, and the
    file is closed when the last of them closes) or any object with a ``write(str)`` method (written to, never
    closed; flushed when it has ``flush()``).  The log starts with the header
    ``Thread,Time,Action,Pointer,Size,Stream``; then one line per event: the native thread id,
    the local time as ``HH:MM:SS.ffffff``, the action (``allocate``, ``allocate failure`` or
    ``free``), the pointer in hex (``(nil)`` for a failure), the size in bytes and the stream
    handle in hex (``0`` for the stream of a synchronous call), as RMM's
    ``logging_resource_adaptor`` writes it.  A ``free`` is logged before the upstream frees
    the memory, so that a concurrent ``allocate`` of the same address always comes after it.

    Logging never loses an allocation nor prevents a free: a line that cannot be written (a
    full disk, a file closed from outside, ``close()`` racing the call) is dropped and
    counted in :attr:`lines_dropped`, the first such error is kept in :attr:`write_error`, and
    the allocation or free goes on.  After :meth:`close`, allocating raises ``ValueError``;
    freeing what was handed out earlier still works (unlogged).  Thread-safe; an async
    resource when the upstream is one; equal to another over an equal upstream writing to
    the same file.  ``scripts/replay_log.py`` replays such a log.
    """

    #: hands out its upstream's pointers unchanged (read by IPC: see Adaptor)
    passes_pointers_through = True

    def __init__(self, upstream: Any, file: Any, auto_flush: bool = False) -> None:
        ref = self._set_upstream(upstream)
        if not isinstance(auto_flush, bool):
            raise TypeError(f"auto_flush must be a bool, not {type(auto_flush).__name__}")
        self._shared: Optional[_SharedFile] = None
        if isinstance(file, (str, bytes, os.PathLike)):
            self._file_name: Optional[str] = os.fsdecode(file)
            self._shared = _join_or_open(self, self._file_name, auto_flush)
            self._file: TextIO = self._shared.file
            self._owned = True
        elif callable(getattr(file, "write", None)):
            self._file_name = getattr(file, "name", None)
            if not isinstance(self._file_name, str):
                self._file_name = None
            self._file = file
            self._owned = False
        else:
            raise TypeError(f"file must be a path or an open text file, not "
                            f"{type(file).__name__}")
        self._auto_flush = auto_flush
        self._closed = False
        self._dropped = 0
        self._write_error: Optional[BaseException] = None
        # a finalizer's free inside write() defers itself; one lock per file written
        self._lock = self._shared.lock if self._shared is not None else DeferringLock()
        if self._shared is None:          # a path's header is written when it is opened
            self._file.write(LOG_HEADER + "\n")
            if auto_flush:
                self._flush_file()
        self._bind(ref)

    def _flush_file(self) -> None:
        flush = getattr(self._file, "flush", None)
        if callable(flush):
            flush()

    def _bind(self, ref: Any) -> None:
        """Invariants:

        * a line is built outside the lock and written under it; a finalizer that frees
          inside ``write()`` (the lock held by its own thread) defers its line, and its free,
          until the lock is let go;
        * a free is logged before the upstream frees, so a later allocation of the same
          address is always logged after it;
        * a line that cannot be written is dropped and counted (:meth:`_drop`), never raised."""
        must_check = must_check_arguments(ref)  # a user-written upstream: check everything
        lock = self._lock
        acquire, release, held_here, defer = lock.acquire, lock.release, lock.held_here, lock.defer
        out = self._file
        write = out.write
        flush = self._flush_file if self._auto_flush else None
        native_id = threading.get_native_id
        drop = self._drop
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)

        def log(action: str, ptr: int, nbytes: int, stream: int) -> None:
            try:
                # As RMM writes them: a null pointer as printf's "%p" does, "(nil)", and a null
                # stream as C++'s ostream does, "0"; others as 0x-prefixed lowercase hex.
                line = (f"{native_id()},{_stamp()},{action},{ptr:#x},{nbytes},"
                        f"{f'{stream:#x}' if stream else '0'}\n" if ptr else
                        f"{native_id()},{_stamp()},{action},(nil),{nbytes},"
                        f"{f'{stream:#x}' if stream else '0'}\n")
            except Exception as exc:  # noqa: BLE001
                drop(exc)
                return
            if held_here():  # re-entered by a finalizer inside write(): after the lock goes
                defer(locked_write, line)
                return
            locked_write(line)

        def locked_write(line: str) -> None:
            acquire()
            try:
                if self._closed:
                    drop(None)
                    return
                try:
                    write(line)
                    if flush is not None:
                        flush()
                except Exception as exc:  # noqa: BLE001 - see the class docstring
                    drop(exc)
            finally:
                release()

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if must_check or type(bytes) is not int:
                bytes, alignment = check_args(bytes, alignment)
            if self._closed or getattr(out, "closed", False) is True:
                raise _closed()
            try:
                ptr = up_alloc(bytes, alignment)
            except BaseException:
                log("allocate failure", 0, bytes, 0)
                raise
            log("allocate", ptr, bytes, 0)
            return ptr

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            if must_check or type(ptr) is not int or type(bytes) is not int:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            if held_here():  # a finalizer inside write(): log and free after the lock goes
                defer(deallocate, ptr, bytes, alignment)
                return
            log("free", ptr, bytes, 0)
            up_dealloc(ptr, bytes, alignment)

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            if must_check or type(bytes) is not int:
                bytes, alignment = check_args(bytes, alignment)
            handle = _handle_of(stream)
            if self._closed or getattr(out, "closed", False) is True:
                raise _closed()
            try:
                ptr: int = up_alloc_async(bytes, alignment, stream)
            except BaseException:
                log("allocate failure", 0, bytes, handle)
                raise
            log("allocate", ptr, bytes, handle)
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if must_check or type(ptr) is not int or type(bytes) is not int:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            handle = _handle_of(stream)
            if held_here():
                defer(deallocate_async, ptr, bytes, alignment, stream)
                return
            log("free", ptr, bytes, handle)
            up_dealloc_async(ptr, bytes, alignment, stream)

        # synchronous bodies of their own (stream 0 in the log, as RMM writes it): no extra call
        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate)

    def _drop(self, exc: Optional[BaseException]) -> None:
        """A line was not written: count it, and keep the first error."""
        self._dropped += 1
        if exc is not None and self._write_error is None:
            self._write_error = exc

    def _settings(self) -> Tuple[Any, ...]:
        return (id(self._file),)

    def get_file_name(self) -> Optional[str]:
        """The log's path (None for a file object without one)."""
        return self._file_name

    @property
    def file(self) -> TextIO:
        """The text file the log is written to."""
        return self._file

    @property
    def lines_dropped(self) -> int:
        """Log lines that could not be written (see the class docstring)."""
        return self._dropped

    @property
    def write_error(self) -> Optional[BaseException]:
        """The first error that made a log line be dropped, or None."""
        return self._write_error

    def flush(self) -> None:
        """Write buffered lines out to the file."""
        with self._lock:
            self._flush_file()

    def close(self) -> None:
        """Flush, and close the file if this adaptor opened it (idempotent).  Allocating
        through a closed LoggingResource raises ``ValueError``; freeing still works, unlogged."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if getattr(self._file, "closed", False) is True:
                return
            try:
                self._flush_file()
            finally:
                # a file shared with other live LoggingResources stays open for them
                if self._owned and (self._shared is None or _leave(self._shared, self)):
                    self._file.close()

    def __enter__(self) -> "LoggingResource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        target = self._file_name if self._file_name is not None else self._file
        return f"LoggingResource({self._upstream.resource!r}, {target!r})"

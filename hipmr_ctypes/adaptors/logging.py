"""``LoggingResource``: one CSV line per allocation event, in RMM's log format."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional, TextIO, Tuple

from ..properties import DEFAULT_ALIGNMENT
from ._base import (MAX_PTR, BoundAdaptor, check_args, check_free_args, check_stream,
                    must_check_arguments, upstream_calls)

__all__ = ["LoggingResource", "LOG_HEADER"]

#: The first line of every log (RMM's header).
LOG_HEADER = "Thread,Time,Action,Pointer,Size,Stream"


class LoggingResource(BoundAdaptor):
    """``LoggingResource(upstream, file, auto_flush=False)``: logs every event as CSV.

    ``file`` is a path (opened for writing, truncated, and closed by :meth:`close` or when the
    adaptor is garbage-collected) or an open text file (written to, never closed).  The log
    starts with the header ``Thread,Time,Action,Pointer,Size,Stream``; then one line per event:
    the native thread id, the local time as ``HH:MM:SS.ffffff``, the action (``allocate``,
    ``allocate failure`` or ``free``), the pointer in hex (``(nil)`` for a failure), the size
    in bytes and the stream handle in hex (``0`` for the stream of a synchronous call), as RMM's
    ``logging_resource_adaptor`` writes it.  A ``free`` is logged before the upstream frees
    the memory, so that a concurrent ``allocate`` of the same address always comes after it.
    Thread-safe; an async resource when the upstream is one; equal to another over an equal
    upstream writing to the same file.  ``scripts/replay_log.py`` replays such a log.
    """

    def __init__(self, upstream: Any, file: Any, auto_flush: bool = False) -> None:
        ref = self._set_upstream(upstream)
        if not isinstance(auto_flush, bool):
            raise TypeError(f"auto_flush must be a bool, not {type(auto_flush).__name__}")
        if isinstance(file, (str, bytes, os.PathLike)):
            self._file_name: Optional[str] = os.fsdecode(file)
            self._file: TextIO = open(self._file_name, "w", encoding="ascii", newline="\n")
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
        self._lock = threading.Lock()
        self._file.write(LOG_HEADER + "\n")
        if auto_flush:
            self._file.flush()
        self._bind(ref)

    def _bind(self, ref: Any) -> None:
        lock = self._lock
        acquire, release = lock.acquire, lock.release
        out = self._file
        write = out.write
        flush = out.flush if self._auto_flush else None
        native_id = threading.get_native_id
        clock = time.time_ns
        must_check = must_check_arguments(ref)  # a user-written upstream: check everything
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)
        second = [(-1, "")]  # (the last whole second seen, its "HH:MM:SS." in local time)

        def stamp() -> str:
            """The local time as ``HH:MM:SS.ffffff``; strftime once a second, not per line."""
            s, us = divmod(clock() // 1000, 1_000_000)
            cached = second[0]            # one atomic read of an immutable pair
            if cached[0] != s:
                cached = (s, time.strftime("%H:%M:%S.", time.localtime(s)))
                second[0] = cached
            return f"{cached[1]}{us:06d}"

        def log(action: str, ptr: int, nbytes: int, stream: int) -> None:
            # As RMM writes them: a null pointer as printf's "%p" does, "(nil)", and a null
            # stream as C++'s ostream does, "0"; others as 0x-prefixed lowercase hex.
            line = (f"{native_id()},{stamp()},{action},{ptr:#x},{nbytes},"
                    f"{f'{stream:#x}' if stream else '0'}\n" if ptr else
                    f"{native_id()},{stamp()},{action},(nil),{nbytes},"
                    f"{f'{stream:#x}' if stream else '0'}\n")
            acquire()
            try:
                write(line)
                if flush is not None:
                    flush()
            finally:
                release()

        def check_open() -> None:
            if self._closed or out.closed:
                raise ValueError("LoggingResource: this LoggingResource (or its log file) is "
                                 "closed")

        def handle_of(stream: Any) -> int:
            if type(stream) is int and 0 <= stream <= MAX_PTR:
                return stream
            return check_stream(stream)

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if must_check or type(bytes) is not int:
                bytes, alignment = check_args(bytes, alignment)
            check_open()
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
            check_open()
            log("free", ptr, bytes, 0)
            up_dealloc(ptr, bytes, alignment)

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            if must_check or type(bytes) is not int:
                bytes, alignment = check_args(bytes, alignment)
            handle = handle_of(stream)
            check_open()
            try:
                ptr = up_alloc_async(bytes, alignment, stream)
            except BaseException:
                log("allocate failure", 0, bytes, handle)
                raise
            log("allocate", ptr, bytes, handle)
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            if must_check or type(ptr) is not int or type(bytes) is not int:
                ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
            handle = handle_of(stream)
            check_open()
            log("free", ptr, bytes, handle)
            up_dealloc_async(ptr, bytes, alignment, stream)

        # synchronous bodies of their own (stream 0 in the log, as RMM writes it): no extra call
        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate)

    def _settings(self) -> Tuple[Any, ...]:
        return (id(self._file),)

    def get_file_name(self) -> Optional[str]:
        """The log's path (None for a file object without one)."""
        return self._file_name

    @property
    def file(self) -> TextIO:
        """The text file the log is written to."""
        return self._file

    def flush(self) -> None:
        """Write buffered lines out to the file."""
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        """Flush, and close the file if this adaptor opened it (idempotent).  Allocating or
        freeing through a closed LoggingResource raises ``ValueError``."""
        with self._lock:
            self._closed = True
            if self._file.closed:
                return
            self._file.flush()
            if self._owned:
                self._file.close()

    def __enter__(self) -> "LoggingResource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        target = self._file_name if self._file_name is not None else self._file
        return f"LoggingResource({self._upstream.resource!r}, {target!r})"

"""Host views of a Buffer's memory: ``Buffer.host_view`` and ``memoryview(buf)`` (Python
3.12+) give a memoryview over a ctypes array that holds the Buffer.  While any such array is
alive the Buffer is *pinned*: ``close()``, ``resize()``, ``reserve()`` and ``release()`` raise
BufferError (:func:`viewed`, asked by ``buffer._not_viewed``).  Imported by the first view,
never by ``import hipmr_ctypes``; it imports nothing of the package."""
from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict

if TYPE_CHECKING:   # what is read of a Buffer (``buffer`` imports this module)
    from .contract import BufferView

__all__ = ["viewed", "host_view", "buffer_export"]

_HOST_READABLE = frozenset({"host", "pinned", "managed"})

# id(buffer) -> {id of a weak reference: that weak reference} of its live ctypes arrays (an
# array is unhashable, and so are weak references to it).  An array holds its Buffer (an
# attribute), so the Buffer outlives every entry; an array's weak-reference callback (run
# when the last memoryview over it is released or collected) removes it.  The callback never
# waits for the lock: where it cannot take it at once, it leaves an empty dict (which means
# "not viewed") for the next view of that buffer to reuse.

_views: Dict[int, Dict[int, Any]] = {}
_views_lock = threading.Lock()


def _forget(key: int) -> Callable[[Any], None]:
    def forget(wr: Any) -> None:
        found = _views.get(key)
        if found is None:
            return
        found.pop(id(wr), None)
        if not found and _views_lock.acquire(False):
            try:
                if not found and _views.get(key) is found:
                    del _views[key]
            finally:
                _views_lock.release()
    return forget


def viewed(buf: object) -> bool:
    """True while a memoryview from :func:`host_view` (or ``memoryview(buf)``) is alive."""
    return bool(_views.get(id(buf)))


def host_view(buf: BufferView, readonly: bool = False) -> memoryview:
    """``Buffer.host_view``: a 1-D ``B`` memoryview over host-accessible memory."""
    if not isinstance(readonly, bool):
        raise TypeError(f"readonly must be a bool, not {type(readonly).__name__}")
    ptr = buf._live()
    kind = buf._memory_kind()
    if kind not in _HOST_READABLE:
        raise BufferError(f"this Buffer holds {kind} memory, which the CPU cannot read: copy "
                          "it to the host (buf.tobytes(), buf.copy_to_host()) instead")
    if not readonly:   # a view of memory its DLPack producer marked read-only (foreign.py)
        foreign = sys.modules.get("hipmr_ctypes._buffer.foreign")
        readonly = foreign is not None and foreign.readonly(buf)
    size = buf._size
    array: Any = (ctypes.c_ubyte * size).from_address(ptr) if size else (ctypes.c_ubyte * 0)()
    array._hipmr_buffer = buf   # the Buffer lives as long as the array
    key = id(buf)
    with _views_lock:
        buf._mutable()          # its own state: close() takes the checked path
        found = _views.get(key)
        if found is None:
            found = _views[key] = {}
        wr = weakref.ref(array, _forget(key))
        found[id(wr)] = wr
    view = memoryview(array).cast("B")
    return view.toreadonly() if readonly else view


PyBUF_WRITABLE = 0x0001


def buffer_export(buf: BufferView, flags: int) -> memoryview:
    """``Buffer.__buffer__`` (Python 3.12+)."""
    view = host_view(buf)
    if view.readonly and flags & PyBUF_WRITABLE:
        view.release()
        raise BufferError("this Buffer views read-only memory")
    return view


"""Pinning host memory that already exists: :func:`register_host` and the
:class:`HostRegistration` it returns (``hipHostRegister`` / ``hipHostUnregister`` /
``hipHostGetDevicePointer``).

A registered range is page-locked and known to the runtime as pinned host memory, so copies
from and to it take the direct asynchronous path (``hipMemcpyAsync``, no staging through the
package's own pinned buffers) and ``Buffer.from_handle`` sees it as pinned.

Rules the module keeps:

* An object with the buffer protocol is held through a buffer export (``PyObject_GetBuffer``)
  for the registration's whole life: the object stays alive, and an object that could move or
  shrink its memory refuses to while exported (``bytearray`` and ``array.array`` resizing,
  ``mmap.close`` / ``resize``, NumPy ``resize``: ``BufferError`` or ``ValueError``).  So the
  runtime never keeps pinned pages that the object has given back.
* Ranges registered through the package never overlap: a second registration of any byte of
  a live one is a ``ValueError``, before any native call; memory the runtime already knows
  (pinned, device or managed memory) is refused too.
* ``close()`` waits for the work of every device (an asynchronous copy may still read or
  write the range), unregisters, then releases the export.  It is idempotent; the garbage
  collector runs it for a registration nobody closed (never at interpreter exit: see
  ``hipmr_ctypes._exit``).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Optional, Tuple

from .. import _hip
from .._checks import check_size
from .._exit import Finalizer, finalize, finalizer
from .._hip.types import (cudaHostRegisterReadOnly, hipHostRegisterMapped,
                          hipHostRegisterPortable)
from .._limits import MAX_ADDRESS
from .._memory_query import pointer_kind

__all__ = ["register_host", "HostRegistration"]

#: the live registrations made through the package: start address -> end address
_live: Dict[int, int] = {}
_live_lock = threading.Lock()


def _overlapping(start: int, end: int) -> Optional[Tuple[int, int]]:
    """A live registration that shares a byte with ``[start, end)``, or None (lock held)."""
    for s, e in _live.items():
        if s < end and start < e:
            return s, e
    return None


def _read_only_flag(platform: str) -> int:
    """The flag that registers memory the device only reads: ``cudaHostRegisterReadOnly`` on
    the nvidia platform; none on AMD, whose headers define ``hipHostRegisterReadOnly`` as
    ignored there, with the bit of ``hipExtHostRegisterCoarseGrained``."""
    return cudaHostRegisterReadOnly if platform == "nvidia" else 0


def _export(obj: Any, writable: bool) -> Tuple[Any, int, int]:
    """``(Py_buffer, address, nbytes)``: a C-contiguous export of ``obj``, held by the
    caller until released with ``PyBuffer_Release``."""
    from .._hip.native import (PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release,
                               Py_buffer, PyObject_GetBuffer)
    try:
        with memoryview(obj) as mv:
            contiguous, readonly = mv.c_contiguous, mv.readonly
    except TypeError:
        raise TypeError(f"obj must be an int address or support the buffer protocol "
                        f"(bytearray, NumPy array, mmap, ...), not {type(obj).__name__}"
                        ) from None
    if not contiguous:
        raise ValueError("obj must be C-contiguous")
    if readonly and writable:
        raise TypeError(f"obj is read-only ({type(obj).__name__}); register it with "
                        f"read_only=True (the device then only reads it)")
    view = Py_buffer()
    PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0))
    address, nbytes = view.buf or 0, view.len
    if not nbytes:
        PyBuffer_Release(view)
        raise ValueError("obj has no bytes to register")
    return view, address, nbytes


@finalizer
def _unregister(ptr: int, view: Any) -> None:
    """Wait for every device's work, unregister ``ptr``, then release the export ``view``
    (None for an int address) and forget the range.  A failure leaves everything as it was
    and raises."""
    rt = _hip.get_runtime()
    _synchronize_all(rt)
    rt.check(rt.fn.hipHostUnregister(ptr), "hipHostUnregister")
    with _live_lock:
        _live.pop(ptr, None)
    if view is not None:
        from .._hip.native import PyBuffer_Release
        PyBuffer_Release(view)


def _synchronize_all(rt: Any) -> None:
    """``hipDeviceSynchronize`` on every device, the calling thread's device restored."""
    count = ctypes.c_int(0)
    if rt.fn.hipGetDeviceCount(count):
        rt.clear_last_error()
        return
    current = ctypes.c_int(0)
    rt.check(rt.fn.hipGetDevice(current), "hipGetDevice")
    try:
        for device in range(count.value):
            rt.check(rt.fn.hipSetDevice(device), "hipSetDevice", device=device)
            rt.check(rt.fn.hipDeviceSynchronize(), "hipDeviceSynchronize", device=device)
    finally:
        rt.fn.hipSetDevice(current.value)


class HostRegistration:
    """Host memory pinned by :func:`register_host`, until :meth:`close`.

    ``ptr`` and ``size``: the registered range; ``device_ptr``: its address for the device
    (``mapped=True``), else None; ``closed``; a context manager whose exit closes it.
    """

    __slots__ = ("_ptr", "_size", "_device_ptr", "_read_only", "_obj", "_finalizer",
                 "__weakref__")
    _ptr: int
    _size: int
    _device_ptr: Optional[int]
    _read_only: bool
    _obj: Any
    _finalizer: Finalizer

    def __init__(self) -> None:
        raise TypeError("use hipmr_ctypes.register_host(obj, ...) to make a HostRegistration")

    @classmethod
    def _make(cls, ptr: int, size: int, device_ptr: Optional[int], read_only: bool, obj: Any,
              view: Any) -> "HostRegistration":
        self = object.__new__(cls)
        self._ptr, self._size, self._device_ptr = ptr, size, device_ptr
        self._read_only, self._obj = read_only, obj
        self._finalizer = finalize(self, _unregister, ptr, view)
        return self

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise ValueError("this HostRegistration is closed")

    @property
    def ptr(self) -> int:
        """The first registered address (ValueError once closed)."""
        self._check_open()
        return self._ptr

    @property
    def size(self) -> int:
        """The registered bytes."""
        return self._size

    @property
    def device_ptr(self) -> Optional[int]:
        """The range's address for the device (from ``hipHostGetDevicePointer``) when it was
        registered with ``mapped=True``; None otherwise (ValueError once closed)."""
        self._check_open()
        return self._device_ptr

    @property
    def read_only(self) -> bool:
        """True when registered with ``read_only=True``."""
        return self._read_only

    @property
    def obj(self) -> Any:
        """The registered object (None for an int address)."""
        return self._obj

    @property
    def closed(self) -> bool:
        """True once unregistered."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Wait for the work of every device, unregister the range and release the object
        (idempotent).  A runtime failure raises HipError and leaves the registration open."""
        finalizer = self._finalizer
        if not finalizer.alive:
            return
        detached = finalizer.detach()
        if detached is None:       # closed meanwhile (another thread, the collector)
            return
        _, func, args, _ = detached
        try:
            func(*args)
        except BaseException:
            self._finalizer = finalize(self, func, *args)   # still registered: stays open
            raise

    def __enter__(self) -> "HostRegistration":
        self._check_open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        return f"<HostRegistration {state} size={self._size}>"


def _check_flag(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def register_host(obj: Any, size: Optional[int] = None, *, portable: bool = True,
                  mapped: bool = False, read_only: bool = False) -> HostRegistration:
    """Pin existing host memory (``hipHostRegister``) until the returned registration is
    closed.

    ``obj``: a writable C-contiguous object with the buffer protocol (``bytearray``, a NumPy
    array, ``mmap``, ...), held (and kept from resizing) while registered; a read-only one
    needs ``read_only=True``.  Or an int address, with ``size``: the caller keeps that memory
    alive and in place until the registration is closed.  ``size``: for an object, the
    leading bytes to register (default all).  ``portable``: pinned for every device;
    ``mapped``: mapped into the device's address space (``device_ptr``); ``read_only``: the
    device only reads it (the runtime's read-only flag where it has one: the nvidia platform).

    Raises TypeError / ValueError before any native call for a bad argument, a range that
    overlaps a live registration, or memory the runtime already knows (pinned, device or
    managed); HipError when the runtime refuses (memory another library registered:
    ``hipErrorHostMemoryAlreadyRegistered``).
    """
    portable = _check_flag(portable, "portable")
    mapped = _check_flag(mapped, "mapped")
    read_only = _check_flag(read_only, "read_only")
    if size is not None:
        size = check_size(size, "size")
        if not size:
            raise ValueError("size=0: expected a positive number of bytes")
    rt = _hip.get_runtime()
    flags = ((hipHostRegisterPortable if portable else 0)
             | (hipHostRegisterMapped if mapped else 0)
             | (_read_only_flag(rt.platform) if read_only else 0))
    view = None
    held: Any = None
    if isinstance(obj, int) and not isinstance(obj, bool):
        if size is None:
            raise TypeError("size is required with an int address")
        ptr = obj
        if not 0 < ptr <= MAX_ADDRESS or ptr + size - 1 > MAX_ADDRESS:
            raise ValueError(f"obj={ptr:#x} with size={size} is not a range of addresses")
    else:
        view, ptr, nbytes = _export(obj, writable=not read_only)
        held = obj
        if size is None:
            size = nbytes
        elif size > nbytes:
            _release(view)
            raise ValueError(f"size={size} is more than obj's {nbytes} bytes")
    end = ptr + size
    try:
        with _live_lock:
            clash = _overlapping(ptr, end)
            if clash is not None:
                raise ValueError(f"[{ptr:#x}, {end:#x}) overlaps a live registration "
                                 f"[{clash[0]:#x}, {clash[1]:#x})")
            _live[ptr] = end     # reserved: a concurrent registration of it is refused
        registered = False
        try:
            kind = pointer_kind(ptr)[0] or pointer_kind(end - 1)[0]
            if kind is not None:
                raise ValueError(f"[{ptr:#x}, {end:#x}) is {kind} memory the runtime already "
                                 "knows; only plain host memory is registered")
            rt.check(rt.fn.hipHostRegister(ptr, size, flags), "hipHostRegister", size=size)
            registered = True
            device_ptr = None
            if mapped:
                out = ctypes.c_void_p()
                rt.check(rt.fn.hipHostGetDevicePointer(out, ptr, 0), "hipHostGetDevicePointer")
                device_ptr = out.value or 0
            return HostRegistration._make(ptr, size, device_ptr, read_only, held, view)
        except BaseException:
            # (an interrupt too: the runtime never keeps pages the object may give back)
            if registered:
                rt.fn.hipHostUnregister(ptr)
            with _live_lock:
                _live.pop(ptr, None)
            raise
    except BaseException:
        if view is not None:
            _release(view)
        raise


def _release(view: Any) -> None:
    from .._hip.native import PyBuffer_Release
    PyBuffer_Release(view)

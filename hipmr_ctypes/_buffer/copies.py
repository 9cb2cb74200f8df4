"""The copies and writes of a Buffer's memory: host <-> buffer, device <-> buffer (peer copies
between devices), ``memset`` and ``fill``.

Every one has the same two shapes.  ``stream=None``: synchronous, ordered after the work on
the buffer's stream (the blocking call on the null stream, else the async call on the
buffer's stream and a synchronize of it).  A stream: the async call on it, which the caller
synchronizes.  Copies, ``fill`` and the synchronous ``memset`` run with the memory's device
current when it is known (``device.on_device_or_current``): the runtime accepts a plain copy
of memory-pool memory only while the pool's device is current, and the null stream is per
device; ``memset`` on a stream runs on the calling thread's current device.  Host-only memory
(a resource without ``device_accessible``) is copied and set by the CPU.  Arguments are
checked before any native call.
"""
from __future__ import annotations

import ctypes
import sys
from typing import TYPE_CHECKING, Any, Optional, Tuple

from .. import _hip
from .._checks import check_stream
from .._hip.native import (PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, Py_buffer,
                          PyByteArray_FromStringAndSize, PyBytes_AsString,
                          PyBytes_FromStringAndSize, PyObject_GetBuffer)
from .._hip.types import hipMemcpyDefault
from .hugepages import advise as advise_huge_pages
from .._memory_query import pointer_kind
from . import staging as _staging
from ..device import on_device_or_current
from ..stream_refs import stream_ref

if TYPE_CHECKING:   # what is read of a Buffer (``buffer`` imports this module)
    from .contract import BufferView

__all__ = ["HostView", "readonly", "check_writable", "check_fits", "cai_source", "copy", "copy_in",
           "copy_to_host", "copy_from_device", "tobytes", "memset", "fill"]


# ---- host objects: the address of anything with the buffer protocol ---------------------------


class HostView:
    """``with HostView(obj, name, writable) as (address, nbytes)``: a C-contiguous view of
    ``obj``'s memory, held while the block runs.  TypeError / ValueError name ``name``."""

    __slots__ = ("_obj", "_writable", "_view", "nbytes")

    def __init__(self, obj: Any, name: str, writable: bool) -> None:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise TypeError(f"{name} must support the buffer protocol (bytes, bytearray, "
                            f"memoryview, array.array, numpy arrays...), not "
                            f"{type(obj).__name__}") from None
        with mv:
            if not mv.c_contiguous:
                raise ValueError(f"{name} must be C-contiguous")
            if writable and mv.readonly:
                raise TypeError(f"{name} must be writable ({type(obj).__name__} is read-only)")
            self.nbytes = mv.nbytes
        self._obj = obj
        self._writable = writable
        self._view: Optional[Py_buffer] = None

    def __enter__(self) -> Tuple[int, int]:
        view = Py_buffer()
        flags = PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if self._writable else 0)
        PyObject_GetBuffer(self._obj, view, flags)
        self._view = view
        return view.buf or 0, view.len

    def __exit__(self, *exc: Any) -> None:
        if self._view is not None:
            PyBuffer_Release(self._view)
            self._view = None


def readonly(buf: BufferView) -> bool:
    """True for a view of memory its producer marked read-only (foreign memory: the one
    answer every writer and every export of the memory asks)."""
    foreign = sys.modules.get("hipmr_ctypes._buffer.foreign")
    return foreign is not None and foreign.readonly(buf)


def check_writable(buf: BufferView, what: str) -> None:
    """BufferError for a view of memory its producer marked read-only (foreign memory, whose
    module is loaded by the first such view)."""
    foreign = sys.modules.get("hipmr_ctypes._buffer.foreign")
    if foreign is not None:
        foreign.check_writable(buf, what)


def check_fits(buf: BufferView, n: int, what: str) -> None:
    """ValueError when ``n`` bytes of ``what`` do not fit in ``buf``."""
    if n > buf._size:
        raise ValueError(f"{what} has {n} bytes, more than the buffer's {buf._size}")


def cai_source(obj: Any) -> Tuple[int, int, Optional[int]]:
    """(address, nbytes, producer stream or None) of a C-contiguous CAI object."""
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        raise TypeError(f"other must be a Buffer or have __cuda_array_interface__, not "
                        f"{type(obj).__name__}") from None
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    n = itemsize
    for extent in shape:
        n *= extent
    strides = cai.get("strides")
    if strides is not None and n:
        expected = []
        step = itemsize
        for extent in reversed(shape):
            expected.append(step)
            step *= extent
        if tuple(s for s, e in zip(strides, shape) if e > 1) != tuple(
                e for e, x in zip(reversed(expected), shape) if x > 1):
            raise ValueError("other must be C-contiguous")
    if cai.get("mask") is not None:
        raise ValueError("other: masked arrays are not supported")
    producer = cai.get("stream") if cai.get("version", 0) >= 3 else None
    return int(cai["data"][0] or 0), n, producer


# ---- copies ------------------------------------------------------------------------------------

_OWN: Any = object()   # copy's default device: the buffer's own


def _sync_copy(buf: BufferView, dst: int, src: int, n: int, host: bool,
               peer: Optional[Tuple[int, int]], device: Optional[int],
               device_to_device: bool = False, staged: Any = None) -> None:
    """A synchronous copy ordered after the work on the buffer's stream, made with
    ``device`` current (the null stream is per device).  ``device_to_device``: the source is
    device memory, which a plain ``hipMemcpy`` may still be reading when it returns (CUDA's
    rule for device-to-device copies): the null stream is then waited for too.  ``staged``:
    ``_staging.to_device`` / ``to_host`` / ``to_existing_host`` for a copy between a host
    object and the buffer, which a large copy of pageable memory into or out of device memory
    goes through."""
    if host:
        ctypes.memmove(dst, src, n)
        return
    rt = _hip.get_runtime()
    own = buf._own_stream()
    with on_device_or_current(device):
        if (staged is not None and n >= _staging.threshold(staged) and peer is None
                and buf._memory_kind() == "device"
                and pointer_kind(src if staged is _staging.to_device else dst)[0] is None
                and staged(rt, dst, src, n, own, device)):
            return
        if peer is not None:
            rt.check(rt.fn.hipMemcpyPeerAsync(dst, peer[0], src, peer[1], n, own),
                     "hipMemcpyPeerAsync", size=n, device=peer[0])   # device memory only
            rt.check(rt.fn.hipStreamSynchronize(own), "hipStreamSynchronize")
            return
        if own == 0:
            rt.check(rt.fn.hipMemcpy(dst, src, n, hipMemcpyDefault), "hipMemcpy", size=n)
            if device_to_device:
                rt.check(rt.fn.hipStreamSynchronize(own), "hipStreamSynchronize")
            return
        # An async copy may still read or write host memory when the call returns: the call
        # leaves only once the stream is done, also when an exception (one a signal handler
        # raised) interrupts it; the wait only starts again then, and the first interruption
        # is raised after it (written inline: nothing may run in between that one escapes).
        status, interrupted = 0, None
        try:
            rt.check(rt.fn.hipMemcpyAsync(dst, src, n, hipMemcpyDefault, own),
                     "hipMemcpyAsync", size=n)
        finally:
            while True:
                try:
                    try:
                        status = rt.fn.hipStreamSynchronize(own)
                        break
                    except BaseException as exc:  # noqa: BLE001 - raised after the wait
                        interrupted = interrupted or exc
                except BaseException as exc:  # noqa: BLE001 - a second one, in the handler
                    interrupted = interrupted or exc
        if interrupted is not None:
            if status:
                rt.clear_last_error()
            raise interrupted
        rt.check(status, "hipStreamSynchronize")


def wait_out(handle: int) -> None:
    """Wait for the stream ``handle`` while an exception leaves a copy that may have queued
    work on it (an interrupt after the async call returned): the copy must not touch host
    memory after the call raised.  Another interrupt only restarts the wait (the exception
    already leaving is the one raised); a failed wait is cleared (the runtime's error is the
    one already raised, or the device is lost)."""
    rt = _hip.get_runtime()
    while True:
        try:
            try:
                if rt.fn.hipStreamSynchronize(handle):
                    rt.clear_last_error()
                return
            except BaseException:  # noqa: BLE001 - the exception leaving is raised
                pass
        except BaseException:  # noqa: BLE001 - a second one, in the handler
            pass


def copy(buf: BufferView, dst: int, src: int, n: int, stream: Any, host: bool,
         peer: Optional[Tuple[int, int]] = None, device: Any = _OWN,
         device_to_device: bool = False, staged: Any = None) -> None:
    """Copy ``n`` bytes for ``buf``; ``peer`` = (destination device, source device) for a copy
    between two devices' memory, which only the peer copy calls accept.  ``device``: the
    device made current for the copy (default: the buffer's own); the other side may be any
    memory (``device_to_device``, ``staged``: see :func:`_sync_copy`)."""
    if not n:
        return
    if device is _OWN:
        device = buf._state.device
    if stream is None:
        _sync_copy(buf, dst, src, n, host, peer, device, device_to_device, staged)
    elif host:
        ctypes.memmove(dst, src, n)
    else:
        handle = check_stream(stream)
        rt = _hip.get_runtime()
        with on_device_or_current(device):
            if peer is not None:
                rt.check(rt.fn.hipMemcpyPeerAsync(dst, peer[0], src, peer[1], n, handle),
                         "hipMemcpyPeerAsync", size=n, device=peer[0])
                return
            try:
                rt.check(rt.fn.hipMemcpyAsync(dst, src, n, hipMemcpyDefault, handle),
                         "hipMemcpyAsync", size=n)
            except BaseException:   # an interrupt may land after the copy was queued
                wait_out(handle)
                raise


def copy_in(buf: BufferView, view: HostView, stream: Any) -> None:
    """Copy the host object of ``view`` into the start of ``buf``."""
    ptr = buf._live()
    check_fits(buf, view.nbytes, "obj")
    with view as (address, n):
        copy(buf, ptr, address, n, stream, buf._state.host_only, staged=_staging.to_device)


def copy_to_host(buf: BufferView, out: Any, stream: Any) -> Any:
    """``Buffer.copy_to_host``."""
    ptr = buf._live()
    buf._own_stream()
    if stream is not None:
        check_stream(stream)
    size = buf._size
    # a fresh destination is not zeroed first: the copy writes every byte of it
    target = PyByteArray_FromStringAndSize(None, size) if out is None else out
    view = HostView(target, "out", True)
    if view.nbytes < size:
        raise ValueError(f"out has {view.nbytes} bytes, fewer than the buffer's {size}")
    with view as (address, _):
        if out is None:   # fresh pages: fewer faults while it is filled (from THRESHOLD)
            advise_huge_pages(address, size)
        staged = _staging.to_host if out is None else _staging.to_existing_host
        copy(buf, address, ptr, size, stream, buf._state.host_only, staged=staged)
    return target


#: destinations a synchronous ``hipMemcpy`` from device memory has filled when it returns
#: (CUDA: it "returns only once the copy has completed" into pinned or pageable host memory).
#: From pinned memory it is "synchronous with respect to the host" too; from pageable memory it
#: may return once the source is staged, and between device-side kinds before the copy is
#: done: those are waited for
_DONE_ON_RETURN = frozenset(("pinned", "host"))


def copy_from_device(buf: BufferView, ptr: int, source: Optional[BufferView], src: int,
                     n: int, stream: Any, host: bool, src_device: Optional[int],
                     src_kind: Optional[str] = None) -> None:
    """Copy ``n`` bytes at ``src`` (of the Buffer ``source``, or of a CAI object: None) to
    ``ptr``, the start of ``buf``; ``src_device``: the source's device when it is device
    memory (None: found from the pointer for a CAI object).  Two devices' memory: a peer
    copy.  Host-accessible memory filled from another device's memory: the copy runs with the
    source's device current (pool memory is refused otherwise), after the work on ``buf``'s
    own stream.  ``src_kind``: the source's memory kind when known (a Buffer's).  Into pinned
    or host memory, or from pinned memory, the copy is complete when ``hipMemcpy`` returns,
    and the null stream is not waited for after it."""
    if not n:
        return
    peer = None
    device = buf._state.device
    dst_kind = None
    if not host:
        if src_device is None and source is None:
            src_kind, src_device = pointer_kind(src)
            if src_kind is None:
                src_kind = "host"          # memory the runtime does not know: host memory
            elif src_kind != "device":
                src_device = None
        dst_kind = buf._memory_kind()
        dst_device = device if dst_kind == "device" else None
        if src_device is not None and dst_device is not None and src_device != dst_device:
            peer = (dst_device, src_device)
            if stream is None and source is not None:
                source._wait_own()   # its work on its own device's stream comes first
        elif dst_device is None and src_device is not None and src_device != device:
            if stream is None:
                buf._wait_own()
            device = src_device
    copy(buf, ptr, src, n, stream, host, peer, device,
         device_to_device=not host and dst_kind not in _DONE_ON_RETURN and src_kind != "pinned")


def tobytes(buf: BufferView, stream: Any) -> bytes:
    """``Buffer.tobytes``: the copy lands in the new ``bytes`` object itself."""
    ptr = buf._live()
    buf._own_stream()
    if stream is not None:
        check_stream(stream)
    n = buf._size
    data = PyBytes_FromStringAndSize(None, n)   # not yet written: nobody else sees it
    if n:
        host = buf._state.host_only
        address = PyBytes_AsString(data)
        advise_huge_pages(address, n)   # fresh pages: fewer faults while it is filled
        copy(buf, address, ptr, n, stream, host, staged=_staging.to_host)
        if stream is not None and not host:
            try:
                stream_ref(stream).wait()
            except BaseException:   # ``data`` is dropped: the copy must be done first
                wait_out(check_stream(stream))
                raise
    return data  # type: ignore[no-any-return]


# ---- patterns ----------------------------------------------------------------------------------

def memset(buf: BufferView, value: Any, stream: Any) -> None:
    """``Buffer.memset``."""
    ptr = buf._live()
    check_writable(buf, "memset")
    buf._own_stream()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"value must be an int in [0, 255], not {type(value).__name__}")
    if not 0 <= value <= 255:
        raise ValueError(f"value={value} is not in [0, 255]")
    handle = None if stream is None else check_stream(stream)
    size = buf._size
    if not size:
        return
    if buf._state.host_only:
        ctypes.memset(ptr, value, size)
        return
    rt = _hip.get_runtime()
    if handle is None:
        own = buf._own_stream()
        with on_device_or_current(buf._state.device):
            if own == 0:
                rt.check(rt.fn.hipMemset(ptr, value, size), "hipMemset", size=size)
                return
            rt.check(rt.fn.hipMemsetAsync(ptr, value, size, own), "hipMemsetAsync", size=size)
            rt.check(rt.fn.hipStreamSynchronize(own), "hipStreamSynchronize")
    else:
        rt.check(rt.fn.hipMemsetAsync(ptr, value, size, handle), "hipMemsetAsync", size=size)

_WIDTHS = {1: ("hipMemsetD8", "hipMemsetD8Async"), 2: ("hipMemsetD16", "hipMemsetD16Async"),
           4: ("hipMemsetD32", "hipMemsetD32Async")}


def fill(buf: BufferView, value: Any, width: Any, stream: Any) -> None:
    """``Buffer.fill``: every argument checked before any native call."""
    ptr = buf._live()
    if isinstance(width, bool) or not isinstance(width, int):
        raise TypeError(f"width must be 1, 2 or 4 (bytes), not {type(width).__name__}")
    if width not in _WIDTHS:
        raise ValueError(f"width={width} is not 1, 2 or 4 (bytes)")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"value must be an int, not {type(value).__name__}")
    bits = 8 * width
    if not -(1 << (bits - 1)) <= value < (1 << bits):
        raise ValueError(f"value={value} does not fit in {width} byte(s): it must be in "
                         f"[{-(1 << (bits - 1))}, {(1 << bits) - 1}]")
    value &= (1 << bits) - 1     # the pattern's bits
    size = buf._size
    if size % width:
        raise ValueError(f"the buffer's size ({size} bytes) is not a multiple of width={width}")
    if ptr % width:
        raise ValueError(f"the buffer's address {ptr:#x} is not aligned to width={width}")
    handle = None if stream is None else check_stream(stream)
    check_writable(buf, "fill")
    own = buf._own_stream()   # a closed Stream's handle never reaches the runtime
    if not size:
        return
    if buf._state.host_only:
        _fill_host(ptr, value, width, size)
        return
    count = size // width
    if width == 4 and value & 0x80000000:
        value -= 1 << 32     # hipMemsetD32 takes an int: the same 32 bits
    sync_name, async_name = _WIDTHS[width]
    rt = _hip.get_runtime()
    device = buf._state.device
    with on_device_or_current(device):
        if handle is None:
            if own == 0:
                rt.check(getattr(rt.fn, sync_name)(ptr, value, count), sync_name, size=size)
                return
            rt.check(getattr(rt.fn, async_name)(ptr, value, count, own), async_name,
                     size=size)
            rt.check(rt.fn.hipStreamSynchronize(own), "hipStreamSynchronize")
        else:
            rt.check(getattr(rt.fn, async_name)(ptr, value, count, handle), async_name,
                     size=size)


def _fill_host(ptr: int, value: int, width: int, size: int) -> None:
    """The pattern written by the CPU: one element, then doubling copies of what is done."""
    if width == 1:
        ctypes.memset(ptr, value, size)
        return
    ctypes.memmove(ptr, value.to_bytes(width, sys.byteorder), width)
    done = width
    while done < size:
        step = min(done, size - done)
        ctypes.memmove(ptr + done, ptr, step)
        done += step

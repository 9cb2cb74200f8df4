"""``Buffer``: one owning allocation made through any async resource (RMM's ``DeviceBuffer``),
with host / device copies, ``__cuda_array_interface__`` and DLPack export."""
from __future__ import annotations

import atexit
import ctypes
import sys
import threading
import weakref
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _hip
from ._checks import check_alignment, check_size, check_stream
from ._exit import finalizer, keep_at_exit
from ._hip.native import (PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, Py_buffer,
                          PyObject_GetBuffer)
from ._hip.types import (MEMORY_TYPE_5, MEMORY_TYPE_6, hipMemcpyDefault,
                         hipPointerAttribute_t)
from .device import Device, check_device, get_device, on_device, prefetch_if_managed
from .properties import DEFAULT_ALIGNMENT, _declared, device_accessible, host_accessible
from .resource_ref import async_resource_ref, resource_ref
from .resources import (ManagedMemoryResource, PinnedMemoryResource,
                        get_current_device_resource)
from .stream import Stream, event_for, wait_event
from .stream_ref import stream_ref

if TYPE_CHECKING:
    from .ipc import IpcBufferDescriptor

__all__ = ["Buffer"]

# ---- host buffers: the address of anything with the buffer protocol ----------------------------


class _HostView:
    """``with _HostView(obj, name, writable) as (address, nbytes)``: a C-contiguous view of
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


# ---- freeing ------------------------------------------------------------------------------------
_exiting = False
_exit_hook_lock = threading.Lock()
_exit_hook = False


def _mark_exit() -> None:
    global _exiting
    _exiting = True


def _install_exit_hook() -> None:
    """Called after the first weakref.finalize exists: atexit runs hooks last-in first-out, so
    this one runs before weakref's, and finalizers running at exit know it."""
    global _exit_hook
    with _exit_hook_lock:
        if not _exit_hook:
            _exit_hook = True
            atexit.register(_mark_exit)


def _free(deallocate_async: Any, ptr: int, size: int, alignment: int, stream: int,
          keep: Any) -> None:
    """Free one allocation in stream order; the finalizer's and ``close()``'s work.

    ``keep`` is the caller's stream object, held so that the stream outlives the allocation.
    A stream closed meanwhile cannot be used any more (HIP 7 crashes on destroyed streams):
    the device is synchronized and the memory freed on the null stream instead.
    """
    if isinstance(keep, Stream) and keep.closed:
        Device(keep.device).synchronize()
        stream = 0
    deallocate_async(ptr, size, alignment, stream)


@finalizer
def _finalize(deallocate_async: Any, ptr: int, size: int, alignment: int, stream: int,
              keep: Any) -> None:
    """Garbage collection or interpreter exit: free, never raise.  A failure is a warning,
    except at exit, where the runtime may already be going away.  At an exit with daemon
    threads still running nothing is freed: they may still use it (``hipmr_ctypes._exit``)."""
    if keep_at_exit():
        return
    try:
        _free(deallocate_async, ptr, size, alignment, stream, keep)
    except Exception as exc:  # noqa: BLE001
        try:
            if not _exiting and not sys.is_finalizing():
                import warnings
                warnings.warn(f"Buffer: freeing {ptr:#x} ({size} bytes) failed: {exc}",
                              RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001
            pass


# ---- the buffer ---------------------------------------------------------------------------------

class Buffer:
    """One allocation of ``size`` bytes made through an ``async_resource_ref`` of ``resource``
    (default: the current device's resource) on ``stream`` (default: the null stream), aligned
    to ``alignment``.

    Freed exactly once, in stream order on the allocation stream: by ``close()`` (optionally
    on another stream; a failed free leaves the buffer owning the memory), by the context
    manager, or when garbage-collected (also at interpreter exit, where errors from a runtime
    shutting down are ignored).  The buffer holds the
    resource and the stream object it was given, so neither goes away before the memory.

    Copies (``copy_from_host``, ``copy_to_host``, ``copy_from_device``, ``memset``) take
    ``stream=None`` for a synchronous copy ordered after the work on the buffer's stream, or a
    stream for an asynchronous one the caller synchronizes.  Host-only memory (a resource
    without ``device_accessible``) is copied with ``ctypes.memmove``.  After ``close()`` every
    data access raises ValueError; ``size``, ``resource``, ``stream`` and ``device`` stay
    readable.
    """

    __slots__ = ("_ptr", "_size", "_capacity", "_alignment", "_ref", "_stream", "_keep",
                 "_device", "_host_only", "_kind", "_finalizer", "_closed", "__weakref__")

    def __init__(self, size: int = 0, *, resource: Any = None, stream: Any = None,
                 alignment: int = DEFAULT_ALIGNMENT) -> None:
        size = check_size(size, "size")
        alignment = check_alignment(alignment, None)
        handle = 0 if stream is None else check_stream(stream)
        if resource is None:
            resource = get_current_device_resource()
        ref = (resource if isinstance(resource, async_resource_ref)
               else async_resource_ref(resource))
        props = _declared(ref.resource)
        host_only = device_accessible not in props and bool(props)
        device = getattr(ref.resource, "device", None)
        if type(device) is not int:
            device = None if host_only else memory_device(ref.resource)
            if device is None and not host_only:
                device = get_device()
        self._size = size
        self._capacity = size
        self._alignment = alignment
        self._ref = ref
        self._stream = stream_ref(handle)
        self._keep = None if stream is None or type(stream) in (int, stream_ref) else stream
        self._device = device
        self._host_only = host_only
        self._kind: Optional[str] = None
        self._closed = False
        self._finalizer: Optional[weakref.finalize] = None
        if size:
            ptr = ref.allocate_async(size, alignment, handle)
            self._ptr = ptr
            self._finalizer = weakref.finalize(self, _finalize, ref.deallocate_async, ptr,
                                               size, alignment, handle, self._keep)
            _install_exit_hook()
        else:
            self._ptr = 0

    @classmethod
    def _adopt(cls, ptr: int, size: int, resource: Any, device: int) -> "Buffer":
        """A Buffer over memory that exists already (``ptr``, ``size`` > 0, on ``device``),
        given back by ``resource.deallocate_async`` on the null stream like any Buffer's: the
        imported buffers of ``Buffer.from_ipc``, whose resources unmap."""
        self = cls.__new__(cls)
        self._size = size
        self._alignment = DEFAULT_ALIGNMENT
        self._ref = async_resource_ref(resource)
        self._stream = stream_ref(0)
        self._keep = None
        self._device = device
        self._host_only = False
        self._kind = "device"
        self._closed = False
        self._rearm(ptr, size, 0, None)
        return self

    # ---- processes ----
    def export_ipc(self) -> "IpcBufferDescriptor":
        """An :class:`~hipmr_ctypes.IpcBufferDescriptor` with which another process maps this
        memory (``Buffer.from_ipc``): ``hipMemPoolExportPointer`` for memory of an
        ``AsyncMemoryResource(enable_ipc=True)``, ``hipIpcGetMemHandle`` for memory of a
        ``DeviceMemoryResource``.  It waits for the buffer's stream first, so importers see
        what was written before.  Other memory (host, pinned, managed, a pool made without
        ``enable_ipc``, part of a larger allocation) raises NotSupportedError naming why.
        Keep this Buffer alive until every importer has closed its mapping."""
        from .ipc import export_buffer
        return export_buffer(self)

    @classmethod
    def from_ipc(cls, descriptor: "IpcBufferDescriptor", resource: Any = None) -> "Buffer":
        """A Buffer mapping the memory another process exported with :meth:`export_ipc`.
        Pool memory needs ``resource``, the importing resource of its pool
        (``AsyncMemoryResource.from_ipc(handle)``; a descriptor of another pool is a
        ValueError); legacy (``hipMalloc``) memory needs none.  Closing the Buffer unmaps the
        memory; it never frees the exporter's."""
        from .ipc import import_buffer
        return import_buffer(descriptor, resource)

    # ---- construction helpers ----
    @classmethod
    def from_host(cls, obj: Any, *, resource: Any = None, stream: Any = None) -> "Buffer":
        """A new buffer holding a copy of ``obj`` (anything C-contiguous with the buffer
        protocol).  With ``stream``, the copy is asynchronous on it."""
        view = _HostView(obj, "obj", False)
        buf = cls(view.nbytes, resource=resource, stream=stream)
        try:
            buf._copy_in(view, stream)
        except BaseException:
            buf.close()
            raise
        return buf

    # ---- attributes ----
    def _live(self) -> int:
        if self._closed:
            raise ValueError("buffer: this Buffer is closed")
        return self._ptr

    @property
    def ptr(self) -> int:
        """The address of the memory as an int (0 for an empty buffer)."""
        return self._live()

    @property
    def size(self) -> int:
        """Size in bytes."""
        return self._size

    nbytes = size

    @property
    def alignment(self) -> int:
        """The alignment the memory was allocated with."""
        return self._alignment

    @property
    def resource(self) -> Any:
        """The resource the memory came from."""
        return self._ref.resource

    @property
    def stream(self) -> stream_ref:
        """The stream the memory was allocated on (and is freed on by default)."""
        return self._stream

    @property
    def device(self) -> Optional[int]:
        """The device the memory lives on: the ``device`` of the resource, or of the first
        resource below it that names one (through any stack of adaptors), else the device
        current at allocation; None for host-only memory."""
        return self._device

    @property
    def closed(self) -> bool:
        """True once the memory was given back."""
        return self._closed

    def __len__(self) -> int:
        return self._size

    # ---- lifetime ----
    def close(self, stream: Any = None) -> None:
        """Free the memory (idempotent), in stream order on ``stream`` (default: the allocation
        stream).

        If the free fails, the error propagates and the buffer still owns the memory: a later
        ``close()`` (or garbage collection) tries again.  While a DLPack consumer still uses the
        memory, the buffer only becomes closed here; the memory is freed (on the allocation
        stream) once the last consumer lets it go.
        """
        if self._closed:
            return
        handle = None if stream is None else check_stream(stream)
        fin = self._finalizer
        if fin is None:
            self._closed = True
            return
        dl = sys.modules.get("hipmr_ctypes._dlpack")
        if dl is not None and dl.exported(self):
            self._closed = True
            return  # the finalizer frees it when the exports release the buffer
        args = fin.detach()  # claims the memory: a finalizer never runs twice
        if args is None:
            self._closed = True
            return
        _, func, fargs, _ = args
        dealloc, ptr, size, alignment, own, keep = fargs
        try:
            if handle is None:
                _free(dealloc, ptr, size, alignment, own, keep)
            else:
                dealloc(ptr, size, alignment, handle)
        except BaseException:
            self._finalizer = weakref.finalize(self, func, *fargs)  # still ours
            raise
        self._closed = True

    def __enter__(self) -> "Buffer":
        self._live()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- copies ----
    def _sync_copy(self, dst: int, src: int, n: int, host: bool,
                   peer: Optional[Tuple[int, int]]) -> None:
        """A synchronous copy ordered after the work on the buffer's stream, made with the
        buffer's device current (the null stream is per device)."""
        if host:
            ctypes.memmove(dst, src, n)
            return
        rt = _hip.get_runtime()
        own = self._stream._handle
        device = self._device
        with on_device(device) if device is not None else _NO_SWITCH:
            if peer is not None:
                rt.check(rt.fn.hipMemcpyPeerAsync(dst, peer[0], src, peer[1], n, own),
                         "hipMemcpyPeerAsync", size=n, device=peer[0])
            elif own == 0:
                rt.check(rt.fn.hipMemcpy(dst, src, n, hipMemcpyDefault), "hipMemcpy", size=n)
                return
            else:
                rt.check(rt.fn.hipMemcpyAsync(dst, src, n, hipMemcpyDefault, own),
                         "hipMemcpyAsync", size=n)
            rt.check(rt.fn.hipStreamSynchronize(own), "hipStreamSynchronize")

    def _copy(self, dst: int, src: int, n: int, stream: Any, host: bool,
              peer: Optional[Tuple[int, int]] = None) -> None:
        """Copy ``n`` bytes; ``peer`` = (destination device, source device) for a copy between
        two devices' memory, which only the peer copy calls accept."""
        if not n:
            return
        if stream is None:
            self._sync_copy(dst, src, n, host, peer)
        elif host:
            ctypes.memmove(dst, src, n)
        else:
            handle = check_stream(stream)
            rt = _hip.get_runtime()
            if peer is not None:
                rt.check(rt.fn.hipMemcpyPeerAsync(dst, peer[0], src, peer[1], n, handle),
                         "hipMemcpyPeerAsync", size=n, device=peer[0])
                return
            rt.check(rt.fn.hipMemcpyAsync(dst, src, n, hipMemcpyDefault, handle),
                     "hipMemcpyAsync", size=n)

    def _check_size(self, n: int, what: str) -> None:
        if n > self._size:
            raise ValueError(f"{what} has {n} bytes, more than the buffer's {self._size}")

    def _copy_in(self, view: _HostView, stream: Any) -> None:
        ptr = self._live()
        self._check_size(view.nbytes, "obj")
        with view as (address, n):
            self._copy(ptr, address, n, stream, self._host_only)

    def copy_from_host(self, obj: Any, stream: Any = None) -> None:
        """Copy ``obj`` (C-contiguous, buffer protocol, at most ``size`` bytes) into the start
        of the buffer.  With ``stream`` the copy is asynchronous: keep ``obj`` alive and unchanged
        until the stream has done it."""
        self._live()
        if stream is not None:
            check_stream(stream)
        self._copy_in(_HostView(obj, "obj", False), stream)

    def copy_to_host(self, out: Any = None, stream: Any = None) -> Any:
        """Copy the buffer to ``out`` (writable, C-contiguous, at least ``size`` bytes: the
        start of a larger one is written) and return it; without ``out``, to a new
        ``bytearray``.  With ``stream`` the copy is asynchronous."""
        ptr = self._live()
        if stream is not None:
            check_stream(stream)
        target = bytearray(self._size) if out is None else out
        view = _HostView(target, "out", True)
        if view.nbytes < self._size:
            raise ValueError(f"out has {view.nbytes} bytes, fewer than the buffer's "
                             f"{self._size}")
        with view as (address, _):
            self._copy(address, ptr, self._size, stream, self._host_only)
        return target

    def copy_from_device(self, other: Any, stream: Any = None) -> None:
        """Copy ``other`` (a Buffer, or an object with ``__cuda_array_interface__``,
        C-contiguous, at most ``size`` bytes) into the start of this buffer."""
        ptr = self._live()
        if stream is not None:
            check_stream(stream)
        if isinstance(other, Buffer):
            src = other._live()
            n = other._size
            host = self._host_only and other._host_only
            producer = None
            src_device = other._device if other._memory_kind() == "device" else None
        else:
            src, n, producer = _cai_source(other)
            host = False
            src_device = None
        self._check_size(n, "other")
        if producer is not None:  # CAI v3: the producer's work must be complete
            stream_ref(producer).wait()
        if not n:
            return
        peer = None
        if not host and self._memory_kind() == "device":
            if src_device is None and not isinstance(other, Buffer):
                src_device = _pointer_device(src)
            dst_device = self._device
            if src_device is not None and dst_device is not None and src_device != dst_device:
                peer = (dst_device, src_device)
                if stream is None and isinstance(other, Buffer):
                    other._wait_own()   # its work on its own device's stream comes first
        self._copy(ptr, src, n, stream, host, peer)

    def _wait_own(self) -> None:
        """Wait for the work on this buffer's stream (on its device: null streams are per
        device)."""
        if self._host_only:
            return
        rt = _hip.get_runtime()
        device = self._device
        with on_device(device) if device is not None else _NO_SWITCH:
            rt.check(rt.fn.hipStreamSynchronize(self._stream._handle), "hipStreamSynchronize")

    def copy(self, resource: Any = None, stream: Any = None) -> "Buffer":
        """A new Buffer with the same contents, allocated from ``resource`` (default: this
        buffer's own resource) on ``stream``.  A resource of another device gives a copy on
        that device (a peer copy).  ``stream=None``: the copy is done when this returns; with a
        stream it is asynchronous on it."""
        self._live()
        if stream is not None:
            check_stream(stream)
        if resource is None:
            new = Buffer(self._size, resource=self._ref, stream=stream,
                         alignment=self._alignment)
        else:
            new = Buffer(self._size, resource=resource, stream=stream)
        try:
            new.copy_from_device(self, stream)
        except BaseException:
            new.close()
            raise
        return new

    def memset(self, value: int, stream: Any = None) -> None:
        """Set every byte to ``value`` (0..255)."""
        ptr = self._live()
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"value must be an int in [0, 255], not {type(value).__name__}")
        if not 0 <= value <= 255:
            raise ValueError(f"value={value} is not in [0, 255]")
        handle = None if stream is None else check_stream(stream)
        if not self._size:
            return
        if self._host_only:
            ctypes.memset(ptr, value, self._size)
            return
        rt = _hip.get_runtime()
        if handle is None:
            own = self._stream._handle
            device = self._device
            with on_device(device) if device is not None else _NO_SWITCH:
                if own == 0:
                    rt.check(rt.fn.hipMemset(ptr, value, self._size), "hipMemset",
                             size=self._size)
                    return
                rt.check(rt.fn.hipMemsetAsync(ptr, value, self._size, own),
                         "hipMemsetAsync", size=self._size)
                rt.check(rt.fn.hipStreamSynchronize(own), "hipStreamSynchronize")
        else:
            rt.check(rt.fn.hipMemsetAsync(ptr, value, self._size, handle), "hipMemsetAsync",
                     size=self._size)

    def tobytes(self, stream: Any = None) -> bytes:
        """A copy of the contents as ``bytes`` (with ``stream``: copied on it, and waited for)."""
        data = self.copy_to_host(stream=stream)
        if stream is not None and not self._host_only:
            stream_ref(stream).wait()
        return bytes(data)

    def __bytes__(self) -> bytes:
        return self.tobytes()

    def __copy__(self) -> "Buffer":
        return self.copy()

    # ---- growth (RMM's DeviceBuffer) ----
    def capacity(self) -> int:
        """The bytes allocated (at least ``size``): :meth:`resize` within it moves nothing."""
        return self._capacity

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + self._capacity

    def _handle_and_keep(self, stream: Any) -> Tuple[int, Any]:
        """The stream handle growth works on (``None``: the buffer's own stream) and the
        object to hold for it."""
        if stream is None:
            return self._stream._handle, self._keep
        handle = check_stream(stream)
        if handle == self._stream._handle:
            return handle, self._keep
        return handle, (None if type(stream) in (int, stream_ref) else stream)

    def _movable(self, what: str) -> None:
        self._live()
        dl = sys.modules.get("hipmr_ctypes._dlpack")
        if dl is not None and dl.exported(self):
            raise BufferError(f"Buffer.{what}: a DLPack consumer still uses this buffer's "
                              "memory")

    def _rearm(self, ptr: int, capacity: int, handle: int, keep: Any) -> None:
        """Own ``ptr`` (``capacity`` bytes, freed on the stream ``handle``) from now on, as
        ``__init__`` arms its finalizer."""
        self._ptr = ptr
        self._capacity = capacity
        self._finalizer = (weakref.finalize(self, _finalize, self._ref.deallocate_async, ptr,
                                            capacity, self._alignment, handle, keep)
                           if capacity else None)
        if capacity:
            _install_exit_hook()

    def _move_to_stream(self, handle: int, keep: Any) -> None:
        """Make ``handle`` the buffer's stream (its memory freed there), after the work queued
        on the current one."""
        if handle == self._stream._handle:
            return
        if not self._host_only and self._ptr:
            self._order_before(handle)
        fin = self._finalizer
        args = fin.detach() if fin is not None else None
        if args is not None:
            self._rearm(self._ptr, self._capacity, handle, keep)
        self._stream = stream_ref(handle)
        self._keep = keep

    def _reallocate(self, capacity: int, handle: int, keep: Any) -> None:
        """Move the contents (``size`` bytes) into a new allocation of ``capacity`` bytes
        made, filled and the old one freed in stream order on ``handle``; on failure the
        buffer is as it was."""
        ref, alignment, old_ptr = self._ref, self._alignment, self._ptr
        device = self._device
        with on_device(device) if device is not None and not self._host_only else _NO_SWITCH:
            if old_ptr and not self._host_only:
                self._order_before(handle)
            new_ptr = ref.allocate_async(capacity, alignment, handle)
            try:
                n = min(self._size, capacity)
                if n and old_ptr:
                    if self._host_only:
                        ctypes.memmove(new_ptr, old_ptr, n)
                    else:
                        rt = _hip.get_runtime()
                        rt.check(rt.fn.hipMemcpyAsync(new_ptr, old_ptr, n, hipMemcpyDefault,
                                                      handle), "hipMemcpyAsync", size=n)
                fin = self._finalizer
                args = fin.detach() if fin is not None else None
                if args is not None:
                    _, func, fargs, _ = args
                    dealloc, ptr, size, align, _, _ = fargs
                    try:
                        dealloc(ptr, size, align, handle)  # after the copy, on its stream
                    except BaseException:
                        self._finalizer = weakref.finalize(self, func, *fargs)  # still ours
                        raise
            except BaseException:
                ref.deallocate_async(new_ptr, capacity, alignment, handle)
                raise
        self._rearm(new_ptr, capacity, handle, keep)
        self._stream = stream_ref(handle)
        self._keep = keep
        self._kind = None if not old_ptr else self._kind

    def reserve(self, new_capacity: int, stream: Any = None) -> None:
        """Make room for ``new_capacity`` bytes: a larger capacity moves the contents into a
        new allocation (same resource and alignment); a smaller one does nothing.  The work
        is queued on ``stream`` (default: the buffer's own), which becomes the buffer's
        stream; ``size`` is unchanged.  ``BufferError`` while a DLPack consumer uses the
        memory."""
        new_capacity = check_size(new_capacity, "new_capacity")
        handle, keep = self._handle_and_keep(stream)
        self._movable("reserve")
        if new_capacity > self._capacity:
            self._reallocate(new_capacity, handle, keep)
        else:
            self._move_to_stream(handle, keep)

    def resize(self, new_size: int, stream: Any = None) -> None:
        """Make the buffer ``new_size`` bytes long, keeping the contents up to the smaller
        size: within :meth:`capacity` nothing moves; beyond it the contents move to a new
        allocation of exactly ``new_size`` bytes (see :meth:`reserve` for the stream)."""
        new_size = check_size(new_size, "new_size")
        handle, keep = self._handle_and_keep(stream)
        self._movable("resize")
        if new_size > self._capacity:
            self._reallocate(new_size, handle, keep)
        else:
            self._move_to_stream(handle, keep)
        self._size = new_size

    def release(self) -> "Buffer":
        """Move the allocation (contents, resource, stream, device) into a new Buffer and
        return it; this one is left empty (size 0, no memory) and usable."""
        self._movable("release")
        new = Buffer.__new__(Buffer)
        for name in ("_ptr", "_size", "_capacity", "_alignment", "_ref", "_stream", "_keep",
                     "_device", "_host_only", "_kind", "_closed"):
            setattr(new, name, getattr(self, name))
        fin = self._finalizer
        args = fin.detach() if fin is not None else None
        new._finalizer = None
        if args is not None:
            _, func, fargs, _ = args
            new._finalizer = weakref.finalize(new, func, *fargs)
        self._finalizer = None
        self._ptr = self._size = self._capacity = 0
        return new

    def prefetch(self, device: Any = None, stream: Any = None) -> None:
        """Prefetch managed memory to ``device`` (default: the current one) on ``stream``
        (default: the buffer's own); nothing happens for memory that is not managed."""
        ptr = self._live()
        target = get_device() if device is None else check_device(device)
        handle = self._stream._handle if stream is None else check_stream(stream)
        if not ptr or not self._size or self._host_only or self._memory_kind() != "managed":
            return
        prefetch_if_managed(ptr, self._size, target, handle)

    # ---- pickling: through the host, allocated again on the current device resource ----
    def __reduce_ex__(self, protocol: int) -> Tuple[Any, ...]:
        data = self.copy_to_host()
        if protocol >= 5:
            import pickle
            return (_unpickle, (pickle.PickleBuffer(data),))
        return (_unpickle, (bytes(data),))

    # ---- interop ----
    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3: 1-D ``uint8`` over the memory (device-accessible only)."""
        if self._host_only:
            raise AttributeError("__cuda_array_interface__: this Buffer holds host-only memory")
        ptr = self._live()
        handle = self._stream._handle
        return {"version": 3, "shape": (self._size,), "typestr": "|u1", "data": (ptr, False),
                "strides": None, "stream": handle if handle else None}

    def _memory_kind(self) -> str:
        """"device", "pinned", "managed" or "host" (host-only memory)."""
        kind = self._kind
        if kind is None:
            kind = self._kind = _memory_kind(self)
        return kind

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)``: kDLCUDA / kDLROCM with the device for device memory,
        kDLCUDAHost / kDLROCMHost for pinned memory, kDLCUDAManaged for managed memory on
        nvidia (kDLROCM on amd), kDLCPU for host memory, and kDLCPU for everything on the
        emulated platform (whose memory is host memory)."""
        from . import _dlpack as dl
        self._live()
        kind = self._memory_kind()
        if kind == "host":
            return (dl.kDLCPU, 0)
        platform = _hip.get_runtime().platform
        if platform == "emulated":
            return (dl.kDLCPU, 0)
        amd = platform == "amd"
        device = self._device or 0
        if kind == "pinned":
            return (dl.kDLROCMHost if amd else dl.kDLCUDAHost, 0)
        if kind == "managed" and not amd:
            return (dl.kDLCUDAManaged, device)
        return (dl.kDLROCM if amd else dl.kDLCUDA, device)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule over the memory (1-D ``uint8``): ``"dltensor_versioned"`` when
        ``max_version >= (1, 0)``, else ``"dltensor"``.  ``stream``: the consumer's stream
        (None = the default stream, -1 = no synchronization): it waits for the buffer's
        stream.  ``copy=True`` and another ``dl_device`` raise BufferError."""
        from . import _dlpack as dl
        ptr = self._live()
        if copy:
            raise BufferError("Buffer.__dlpack__: copy=True is not supported (export shares "
                              "the memory)")
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"Buffer.__dlpack__: the memory is on DLPack device {device}, "
                              f"not {tuple(dl_device)}")
        if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)):
            raise TypeError(f"stream must be an int or None, not {type(stream).__name__}")
        if device[0] != dl.kDLCPU and stream != -1:
            self._order_before(0 if stream is None else stream)
        versioned = False
        if max_version is not None:
            try:
                versioned = tuple(max_version)[0] >= dl.DLPACK_MAJOR
            except (TypeError, IndexError):
                raise TypeError(f"max_version must be a (major, minor) tuple, not "
                                f"{max_version!r}") from None
        return dl.export(self, ptr, self._size, device, versioned)

    def _order_before(self, consumer: int) -> None:
        """Make work later queued on ``consumer`` wait for the buffer's stream."""
        own = self._stream._handle
        legacy = (0, 1)
        if consumer == own or (own in legacy and consumer in legacy):
            return
        with event_for(own) as event:  # on own's device (hipEventDisableTiming)
            event.record(own)
            wait_event(consumer, event)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._ptr:#x}"
        return (f"<Buffer {state} size={self._size} device={self._device} "
                f"stream={self._stream!r} resource={self._ref.resource!r}>")


_NO_SWITCH = nullcontext()


def memory_device(resource: Any) -> Optional[int]:
    """The device the memory of ``resource`` lives on: its ``device`` when that is an int, else
    the first such ``device`` below it through ``upstream_resource()`` (adaptors, refs); None
    when no resource of the stack names one."""
    for _ in range(64):  # a stack deeper than this is a cycle
        if isinstance(resource, resource_ref):
            resource = resource.resource
        device = getattr(resource, "device", None)
        if type(device) is int:
            return device
        upstream = getattr(resource, "upstream_resource", None)
        if not callable(upstream):
            return None
        try:
            resource = upstream()
        except Exception:  # noqa: BLE001 - a user object's method: no device known
            return None
    return None


def _pointer_device(ptr: int) -> Optional[int]:
    """The device of device-only memory at ``ptr`` (hipPointerGetAttributes), else None."""
    rt = _hip.get_runtime()
    attrs = hipPointerAttribute_t()
    if rt.fn.hipPointerGetAttributes(attrs, ptr):
        rt.clear_last_error()
        return None
    if rt.platform == "amd" and rt.runtime_version()[0] < 6:
        table = MEMORY_TYPE_5
    else:
        table = MEMORY_TYPE_6
    return attrs.device if table.get(attrs.type) == "device" and not attrs.isManaged else None


def _unpickle(data: Any) -> Buffer:
    return Buffer.from_host(data)


def _cai_source(obj: Any) -> Tuple[int, int, Optional[int]]:
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


def _memory_kind(buf: Buffer) -> str:
    props = _declared(buf._ref.resource)
    if buf._host_only:
        return "host"
    if host_accessible not in props:
        return "device"
    # device- and host-accessible: pinned or managed.  Our own resources (also under adaptors
    # that name their upstream) say which; otherwise ask the runtime about the pointer.
    resource = buf._ref.resource
    for _ in range(32):
        if isinstance(resource, ManagedMemoryResource):
            return "managed"
        if isinstance(resource, PinnedMemoryResource):
            return "pinned"
        upstream = getattr(resource, "upstream_resource", None)
        if upstream is None:
            break
        resource = upstream()
        if isinstance(resource, resource_ref):
            resource = resource.resource
    if not buf._ptr:
        return "pinned"
    rt = _hip.get_runtime()
    attrs = hipPointerAttribute_t()
    if rt.fn.hipPointerGetAttributes(attrs, buf._ptr):
        return "pinned"
    if attrs.isManaged:
        return "managed"
    if rt.platform == "amd":
        table = MEMORY_TYPE_6 if rt.runtime_version()[0] >= 6 else MEMORY_TYPE_5
    else:
        table = MEMORY_TYPE_6
    return "managed" if table.get(attrs.type, "") in ("managed", "unified") else "pinned"

"""``Buffer``: one owning allocation made through any async resource (RMM's ``DeviceBuffer``),
with host / device copies, ``__cuda_array_interface__`` and DLPack export.

This module keeps the class, its construction and its lifetime (free, close, growth); what a
buffer knows of its resource is in ``_buffer.state``, the copies and patterns in
``_buffer.copies``, host views in ``_buffer.host_views``, foreign memory in ``_buffer.foreign``
(``_buffer.contract`` says what those helpers read of a Buffer), and what memory is where in
``_memory_query``."""
from __future__ import annotations

import ctypes
import operator
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, SupportsIndex, Tuple

from . import _hip
from ._checks import FAST_ALIGNMENTS, check_alignment, check_size, check_stream
from ._exit import _state as _exit_state, warn_failed_free
from ._limits import MAX_ADDRESS, MAX_ONE_DIGIT_INT
from ._locks import atomic_slot
from ._buffer import state as _buffer_state
from ._buffer.state import _State, _current_entry, _shared_state, _state_for
from ._buffer.copies import (HostView, cai_source, check_fits, check_writable, copy_from_device,
                      copy_in, copy_to_host, fill, memset, readonly, tobytes)
from ._hip.types import hipMemcpyDefault
from ._memory_query import memory_kind, pointer_kind
from .concepts import AsyncResource
from . import device as _device_module
from .device import (Device, current_device_function as _current_device, on_device,
                     on_device_or_current, prefetch_if_managed)
from .device import _NO_SWITCH   # _wait_own alone (everything else: on_device_or_current)
from .properties import DEFAULT_ALIGNMENT
from .resource_refs import async_resource_ref, resource_ref
from .resources import get_per_device_resource
from .stream import Stream, event_for, wait_event
from .stream_refs import stream_ref

if TYPE_CHECKING:
    from .ipc import IpcBufferDescriptor

__all__ = ["Buffer"]

# Bound by assignment, not imported: CPython 3.11 compiles a method call on an imported name
# (``_current.get``) as a module attribute load, which costs the hot path a slow look-up.
_current = _buffer_state._current

# ---- freeing ------------------------------------------------------------------------------------

_CLOSED = "buffer: this Buffer is closed"


# ---- the buffer ---------------------------------------------------------------------------------

class Buffer:
    """One allocation of ``size`` bytes made through ``resource`` (an async resource or an
    ``async_resource_ref``; default: the current device's resource) on ``stream`` (default: the
    null stream), aligned to ``alignment``.

    Freed exactly once, in stream order on the allocation stream: by ``close()`` (optionally
    on another stream; a failed free leaves the buffer owning the memory), by the context
    manager, or when the buffer is garbage-collected.  At interpreter exit the garbage
    collector frees nothing: a buffer still alive stays valid until the process ends (its
    memory may still be read through views the package cannot see), while ``close()`` still
    frees.  The buffer holds the resource and the stream object it was given, so neither goes
    away before the memory.  Without ``resource``, the resource of the calling thread's
    current device is used (with one device visible, found without a runtime call).

    Copies (``copy_from_host``, ``copy_to_host``, ``copy_from_device``, ``memset``) take
    ``stream=None`` for a synchronous copy ordered after the work on the buffer's stream, or a
    stream for an asynchronous one the caller synchronizes.  Host-only memory (a resource
    without ``device_accessible``) is copied with ``ctypes.memmove``.  After ``close()`` every
    data access raises ValueError; ``size``, ``resource``, ``stream`` and ``device`` stay
    readable.
    """

    __slots__ = ("_ptr", "_size", "_ref", "_handle", "_free", "_state", "__weakref__")
    # _ref: the resource or ref given; _handle: the stream's handle; _free: its
    # deallocate_async while the buffer owns memory, else unset (deleting the slot, which
    # only one caller can do, is the claim that frees the memory exactly once: see _claim);
    # _state: the rest (see _State).
    _ptr: int
    _size: int
    _ref: Any
    _handle: int
    _free: Callable[..., Any]
    _state: _State

    def __init__(self, size: int = 0, *, resource: Any = None, stream: Any = None,
                 alignment: int = DEFAULT_ALIGNMENT) -> None:
        if (stream is None and alignment is DEFAULT_ALIGNMENT and type(size) is int
                and size > 0 and size <= MAX_ONE_DIGIT_INT):  # the usual: every argument checked
            if resource is None:  # the current device's resource
                devices = _device_module._devices  # the cached function, unless the runtime changed
                device = (devices[1] if devices[0] is _hip._runtime and devices[0] is not None
                          else _current_device())()
                entry = _current.get(device)
                resource, state = _current_entry(device) if entry is None else entry
            else:
                state = _buffer_state._last
                target = state.owner()
                if target is not resource and (type(resource) is not state.ref_class
                                               or resource.resource is not target):
                    state = _state_for(resource, DEFAULT_ALIGNMENT, None, None)
            self._ref = resource
            self._size = size
            self._handle = 0
            self._state = state
            self._ptr = resource.allocate_async(size, DEFAULT_ALIGNMENT, 0)
            self._free = resource.deallocate_async
        else:
            self._init(size, resource, stream, alignment)

    def _init(self, size: Any, resource: Any, stream: Any, alignment: Any) -> None:
        """``__init__`` for every call but the usual one: the same, checking everything."""
        if type(size) is not int or size < 0 or size > MAX_ONE_DIGIT_INT:
            size = check_size(size, "size")
        if alignment is not DEFAULT_ALIGNMENT and FAST_ALIGNMENTS.get(alignment) is not alignment:
            alignment = check_alignment(alignment, None)
        keep = None
        if stream is None:
            handle = 0
        elif type(stream) is int and 0 <= stream <= MAX_ADDRESS:
            handle = stream
        else:
            handle = check_stream(stream)
            keep = None if type(stream) is stream_ref else stream
        device = None
        if resource is None:  # the current device's resource
            device = _current_device()()
            resource = get_per_device_resource(device)
        state = _state_for(resource, alignment, keep, device)
        self._ref = resource
        self._size = size
        self._handle = handle
        self._state = state
        if size:
            self._ptr = resource.allocate_async(size, alignment, handle)
            self._free = resource.deallocate_async
        else:
            self._ptr = 0
            if state.shared:
                self._state = state.empty_twin
            else:
                state.gone = True

    def __del__(self, _keep: Dict[str, bool] = _exit_state,
                _failed: Callable[..., None] = warn_failed_free) -> None:
        """Garbage collection: free, never raise (a failure is a warning, but not while the
        interpreter shuts down).  Uses nothing but the buffer and its arguments: it may run
        while the interpreter tears modules down."""
        try:
            state = self._state
        except AttributeError:  # __init__ did not get that far
            return
        if state.gone or _keep["keep"]:  # nothing to free; or exiting (hipmr_ctypes._exit)
            return
        try:
            free = self._free
            del self._free   # the claim
        except AttributeError:  # no memory owned
            return
        try:
            if state.plain:
                self._state = state.closed_twin
                free(self._ptr, self._size, state.alignment, self._handle)
            else:
                if not state.shared:
                    state.closed = True
                self._free_now(free, None)
        except Exception as exc:  # noqa: BLE001
            _failed("Buffer", self._ptr, self._capacity, exc)

    def _claim(self) -> Optional[Callable[..., Any]]:
        """The free function, taken by this caller alone (None: the buffer owns no memory,
        or another thread took it)."""
        try:
            free = self._free
            del self._free   # fails for all but one caller
        except AttributeError:
            return None
        return free

    def _mutable(self) -> _State:
        """The buffer's own state (a copy of the shared one, made now if need be)."""
        state = self._state
        if state.shared:
            state = self._state = state.copy()
        if state.capacity is None:
            state.capacity = self._size
        return state

    @property
    def _capacity(self) -> int:
        capacity = self._state.capacity
        return self._size if capacity is None else capacity

    @property
    def _device(self) -> Optional[int]:
        return self._state.device

    @property
    def _host_only(self) -> bool:
        return self._state.host_only

    @property
    def _alignment(self) -> int:
        return self._state.alignment

    @property
    def _keep(self) -> Any:
        return self._state.keep

    def _mark_closed(self, freed: bool = False) -> None:
        """Closed; ``freed``: its memory was given back here (the collector has nothing to
        claim then)."""
        state = self._state
        if state.shared:
            self._state = state.closed_twin
        else:
            state.closed = True
            if freed:
                state.gone = True

    def _free_now(self, free: Callable[..., Any], handle: Optional[int]) -> None:
        """Free the memory on ``handle`` (None: the buffer's stream).  A stream object the
        buffer holds that was closed meanwhile cannot be used any more (HIP 7 crashes on
        destroyed streams): the device is synchronized and the memory freed on the null
        stream instead."""
        state = self._state
        if handle is None:
            handle = self._handle
            keep = state.keep
            if keep is not None and isinstance(keep, Stream) and keep.closed:
                Device(keep.device).synchronize()
                handle = 0
        free(self._ptr, self._capacity, state.alignment, handle)

    @classmethod
    def _adopt(cls, ptr: int, size: int, resource: Any, device: int) -> "Buffer":
        """A Buffer over memory that exists already (``ptr``, ``size`` > 0, on ``device``),
        given back by ``resource.deallocate_async`` on the null stream like any Buffer's: the
        imported buffers of ``Buffer.from_ipc``, whose resources unmap."""
        self = cls.__new__(cls)
        self._size = size
        self._ref = async_resource_ref(resource)
        state = self._state = _shared_state(device, False).copy()
        state.kind = "device"
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
        from .ipc import describe
        ptr = self._live()
        self._own_stream()   # a closed stream's handle never reaches the runtime
        if not self._size:
            raise ValueError("an empty Buffer has no memory to share")
        return describe(ptr, self._size, self._memory_kind(), self.device,
                        self.resource, self._wait_own)

    @classmethod
    def from_ipc(cls, descriptor: "IpcBufferDescriptor", resource: Any = None) -> "Buffer":
        """A Buffer mapping the memory another process exported with :meth:`export_ipc`.
        Pool memory needs ``resource``, the importing resource of its pool
        (``AsyncMemoryResource.from_ipc(handle)``; a descriptor of another pool is a
        ValueError); legacy (``hipMalloc``) memory needs none.  Closing the Buffer unmaps the
        memory; it never frees the exporter's."""
        from .ipc import map_descriptor
        ptr, owner = map_descriptor(descriptor, resource)
        size = descriptor.size
        try:
            return Buffer._adopt(ptr, size, owner, descriptor.device)
        except BaseException:
            owner.deallocate_async(ptr, size, DEFAULT_ALIGNMENT, 0)   # unmapped again
            raise

    # ---- construction helpers ----
    @classmethod
    def from_host(cls, obj: Any, *, resource: Any = None, stream: Any = None) -> "Buffer":
        """A new buffer holding a copy of ``obj`` (anything C-contiguous with the buffer
        protocol).  With ``stream``, the copy is asynchronous on it."""
        view = HostView(obj, "obj", False)
        buf = cls(view.nbytes, resource=resource, stream=stream)
        try:
            copy_in(buf, view, stream)
        except BaseException:
            buf.close()
            raise
        return buf

    # ---- attributes ----
    def _live(self) -> int:
        if self._state.closed:
            raise ValueError(_CLOSED)
        return self._ptr

    def _own_stream(self) -> int:
        """The handle of the buffer's own stream, for a native call; ValueError when the
        :class:`Stream` object the buffer holds was closed (its destroyed handle must never
        reach the runtime: HIP 7 and CUDA crash on one)."""
        keep = self._state.keep
        if keep is not None and type(keep) is Stream and keep.closed:
            raise ValueError(f"buffer: this Buffer's stream ({keep!r}) was closed; pass a "
                             "live stream to close(stream=...) to free it, or keep the "
                             "stream open while the buffer is used")
        return self._handle

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
        return self._state.alignment

    @property
    def resource(self) -> AsyncResource:
        """The resource the memory came from."""
        ref = self._ref
        resource: AsyncResource = ref.resource if isinstance(ref, resource_ref) else ref
        return resource

    @property
    def stream(self) -> stream_ref:
        """The stream the memory was allocated on (and is freed on by default).  ValueError
        when it is a :class:`Stream` that was closed: its handle was destroyed, and a
        ``stream_ref`` of it would hand it to the runtime."""
        return stream_ref(self._own_stream())

    @property
    def device(self) -> Optional[int]:
        """The device the memory lives on: the ``device`` of the resource, or of the first
        resource below it that names one (through any stack of adaptors), else the device
        current at allocation; None for host-only memory.  For a resource that declares no
        properties, what the runtime says of the memory (None for memory it does not know:
        host memory), the same answer ``__dlpack_device__`` gives."""
        state = self._state
        if state.asks and state.kind is None and not state.closed:
            self._memory_kind()
            state = self._state
        return state.device

    @property
    def closed(self) -> bool:
        """True once the memory was given back (or, while DLPack consumers still use it, will
        be when the last one lets it go)."""
        return self._state.closed

    def __len__(self) -> int:
        return self._size

    # ---- lifetime ----
    def close(self, stream: Any = None) -> None:
        """Free the memory (idempotent), in stream order on ``stream`` (default: the allocation
        stream).

        If the free fails, the error propagates and the buffer still owns the memory: a later
        ``close()`` (or garbage collection) tries again.  While a DLPack consumer still uses the
        memory, the buffer only becomes closed here; the memory is freed (on the allocation
        stream) once the last consumer lets it go.  A ``close()`` racing another thread's
        returns at once, leaving the free to the other: the buffer is closed when that free
        returns (or still owns the memory, if it fails).
        """
        state = self._state
        if state.plain and stream is None:
            try:
                free = self._free
                del self._free   # the claim
            except AttributeError:  # another thread's close() is freeing it and decides
                return
            try:  # (a plain buffer has the default alignment)
                free(self._ptr, self._size, DEFAULT_ALIGNMENT, self._handle)
            except BaseException:
                self._free = free  # still ours
                raise
            self._state = state.closed_twin
        elif not state.closed:
            self._close(stream)  # another stream, a stream object held, or maybe exported

    def _close(self, stream: Any) -> None:
        handle = None if stream is None else check_stream(stream)
        _not_viewed(self, "close")
        dl = sys.modules.get("hipmr_ctypes._buffer.dlpack")
        if dl is not None and dl.exported(self):
            self._mark_closed()
            if dl.exported(self):
                return  # freed by the last export's deleter (_exports_released)
            # the last consumer let go meanwhile, before it could see the buffer closed
        free = self._claim()
        if free is None:
            if not self._state.plain:  # else another thread's close() frees it and decides
                self._mark_closed()
            return
        try:
            self._free_now(free, handle)
        except BaseException:
            self._free = free  # still ours
            raise
        self._mark_closed(freed=True)

    def _exports_released(self) -> None:
        """The last DLPack consumer let the memory go (``_buffer.dlpack``'s deleter): a buffer
        closed meanwhile frees it now, on its allocation stream (on the null stream after a
        device synchronization when that :class:`Stream` was closed).  Runs inside a C
        callback: a failed free is a warning, and the buffer keeps the memory (the garbage
        collector tries again)."""
        if not self._state.closed or _exit_state["keep"]:
            return
        free = self._claim()
        if free is None:
            return
        try:
            self._free_now(free, None)
        except Exception as exc:  # noqa: BLE001 - nothing may leave a C callback
            self._free = free   # still ours
            warn_failed_free("Buffer", self._ptr, self._capacity, exc)
            return
        self._mark_closed(freed=True)

    def __enter__(self) -> "Buffer":
        self._live()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- copies (the work is in _buffer/copies.py) ----
    def copy_from_host(self, obj: Any, stream: Any = None) -> None:
        """Copy ``obj`` (C-contiguous, buffer protocol, at most ``size`` bytes) into the start
        of the buffer.  With ``stream`` the copy is asynchronous: keep ``obj`` alive and unchanged
        until the stream has done it."""
        self._live()
        check_writable(self, "copy_from_host")
        self._own_stream()
        if stream is not None:
            check_stream(stream)
        copy_in(self, HostView(obj, "obj", False), stream)

    def copy_to_host(self, out: Any = None, stream: Any = None) -> Any:
        """Copy the buffer to ``out`` (writable, C-contiguous, at least ``size`` bytes: the
        start of a larger one is written) and return it; without ``out``, to a new
        ``bytearray``.  With ``stream`` the copy is asynchronous."""
        return copy_to_host(self, out, stream)

    def copy_from_device(self, other: Any, stream: Any = None) -> None:
        """Copy ``other`` (a Buffer, or an object with ``__cuda_array_interface__``,
        C-contiguous, at most ``size`` bytes) into the start of this buffer."""
        ptr = self._live()
        check_writable(self, "copy_from_device")
        self._own_stream()
        if stream is not None:
            check_stream(stream)
        source: Optional[Buffer] = None
        if isinstance(other, Buffer):
            source = other
            src = other._live()
            other._own_stream()
            n = other._size
            host = self._host_only and other._host_only
            producer = None
            src_kind: Optional[str] = other._memory_kind()
            src_device = other._device if src_kind == "device" else None
        else:
            src, n, producer = cai_source(other)
            host = False
            src_device = None
            src_kind = None
        check_fits(self, n, "other")
        if producer is not None:  # CAI v3: the producer's work must be complete
            stream_ref(producer).wait()
        copy_from_device(self, ptr, source, src, n, stream, host, src_device, src_kind)

    def _wait_own(self) -> None:
        """Wait for the work on this buffer's stream (on its device: null streams are per
        device)."""
        if self._host_only:
            return
        rt = _hip.get_runtime()
        device = self._device
        with on_device(device) if device is not None else _NO_SWITCH:
            rt.check(rt.fn.hipStreamSynchronize(self._own_stream()), "hipStreamSynchronize")

    def copy(self, resource: Any = None, stream: Any = None) -> "Buffer":
        """A new Buffer with the same contents, allocated from ``resource`` (default: this
        buffer's own resource) on ``stream``.  A resource of another device gives a copy on
        that device (a peer copy).  ``stream=None``: the copy is done when this returns; with a
        stream it is asynchronous on it."""
        self._live()
        self._own_stream()
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
        memset(self, value, stream)

    def tobytes(self, stream: Any = None) -> bytes:
        """A copy of the contents as ``bytes`` (with ``stream``: copied on it, and waited for).
        The copy lands in the new ``bytes`` object itself: no zero-filled staging and no
        second copy."""
        return tobytes(self, stream)

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
            return self._own_stream(), self._keep
        handle = check_stream(stream)
        if handle == self._handle:
            return handle, self._keep
        return handle, (None if type(stream) in (int, stream_ref) else stream)

    def _movable(self, what: str) -> None:
        self._live()
        self._own_stream()
        dl = sys.modules.get("hipmr_ctypes._buffer.dlpack")
        if dl is not None and dl.exported(self):
            raise BufferError(f"Buffer.{what}: a DLPack consumer still uses this buffer's "
                              "memory")
        _not_viewed(self, what)

    def _rearm(self, ptr: int, capacity: int, handle: int, keep: Any) -> None:
        """Own ``ptr`` (``capacity`` bytes, freed on the stream ``handle``) from now on, as
        ``__init__`` does."""
        state = self._mutable()
        self._ptr = ptr
        state.capacity = capacity
        self._handle = handle
        state.keep = keep
        if capacity:
            self._free = self._ref.deallocate_async
        else:
            self._claim()
        state.gone = not capacity   # the collector skips a buffer that owns nothing

    def _move_to_stream(self, handle: int, keep: Any) -> None:
        """Make ``handle`` the buffer's stream (its memory freed there), after the work queued
        on the current one."""
        if handle == self._handle:
            return
        if not self._host_only and self._ptr:
            self._order_before(handle)
        self._handle = handle
        self._mutable().keep = keep

    def _reallocate(self, capacity: int, handle: int, keep: Any) -> None:
        """Move the contents (``size`` bytes) into a new allocation of ``capacity`` bytes
        made, filled and the old one freed in stream order on ``handle``; on failure the
        buffer is as it was."""
        ref, alignment, old_ptr = self._ref, self._alignment, self._ptr
        device = self._device
        with on_device_or_current(None if self._host_only else device):
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
                dealloc = self._claim()
                if dealloc is not None:
                    try:
                        # after the copy, on its stream
                        dealloc(old_ptr, self._capacity, alignment, handle)
                    except BaseException:
                        self._free = dealloc  # still ours
                        raise
            except BaseException:
                ref.deallocate_async(new_ptr, capacity, alignment, handle)
                raise
        self._rearm(new_ptr, capacity, handle, keep)
        if not old_ptr:
            self._state.kind = None   # made the buffer's own by _rearm

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
        self._mutable()   # the capacity stays when the size changes
        self._size = new_size

    def release(self) -> "Buffer":
        """Move the allocation (contents, resource, stream, device, and the ``owner`` of
        :meth:`from_handle`) into a new Buffer and return it; this one is left empty (size 0,
        no memory) and usable."""
        self._movable("release")
        new = Buffer.__new__(Buffer)
        for name in ("_ptr", "_size", "_ref", "_handle", "_state"):
            setattr(new, name, getattr(self, name))
        free = self._claim()
        if free is not None:
            new._free = free
        foreign = sys.modules.get("hipmr_ctypes._buffer.foreign")
        if foreign is not None:   # from_handle(owner=...): the owner goes with the memory
            foreign.move_owner(self, new)
        state = self._state
        self._state = state if state.shared else state.copy()  # one state per buffer
        self._ptr = self._size = 0
        state = self._mutable()
        state.capacity = 0
        state.gone = True
        return new

    def prefetch(self, device: Any = None, stream: Any = None) -> None:
        """Prefetch managed memory to ``device`` (default: the current one; ``"host"``: to the
        host) on ``stream`` (default: the buffer's own); nothing happens for memory that is
        not managed."""
        ptr = self._live()
        target = _device_module.prefetch_target(device)
        handle = self._own_stream() if stream is None else check_stream(stream)
        if not ptr or not self._size or self._host_only or self._memory_kind() != "managed":
            return
        prefetch_if_managed(ptr, self._size, target, handle)

    # ---- managed-memory control: advice and discarding (device.advise / device.discard) ----
    def advise(self, advice: str, device: Any = None, *, unset: bool = False) -> None:
        """Advise the runtime about this managed memory (``hipMemAdvise``): ``advice`` is
        ``"read_mostly"``, ``"preferred_location"``, ``"accessed_by"`` or ``"coarse_grain"``
        (AMD's: NotSupportedError on the nvidia platform); ``device``: the device it names
        (default: the current one; ``"host"`` for the preferred location or an accessor);
        ``unset=True`` withdraws it.  Memory that is not managed is a ValueError, raised
        before any native call like every bad argument."""
        ptr = self._live()
        kind = "host" if self._host_only else self._memory_kind()
        _device_module.advise(ptr, self._size, kind, advice, device, unset)

    def discard(self, stream: Any = None) -> None:
        """Tell the runtime the contents of this managed memory are no longer needed
        (``hipMemDiscardBatchAsync``, on ``stream``, default the buffer's own): its pages may
        be dropped instead of migrated, and reading it before writing it again gives
        indeterminate bytes.  NotSupportedError where the runtime lacks the call (ROCm before
        7.2); memory that is not managed is a ValueError."""
        ptr = self._live()
        handle = self._own_stream() if stream is None else check_stream(stream)
        kind = "host" if self._host_only else self._memory_kind()
        _device_module.discard(ptr, self._size, kind, handle)

    # ---- pickling: through the host, allocated again on the current device resource ----
    def __reduce_ex__(self, protocol: SupportsIndex) -> Tuple[Any, ...]:
        protocol = operator.index(protocol)
        if protocol >= 5:
            import pickle
            return (_unpickle, (pickle.PickleBuffer(self.copy_to_host()),))
        return (_unpickle, (self.tobytes(),))

    # ---- interop ----
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """CUDA Array Interface v3: 1-D ``uint8`` over the memory (device-accessible only);
        ``data`` is ``(ptr, True)`` for memory its producer marked read-only."""
        if self._host_only:
            raise AttributeError("__cuda_array_interface__: this Buffer holds host-only memory")
        ptr = self._live()
        if self._memory_kind() == "host":   # a resource that declares nothing, over host memory
            raise AttributeError("__cuda_array_interface__: this Buffer holds host memory")
        handle = self._own_stream()
        return {"version": 3, "shape": (self._size,), "typestr": "|u1",
                "data": (ptr, readonly(self)), "strides": None,
                "stream": handle if handle else None}

    def _memory_kind(self) -> str:
        """"device", "pinned", "managed" or "host" (host-only memory), found once.  For a
        resource that declares no properties the runtime's answer for the pointer also gives
        the buffer's device (None for host memory): one answer for ``device`` and DLPack."""
        kind = self._state.kind
        if kind is None:
            state = self._mutable()
            if state.asks:
                found, device = pointer_kind(self._ptr)
                kind = found or "host"
                if kind == "host":
                    state.device = None
                elif device is not None:
                    state.device = device
            else:
                kind = memory_kind(self.resource, self._ptr, self._host_only)
            state.kind = kind
        return kind

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)``: kDLCUDA / kDLROCM with the device for device memory,
        kDLCUDAHost / kDLROCMHost for pinned memory, kDLCUDAManaged for managed memory on
        nvidia (kDLROCM on amd), kDLCPU for host memory, and kDLCPU for everything on the
        emulated platform (whose memory is host memory)."""
        from ._buffer import dlpack as dl
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
        stream.  ``copy=True`` and another ``dl_device`` raise BufferError.  Memory its
        producer marked read-only is exported with DLPack's read-only flag, so only as a
        versioned capsule (a legacy request raises BufferError, as NumPy's does)."""
        from ._buffer import dlpack as dl
        ptr = self._live()
        self._own_stream()
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
            versioned = dl.check_max_version(max_version)[0] >= dl.DLPACK_MAJOR
        frozen = readonly(self)
        if frozen and not versioned:
            raise BufferError("Buffer.__dlpack__: this Buffer views read-only memory, which "
                              "only a versioned DLPack capsule can mark read-only: pass "
                              "max_version=(1, 0) or later")
        return dl.export(self, ptr, self._size, device, versioned, frozen)

    def _order_before(self, consumer: int) -> None:
        """Make work later queued on ``consumer`` wait for the buffer's stream."""
        own = self._own_stream()
        legacy = (0, 1)
        if consumer == own or (own in legacy and consumer in legacy):
            return
        with event_for(own) as event:  # on own's device (hipEventDisableTiming)
            event.record(own)
            wait_event(consumer, event)

    # ---- foreign memory, patterns (_buffer/copies.py), host views (_buffer/host_views.py) ----
    @classmethod
    def from_handle(cls, ptr: int, size: int, *, owner: Any = None, resource: Any = None,
                    device: Any = None, stream: Any = None) -> "Buffer":
        """A Buffer over ``size`` bytes at ``ptr`` that some other code allocated.

        Without ``resource``: a view.  It frees nothing; it holds ``owner`` (any object: the
        array or allocation the memory belongs to) until it is closed or dropped, after the
        work queued on its stream is done.  Its ``resource`` is a ``ForeignMemory``, which
        allocates nothing (``copy()`` needs ``resource=``; ``resize`` past the size raises
        BufferError).  With ``resource``: the Buffer owns the memory and frees it exactly once
        through ``resource.deallocate_async`` on ``stream``, as if it had allocated it there
        (``owner``, if given, is then held as long as the Buffer).

        ``device`` (default: found from the pointer) and the memory's kind (device, pinned,
        managed or plain host memory) come from ``hipPointerGetAttributes``; memory the runtime
        does not know is host memory (``device`` None).  ``stream`` (default: the null stream)
        is the Buffer's stream.  A negative or non-int ``ptr`` or ``size``, ``ptr`` 0 with a
        size, an unknown device or a closed stream: TypeError / ValueError before any native
        call."""
        from ._buffer.foreign import from_handle
        return from_handle(ptr, size, owner, resource, device, stream, Buffer._over)

    @classmethod
    def from_dlpack(cls, obj: Any) -> "Buffer":
        """A zero-copy Buffer view of another library's C-contiguous array (CuPy, PyTorch,
        NumPy, JAX, a Buffer: anything with ``__dlpack__``), ``nbytes`` long.

        It asks for a DLPack 1.x capsule (``max_version=(1, 0)``; a producer without
        ``max_version`` gives a legacy one), takes ownership of it, and calls the producer's
        deleter exactly once, when the view is closed or dropped (after the work queued on its
        stream), so the producer's memory stays valid as long as the view.  Non-contiguous
        arrays, sub-byte dtypes and memory of another platform raise ValueError (the capsule
        is then left unused: its own destructor lets the producer go).  A tensor its producer
        marked read-only gives a read-only view (writes raise BufferError)."""
        from ._buffer.foreign import from_dlpack
        return from_dlpack(obj, Buffer._over)

    @classmethod
    def _over(cls, ptr: int, size: int, ref: Any, kind: str, device: Optional[int],
              handle: int, keep: Any, owns: bool) -> "Buffer":
        """A Buffer over ``[ptr, ptr + size)`` of ``kind`` memory, given back through
        ``ref.deallocate_async`` (on the stream ``handle``) when ``owns``: the Buffers of
        :meth:`from_handle` and :meth:`from_dlpack` (built by ``_buffer.foreign``)."""
        host_only = kind == "host"
        if device is None and not host_only:
            device = _current_device()()
        self = cls.__new__(cls)
        self._size = size
        self._ref = ref
        state = self._state = _shared_state(None if host_only else device, host_only).copy()
        state.kind = kind
        state.keep = keep
        state.capacity = size
        self._ptr = ptr
        self._handle = handle
        if owns:
            self._free = ref.deallocate_async
        state.gone = not owns
        return self

    def fill(self, value: int, width: int = 1, stream: Any = None) -> None:
        """Write ``value`` as a ``width``-byte pattern (1, 2 or 4; native byte order) over the
        whole buffer: hipMemsetD8 / D16 / D32, or their Async forms on ``stream`` (``None``:
        done when this returns, after the work on the buffer's stream).  ``value`` may be
        unsigned or signed (``-1`` with width 4 is ``0xFFFFFFFF``).  A width other than 1, 2,
        4, a value that does not fit, a size that is not a multiple of ``width`` or an address
        not aligned to it: ValueError before any native call."""
        fill(self, value, width, stream)

    def host_view(self, readonly: bool = False) -> memoryview:
        """A writable 1-D ``memoryview`` (format ``B``) of host-accessible memory (host,
        pinned, managed), on every Python version; ``memoryview(buf)`` is the same on Python
        3.12+.  Device memory raises BufferError.  While the view (or anything made from it)
        is alive, ``close()``, ``resize()``, ``reserve()`` and ``release()`` raise BufferError;
        release it (``view.release()``, or ``with buf.host_view() as view:``) first.  The view
        does not wait for queued GPU work: synchronize first."""
        from ._buffer.host_views import host_view
        return host_view(self, readonly)

    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int) -> memoryview:
            """The buffer protocol (Python 3.12+): :meth:`host_view`."""
            from ._buffer.host_views import buffer_export
            return buffer_export(self, flags)

        def __release_buffer__(self, view: memoryview) -> None:
            """The end of a ``memoryview(buf)``: the view from :meth:`__buffer__` is released
            (and the buffer unpinned once no other view of it is alive)."""
            view.release()

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else f"{self._ptr:#x}"
        keep = self._state.keep
        stream = (keep if type(keep) is Stream and keep.closed
                  else stream_ref(self._handle))   # a closed Stream shows as one
        return (f"<Buffer {state} size={self._size} device={self._device} "
                f"stream={stream!r} resource={self.resource!r}>")


atomic_slot(Buffer, "_free")   # `del self._free` is an atomic claim on every build (_locks)

def _not_viewed(buf: Buffer, what: str) -> None:
    """BufferError while a host view of ``buf`` is alive (see ``_buffer.host_views``)."""
    hv = sys.modules.get("hipmr_ctypes._buffer.host_views")
    if hv is not None and hv.viewed(buf):
        raise BufferError(f"Buffer.{what}: a memoryview of this buffer's memory is still "
                          "alive (release it first)")


def _unpickle(data: Any) -> Buffer:
    return Buffer.from_host(data)

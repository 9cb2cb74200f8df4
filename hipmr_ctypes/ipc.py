"""Device memory shared between processes (see docs/scale.md): the one home of IPC.

Two kinds, as in HIP and CUDA:

* **pool memory** of an ``AsyncMemoryResource(enable_ipc=True)``: the exporter sends the
  pool's :class:`IpcPoolHandle` once (``resource.pool.export_handle()``); the importer makes an
  importing resource of it (``AsyncMemoryResource.from_ipc(handle)``); then every buffer
  travels as a small :class:`IpcBufferDescriptor` (``buf.export_ipc()``,
  ``hipMemPoolExportPointer``) and is mapped with ``Buffer.from_ipc(descriptor, resource)``
  (``hipMemPoolImportPointer``).
* **legacy memory** of a ``DeviceMemoryResource`` (``hipMalloc``): the descriptor alone carries
  a ``hipIpcGetMemHandle`` handle; ``Buffer.from_ipc(descriptor)`` opens it
  (``hipIpcOpenMemHandle``).

Closing an imported Buffer unmaps it; it never frees the exporter's memory.  The exporter must
keep its Buffer alive until every importer has closed its mapping.

This module sits below ``buffer`` and the resources and works on plain values:
:func:`describe` makes the descriptor of memory given as pointer, size, kind, device and the
resource it came from; :func:`map_descriptor` maps one and gives the pointer and the resource
that unmaps it.  ``Buffer.export_ipc`` / ``Buffer.from_ipc`` do the Buffer side.  A pool's IPC
state is one :class:`PoolIpc` in ``MemoryPool._ipc`` (None for a pool that cannot be shared),
set when the pool is made; only this module reads or changes what is in it.

What the walk down a resource stack (:func:`source_of`) reads, on the classes:

* ``_ipc_memory`` on a resource that makes shareable memory: ``"pool"``
  (``AsyncMemoryResource``) or ``"legacy"`` (``DeviceMemoryResource``);
* ``passes_pointers_through = True`` on an adaptor that hands out its upstream's pointers
  unchanged (see :class:`hipmr_ctypes.adaptors._base.Adaptor`).

A pool handle travels to another process through ``multiprocessing`` (Queue, Pipe, Process
arguments, ``ProcessPoolExecutor``; spawn and forkserver: a child forked after the runtime
started refuses to use it, see ``hipmr_ctypes._hip.fork``), which passes the descriptor
itself, or over a Unix socket with :meth:`IpcPoolHandle.send` / :meth:`IpcPoolHandle.receive`
(``SCM_RIGHTS``), for processes that multiprocessing did not start (MPI ranks).  Plain
``pickle`` refuses it: a file descriptor number means nothing in another process.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import zlib
from ctypes import byref, c_int, c_size_t, c_void_p
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, Callable, Dict, Optional, Tuple

from . import _hip
from ._checks import check_ptr, check_size, check_stream
from ._exit import finalize
from ._hip.types import (hipIpcMemHandle_t, hipMemHandleTypePosixFileDescriptor,
                         hipMemPoolPtrExportData, ipc_lazy_enable_peer_access)
from .device import check_device
from .errors import NotSupportedError
from .properties import DEFAULT_ALIGNMENT, device_accessible

__all__ = ["IpcBufferDescriptor", "IpcPoolHandle", "POOL_ID_BYTES", "PoolIpc",
           "ImportedMappings", "LegacyIpcMapping", "LEGACY_MAPPINGS", "cannot_allocate",
           "unmap_only", "export_pool", "import_pool", "ipc_open_flags", "source_of", "describe",
           "map_descriptor"]

#: Bytes of the random identity of an exported pool (carried by handles and descriptors).
POOL_ID_BYTES = 16


# ---- pool handles ------------------------------------------------------------------------------
_POOL_MAGIC = b"HMRPOOL1"
_HEADER = struct.Struct(f"<8sii{POOL_ID_BYTES}s")   # magic, device, reserved, pool id

_PICKLE_HINT = (
    "an IpcPoolHandle owns a file descriptor, which plain pickle cannot carry to another "
    "process. Send it through multiprocessing (a Queue, a Pipe, Process arguments, a "
    "ProcessPoolExecutor call), which passes the descriptor itself, or over a connected Unix "
    "socket with handle.send(sock) and IpcPoolHandle.receive(sock)")


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class IpcPoolHandle:
    """The shareable handle of an IPC-enabled memory pool: an owned POSIX file descriptor
    (``hipMemPoolExportToShareableHandle``), the pool's device and its identity.

    Made by ``MemoryPool.export_handle()``; turned into an importing resource by
    ``AsyncMemoryResource.from_ipc(handle)``.  ``close()`` (or the context manager, or garbage
    collection) closes the descriptor; the pool and what was imported from it are not
    affected.  Whoever holds the handle can map every allocation of the pool: give it only to
    processes you trust with all of it.
    """

    __slots__ = ("_fd", "_device", "_pool_id", "_lock", "_finalizer", "__weakref__")

    def __init__(self, fd: int, device: int, pool_id: bytes) -> None:
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise ValueError(f"fd must be an open file descriptor (an int >= 0), not {fd!r}")
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ValueError(f"device must be an int >= 0, not {device!r}")
        if not isinstance(pool_id, bytes) or len(pool_id) != POOL_ID_BYTES:
            raise ValueError(f"pool_id must be {POOL_ID_BYTES} bytes")
        self._fd: Optional[int] = fd
        self._device = device
        self._pool_id = pool_id
        self._lock = threading.Lock()
        self._finalizer = finalize(self, _close_fd, fd)  # never at exit: hipmr_ctypes._exit

    @property
    def fd(self) -> int:
        """The file descriptor (owned by this object: do not close it yourself)."""
        fd = self._fd
        if fd is None:
            raise ValueError("IpcPoolHandle: this handle is closed")
        return fd

    @property
    def device(self) -> int:
        """The device the pool's memory lives on (in the exporting process's numbering)."""
        return self._device

    @property
    def pool_id(self) -> bytes:
        """The pool's identity, shared by every handle and buffer descriptor of that pool."""
        return self._pool_id

    @property
    def closed(self) -> bool:
        """True once the descriptor was closed."""
        return self._fd is None

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        with self._lock:
            if self._fd is None:
                return
            self._fd = None
        self._finalizer()

    def __enter__(self) -> "IpcPoolHandle":
        self.fd
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- Unix sockets ----
    def send(self, sock: socket.socket) -> None:
        """Send the handle over a connected Unix socket (``socket.send_fds``); the receiving
        process calls :meth:`receive`.  This handle stays open."""
        if not isinstance(sock, socket.socket) or sock.family != socket.AF_UNIX:
            raise TypeError("sock must be a connected AF_UNIX socket.socket")
        header = _HEADER.pack(_POOL_MAGIC, self._device, 0, self._pool_id)
        socket.send_fds(sock, [header], [self.fd])

    @classmethod
    def receive(cls, sock: socket.socket) -> "IpcPoolHandle":
        """Receive a handle that :meth:`send` sent over the connected Unix socket ``sock``.
        ValueError when what arrives is not one (anything received is closed)."""
        if not isinstance(sock, socket.socket) or sock.family != socket.AF_UNIX:
            raise TypeError("sock must be a connected AF_UNIX socket.socket")
        data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
        if len(fds) != 1 or len(data) != _HEADER.size:
            for fd in fds:
                _close_fd(fd)
            raise ValueError(f"IpcPoolHandle.receive: expected one handle ({_HEADER.size} "
                             f"bytes and one descriptor), got {len(data)} bytes and "
                             f"{len(fds)} descriptors")
        magic, device, _reserved, pool_id = _HEADER.unpack(data)
        if magic != _POOL_MAGIC or device < 0:
            _close_fd(fds[0])
            raise ValueError("IpcPoolHandle.receive: the message is not an IpcPoolHandle")
        return cls(fds[0], device, pool_id)

    # ---- pickling: only through multiprocessing, which can pass the descriptor ----
    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(_PICKLE_HINT)

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else f"fd={self._fd}"
        return f"<IpcPoolHandle {state} device={self._device} pool={self._pool_id.hex()[:8]}>"


def _rebuild_handle(dup: Any, device: int, pool_id: bytes) -> IpcPoolHandle:
    return IpcPoolHandle(dup.detach(), device, pool_id)


def _reduce_handle(handle: IpcPoolHandle) -> Any:
    # DupFd passes a duplicate of the descriptor: to a child being started (spawn,
    # forkserver) with the process, else through multiprocessing's resource sharer.
    return (_rebuild_handle, (DupFd(handle.fd), handle._device, handle._pool_id))


ForkingPickler.register(IpcPoolHandle, _reduce_handle)


def export_pool(handle: int, device: int, pool_id: bytes, rt: Any) -> IpcPoolHandle:
    """``hipMemPoolExportToShareableHandle`` of the pool ``handle``: a new
    :class:`IpcPoolHandle` (``MemoryPool.export_handle``)."""
    fd = c_int(-1)
    rt.check(rt.fn.hipMemPoolExportToShareableHandle(
        byref(fd), handle, hipMemHandleTypePosixFileDescriptor, 0),
        "hipMemPoolExportToShareableHandle", device=device)
    return IpcPoolHandle(fd.value, device, pool_id)


def import_pool(handle: IpcPoolHandle) -> int:
    """``hipMemPoolImportFromShareableHandle`` of ``handle``: the imported pool's handle."""
    if not isinstance(handle, IpcPoolHandle):
        raise TypeError(f"handle must be an IpcPoolHandle, not {type(handle).__name__}")
    fd = handle.fd
    rt = _hip.get_runtime()
    out = c_void_p()
    rt.check(rt.fn.hipMemPoolImportFromShareableHandle(out, fd,
                                                       hipMemHandleTypePosixFileDescriptor, 0),
             "hipMemPoolImportFromShareableHandle", device=handle.device)
    return out.value or 0


# ---- a pool's IPC state ----------------------------------------------------------------------------
def cannot_allocate(*args: Any) -> int:
    """The allocation function of an importing resource: it maps, never allocates."""
    raise NotSupportedError(801, "hipErrorNotSupported",
                            "an imported memory pool cannot allocate: it only maps buffers "
                            "of the exporting process (Buffer.from_ipc)",
                            "hipMallocFromPoolAsync")


class Mapped:
    """One memory mapping this process holds: the key it was imported with (the export data
    or legacy handle), its address, the bytes the runtime says the allocation has there, and
    how many Buffers share it."""

    __slots__ = ("key", "ptr", "extent", "count")

    def __init__(self, key: bytes, ptr: int, extent: int) -> None:
        self.key: bytes = key
        self.ptr: int = ptr
        self.extent: int = extent
        self.count: int = 1


class ImportedMappings:
    """The memory one importing pool (or the legacy handles of the process) maps: each
    allocation once, shared by every Buffer imported from the same descriptor (a count), and
    unmapped when the last of them closes.  Every section under the lock only reads and
    writes dicts and ints of objects made before it (no Python container is made there, so
    no finalizer can run inside it)."""

    __slots__ = ("_lock", "_by_ptr", "_by_key")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_ptr: Dict[int, Mapped] = {}
        self._by_key: Dict[bytes, Mapped] = {}

    def __len__(self) -> int:
        return len(self._by_ptr)

    def __contains__(self, ptr: object) -> bool:
        return ptr in self._by_ptr

    def share(self, key: bytes) -> Optional[Mapped]:
        """The mapping imported with ``key``, one more Buffer counted on it; None if none."""
        with self._lock:
            found = self._by_key.get(key)
            if found is not None:
                found.count += 1
        return found

    def add(self, mapped: Mapped) -> None:
        """Record a new mapping (counted once)."""
        with self._lock:
            self._by_ptr[mapped.ptr] = mapped
            self._by_key[mapped.key] = mapped

    def release(self, ptr: int) -> Optional[Mapped]:
        """One Buffer on ``ptr`` lets go: the mapping when that was the last one (forgotten
        now: the caller unmaps it, or gives it back with :meth:`restore`), ``NOT_LAST`` when
        others still use it, None when ``ptr`` is not mapped here."""
        with self._lock:
            found = self._by_ptr.get(ptr)
            if found is None:
                return None
            if found.count > 1:
                found.count -= 1
                return NOT_LAST
            del self._by_ptr[ptr]
            if self._by_key.get(found.key) is found:
                del self._by_key[found.key]
        return found

    def restore(self, mapped: Mapped) -> None:
        """Undo :meth:`release` of the last Buffer (its unmap failed)."""
        with self._lock:
            self._by_ptr[mapped.ptr] = mapped
            self._by_key.setdefault(mapped.key, mapped)


#: what :meth:`ImportedMappings.release` returns while other Buffers still use a mapping
NOT_LAST = Mapped(b"", 0, 0)


def unmap_only(free: Callable[[int, int], int],
               mapped: ImportedMappings) -> Callable[[int, int], int]:
    """The free function of an importing resource: for a pointer it mapped, one Buffer less on
    the mapping, and ``hipFreeAsync`` (which unmaps) when that was the last;
    hipErrorInvalidValue for any other pointer (nothing called)."""

    def unmap_async(ptr: int, stream: int) -> int:
        last = mapped.release(ptr)
        if last is None:
            return 1
        if last is NOT_LAST:
            return 0
        st: int = free(ptr, stream)
        if st:
            mapped.restore(last)
        return st

    unmap_async.__qualname__ = "AsyncMemoryResource.from_ipc.unmap_async"
    return unmap_async


class PoolIpc:
    """What a shareable memory pool knows of IPC (``MemoryPool._ipc``):

    - ``pool_id``: its identity, carried by every handle and buffer descriptor of the pool;
    - ``mappings``: for a pool imported from another process, what this process maps of it
      (an :class:`ImportedMappings`, whose emptiness tells a closed imported pool when to be
      destroyed); None for the exporting side;
    - ``handle``: for the exporting side, the pool's own :class:`IpcPoolHandle`, made by the
      first ``Buffer.export_ipc`` (HIP and CUDA export pointers only of a pool exported
      already: hipErrorInvalidValue otherwise) and closed with the pool."""

    __slots__ = ("pool_id", "mappings", "handle")

    def __init__(self, pool_id: bytes, mappings: Optional[ImportedMappings] = None) -> None:
        self.pool_id: bytes = pool_id
        self.mappings: Optional[ImportedMappings] = mappings
        self.handle: Optional[IpcPoolHandle] = None

    @classmethod
    def exporting(cls) -> "PoolIpc":
        """The state of a new exportable pool: a random identity."""
        return cls(os.urandom(POOL_ID_BYTES))

    @classmethod
    def importing(cls, handle: IpcPoolHandle) -> "PoolIpc":
        """The state of the pool imported from ``handle``: its identity, no mapping yet."""
        return cls(handle.pool_id, ImportedMappings())

    @property
    def imported(self) -> bool:
        """True on the importing side."""
        return self.mappings is not None

    def close(self) -> None:
        """The pool closes: its own handle (if one was made) is closed."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.close()


# ---- buffer descriptors ----------------------------------------------------------------------------
_BUFFER_MAGIC = b"HMRBUF01"
_KINDS = {1: "pool", 2: "legacy"}
_CODES = {v: k for k, v in _KINDS.items()}
# magic, kind, device, size, offset, pool id, export data / handle; then a CRC32 of all that
_BODY = struct.Struct(f"<8sBxxxiQQ{POOL_ID_BYTES}s64s")
_CRC = struct.Struct("<I")
SIZE = _BODY.size + _CRC.size


class IpcBufferDescriptor:
    """What another process needs to map one exported Buffer: plain bytes (the export data or
    legacy handle, the size, the device, the offset into the allocation and which pool it
    belongs to), immutable and picklable.  ``bytes(descriptor)`` and
    :meth:`from_bytes` turn it into bytes and back (for MPI or sockets); bytes that are
    truncated or corrupted raise ValueError.

    A descriptor grants access to the memory it names: send it only to processes you trust.
    """

    __slots__ = ("_raw",)
    _raw: bytes

    def __init__(self, kind: str, device: int, size: int, offset: int, pool_id: bytes,
                 data: bytes) -> None:
        if kind not in _CODES:
            raise ValueError(f"kind must be 'pool' or 'legacy', not {kind!r}")
        for name, value in (("device", device), ("size", size), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, not {value!r}")
        if not isinstance(pool_id, bytes) or len(pool_id) != POOL_ID_BYTES:
            raise ValueError(f"pool_id must be {POOL_ID_BYTES} bytes")
        if not isinstance(data, bytes) or len(data) != 64:
            raise ValueError("data must be 64 bytes")
        _check_fields(kind, device, size, offset)
        body = _BODY.pack(_BUFFER_MAGIC, _CODES[kind], device, size, offset, pool_id, data)
        object.__setattr__(self, "_raw", body + _CRC.pack(zlib.crc32(body)))

    @classmethod
    def from_bytes(cls, data: Any) -> "IpcBufferDescriptor":
        """The descriptor that ``bytes(descriptor)`` gave; ValueError for anything else."""
        try:
            raw = bytes(memoryview(data))
        except TypeError:
            raise TypeError(f"data must be bytes-like, not {type(data).__name__}") from None
        if len(raw) != SIZE:
            raise ValueError(f"an IpcBufferDescriptor is {SIZE} bytes, not {len(raw)}")
        body, (crc,) = raw[:_BODY.size], _CRC.unpack(raw[_BODY.size:])
        magic, code = body[:8], body[8]
        if magic != _BUFFER_MAGIC or code not in _KINDS:
            raise ValueError("these bytes are not an IpcBufferDescriptor")
        if zlib.crc32(body) != crc:
            raise ValueError("IpcBufferDescriptor: the bytes are corrupted (checksum mismatch)")
        fields = _BODY.unpack(body)
        _check_fields(_KINDS[code], fields[2], fields[3], fields[4])
        self = cls.__new__(cls)
        object.__setattr__(self, "_raw", raw)
        return self

    def _fields(self) -> Tuple[Any, ...]:
        return _BODY.unpack(self._raw[:_BODY.size])

    @property
    def kind(self) -> str:
        """``"pool"`` (memory-pool memory) or ``"legacy"`` (``hipMalloc`` memory)."""
        return _KINDS[self._fields()[1]]

    @property
    def device(self) -> int:
        """The device the memory lives on (the exporting process's numbering)."""
        return int(self._fields()[2])

    @property
    def size(self) -> int:
        """Bytes of the exported Buffer."""
        return int(self._fields()[3])

    @property
    def offset(self) -> int:
        """Where the Buffer starts in the allocation a legacy handle names (0 for pools)."""
        return int(self._fields()[4])

    @property
    def pool_id(self) -> Optional[bytes]:
        """The identity of the pool the memory belongs to (None for legacy memory)."""
        fields = self._fields()
        return bytes(fields[5]) if _KINDS[fields[1]] == "pool" else None

    @property
    def data(self) -> bytes:
        """The 64 bytes of ``hipMemPoolPtrExportData`` or ``hipIpcMemHandle_t``."""
        return bytes(self._fields()[6])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IpcBufferDescriptor is immutable")

    def __bytes__(self) -> bytes:
        return self._raw

    def __reduce__(self) -> Any:
        # a module-level function: pickled by reference by every pickler (cloudpickle, Dask's
        # serializer, pickles a classmethod by value, with the module's globals)
        return (_descriptor, (self._raw,))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IpcBufferDescriptor):
            return NotImplemented
        return other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return (f"<IpcBufferDescriptor {self.kind} size={self.size} device={self.device}"
                f"{'' if self.pool_id is None else ' pool=' + self.pool_id.hex()[:8]}>")


def _check_fields(kind: str, device: int, size: int, offset: int) -> None:
    """ValueError for fields no exported Buffer has (the checksum proves nothing: anyone can
    compute it), before anything is packed or mapped."""
    if not 0 <= device < 1 << 31:
        raise ValueError(f"IpcBufferDescriptor: device={device} is not a device ordinal")
    if not 0 < size < 1 << 64:
        raise ValueError(f"IpcBufferDescriptor: size={size} is not the size of an exported "
                         "Buffer (1 to 2**64 - 1 bytes)")
    if not 0 <= offset < 1 << 64 or offset + size >= 1 << 64:
        raise ValueError(f"IpcBufferDescriptor: offset={offset} with size={size} does not fit "
                         "an address space")
    if kind == "pool" and offset:
        raise ValueError(f"IpcBufferDescriptor: a pool descriptor has offset 0, not {offset}")


def _descriptor(raw: bytes) -> IpcBufferDescriptor:
    """Unpickling: :meth:`IpcBufferDescriptor.from_bytes` (which checks everything again)."""
    return IpcBufferDescriptor.from_bytes(raw)


# ---- legacy mappings -----------------------------------------------------------------------------
def ipc_open_flags(rt: Any) -> int:
    """The one flag ``hipIpcOpenMemHandle`` accepts on this runtime."""
    if rt.platform == "nvidia":
        return 1   # cudaIpcMemLazyEnablePeerAccess
    return ipc_lazy_enable_peer_access(rt.runtime_version()[0])


#: the legacy handles this process has open (``hipIpcOpenMemHandle``), each once
LEGACY_MAPPINGS = ImportedMappings()


class LegacyIpcMapping:
    """The resource of one Buffer opened from a legacy handle (``hipIpcOpenMemHandle``): its
    only free lets go of the mapping after the stream's work (``hipIpcCloseMemHandle`` once
    the last Buffer on it let go: see :data:`LEGACY_MAPPINGS`); it cannot allocate.
    Internal: ``Buffer.from_ipc`` makes one per imported buffer."""

    _checks_arguments = True
    __slots__ = ("_base", "_ptr", "_device", "_closed", "_lock", "__weakref__")
    properties: Tuple[type, ...] = (device_accessible,)

    def __init__(self, base: int, ptr: int, device: int) -> None:
        self._base = base
        self._ptr = ptr
        self._device = device
        self._closed = False
        self._lock = threading.Lock()

    @property
    def device(self) -> int:
        """The device the memory lives on."""
        return self._device

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Refused: this resource only unmaps one imported buffer."""
        return cannot_allocate()

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """Refused: this resource only unmaps one imported buffer."""
        return cannot_allocate()

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Unmap (``hipIpcCloseMemHandle``)."""
        self.deallocate_async(ptr, bytes, alignment, 0)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Wait for ``stream``, then let go of the mapping (``hipIpcCloseMemHandle`` when no
        other Buffer uses it); only the pointer this mapping gave out (ValueError otherwise)."""
        ptr = check_ptr(ptr)
        check_size(bytes)
        handle = check_stream(stream)
        with self._lock:
            if self._closed or ptr != self._ptr:
                raise ValueError(f"{ptr:#x} is not the live mapping of this legacy IPC handle")
            self._closed = True
        rt = _hip.get_runtime()
        try:
            rt.check(rt.fn.hipStreamSynchronize(handle), "hipStreamSynchronize")
        except BaseException:
            with self._lock:
                self._closed = False
            raise
        last = LEGACY_MAPPINGS.release(self._base)
        if last is None or last is NOT_LAST:
            return
        try:
            rt.check(rt.fn.hipIpcCloseMemHandle(self._base), "hipIpcCloseMemHandle",
                     device=self._device)
        except BaseException:
            LEGACY_MAPPINGS.restore(last)
            with self._lock:
                self._closed = False
            raise

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<LegacyIpcMapping {self._ptr:#x} device={self._device}>"


# ---- export ----------------------------------------------------------------------------------
def source_of(resource: Any) -> Any:
    """The resource that made the memory ``resource`` hands out, through adaptors whose class
    says ``passes_pointers_through = True``: the first whose class names its ``_ipc_memory``;
    NotSupportedError naming the first resource that is neither."""
    from .resource_refs import upstream_chain   # on first use: importing this stays light
    for found in upstream_chain(resource, "Buffer.export_ipc"):   # any depth; a cycle raises
        cls = type(found)
        if getattr(cls, "_ipc_memory", None) is not None:
            return found
        if getattr(cls, "passes_pointers_through", False) is not True:
            resource = found
            break
    raise NotSupportedError(
        801, "hipErrorNotSupported",
        f"memory from {type(resource).__name__} cannot be shared with another process: only "
        "whole allocations of DeviceMemoryResource (hipMalloc) or of an "
        "AsyncMemoryResource(enable_ipc=True) can (directly or through statistics, tracking, "
        "logging, limiting or failure-callback adaptors)", "Buffer.export_ipc")


def _not_shareable(why: str) -> NotSupportedError:
    return NotSupportedError(801, "hipErrorNotSupported", why, "Buffer.export_ipc")


def describe(ptr: int, size: int, kind: str, device: Optional[int], resource: Any,
             wait: Callable[[], Any]) -> IpcBufferDescriptor:
    """The descriptor of ``size`` (> 0) bytes of ``kind`` memory at ``ptr`` on ``device``
    (None: the source resource's), which ``resource`` handed out (``Buffer.export_ipc``).
    ``wait()`` waits for the work queued on the memory; it is called once everything is
    checked, before the memory is exported.  NotSupportedError for memory that cannot be
    shared."""
    if kind != "device":
        raise _not_shareable(f"{kind} memory cannot be shared with another process (HIP "
                             "shares device memory only)")
    source = source_of(resource)
    rt = _hip.get_runtime()
    dev: int = source.device if device is None else device
    if type(source)._ipc_memory == "pool":
        pool = source.pool
        pool.handle   # ValueError when closed
        state: Optional[PoolIpc] = pool._ipc
        if state is not None and state.imported:
            raise _not_shareable("memory imported from another process cannot be exported "
                                 "again")
        if state is None:
            raise _not_shareable("this Buffer's memory pool cannot be shared: make its "
                                 "resource with AsyncMemoryResource(enable_ipc=True)")
        if state.handle is None:
            state.handle = pool.export_handle()   # kept until the pool closes
        wait()   # the allocation and the writes before it are done for importers
        export = hipMemPoolPtrExportData()
        rt.check(rt.fn.hipMemPoolExportPointer(export, ptr), "hipMemPoolExportPointer",
                 device=dev)
        return IpcBufferDescriptor("pool", dev, size, 0, state.pool_id, bytes(export))
    wait()
    handle = hipIpcMemHandle_t()
    rt.check(rt.fn.hipIpcGetMemHandle(handle, ptr), "hipIpcGetMemHandle", device=dev)
    return IpcBufferDescriptor("legacy", dev, size, 0, bytes(POOL_ID_BYTES),
                               bytes(handle))


# ---- import ----------------------------------------------------------------------------------
#
# What an importer can check, and does, before a Buffer exists (docs/scale.md, "Trust"): the
# fields are in range (``from_bytes``), the pool's identity and device match the importing
# resource's, and what the runtime actually mapped is device memory of that device whose
# range (``hipMemGetAddressRange``) holds ``offset + size`` bytes from the mapped base.
# Anything else is a ValueError with nothing left mapped.  The runtime maps an allocation once
# per process: importing the same descriptor again shares that mapping (counted).


def _refuse(why: str) -> ValueError:
    return ValueError(f"Buffer.from_ipc: {why}; the descriptor is damaged or forged (nothing "
                      "was mapped)")


def _check_mapping(rt: Any, base: int, device: int, need: int) -> int:
    """The bytes mapped from ``base`` on (to the end of the range the runtime reports for
    it: the allocation, or a larger segment that holds it); ValueError when that is not
    device memory of ``device`` with at least ``need`` bytes."""
    from ._memory_query import pointer_kind   # on first use: importing this stays light
    found, extent = c_void_p(), c_size_t()
    if rt.fn.hipMemGetAddressRange(found, extent, base):
        rt.clear_last_error()
        raise _refuse("the runtime does not know the memory it mapped")
    start = found.value or 0
    available = start + extent.value - base
    if not start <= base or available < need:
        raise _refuse(f"it asks for {need} bytes of an allocation of {max(available, 0)}")
    kind, actual = pointer_kind(base)
    if kind != "device" or actual != device:
        raise _refuse(f"it says device {device}, but the memory mapped is "
                      + ("not device memory" if kind != "device" else f"on device {actual}"))
    return available


def map_descriptor(descriptor: IpcBufferDescriptor, resource: Any = None) -> Tuple[int, Any]:
    """Map the memory ``descriptor`` names (``Buffer.from_ipc``): ``(pointer, owner)``, where
    ``owner.deallocate_async(pointer, descriptor.size, DEFAULT_ALIGNMENT, 0)`` unmaps it (the
    importing resource for pool memory, a new :class:`LegacyIpcMapping` for legacy memory).
    Pool memory needs ``resource``, the importing resource of its pool."""
    if not isinstance(descriptor, IpcBufferDescriptor):
        raise TypeError(f"descriptor must be an IpcBufferDescriptor, not "
                        f"{type(descriptor).__name__}")
    size, device, offset = descriptor.size, descriptor.device, descriptor.offset
    key = descriptor.data
    if descriptor.kind == "pool":
        return _map_pool_pointer(descriptor, resource, size, device, key)
    if resource is not None:
        raise ValueError("legacy (hipMalloc) memory is opened without a resource: "
                         "Buffer.from_ipc(descriptor)")
    try:
        check_device(device, "the descriptor's device")
    except ValueError as exc:
        raise _refuse(str(exc)) from None
    rt = _hip.get_runtime()
    shared = LEGACY_MAPPINGS.share(key)
    if shared is None:
        out = c_void_p()
        handle_struct = hipIpcMemHandle_t.from_buffer_copy(key)
        try:
            rt.check(rt.fn.hipIpcOpenMemHandle(out, handle_struct, ipc_open_flags(rt)),
                     "hipIpcOpenMemHandle", device=device)
        except NotSupportedError as exc:
            if rt.platform != "emulated":
                raise
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "the emulated platform cannot map hipMalloc memory of "
                                    "another process (legacy IPC handles); share memory of an "
                                    "AsyncMemoryResource(enable_ipc=True) instead",
                                    "hipIpcOpenMemHandle") from exc
        base = out.value or 0
        try:
            extent = _check_mapping(rt, base, device, offset + size)
        except BaseException:
            rt.fn.hipIpcCloseMemHandle(base)
            rt.clear_last_error()
            raise
        shared = Mapped(key, base, extent)
        LEGACY_MAPPINGS.add(shared)
    base = shared.ptr
    mapping = LegacyIpcMapping(base, base + offset, device)
    if shared.extent < offset + size:
        mapping.deallocate(base + offset, size)   # the count taken above
        raise _refuse(f"it asks for bytes {offset} to {offset + size} of an allocation of "
                      f"{shared.extent}")
    return base + offset, mapping


def _map_pool_pointer(descriptor: IpcBufferDescriptor, resource: Any, size: int, device: int,
                      key: bytes) -> Tuple[int, Any]:
    if resource is None:
        raise ValueError("pool memory is mapped through the importing resource of its "
                         "pool: Buffer.from_ipc(descriptor, "
                         "AsyncMemoryResource.from_ipc(pool_handle))")
    if getattr(type(resource), "_ipc_memory", None) != "pool" or not resource.pool.imported:
        raise TypeError("resource must be an importing AsyncMemoryResource "
                        "(AsyncMemoryResource.from_ipc), not "
                        f"{type(resource).__name__}")
    pool = resource.pool
    handle = pool.handle   # ValueError when closed
    state: PoolIpc = pool._ipc
    if descriptor.pool_id != state.pool_id:
        raise ValueError("this descriptor belongs to another memory pool than the "
                         "resource's (import that pool's handle first)")
    if device != pool.device:
        raise _refuse(f"it says device {device}, but its pool's handle says device "
                      f"{pool.device}")
    mappings = state.mappings
    assert mappings is not None
    shared = mappings.share(key)
    if shared is None:
        rt = _hip.get_runtime()
        out = c_void_p()
        export = hipMemPoolPtrExportData.from_buffer_copy(key)
        rt.check(rt.fn.hipMemPoolImportPointer(out, handle, export),
                 "hipMemPoolImportPointer", device=device)
        ptr = out.value or 0
        try:
            extent = _check_mapping(rt, ptr, device, size)
        except BaseException:
            rt.fn.hipFreeAsync(ptr, 0)   # unmapped at once: never known to the resource
            rt.clear_last_error()
            raise
        shared = Mapped(key, ptr, extent)
        mappings.add(shared)   # from now on the resource's free unmaps it
    elif shared.extent < size:
        resource.deallocate_async(shared.ptr, size, DEFAULT_ALIGNMENT, 0)  # the count taken above
        raise _refuse(f"it asks for {size} bytes of an allocation of {shared.extent}")
    return shared.ptr, resource

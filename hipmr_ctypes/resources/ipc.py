"""Memory pools shared between processes: :class:`IpcPoolHandle` (an owned POSIX file
descriptor of an IPC-enabled pool), the importing side of :class:`AsyncMemoryResource`, and
the small resource that unmaps memory opened from a legacy per-allocation handle.

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
from ctypes import c_void_p
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, Callable, Dict, Optional, Tuple

from .. import _hip
from .._exit import finalize
from ..errors import NotSupportedError
from .._hip.types import hipMemHandleTypePosixFileDescriptor
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from .._checks import check_ptr, check_size, check_stream

__all__ = ["IpcPoolHandle", "LegacyIpcMapping", "POOL_ID_BYTES"]

#: Bytes of the random identity of an exported pool (carried by handles and descriptors).
POOL_ID_BYTES = 16
_MAGIC = b"HMRPOOL1"
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
        header = _HEADER.pack(_MAGIC, self._device, 0, self._pool_id)
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
        if magic != _MAGIC or device < 0:
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


# ---- the importing side --------------------------------------------------------------------------
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


def ipc_open_flags(rt: Any) -> int:
    """The one flag ``hipIpcOpenMemHandle`` accepts on this runtime."""
    from .._hip.types import ipc_lazy_enable_peer_access
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


__all__ += ["cannot_allocate", "unmap_only", "import_pool", "ipc_open_flags", "Mapped",
            "ImportedMappings", "NOT_LAST", "LEGACY_MAPPINGS"]

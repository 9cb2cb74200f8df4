"""Interprocess memory: pools exported as file descriptors, pointers exported from them, and
the legacy per-allocation handles.

A pool created with the POSIX file-descriptor handle type allocates from a
:class:`~._shared.SharedArena` (a ``memfd`` mapped shared).  Its exported handle is a new
descriptor of that file; importing it maps the same file in the importing process, so an
imported pointer reaches the same pages at another address, across real processes.  An
imported pool cannot allocate; memory imported from it is unmapped by hipFree / hipFreeAsync
(which never free the exporter's memory).

Legacy handles (hipIpcGetMemHandle of hipMalloc memory) are 64 well-formed bytes, but the
emulation cannot map hipMalloc memory of another process: hipIpcOpenMemHandle of one returns
hipErrorNotSupported.

Interprocess events work as clr's: hipIpcGetEventHandle gives an interprocess event a small
named shared-memory file (:class:`SharedEventSignal`, in ``/dev/shm``) whose name is the
handle; hipIpcOpenEventHandle in another process maps it.  The process that records the event
last sets the signal while the work it follows is pending and clears it once that work is done;
a query in any process reads it, and hipEventSynchronize polls it.  The exporter removes the
name when it destroys the event (or at exit); processes that opened it keep their mapping.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import struct
from ctypes import c_int, c_size_t, c_void_p
from typing import TYPE_CHECKING, Any, Optional, Set

from ..types import (hipEventDisableTiming, hipEventInterprocess, hipIpcEventHandle_t,
                     hipIpcMemHandle_t, hipMemHandleTypePosixFileDescriptor,
                     hipMemPoolPtrExportData, ipc_lazy_enable_peer_access)
from ._args import Status, addr, out, u32
from ._core import DEVICE, INVALID_HANDLE, INVALID_VALUE, Alloc, EmulatorCore, Event
from ._shared import ARENA_ID_BYTES, SharedArena

if TYPE_CHECKING:
    import mmap  # imported by the first interprocess event: the first use imports no mmap

__all__ = ["IpcMixin"]

NOT_SUPPORTED = 801
NOT_INITIALIZED = 3
INVALID_CONFIGURATION = 9
INVALID_CONTEXT = 201

_EVENT_TAG = b"HMREVT01"
_SIGNAL = struct.Struct("<8sqi")      # magic, the exporter's pid, pending (0 or 1)
_SIGNAL_MAGIC = b"HMRSIGNL"
_SIGNAL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
#: the signal files this process made and has not removed yet (removed at exit; a child
#: forked from it removes none of its parent's: their names carry the maker's pid)
_created: Set[str] = set()


def _remove_created(created: Set[str] = _created) -> None:
    mine = f"-{os.getpid()}-"
    for path in list(created):
        if mine in path:
            try:
                os.unlink(path)
            except OSError:
                pass
        created.discard(path)


atexit.register(_remove_created)


class SharedEventSignal:
    """The shared signal of one interprocess event: a page of a named file, mapped."""

    __slots__ = ("path", "owner_pid", "_map", "_created")

    def __init__(self, path: str, mapping: mmap.mmap, created: bool) -> None:
        self.path, self._map, self._created = path, mapping, created
        self.owner_pid = _SIGNAL.unpack_from(mapping, 0)[1]

    @classmethod
    def create(cls) -> "SharedEventSignal":
        """A new signal, named after this process and a random token (the exporter)."""
        import mmap
        path = f"{_SIGNAL_DIR}/hipmr-emulated-event-{os.getpid()}-{os.urandom(8).hex()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            mapping = mmap.mmap(fd, mmap.PAGESIZE)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        _SIGNAL.pack_into(mapping, 0, _SIGNAL_MAGIC, os.getpid(), 0)
        _created.add(path)
        return cls(path, mapping, True)

    @classmethod
    def open(cls, path: str) -> "SharedEventSignal":
        """The signal another process exported (OSError / ValueError when it is not one)."""
        if not path.startswith(f"{_SIGNAL_DIR}/hipmr-emulated-event-") or "/.." in path:
            raise ValueError("not an emulated event signal")
        import mmap
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < mmap.PAGESIZE:
                raise ValueError("not an emulated event signal")
            mapping = mmap.mmap(fd, mmap.PAGESIZE)
        finally:
            os.close(fd)
        if _SIGNAL.unpack_from(mapping, 0)[0] != _SIGNAL_MAGIC:
            mapping.close()
            raise ValueError("not an emulated event signal")
        return cls(path, mapping, False)

    def pending(self) -> bool:
        """True while the last recorder's work is pending (ValueError once closed)."""
        return bool(_SIGNAL.unpack_from(self._map, 0)[2])

    def set_pending(self, pending: bool) -> None:
        _SIGNAL.pack_into(self._map, 0, _SIGNAL_MAGIC, self.owner_pid, int(pending))

    def close(self) -> None:
        """Unmap; the exporter also removes the name (processes that opened it keep it)."""
        self._map.close()
        if self._created:
            self._created = False
            _created.discard(self.path)
            try:
                os.unlink(self.path)
            except OSError:
                pass


class _Every:
    """Contains every name: the calls of the fault that fails everything after a fork."""

    def __contains__(self, name: object) -> bool:
        return True


_EVERY_CALL: Any = _Every()
_LEGACY_TAG = b"HIPMRIPC"
_POINTER_TAG = b"HMRPTR01"
_POINTER = struct.Struct(f"<8s{ARENA_ID_BYTES}sQQi")   # tag, arena id, offset, size, device


class IpcMixin(EmulatorCore):
    """hipMemPoolExportToShareableHandle, hipMemPoolImportFromShareableHandle,
    hipMemPoolExportPointer, hipMemPoolImportPointer, hipIpcGetMemHandle, hipIpcOpenMemHandle,
    hipIpcCloseMemHandle, hipIpcGetEventHandle, hipIpcOpenEventHandle; and hipMemGetAddressRange, with which an importer checks what it
    mapped."""

    # ---- fork ---------------------------------------------------------------------------------
    def fail_after_fork(self) -> None:
        """In a child forked from the process that made this emulator: every call fails from
        now on with hipErrorNotInitialized, as CUDA's fail in such a child, so that nothing
        inherited (pools whose shared memory the parent still uses, above all) hands out
        memory.  Called by ``hipmr_ctypes._hip.fork``; the lock was made free before."""
        from ._core import _Fault
        self._faults[:] = [_Fault(NOT_INITIALIZED, 1 << 62, _EVERY_CALL)]

    # ---- the range of an allocation ----------------------------------------------------------
    def hipMemGetAddressRange(self, pbase: Any, psize: Any, dptr: Any) -> None:
        """hipMemGetAddressRange(hipDeviceptr_t*, size_t*, hipDeviceptr_t): the base and size
        of the live allocation containing ``dptr`` (any kind, imported memory too: the size
        the exporter's runtime wrote in the export data); hipErrorInvalidValue for memory
        the runtime does not know."""
        base_out, size_out = out(pbase, c_void_p), out(psize, c_size_t)
        p = addr(dptr)
        with self._lock:
            alloc = self._find(p) if p else None
            if alloc is None:
                raise Status(INVALID_VALUE)
            base, size = alloc.ptr, alloc.size
        base_out.value = base
        size_out.value = size

    # ---- pools ----------------------------------------------------------------------------
    def hipMemPoolExportToShareableHandle(self, shared_handle: Any, mem_pool: Any,
                                          handle_type: Any, flags: Any) -> None:
        """hipMemPoolExportToShareableHandle(void* (an int*), hipMemPool_t, type, unsigned):
        a new descriptor of the pool's shared memory; only pools made for it."""
        target = out(shared_handle, c_int)
        if u32(handle_type) != hipMemHandleTypePosixFileDescriptor or u32(flags):
            raise Status(INVALID_VALUE)
        with self._lock:
            pool = self._pools.get(addr(mem_pool))
            if pool is None or pool.arena is None or pool.imported:
                raise Status(INVALID_VALUE)
            try:
                target.value = pool.arena.export_fd()
            except OSError:
                raise Status(INVALID_VALUE) from None
            pool.shared = True

    def hipMemPoolImportFromShareableHandle(self, mem_pool: Any, shared_handle: Any,
                                            handle_type: Any, flags: Any) -> None:
        """hipMemPoolImportFromShareableHandle(hipMemPool_t*, void* (the fd), type, unsigned):
        maps the exporter's shared memory; the new pool cannot allocate."""
        from ._core import Pool
        target = out(mem_pool, c_void_p)
        fd = addr(shared_handle)
        if u32(handle_type) != hipMemHandleTypePosixFileDescriptor or u32(flags) \
                or fd > 0x7FFFFFFF:
            raise Status(INVALID_VALUE)
        try:
            arena = SharedArena.open(fd)
        except (OSError, ValueError, OverflowError):
            raise Status(INVALID_VALUE) from None
        if not 0 <= arena.device < len(self._devices):
            arena.close()
            raise Status(INVALID_VALUE)
        with self._lock:
            pool = Pool(self._new_handle(), arena.device, False,
                        hipMemHandleTypePosixFileDescriptor, 0)
            pool.arena = arena
            pool.imported = True
            self._pools[pool.handle] = pool
        target.value = pool.handle

    def hipMemPoolExportPointer(self, export_data: Any, ptr: Any) -> None:
        """hipMemPoolExportPointer(hipMemPoolPtrExportData*, void*): the start of a live
        allocation of a pool made for export and exported already (as in CUDA: a pointer of
        a pool never passed to hipMemPoolExportToShareableHandle is an invalid value)."""
        target = out(export_data, hipMemPoolPtrExportData)
        with self._lock:
            alloc = self._allocs.get(addr(ptr))
            pool = alloc.pool if alloc is not None else None
            if alloc is None or alloc.kind != DEVICE or pool is None or pool.arena is None \
                    or pool.imported or not pool.shared:
                raise Status(INVALID_VALUE)
            data = _POINTER.pack(_POINTER_TAG, pool.arena.ident,
                                 pool.arena.offset_of(alloc.ptr), alloc.size, alloc.device)
        ctypes.memmove(ctypes.addressof(target), data.ljust(64, b"\0"), 64)

    def hipMemPoolImportPointer(self, dev_ptr: Any, mem_pool: Any, export_data: Any) -> None:
        """hipMemPoolImportPointer(void**, hipMemPool_t, hipMemPoolPtrExportData*): export data
        of that pool, not mapped yet in this process."""
        target = out(dev_ptr, c_void_p)
        data = bytes(out(export_data, hipMemPoolPtrExportData))
        tag, ident, offset, size, _device = _POINTER.unpack(data[:_POINTER.size])
        with self._lock:
            pool = self._pools.get(addr(mem_pool))
            if pool is None or not pool.imported or pool.arena is None or tag != _POINTER_TAG \
                    or ident != pool.arena.ident or not size \
                    or offset + size > pool.arena.capacity or offset % 256:
                raise Status(INVALID_VALUE)
            ptr = pool.arena.base + offset
            if ptr in self._allocs:
                raise Status(INVALID_VALUE)   # mapped already in this process
            pool.live += 1
            self._register(Alloc(ptr, size, 0, pool.device, DEVICE, 0, pool))
        target.value = ptr

    # ---- events ---------------------------------------------------------------------------
    def hipIpcGetEventHandle(self, handle: Any, event: Any) -> None:
        """hipIpcGetEventHandle(hipIpcEventHandle_t*, hipEvent_t): an event made with
        hipEventInterprocess (else hipErrorInvalidConfiguration, as clr); its shared signal
        is made by the first call, and every call gives the same handle."""
        target = out(handle, hipIpcEventHandle_t)
        with self._lock:
            ev = self._events.get(addr(event))
            if ev is None:
                raise Status(INVALID_HANDLE)
            if not ev.flags & hipEventInterprocess:
                raise Status(INVALID_CONFIGURATION)
            if ev.ipc is None:
                try:
                    ev.ipc = SharedEventSignal.create()
                except OSError:
                    raise Status(INVALID_CONFIGURATION) from None
                ev.ipc.set_pending(ev.pending())
                self._ipc_events[ev.handle] = ev
            data = _EVENT_TAG + ev.ipc.path.encode()
        ctypes.memmove(ctypes.addressof(target), data.ljust(64, b"\0"), 64)

    def hipIpcOpenEventHandle(self, event: Any, handle: Any) -> None:
        """hipIpcOpenEventHandle(hipEvent_t*, hipIpcEventHandle_t): a new event (timing
        disabled, interprocess) on the current device over the exporter's signal; a handle
        this process exported is hipErrorInvalidContext (as clr), one whose signal is gone
        or that is not a handle hipErrorInvalidValue."""
        target = out(event, c_void_p)
        if not isinstance(handle, hipIpcEventHandle_t):
            raise TypeError("expected a hipIpcEventHandle_t")
        data = bytes(handle)
        if data[:8] != _EVENT_TAG:
            raise Status(INVALID_VALUE)
        try:
            path = data[8:].rstrip(b"\0").decode()
            signal: Optional[SharedEventSignal] = SharedEventSignal.open(path)
        except (OSError, ValueError):
            raise Status(INVALID_VALUE) from None
        assert signal is not None
        if signal.owner_pid == os.getpid():
            signal.close()
            raise Status(INVALID_CONTEXT)
        with self._lock:
            ev = Event(self._new_handle(), self._tls.device,
                       hipEventDisableTiming | hipEventInterprocess)
            ev.ipc = signal
            self._events[ev.handle] = ev
            self._ipc_events[ev.handle] = ev
        target.value = ev.handle

    # ---- legacy handles -------------------------------------------------------------------
    def hipIpcGetMemHandle(self, handle: Any, dev_ptr: Any) -> None:
        """hipIpcGetMemHandle(hipIpcMemHandle_t*, void*): hipMalloc memory only."""
        target = out(handle, hipIpcMemHandle_t)
        p = addr(dev_ptr)
        with self._lock:
            alloc = self._find(p) if p else None
            if alloc is None or alloc.kind != DEVICE or alloc.pool is not None:
                raise Status(INVALID_VALUE)
            data = _LEGACY_TAG + struct.pack("<QQQi", alloc.ptr, alloc.size, p - alloc.ptr,
                                             alloc.device)
        ctypes.memmove(ctypes.addressof(target), data.ljust(64, b"\0"), 64)

    def hipIpcOpenMemHandle(self, dev_ptr: Any, handle: Any, flags: Any) -> None:
        """hipIpcOpenMemHandle(void**, hipIpcMemHandle_t, unsigned): the flag must be
        hipIpcMemLazyEnablePeerAccess of the version; the emulation cannot map hipMalloc
        memory of another process (hipErrorNotSupported)."""
        target = out(dev_ptr, c_void_p)
        if not isinstance(handle, hipIpcMemHandle_t):
            raise TypeError("expected a hipIpcMemHandle_t")
        if u32(flags) != ipc_lazy_enable_peer_access(self.version[0]):
            raise Status(INVALID_VALUE)
        if bytes(handle)[:8] != _LEGACY_TAG:
            raise Status(INVALID_VALUE)
        target.value = None
        raise Status(NOT_SUPPORTED)

    def hipIpcCloseMemHandle(self, dev_ptr: Any) -> None:
        """hipIpcCloseMemHandle(void*): nothing is ever opened here (hipErrorInvalidValue)."""
        addr(dev_ptr)
        raise Status(INVALID_VALUE)

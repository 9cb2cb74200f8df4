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
"""
from __future__ import annotations

import ctypes
import struct
from ctypes import c_int, c_size_t, c_void_p
from typing import Any

from ..types import (hipIpcMemHandle_t, hipMemHandleTypePosixFileDescriptor,
                     hipMemPoolPtrExportData, ipc_lazy_enable_peer_access)
from ._args import Status, addr, out, u32
from ._core import DEVICE, INVALID_VALUE, Alloc, EmulatorCore
from ._shared import ARENA_ID_BYTES, SharedArena

__all__ = ["IpcMixin"]

NOT_SUPPORTED = 801
NOT_INITIALIZED = 3


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
    hipIpcCloseMemHandle; and hipMemGetAddressRange, with which an importer checks what it
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

"""Memory pools and stream-ordered allocation: hipMemPool*, hipMallocAsync, hipFreeAsync, ...

Model (docs/emulated.md): a pool reserves 256-byte-rounded blocks
from its device's capacity.  A freed block goes to the pool's cache and stays reserved; an
allocation reuses the smallest cached block that is at least the request and at most 12.5 %
larger (AMD's rule), else reserves a new block.  At a synchronize point, cached blocks are
released (largest first) while the pool holds more than its release threshold; hipMemPoolTrimTo
does the same down to its argument.  An allocation that would exceed the device's capacity first
releases as much of the pool's cache as it needs, and fails with nothing released when even
that would not be enough.
"""
from __future__ import annotations

from ctypes import c_int, c_void_p
from typing import Any, Optional

from ..types import (hipMemAccessDesc, hipMemLocation, hipMemPoolProps,
                     hipMemAllocationTypePinned, hipMemHandleTypeNone,
                     hipMemHandleTypePosixFileDescriptor, hipMemLocationTypeDevice,
                     hipMemLocationTypeHost, HOST_POOLS_SINCE,
                     hipMemAccessFlagsProtNone, hipMemAccessFlagsProtRead,
                     hipMemAccessFlagsProtReadWrite, hipMemPoolAttrReleaseThreshold,
                     hipMemPoolAttrReservedMemCurrent, hipMemPoolAttrReservedMemHigh,
                     hipMemPoolAttrUsedMemCurrent, hipMemPoolAttrUsedMemHigh)
from ._args import Status, addr, i32, int_cell, out, out_array, u64
from ._shared import SharedArena
from ._core import (DEVICE, GRAPH, INVALID_DEVICE, INVALID_VALUE, MANAGED, OUT_OF_MEMORY, PINNED,
                    Alloc, EmulatorCore, Pool, round_up)

__all__ = ["PoolMixin"]

_ACCESS_FLAGS = (hipMemAccessFlagsProtNone, hipMemAccessFlagsProtRead,
                 hipMemAccessFlagsProtReadWrite)


class PoolMixin(EmulatorCore):
    """hipMemPool*, hipDevice{Get,Set,GetDefault}MemPool, hipMallocAsync and friends."""

    # ---- bookkeeping (lock held) ----------------------------------------------------------
    def _pool(self, handle: Any) -> Pool:
        pool = self._pools.get(addr(handle))
        if pool is None:
            raise Status(INVALID_VALUE)
        return pool

    def _reusable(self, pool: Pool, ptr: int, stream: Optional[int]) -> bool:
        """Whether the cached block ``ptr`` may serve an allocation on ``stream``: always on
        the stream that freed it (or after a synchronous free); on another stream only as the
        pool's reuse policies allow (``hipMemPoolReuse*``): opportunistically once the freeing
        stream's work is done, or with a dependency the runtime inserts.  Work runs when it is
        submitted here, so a freeing stream is done unless a test made it busy."""
        freed = pool.freed_on.get(ptr)
        if freed is None or stream is None or freed == stream:
            return True
        if pool.reuse[2]:     # AllowInternalDependencies: the runtime orders the two streams
            return True
        if pool.reuse[1]:     # AllowOpportunistic: the free's work is done
            s = self._streams.get(freed)
            return s is None or not s.busy
        return False          # FollowEventDependencies alone: no event is followed here

    def _pool_alloc(self, pool: Pool, size: int, stream: Optional[int] = None) -> int:
        """Allocate ``size`` (> 0) bytes from ``pool`` for ``stream``; Status(OUT_OF_MEMORY)
        leaves all unchanged."""
        need = round_up(size)
        best = None
        for i, (block, ptr) in enumerate(pool.cache):
            if need <= block and block * 8 <= need * 9 and (
                    best is None or block < pool.cache[best][0]) and \
                    self._reusable(pool, ptr, stream):
                best = i
        if best is not None:
            block, ptr = pool.cache.pop(best)
            pool.freed_on.pop(ptr, None)
        else:
            keep = pool.reserved   # what the pool may keep reserved so that `need` fits
            keep = min(keep, pool.reserved - (need - self._room(pool.host, pool.device)))
            if pool.max_size:
                keep = min(keep, pool.max_size - need)
            if keep < pool.used:
                raise Status(OUT_OF_MEMORY)
            self._pool_release(pool, keep)
            ptr = pool.arena.alloc(need) if pool.arena is not None else self._heap.alloc(need)
            if not ptr:
                raise Status(OUT_OF_MEMORY)
            block = need
            pool.reserved += block
            self._commit(pool.host, pool.device, block)
            pool.reserved_high = max(pool.reserved_high, pool.reserved)
        pool.used += block
        pool.used_high = max(pool.used_high, pool.used)
        pool.live += 1
        self._register(Alloc(ptr, size, block, pool.device, PINNED if pool.host else DEVICE, 0,
                             pool))
        return ptr

    def _async_alloc(self, out_ptr: Any, size: Any, pool_handle: Optional[Any],
                     stream: Any) -> None:
        target = out(out_ptr, c_void_p)
        nbytes = u64(size)
        with self._lock:
            s = self._stream_or(addr(stream), INVALID_VALUE)
            pool = (self._devices[s.device].current_pool if pool_handle is None
                    else self._pool(pool_handle))
            if pool.imported:   # an imported pool only maps
                raise Status(INVALID_VALUE)
            if not nbytes:
                target.value = None
                return
            try:
                target.value = self._pool_alloc(pool, nbytes, addr(stream))
            except Status:
                target.value = None
                raise

    # ---- HIP functions --------------------------------------------------------------------
    def hipMallocAsync(self, dev_ptr: Any, size: Any, stream: Any) -> None:
        """hipMallocAsync(void**, size_t, hipStream_t): from the stream's device's current pool."""
        self._async_alloc(dev_ptr, size, None, stream)

    def hipMallocFromPoolAsync(self, dev_ptr: Any, size: Any, mem_pool: Any,
                               stream: Any) -> None:
        """hipMallocFromPoolAsync(void**, size_t, hipMemPool_t, hipStream_t)."""
        if not addr(mem_pool):
            raise Status(INVALID_VALUE)
        self._async_alloc(dev_ptr, size, mem_pool, stream)

    def hipFreeAsync(self, dev_ptr: Any, stream: Any) -> None:
        """hipFreeAsync(void*, hipStream_t): pool blocks go back to their pool's cache."""
        ptr = addr(dev_ptr)
        with self._lock:
            self._stream_or(addr(stream), INVALID_VALUE)
            if not ptr:
                if self.version >= (7, 0, 0):
                    return
                raise Status(INVALID_VALUE)
            alloc = self._allocs.get(ptr)
            if alloc is None or (alloc.kind not in (DEVICE, MANAGED, GRAPH)
                                  and alloc.pool is None):
                raise Status(INVALID_VALUE)
            self._release_alloc(alloc)
            pool = alloc.pool
            if pool is not None and pool.alive and not pool.imported:
                pool.freed_on[ptr] = addr(stream)

    def hipMemPoolCreate(self, mem_pool: Any, pool_props: Any) -> None:
        """hipMemPoolCreate(hipMemPool_t*, const hipMemPoolProps*): pinned memory located on
        a device, or, from HIP 7.2 (hipMemLocationTypeHost), on the host (the id is ignored;
        the pool belongs to the calling thread's device for its bookkeeping)."""
        target = out(mem_pool, c_void_p)
        props = out(pool_props, hipMemPoolProps)
        host = (props.location.type == hipMemLocationTypeHost
                and self.version >= HOST_POOLS_SINCE)
        if (props.allocType != hipMemAllocationTypePinned
                or (props.location.type != hipMemLocationTypeDevice and not host)
                or props.handleTypes not in (hipMemHandleTypeNone,
                                             hipMemHandleTypePosixFileDescriptor)):
            raise Status(INVALID_VALUE)
        dev = (self._current() if host
               else self._device(props.location.id, INVALID_VALUE))
        arena = None
        if props.handleTypes == hipMemHandleTypePosixFileDescriptor:
            try:   # IPC-enabled: allocate from memory another process can map
                arena = SharedArena.create(dev.ordinal, props.maxSize or dev.capacity)
            except (OSError, ValueError, OverflowError):
                raise Status(OUT_OF_MEMORY) from None
        with self._lock:
            pool = Pool(self._new_handle(), dev.ordinal, False, props.handleTypes,
                        props.maxSize)
            pool.arena = arena
            pool.host = host
            self._pools[pool.handle] = pool
        target.value = pool.handle

    def hipMemPoolDestroy(self, mem_pool: Any) -> None:
        """hipMemPoolDestroy(hipMemPool_t): releases the cache; live blocks die when freed."""
        with self._lock:
            pool = self._pool(mem_pool)
            if pool.is_default:
                raise Status(INVALID_VALUE)
            self._pool_release(pool, 0)
            pool.alive = False
            if pool.arena is not None and not pool.live:
                pool.arena.close()
            del self._pools[pool.handle]
            dev = self._devices[pool.device]
            if dev.current_pool is pool:
                dev.current_pool = dev.default_pool

    def hipMemPoolSetAttribute(self, mem_pool: Any, attr: Any, value: Any) -> None:
        """hipMemPoolSetAttribute(hipMemPool_t, hipMemPoolAttr, void*): byref(c_int | c_uint64)."""
        attr = i32(attr)
        with self._lock:
            pool = self._pool(mem_pool)
            if 1 <= attr <= 3:
                pool.reuse[attr - 1] = int_cell(value, 4).value
            elif attr == hipMemPoolAttrReleaseThreshold:
                pool.threshold = u64(int_cell(value, 8).value)
            elif attr in (hipMemPoolAttrReservedMemHigh, hipMemPoolAttrUsedMemHigh):
                if int_cell(value, 8).value != 0:
                    raise Status(INVALID_VALUE)   # a high-water mark can only be reset
                if attr == hipMemPoolAttrReservedMemHigh:
                    pool.reserved_high = pool.reserved
                else:
                    pool.used_high = pool.used
            else:   # ReservedMemCurrent / UsedMemCurrent are read-only; others are unknown
                raise Status(INVALID_VALUE)

    def hipMemPoolGetAttribute(self, mem_pool: Any, attr: Any, value: Any) -> None:
        """hipMemPoolGetAttribute(hipMemPool_t, hipMemPoolAttr, void*): byref(c_int | c_uint64)."""
        attr = i32(attr)
        with self._lock:
            pool = self._pool(mem_pool)
            if 1 <= attr <= 3:
                int_cell(value, 4).value = pool.reuse[attr - 1]
                return
            readings = {hipMemPoolAttrReleaseThreshold: pool.threshold,
                        hipMemPoolAttrReservedMemCurrent: pool.reserved,
                        hipMemPoolAttrReservedMemHigh: pool.reserved_high,
                        hipMemPoolAttrUsedMemCurrent: pool.used,
                        hipMemPoolAttrUsedMemHigh: pool.used_high}
            if attr not in readings:
                raise Status(INVALID_VALUE)
            int_cell(value, 8).value = readings[attr]

    def hipMemPoolTrimTo(self, mem_pool: Any, min_bytes_to_hold: Any) -> None:
        """hipMemPoolTrimTo(hipMemPool_t, size_t): release cache down to max(n, used) reserved."""
        keep = u64(min_bytes_to_hold)
        with self._lock:
            pool = self._pool(mem_pool)
            self._pool_release(pool, max(keep, pool.used))

    def hipMemPoolSetAccess(self, mem_pool: Any, desc_list: Any, count: Any) -> None:
        """hipMemPoolSetAccess(hipMemPool_t, const hipMemAccessDesc*, size_t): all-or-nothing."""
        n = u64(count)
        with self._lock:
            pool = self._pool(mem_pool)
            descs = out_array(desc_list, hipMemAccessDesc, n)
            wanted = []
            for desc in descs:
                if (desc.location.type != hipMemLocationTypeDevice
                        or desc.flags not in _ACCESS_FLAGS):
                    raise Status(INVALID_VALUE)
                wanted.append((self._device(desc.location.id, INVALID_VALUE).ordinal,
                               desc.flags))
            for ordinal, flags in wanted:
                if ordinal != pool.device:   # the owner always has read-write access
                    pool.access[ordinal] = flags

    def hipMemPoolGetAccess(self, flags: Any, mem_pool: Any, location: Any) -> None:
        """hipMemPoolGetAccess(hipMemAccessFlags*, hipMemPool_t, hipMemLocation*)."""
        target = out(flags, c_int)
        loc = out(location, hipMemLocation)
        with self._lock:
            pool = self._pool(mem_pool)
            if loc.type != hipMemLocationTypeDevice:
                raise Status(INVALID_VALUE)
            ordinal = self._device(loc.id, INVALID_VALUE).ordinal
            target.value = (hipMemAccessFlagsProtReadWrite if ordinal == pool.device
                            else pool.access.get(ordinal, hipMemAccessFlagsProtNone))

    def hipDeviceGetDefaultMemPool(self, mem_pool: Any, device: Any) -> None:
        """hipDeviceGetDefaultMemPool(hipMemPool_t*, int)."""
        target = out(mem_pool, c_void_p)
        target.value = self._device(i32(device)).default_pool.handle

    def hipDeviceGetMemPool(self, mem_pool: Any, device: Any) -> None:
        """hipDeviceGetMemPool(hipMemPool_t*, int): the device's current pool."""
        target = out(mem_pool, c_void_p)
        dev = self._device(i32(device), INVALID_VALUE)
        with self._lock:
            target.value = dev.current_pool.handle

    def hipDeviceSetMemPool(self, device: Any, mem_pool: Any) -> None:
        """hipDeviceSetMemPool(int, hipMemPool_t): the pool must belong to that device."""
        dev = self._device(i32(device), INVALID_VALUE)
        with self._lock:
            pool = self._pool(mem_pool)
            if pool.imported or pool.host:
                raise Status(INVALID_VALUE)    # an imported pool cannot allocate; a host pool
            if pool.device != dev.ordinal:     # is no device's current pool
                raise Status(INVALID_DEVICE)   # as AMD returns
            dev.current_pool = pool

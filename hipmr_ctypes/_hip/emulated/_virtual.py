"""Virtual memory: hipMemAddressReserve / Free, hipMemCreate / Release, hipMemMap / Unmap,
hipMemSetAccess / GetAccess, hipMemGetAllocationGranularity, over ``_vspace.VirtualSpace``.

The rules are the real runtimes' (CUDA's driver documents them most precisely): sizes,
addresses and offsets are multiples of the granularity; a physical allocation counts against
its device's memory from hipMemCreate until it is both released and unmapped; a mapping has
no access until hipMemSetAccess grants it, per device; unmapping and setting access cover whole
mappings.  Stricter than the real runtimes, to catch a caller's mistake: freeing a reservation
that still has mappings is invalid value.
"""
from __future__ import annotations

import ctypes
from ctypes import c_size_t, c_ulonglong, c_void_p
from typing import Any, List, Tuple

from ..decls import hipMemAccessDesc, hipMemLocation
from ..types import allocation_prop_type
from ._args import Status, addr, i32, out, out_array, u64
from ._core import INVALID_VALUE, OUT_OF_MEMORY, EmulatorCore
from ._vspace import GRANULARITY, Mapping, Physical, Reservation, VirtualSpace

__all__ = ["VirtualMixin"]

NOT_SUPPORTED = 801
_ACCESS_FLAGS = frozenset({0, 1, 3})   # hipMemAccessFlagsProtNone / ProtRead / ProtReadWrite


def _granular(*values: int) -> bool:
    return all(v % GRANULARITY == 0 for v in values)


class VirtualMixin(EmulatorCore):
    """The virtual-memory calls (see the module's docstring)."""

    # ---- helpers (lock held) --------------------------------------------------------------
    def _vmm_space(self) -> VirtualSpace:
        if not self._vspace.supported:
            raise Status(NOT_SUPPORTED)
        return self._vspace

    def _allocation_device(self, prop: Any) -> int:
        """The device of a ``hipMemAllocationProp`` argument (this release's layout), checked:
        pinned device memory, no handle type or a POSIX file descriptor."""
        p = addr(prop)
        if not p:
            raise Status(INVALID_VALUE)
        ptype: Any = allocation_prop_type(self.version[0], self.version[1])
        value: Any = ptype.from_buffer_copy(ctypes.string_at(p, ctypes.sizeof(ptype)))
        if (value.type != 1 or value.location.type != 1
                or value.requestedHandleType not in (0, 1)):
            raise Status(INVALID_VALUE)
        return self._device(value.location.id, INVALID_VALUE).ordinal

    def _range(self, ptr: int, size: int) -> Reservation:
        """The reservation that holds all of ``[ptr, ptr + size)`` (granular, not empty)."""
        if not size or not _granular(ptr, size):
            raise Status(INVALID_VALUE)
        r = self._vmm_space().reservation_of(ptr, size)
        if r is None or ptr < r.base or ptr + size > r.base + r.size:
            raise Status(INVALID_VALUE)
        return r

    def _whole_mappings(self, ptr: int, size: int) -> Tuple[Reservation, List[Mapping]]:
        """The mappings that exactly make up ``[ptr, ptr + size)``."""
        r = self._range(ptr, size)
        found = r.covering(ptr, size)
        if not found or found[0].ptr != ptr or found[-1].ptr + found[-1].size != ptr + size:
            raise Status(INVALID_VALUE)
        return r, found

    def _physical(self, handle: Any) -> Physical:
        phys = self._vmm_space().physicals.get(addr(handle))
        if phys is None or phys.released:
            raise Status(INVALID_VALUE)
        return phys

    def _gone(self, phys: Physical) -> None:
        """``phys``'s memory went back: its device has it free again."""
        self._devices[phys.device].committed -= phys.size

    # ---- HIP functions --------------------------------------------------------------------
    def hipMemGetAllocationGranularity(self, granularity: Any, prop: Any, option: Any) -> None:
        """hipMemGetAllocationGranularity(size_t*, const hipMemAllocationProp*, flags):
        2 MiB, minimum and recommended."""
        target = out(granularity, c_size_t)
        if i32(option) not in (0, 1):
            raise Status(INVALID_VALUE)
        with self._lock:
            self._vmm_space()
            self._allocation_device(prop)
        target.value = GRANULARITY

    def hipMemAddressReserve(self, ptr: Any, size: Any, alignment: Any, hint: Any,
                             flags: Any) -> None:
        """hipMemAddressReserve(void**, size_t, size_t alignment, void* addr, ull flags): the
        address is a hint, not followed here; alignment 0 means the granularity."""
        target = out(ptr, c_void_p)
        n, align, _ = u64(size), u64(alignment), addr(hint)
        if u64(flags) or not n or not _granular(n) or (align & (align - 1)):
            raise Status(INVALID_VALUE)
        with self._lock:
            base = self._vmm_space().reserve(n, max(align, GRANULARITY))
        if not base:
            raise Status(OUT_OF_MEMORY)
        target.value = base

    def hipMemAddressFree(self, ptr: Any, size: Any) -> None:
        """hipMemAddressFree(void*, size_t): a whole reservation with nothing mapped in it."""
        p, n = addr(ptr), u64(size)
        with self._lock:
            space = self._vmm_space()
            r = space.reservations.get(p)
            if r is None or r.size != n or r.mappings:
                raise Status(INVALID_VALUE)
            space.free(r)

    def hipMemCreate(self, handle: Any, size: Any, prop: Any, flags: Any) -> None:
        """hipMemCreate(handle*, size_t, const hipMemAllocationProp*, ull flags): physical
        memory of the property's device, counted against it at once."""
        target = out(handle, c_void_p)
        n = u64(size)
        if u64(flags) or not n or not _granular(n):
            raise Status(INVALID_VALUE)
        with self._lock:
            space = self._vmm_space()
            dev = self._devices[self._allocation_device(prop)]
            if n > dev.capacity - dev.committed:
                raise Status(OUT_OF_MEMORY)
            try:
                phys = space.create(self._new_handle(), dev.ordinal, n)
            except OSError:
                raise Status(OUT_OF_MEMORY) from None
            dev.committed += n
        target.value = phys.handle

    def hipMemRelease(self, handle: Any) -> None:
        """hipMemRelease(handle): the memory goes once no mapping of it is left."""
        with self._lock:
            phys = self._physical(handle)
            phys.released = True
            if self._vspace.drop(phys):
                self._gone(phys)

    def hipMemMap(self, ptr: Any, size: Any, offset: Any, handle: Any, flags: Any) -> None:
        """hipMemMap(void*, size_t, size_t offset, handle, ull flags): into a reservation,
        over nothing mapped yet; no access until hipMemSetAccess."""
        p, n, off = addr(ptr), u64(size), u64(offset)
        if u64(flags) or not _granular(off):
            raise Status(INVALID_VALUE)
        with self._lock:
            r = self._range(p, n)
            phys = self._physical(handle)
            if off + n > phys.size or r.overlaps(p, n):
                raise Status(INVALID_VALUE)
            if not self._vspace.map(r, p, n, off, phys):
                raise Status(OUT_OF_MEMORY)

    def hipMemUnmap(self, ptr: Any, size: Any) -> None:
        """hipMemUnmap(void*, size_t): whole mappings; the range stays reserved."""
        p, n = addr(ptr), u64(size)
        with self._lock:
            r, found = self._whole_mappings(p, n)
            for m in found:
                if self._vspace.unmap(r, m):
                    self._gone(m.physical)

    def hipMemSetAccess(self, ptr: Any, size: Any, desc: Any, count: Any) -> None:
        """hipMemSetAccess(void*, size_t, const hipMemAccessDesc*, size_t count): per device,
        over whole mappings."""
        p, n, c = addr(ptr), u64(size), u64(count)
        if not c:
            raise Status(INVALID_VALUE)
        wanted = []
        for d in out_array(desc, hipMemAccessDesc, c):
            if d.location.type != 1 or d.flags not in _ACCESS_FLAGS:
                raise Status(INVALID_VALUE)
            wanted.append((self._device(d.location.id, INVALID_VALUE).ordinal, d.flags))
        with self._lock:
            _, found = self._whole_mappings(p, n)
            for m in found:
                for device, value in wanted:
                    if value:
                        m.access[device] = value
                    else:
                        m.access.pop(device, None)
                self._vspace.protect(m)

    def hipMemGetAccess(self, flags: Any, location: Any, ptr: Any) -> None:
        """hipMemGetAccess(ull*, const hipMemLocation*, void*): of the mapping at ``ptr``."""
        target = out(flags, c_ulonglong)
        loc = out(location, hipMemLocation)
        if loc.type != 1:
            raise Status(INVALID_VALUE)
        device = self._device(loc.id, INVALID_VALUE).ordinal
        p = addr(ptr)
        with self._lock:
            r = self._vmm_space().reservation_of(p)
            m = r.mapping_at(p) if r is not None else None
            if m is None:
                raise Status(INVALID_VALUE)
            target.value = m.access.get(device, 0)

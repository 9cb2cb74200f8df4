"""The emulator's virtual address space: reserved ranges into which "physical" allocations are
mapped, as the real runtimes' virtual-memory calls do (``_virtual.py`` holds those calls).

A reservation is an ``mmap`` of ``PROT_NONE`` pages (no memory behind them); a physical
allocation is a ``memfd`` file of its size; mapping one maps the file's pages at a fixed
address inside the reservation (``MAP_SHARED | MAP_FIXED``), still ``PROT_NONE`` until access is
set (``mprotect``); unmapping maps ``PROT_NONE`` anonymous pages back over the range.  So an
address stays the same across unmap and remap, the data of a physical allocation lives as long
as its file (released and no longer mapped: closed), and nothing in an unmapped range can be
read or written: the emulated copies and memsets ask :meth:`VirtualSpace.accessible` first, under
the emulator's lock, which every map, unmap and access change also holds.

Linux only (``memfd_create``); elsewhere :attr:`VirtualSpace.supported` is False and the calls
answer ``hipErrorNotSupported``.  Every method is called with the emulator's lock held.
"""
from __future__ import annotations

import bisect
import os
import sys
from typing import Any, Dict, List, Optional

from ..native import address_space_calls

__all__ = ["VirtualSpace", "Physical", "Mapping", "Reservation", "GRANULARITY"]

#: the granularity of sizes, addresses and offsets (the real runtimes' on current GPUs)
GRANULARITY = 2 << 20

_PROT_NONE, _PROT_READ, _PROT_WRITE = 0, 1, 2
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = (
    0x01, 0x02, 0x10, 0x20, 0x4000)   # Linux's values (x86-64, AArch64, POWER alike)
_MAP_FAILED = (1 << 64) - 1
READ, READ_WRITE = 1, 3               # hipMemAccessFlagsProtRead / ProtReadWrite


class Physical:
    """One physical allocation (hipMemCreate): its memfd, size and device.  ``refs``: one
    while not released, plus one per mapping; the memory goes at zero."""
    __slots__ = ("handle", "device", "size", "fd", "refs", "released")

    def __init__(self, handle: int, device: int, size: int, fd: int) -> None:
        self.handle, self.device, self.size, self.fd = handle, device, size, fd
        self.refs = 1
        self.released = False


class Mapping:
    """``size`` bytes of ``physical`` from ``offset``, mapped at ``ptr``; ``access``: device ->
    hipMemAccessFlags."""
    __slots__ = ("ptr", "size", "offset", "physical", "access")

    def __init__(self, ptr: int, size: int, offset: int, physical: Physical) -> None:
        self.ptr, self.size, self.offset, self.physical = ptr, size, offset, physical
        self.access: Dict[int, int] = {}


class Reservation:
    """A reserved range ``[base, base + size)`` and the mappings in it (by address)."""
    __slots__ = ("base", "size", "mappings", "starts")

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size = base, size
        self.mappings: Dict[int, Mapping] = {}
        self.starts: List[int] = []          # sorted keys of ``mappings``

    def mapping_at(self, ptr: int) -> Optional[Mapping]:
        """The mapping holding address ``ptr``, or None."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            m = self.mappings[self.starts[i]]
            if ptr < m.ptr + m.size:
                return m
        return None

    def overlaps(self, ptr: int, size: int) -> bool:
        """True when ``[ptr, ptr + size)`` touches a mapping."""
        if self.mapping_at(ptr) is not None:
            return True
        i = bisect.bisect_right(self.starts, ptr)
        return i < len(self.starts) and self.starts[i] < ptr + size

    def covering(self, ptr: int, size: int) -> Optional[List[Mapping]]:
        """The mappings that cover ``[ptr, ptr + size)`` with no gap, in order, or None."""
        found: List[Mapping] = []
        at, end = ptr, ptr + size
        while at < end:
            m = self.mapping_at(at)
            if m is None:
                return None
            found.append(m)
            at = m.ptr + m.size
        return found


class VirtualSpace:
    """Reservations, physical allocations and mappings of one emulator (its lock held)."""

    def __init__(self) -> None:
        calls = address_space_calls() if hasattr(os, "memfd_create") else None
        self.supported = calls is not None
        self._mmap: Any = None
        self._munmap: Any = None
        self._mprotect: Any = None
        if calls is not None:
            self._mmap, self._munmap, self._mprotect = calls
        self.reservations: Dict[int, Reservation] = {}
        self._bases: List[int] = []
        self.physicals: Dict[int, Physical] = {}

    # ---- queries --------------------------------------------------------------------------
    def reservation_of(self, ptr: int, size: int = 1) -> Optional[Reservation]:
        """The reservation that ``[ptr, ptr + size)`` starts in or runs into, or None."""
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i >= 0:
            r = self.reservations[self._bases[i]]
            if ptr < r.base + r.size:
                return r
        i += 1
        if i < len(self._bases) and self._bases[i] < ptr + max(size, 1):
            return self.reservations[self._bases[i]]
        return None

    def accessible(self, ptr: int, size: int, device: int, write: bool) -> bool:
        """True when all of ``[ptr, ptr + size)`` lies in one reservation, mapped with no gap,
        and readable (``write``: writable) by ``device``."""
        r = self.reservation_of(ptr, size)
        if r is None or ptr < r.base or ptr + size > r.base + r.size:
            return False
        found = r.covering(ptr, size)
        if found is None:
            return False
        need = READ_WRITE if write else READ
        return all(m.access.get(device, 0) & need == need for m in found)

    # ---- changes (each returns False / raises OSError where the host refuses) --------------
    def reserve(self, size: int, alignment: int) -> int:
        """A new reservation of ``size`` bytes aligned to ``alignment`` (a power of two, at
        least the page size); 0 when the address space cannot hold it."""
        assert self._mmap is not None and self._munmap is not None
        span = size + alignment
        raw: Optional[int] = self._mmap(None, span, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE,
                         -1, 0)
        if raw is None or raw == _MAP_FAILED:
            return 0
        base = (raw + alignment - 1) // alignment * alignment
        if base > raw:
            self._munmap(raw, base - raw)
        tail = raw + span - (base + size)
        if tail:
            self._munmap(base + size, tail)
        self.reservations[base] = Reservation(base, size)
        bisect.insort(self._bases, base)
        return base

    def free(self, r: Reservation) -> None:
        """Give a reservation (with no mapping left) back to the host."""
        assert self._munmap is not None
        del self.reservations[r.base]
        del self._bases[bisect.bisect_left(self._bases, r.base)]
        self._munmap(r.base, r.size)

    def create(self, handle: int, device: int, size: int) -> Physical:
        """A new physical allocation (OSError when the host cannot make its file)."""
        fd = os.memfd_create("hipmr-emulated-vmm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        except OSError:
            os.close(fd)
            raise
        phys = Physical(handle, device, size, fd)
        self.physicals[handle] = phys
        return phys

    def drop(self, phys: Physical) -> bool:
        """One reference of ``phys`` less; True when that was the last (its memory is gone)."""
        phys.refs -= 1
        if phys.refs:
            return False
        del self.physicals[phys.handle]
        os.close(phys.fd)
        return True

    def map(self, r: Reservation, ptr: int, size: int, offset: int, phys: Physical) -> bool:
        """Map ``size`` bytes of ``phys`` from ``offset`` at ``ptr`` (no access yet)."""
        assert self._mmap is not None
        got = self._mmap(ptr, size, _PROT_NONE, _MAP_SHARED | _MAP_FIXED, phys.fd, offset)
        if got != ptr:
            return False
        m = Mapping(ptr, size, offset, phys)
        r.mappings[ptr] = m
        bisect.insort(r.starts, ptr)
        phys.refs += 1
        return True

    def unmap(self, r: Reservation, m: Mapping) -> bool:
        """Put reserved, inaccessible pages back where ``m`` was; True when that released the
        physical memory (it was released and this was its last mapping)."""
        assert self._mmap is not None
        self._mmap(m.ptr, m.size, _PROT_NONE,
                   _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED, -1, 0)
        del r.mappings[m.ptr]
        del r.starts[bisect.bisect_left(r.starts, m.ptr)]
        return self.drop(m.physical)

    def protect(self, m: Mapping) -> None:
        """Make the host pages of ``m`` as accessible as its most permissive device access (the
        emulated copies check each device's own access first)."""
        assert self._mprotect is not None
        flags = 0
        for value in m.access.values():
            flags |= value
        prot = (_PROT_READ | _PROT_WRITE if flags & 2 else _PROT_READ if flags & 1
                else _PROT_NONE)
        self._mprotect(m.ptr, m.size, prot)

    def release_all(self) -> None:
        """Unmap and free everything (emulator reset or garbage collection)."""
        for r in list(self.reservations.values()):
            r.mappings.clear()
            r.starts.clear()
            self.free(r)
        for phys in list(self.physicals.values()):
            os.close(phys.fd)
        self.physicals.clear()


def release_unless_exiting(space: VirtualSpace, exiting: "object" = sys.is_finalizing) -> None:
    """The emulator's finalizer for its address space (as ``_core``'s for its heap)."""
    if not exiting():  # type: ignore[operator]
        space.release_all()


"""Shared memory for the emulated IPC-enabled memory pools: one ``memfd`` per pool, mapped
with ``mmap(MAP_SHARED)``, whose descriptor is what ``hipMemPoolExportToShareableHandle``
hands out.  Another process maps the same file: the same pages at another address, as GPU
IPC gives.  Blocks are handed out by offset (first fit, freed ranges merged).

The first page is a header another process reads when it imports the pool: a magic, the
pool's identity, its device and its capacity.  A leaf module (standard library only).
"""
from __future__ import annotations

import bisect
import ctypes
import os
import struct
from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:  # mmap itself is imported by the first pool that shares memory
    import mmap

__all__ = ["SharedArena", "ARENA_ID_BYTES"]

ARENA_ID_BYTES = 16
_MAGIC = b"HMRARENA"
_HEADER = struct.Struct(f"<8s{ARENA_ID_BYTES}siQ")   # magic, id, device, capacity
# the page size mmap maps in (mmap.PAGESIZE), read without importing mmap
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_ALIGN = 256


def _new_file(size: int) -> int:
    """A new anonymous file of ``size`` bytes (sparse), as a descriptor."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd: int = memfd_create("hipmr-emulated-pool", getattr(os, "MFD_CLOEXEC", 1))
    else:  # POSIX without memfd: an unlinked file, in shared memory where there is some
        import tempfile  # (only here: it is slow to import)
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryFile(dir=directory) as f:
            fd = os.dup(f.fileno())
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedArena:
    """One pool's shared memory.  :meth:`create` makes a new one (the exporting side: it
    allocates); :meth:`open` maps one another process exported (the importing side: it only
    translates offsets).  :meth:`close` unmaps it; pointers into it are invalid after that."""

    __slots__ = ("ident", "device", "capacity", "base", "owner", "_fd", "_map", "_anchor",
                 "_free")

    def __init__(self, fd: int, mapping: "mmap.mmap", ident: bytes, device: int, capacity: int,
                 owner: bool) -> None:
        self._fd: Optional[int] = fd
        self._map: "Optional[mmap.mmap]" = mapping
        self._anchor: "Optional[ctypes.Array[ctypes.c_char]]" = (ctypes.c_char * len(mapping)).from_buffer(
            mapping)
        self.base = ctypes.addressof(self._anchor) + _PAGE   # the first block's address
        self.ident, self.device, self.capacity, self.owner = ident, device, capacity, owner
        self._free: List[Tuple[int, int]] = [(0, capacity)]  # (offset, size), sorted

    @classmethod
    def create(cls, device: int, capacity: int) -> "SharedArena":
        """A new arena of ``capacity`` bytes (rounded up to a page) for a pool of ``device``."""
        import mmap
        capacity = -(-capacity // _PAGE) * _PAGE
        ident = os.urandom(ARENA_ID_BYTES)
        fd = _new_file(_PAGE + capacity)
        try:
            mapping = mmap.mmap(fd, _PAGE + capacity, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        mapping[:_HEADER.size] = _HEADER.pack(_MAGIC, ident, device, capacity)
        return cls(fd, mapping, ident, device, capacity, True)

    @classmethod
    def open(cls, fd: int) -> "SharedArena":
        """Map the arena behind ``fd`` (a descriptor :meth:`export_fd` gave, possibly in another
        process); ``fd`` itself is not kept.  OSError / ValueError when it is not one."""
        import mmap
        size = os.fstat(fd).st_size
        if size < _PAGE + _PAGE:
            raise ValueError("not an emulated memory pool")
        own = os.dup(fd)
        try:
            mapping = mmap.mmap(own, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(own)
            raise
        magic, ident, device, capacity = _HEADER.unpack(mapping[:_HEADER.size])
        if magic != _MAGIC or capacity != size - _PAGE:
            mapping.close()
            os.close(own)
            raise ValueError("not an emulated memory pool")
        arena = cls(own, mapping, ident, device, capacity, False)
        arena._free = []
        return arena

    @property
    def closed(self) -> bool:
        """True once unmapped."""
        return self._map is None

    def export_fd(self) -> int:
        """A new descriptor of the arena's file (the caller owns it)."""
        if self._fd is None:
            raise ValueError("arena closed")
        return os.dup(self._fd)

    def alloc(self, nbytes: int) -> int:
        """The address of a new block of ``nbytes`` (> 0, rounded up to 256); 0 when no free
        range is large enough."""
        need = -(-nbytes // _ALIGN) * _ALIGN
        for i, (offset, size) in enumerate(self._free):
            if size >= need:
                if size == need:
                    del self._free[i]
                else:
                    self._free[i] = (offset + need, size - need)
                return self.base + offset
        return 0

    def free(self, ptr: int, nbytes: int) -> None:
        """Give back the block at ``ptr`` of ``nbytes`` (as given to :meth:`alloc`)."""
        need = -(-nbytes // _ALIGN) * _ALIGN
        offset = ptr - self.base
        i = bisect.bisect_left(self._free, (offset, 0))
        self._free.insert(i, (offset, need))
        if i + 1 < len(self._free) and offset + need == self._free[i + 1][0]:
            self._free[i] = (offset, need + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            prev = self._free[i - 1]
            self._free[i - 1] = (prev[0], prev[1] + self._free.pop(i)[1])

    def offset_of(self, ptr: int) -> int:
        """Where ``ptr`` lies in the arena."""
        return ptr - self.base

    def close(self) -> None:
        """Unmap and close (idempotent)."""
        mapping, fd = self._map, self._fd
        self._map = self._fd = None
        self._anchor = None
        if mapping is not None:
            mapping.close()
        if fd is not None:
            os.close(fd)

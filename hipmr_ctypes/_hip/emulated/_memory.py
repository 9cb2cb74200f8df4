"""Plain memory: hipMalloc / hipFree, pinned and managed memory, copies, memset, pointer queries."""
from __future__ import annotations

import ctypes
import sys
from ctypes import c_size_t, c_void_p
from typing import Any, Optional

from ..types import (hipPointerAttribute_t,
                     hipMemAttachGlobal, hipMemAttachHost, hipMemcpyDefault,
                     hipMemcpyDeviceToDevice, hipMemcpyDeviceToHost, hipMemcpyHostToDevice,
                     hipMemcpyHostToHost)
from ._args import MAX_ADDRESS, Status, addr, extent, i32, out, out_array, u32, u64
from ._core import (DEVICE, HOST_MEMORY_ALREADY_REGISTERED, HOST_MEMORY_NOT_REGISTERED,
                    INVALID_MEMCPY_DIRECTION, INVALID_VALUE, MANAGED, MIN_HOST_ADDRESS,
                    OUT_OF_MEMORY, PINNED, REGISTERED, Alloc, EmulatorCore, round_up)

__all__ = ["MemoryMixin"]

hipMemcpyDeviceToDeviceNoCU = 1024   # HIP >= 6.1
# hipHostMalloc flags: Portable, Mapped, WriteCombined, NumaUser, Coherent, NonCoherent
_HOST_MALLOC_FLAGS = 0x1 | 0x2 | 0x4 | 0x20000000 | 0x40000000 | 0x80000000
_HOST_MALLOC_UNCACHED = 0x10000000   # HIP >= 7.0
_COHERENT_BOTH = 0x40000000 | 0x80000000
# hipMemoryType numbering (ROCm 6 and later; tests/binding/test_abi.py checks it against the
# headers)
# (registered host memory is host memory, as hipHostMalloc's is)
_MEMORY_TYPE_6 = {PINNED: 1, REGISTERED: 1, DEVICE: 2, MANAGED: 3}
_MEMORY_TYPE_5 = {PINNED: 0, REGISTERED: 0, DEVICE: 1, MANAGED: 4}
# hipHostRegister flags: Portable, Mapped, IoMemory, hipExtHostRegisterCoarseGrained
_HOST_REGISTER_FLAGS = 0x1 | 0x2 | 0x4 | 0x8
# hipMemoryAdvise: Set/Unset ReadMostly, PreferredLocation, AccessedBy (1-6), CoarseGrain
_ADVICE = frozenset((1, 2, 3, 4, 5, 6, 100, 101))
_SYNC = object()   # "no stream": the synchronous copy and memset
_KINDS = frozenset({hipMemcpyHostToHost, hipMemcpyHostToDevice, hipMemcpyDeviceToHost,
                    hipMemcpyDeviceToDevice, hipMemcpyDefault})
_KINDS_NO_CU = _KINDS | {hipMemcpyDeviceToDeviceNoCU}


def _reaches(alloc: Alloc, device: int) -> bool:
    """Whether a plain copy made while ``device`` is current may touch ``alloc``: hipMalloc,
    pinned and managed memory always (a unified address space), pool memory only on its own
    device or one its pool grants access (CUDA refuses the rest with invalid value, whatever
    the stream's device and the other side of the copy)."""
    pool = alloc.pool
    return (pool is None or pool.host or device == pool.device
            or pool.access.get(device, 0) != 0)


class MemoryMixin(EmulatorCore):
    """hipMalloc, hipExtMallocWithFlags, hipFree, hipHostMalloc, hipHostFree, hipHostRegister, hipHostUnregister,
    hipHostGetDevicePointer, hipMallocManaged, hipMemAdvise, hipMemDiscardBatchAsync,
    hipMemcpy*,
    hipMemcpyPeer*, hipMemset*,
    hipMemPrefetchAsync, hipPointerGetAttributes."""

    # ---- helpers (lock held) --------------------------------------------------------------
    def _plain_alloc(self, out_ptr: Any, size: Any, kind: str, flags: int) -> None:
        target = out(out_ptr, c_void_p)
        nbytes = u64(size)
        if not nbytes:
            target.value = None
            return
        block = round_up(nbytes)
        with self._lock:
            dev = self._current()
            if kind == PINNED:
                room = self.config.host_memory - self._host_committed
            else:
                room = dev.capacity - dev.committed
            ptr = self._heap.alloc(block) if block <= room else 0
            if not ptr:
                target.value = None
                raise Status(OUT_OF_MEMORY)
            if kind == PINNED:
                self._host_committed += block
            else:
                dev.committed += block
            self._register(Alloc(ptr, nbytes, block, dev.ordinal, kind, flags))
        target.value = ptr

    def _check_range(self, ptr: int, nbytes: int, device_side: bool, host_side: bool,
                     write: bool = False, device: Optional[int] = None) -> None:
        """Validate [ptr, ptr + nbytes) as one side of a copy or memset.

        ``device_side``: must lie in one live emulated allocation (any kind: pinned and
        managed memory are device-accessible).  ``host_side``: must not be device-only memory.
        Memory the emulation does not know is trusted as host memory (like the real runtime)
        unless it is near NULL or runs into an emulated allocation or a virtual-memory
        reservation.  Virtual memory must be mapped with no gap and readable (``write``:
        writable) by ``device`` (default: the calling thread's): never is an unmapped page
        touched.
        """
        if ptr < MIN_HOST_ADDRESS or ptr + nbytes > MAX_ADDRESS:
            raise Status(INVALID_VALUE)
        space = self._vspace
        if space.reservations and space.reservation_of(ptr, nbytes) is not None:
            if host_side or not space.accessible(
                    ptr, nbytes, self._tls.device if device is None else device, write):
                raise Status(INVALID_VALUE)
            return
        alloc = self._find(ptr)
        if alloc is None:
            if device_side or self._overlaps_allocation(ptr, nbytes):
                raise Status(INVALID_VALUE)
            return
        if ptr + nbytes > alloc.ptr + alloc.size or (host_side and alloc.kind == DEVICE):
            raise Status(INVALID_VALUE)

    def _copy(self, dst: Any, src: Any, size_bytes: Any, kind: Any, stream: Any) -> None:
        d, s, n, k = addr(dst), addr(src), u64(size_bytes), i32(kind)
        if k not in (_KINDS_NO_CU if self.version >= (6, 1, 0) else _KINDS):
            raise Status(INVALID_MEMCPY_DIRECTION)
        if isinstance(dst, bytes):   # never write into an immutable object
            raise Status(INVALID_VALUE)
        for side in (dst, src):      # a buffer that knows its size must hold the whole copy
            room = extent(side)
            if room is not None and n > room:
                raise Status(INVALID_VALUE)
        with self._lock:
            if stream is not _SYNC:
                self._stream_or(addr(stream))
            if not n:
                return
            to_device = k in (hipMemcpyHostToDevice, hipMemcpyDeviceToDevice,
                              hipMemcpyDeviceToDeviceNoCU)
            from_device = k in (hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice,
                                hipMemcpyDeviceToDeviceNoCU)
            self._check_range(d, n, to_device, k in (hipMemcpyHostToHost, hipMemcpyDeviceToHost),
                              True)
            self._check_range(s, n, from_device, k in (hipMemcpyHostToHost, hipMemcpyHostToDevice))
            current = self._tls.device
            for alloc in (self._find(d), self._find(s)):
                if alloc is not None and not _reaches(alloc, current):
                    raise Status(INVALID_VALUE)   # pool memory of a device that is not current
            ctypes.memmove(d, s, n)

    def _peer_copy(self, dst: Any, dst_device: Any, src: Any, src_device: Any, size_bytes: Any,
                   stream: Any) -> None:
        d, s, n = addr(dst), addr(src), u64(size_bytes)
        self._device(i32(dst_device))
        self._device(i32(src_device))
        with self._lock:
            if stream is not _SYNC:
                self._stream_or(addr(stream))
            if not n:
                return
            self._check_range(d, n, True, False, True, i32(dst_device))
            self._check_range(s, n, True, False, False, i32(src_device))
            ctypes.memmove(d, s, n)

    def _set(self, dst: Any, value: Any, size_bytes: Any, stream: Any) -> None:
        d, v, n = addr(dst), i32(value), u64(size_bytes)
        with self._lock:
            device = (self._tls.device if stream is _SYNC
                      else self._stream_or(addr(stream)).device)
            if not n:
                return
            self._check_range(d, n, True, False, True, device)
            alloc = self._find(d)
            if alloc is not None and not _reaches(alloc, device):
                raise Status(INVALID_VALUE)   # pool memory set by another device's stream
            ctypes.memset(d, v & 0xFF, n)

    def _set_elements(self, dst: Any, value: int, count: Any, width: int, stream: Any) -> None:
        """hipMemsetD8/D16/D32(Async): ``count`` elements of ``width`` bytes, each ``value``
        (native byte order), inside one live allocation; the address must be aligned to the
        element (cuda.h requires it of cuMemsetD16/D32; invalid value here)."""
        d, n = addr(dst), u64(count)
        if n > MAX_ADDRESS // width:
            raise Status(INVALID_VALUE)
        nbytes = n * width
        with self._lock:
            device = (self._tls.device if stream is _SYNC
                      else self._stream_or(addr(stream)).device)
            if not n:
                return
            if d % width:
                raise Status(INVALID_VALUE)
            self._check_range(d, nbytes, True, False, True, device)
            alloc = self._find(d)
            if alloc is not None and not _reaches(alloc, device):
                raise Status(INVALID_VALUE)
            if width == 1:
                ctypes.memset(d, value, n)
                return
            element = value.to_bytes(width, sys.byteorder)
            ctypes.memmove(d, element * n, nbytes)

    def _live(self, ptr: Any, kind: Optional[str] = None) -> Alloc:
        """The live allocation that starts at ``ptr`` (of ``kind``), else invalid value."""
        alloc = self._allocs.get(addr(ptr))
        if alloc is None or (kind is not None and alloc.kind != kind):
            raise Status(INVALID_VALUE)
        return alloc

    def _virtual_attributes(self, attrs: Any, p: int) -> None:
        """hipPointerGetAttributes of mapped virtual memory: device memory of the physical
        allocation's device; anything else the emulation does not know is invalid value."""
        r = self._vspace.reservation_of(p) if p and self._vspace.reservations else None
        m = r.mapping_at(p) if r is not None else None
        if m is None:
            raise Status(INVALID_VALUE)
        numbering = _MEMORY_TYPE_6 if self.version >= (6, 0, 0) else _MEMORY_TYPE_5
        attrs.type = numbering[DEVICE]
        attrs.device = m.physical.device
        attrs.devicePointer = p
        attrs.hostPointer = None
        attrs.isManaged = 0
        attrs.allocationFlags = 0

    # ---- HIP functions --------------------------------------------------------------------
    def hipMalloc(self, ptr: Any, size: Any) -> None:
        """hipMalloc(void**, size_t): size 0 gives NULL and success."""
        self._plain_alloc(ptr, size, DEVICE, 0)

    def hipFree(self, ptr: Any) -> None:
        """hipFree(void*): NULL is success; it waits for the device (its streams become idle)."""
        p = addr(ptr)
        if not p:
            return
        with self._lock:
            alloc = self._allocs.get(p)
            if alloc is None or alloc.kind == REGISTERED or (alloc.kind == PINNED
                                                             and alloc.pool is None):
                raise Status(INVALID_VALUE)
            self._release_alloc(alloc)
            self._complete_device(alloc.device)

    def hipHostMalloc(self, ptr: Any, size: Any, flags: Any) -> None:
        """hipHostMalloc(void**, size_t, unsigned): pinned, device-accessible host memory."""
        f = u32(flags)
        allowed = _HOST_MALLOC_FLAGS | (_HOST_MALLOC_UNCACHED if self.version >= (7, 0, 0) else 0)
        if f & ~allowed or (f & _COHERENT_BOTH) == _COHERENT_BOTH:
            raise Status(INVALID_VALUE)
        self._plain_alloc(ptr, size, PINNED, f)

    def hipExtMallocWithFlags(self, ptr: Any, size: Any, flags: Any) -> None:
        """hipExtMallocWithFlags(void**, size_t, unsigned): device memory like hipMalloc's,
        the flag recorded: Default 0, Finegrained 1, Uncached 3 (HIP 5.5+), Contiguous 4
        (HIP 6.2+); the signal flag (2) and any other value are invalid here."""
        f = u32(flags)
        allowed = {0, 1} | ({3} if self.version >= (5, 5, 0) else set()) \
            | ({4} if self.version >= (6, 2, 0) else set())
        if f not in allowed:
            raise Status(INVALID_VALUE)
        self._plain_alloc(ptr, size, DEVICE, f)

    def hipHostFree(self, ptr: Any) -> None:
        """hipHostFree(void*): NULL is success; only hipHostMalloc memory."""
        if not addr(ptr):
            return
        with self._lock:
            self._release_alloc(self._live(ptr, PINNED))

    def hipHostRegister(self, host_ptr: Any, size_bytes: Any, flags: Any) -> None:
        """hipHostRegister(void*, size_t, unsigned): pin the caller's host memory.  Memory
        that overlaps pinned or registered memory: hipErrorHostMemoryAlreadyRegistered;
        device or managed memory, NULL, size 0 or an unknown flag: invalid value.  Any other
        address is trusted as host memory, as the real runtime trusts it."""
        p, n, f = addr(host_ptr), u64(size_bytes), u32(flags)
        if not n or f & ~_HOST_REGISTER_FLAGS or p < MIN_HOST_ADDRESS or p + n > MAX_ADDRESS:
            raise Status(INVALID_VALUE)
        with self._lock:
            if self._overlaps_allocation(p, n):
                overlapped = [a for a in self._allocs.values()
                              if a.ptr < p + n and p < a.ptr + a.size]
                if all(a.kind in (PINNED, REGISTERED) for a in overlapped):
                    raise Status(HOST_MEMORY_ALREADY_REGISTERED)
                raise Status(INVALID_VALUE)
            self._register(Alloc(p, n, 0, self._tls.device, REGISTERED, f))

    def hipHostUnregister(self, host_ptr: Any) -> None:
        """hipHostUnregister(void*): the start of a registration, else
        hipErrorHostMemoryNotRegistered; the memory itself stays the caller's."""
        p = addr(host_ptr)
        with self._lock:
            alloc = self._allocs.get(p)
            if alloc is None or alloc.kind != REGISTERED:
                raise Status(HOST_MEMORY_NOT_REGISTERED if p else INVALID_VALUE)
            self._release_alloc(alloc)

    def hipHostGetDevicePointer(self, dev_ptr: Any, host_ptr: Any, flags: Any) -> None:
        """hipHostGetDevicePointer(void**, void*, unsigned): flags must be 0; the address of
        registered or hipHostMalloc memory as the device sees it (the same address: one
        unified address space)."""
        target = out(dev_ptr, c_void_p)
        p, f = addr(host_ptr), u32(flags)
        if f:
            raise Status(INVALID_VALUE)
        with self._lock:
            alloc = self._find(p) if p else None
            if alloc is None or alloc.kind not in (PINNED, REGISTERED):
                raise Status(INVALID_VALUE)
        target.value = p

    def hipMallocManaged(self, dev_ptr: Any, size: Any, flags: Any) -> None:
        """hipMallocManaged(void**, size_t, unsigned): flags hipMemAttachGlobal or Host."""
        f = u32(flags)
        if f not in (hipMemAttachGlobal, hipMemAttachHost):
            raise Status(INVALID_VALUE)
        self._plain_alloc(dev_ptr, size, MANAGED, f)

    def hipMemcpy(self, dst: Any, src: Any, size_bytes: Any, kind: Any) -> None:
        """hipMemcpy(void*, const void*, size_t, hipMemcpyKind): a checked memmove."""
        self._copy(dst, src, size_bytes, kind, _SYNC)

    def hipMemcpyAsync(self, dst: Any, src: Any, size_bytes: Any, kind: Any,
                       stream: Any) -> None:
        """hipMemcpyAsync(..., hipStream_t): done at once; the stream must be valid."""
        self._copy(dst, src, size_bytes, kind, stream)

    def hipMemcpyPeer(self, dst: Any, dst_device: Any, src: Any, src_device: Any,
                      size_bytes: Any) -> None:
        """hipMemcpyPeer(void*, int, const void*, int, size_t): device memory of any devices."""
        self._peer_copy(dst, dst_device, src, src_device, size_bytes, _SYNC)

    def hipMemcpyPeerAsync(self, dst: Any, dst_device: Any, src: Any, src_device: Any,
                           size_bytes: Any, stream: Any) -> None:
        """hipMemcpyPeerAsync(..., hipStream_t): done at once; the stream must be valid."""
        self._peer_copy(dst, dst_device, src, src_device, size_bytes, stream)

    def hipMemset(self, dst: Any, value: Any, size_bytes: Any) -> None:
        """hipMemset(void*, int, size_t): inside one live allocation."""
        self._set(dst, value, size_bytes, _SYNC)

    def hipMemsetAsync(self, dst: Any, value: Any, size_bytes: Any, stream: Any) -> None:
        """hipMemsetAsync(void*, int, size_t, hipStream_t): done at once."""
        self._set(dst, value, size_bytes, stream)

    def hipMemsetD8(self, dst: Any, value: Any, count: Any) -> None:
        """hipMemsetD8(hipDeviceptr_t, unsigned char, size_t count)."""
        self._set_elements(dst, u32(value) & 0xFF, count, 1, _SYNC)

    def hipMemsetD8Async(self, dst: Any, value: Any, count: Any, stream: Any) -> None:
        """hipMemsetD8Async(..., hipStream_t): done at once."""
        self._set_elements(dst, u32(value) & 0xFF, count, 1, stream)

    def hipMemsetD16(self, dst: Any, value: Any, count: Any) -> None:
        """hipMemsetD16(hipDeviceptr_t, unsigned short, size_t count): 2-byte elements."""
        self._set_elements(dst, u32(value) & 0xFFFF, count, 2, _SYNC)

    def hipMemsetD16Async(self, dst: Any, value: Any, count: Any, stream: Any) -> None:
        """hipMemsetD16Async(..., hipStream_t): done at once."""
        self._set_elements(dst, u32(value) & 0xFFFF, count, 2, stream)

    def hipMemsetD32(self, dst: Any, value: Any, count: Any) -> None:
        """hipMemsetD32(hipDeviceptr_t, int, size_t count): 4-byte elements."""
        self._set_elements(dst, u32(value), count, 4, _SYNC)

    def hipMemsetD32Async(self, dst: Any, value: Any, count: Any, stream: Any) -> None:
        """hipMemsetD32Async(..., hipStream_t): done at once."""
        self._set_elements(dst, u32(value), count, 4, stream)

    def hipMemPrefetchAsync(self, dev_ptr: Any, count: Any, device: Any, stream: Any) -> None:
        """hipMemPrefetchAsync(const void*, size_t, int, hipStream_t): validates, moves nothing."""
        p, n, d = addr(dev_ptr), u64(count), i32(device)
        with self._lock:
            self._stream_or(addr(stream))
            if d != -1:   # hipCpuDeviceId prefetches to the host
                self._device(d)
            alloc = self._find(p) if p else None
            if alloc is None or alloc.kind != MANAGED or p + n > alloc.ptr + alloc.size:
                raise Status(INVALID_VALUE)

    def hipMemAdvise(self, dev_ptr: Any, count: Any, advice: Any, device: Any) -> None:
        """hipMemAdvise(const void*, size_t, hipMemoryAdvise, int): validates and records
        nothing (all memory is host memory).  The range must lie in one managed allocation,
        or, on an APU (``HIPMR_EMULATED_APU=1``), in memory from the system allocator (any
        host memory the emulation does not know); the read-mostly advice ignores ``device``,
        the others take a device or hipCpuDeviceId (-1)."""
        p, n, a, d = addr(dev_ptr), u64(count), i32(advice), i32(device)
        if a not in _ADVICE or not n or p < MIN_HOST_ADDRESS or p + n > MAX_ADDRESS:
            raise Status(INVALID_VALUE)
        if a not in (1, 2) and d != -1:
            self._device(d)
        with self._lock:
            alloc = self._find(p)
            if alloc is None:
                if not self.config.apu or self._overlaps_allocation(p, n):
                    raise Status(INVALID_VALUE)
            elif alloc.kind != MANAGED or p + n > alloc.ptr + alloc.size:
                raise Status(INVALID_VALUE)

    def hipMemDiscardBatchAsync(self, dev_ptrs: Any, sizes: Any, count: Any, flags: Any,
                                stream: Any) -> None:
        """hipMemDiscardBatchAsync(void**, size_t*, size_t, unsigned long long, hipStream_t)
        (HIP 7.2): ``count`` ranges, each inside one managed allocation (or system memory on
        an APU), flags 0.  Their contents become indeterminate; the emulation keeps them."""
        n = u64(count)
        if not n or u64(flags) or n > 1 << 20:
            raise Status(INVALID_VALUE)
        ptrs = out_array(dev_ptrs, c_void_p, n)
        lengths = out_array(sizes, c_size_t, n)
        with self._lock:
            self._stream_or(addr(stream))
            for p, length in zip(ptrs, lengths):
                # (an array's items read as ints; a single instance as itself)
                start = int(getattr(p, "value", p) or 0)
                size = int(getattr(length, "value", length))
                if not size or start < MIN_HOST_ADDRESS or start + size > MAX_ADDRESS:
                    raise Status(INVALID_VALUE)
                alloc = self._find(start)
                if alloc is None:
                    if not self.config.apu or self._overlaps_allocation(start, size):
                        raise Status(INVALID_VALUE)
                elif alloc.kind != MANAGED or start + size > alloc.ptr + alloc.size:
                    raise Status(INVALID_VALUE)

    def hipPointerGetAttributes(self, attributes: Any, ptr: Any) -> None:
        """hipPointerGetAttributes(hipPointerAttribute_t*, const void*): known memory only."""
        attrs = out(attributes, hipPointerAttribute_t)
        p = addr(ptr)
        with self._lock:
            alloc = self._find(p) if p else None
            if alloc is None:
                self._virtual_attributes(attrs, p)
                return
            numbering = _MEMORY_TYPE_6 if self.version >= (6, 0, 0) else _MEMORY_TYPE_5
            attrs.type = numbering[alloc.kind]
            attrs.device = alloc.device
            attrs.devicePointer = p
            attrs.hostPointer = None if alloc.kind == DEVICE else p
            attrs.isManaged = int(alloc.kind == MANAGED)
            attrs.allocationFlags = alloc.flags

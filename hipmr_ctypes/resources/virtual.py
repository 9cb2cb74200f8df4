"""``VirtualMemoryResource``: every allocation its own reserved address range with its own
physical memory mapped into it (HIP's virtual-memory calls), so that the memory can be given
back to the device and taken again later at the same addresses: :meth:`~VirtualMemoryResource.pause`
and :meth:`~VirtualMemoryResource.resume` (docs/virtual-memory.md).

State and locking: one :class:`~hipmr_ctypes._locks.DeferringLock` guards the table of
allocations (``_regions``: base address -> :class:`_Region`) and is held for the whole of an
allocation's mapping, a pause and a resume, so that a thread allocating or freeing while
another pauses waits for it and then sees a consistent table.  A deallocation reached from a
finalizer while the same thread holds the lock is deferred until the lock is let go.  A
stream-ordered deallocation waits for its stream before it takes the lock.

Interrupts: a pause or resume run in the main thread holds SIGINT's Python handler back until
its table is consistent again (``_interrupts_held``), then raises the KeyboardInterrupt.

Pinned blocks: a backup's blocks outlive the resume (or the deallocation) that is done with
them, as spares (``_spares``: block size -> blocks, under the lock), which the next pause takes
before it allocates any; ``release_backup_memory`` frees them, and so does a finalizer
(``_exit.finalize``: when the resource is garbage-collected, never at exit).  A pause that fails
frees the blocks it allocated and puts the spares it took back: it holds no more pinned memory
than before.  ``_backup_bytes`` counts every block (in backups and spare).
"""
from __future__ import annotations

import contextvars
import ctypes
import threading
from contextlib import contextmanager
from ctypes import c_int, c_size_t, c_void_p
from typing import Any, Container, Dict, Generator, Iterable, List, Optional, Tuple

from .. import _hip
from .._checks import MAX_SIZE, check_args, check_ptr, check_stream
from .._exit import finalize
from .._locks import DeferringLock
from ..device import check_device, device_count, get_device, on_device
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from ._common import DEVICE_ALIGNMENTS, MAX_DEVICE_ALIGNMENT, sync_stream

__all__ = ["VirtualMemoryResource", "VmmSetup"]

_PINNED, _DEVICE_LOCATION, _READ_WRITE = 1, 1, 3   # hipMemAllocationTypePinned, ...
_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2
_PORTABLE = 1                                        # hipHostMallocPortable
_GRANULARITY_MINIMUM, _GRANULARITY_RECOMMENDED = 0, 1
#: bytes of one pinned block of a backup: the pause allocates the next block while the copy
#: into the one before is in flight, and a resume copies each back as soon as the range is
#: mapped again
BACKUP_CHUNK = 64 << 20

#: the tag of the allocations made now, per resource (id -> tag): a context variable, so that
#: ``with vmm.tag(...)`` holds in its own thread and asyncio task only
_tags: "contextvars.ContextVar[Dict[int, str]]" = contextvars.ContextVar("hipmr_vmm_tags",
                                                                        default={})


def _free_spares(host_free: Any, spares: Dict[int, List[int]]) -> None:
    """Finalizer of a resource: free its spare pinned blocks (errors ignored: a finalizer has
    nobody to report to; in a forked child the runtime refuses, and the blocks are the
    parent's)."""
    for blocks in list(spares.values()):
        for block in blocks:
            try:
                host_free(block)
            except Exception:  # noqa: BLE001
                pass
    spares.clear()


class VmmSetup:
    """What every user of the virtual-memory calls on one device needs, queried once:
    ``device`` (the ordinal; ``device=None``: the current one), ``rt``, ``prop`` (the
    ``hipMemAllocationProp`` of pinned memory on the device, in this runtime's layout),
    ``granularity`` (``granularity=None``: the device's recommended one, at least its minimum;
    else checked to be a positive multiple of the minimum) and ``access`` (read-write for the
    device and every device that can access it as a peer).

    TypeError / ValueError for a bad ``granularity`` before any native call; NotSupportedError
    where the device has no virtual memory management (the attribute
    ``virtual_memory_management_supported`` is 0; a runtime older than the attribute, ROCm
    5.2, is asked through the calls themselves)."""

    __slots__ = ("device", "rt", "prop", "granularity", "minimum", "access")
    device: int
    rt: Any
    prop: Any
    granularity: int
    minimum: int
    access: Any

    def __init__(self, device: Optional[Any], granularity: Optional[int]) -> None:
        if granularity is not None and (type(granularity) is not int or granularity <= 0):
            raise TypeError(f"granularity must be a positive int or None, not {granularity!r}") \
                if type(granularity) is not int else \
                ValueError(f"granularity must be positive, not {granularity}")
        rt = _hip.get_runtime()
        ordinal = get_device() if device is None else check_device(device)
        self.device, self.rt = ordinal, rt
        supported = c_int(1)
        st = rt.fn.hipDeviceGetAttribute(supported, 89, ordinal)
        if st:   # a runtime older than the attribute (ROCm 5.2): the calls themselves say
            rt.clear_last_error()
        elif not supported.value:
            from .._hip.exceptions import NotSupportedError
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    f"device {ordinal} has no virtual memory management "
                                    "(hipDeviceAttributeVirtualMemoryManagementSupported)",
                                    "hipDeviceGetAttribute")
        from .._hip.types import allocation_prop_type
        if rt.platform == "nvidia":   # CUDA's layout, whatever CUDA version
            major, minor = 6, 0
        else:
            major, minor, _ = rt.runtime_version()
        prop: Any = allocation_prop_type(major, minor)()
        prop.type = _PINNED
        prop.location.type = _DEVICE_LOCATION
        prop.location.id = ordinal
        self.prop = prop
        minimum = self.minimum = self._query_granularity(_GRANULARITY_MINIMUM)
        if granularity is None:
            granularity = max(self._query_granularity(_GRANULARITY_RECOMMENDED), minimum)
        elif granularity % minimum:
            raise ValueError(f"granularity={granularity} is not a multiple of device "
                             f"{ordinal}'s minimum, {minimum}")
        self.granularity = granularity
        self.access = self._access_descriptors(ordinal)

    def _query_granularity(self, option: int) -> int:
        out = c_size_t()
        st = self.rt.fn.hipMemGetAllocationGranularity(out, ctypes.byref(self.prop), option)
        if st:
            raise self.rt.error(st, "hipMemGetAllocationGranularity", device=self.device)
        return out.value

    @staticmethod
    def _access_descriptors(ordinal: int) -> Any:
        """Read-write for ``ordinal`` and every device that can access it as a peer."""
        from ..device import Device
        from .._hip.types import hipMemAccessDesc
        devices = [ordinal] + [d for d in range(device_count())
                               if d != ordinal and Device(d).can_access_peer(ordinal)]
        descs = (hipMemAccessDesc * len(devices))()
        for desc, d in zip(descs, devices):
            desc.location.type, desc.location.id, desc.flags = _DEVICE_LOCATION, d, _READ_WRITE
        return descs


class _Region:
    """One allocation: its reserved range ``[ptr, ptr + size)``; ``handle``: its physical
    memory (0 while paused and released); ``used``: the bytes asked for, the ones a backup
    keeps (the rest of the range is nobody's); ``mapped``; ``backup``: the pinned host blocks,
    ``(address, bytes)`` (:data:`BACKUP_CHUNK` bytes each, the last one the rest), holding its
    bytes while paused (none: discarded, or not paused)."""
    __slots__ = ("ptr", "size", "used", "tag", "handle", "mapped", "backup", "paused")

    def __init__(self, ptr: int, size: int, used: int, tag: Optional[str], handle: int) -> None:
        self.ptr, self.size, self.used, self.tag, self.handle = ptr, size, used, tag, handle
        self.mapped = True
        self.backup: Tuple[Tuple[int, int], ...] = ()
        self.paused = False


@contextmanager
def _interrupts_held() -> Generator[None, None, None]:
    """In the main thread, a SIGINT during the block runs its handler (KeyboardInterrupt)
    after the block instead of inside it; elsewhere (no signal handler runs there) nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import signal
    caught: List[Tuple[int, Any]] = []
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is None:   # a handler not set from Python: it could not be put back
            raise ValueError
        signal.signal(signal.SIGINT, lambda num, frame: caught.append((num, frame)))
    except (ValueError, OSError, TypeError):   # no signals here (an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)   # what it would have done: now


class VirtualMemoryResource:
    """Device memory of ``device`` (default: the current device) through HIP's virtual-memory
    calls: each allocation reserves its own address range, rounded up to ``granularity``
    (default: the device's recommended granularity; else a multiple of its minimum), creates
    physical memory of that size, maps it there and gives read-write access to ``device``
    and to every device that can access it as a peer.

    :meth:`pause` gives allocations' physical memory back to the device (after copying it to
    pinned host memory, or discarding it), :meth:`resume` maps new physical memory at the same
    addresses and restores the bytes; :meth:`tag` labels the allocations made inside a
    ``with`` block so that they can be paused apart.  The pinned blocks of a backup are kept
    after the resume for the next pause (:attr:`backup_bytes`; :meth:`release_backup_memory`
    frees them; so does the garbage collector).  Async and device-accessible; the
    allocations are not stream-ordered (``allocate_async`` maps at once, ``deallocate_async``
    waits for its stream before unmapping).  Thread-safe.  Equal only to itself.

    Raises NotSupportedError where the runtime has no virtual memory (the device attribute
    ``virtual_memory_management_supported`` is 0, or the library lacks the calls; ROCm 5.2
    has the calls but not the attribute: the calls answer).
    """

    __slots__ = ("_device", "_rt", "_fn", "_granularity", "_prop", "_access", "_lock",
                 "_regions", "_mapped", "_reserved", "_spares", "_backup_bytes",
                 "__weakref__")
    properties: Tuple[type, ...] = (device_accessible,)

    def __init__(self, device: Optional[Any] = None, *, granularity: Optional[int] = None) -> None:
        setup = VmmSetup(device, granularity)
        self._device, self._rt, self._fn = setup.device, setup.rt, setup.rt.fn
        self._prop, self._granularity, self._access = setup.prop, setup.granularity, setup.access
        self._lock = DeferringLock()
        self._regions: Dict[int, _Region] = {}
        self._mapped = 0
        self._reserved = 0
        #: spare pinned blocks, by size; freed by release_backup_memory or the finalizer
        self._spares: Dict[int, List[int]] = {}
        self._backup_bytes = 0
        finalize(self, _free_spares, setup.rt.fn.hipHostFree, self._spares)

    # ---- what it is -----------------------------------------------------------------------
    @property
    def device(self) -> int:
        """The device ordinal the memory lives on."""
        return self._device

    @property
    def granularity(self) -> int:
        """Every allocation's size is rounded up to a multiple of this many bytes."""
        return self._granularity

    @property
    def mapped_bytes(self) -> int:
        """Bytes of physical memory mapped now (allocations not paused)."""
        return self._mapped

    @property
    def reserved_bytes(self) -> int:
        """Bytes of address space reserved now (every live allocation, paused or not)."""
        return self._reserved

    @property
    def backup_bytes(self) -> int:
        """Bytes of pinned host memory held now: the backups of paused allocations and the
        spare blocks kept for the next pause (:meth:`release_backup_memory` frees these)."""
        return self._backup_bytes

    def release_backup_memory(self) -> int:
        """Free the spare pinned blocks (those of backups that a resume or a deallocation is
        done with, kept for the next pause); returns the bytes freed.  The backups of paused
        allocations stay.  A block whose ``hipHostFree`` fails stays a spare, and the error
        is raised once the others are freed."""
        fn = self._fn
        freed = 0
        failed: Optional[Tuple[int, int]] = None
        with self._lock, _interrupts_held():
            spares = self._spares
            blocks = [(b, n) for n, bs in spares.items() for b in bs]
            spares.clear()
            for block, n in blocks:
                st = fn.hipHostFree(block)
                if st:
                    spares.setdefault(n, []).append(block)
                    if failed is None:
                        failed = (st, n)
                    continue
                self._backup_bytes -= n
                freed += n
        if failed is not None:
            raise self._error(failed[0], "hipHostFree", size=failed[1],
                              detail=f"a spare backup block; {freed} bytes were freed")
        return freed

    # ---- native steps (device current) ----------------------------------------------------
    def _error(self, st: int, call: str, **kw: Any) -> Exception:
        error: Exception = self._rt.error(st, call, device=self._device, **kw)
        return error

    def _map_new(self, ptr: int, size: int) -> int:
        """New physical memory of ``size`` mapped at ``ptr`` with access set: its handle.
        On failure nothing is left behind and the error is raised."""
        fn = self._fn
        handle = c_void_p()
        st = fn.hipMemCreate(handle, size, ctypes.byref(self._prop), 0)
        if st:
            raise self._error(st, "hipMemCreate", size=size)
        h = handle.value or 0
        try:
            self._map_handle(ptr, size, h)
        except BaseException:
            fn.hipMemRelease(h)
            raise
        return h

    def _map_handle(self, ptr: int, size: int, handle: int) -> None:
        fn = self._fn
        st = fn.hipMemMap(ptr, size, 0, handle, 0)
        if st:
            raise self._error(st, "hipMemMap", size=size, detail=f"ptr={ptr:#x}")
        st = fn.hipMemSetAccess(ptr, size, self._access, len(self._access))
        if st:
            fn.hipMemUnmap(ptr, size)
            raise self._error(st, "hipMemSetAccess", size=size, detail=f"ptr={ptr:#x}")

    def _free_region(self, r: _Region) -> None:
        """Unmap, release and free the range of a region taken out of the table; its backup
        blocks become spares.  A step that fails puts the region back, as far as it got, and
        raises: the deallocation can be tried again."""
        fn = self._fn
        st = fn.hipMemUnmap(r.ptr, r.size) if r.mapped else 0
        if st:
            raise self._put_back(r, self._error(st, "hipMemUnmap", detail=f"ptr={r.ptr:#x}"))
        r.mapped = False
        st = fn.hipMemRelease(r.handle) if r.handle else 0
        if st:
            raise self._put_back(r, self._error(st, "hipMemRelease", detail=f"ptr={r.ptr:#x}"))
        r.handle = 0
        st = fn.hipMemAddressFree(r.ptr, r.size)
        if st:
            raise self._put_back(r, self._error(st, "hipMemAddressFree",
                                                detail=f"ptr={r.ptr:#x}"))
        if r.backup:
            with self._lock:
                self._spare_backup(r)

    def _spare_backup(self, r: _Region) -> None:
        """``r``'s backup blocks become spares (the lock held)."""
        self._spare_blocks(r.backup, ())
        r.backup = ()

    def _spare_blocks(self, blocks: Iterable[Tuple[int, int]], fresh: Container[int]) -> None:
        """``blocks`` ``[(address, bytes)]`` become spares, but those in ``fresh`` (allocated
        by a pause that failed) are freed (the lock held)."""
        spares = self._spares
        for block, n in blocks:
            if block in fresh:
                self._fn.hipHostFree(block)
                self._backup_bytes -= n
            else:
                spares.setdefault(n, []).append(block)

    def _put_back(self, r: _Region, error: Exception) -> Exception:
        """``r`` in the table again (its deallocation failed part way); returns ``error``.  An
        unmapped region that is not paused cannot be used any more: it counts as paused, with
        its bytes discarded, until it is deallocated or resumed."""
        if not r.mapped and not r.paused:
            r.paused = True
        with self._lock:
            self._regions[r.ptr] = r
            self._reserved += r.size
            if r.mapped:
                self._mapped += r.size
        return error

    # ---- allocation -----------------------------------------------------------------------
    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """A new range of ``bytes`` rounded up to :attr:`granularity`, mapped to new physical
        memory, tagged with the innermost :meth:`tag` block around the call; ``allocate(0)``
        returns 0.  OutOfMemoryError (and nothing left behind) when the device has no room."""
        if (type(bytes) is not int or not 0 < bytes <= MAX_SIZE or type(alignment) is not int
                or alignment not in DEVICE_ALIGNMENTS):
            bytes = check_args(bytes, alignment, MAX_DEVICE_ALIGNMENT)[0]
            if not bytes:
                return 0
        g = self._granularity
        size = -(-bytes // g) * g
        tag = _tags.get().get(id(self))
        fn = self._fn
        with on_device(self._device):
            out = c_void_p()
            st = fn.hipMemAddressReserve(out, size, 0, None, 0)
            if st:
                raise self._error(st, "hipMemAddressReserve", size=size)
            ptr: int = out.value or 0
            try:
                with self._lock:
                    handle = self._map_new(ptr, size)
                    self._regions[ptr] = _Region(ptr, size, bytes, tag, handle)
                    self._mapped += size
                    self._reserved += size
            except BaseException:
                if ptr not in self._regions:
                    fn.hipMemAddressFree(ptr, size)
                raise
        return ptr

    def _region(self, ptr: int, nbytes: int) -> _Region:
        """``ptr``'s region; ValueError when it is not one of ours or ``nbytes`` is not the
        size it was allocated with."""
        r = self._regions.get(ptr)
        if r is None:
            raise ValueError(f"ptr={ptr:#x} was not allocated by this {type(self).__name__} "
                             "(or was freed already)")
        if nbytes != r.used:
            raise ValueError(f"bytes={nbytes} does not match the allocation at {ptr:#x} "
                             f"({r.used} bytes)")
        return r

    def _claim(self, ptr: int, nbytes: int) -> _Region:
        """Take ``ptr``'s region out of the table (ValueError when it is not one of ours or
        ``nbytes`` is not the size it was allocated with)."""
        r = self._region(ptr, nbytes)
        del self._regions[ptr]
        self._reserved -= r.size
        if r.mapped:
            self._mapped -= r.size
        return r

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Unmap and free the allocation at ``ptr`` (paused or not: a paused one's backup
        blocks become spares, :meth:`release_backup_memory`); ``deallocate(0, ...)`` does
        nothing.  The caller's work on the memory must be complete (use ``deallocate_async``
        to have a stream waited for)."""
        ptr = check_ptr(ptr)
        check_args(bytes, alignment, MAX_DEVICE_ALIGNMENT)
        if not ptr:
            return
        lock = self._lock
        if lock.held_here():   # a finalizer run inside this thread's pause or allocation
            lock.defer(self._deallocate_now, ptr, bytes)
            return
        self._deallocate_now(ptr, bytes)

    def _deallocate_now(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            r = self._claim(ptr, nbytes)
        with on_device(self._device):
            self._free_region(r)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """As :meth:`allocate` (mapping is not stream-ordered); ``stream`` is checked only."""
        check_stream(stream)
        return self.allocate(bytes, alignment)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Wait for ``stream`` (``hipStreamSynchronize``), then :meth:`deallocate`."""
        ptr = check_ptr(ptr)
        check_args(bytes, alignment, MAX_DEVICE_ALIGNMENT)
        handle = check_stream(stream)
        if not ptr:
            return
        self._region(ptr, bytes)   # a ValueError before the stream is waited for
        sync_stream(handle)
        self.deallocate(ptr, bytes, alignment)

    # ---- tags -----------------------------------------------------------------------------
    @contextmanager
    def tag(self, name: str) -> Generator["VirtualMemoryResource", None, None]:
        """``with vmm.tag("weights"):`` labels the allocations this resource makes inside the
        block (in this thread or asyncio task: a context variable) with ``name``, so that
        :meth:`pause` / :meth:`resume` can name them.  Blocks nest; the innermost wins."""
        if type(name) is not str or not name:
            raise TypeError(f"a tag is a non-empty str, not {name!r}") if type(name) is not str \
                else ValueError("a tag is a non-empty str")
        tags = dict(_tags.get())
        tags[id(self)] = name
        token = _tags.set(tags)
        try:
            yield self
        finally:
            _tags.reset(token)

    def _select(self, tag: Optional[str]) -> List[_Region]:
        if tag is not None and (type(tag) is not str or not tag):
            raise TypeError(f"tag must be a non-empty str or None, not {tag!r}")
        return [r for r in self._regions.values() if tag is None or r.tag == tag]

    def paused(self, tag: Optional[str] = None) -> bool:
        """True when an allocation with ``tag`` (None: any) is paused."""
        with self._lock:
            return any(r.paused for r in self._select(tag))

    # ---- sleep and wake -------------------------------------------------------------------
    def pause(self, tag: Optional[str] = None, *, backup: bool = True) -> int:
        """Give the physical memory of the allocations with ``tag`` (None: all) that are not
        paused back to the device; returns the bytes released (0 when no allocation has
        ``tag``).

        Waits for all work on the device (``hipDeviceSynchronize``), then with ``backup``
        copies each allocation into pinned host memory, and unmaps and releases it; the
        addresses stay reserved; the blocks are the spares an earlier resume kept where there
        are some of the size, else new ones.  Without ``backup`` the bytes are discarded
        (:meth:`resume` brings the memory back zero-filled).  RuntimeError when all of them are
        paused already.  When the pinned memory cannot be had or a copy fails, nothing is
        released (the spares taken are spares again, new blocks are freed) and the error is
        raised; when an unmap fails, the allocations handled before it stay
        paused, the others stay as they were, and the error is raised.
        """
        if type(backup) is not bool:
            raise TypeError(f"backup must be a bool, not {backup!r}")
        with self._lock:
            selected = self._select(tag)
            regions = [r for r in selected if not r.paused]
            if not regions:
                if selected:
                    raise RuntimeError(f"{self._what(tag)} is paused already; resume it first")
                return 0
            with _interrupts_held(), on_device(self._device):
                return self._pause_locked(regions, backup)

    def _pause_locked(self, regions: List[_Region], backup: bool) -> int:
        fn = self._fn
        st = fn.hipDeviceSynchronize()
        if st:
            raise self._error(st, "hipDeviceSynchronize")
        copies: List[List[Tuple[int, int]]] = [[] for _ in regions]
        fresh: Dict[int, int] = {}   # the blocks this pause allocated (not spares)
        if backup:
            try:
                self._back_up(regions, copies, fresh)
            except BaseException:
                fn.hipStreamSynchronize(0)   # copies in flight end before their memory goes
                for blocks in copies:
                    self._spare_blocks(blocks, fresh)
                self._rt.clear_last_error()
                raise
        released = 0
        failed: Optional[Exception] = None
        for i, r in enumerate(regions):
            if failed is not None:       # not reached: stays as it was
                self._spare_blocks(copies[i], fresh)
                continue
            st = fn.hipMemUnmap(r.ptr, r.size)
            if st:
                failed = self._error(st, "hipMemUnmap", detail=f"ptr={r.ptr:#x}; the "
                                     "allocations before it are paused, the others are not")
                self._spare_blocks(copies[i], fresh)
                continue
            r.mapped, r.paused, r.backup = False, True, tuple(copies[i])
            self._mapped -= r.size
            st = fn.hipMemRelease(r.handle)
            if st:   # unmapped but still held: resume maps it again, deallocate releases it
                failed = self._error(st, "hipMemRelease", detail=f"ptr={r.ptr:#x}")
                continue
            r.handle = 0
            released += r.size
        if failed is not None:
            raise failed
        return released

    def _back_up(self, regions: List[_Region], copies: List[List[Tuple[int, int]]],
                 fresh: Dict[int, int]) -> None:
        """Copy every region into pinned blocks (``copies[i]`` gets region ``i``'s, each block
        as soon as it is had, so that the caller can give them all back after a failure;
        ``fresh`` the ones allocated here): a spare of the size when there is one, else a new
        one, allocated while the copy into the one before runs.  Returns once every copy is
        complete."""
        fn = self._fn
        spares = self._spares
        out = c_void_p()
        chunk = BACKUP_CHUNK
        for r, blocks in zip(regions, copies):
            for offset in range(0, r.used, chunk):   # the caller's bytes only
                n = min(chunk, r.used - offset)
                spare = spares.get(n)
                if spare:
                    blocks.append((spare.pop(), n))
                else:
                    st = fn.hipHostMalloc(out, n, _PORTABLE)
                    if st:
                        raise self._error(st, "hipHostMalloc", size=n, detail="pinned memory "
                                          "for the backup; nothing was released")
                    block = out.value or 0
                    blocks.append((block, n))
                    fresh[block] = n
                    self._backup_bytes += n
                st = fn.hipMemcpyAsync(blocks[-1][0], r.ptr + offset, n, _DEVICE_TO_HOST, 0)
                if st:
                    raise self._error(st, "hipMemcpyAsync", size=n,
                                      detail="the backup; nothing was released")
        st = fn.hipStreamSynchronize(0)
        if st:
            raise self._error(st, "hipStreamSynchronize",
                              detail="the backup; nothing was released")

    def resume(self, tag: Optional[str] = None) -> int:
        """Map new physical memory at the addresses of the paused allocations with ``tag``
        (None: all), give it access, copy the backups back (discarded ones are zero-filled)
        and keep the backups' pinned blocks as spares for the next pause
        (:attr:`backup_bytes`, :meth:`release_backup_memory`); returns the bytes mapped.
        RuntimeError when none of them is paused.  When a step fails, the allocations it could
        not restore stay paused, with their backups, and the error is raised: a later resume
        tries them again."""
        with self._lock:
            regions = [r for r in self._select(tag) if r.paused]
            if not regions:
                raise RuntimeError(f"{self._what(tag)} is not paused")
            with _interrupts_held(), on_device(self._device):
                return self._resume_locked(regions)

    def _resume_locked(self, regions: List[_Region]) -> int:
        fn = self._fn
        done: List[_Region] = []
        failed: Optional[BaseException] = None
        try:
            for r in regions:
                try:
                    if r.handle:              # not released at the pause: the same memory
                        self._map_handle(r.ptr, r.size, r.handle)
                    else:
                        r.handle = self._map_new(r.ptr, r.size)
                except Exception as exc:  # noqa: BLE001 - raised below, after the rest
                    failed = exc
                    break
                r.mapped = True
                done.append(r)
                self._restore(r)
            st = fn.hipStreamSynchronize(0)
            if st:
                raise self._error(st, "hipStreamSynchronize", detail="restoring; it stays paused")
        except BaseException:
            fn.hipStreamSynchronize(0)
            self._rt.clear_last_error()
            for r in done:                    # back to paused, the backups kept
                if not fn.hipMemUnmap(r.ptr, r.size):
                    r.mapped = False
                    if not fn.hipMemRelease(r.handle):
                        r.handle = 0
            raise
        mapped = 0
        for r in done:
            self._spare_backup(r)
            r.paused = False
            self._mapped += r.size
            mapped += r.size
        if failed is not None:
            raise failed
        return mapped

    def _restore(self, r: _Region) -> None:
        """Queue the copies of ``r``'s backup into its memory (none: zero-fill it)."""
        fn = self._fn
        if not r.backup:
            st = fn.hipMemsetAsync(r.ptr, 0, r.size, 0)
            if st:
                raise self._error(st, "hipMemsetAsync", size=r.size,
                                  detail="restoring; it stays paused")
            return
        offset = 0
        for block, n in r.backup:
            st = fn.hipMemcpyAsync(r.ptr + offset, block, n, _HOST_TO_DEVICE, 0)
            if st:
                raise self._error(st, "hipMemcpyAsync", size=n, detail="restoring; it stays paused")
            offset += n

    def _what(self, tag: Optional[str]) -> str:
        return "memory of this resource" if tag is None else f"memory tagged {tag!r}"

    # ---- identity -------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"{type(self).__name__}(device={self._device}, granularity={self._granularity}, "
                f"mapped_bytes={self._mapped}, reserved_bytes={self._reserved})")

    def __reduce__(self) -> Tuple[Any, ...]:
        raise TypeError(f"a {type(self).__name__} owns its allocations' mappings and cannot "
                        "be pickled")

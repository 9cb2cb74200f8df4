"""The reserved address range of a ``VirtualPoolResource`` and the physical pages mapped into it:
every virtual-memory call the pool makes (the pool itself, in the adaptors layer, makes none;
the package's ``__init__`` hands it this class, see ``hipmr_ctypes._virtual_range``).

A range is reserved once, ``reserve_size`` bytes (default: :data:`RESERVE_FACTOR` times the
device's memory, and at least twice the pool's maximum; where the runtime refuses that much,
twice and then once the device's memory, never less than twice the maximum); pages of ``granularity`` bytes are
mapped one ``hipMemCreate`` + ``hipMemMap`` each, with one ``hipMemSetAccess`` over every run
mapped at once, and unmapped and released one by one (the runtimes unmap whole mappings only).
"""
from __future__ import annotations

import ctypes
from bisect import bisect_left, insort
from contextlib import contextmanager
from ctypes import c_void_p
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple

from .._device_sizes import resolve_size
from .._exit import finalize, finalizer
from ..device import Device, check_device, get_device, on_device
from ..properties import device_accessible
from .virtual import VmmSetup, _interrupts_held

__all__ = ["VirtualRange", "RESERVE_FACTOR"]

#: the range reserved by default, as a multiple of the device's memory: address space is
#: cheap, and holes left by unmapped pages must never make the pool run out of it before it
#: runs out of memory
RESERVE_FACTOR = 4
#: what a runtime answers when one hipMemSetAccess may not span several mappings (invalid
#: value, not supported): the pages are then given access one by one
_PER_MAPPING = frozenset({1, 801})


class VirtualRange:
    """A pool's reserved range ``[base, base + size)`` and the pages mapped into it
    (``pages``: address -> handle), grouped in maximal mapped runs (``runs``: start -> size,
    ``starts`` sorted).  Every method but :meth:`close` is called with the arena's lock held
    and ``device`` current.  An async, device-accessible resource only so that the pool can
    hold it as its upstream: allocating from it raises TypeError."""

    __slots__ = ("device", "base", "size", "page", "fn", "rt", "prop", "access", "pages",
                 "runs", "starts", "stray", "sizes", "reserved", "closer", "__weakref__")
    properties: Tuple[type, ...] = (device_accessible,)
    device: int
    base: int
    size: int
    page: int
    fn: Any
    rt: Any
    prop: Any
    access: Any
    pages: Dict[int, int]
    runs: Dict[int, int]
    starts: List[int]
    stray: List[Tuple[int, int]]
    sizes: Dict[str, Optional[int]]
    reserved: List[int]
    closer: Any

    def __init__(self, device: Optional[Any], granularity: Optional[int],
                 sizes: Dict[str, Any]) -> None:
        """Reserve the range on ``device`` (None: the current one) with pages of
        ``granularity`` (see :class:`~hipmr_ctypes.resources.virtual.VmmSetup`); ``sizes``:
        the pool's parsed sizes (``maximum_pool_size``, ``release_threshold``,
        ``reserve_size``; each None or what ``parse_config_size`` read), resolved on the
        device into :attr:`sizes` (``maximum_pool_size`` rounded down to the page)."""
        ordinal = get_device() if device is None else check_device(device)
        resolved: Dict[str, Optional[int]] = {
            name: None if value is None else resolve_size(value, name, ordinal)
            for name, value in sizes.items()}
        setup = VmmSetup(ordinal, granularity)
        self.device, self.rt, self.fn = ordinal, setup.rt, setup.rt.fn
        self.prop, self.access, self.page = setup.prop, setup.access, setup.granularity
        page = self.page
        if page % 256:
            raise ValueError(f"granularity={page} is not a multiple of 256")
        maximum = resolved.get("maximum_pool_size")
        if maximum is not None:
            maximum = resolved["maximum_pool_size"] = maximum - maximum % page
        given = resolved.get("reserve_size")
        if given is None:    # generous first, less where the runtime refuses that much
            total = max(Device(ordinal).memory_info()[1], page)
            least = max(total, 2 * maximum) if maximum is not None else total
            sizes_to_try = [max(f * total, least) for f in (RESERVE_FACTOR, 2, 1)]
        else:
            sizes_to_try = [given]
        sizes_to_try = sorted({-(-n // page) * page for n in sizes_to_try}, reverse=True)
        if not sizes_to_try[-1]:
            raise ValueError("reserve_size must be positive")
        self.sizes = resolved
        self.pages = {}
        self.runs = {}
        self.starts = []
        #: pages out of the books whose unmap or release failed: ``(address or 0, handle)``,
        #: tried again before every later unmap and at the end
        self.stray = []
        out = c_void_p()
        st, size = 0, sizes_to_try[0]
        with on_device(ordinal):
            for size in sizes_to_try:
                st = self.fn.hipMemAddressReserve(out, size, 0, None, 0)
                if not st:
                    break
                self.rt.clear_last_error()
        if st:
            raise self.rt.error(st, "hipMemAddressReserve", device=ordinal, size=size,
                                detail="the address range of a VirtualPoolResource")
        self.base, self.size = out.value or 0, size
        #: ``[base]`` while the range is reserved, ``[0]`` once freed or in a forked child
        self.reserved = [self.base]
        self.closer = finalize(self, _close_range, self.reserved, self.size, self.pages,
                               self.stray, self.fn, self.rt, ordinal, page)

    @contextmanager
    def held(self) -> Generator[None, None, None]:
        """The device current and SIGINT held back (``resources.virtual._interrupts_held``)
        for a block that maps or unmaps and updates the books of the caller too."""
        with _interrupts_held(), on_device(self.device):
            yield

    # ---- the resource interface (refused) ------------------------------------------------
    def _refuse(self, *args: Any) -> Any:
        raise TypeError("the reserved range of a VirtualPoolResource is mapped by the pool; "
                        "allocate from the pool")

    allocate: Callable[..., Any] = _refuse
    deallocate: Callable[..., Any] = _refuse
    allocate_async: Callable[..., Any] = _refuse
    deallocate_async: Callable[..., Any] = _refuse

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return (f"<the reserved range of a VirtualPoolResource on device {self.device}: "
                f"{self.size} bytes at {self.base:#x}, {len(self.pages) * self.page} mapped>")

    # ---- the mapped runs ------------------------------------------------------------------
    def gaps(self) -> List[Tuple[int, int]]:
        """The unmapped gaps ``(start, end)`` of the range, in address order."""
        out = []
        at = self.base
        runs = self.runs
        for start in self.starts:
            if start > at:
                out.append((at, start))
            at = start + runs[start]
        if at < self.base + self.size:
            out.append((at, self.base + self.size))
        return out

    def _add_run(self, start: int, size: int) -> None:
        runs, starts = self.runs, self.starts
        end = start + size
        if end in runs:                                  # merge with the run above
            size += runs.pop(end)
            del starts[bisect_left(starts, end)]
        i = bisect_left(starts, start)
        if i and starts[i - 1] + runs[starts[i - 1]] == start:   # and the one below
            below = starts[i - 1]
            runs[below] += size
            return
        runs[start] = size
        insort(starts, start)

    def _remove_run(self, start: int, size: int) -> None:
        """``[start, start + size)``, inside one run, is no longer mapped."""
        runs, starts = self.runs, self.starts
        i = bisect_left(starts, start + 1) - 1
        run = starts[i]
        run_end = run + runs[run]
        if run == start:
            del runs[run]
            del starts[i]
        else:
            runs[run] = start - run
        if start + size < run_end:
            runs[start + size] = run_end - start - size
            insort(starts, start + size)

    # ---- mapping --------------------------------------------------------------------------
    def map(self, start: int, size: int) -> None:
        """Map new pages over ``[start, start + size)`` (unmapped, page-aligned) with access
        set for the pool's devices.  On failure nothing is left mapped or created and the
        error is raised (``OutOfMemoryError`` when the device has no room)."""
        fn, page, prop = self.fn, self.page, ctypes.byref(self.prop)
        made: List[Tuple[int, int]] = []
        handle = c_void_p()
        failed: Optional[Exception] = None
        for at in range(start, start + size, page):
            st = fn.hipMemCreate(handle, page, prop, 0)
            if st:
                failed = self.rt.error(st, "hipMemCreate", device=self.device, size=page,
                                       detail="a page of a VirtualPoolResource")
                break
            h = handle.value or 0
            st = fn.hipMemMap(at, page, 0, h, 0)
            if st:
                failed = self.rt.error(st, "hipMemMap", device=self.device, size=page,
                                       detail=f"ptr={at:#x}")
                fn.hipMemRelease(h)
                break
            made.append((at, h))
        if failed is None:
            st = fn.hipMemSetAccess(start, size, self.access, len(self.access))
            if st in _PER_MAPPING and len(made) > 1:
                # a runtime that sets access over one mapping at a time: page by page
                self.rt.clear_last_error()
                for at, _ in made:
                    st = fn.hipMemSetAccess(at, page, self.access, len(self.access))
                    if st:
                        break
            if st:
                failed = self.rt.error(st, "hipMemSetAccess", device=self.device, size=size,
                                       detail=f"ptr={start:#x}")
        if failed is not None:
            self.stray.extend(made)
            self.retry_stray()
            raise failed
        pages = self.pages
        for at, h in made:
            pages[at] = h
        self._add_run(start, size)

    def unmap(self, start: int, size: int) -> int:
        """Unmap and release the pages of ``[start, start + size)`` (mapped, page-aligned),
        one by one; returns the bytes unmapped.  A page whose unmap fails stays mapped and the
        error is raised, with the bytes unmapped before it in ``error.unmapped``; a page whose
        release fails after its unmap is unmapped (the runtime frees it with its handle) and
        the error is raised the same way."""
        fn, page, pages = self.fn, self.page, self.pages
        if self.stray:
            self.retry_stray()
        done = 0
        try:
            for at in range(start, start + size, page):
                st = fn.hipMemUnmap(at, page)
                if st:
                    raise self.rt.error(st, "hipMemUnmap", device=self.device, size=page,
                                        detail=f"ptr={at:#x}; it stays in the pool")
                handle = pages.pop(at)
                done += page
                st = fn.hipMemRelease(handle)
                if st:
                    self.stray.append((0, handle))
                    raise self.rt.error(st, "hipMemRelease", device=self.device, size=page,
                                        detail=f"ptr={at:#x} (unmapped; released later)")
        except Exception as exc:
            exc.unmapped = done  # type: ignore[attr-defined]
            raise
        finally:
            if done:
                self._remove_run(start, done)
        return done

    def retry_stray(self) -> None:
        """Unmap (where still mapped) and release the pages of :attr:`stray`; those that fail
        again stay there (errors cleared)."""
        fn, page = self.fn, self.page
        left = []
        for at, handle in self.stray:
            if at and fn.hipMemUnmap(at, page):
                left.append((at, handle))
            elif fn.hipMemRelease(handle):
                left.append((0, handle))
        self.stray[:] = left
        self.rt.clear_last_error()

    def close(self) -> None:
        """Unmap and release every page and free the range, now (the finalizer's work; the
        range is unusable afterwards).  Errors are ignored: what fails stays."""
        self.closer()
        self.runs.clear()
        self.starts.clear()

    def forget(self) -> None:
        """In a forked child: the range and pages are the parent's; never touch them."""
        self.pages.clear()
        self.stray.clear()
        self.reserved[0] = 0


@finalizer
def _close_range(reserved: List[int], size: int, pages: Dict[int, int],
                 stray: List[Tuple[int, int]], fn: Any, rt: Any, device: int, page: int) -> None:
    """Finalizer of a range: its pages and the range go back (never at exit: see ``_exit``).
    Errors are ignored (a finalizer has nobody to report to; a forked child's runtime
    refuses, and the range is the parent's: its ``pages`` are emptied there)."""
    try:
        with on_device(device):
            for at, handle in stray + [(at, h) for at, h in pages.items()]:
                if not (at and fn.hipMemUnmap(at, page)) and not fn.hipMemRelease(handle):
                    pages.pop(at, None)
            stray.clear()
            if reserved[0] and not pages and not fn.hipMemAddressFree(reserved[0], size):
                reserved[0] = 0
            rt.clear_last_error()
    except Exception:  # noqa: BLE001
        pass

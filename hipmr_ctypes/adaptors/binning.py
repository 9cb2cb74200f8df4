"""``BinningResource``: routes each request by size to a bin resource."""
from __future__ import annotations

import operator
import threading
from bisect import bisect_left
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..properties import DEFAULT_ALIGNMENT
from .._checks import FAST_ALIGNMENTS, check_args, check_free_args, check_size, check_stream
from .._stream_order import SYNC
from ._base import BoundAdaptor, as_upstream_ref
from ._checked import claim, duplicate, must_check_arguments
from ._dead import ANY as _ANY, DEAD as _DEAD, rescue as _rescue
from .fixed_size import DEFAULT_BLOCKS, FixedSizeResource, chunk_too_large

__all__ = ["BinningResource"]

_ROUTES_CACHED = 4096      # exact sizes whose record is remembered (then routed each time)
# what the hot paths use, as globals rather than closure cells (every cell a closure uses is
# copied into every call's frame)
_MISS = (KeyError, TypeError)  # a size not in the route cache / an unhashable alignment
_NONE: Any = object()


def _entry(ref: Any, size: int = 0) -> Tuple[Any, Any, Any, Any, Any]:
    """``(allocate_async, deallocate_async, allocate, deallocate, lists)`` of a bin of
    ``size`` bytes (or of the upstream: ``size`` 0), the methods of its ref bound once (the
    async pair None for a synchronous ref).  The package's own resources check every argument
    (the stream too) before they change anything: the adaptor's fast paths pass sizes (and a
    free's alignment) on unchecked, for the bin to check.  A user-written one gets every
    argument checked first.  ``lists``: for a bin that is a :class:`FixedSizeResource` (not a
    subclass) whose blocks hold ``size`` bytes, its :class:`~.fixed_size.FreeLists`, which
    the adaptor's fast paths serve themselves, keeping to its rules; else None."""
    up_alloc: Any = ref.allocate
    up_dealloc: Any = ref.deallocate
    up_alloc_async: Any = getattr(ref, "allocate_async", None)
    up_dealloc_async: Any = getattr(ref, "deallocate_async", None)
    resource = ref.resource
    lists = (resource._free_lists() if size and type(resource) is FixedSizeResource
             and size <= resource.block_size else None)
    if not must_check_arguments(ref):
        return up_alloc_async, up_dealloc_async, up_alloc, up_dealloc, lists

    def allocate(nbytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        ptr: int = up_alloc(*check_args(nbytes, alignment))
        return ptr

    def deallocate(ptr: int, nbytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        up_dealloc(*check_free_args(ptr, nbytes, alignment))

    if up_alloc_async is None:
        return None, None, allocate, deallocate, None

    def allocate_async(nbytes: int, alignment: int, stream: Any) -> int:
        check_stream(stream)
        ptr: int = up_alloc_async(*check_args(nbytes, alignment), stream)
        return ptr

    def deallocate_async(ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
        check_stream(stream)
        up_dealloc_async(*check_free_args(ptr, nbytes, alignment), stream)

    return allocate_async, deallocate_async, allocate, deallocate, None


def _route(routes: Dict[int, Any], bins: List[Any], nbytes: int, alignment: int) -> Any:
    """The record of a request of ``nbytes`` (checked) aligned to ``alignment``: the entry of
    the smallest bin of at least ``nbytes`` for an alignment of at most 256, else the
    upstream's, followed by ``nbytes`` (at index 5).  Remembered in the route cache
    ``routes`` for the next request of that size.  ``bins[0]`` (``(sizes, entries,
    upstream's entry)``) is read before the record is stored and again after: when
    :meth:`BinningResource.add_bin` replaced it meanwhile (and then cleared the cache), the
    record, which may be of the old bins, is taken out again."""
    table = bins[0]
    sizes, entries, upstream = table
    if alignment > DEFAULT_ALIGNMENT:
        return upstream + (nbytes,)
    i = bisect_left(sizes, nbytes)
    record = (entries[i] if i < len(sizes) else upstream) + (nbytes,)
    if len(routes) < _ROUTES_CACHED:
        routes[nbytes] = record
        if bins[0] is not table:
            routes.pop(nbytes, None)
    return record


def _allocate_slow(books: Tuple[Any, Any, Any], bytes: Any, alignment: Any,
                   stream: Any) -> int:
    """The checked allocation: a size not in the route cache, an alignment above 256 or of
    another type (``stream`` SYNC: the synchronous ``allocate``).  ``books``: the adaptor's
    ``(live, routes, bins)``."""
    bytes, alignment = check_args(bytes, alignment)
    if not bytes:
        return 0
    live, routes, bins = books
    record = _route(routes, bins, bytes, alignment)
    ptr: int = (record[2](bytes, alignment) if stream is SYNC
                else record[0](bytes, alignment, stream))
    if ptr:
        if ptr in live:  # a bin handed ptr out twice
            raise duplicate("BinningResource", ptr)
        live[ptr] = record
    return ptr


def _deallocate_slow(live: Dict[int, Any], ptr: Any, bytes: Any, alignment: Any,
                     stream: Any) -> None:
    """The checked free (after the fast path put back what it popped): the precise error for
    a pointer this adaptor did not hand out or a wrong size, else the free through the
    record's bin (``stream`` SYNC: the synchronous ``deallocate``)."""
    ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
    found = claim(live, ptr, bytes, 5, "BinningResource")
    if found is None:
        return
    try:
        if stream is SYNC:
            found[3](ptr, bytes, alignment)
        else:
            found[1](ptr, bytes, alignment, stream)
    except BaseException:
        live[ptr] = found
        raise


def _exponent(value: Any, name: str) -> int:
    """A bin size exponent: an int in ``[0, 62]`` (a bin of ``2**value`` bytes)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int exponent, not bool")
    try:
        exponent = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int exponent, not {type(value).__name__}") from None
    if not 0 <= exponent <= 62:
        raise ValueError(f"{name}={exponent} is not in [0, 62] (a bin of 2**{name} bytes)")
    return exponent


class BinningResource(BoundAdaptor):
    """``BinningResource(upstream, bins=(), *, min_size_exponent=None,
    max_size_exponent=None)``.

    A request of ``bytes`` (with an alignment of at most 256) goes to the smallest bin whose
    size is at least ``bytes``; larger requests and larger alignments go to ``upstream``.
    ``bins`` lists bin sizes (each gets a :class:`FixedSizeResource` over the upstream with
    that block size) or ``(size, resource)`` pairs; ``min_size_exponent`` / ``max_size_exponent``
    (RMM's) add fixed-size bins of ``2**min .. 2**max`` bytes.  :meth:`add_bin` adds one later
    (a size that has a bin keeps it, as in RMM).
    A bin resource must have every property of the upstream, and be async when the upstream
    is.  Each pointer is freed through the resource that allocated it, also after bins were
    added.  Thread-safe; an async resource when the upstream is one; equal to another over an
    equal upstream with equal bins.
    """

    def __init__(self, upstream: Any, bins: Iterable[Any] = (), *,
                 min_size_exponent: Optional[int] = None,
                 max_size_exponent: Optional[int] = None) -> None:
        ref = self._set_upstream(upstream)
        specs: List[Tuple[int, Any]] = []
        try:
            items = list(bins)
        except TypeError:
            raise TypeError(f"bins must be an iterable of sizes or (size, resource) pairs, "
                            f"not {type(bins).__name__}") from None
        for item in items:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise TypeError(f"bins: {item!r} is not a size or a (size, resource) pair")
                specs.append((item[0], item[1]))
            else:
                specs.append((item, None))
        if (min_size_exponent is None) != (max_size_exponent is None):
            raise ValueError("min_size_exponent and max_size_exponent must be given together")
        if min_size_exponent is not None:
            low = _exponent(min_size_exponent, "min_size_exponent")
            high = _exponent(max_size_exponent, "max_size_exponent")
            if high < low:
                raise ValueError(f"max_size_exponent={high} is smaller than "
                                 f"min_size_exponent={low}")
            if chunk_too_large(1 << high, DEFAULT_BLOCKS):
                raise ValueError(f"max_size_exponent={high}: its bin is a FixedSizeResource of "
                                 f"{DEFAULT_BLOCKS} blocks of 2**{high} bytes per chunk, more "
                                 "than 2**63 bytes (add larger bins as (size, resource) pairs)")
            specs.extend((1 << e, None) for e in range(low, high + 1))
        self._lock = threading.Lock()
        self._sizes: List[int] = []        # sorted bin sizes
        self._refs: List[Any] = []         # the bins' refs, in the same order
        # ptr -> the record it was allocated with: (the bin's entry..., bytes)
        self._live: Dict[int, Tuple[Any, ...]] = {}
        self._entries: List[Any] = []      # the bins' entries (_entry), in the same order
        self._up_entry = _entry(ref)
        # [(sizes, entries, upstream's entry)], replaced whole by _insert; the route cache maps
        # an exact size (alignment at most 256) to its record, cleared by _insert after that
        self._bins: List[Any] = [((), (), self._up_entry)]
        self._routes: Dict[int, Tuple[Any, ...]] = {}
        checked = [self._check_bin(size, res) for size, res in specs]
        for size, _ in checked:
            if sum(1 for s, _ in checked if s == size) > 1:
                raise ValueError(f"bins: the size {size} appears twice")
        for size, res in checked:
            self._insert(size, res if res is not None else FixedSizeResource(ref, size))
        self._bind(ref)

    def _check_bin(self, size: Any, resource: Any) -> Tuple[int, Any]:
        size = check_size(size, "size")
        if not size:
            raise ValueError("size=0: a bin must hold at least one byte")
        if resource is None:
            if chunk_too_large(size, DEFAULT_BLOCKS):
                raise ValueError(f"size={size}: a bin without a resource of its own is a "
                                 f"FixedSizeResource of {DEFAULT_BLOCKS} blocks per chunk, and "
                                 f"{DEFAULT_BLOCKS} blocks of {size} bytes are more than 2**63 "
                                 "bytes: give this bin a (size, resource) pair")
            return size, None
        bin_ref = as_upstream_ref(resource, "resource")
        if self._reaches_self(bin_ref.resource):
            raise ValueError("resource: the bin is this BinningResource, or a stack of "
                             "resources over it (every allocation would recurse)")
        missing = [p.__name__ for p in self._upstream.properties
                   if p not in bin_ref.properties]
        if missing:
            raise TypeError(f"resource: the bin lacks the upstream's properties "
                            f"{', '.join(sorted(missing))}")
        if self._async and not hasattr(bin_ref, "allocate_async"):
            raise TypeError("resource: the upstream is an async resource but the bin is not")
        return size, bin_ref

    def _reaches_self(self, resource: Any) -> bool:
        """True when ``resource`` is this adaptor or has it below it (through ``upstream`` /
        ``resource`` links: adaptors, refs)."""
        seen = set()
        todo = [resource]
        while todo:
            r = todo.pop()
            if r is self:
                return True
            if id(r) in seen or r is None:
                continue
            seen.add(id(r))
            for attr in ("resource", "upstream"):
                try:
                    nxt = getattr(r, attr, None)
                except Exception:  # noqa: BLE001 - a property of a user object
                    nxt = None
                if nxt is not None and not callable(nxt):
                    todo.append(nxt)
            for nxt in getattr(r, "bins", ()) if isinstance(r, BinningResource) else ():
                todo.append(nxt[1])
        return False

    def _insert(self, size: int, resource: Any) -> None:
        bin_ref = as_upstream_ref(resource, "resource")
        with self._lock:
            if size in self._sizes:   # (add_bin in another thread meanwhile): the first stays
                return
            i = bisect_left(self._sizes, size)
            self._sizes.insert(i, size)
            self._refs.insert(i, bin_ref)
            self._entries.insert(i, _entry(bin_ref, size))
            # the bins first, then the route cache emptied: a record of the old bins stored
            # meanwhile is cleared here, or taken out again by _route, which reads the bins
            # again after it stored it
            self._bins[0] = (tuple(self._sizes), tuple(self._entries), self._up_entry)
            self._routes.clear()

    def add_bin(self, size: int, resource: Any = None) -> None:
        """Add a bin for requests of up to ``size`` bytes (above the next smaller bin), served
        by ``resource`` (default: a new ``FixedSizeResource(upstream, size)``).  When a bin
        of that size exists already it is kept and nothing changes, as in RMM (the
        arguments are still checked)."""
        size, bin_ref = self._check_bin(size, resource)
        with self._lock:
            if size in self._sizes:
                return
        self._insert(size, bin_ref if bin_ref is not None
                     else FixedSizeResource(self._upstream, size))

    def _bind(self, ref: Any) -> None:
        """The hot paths take no lock: a request's record ``(the bin's entry..., bytes)`` is
        read from the route cache ``_routes`` (exact size -> record, one shared tuple per
        size, filled on a miss by :func:`_route`; :meth:`add_bin` clears it); ``live[ptr] =
        record`` records an allocation and ``live.pop(ptr)`` claims it for its free (one
        atomic dict operation each, so two threads can never both free a pointer).  An entry
        holds the bound methods of its bin (or of the upstream): a hit calls the bin
        directly, with the size (and a free's alignment) unchecked, for the bin to check (the
        package's own resources do; a user-written bin's entry checks them first).  A pointer
        already live when a bin hands it out is refused: the test ``ptr in live`` before
        the store cannot be passed by a pointer that is live (the store comes after it, and
        a free pops the record before the bin can hand the pointer out again)."""
        live = self._live
        live_pop = live.pop
        routes = self._routes
        books = (live, routes, self._bins)   # what the checked allocation uses

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            try:  # a size whose route is known, an alignment of at most 256
                if alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS[alignment] is alignment:
                    record = routes[bytes]
                else:
                    return _allocate_slow(books, bytes, alignment, stream)
            except _MISS:
                return _allocate_slow(books, bytes, alignment, stream)
            ptr = 0
            lists = record[4]
            if lists is not None and type(bytes) is int:  # a fixed-size bin's lists, inline
                lst = lists.streams.get(stream if type(stream) is int
                                        else getattr(stream, "_hipmr_handle", None))
                if lst:   # (a checked stream's; else the bin's own path resolves it)
                    try:  # the pop hands the block to exactly one caller
                        ptr = lst.pop()
                        lists.live[ptr] = bytes
                    except IndexError:  # another thread took the last block meanwhile
                        pass
            if not ptr:
                ptr = record[0](bytes, alignment, stream)  # the bin checks the size's type
            if ptr:
                if ptr in live:  # a bin handed ptr out twice
                    raise duplicate("BinningResource", ptr)
                live[ptr] = record
            return ptr

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            try:  # a size whose route is known, an alignment of at most 256
                if alignment is DEFAULT_ALIGNMENT or FAST_ALIGNMENTS[alignment] is alignment:
                    record = routes[bytes]
                else:
                    return _allocate_slow(books, bytes, alignment, SYNC)
            except _MISS:
                return _allocate_slow(books, bytes, alignment, SYNC)
            ptr = 0
            lists = record[4]
            if lists is not None and type(bytes) is int:  # a fixed-size bin's lists, inline
                try:
                    ptr = lists.host.pop()
                    lists.live[ptr] = bytes
                except IndexError:
                    pass
            if not ptr:
                ptr = record[2](bytes, alignment)  # the bin checks the size's type
            if ptr:
                if ptr in live:  # a bin handed ptr out twice
                    raise duplicate("BinningResource", ptr)
                live[ptr] = record
            return ptr

        def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
            try:  # (a float equal to a live pointer is refused by the bin: put back below)
                found = live_pop(ptr)
            except _MISS:  # not live / unhashable
                return _deallocate_slow(live, ptr, bytes, alignment, stream)
            try:  # the bin checks the types of bytes and alignment, and the stream
                if found[5] == bytes:
                    lists = found[4]
                    if (lists is not None and type(ptr) is int is type(bytes)
                            and (alignment is DEFAULT_ALIGNMENT
                                 or FAST_ALIGNMENTS.get(alignment) is alignment)):
                        lst = lists.streams.get(stream if type(stream) is int
                                                else getattr(stream, "_hipmr_handle", None))
                        if lst is not None:  # a checked stream's: take the bin's claim
                            bin_live = lists.live
                            known = bin_live.pop(ptr, _NONE)
                            if known == bytes:
                                lst.append(ptr)
                                if _ANY and id(lst) in _DEAD:  # the bin let the list go
                                    _rescue(lst)               # meanwhile
                                return
                            if known is not _NONE:  # put it back; the bin decides below
                                bin_live[ptr] = known
                    found[1](ptr, bytes, alignment, stream)
                    return
            except BaseException:
                live[ptr] = found
                raise
            live[ptr] = found  # another size: put it back, the checked path decides
            _deallocate_slow(live, ptr, bytes, alignment, stream)

        def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            try:  # (a float equal to a live pointer is refused by the bin: put back below)
                found = live_pop(ptr)
            except _MISS:  # not live / unhashable
                return _deallocate_slow(live, ptr, bytes, alignment, SYNC)
            try:  # the bin checks the types of bytes and alignment
                if found[5] == bytes:
                    lists = found[4]
                    if (lists is not None and type(ptr) is int is type(bytes)
                            and (alignment is DEFAULT_ALIGNMENT
                                 or FAST_ALIGNMENTS.get(alignment) is alignment)):
                        bin_live = lists.live   # a fixed-size bin's lists, inline
                        known = bin_live.pop(ptr, _NONE)
                        if known == bytes:
                            lists.host.append(ptr)
                            return
                        if known is not _NONE:  # put it back; the bin decides below
                            bin_live[ptr] = known
                    found[3](ptr, bytes, alignment)
                    return
            except BaseException:
                live[ptr] = found
                raise
            live[ptr] = found  # another size: put it back, the checked path decides
            _deallocate_slow(live, ptr, bytes, alignment, SYNC)

        self._build(allocate_async, deallocate_async, allocate=allocate, deallocate=deallocate)

    def _settings(self) -> Tuple[Any, ...]:
        return tuple(self.bins)

    @property
    def bins(self) -> Tuple[Tuple[int, Any], ...]:
        """``((size, resource), ...)`` from the smallest bin up."""
        with self._lock:
            return tuple((s, r.resource) for s, r in zip(self._sizes, self._refs))

    @property
    def bin_resources(self) -> Dict[int, Any]:
        """``{size: resource}`` for every bin."""
        return dict(self.bins)

    def allocation_count(self) -> int:
        """Number of live allocations."""
        return len(self._live)

    def release(self) -> int:
        """Call ``release()`` on every bin that has one (the fixed-size bins give their free
        chunks back); returns the total bytes they report."""
        given = 0
        for _, resource in self.bins:
            rel = getattr(resource, "release", None)
            if callable(rel):
                got: Any = rel()
                given += got or 0
        return given

    def __repr__(self) -> str:
        return (f"BinningResource({self._upstream.resource!r}, "
                f"bins={[s for s, _ in self.bins]})")

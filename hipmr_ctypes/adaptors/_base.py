"""What every adaptor shares: the upstream reference, the hot methods' slots, equality, and
the argument checks.

An adaptor stores its upstream as a ``resource_ref`` / ``async_resource_ref`` carrying every
property the upstream declares, exposes it with ``upstream_resource()`` and forwards those
properties (:class:`~hipmr_ctypes.properties.forward_property`).  It is an async resource
exactly when its upstream is one: over a synchronous upstream the slots ``allocate_async`` /
``deallocate_async`` are left unset (reading them raises ``AttributeError``), so
``is_async_resource(adaptor)`` is False there.

Checks run before any state or upstream is touched and name the argument they reject.  Hot
paths inline the cheap part (``type(x) is int``, membership in :data:`FAST_ALIGNMENTS`) and
call the functions here only when that fails.

How an adaptor is built (one way; docs/internals.md has the details): its hot paths are
closures made once per instance by a ``_bind`` method, which hands them to
:meth:`BoundMethods._build` (every adaptor but the two sub-allocators, which give all four to
:meth:`BoundMethods._install`), which keeps them in the slots named after the four methods
(``_Declared`` declares their signatures); each closure is named after its method
(``__qualname__`` ``"PoolResource.allocate"``),
so that tracebacks, profilers and argument errors read as calls of the public method.
"""
from __future__ import annotations

import weakref
from types import FunctionType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .._exit import finalizer
from .._locks import on_forked_child
from ..errors import ForkedChildError
from ..concepts import is_async_resource, is_resource
from ..properties import DEFAULT_ALIGNMENT, forward_property
from ..resource_ref import async_resource_ref, resource_ref

if TYPE_CHECKING:  # a ref with any properties, for annotations
    from typing_extensions import Unpack
    AnyRef = resource_ref[Unpack[Tuple[Any, ...]]]
from .._checks import (FAST_ALIGNMENTS, MAX_SIZE, STREAM_REF, check_alignment, check_ptr,
                       check_size, check_stream)
from .._limits import MAX_ADDRESS

__all__ = ["Adaptor", "BoundAdaptor", "BoundMethods", "IdentityEqual",
           "as_upstream_ref", "check_size", "check_alignment", "check_args",
           "check_free_args", "check_ptr", "upstream_calls", "checked_frees",
           "check_stream", "check_free", "check_callable", "give_back_chunks",
           "return_chunks", "round_up", "FAST_ALIGNMENTS", "STREAM_REF", "MAX_SIZE", "MAX_ADDRESS",
           "must_check_arguments", "SYNC", "claim", "check_upstream_chunk", "overlaps",
           "check_upstream_ptr", "duplicate", "checking_first"]

#: ``MAX_ADDRESS`` under the name ``adaptors/binning.py`` still imports; not exported, and to
#: go when that module reads ``MAX_ADDRESS``.
MAX_PTR = MAX_ADDRESS


def check_args(nbytes: Any, alignment: Any) -> Tuple[int, int]:
    """A checked ``(bytes, alignment)`` pair (the slow path of the adaptors' fast checks)."""
    return check_size(nbytes), check_alignment(alignment)


def check_free_args(ptr: Any, nbytes: Any, alignment: Any) -> Tuple[int, int, int]:
    """A checked ``(ptr, bytes, alignment)`` triple (the slow path of the fast checks)."""
    return check_ptr(ptr), check_size(nbytes), check_alignment(alignment)


def check_free(ptr: int, known: Any, nbytes: int, owner: str) -> None:
    """Raise ValueError unless ``known``, the size ``ptr`` was allocated with (None when it is
    not live), equals the ``nbytes`` it is being freed with."""
    if known is None:
        raise ValueError(f"ptr={ptr:#x} is not a live allocation of this {owner} (never "
                         "allocated by it, or already deallocated)")
    if known != nbytes:
        raise ValueError(f"ptr={ptr:#x} was allocated with {known} bytes, not bytes={nbytes}")


class _Sync:
    """The type of :data:`SYNC`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SYNC"

    def __reduce__(self) -> str:
        return "SYNC"

    def __hash__(self) -> int:
        # Fixed, not the address: the sub-allocators key their free lists by stream handle and
        # SYNC, and an address-based hash would, in some processes, put SYNC in the dict slot
        # of stream 0 and cost every lookup of that stream an extra probe.  -2 falls in the
        # last slots, away from the special streams (0, 1, 2) and from aligned handles.
        return -2


#: The "stream" of a synchronous call (``allocate`` / ``deallocate``), wherever an adaptor's
#: body serves both kinds of call or keys its state by stream: never a stream handle.
SYNC = _Sync()


def claim(records: Dict[int, Any], ptr: int, nbytes: int, size_at: int, owner: str,
          required: bool = True) -> Any:
    """The checked claim of ``ptr``'s record for its free (the slow path of a lock-free
    ``records.pop(ptr)``; the arguments are already checked): the record, taken with one
    ``dict.pop`` so that two threads can never both claim it.  ``record[size_at]`` (or the
    record itself, when it is an int) is the size it was allocated with: another ``nbytes`` is
    a ValueError, and so is a pointer with no record, unless it is the no-op free of ``(0, 0)``
    or ``required`` is false (then None)."""
    found = records.get(ptr)
    if found is None and (not required or (not ptr and not nbytes)):
        return None
    check_free(ptr, found if found is None or type(found) is int else found[size_at], nbytes,
               owner)
    found = records.pop(ptr, None)
    if found is None:  # another thread freed it meanwhile
        check_free(ptr, None, nbytes, owner)
    return found


def check_callable(value: Any, name: str) -> Any:
    """``value`` unchanged if callable, else TypeError naming ``name``."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")
    return value


def round_up(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of the power of two ``alignment``."""
    return (value + alignment - 1) & -alignment


@finalizer
def give_back_chunks(up_dealloc: Callable[..., Any], chunks: Dict[int, int]) -> None:
    """Finalizer of the sub-allocators: return every chunk ``{start: size}`` to the upstream
    (with alignment 256) when the resource is garbage-collected; errors are ignored (the
    interpreter may be exiting).  Never run at exit (see ``hipmr_ctypes._exit``)."""
    for start, size in list(chunks.items()):
        try:
            up_dealloc(start, size, DEFAULT_ALIGNMENT)
        except Exception:
            pass
    chunks.clear()


def return_chunks(lock: Any, chunks: List[Tuple[int, int]], events: List[Any],
                  up_dealloc: Callable[..., Any],
                  keep: Callable[[List[Tuple[int, int]], bool], None],
                  returning: Dict[int, int]) -> int:
    """Give ``chunks`` ``[(start, size)]``, already out of the sub-allocator's books, back to
    the upstream (with alignment 256); returns the bytes given back.

    Called with ``lock`` held, and returns with it held; the lock is let go meanwhile, while
    the host waits for ``events`` (recorded on the streams that freed into the chunks; closed
    here) and while the upstream frees (both may block), so that other threads keep
    allocating.  Until the upstream is asked to take a chunk back it stays in ``returning``
    (``{start: size}``), which growth checks as it checks the books (an upstream that hands
    out a chunk it has not got back yet is refused).  If a wait or a free raises,
    ``keep(rest, waited)`` takes back, under the lock, the chunks the upstream did not get
    (``waited``: the events all completed), but for one that overlaps a chunk the pool got
    meanwhile (the upstream handed it out again: it is the upstream's now); the error
    propagates."""
    returning.update(chunks)
    lock.release()
    given = done = 0
    waited = False
    try:
        try:
            for ev in events:
                ev.synchronize()
            waited = True
        finally:
            for ev in events:
                ev.close()
        for start, size in chunks:
            returning.pop(start, None)   # the upstream may hand it out again from now on
            up_dealloc(start, size, DEFAULT_ALIGNMENT)
            given += size
            done += 1
    except BaseException:
        lock.acquire()
        rest = chunks[done:]
        for start, _ in rest:
            returning.pop(start, None)
        keep(rest, waited)
        raise
    lock.acquire()
    return given


def overlaps(chunks: Dict[int, int], start: int, size: int) -> bool:
    """True when ``[start, start + size)`` overlaps a chunk of ``{start: size}``."""
    end = start + size
    return any(s < end and start < s + n for s, n in chunks.items())


def check_upstream_chunk(ptr: Any, size: int, chunks: Dict[int, int], give_back: Any,
                         owner: str, returning: Dict[int, int]) -> int:
    """The one check of a chunk an upstream returned for ``size`` bytes (a sub-allocator's
    slow path): a non-null int address aligned to 256 whose ``size`` bytes fit below 2**64
    and overlap none of ``chunks`` nor of ``returning`` (chunks on their way back to the
    upstream: see :func:`return_chunks`) (an upstream that hands out an address twice would
    otherwise give one block to two users).  Anything else is given back when it can be
    (never a pointer overlapping a chunk already held: that would free live memory) and
    refused with ValueError."""
    if (type(ptr) is int and 0 < ptr and ptr + size <= MAX_ADDRESS + 1
            and not ptr & (DEFAULT_ALIGNMENT - 1) and not overlaps(chunks, ptr, size)
            and not overlaps(returning, ptr, size)):
        return ptr
    if type(ptr) is int and 0 < ptr <= MAX_ADDRESS and (
            overlaps(chunks, ptr, size) or overlaps(returning, ptr, size)):
        problem = "it overlaps memory the upstream handed out before and that is still held"
    else:
        problem = f"a sub-allocator needs a non-null address aligned to {DEFAULT_ALIGNMENT}"
        if type(ptr) is int and 0 < ptr <= MAX_ADDRESS:
            try:
                give_back(ptr, size, DEFAULT_ALIGNMENT)
            except Exception:  # noqa: BLE001 - the refusal below is the error to report
                pass
    raise ValueError(f"{owner}: the upstream returned {ptr!r} for {size} bytes: {problem}")


def check_upstream_ptr(ptr: Any, nbytes: int, alignment: int, give_back: Any,
                       owner: str) -> int:
    """The one check of what a user-written upstream returned for ``(nbytes, alignment)``
    (the package's own resources are trusted): an int address whose ``nbytes`` fit below
    2**64, aligned to ``alignment``, non-null unless ``nbytes`` is 0.  Anything else is
    given back when it is an address (with the arguments it was asked for) and refused:
    TypeError for something that is not an int, ValueError otherwise."""
    if (type(ptr) is int and 0 <= ptr and ptr + nbytes <= MAX_ADDRESS + 1
            and not ptr & (alignment - 1) and (ptr or not nbytes)):
        return ptr
    if type(ptr) is int and 0 < ptr <= MAX_ADDRESS:
        try:
            give_back(ptr, nbytes, alignment)
        except Exception:  # noqa: BLE001 - the refusal below is the error to report
            pass
        problem = (f"it is not aligned to {alignment}" if ptr & (alignment - 1)
                   else "its bytes run past the end of the address space")
    elif type(ptr) is int and ptr == 0:
        problem = "a null pointer for a non-empty allocation"
    elif type(ptr) is int:
        problem = "not an address in [0, 2**64)"
    else:
        raise TypeError(f"{owner}: the pointer returned by the upstream's allocate for "
                        f"bytes={nbytes} is {ptr!r}, not an int address")
    raise ValueError(f"{owner}: the pointer returned by the upstream's allocate for "
                     f"bytes={nbytes}, alignment={alignment} is {ptr!r}: {problem}")


def duplicate(owner: str, ptr: int) -> ValueError:
    """The error for an upstream that returned an address it had handed out before and that
    is still live (never given back: that would free the live allocation)."""
    return ValueError(f"{owner}: the upstream returned ptr={ptr:#x}, which it handed out "
                      "before and which is still live: the upstream is broken")


def upstream_calls(ref: AnyRef) -> Tuple[Callable[..., int], Callable[..., None], Any, Any]:
    """``(allocate, deallocate, allocate_async, deallocate_async)`` of an upstream ref, bound
    once (the async ones are None for a synchronous ref)."""
    return (ref.allocate, ref.deallocate, getattr(ref, "allocate_async", None),
            getattr(ref, "deallocate_async", None))


def must_check_arguments(ref: resource_ref) -> bool:
    """True when an adaptor over ``ref`` must check every argument itself: the resource behind
    it is not one of the package's own, which validate every argument (sizes, alignments,
    pointers) before they change anything.  Over those, an adaptor keeps only the checks its own
    bookkeeping needs."""
    return getattr(type(ref.resource), "_checks_arguments", False) is not True


def checked_frees(ref: AnyRef) -> Tuple[Any, Any]:
    """``deallocate`` / ``deallocate_async`` that check their arguments, then call the
    upstream's: for adaptors that do nothing of their own when memory is freed.  Over one of
    the package's own resources, which check every argument themselves, the upstream's own
    (bound) methods: the adaptor then adds nothing to a free."""
    if not must_check_arguments(ref):
        return ref.deallocate, getattr(ref, "deallocate_async", None)
    up_dealloc = ref.deallocate
    up_dealloc_async = getattr(ref, "deallocate_async", None)

    def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        up_dealloc(*check_free_args(ptr, bytes, alignment))

    def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        check_stream(stream)
        up_dealloc_async(*check_free_args(ptr, bytes, alignment), stream)  # type: ignore[misc]

    return deallocate, deallocate_async


def checking_first(allocate: Callable[..., int], deallocate: Callable[..., None],
                   allocate_async: Any, deallocate_async: Any) -> Tuple[Any, Any, Any, Any]:
    """``(allocate, deallocate, allocate_async, deallocate_async)`` that check every argument
    they are given (sizes, alignments, pointers: :func:`check_args`, :func:`check_free_args`),
    then call the given fast paths with the checked values: what an adaptor over a
    user-written upstream installs (:func:`must_check_arguments`), so that its fast paths
    test only what their own bookkeeping needs and carry no test of the upstream's kind.  The
    async pair is None where the given one is."""

    def checked_allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        return allocate(*check_args(bytes, alignment))

    def checked_deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        deallocate(*check_free_args(ptr, bytes, alignment))

    def checked_allocate_async(bytes: int, alignment: int, stream: Any) -> int:
        bytes, alignment = check_args(bytes, alignment)
        ptr: int = allocate_async(bytes, alignment, stream)
        return ptr

    def checked_deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        ptr, bytes, alignment = check_free_args(ptr, bytes, alignment)
        deallocate_async(ptr, bytes, alignment, stream)

    return (checked_allocate, checked_deallocate,
            None if allocate_async is None else checked_allocate_async,
            None if deallocate_async is None else checked_deallocate_async)


def as_upstream_ref(upstream: Any, name: str = "upstream") -> AnyRef:
    """``upstream`` as a ref carrying all its properties: itself if it already is a ref, an
    ``async_resource_ref`` for an async resource, a ``resource_ref`` for a synchronous one."""
    if isinstance(upstream, resource_ref):
        return upstream
    if upstream is None or isinstance(upstream, type):
        raise TypeError(f"{name} must be a resource instance or a resource_ref, not "
                        f"{upstream!r}")
    props = tuple(getattr(upstream, "properties", ()))
    if is_async_resource(upstream):
        return async_resource_ref[props](upstream)  # type: ignore[valid-type]
    if is_resource(upstream):
        return resource_ref[props](upstream)  # type: ignore[valid-type]
    raise TypeError(f"{name}: {type(upstream).__name__} is not a resource (it needs "
                    "allocate(bytes, alignment), deallocate(ptr, bytes, alignment) and ==)")


class Adaptor(forward_property):
    """Base class of the adaptors: an upstream ref, forwarded properties, equality.

    Subclasses call :meth:`_set_upstream` first in ``__init__`` and list their settings in
    :meth:`_settings`; two adaptors are equal when they have the same type, equal upstreams and
    equal settings.  Adaptors that own memory of their own (pools) compare by identity instead.

    ``passes_pointers_through`` (a class attribute, False here) says that ``allocate`` returns
    exactly the pointer the upstream returned for the same size, and ``deallocate`` gives that
    pointer back to the upstream: the memory is the upstream's whole allocation.  Memory from
    such an adaptor can be shared with another process as its upstream's
    (``Buffer.export_ipc`` walks down through it); any adaptor class may set it to True,
    whatever its base (statistics, tracking, logging, limiting and failure-callback do).
    """

    #: hands out the upstream's pointers unchanged (see the class documentation)
    passes_pointers_through = False
    _async = False
    _upstream: AnyRef

    def _set_upstream(self, upstream: Any, name: str = "upstream") -> AnyRef:
        ref = as_upstream_ref(upstream, name)
        self._upstream = ref
        self._async = isinstance(ref, async_resource_ref)
        return ref

    def upstream_resource(self) -> AnyRef:
        """The upstream, as the ``resource_ref`` / ``async_resource_ref`` this adaptor holds."""
        return self._upstream

    @property
    def upstream(self) -> Any:
        """The upstream resource object itself (``upstream_resource().resource``)."""
        return self._upstream.resource

    def _settings(self) -> Tuple[Any, ...]:
        return ()

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        # isinstance as well: mypy before 2.0 (Python 3.9's) narrows only through it
        if type(other) is not type(self) or not isinstance(other, type(self)):
            return False
        return bool(self._upstream == other._upstream) and \
            self._settings() == other._settings()

    def __hash__(self) -> int:
        try:
            return hash((type(self), self._upstream, self._settings()))
        except TypeError:
            return hash((type(self), self._upstream))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._upstream.resource!r})"


class IdentityEqual:
    """Mixin for adaptors that own memory (pools): equal only to themselves, since memory from
    one pool cannot be given back to another even over the same upstream."""

    def __eq__(self, other: object) -> bool:
        return other is self

    if TYPE_CHECKING:
        def __hash__(self) -> int:
            return object.__hash__(self)
    else:  # object's own slot: no Python-level call
        __hash__ = object.__hash__


class _Declared:
    """The four hot methods as :class:`BoundMethods` instances offer them: their signatures and
    documentation (for ``help()``, type checkers and ``_Declared.allocate(instance, ...)``).
    An instance's own are the closures :class:`BoundMethods` keeps in its slots, which come
    first in every subclass's MRO."""

    def allocate(self, bytes: int,
                 alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocate ``bytes`` bytes aligned to ``alignment``; returns the pointer."""
        return self.allocate(bytes, alignment)

    def deallocate(self, ptr: int, bytes: int,
                   alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Free ``ptr``, obtained from ``allocate(bytes, alignment)``."""
        self.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """Allocate in stream order on ``stream`` (only over an async upstream)."""
        return self.allocate_async(bytes, alignment, stream)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Free ``ptr`` in stream order on ``stream`` (only over an async upstream)."""
        self.deallocate_async(ptr, bytes, alignment, stream)


class BoundMethods(_Declared):
    """A resource whose hot methods are closures built once per instance, so that a call looks
    nothing up.  The closures live in the four slots of this class, named after the methods
    they serve (``__qualname__`` ``"<Class>.<method>"``), with the signatures
    :class:`_Declared` documents.  ``allocate_async`` / ``deallocate_async`` are set only when
    ``_async`` is true (otherwise reading them raises ``AttributeError``).

    Slots rather than the instance's ``__dict__``: a value in an instance's dict that shadows
    a method of its class is read the generic way on every access (CPython specializes the
    read of a slot, never that of a shadowing attribute), and ``pool.allocate_async(...)`` is
    what users write.

    So a class's shape is fixed: every instance has ``allocate`` and ``deallocate`` with the
    declared signatures, and the async pair, with theirs, exactly when ``instance._async``.
    """

    __slots__ = {
        "allocate": "allocate(bytes, alignment=256) -> int: allocate ``bytes`` bytes aligned "
                    "to ``alignment``; returns the pointer.",
        "deallocate": "deallocate(ptr, bytes, alignment=256): free ``ptr``, obtained from "
                      "``allocate(bytes, alignment)``.",
        "allocate_async": "allocate_async(bytes, alignment, stream) -> int: allocate in "
                          "stream order on ``stream`` (only over an async upstream).",
        "deallocate_async": "deallocate_async(ptr, bytes, alignment, stream): free ``ptr`` in "
                            "stream order on ``stream`` (only over an async upstream)."}

    #: every subclass validates its arguments before changing anything (see
    #: must_check_arguments)
    _checks_arguments = True
    #: the instances' closures have the signatures declared on the class; the async pair
    #: exists when ``_async`` is true (the concepts may rely on this)
    _bound_methods = True

    _async = False

    def _install(self, allocate: Callable[..., int], deallocate: Callable[..., None],
                 allocate_async: Optional[Callable[..., int]] = None,
                 deallocate_async: Optional[Callable[..., None]] = None) -> None:
        """Store the four hot paths on the instance (the async pair only when ``_async``),
        each closure named after its public method."""
        owner = type(self).__qualname__
        methods: Dict[str, Optional[Callable[..., Any]]] = {"allocate": allocate,
                                                            "deallocate": deallocate}
        if self._async:
            methods["allocate_async"] = allocate_async
            methods["deallocate_async"] = deallocate_async
        for name, fn in methods.items():
            if fn is None:
                raise TypeError(f"{owner}: no {name} to install")
            if type(fn) is FunctionType:  # a closure made for this instance, not a bound method
                fn.__name__ = name
                fn.__qualname__ = f"{owner}.{name}"
            setattr(self, name, fn)

    def _build(self, allocate_async: Callable[..., int],
               deallocate_async: Optional[Callable[..., None]] = None, *,
               allocate: Optional[Callable[..., int]] = None,
               deallocate: Optional[Callable[..., None]] = None) -> None:
        """The one way an adaptor installs its hot paths.

        ``allocate_async(bytes, alignment, stream)`` and ``deallocate_async(ptr, bytes,
        alignment, stream)`` are the bodies: the synchronous ``allocate`` / ``deallocate`` call
        them with :data:`SYNC` as the stream, unless the adaptor gives its own (where a
        measured hot path saves the extra call).  Without ``deallocate_async`` the adaptor does
        nothing of its own when memory is freed: frees go to its upstream (``_upstream``) after
        the checks it needs (:func:`checked_frees`).  The sub-allocators (pool, fixed size), whose
        synchronous and stream-ordered paths differ, call :meth:`_install` instead."""
        if deallocate_async is None:
            deallocate, free_async = checked_frees(self._upstream)  # type: ignore[attr-defined]
        else:
            free_async = deallocate_async

        def allocate_sync(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            return allocate_async(bytes, alignment, SYNC)

        def deallocate_sync(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            free_async(ptr, bytes, alignment, SYNC)
        # (_install names the closures after the public methods)
        self._install(allocate or allocate_sync, deallocate or deallocate_sync, allocate_async,
                      free_async)


class BoundAdaptor(BoundMethods, Adaptor):
    """An :class:`Adaptor` with :class:`BoundMethods`."""


# ---- a forked child: the sub-allocators refuse ------------------------------------------------
#: the pool and fixed-size resources of this process, weakly: in a child forked after the
#: runtime started they refuse every call (the blocks they cache are the parent's memory)
_SUB_ALLOCATORS: "weakref.WeakSet[BoundMethods]" = weakref.WeakSet()


def refuse_in_forked_child(resource: BoundMethods) -> None:
    """Make ``resource`` (a sub-allocator) refuse every call in a child forked after the
    runtime started (see ``hipmr_ctypes._hip.fork``)."""
    _SUB_ALLOCATORS.add(resource)


def _refusal() -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ForkedChildError()
    return refused


def _refuse_sub_allocators() -> None:
    for resource in list(_SUB_ALLOCATORS):
        resource._install(_refusal(), _refusal(), _refusal(), _refusal())


on_forked_child(_refuse_sub_allocators)

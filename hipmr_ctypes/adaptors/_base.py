"""The adaptors' base classes: the upstream reference, forwarded properties, equality, and the
slots of the four hot methods.

An adaptor stores its upstream as a ``resource_ref`` / ``async_resource_ref`` carrying every
property the upstream declares, exposes it with ``upstream_resource()`` and forwards those
properties (:class:`~hipmr_ctypes.properties.forward_property`).  It is an async resource
exactly when its upstream is one: over a synchronous upstream the slots ``allocate_async`` /
``deallocate_async`` are left unset (reading them raises ``AttributeError``), so
``is_async_resource(adaptor)`` is False there.

Every adaptor's ``_bind`` has one shape (docs/hot-paths.md):

* first, once, the choice of what to install: over a user-written upstream
  (:func:`~hipmr_ctypes.adaptors._checked.must_check_arguments`) the checked paths, else the
  fast ones;
* the state the fast paths use, as closure cells; at most the four fast closures, each named
  after its method; slow and checked paths are methods or module functions;
* :meth:`BoundMethods._build` (or, for the two sub-allocators, :meth:`BoundMethods._install`)
  stores them in the slots named after the four methods.

The argument checks are :mod:`hipmr_ctypes._checks`'; the checked paths around an upstream are
in :mod:`._checked`; what the sub-allocators share is in :mod:`._chunks`.
"""
from __future__ import annotations

from types import FunctionType
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Type, TypeVar

from .._stream_order import SYNC
from ..concepts import is_async_resource, is_resource
from ..properties import DEFAULT_ALIGNMENT, forward_property
from ..resource_refs import async_resource_ref, resource_ref
from ._checked import checked_frees, checking_first

if TYPE_CHECKING:
    from ._checked import AnyRef

__all__ = ["Adaptor", "BoundAdaptor", "BoundMethods", "IdentityEqual", "as_upstream_ref"]


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


_Self = TypeVar("_Self", bound="Adaptor")


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

    def __new__(cls: Type[_Self], *args: Any, **kwargs: Any) -> _Self:
        # RMM's keyword for the upstream gets a TypeError that names ours (before __init__
        # would refuse it with Python's own "unexpected keyword" message)
        if "upstream_mr" in kwargs:
            from .._rmm_names import keyword_hint
            raise TypeError(keyword_hint(f"{cls.__name__}()", "upstream_mr", "upstream"))
        return object.__new__(cls)

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
    """The four hot methods' signatures and documentation (for ``help()``, type checkers and
    ``_Declared.allocate(instance, ...)``).  These are stubs: an instance's real bodies are the
    closures its class's ``_bind`` builds, which :meth:`BoundMethods._install` stores in the
    slots of :class:`BoundMethods` (first in every subclass's MRO, so they shadow these)."""

    def allocate(self, bytes: int,
                 alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocate ``bytes`` bytes aligned to ``alignment``; returns the pointer.  (The body
        is the closure the class's ``_bind`` installs.)"""
        return self.allocate(bytes, alignment)

    def deallocate(self, ptr: int, bytes: int,
                   alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Free ``ptr``, obtained from ``allocate(bytes, alignment)``.  (The body is the
        closure the class's ``_bind`` installs.)"""
        self.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """Allocate in stream order on ``stream`` (only over an async upstream).  (The body is
        the closure the class's ``_bind`` installs.)"""
        return self.allocate_async(bytes, alignment, stream)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Free ``ptr`` in stream order on ``stream`` (only over an async upstream).  (The body
        is the closure the class's ``_bind`` installs.)"""
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
               deallocate: Optional[Callable[..., None]] = None,
               check_first: bool = False) -> None:
        """The one way an adaptor installs its hot paths.

        ``allocate_async(bytes, alignment, stream)`` and ``deallocate_async(ptr, bytes,
        alignment, stream)`` are the bodies: the synchronous ``allocate`` / ``deallocate`` call
        them with :data:`SYNC` as the stream, unless the adaptor gives its own (one call less
        on its path).  Without ``deallocate_async`` the adaptor does nothing of its own when
        memory is freed: frees go to its upstream (``_upstream``) after the checks it needs
        (:func:`~._checked.checked_frees`).  ``check_first``: install
        :func:`~._checked.checking_first`'s wrappers, which check every argument and then call
        the given paths (over a user-written upstream).  The sub-allocators (pool, fixed
        size), whose synchronous and stream-ordered paths differ, call :meth:`_install`."""
        if deallocate_async is None:
            deallocate, free_async = checked_frees(self._upstream)  # type: ignore[attr-defined]
        else:
            free_async = deallocate_async

        def allocate_sync(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            return allocate_async(bytes, alignment, SYNC)

        def deallocate_sync(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
            free_async(ptr, bytes, alignment, SYNC)

        paths = (allocate or allocate_sync, deallocate or deallocate_sync, allocate_async,
                 free_async)
        # (_install names the closures after the public methods)
        self._install(*(checking_first(*paths) if check_first else paths))


class BoundAdaptor(BoundMethods, Adaptor):
    """An :class:`Adaptor` with :class:`BoundMethods`."""

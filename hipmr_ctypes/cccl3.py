"""The CCCL 3.x names and semantics of ``cuda::mr``, built on the package's resources.

The top level of the package keeps libhipcxx 2.2's model exactly (``is_resource`` means
*synchronous*, ``async_resource_ref``, ``allocate_async(bytes, alignment, stream)``).  CCCL 3.x
renamed it; this module speaks 3.x:

* a **resource** is stream-ordered: ``allocate(stream, bytes, alignment)`` and
  ``deallocate(stream, ptr, bytes, alignment)`` (the stream first), plus the synchronous pair;
* a **synchronous resource** has ``allocate_sync(bytes, alignment)`` and
  ``deallocate_sync(ptr, bytes, alignment)`` and a usable ``==``;
* ``resource_ref`` / ``synchronous_resource_ref`` are the non-owning wrappers,
  ``any_resource`` / ``any_synchronous_resource`` the owning ones (which may be empty),
  ``shared_resource`` a reference-counted holder, ``synchronous_resource_adapter`` a
  synchronous resource made stream-ordered, ``dynamic_accessibility_property`` a property every
  resource has, and :class:`stream_ref` gains ``wait(event | stream)``.

An object is read in one of two shapes.  One with an ``allocate_sync`` attribute is read in
3.x's shape (its ``allocate`` takes the stream first).  Anything else is read as the top level
reads it (2.2's shape): the package's resources and adaptors, and users' 2.2 resources, are
3.x resources through ``allocate_async`` / ``deallocate_async`` and synchronous resources
through ``allocate`` / ``deallocate``.  So ``resource_ref(hmr.AsyncMemoryResource())`` works as
it is.

The default alignment is 256 (``DEFAULT_ALIGNMENT``) everywhere here too: CCCL's wrappers use
``alignof(max_align_t)`` (16) and deprecated the default; this module keeps one default for the
whole package.  Python objects are shared by reference: the "owning" wrappers keep their
resource alive exactly as the refs do; what they add is emptiness and construction from a ref.
Importing this module loads no library; ``stream_ref.wait`` reaches the runtime on first call.
"""
from __future__ import annotations

import enum
import inspect
from typing import (Any, Callable, Collection, FrozenSet, Optional, Protocol, Tuple,
                    Type, TypeVar)

from . import concepts as _concepts
from . import properties as _props
from .resource_refs import async_resource_ref as _async_ref22
from .resource_refs import resource_ref as _ref22
from .resource_refs import try_get_property as _try_get_property22
from .resource_refs import resource_cast as _resource_cast22
from .resource_refs import (ImmutableRef, listed_property, property_names, ref_hash,
                            resource_hash, same_resource, specializer)
from .stream_refs import as_stream_handle
from .stream_refs import stream_ref as _stream_ref22
from .properties import DEFAULT_ALIGNMENT, Property, _check_property, forward_property

__all__ = ["DEFAULT_ALIGNMENT", "Resource", "SynchronousResource", "is_resource",
           "is_synchronous_resource", "is_resource_with", "is_synchronous_resource_with",
           "resource_ref", "synchronous_resource_ref", "any_resource",
           "any_synchronous_resource", "shared_resource", "make_shared_resource",
           "synchronous_resource_adapter", "Accessibility", "dynamic_accessibility_property",
           "get_property", "has_property", "try_get_property", "resource_cast", "stream_ref"]

T = TypeVar("T")
_set = object.__setattr__
#: the reason the top level's concepts give for every wrapper of this module
_NOT_22 = ("{name} is a CCCL 3.x object (allocate takes the stream first): use it through "
           "hipmr_ctypes.cccl3, or pass its .resource to the 2.2 API")


# ---- properties ----------------------------------------------------------------------------------
class Accessibility(enum.Enum):
    """Where memory can be accessed from: the value of :class:`dynamic_accessibility_property`."""

    host = "host"
    device = "device"
    host_device = "host_device"
    unknown = "unknown"


class dynamic_accessibility_property(Property):
    """Stateful (an :class:`Accessibility`): where the resource's memory can be accessed, known
    at run time.  Every resource has it: a resource that does not declare it answers what its
    ``host_accessible`` / ``device_accessible`` declare (neither: ``Accessibility.unknown``)."""

    __slots__ = ()
    value_type = Accessibility


def _resource_of(obj: Any) -> Any:
    """The resource behind a wrapper of either model, or ``obj`` itself."""
    if isinstance(obj, _Wrapper):
        if obj.resource is None:
            raise ValueError(f"{type(obj).__name__} is empty")
        return obj.resource
    if isinstance(obj, _ref22):
        return obj.resource
    return obj


def _inferred_accessibility(obj: Any) -> Accessibility:
    declared = _props._declared(obj)
    host = _props.host_accessible in declared
    device = _props.device_accessible in declared
    if host and device:
        return Accessibility.host_device
    return Accessibility.host if host else Accessibility.device if device else \
        Accessibility.unknown


def has_property(obj: Any, prop: Type[Property]) -> bool:
    """``hmr.has_property``, plus :class:`dynamic_accessibility_property` for every resource
    (of either shape) and every wrapper of this module."""
    _check_property(prop)
    if prop is dynamic_accessibility_property and (
            isinstance(obj, _Wrapper) or is_synchronous_resource(obj)):
        return True
    return _props.has_property(obj, prop)


def get_property(obj: Any, prop: Type[Property]) -> Any:
    """``hmr.get_property``, with :class:`dynamic_accessibility_property` answered for every
    resource: the resource's own value when it declares it, else what its static properties
    say.  Through a wrapper, the wrapped resource answers (the value is the memory's, whatever
    properties the wrapper's type lists)."""
    _check_property(prop)
    if prop is dynamic_accessibility_property and has_property(obj, prop):
        res = _resource_of(obj)
        if prop in _props._declared(res):
            return _props.get_property(res, prop)
        return _inferred_accessibility(res)
    if isinstance(obj, _Wrapper):
        return obj.get_property(prop)
    return _props.get_property(obj, prop)


def try_get_property(obj: Any, prop: Type[Property]) -> Any:
    """A property of the resource behind ``obj`` (a wrapper of either model, or a resource),
    even one the wrapper's type does not list: ``True`` / ``False`` for a stateless property,
    the value or ``None`` for a stateful one."""
    _check_property(prop)
    res = _resource_of(obj)
    if prop is dynamic_accessibility_property:
        return get_property(res, prop) if is_synchronous_resource(res) else None
    return _try_get_property22(res, prop)


def resource_cast(cls: Type[T], obj: Any) -> Optional[T]:
    """The resource behind ``obj`` if its type is exactly ``cls``, else ``None`` (also for an
    empty wrapper)."""
    return _resource_cast22(cls, obj.resource if isinstance(obj, _Wrapper) else obj)


# ---- concepts ------------------------------------------------------------------------------------
#: the 3.x methods: name -> number of positional arguments
_METHODS_3X = (("allocate_sync", 2), ("deallocate_sync", 3), ("allocate", 3), ("deallocate", 4))


def _callable_with(fn: Any, count: int) -> bool:
    if fn is None or not callable(fn):
        return False
    try:
        inspect.signature(fn).bind(*([0] * count))
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): trust it
        return True
    return True


def _kind_3x(obj: Any) -> Tuple[int, str]:
    """(0 not a resource, 1 synchronous, 2 stream-ordered, why not) for a 3.x-shaped object."""
    cls = type(obj)
    if getattr(cls, "__eq__", None) is None or getattr(cls, "__ne__", None) is None:
        return 0, f"{cls.__name__} does not support =="
    status = [_callable_with(getattr(obj, name, None), count) for name, count in _METHODS_3X]
    if not (status[0] and status[1]):
        name = "allocate_sync" if not status[0] else "deallocate_sync"
        params = "bytes, alignment" if not status[0] else "ptr, bytes, alignment"
        return 0, f"{cls.__name__}.{name} is missing or cannot be called as {name}({params})"
    if not (status[2] and status[3]):
        name = "allocate" if not status[2] else "deallocate"
        params = "stream, bytes, alignment" if not status[2] else "stream, ptr, bytes, alignment"
        return 1, f"{cls.__name__}.{name} is missing or cannot be called as {name}({params})"
    return 2, ""


def _kind(obj: Any) -> Tuple[int, str]:
    if isinstance(obj, type):
        return 0, "a class is not a resource (pass an instance)"
    if isinstance(obj, _Wrapper):
        if obj.resource is None:
            return 0, f"{type(obj).__name__} is empty"
        return (type(obj)._kind,
                f"{type(obj).__name__} is synchronous: it has no stream-ordered allocate")
    if hasattr(obj, "allocate_sync"):
        return _kind_3x(obj)
    info = _concepts._info(obj)
    why = info.why or f"{type(obj).__name__} is not a resource"
    if info.kind == 1:
        why = f"{type(obj).__name__} has no allocate_async / deallocate_async"
    return info.kind, why


def is_synchronous_resource(obj: Any) -> bool:
    """True for a synchronous resource: ``allocate_sync`` / ``deallocate_sync`` and ``==`` (or,
    read as the top level reads it, ``allocate`` / ``deallocate``)."""
    return _kind(obj)[0] >= 1


def is_resource(obj: Any) -> bool:
    """True for a stream-ordered resource: a synchronous resource whose ``allocate(stream,
    bytes, alignment)`` / ``deallocate(stream, ptr, bytes, alignment)`` exist (or, read as the
    top level reads it, an async resource)."""
    return _kind(obj)[0] == 2


def _has_all(obj: Any, props: Tuple[Type[Property], ...]) -> bool:
    for prop in props:
        _check_property(prop)
    declared = _declared_props(obj)
    return all(prop in declared or prop is dynamic_accessibility_property for prop in props)


def _declared_props(obj: Any) -> Collection[Type[Property]]:
    if isinstance(obj, _Wrapper):
        return type(obj).properties
    return _props._declared(obj)


def is_synchronous_resource_with(obj: Any, *props: Type[Property]) -> bool:
    """True for a synchronous resource that has every property in ``props``."""
    return _has_all(obj, props) and is_synchronous_resource(obj)


def is_resource_with(obj: Any, *props: Type[Property]) -> bool:
    """True for a stream-ordered resource that has every property in ``props``."""
    return _has_all(obj, props) and is_resource(obj)


class SynchronousResource(Protocol):
    """For type checkers: what :func:`is_synchronous_resource` checks (3.x's shape)."""

    def allocate_sync(self, bytes: int, alignment: int) -> int:
        """Allocate ``bytes`` bytes aligned to ``alignment``; the pointer as an int."""
        ...

    def deallocate_sync(self, ptr: int, bytes: int, alignment: int) -> None:
        """Free ``ptr``, from ``allocate_sync(bytes, alignment)``."""
        ...

    def __eq__(self, other: object) -> bool:
        ...


class Resource(SynchronousResource, Protocol):
    """For type checkers: what :func:`is_resource` checks (3.x's shape: the stream first)."""

    def allocate(self, stream: Any, bytes: int, alignment: int) -> int:
        """Allocate in stream order on ``stream``; the pointer as an int."""
        ...

    def deallocate(self, stream: Any, ptr: int, bytes: int, alignment: int) -> None:
        """Free ``ptr`` in stream order on ``stream``."""
        ...


# ---- binding a source's methods in 3.x's shape ---------------------------------------------------
def _methods_22(source: Any, kind: int) -> Tuple[Callable[..., Any], ...]:
    """3.x-shaped callables over a 2.2-shaped resource (through a 2.2 ref, which already gives
    the resource's own bound methods where their signatures allow, defaulting to 256)."""
    ref: Any = (_async_ref22 if kind == 2 else _ref22)(source)
    if kind < 2:
        return (ref.allocate, ref.deallocate)
    allocate_async, deallocate_async = ref.allocate_async, ref.deallocate_async

    def allocate(stream: Any, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        return allocate_async(bytes, alignment, stream)  # type: ignore[no-any-return]

    def deallocate(stream: Any, ptr: int, bytes: int,
                   alignment: int = DEFAULT_ALIGNMENT) -> None:
        deallocate_async(ptr, bytes, alignment, stream)

    return (ref.allocate, ref.deallocate, allocate, deallocate)


def _methods_3x(source: Any, kind: int) -> Tuple[Callable[..., Any], ...]:
    """Callables over a 3.x-shaped resource, with the alignment defaulting to 256."""
    allocate_sync, deallocate_sync = source.allocate_sync, source.deallocate_sync

    def _allocate_sync(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        return allocate_sync(bytes, alignment)  # type: ignore[no-any-return]

    def _deallocate_sync(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        deallocate_sync(ptr, bytes, alignment)

    if kind < 2:
        return (_allocate_sync, _deallocate_sync)
    allocate_, deallocate_ = source.allocate, source.deallocate

    def allocate(stream: Any, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        return allocate_(stream, bytes, alignment)  # type: ignore[no-any-return]

    def deallocate(stream: Any, ptr: int, bytes: int,
                   alignment: int = DEFAULT_ALIGNMENT) -> None:
        deallocate_(stream, ptr, bytes, alignment)

    return (_allocate_sync, _deallocate_sync, allocate, deallocate)


def _bind(cls: Type["_Wrapper"], source: Any) -> Tuple[Any, Tuple[Callable[..., Any], ...]]:
    """(the resource, its methods in 3.x's shape) for a wrapper of class ``cls`` built from
    ``source``; TypeError naming what is missing."""
    want = cls._kind
    props = cls.properties
    if isinstance(source, _Wrapper):  # another wrapper of this module: share its methods
        if source.resource is None:
            raise TypeError(f"cannot build {cls.__name__} from an empty "
                            f"{type(source).__name__}")
        if type(source)._kind < want:
            raise TypeError(f"cannot build {cls.__name__} from the synchronous "
                            f"{type(source).__name__}: it has no stream-ordered allocate")
        missing = props - type(source).properties - {dynamic_accessibility_property}
        if missing:
            raise TypeError(f"cannot build {cls.__name__} from {type(source).__name__}: it "
                            f"lacks {property_names(missing)} (build from .resource to check the "
                            "resource itself)")
        return source.resource, source._methods[:2 * want]
    resource = source
    if isinstance(source, _ref22):  # a 2.2 ref: its listed properties count
        declared: Collection[Type[Property]] = type(source).properties
        resource = source.resource
    else:
        declared = _props._declared(source)
    kind, why = _kind(source)
    if kind < want:
        if source is None or isinstance(source, type):
            raise TypeError(f"{cls.__name__} needs a resource instance, not {source!r}")
        raise TypeError(f"cannot build {cls.__name__} from {type(source).__name__}: {why}")
    absent = [p for p in props if p not in declared and p is not dynamic_accessibility_property]
    if absent:
        raise TypeError(f"cannot build {cls.__name__} from {type(source).__name__}: it lacks "
                        f"the properties {property_names(absent)}")
    if hasattr(source, "allocate_sync"):
        methods = _methods_3x(source, want)
    else:
        methods = _methods_22(source, want)
    return resource, methods


# ---- the wrappers --------------------------------------------------------------------------------
def _empty(*args: Any, **kwargs: Any) -> Any:
    raise ValueError("the wrapper is empty: it holds no resource")


class _Wrapper(ImmutableRef):
    """What the four wrappers share: the resource, its methods, properties, equality."""

    __slots__ = ("resource", "_methods", "allocate_sync", "deallocate_sync")
    _hipmr_not_a_resource = _NOT_22
    _kind = 1
    properties: FrozenSet[Type[Property]] = frozenset()
    resource: Any
    _methods: Tuple[Callable[..., Any], ...]
    allocate_sync: Callable[..., int]
    deallocate_sync: Callable[..., None]

    def __class_getitem__(cls, props: Any) -> type:
        return _specialize(cls, props)

    def _fill(self, resource: Any, methods: Tuple[Callable[..., Any], ...]) -> None:
        _set(self, "resource", resource)
        _set(self, "_methods", methods)
        _set(self, "allocate_sync", methods[0])
        _set(self, "deallocate_sync", methods[1])
        if type(self)._kind == 2:
            _set(self, "allocate", methods[2])
            _set(self, "deallocate", methods[3])

    def get_property(self, prop: Type[Property]) -> Any:
        """The resource's value of a listed stateful property, read live (None if stateless);
        :class:`dynamic_accessibility_property` is always answered."""
        _check_property(prop)
        if prop is dynamic_accessibility_property:
            return get_property(self, prop)
        return listed_property(self, prop, _resource_of)

    def __eq__(self, other: object) -> bool:
        res = self.resource
        if isinstance(other, _Wrapper):
            if res is None or other.resource is None:  # empty equals empty, never a resource
                return res is None and other.resource is None
            other = other.resource
        elif res is None:
            return False
        elif isinstance(other, _ref22):
            other = other.resource
        return same_resource(res, other)

    __hash__ = ref_hash

    def __reduce__(self) -> Tuple[Any, ...]:
        base = next(k for k in type(self).__mro__ if k in _BASES)
        return (_rebuild, (base.__name__, tuple(type(self).properties), self.resource))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'' if self.resource is None else repr(self.resource)})"


class synchronous_resource_ref(_Wrapper):
    """A non-owning reference to a synchronous resource with the properties of this class:
    ``synchronous_resource_ref[P, ...](source)``.

    ``source``: a synchronous resource of either shape with every property, a 2.2 ref, or a
    wrapper of this module whose type lists them.  ``allocate_sync(bytes, alignment=256)``,
    ``deallocate_sync(ptr, bytes, alignment=256)``, ``resource``, ``properties``,
    ``get_property(P)`` (listed properties only; :func:`try_get_property` reaches the others).
    Equal when the resources have the same type and compare equal (also with a resource
    itself); immutable and hashable."""

    __slots__ = ()

    def __init__(self, source: Any) -> None:
        self._fill(*_bind(type(self), source))


class resource_ref(synchronous_resource_ref):
    """A non-owning reference to a stream-ordered resource: a
    :class:`synchronous_resource_ref` plus ``allocate(stream, bytes, alignment=256)`` and
    ``deallocate(stream, ptr, bytes, alignment=256)``.  It converts to a
    ``synchronous_resource_ref`` of a subset of its properties; never the other way."""

    __slots__ = ("allocate", "deallocate")
    _kind = 2
    allocate: Callable[..., int]
    deallocate: Callable[..., None]


class any_synchronous_resource(_Wrapper):
    """An owning wrapper of a synchronous resource: like :class:`synchronous_resource_ref`,
    and also constructible empty (``any_synchronous_resource[P]()``) or from a ref.  An empty
    one is false, equals only another empty one, and raises ValueError when used.  A copy
    holds the same resource (Python shares objects by reference)."""

    __slots__ = ()

    def __init__(self, source: Any = None) -> None:
        if source is None:
            methods = (_empty,) * (2 * type(self)._kind)
            self._fill(None, methods)
        else:
            self._fill(*_bind(type(self), source))

    def has_value(self) -> bool:
        """True unless the wrapper is empty."""
        return self.resource is not None

    def __bool__(self) -> bool:
        return self.resource is not None


class any_resource(any_synchronous_resource):
    """An owning wrapper of a stream-ordered resource (see :class:`any_synchronous_resource`),
    with ``allocate(stream, bytes, alignment=256)`` / ``deallocate(stream, ptr, bytes,
    alignment=256)``."""

    __slots__ = ("allocate", "deallocate")
    _kind = 2
    allocate: Callable[..., int]
    deallocate: Callable[..., None]


_BASES = (resource_ref, synchronous_resource_ref, any_resource, any_synchronous_resource)
_BY_NAME = {cls.__name__: cls for cls in _BASES}
_specialize = specializer(_BASES, __name__)


def _rebuild(base: str, props: Tuple[Type[Property], ...], resource: Any) -> Any:
    cls: Any = _specialize(_BY_NAME[base], props)
    return cls(resource) if resource is not None else cls()


# ---- shared_resource and synchronous_resource_adapter --------------------------------------------
class _Block:
    """The block a shared_resource's copies share."""

    __slots__ = ("resource", "methods", "kind", "__weakref__")

    def __init__(self, resource: Any) -> None:
        kind, why = _kind(resource)
        if kind < 1:
            raise TypeError(f"shared_resource needs a resource, not {type(resource).__name__}: "
                            f"{why}")
        self.resource = resource
        self.kind = kind
        cls: Any = any_resource if kind == 2 else any_synchronous_resource
        self.methods = cls(resource)._methods


class shared_resource(forward_property):
    """A reference-counted resource: ``shared_resource(resource)``; copies (``copy.copy``)
    share it, and the resource lives while any copy does.  A 3.x resource itself
    (``allocate_sync`` / ``deallocate_sync``, and ``allocate`` / ``deallocate`` with the stream
    first when the resource is stream-ordered) with the resource's properties.  Two copies of
    one block are equal; otherwise the payloads are compared.  ``get()`` is the resource."""

    __slots__ = ("_block", "allocate_sync", "deallocate_sync", "allocate", "deallocate")
    _hipmr_not_a_resource = _NOT_22
    allocate_sync: Callable[..., int]
    deallocate_sync: Callable[..., None]
    allocate: Callable[..., int]
    deallocate: Callable[..., None]

    def __init__(self, resource: Any) -> None:
        self._share(_Block(resource))

    def _share(self, block: _Block) -> None:
        self._block = block
        methods = block.methods
        self.allocate_sync, self.deallocate_sync = methods[0], methods[1]
        if block.kind == 2:
            self.allocate, self.deallocate = methods[2], methods[3]

    def get(self) -> Any:
        """The shared resource."""
        return self._block.resource

    def upstream_resource(self) -> Any:
        """The shared resource (its properties are this object's)."""
        return self._block.resource

    def __copy__(self) -> "shared_resource":
        copy = shared_resource.__new__(shared_resource)
        copy._share(self._block)
        return copy

    def __deepcopy__(self, memo: Any) -> "shared_resource":
        return self.__copy__()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, shared_resource):
            if other._block is self._block:
                return True
            other = other._block.resource
        return same_resource(self._block.resource, other)

    def __hash__(self) -> int:
        return resource_hash(self._block.resource)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (shared_resource, (self._block.resource,))

    def __repr__(self) -> str:
        return f"shared_resource({self._block.resource!r})"


def make_shared_resource(cls: Callable[..., Any], *args: Any, **kwargs: Any) -> shared_resource:
    """``shared_resource(cls(*args, **kwargs))``."""
    if not callable(cls):
        raise TypeError(f"make_shared_resource needs a resource class, not {cls!r}")
    return shared_resource(cls(*args, **kwargs))


class synchronous_resource_adapter(forward_property):
    """A synchronous resource made stream-ordered: ``synchronous_resource_adapter(upstream)``.

    ``allocate(stream, bytes, alignment=256)`` is the upstream's stream-ordered allocate when
    it has one, else its ``allocate_sync``; ``deallocate(stream, ptr, bytes, alignment=256)``
    is the upstream's stream-ordered deallocate, else it synchronizes ``stream`` (work queued
    there may still use the memory) and calls ``deallocate_sync``.  The upstream's properties
    are the adapter's; equal when the upstreams are."""

    __slots__ = ("_upstream", "allocate_sync", "deallocate_sync", "allocate", "deallocate")
    _hipmr_not_a_resource = _NOT_22
    allocate_sync: Callable[..., int]
    deallocate_sync: Callable[..., None]
    allocate: Callable[..., int]
    deallocate: Callable[..., None]

    def __init__(self, upstream: Any) -> None:
        kind, why = _kind(upstream)
        if kind < 1:
            raise TypeError(f"synchronous_resource_adapter needs a resource, not "
                            f"{type(upstream).__name__}: {why}")
        self._upstream = upstream
        cls: Any = any_resource if kind == 2 else any_synchronous_resource
        methods = cls(upstream)._methods
        self.allocate_sync, self.deallocate_sync = methods[0], methods[1]
        if kind == 2:
            self.allocate, self.deallocate = methods[2], methods[3]
            return
        allocate_sync, deallocate_sync = methods[0], methods[1]
        as_handle = as_stream_handle

        def allocate(stream: Any, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            as_handle(stream)  # a bad stream is refused before any allocation
            return allocate_sync(bytes, alignment)  # type: ignore[no-any-return]

        def deallocate(stream: Any, ptr: int, bytes: int,
                       alignment: int = DEFAULT_ALIGNMENT) -> None:
            _stream_ref22(stream).sync()
            deallocate_sync(ptr, bytes, alignment)

        self.allocate, self.deallocate = allocate, deallocate

    def upstream_resource(self) -> Any:
        """The adapted resource."""
        return self._upstream

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, synchronous_resource_adapter):
            return False
        return same_resource(self._upstream, other._upstream)

    def __hash__(self) -> int:
        return resource_hash(self._upstream)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (synchronous_resource_adapter, (self._upstream,))

    def __repr__(self) -> str:
        return f"synchronous_resource_adapter({self._upstream!r})"


# ---- stream_ref ----------------------------------------------------------------------------------
class stream_ref(_stream_ref22):
    """The package's :class:`~hipmr_ctypes.stream_ref` with CCCL 3.x's ``wait``:
    ``ref.wait(event)`` makes later work on this stream wait for ``event`` (an
    :class:`~hipmr_ctypes.Event`); ``ref.wait(other)`` (anything a stream_ref accepts) makes it
    wait for all work queued on ``other`` so far (nothing to do when it is this stream).  Neither
    blocks the host: ``sync()`` does.  ``is_done()`` queries."""

    __slots__ = ()

    def wait(self, other: Any) -> None:  # type: ignore[override]
        """Make later work on this stream wait for ``other`` (an Event or a stream)."""
        from .stream import Event, wait_event, event_for
        if isinstance(other, Event):
            wait_event(self._handle, other)
            return
        handle = as_stream_handle(other, "other")
        if handle == self._handle:
            return
        event = event_for(handle)
        try:
            event.record(handle)
            wait_event(self._handle, event)
        finally:
            event.close()

    def sync(self) -> None:
        """Block until all work queued on the stream has finished (``hipStreamSynchronize``)."""
        _stream_ref22.wait(self)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (stream_ref, (self._handle,))

    def __repr__(self) -> str:
        return "cccl3." + super().__repr__()

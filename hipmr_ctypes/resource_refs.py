"""Type-erased, non-owning references to resources (libhipcxx ``cuda::mr::resource_ref``).

``resource_ref[P1, P2, ...]`` is a class, one per *set* of properties (order and repeats do not
matter: ``resource_ref[A, B] is resource_ref[B, A, A]``; ``resource_ref[()] is resource_ref``).
An instance refers to a resource that has every listed property::

    ref = resource_ref[device_accessible](my_resource)    # TypeError if it lacks one
    ptr = ref.allocate(1024)                               # alignment defaults to 256
    ref.deallocate(ptr, 1024)

``async_resource_ref[...]`` does the same for async resources and adds ``allocate_async`` /
``deallocate_async``.  A ref holds its resource strongly but never owns its allocations.

Calls cost what calling the resource costs: the resource's bound methods are stored on the ref
when it is built (``ref.allocate`` *is* ``resource.allocate``) whenever the resource's
signature already matches the ref's: ``allocate(self, bytes, alignment=256)``,
``deallocate(self, ptr, bytes, alignment=256)``, ``allocate_async(self, bytes, alignment,
stream)``, ``deallocate_async(self, ptr, bytes, alignment, stream)``.  With these names but
another default alignment (or none), the ref binds a copy of the method whose alignment
defaults to 256; with other names, a small wrapper supplies the ref's signature.  The default
is :data:`DEFAULT_ALIGNMENT` (256) through every ref.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Dict, FrozenSet, Iterator, Optional, Tuple, Type, TypeVar

from .concepts import CANONICAL, DEFAULTABLE, _info
from .properties import DEFAULT_ALIGNMENT, Property, _check_property, _declared
from .properties import get_property as _get_property

__all__ = ["DEFAULT_ALIGNMENT", "resource_ref", "async_resource_ref", "try_get_property",
           "resource_cast"]

T = TypeVar("T")
_set = object.__setattr__
_NAMES = ("allocate", "deallocate", "allocate_async", "deallocate_async")


def _wrap_allocate(fn: Callable[..., int]) -> Callable[..., int]:
    def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        return fn(bytes, alignment)
    return allocate


def _wrap_deallocate(fn: Callable[..., Any]) -> Callable[..., Any]:
    def deallocate(ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> Any:
        return fn(ptr, bytes, alignment)
    return deallocate


def _wrap_allocate_async(fn: Callable[..., int]) -> Callable[..., int]:
    def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
        return fn(bytes, alignment, stream)
    return allocate_async


def _wrap_deallocate_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    def deallocate_async(ptr: int, bytes: int, alignment: int, stream: Any) -> Any:
        return fn(ptr, bytes, alignment, stream)
    return deallocate_async


_WRAPPERS = (_wrap_allocate, _wrap_deallocate, _wrap_allocate_async, _wrap_deallocate_async)


def _with_default_alignment(fn: Any, index: int) -> Optional[Callable[..., Any]]:
    """``fn`` (a bound method of a plain function whose parameter ``index``, after ``self``, is
    ``alignment``) rebound to a copy of its function whose alignment defaults to 256: no extra
    call frame.  None when ``fn`` is not such a method."""
    import types
    if type(fn) is not types.MethodType or type(fn.__func__) is not types.FunctionType:
        return None
    func = fn.__func__
    code = func.__code__
    argcount = code.co_argcount
    names = code.co_varnames[:argcount]
    if code.co_posonlyargcount or argcount < index + 2 or names[index + 1] != "alignment":
        return None
    after = argcount - index - 2            # parameters after alignment: all have defaults
    old = func.__defaults__ or ()
    if len(old) < after:
        return None
    clone = types.FunctionType(code, func.__globals__, func.__name__,
                               (DEFAULT_ALIGNMENT,) + (old[len(old) - after:] if after else ()),
                               func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    clone.__qualname__ = func.__qualname__
    clone.__doc__ = func.__doc__
    clone.__module__ = func.__module__
    return types.MethodType(clone, fn.__self__)


_resource_attr = attrgetter("resource")


# ---- what every ref class shares, here and in cccl3 (its wrappers are refs of CCCL 3.x) --------
def property_names(props: Any) -> str:
    """The names of the properties ``props``, sorted, for messages and class names."""
    return ", ".join(sorted(p.__name__ for p in props))


def resource_hash(resource: Any) -> int:
    """The hash of whatever refers to ``resource``: its own, or its type's for an unhashable
    resource."""
    try:
        return hash(resource)
    except TypeError:
        return hash(type(resource))


def ref_hash(self: Any) -> int:
    """A ref's ``__hash__``: :func:`resource_hash` of its ``resource``."""
    return resource_hash(self.resource)


def same_resource(resource: Any, other: Any) -> bool:
    """Whether a ref to ``resource`` equals ``other`` (a resource, a ref already looked
    through): the same type, and equal."""
    return type(other) is type(resource) and bool(resource == other)


def listed_property(ref: Any, prop: Type[Property],
                    resource_of: Callable[[Any], Any] = _resource_attr) -> Any:
    """A ref's ``get_property(prop)``: the live value of a stateful property its class
    lists (read from ``resource_of(ref)``), None for a listed stateless one, TypeError for a
    property its class does not list."""
    if prop not in type(ref).properties:
        raise TypeError(f"{type(ref).__name__} does not have the property "
                        f"{getattr(prop, '__name__', prop)} (try_get_property reaches "
                        "the resource's other properties)")
    if not hasattr(prop, "value_type"):
        return None
    return _get_property(resource_of(ref), prop)


def specializer(bases: Tuple[type, ...], module: str) -> Callable[[type, Any], type]:
    """The ``__class_getitem__`` of one family of ref classes (``bases``; their subclasses
    are made in ``module``): ``specialize(base, props)`` is the subclass of ``base`` that
    lists the properties ``props`` (a property or a tuple of them; order and repeats do not
    matter), made once per set and kept; ``base`` itself for no property.  TypeError for a
    ``base`` not in ``bases`` (a class that has its properties already) or a non-property."""
    classes: Dict[Tuple[type, FrozenSet[Type[Property]]], type] = {}
    listed = [b.__name__ for b in bases]
    hint = " or ".join(listed) if len(listed) == 2 else "one of " + ", ".join(listed)

    def specialize(base: type, props: Any) -> type:
        if base not in bases:
            raise TypeError(f"{base.__name__} already has its properties; subscript {hint}")
        if not isinstance(props, tuple):
            props = (props,)
        for prop in props:
            _check_property(prop)
        key = (base, frozenset(props))
        cls = classes.get(key)
        if cls is None:
            if not key[1]:
                return base
            name = f"{base.__name__}[{property_names(key[1])}]"
            cls = type(name, (base,), {
                "__slots__": (), "properties": key[1], "__module__": module,
                "__qualname__": name,
                "__doc__": f"A {base.__name__} to a resource with the properties "
                           f"{property_names(key[1])}."})
            cls = classes.setdefault(key, cls)
        return cls

    return specialize


class ImmutableRef:
    """What every ref class shares (here and in ``cccl3``): immutable, and its own copy."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __copy__(self: T) -> T:
        return self

    def __deepcopy__(self: T, memo: Any) -> T:
        return self


class resource_ref(ImmutableRef):
    """A reference to a resource with the properties of this class (none for the bare class).

    ``resource_ref[P, ...](source)``: ``source`` is a resource with every property (checked with
    :func:`~hipmr_ctypes.is_resource_with`), or another ref (sync or async) whose properties
    include these; the new ref then refers to the same resource object.  ``TypeError``
    otherwise, naming what is missing.

    Attributes: ``allocate(bytes, alignment=256) -> int``, ``deallocate(ptr, bytes,
    alignment=256)`` (the resource's own bound methods or thin wrappers; results are returned
    unchanged), ``resource`` (the referenced object) and ``properties`` (a ``frozenset`` of
    property classes).  Only the listed properties are visible: :func:`get_property` raises
    ``TypeError`` for any other; see :func:`try_get_property`.  Two refs are equal when their
    resources have the same type and compare equal (property sets do not matter); a ref also
    equals its resource, and ``hash(ref) == hash(ref.resource)`` (``hash(type(resource))`` for
    an unhashable resource).  Refs are immutable.
    """

    __slots__ = ("resource", "allocate", "deallocate")
    resource: Any
    allocate: Callable[..., int]
    deallocate: Callable[..., Any]
    properties: FrozenSet[Type[Property]] = frozenset()
    _hipmr_ref_kind = 1  # concepts: 1 resource, 2 async resource

    def __class_getitem__(cls, props: Any) -> type:
        return _specialize(cls, props)

    def __init__(self, source: Any) -> None:
        cls = type(self)
        want = cls._hipmr_ref_kind
        info = _info(source)  # cached per class and shape of instance (concepts)
        if info.ref and isinstance(source, resource_ref):
            _from_ref(self, cls, want, source)
            return
        if info.kind < want:
            if source is None or isinstance(source, type):
                raise TypeError(f"{cls.__name__} needs a resource instance, not {source!r}")
            raise TypeError(f"cannot build {cls.__name__} from {type(source).__name__}: "
                            f"{info.why or f'{type(source).__name__} is not a resource'}")
        props = cls.properties
        if props:
            declared = _declared(source)
            for prop in props:
                if prop not in declared:
                    missing = [p for p in props if p not in declared]
                    raise TypeError(f"cannot build {cls.__name__} from "
                                    f"{type(source).__name__}: it lacks the properties "
                                    f"{property_names(missing)}")
        _set_resource(self, source)
        if info.bind >= 2 * want:  # the resource's own bound methods
            _set_allocate(self, source.allocate)
            _set_deallocate(self, source.deallocate)
            if want == 2:
                _set_allocate_async(self, source.allocate_async)
                _set_deallocate_async(self, source.deallocate_async)
            return
        statuses = info.methods
        for i, (name, status, wrap) in enumerate(zip(_NAMES[:2 * want], statuses, _WRAPPERS)):
            fn = getattr(source, name)
            if status == DEFAULTABLE:
                fn = _with_default_alignment(fn, i + 1) or wrap(fn)
            elif status != CANONICAL:
                fn = wrap(fn)
            _set(self, name, fn)

    def get_property(self, prop: Type[Property]) -> Any:
        """The resource's value of a listed stateful property, read live (None if stateless)."""
        return listed_property(self, prop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, resource_ref):
            other = other.resource
        return same_resource(self.resource, other)

    __hash__ = ref_hash

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild, (type(self)._hipmr_ref_kind == 2, tuple(type(self).properties),
                           self.resource))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.resource!r})"


class async_resource_ref(resource_ref):
    """A reference to an async resource: a :class:`resource_ref` plus
    ``allocate_async(bytes, alignment, stream) -> int`` and
    ``deallocate_async(ptr, bytes, alignment, stream)``, forwarded unchanged.

    Built from an async resource or another async ref; never from a synchronous ref.  It
    converts to ``resource_ref[...]`` of a subset of its properties.
    """

    __slots__ = ("allocate_async", "deallocate_async")
    allocate_async: Callable[..., int]
    deallocate_async: Callable[..., Any]
    _hipmr_ref_kind = 2


# the slots' own setters: the refs' __setattr__ refuses every write
_set_resource = resource_ref.__dict__["resource"].__set__
_set_allocate = resource_ref.__dict__["allocate"].__set__
_set_deallocate = resource_ref.__dict__["deallocate"].__set__
_set_allocate_async = async_resource_ref.__dict__["allocate_async"].__set__
_set_deallocate_async = async_resource_ref.__dict__["deallocate_async"].__set__


def _from_ref(self: resource_ref, cls: Type[resource_ref], want: int,
              source: resource_ref) -> None:
    """Fill the ref ``self`` (of class ``cls``, kind ``want``) from the ref ``source``."""
    if type(source)._hipmr_ref_kind < want:
        raise TypeError(f"cannot build {cls.__name__} from the synchronous "
                        f"{type(source).__name__}: it has no allocate_async")
    missing = cls.properties - type(source).properties
    if missing:
        raise TypeError(f"cannot build {cls.__name__} from {type(source).__name__}: "
                        f"it lacks {property_names(missing)} (build from ref.resource to "
                        "check the resource itself)")
    _set_resource(self, source.resource)
    _set_allocate(self, source.allocate)
    _set_deallocate(self, source.deallocate)
    if want == 2:
        _set_allocate_async(self, source.allocate_async)  # type: ignore[attr-defined]
        _set_deallocate_async(self, source.deallocate_async)  # type: ignore[attr-defined]


_specialize = specializer((resource_ref, async_resource_ref), __name__)


def _rebuild(is_async: bool, props: Tuple[Type[Property], ...], resource: Any) -> resource_ref:
    return (async_resource_ref if is_async else resource_ref)[props](resource)


def try_get_property(obj: Any, prop: Type[Property]) -> Any:
    """Query a property of the resource behind a ref, even one the ref's type does not list.

    Stateless ``prop``: ``True`` or ``False``.  Stateful: the current value, or ``None`` when
    the resource does not have it.  ``obj`` may also be a resource itself.
    """
    _check_property(prop)
    res = obj.resource if isinstance(obj, resource_ref) else obj
    has = prop in _declared(res)
    if not hasattr(prop, "value_type"):
        return has
    return _get_property(res, prop) if has else None


def resource_cast(cls: Type[T], obj: Any) -> Optional[T]:
    """The resource behind the ref ``obj`` (or ``obj`` itself) if its type is exactly ``cls``,
    else ``None``."""
    if not isinstance(cls, type):
        raise TypeError(f"resource_cast needs a class, not {cls!r}")
    res = obj.resource if isinstance(obj, resource_ref) else obj
    return res if type(res) is cls else None


def upstream_chain(resource: Any, what: str = "upstream_chain") -> Iterator[Any]:
    """``resource``, then each resource below it through ``upstream_resource()``, refs looked
    through to the resource they name, until one has no callable ``upstream_resource`` or its
    call raises.  No depth limit: a stack is as deep as its user made it.  A resource that
    comes round again (a cycle through any number of adaptors, found by identity) raises
    ValueError naming ``what``, never a silent wrong answer."""
    seen: Dict[int, Any] = {}   # id -> the object, kept alive so that no id is reused
    depth = 0
    while True:
        if isinstance(resource, resource_ref):
            resource = resource.resource
        if id(resource) in seen:
            raise ValueError(f"{what}: the resource stack has a cycle: "
                             f"{type(resource).__name__} is reached again after {depth} "
                             "upstream_resource() steps")
        seen[id(resource)] = resource
        yield resource
        upstream = getattr(resource, "upstream_resource", None)
        if not callable(upstream):
            return
        try:
            resource = upstream()
        except Exception:  # noqa: BLE001 - a user object's method: the stack ends here
            return
        depth += 1

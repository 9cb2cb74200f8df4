"""The resource concepts (libhipcxx ``cuda::mr::resource`` / ``async_resource``) as predicates.

A *resource* is an instance whose ``allocate(bytes, alignment)`` and
``deallocate(ptr, bytes, alignment)`` can be called with those positional arguments and whose
``==`` is usable (a class that sets ``__eq__ = None`` is not a resource).  An *async resource*
is a resource that also has ``allocate_async(bytes, alignment, stream)`` and
``deallocate_async(ptr, bytes, alignment, stream)``.  Classes themselves are never resources.

What depends only on the class (the methods and their signatures) is computed once per class
with :mod:`inspect` and cached; a class that is changed after its first check keeps the cached
answer.  Properties are checked on every call, per object, because a
:class:`~hipmr_ctypes.properties.forward_property` adaptor's properties follow its upstream.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Protocol, Tuple, Type

from .properties import DEFAULT_ALIGNMENT, Property, _check_property, _declared

if TYPE_CHECKING:
    from .stream_ref import stream_ref

__all__ = ["is_resource", "is_async_resource", "is_resource_with", "is_async_resource_with",
           "Resource", "AsyncResource"]

# method -> (canonical parameter names, whether the last must default to 256)
_METHODS: Tuple[Tuple[str, Tuple[str, ...], bool], ...] = (
    ("allocate", ("bytes", "alignment"), True),
    ("deallocate", ("ptr", "bytes", "alignment"), True),
    ("allocate_async", ("bytes", "alignment", "stream"), False),
    ("deallocate_async", ("ptr", "bytes", "alignment", "stream"), False),
)

# Per method: MISSING = missing or not callable that way, CALLABLE = callable, DEFAULTABLE =
# canonical parameter names but the alignment does not default to 256, CANONICAL = canonical
# names and default: a ref can bind it as it is.
MISSING, CALLABLE, DEFAULTABLE, CANONICAL = 0, 1, 2, 3


class _Info:
    """What the concepts need to know about one class (or one instance, when not cacheable)."""

    __slots__ = ("kind", "methods", "why")

    def __init__(self, kind: int, methods: Tuple[int, ...], why: str) -> None:
        self.kind = kind        # 0 not a resource, 1 resource, 2 async resource
        self.methods = methods  # a status per entry of _METHODS
        self.why = why          # why it is not a (async) resource, for error messages


_CACHE: Dict[type, _Info] = {}
_NOT_A_RESOURCE = _Info(0, (MISSING,) * 4, "a class is not a resource (pass an instance)")


def _is_static(cls: type, obj: Any, name: str) -> bool:
    """True when ``obj.<name>`` is the same kind of callable for every instance of ``cls``."""
    import types
    if name in getattr(obj, "__dict__", ()) or getattr(cls, "__getattr__", None) is not None:
        return False
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return isinstance(klass.__dict__[name],
                              (types.FunctionType, staticmethod, classmethod,
                               types.BuiltinFunctionType, types.MethodDescriptorType))
    return True  # missing on the class: missing for every instance unless in __dict__


def _method_status(obj: Any, name: str, params: Tuple[str, ...], wants_default: bool) -> int:
    fn = getattr(obj, name, None)
    if fn is None or not callable(fn):
        return MISSING
    import inspect
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature available (some builtins): trust it
        return CALLABLE
    try:
        sig.bind(*([0] * len(params)))
    except TypeError:
        return MISSING
    plist = list(sig.parameters.values())[:len(params)]
    if [p.name for p in plist] != list(params):
        return CALLABLE
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in plist):
        return CALLABLE
    default = plist[-1].default
    if wants_default and not (type(default) is int and default == DEFAULT_ALIGNMENT):
        return DEFAULTABLE
    return CANONICAL


def _classify(obj: Any) -> _Info:
    cls = type(obj)
    if isinstance(obj, type):
        _CACHE[cls] = _NOT_A_RESOURCE
        return _NOT_A_RESOURCE
    marker = getattr(cls, "_hipmr_ref_kind", None)
    if marker is not None:  # resource_ref classes: bound methods live in slots
        info = _Info(marker, (CANONICAL,) * (2 * marker) + (MISSING,) * (4 - 2 * marker),
                     "" if marker == 2 else
                     f"{cls.__name__} is a synchronous ref: it has no allocate_async")
        _CACHE[cls] = info
        return info
    statuses = tuple(_method_status(obj, n, p, d) for n, p, d in _METHODS)
    missing = [i for i, status in enumerate(statuses) if status == MISSING]
    if getattr(cls, "__eq__", None) is None or getattr(cls, "__ne__", None) is None:
        kind, first = 0, None
        why = f"{cls.__name__} does not support == (its __eq__ or __ne__ is None)"
    else:
        kind = 0 if (0 in missing or 1 in missing) else 1 if missing else 2
        first = missing[0] if missing else None
        why = ""
    if first is not None:
        name, params, _ = _METHODS[first]
        why = (f"{cls.__name__}.{name} is missing or cannot be called as "
               f"{name}({', '.join(params)})")
    info = _Info(kind, statuses, why)
    if all(_is_static(cls, obj, n) for n, _, _ in _METHODS):
        _CACHE[cls] = info
    return info


def _info(obj: Any) -> _Info:
    """The cached (or, for instance-defined methods, freshly computed) facts about ``obj``."""
    info = _CACHE.get(type(obj))
    return info if info is not None else _classify(obj)


def is_resource(obj: Any) -> bool:
    """True when ``obj`` is an instance with usable ``allocate``, ``deallocate`` and ``==``."""
    info = _CACHE.get(type(obj))
    if info is None:
        info = _classify(obj)
    return info.kind >= 1


def is_async_resource(obj: Any) -> bool:
    """True when ``obj`` is a resource that also has ``allocate_async`` / ``deallocate_async``."""
    info = _CACHE.get(type(obj))
    if info is None:
        info = _classify(obj)
    return info.kind == 2


def _has_all(obj: Any, props: Tuple[Type[Property], ...]) -> bool:
    for prop in props:
        _check_property(prop)
    declared = _declared(obj)
    return all(prop in declared for prop in props)


def is_resource_with(obj: Any, *props: Type[Property]) -> bool:
    """True when ``obj`` is a resource and declares every property in ``props``."""
    return _has_all(obj, props) and is_resource(obj)


def is_async_resource_with(obj: Any, *props: Type[Property]) -> bool:
    """True when ``obj`` is an async resource and declares every property in ``props``."""
    return _has_all(obj, props) and is_async_resource(obj)


def _why_not(obj: Any, want_async: bool) -> Optional[str]:
    """Why ``obj`` is not a (async) resource, or None when it is one."""
    info = _info(obj)
    if info.kind >= (2 if want_async else 1):
        return None
    return info.why or f"{type(obj).__name__} is not a resource"


class Resource(Protocol):
    """For type checkers: what :func:`is_resource` checks at run time."""

    def allocate(self, bytes: int, alignment: int) -> int:
        """Allocate ``bytes`` bytes aligned to ``alignment``; return the pointer as an int."""
        ...

    def deallocate(self, ptr: int, bytes: int, alignment: int) -> None:
        """Free ``ptr``, obtained from ``allocate(bytes, alignment)``."""
        ...

    def __eq__(self, other: object) -> bool:
        ...


class AsyncResource(Resource, Protocol):
    """For type checkers: what :func:`is_async_resource` checks at run time."""

    def allocate_async(self, bytes: int, alignment: int, stream: "stream_ref") -> int:
        """Allocate in stream order on ``stream``; return the pointer as an int."""
        ...

    def deallocate_async(self, ptr: int, bytes: int, alignment: int,
                         stream: "stream_ref") -> None:
        """Free ``ptr`` in stream order on ``stream``."""
        ...

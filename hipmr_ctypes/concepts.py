"""The resource concepts (libhipcxx ``cuda::mr::resource`` / ``async_resource``) as predicates.

A *resource* is an instance whose ``allocate(bytes, alignment)`` and
``deallocate(ptr, bytes, alignment)`` can be called with those positional arguments and whose
``==`` is usable (a class that sets ``__eq__ = None`` is not a resource).  An *async resource*
is a resource that also has ``allocate_async(bytes, alignment, stream)`` and
``deallocate_async(ptr, bytes, alignment, stream)``.  Classes themselves are never resources.

The answer is computed with :mod:`inspect` once per *shape* and cached: the class (its methods,
``__eq__``, ``__ne__`` and ``__getattr__`` as found through the MRO, compared on every check, so
that a class changed after its first check is checked again) and, for an instance that keeps
methods of its own in ``__dict__``, their code, defaults and kind.  The package's adaptors,
whose hot paths are closures made per instance with the signatures their class declares, are
one shape per class and per ``_async`` (their classes are not re-read on each check).  Objects whose methods nothing short of inspection can
judge (callable objects stored on the instance, descriptors computing per-instance values, a
class ``__getattr__``) are inspected on every check.  Properties are checked on every call,
per object, because a :class:`~hipmr_ctypes.properties.forward_property` adaptor's properties
follow its upstream.
"""
from __future__ import annotations

from types import FunctionType as _FunctionType, MethodType as _MethodType
from typing import Any, Dict, Optional, Protocol, Tuple, Type

from .properties import DEFAULT_ALIGNMENT, Property, _check_property, _declared

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
    """What the concepts know about the objects of one shape."""

    __slots__ = ("kind", "methods", "why", "ref", "bind")

    def __init__(self, kind: int, methods: Tuple[int, ...], why: str, ref: bool = False) -> None:
        self.kind = kind        # 0 not a resource, 1 resource, 2 async resource
        self.methods = methods  # a status per entry of _METHODS
        self.why = why          # why it is not a (async) resource, for error messages
        self.ref = ref          # the class is a resource_ref class (marked _hipmr_ref_kind)
        bind = 0                # how many methods, from the first, a ref binds as they are
        while bind < len(methods) and methods[bind] == CANONICAL:
            bind += 1
        self.bind = bind


_NOT_A_RESOURCE = _Info(0, (MISSING,) * 4, "a class is not a resource (pass an instance)")
_NAMES = tuple(name for name, _, _ in _METHODS)
#: the class attributes that decide the answer, read through the MRO on every check: a class
#: changed after its first check is checked again
_DECIDING = _NAMES + ("__eq__", "__ne__", "__getattr__")
_ABSENT = object()
_MAX_SHAPES = 64  # instance shapes remembered per class (then checked every time)


class _Entry:
    """The cache of one class: its deciding attributes when it was examined, and the answer
    per instance shape (``fixed``: one answer for every instance, whatever its shape)."""

    __slots__ = ("attrs", "fixed", "cacheable", "bound", "shapes")

    def __init__(self, attrs: Tuple[Any, ...], fixed: Optional[_Info], cacheable: bool,
                 bound: bool) -> None:
        self.attrs = attrs
        self.fixed = fixed
        self.cacheable = cacheable
        self.bound = bound
        self.shapes: Dict[Any, _Info] = {}


_CACHE: Dict[type, _Entry] = {}


def _class_attrs(cls: type) -> Tuple[Any, ...]:
    return tuple([getattr(cls, name, None) for name in _DECIDING])


def _static_kind(cls: type, name: str) -> bool:
    """True when the class attribute ``name`` (found through the MRO) gives the same callable
    to every instance: a plain function, static or class method, builtin; or nothing."""
    import types
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return isinstance(klass.__dict__[name],
                              (types.FunctionType, staticmethod, classmethod,
                               types.BuiltinFunctionType, types.MethodDescriptorType,
                               types.WrapperDescriptorType))
    return True


def _new_entry(cls: type) -> _Entry:
    attrs = _class_attrs(cls)
    reason = getattr(cls, "_hipmr_not_a_resource", None)
    if issubclass(cls, type):
        entry = _Entry(attrs, _NOT_A_RESOURCE, True, False)
    elif isinstance(reason, str):  # the CCCL 3.x wrappers: allocate takes the stream first
        entry = _Entry(attrs, _Info(0, (MISSING,) * 4, reason.format(name=cls.__name__)),
                       True, False)
    else:
        marker = cls.__dict__.get("_hipmr_ref_kind") or getattr(cls, "_hipmr_ref_kind", None)
        if marker is not None:  # resource_ref classes: bound methods live in slots
            entry = _Entry(attrs, _Info(
                marker, (CANONICAL,) * (2 * marker) + (MISSING,) * (4 - 2 * marker),
                "" if marker == 2 else
                f"{cls.__name__} is a synchronous ref: it has no allocate_async", True),
                True, False)
        else:
            # an adaptor of the package: its per-instance closures have the signatures the
            # class declares, and the async pair exists exactly when instance._async
            bound = getattr(cls, "_bound_methods", False) is True
            cacheable = attrs[-1] is None and (
                bound or all(_static_kind(cls, name) for name in _NAMES))
            entry = _Entry(attrs, None, cacheable, bound)
    _CACHE[cls] = entry
    return entry


def _decider(value: Any) -> Any:
    """What decides how ``value`` (an instance attribute) can be called, as a hashable key, or
    None when nothing short of inspecting it says."""
    import types
    kind = type(value)
    if kind is types.MethodType:
        func = value.__func__
        inner = _decider(func) if type(func) is types.FunctionType else None
        return None if inner is None else ("method", inner)
    if kind is types.FunctionType:
        if value.__dict__:  # __wrapped__, __signature__, ...: inspect may read them
            return None
        kw = value.__kwdefaults__
        try:
            key = (value.__code__, value.__defaults__,
                   None if kw is None else tuple(sorted(kw.items())))
            hash(key)
        except TypeError:  # an unhashable default
            return None
        return key
    if kind is types.BuiltinFunctionType or not callable(value):
        return ("value", kind, value if kind is types.BuiltinFunctionType else None)
    return None


def _shape(obj: Any, entry: _Entry) -> Any:
    """The instance's part of the answer: ``_async`` for the package's adaptors; otherwise what
    its ``__dict__`` holds under the four method names (None: not cacheable)."""
    if entry.bound:
        return getattr(obj, "_async", False) is True
    d = getattr(obj, "__dict__", None)
    if not d:
        return ()
    parts = []
    for name in _NAMES:
        value = d.get(name, _ABSENT)
        if value is not _ABSENT:
            key = _decider(value)
            if key is None:
                return None
            parts.append((name, key))
    return tuple(parts)


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
_NO_DEFAULT = object()


def _plain_status(fn: Any, params: Tuple[str, ...], wants_default: bool) -> Optional[int]:
    """:func:`_method_status` read from the code object of a plain function or a method bound
    to one (what ``inspect.signature`` reads for them), so that the common case imports no
    :mod:`inspect`; None for anything else (wrapped, with ``__signature__``, a builtin, a
    callable object, a method whose function takes no positional parameter)."""
    func, bound = fn, False
    if type(fn) is _MethodType:
        func, bound = fn.__func__, True
    if type(func) is not _FunctionType or "__wrapped__" in func.__dict__ \
            or "__signature__" in func.__dict__:
        return None
    code = func.__code__
    count, posonly = code.co_argcount, code.co_posonlyargcount
    names = code.co_varnames[:count]
    defaults = func.__defaults__ or ()
    dflt = [_NO_DEFAULT] * (count - len(defaults)) + list(defaults)
    if bound:
        if not count:
            return None
        names, dflt, posonly = names[1:], dflt[1:], max(posonly - 1, 0)
    n = len(params)
    kwonly = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    kwdefaults = func.__kwdefaults__ or {}
    if (len(names) < n and not code.co_flags & _CO_VARARGS) \
            or any(d is _NO_DEFAULT for d in dflt[n:]) \
            or any(k not in kwdefaults for k in kwonly):
        return MISSING                   # cannot be called with n positional arguments
    if len(names) < n or tuple(names[:n]) != params:
        return CALLABLE                  # (*args or other names among the first n)
    if posonly:                          # a positional-only parameter among the first n
        return CALLABLE
    default = dflt[n - 1]
    if wants_default and not (type(default) is int and default == DEFAULT_ALIGNMENT):
        return DEFAULTABLE
    return CANONICAL


def _method_status(obj: Any, name: str, params: Tuple[str, ...], wants_default: bool) -> int:
    fn = getattr(obj, name, None)
    if fn is None or not callable(fn):
        return MISSING
    plain = _plain_status(fn, params, wants_default)
    if plain is not None:
        return plain
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
    """Inspect ``obj``'s methods (no cache)."""
    cls = type(obj)
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
    return _Info(kind, statuses, why)


def _info(obj: Any) -> _Info:
    """The facts about ``obj``: cached per class and instance shape, checked afresh when the
    class changed or the instance holds methods nothing short of inspection can judge."""
    cls = type(obj)
    entry = _CACHE.get(cls)
    if entry is None or (entry.fixed is None and not entry.bound
                         and entry.attrs != _class_attrs(cls)):
        entry = _new_entry(cls)
    info = entry.fixed
    if info is not None:
        return info
    if not entry.cacheable:
        return _classify(obj)
    if entry.bound:  # the package's adaptors: one shape per class and _async (see _shape)
        shape: Any = getattr(obj, "_async", False) is True
    else:
        shape = _shape(obj, entry)
        if shape is None:
            return _classify(obj)
    shapes = entry.shapes
    info = shapes.get(shape)
    if info is None:
        info = _classify(obj)
        if len(shapes) < _MAX_SHAPES:
            shapes[shape] = info
    return info


def is_resource(obj: Any) -> bool:
    """True when ``obj`` is an instance with usable ``allocate``, ``deallocate`` and ``==``."""
    return _info(obj).kind >= 1


def is_async_resource(obj: Any) -> bool:
    """True when ``obj`` is a resource that also has ``allocate_async`` / ``deallocate_async``."""
    return _info(obj).kind == 2


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

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """Allocate in stream order on ``stream`` (a ``stream_ref``, or anything it accepts);
        return the pointer as an int."""
        ...

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Free ``ptr`` in stream order on ``stream``."""
        ...

"""Properties: tags that say what a resource's memory is (libhipcxx ``cuda::get_property``).

A property is a subclass of :class:`Property`.  It is *stateful* when it has a ``value_type``
class attribute and *stateless* (a plain tag) otherwise.  Any object declares the properties it
has with an attribute ``properties``, a tuple of property classes; the value of a stateful
property comes from the object's method ``get_property(self, P)``::

    class memory_kind(Property):
        value_type = int

    class MyResource:
        properties = (device_accessible, memory_kind)
        def get_property(self, prop):
            return 42

    get_property(MyResource(), device_accessible)   # None
    get_property(MyResource(), memory_kind)         # 42, read on every call

A subclass inherits ``properties`` like any class attribute; to add one write
``properties = Base.properties + (extra,)``.  Imports nothing but the standard library.

Type checkers see ``get_property(r, memory_kind)`` as ``int`` (the class ``value_type`` names):
its overloads match a property class against the protocol ``_Stateful`` (instances with a
``value_type`` attribute), which exists only for type checkers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Collection, Tuple, Type, overload

if TYPE_CHECKING:
    from typing import Protocol, TypeVar, Union

    _V = TypeVar("_V", covariant=True)

    class _Stateful(Protocol[_V]):
        """What a type checker sees of a stateful property class: a ``value_type`` attribute,
        the class of the values ``get_property`` returns."""

        @property
        def value_type(self) -> Type[_V]: ...

    #: the library's stateless properties, whose get_property value is None
    _Tag = Union[Type["device_accessible"], Type["host_accessible"]]

__all__ = ["DEFAULT_ALIGNMENT", "Property", "device_accessible", "host_accessible",
           "get_property", "has_property", "has_property_with", "property_with_value",
           "forward_property"]

_COLLECTIONS = (tuple, frozenset, list, set)
_NO_VALUE = object()

#: The alignment every allocate / deallocate uses when the caller gives none (hipMalloc's).
DEFAULT_ALIGNMENT: int = 256


class Property:
    """Base class of every property; a subclass with a ``value_type`` attribute is stateful.

    Properties are used as classes, never instantiated: ``get_property(r, device_accessible)``.
    """

    __slots__ = ()


class device_accessible(Property):
    """Stateless: the memory can be accessed by device (GPU) code."""

    __slots__ = ()


class host_accessible(Property):
    """Stateless: the memory can be accessed by host (CPU) code."""

    __slots__ = ()


def _check_property(prop: Any) -> None:
    """Raise TypeError unless ``prop`` is a property class (a proper subclass of Property)."""
    if not (isinstance(prop, type) and issubclass(prop, Property)) or prop is Property:
        raise TypeError(f"{prop!r} is not a property class (a subclass of "
                        "hipmr_ctypes.Property)")


def _declared(obj: Any) -> Collection[Type[Property]]:
    """The property classes ``obj`` declares (its ``properties`` attribute, () when absent)."""
    props = getattr(obj, "properties", ())
    if isinstance(props, _COLLECTIONS):
        return props
    if isinstance(obj, type):  # a class whose ``properties`` is a descriptor
        return ()
    raise TypeError(f"{type(obj).__name__}.properties must be a tuple of property classes, "
                    f"not {type(props).__name__}")


def property_with_value(prop: Type[Property]) -> bool:
    """True when ``prop`` is stateful, i.e. has a ``value_type`` attribute."""
    _check_property(prop)
    return hasattr(prop, "value_type")


def has_property(obj: Any, prop: Type[Property]) -> bool:
    """True when ``obj`` (any object, not only a resource) declares ``prop``."""
    _check_property(prop)
    return prop in _declared(obj)


def has_property_with(obj: Any, prop: Type[Property], value_type: Any) -> bool:
    """True when ``prop`` is stateful, ``obj`` declares it and ``prop.value_type is value_type``.
    """
    _check_property(prop)
    return (getattr(prop, "value_type", _NO_VALUE) is value_type
            and prop in _declared(obj))


@overload
def get_property(obj: object, prop: Type[_Stateful[_V]]) -> _V: ...
@overload
def get_property(obj: object, prop: _Tag) -> None: ...
@overload
def get_property(obj: object, prop: Type[Property]) -> Any: ...
def get_property(obj: Any, prop: Any) -> Any:
    """The value of ``prop`` on ``obj``: ``None`` for a stateless property, the current value
    (``obj.get_property(prop)``, read on every call) for a stateful one.

    Raises ``TypeError`` when ``obj`` does not declare ``prop``.  For a :class:`forward_property`
    adaptor, a stateful property it does not answer itself is read from its upstream.

    Typed by the property: a class with ``value_type = int`` gives ``int``; the library's
    stateless ``device_accessible`` / ``host_accessible`` give ``None``; any other property
    class (a user's stateless tag, or one known only as ``Type[Property]``) gives ``Any``.
    """
    _check_property(prop)
    if prop not in _declared(obj):
        raise TypeError(f"{type(obj).__name__} does not have the property {prop.__name__}")
    if not hasattr(prop, "value_type"):
        return None
    if isinstance(obj, forward_property) and prop not in obj.own_properties:
        return get_property(obj.upstream_resource(), prop)
    if isinstance(obj, type):
        raise TypeError(f"the stateful property {prop.__name__} needs an instance of "
                        f"{obj.__name__}, not the class")
    getter = getattr(obj, "get_property", None)
    if getter is None:
        raise TypeError(f"{type(obj).__name__} declares the stateful property {prop.__name__} "
                        "but has no get_property(self, prop) method")
    return getter(prop)


class _ForwardedProperties:
    """The ``properties`` of a forward_property adaptor: its own, then its upstream's."""

    def __get__(self, obj: Any, cls: Any = None) -> Tuple[Type[Property], ...]:
        if obj is None:
            props: Tuple[Type[Property], ...] = cls.own_properties
            return props
        own: Tuple[Type[Property], ...] = obj.own_properties
        upstream = _declared(obj.upstream_resource())
        if not own:  # most adaptors: the upstream's, as they are (the common, cheap case)
            return upstream if type(upstream) is tuple else tuple(upstream)
        if not upstream:
            return own
        return own + tuple(p for p in upstream if p not in own)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError("the properties of a forward_property adaptor are computed from "
                             "own_properties and its upstream's")


_FORWARDED = _ForwardedProperties()


class forward_property:
    """Mixin for an adaptor with an ``upstream_resource()`` method: the adaptor has every
    property of its upstream (stateless ones, and stateful ones answered by the upstream) in
    addition to its own.

    Declare the adaptor's own properties as usual with ``properties = (...)`` in the class body
    (they are kept as ``own_properties``); ``instance.properties`` is then own + upstream's,
    computed on each access.  A stateful property listed as the adaptor's own is answered by the
    adaptor's ``get_property(self, P)`` method and overrides the upstream's; the function
    :func:`get_property` sends every other stateful property to the upstream, which may itself
    be a ``resource_ref`` or another adaptor.
    """

    __slots__ = ()
    own_properties: Tuple[Type[Property], ...] = ()
    if TYPE_CHECKING:  # what reading it gives; subclasses assign tuples
        properties: Tuple[Type[Property], ...]
    else:
        properties = _FORWARDED
    #: the adaptor's upstream resource (or ref), whose properties it forwards
    upstream_resource: Callable[[], Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: Any = _FORWARDED
        for klass in cls.__mro__:
            if "properties" in klass.__dict__:
                found = klass.__dict__["properties"]
                break
        if found is _FORWARDED:
            return
        if not isinstance(found, (tuple, list)):
            raise TypeError(f"{cls.__name__}.properties must be a tuple of property classes")
        for prop in found:
            _check_property(prop)
        cls.own_properties = tuple(dict.fromkeys(found))
        setattr(cls, "properties", _FORWARDED)  # the descriptor (typed as the tuple it gives)

    def get_property(self, prop: Type[Property]) -> Any:
        """The upstream's value of the stateful property ``prop``."""
        return get_property(self.upstream_resource(), prop)

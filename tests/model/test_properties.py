"""Properties: ports of upstream get_property/{has_property,get_property,forward_property}
(libhipcxx's own property tests) plus the Python-specific rules (bad property classes, instances
versus classes, forwarding through adaptors)."""
import pytest

from hipmr_ctypes.properties import (DEFAULT_ALIGNMENT, Property, device_accessible,
                                     forward_property, get_property, has_property,
                                     has_property_with, host_accessible, property_with_value)
from hipmr_ctypes.resource_refs import resource_ref


class prop_with_value(Property):
    value_type = int


class prop(Property):
    pass


class other_prop_with_value(Property):
    value_type = float


class valid_property:
    """Not a resource: only a stateless property (upstream ``valid_property``)."""
    properties = (prop,)


class valid_property_with_value:
    """Not a resource: a stateful property answering 42."""
    properties = (prop_with_value,)

    def get_property(self, p):
        return 42


class derived_from_property(valid_property):
    """Inherits ``prop`` without redeclaring it."""


class derived_adding_stateful(valid_property):
    properties = valid_property.properties + (prop_with_value,)

    def get_property(self, p):
        return 42


class no_properties:
    pass


# 1. property_with_value
def test_property_with_value_iff_value_type():
    assert property_with_value(prop_with_value)
    assert not property_with_value(prop)
    assert not property_with_value(device_accessible)
    assert not property_with_value(host_accessible)


def test_value_type_is_inherited_by_subclasses_of_a_property():
    class sub(prop_with_value):
        pass
    assert property_with_value(sub)


# 2. has_property on any type, not only resources
def test_has_property_on_non_resources():
    assert has_property(valid_property(), prop)
    assert not has_property(valid_property(), prop_with_value)
    assert has_property(valid_property_with_value(), prop_with_value)
    assert not has_property(valid_property_with_value(), prop)
    assert not has_property(no_properties(), prop)
    assert not has_property(42, prop)


def test_has_property_works_on_classes_too():
    assert has_property(valid_property, prop)
    assert not has_property(no_properties, prop)


# 3. has_property_with
def test_has_property_with_truth_table():
    assert has_property_with(valid_property_with_value(), prop_with_value, int)
    assert not has_property_with(valid_property_with_value(), prop_with_value, float)
    assert not has_property_with(valid_property_with_value(), prop_with_value, bool)
    assert not has_property_with(valid_property(), prop, int)          # stateless
    assert not has_property_with(valid_property(), prop_with_value, int)  # undeclared
    assert not has_property_with(valid_property_with_value(), other_prop_with_value, float)


# 4. inheritance
def test_derived_class_inherits_properties():
    assert has_property(derived_from_property(), prop)
    assert get_property(derived_from_property(), prop) is None


def test_derived_class_adding_stateful_keeps_the_stateless_one():
    d = derived_adding_stateful()
    assert has_property(d, prop)
    assert has_property_with(d, prop_with_value, int)
    assert get_property(d, prop_with_value) == 42
    assert not has_property(valid_property(), prop_with_value)


# 5. get_property
def test_get_property_values():
    assert get_property(valid_property_with_value(), prop_with_value) == 42
    assert get_property(valid_property(), prop) is None


def test_get_property_undeclared_raises_naming_type_and_property():
    with pytest.raises(TypeError, match=r"valid_property\b.*prop_with_value"):
        get_property(valid_property(), prop_with_value)
    with pytest.raises(TypeError, match="no_properties.*device_accessible"):
        get_property(no_properties(), device_accessible)


def test_get_property_reads_live_value_each_call():
    class counter:
        properties = (prop_with_value,)

        def __init__(self):
            self.n = 0

        def get_property(self, p):
            self.n += 1
            return self.n
    c = counter()
    assert [get_property(c, prop_with_value) for _ in range(3)] == [1, 2, 3]


def test_stateful_without_getter_is_a_type_error():
    class broken:
        properties = (prop_with_value,)
    with pytest.raises(TypeError, match="get_property"):
        get_property(broken(), prop_with_value)


@pytest.mark.parametrize("bad", [None, 42, "prop", object, Property, prop(), int])
def test_non_property_arguments_raise(bad):
    for fn in (lambda: get_property(valid_property(), bad),
               lambda: has_property(valid_property(), bad),
               lambda: has_property_with(valid_property(), bad, int),
               lambda: property_with_value(bad)):
        with pytest.raises(TypeError):
            fn()


def test_malformed_properties_attribute_raises():
    class single:
        properties = prop  # not a tuple
    with pytest.raises(TypeError, match="tuple"):
        has_property(single(), prop)


def test_builtin_properties_are_stateless_property_classes():
    for p in (device_accessible, host_accessible):
        assert issubclass(p, Property)
        assert not property_with_value(p)
    assert DEFAULT_ALIGNMENT == 256


# 6. forward_property
class upstream_with_valueless_property:
    properties = (prop,)


class upstream_with_stateful_property:
    properties = (prop_with_value,)

    def __init__(self, value=42):
        self.value = value

    def get_property(self, p):
        return self.value


class upstream_with_both:
    properties = (prop, prop_with_value)

    def get_property(self, p):
        return 42


class derived_plain(forward_property):
    def __init__(self, upstream):
        self.upstream = upstream

    def upstream_resource(self):
        return self.upstream


class derived_override(forward_property):
    properties = (prop_with_value,)

    def __init__(self, upstream):
        self.upstream = upstream

    def upstream_resource(self):
        return self.upstream

    def get_property(self, p):
        assert p is prop_with_value  # only its own properties reach it
        return 1337


def test_forward_stateless():
    d = derived_plain(upstream_with_valueless_property())
    assert has_property(d, prop)
    assert get_property(d, prop) is None
    assert not has_property(d, prop_with_value)


def test_forward_stateful_answered_by_upstream_live():
    up = upstream_with_stateful_property()
    d = derived_plain(up)
    assert has_property_with(d, prop_with_value, int)
    assert get_property(d, prop_with_value) == 42
    up.value = 7
    assert get_property(d, prop_with_value) == 7
    assert d.get_property(prop_with_value) == 7


def test_forward_both():
    d = derived_plain(upstream_with_both())
    assert has_property(d, prop) and has_property(d, prop_with_value)
    assert get_property(d, prop_with_value) == 42


def test_derived_override_wins_and_other_properties_still_forward():
    d = derived_override(upstream_with_both())
    assert get_property(d, prop_with_value) == 1337
    assert get_property(d, prop) is None
    assert d.properties.count(prop_with_value) == 1


def test_own_properties_add_to_the_upstream_ones():
    class adaptor(derived_plain):
        properties = (host_accessible,)
    d = adaptor(upstream_with_stateful_property())
    assert set(d.properties) == {host_accessible, prop_with_value}
    assert adaptor.own_properties == (host_accessible,)
    assert adaptor.properties == (host_accessible,)  # class level: own only
    assert get_property(d, prop_with_value) == 42


def test_subclass_extends_own_properties_pythonically():
    class more(derived_override):
        properties = derived_override.properties + (device_accessible,)
    d = more(upstream_with_valueless_property())
    assert set(d.properties) == {prop_with_value, device_accessible, prop}
    assert get_property(d, prop_with_value) == 1337


def test_forwarded_properties_follow_the_upstream():
    d = derived_plain(upstream_with_valueless_property())
    assert not has_property(d, prop_with_value)
    d.upstream = upstream_with_stateful_property()
    assert has_property(d, prop_with_value)
    assert not has_property(d, prop)


def test_forward_through_a_chain_of_adaptors():
    d = derived_plain(derived_plain(upstream_with_stateful_property(5)))
    assert get_property(d, prop_with_value) == 5


class counting_resource:
    properties = (device_accessible, prop_with_value)

    def __init__(self):
        self.value = 42

    def allocate(self, bytes, alignment=256):
        return 0

    def deallocate(self, ptr, bytes, alignment=256):
        pass

    def get_property(self, p):
        return self.value


def test_forward_from_a_resource_ref_upstream():
    """Upstream's ``__has_upstream_resource`` returning a ref (by value) works."""
    res = counting_resource()
    ref = resource_ref[prop_with_value](res)
    d = derived_plain(ref)
    assert has_property(d, prop_with_value)
    assert not has_property(d, device_accessible)  # the ref hides it
    res.value = 9
    assert get_property(d, prop_with_value) == 9


def test_forward_property_properties_are_read_only():
    d = derived_plain(upstream_with_valueless_property())
    with pytest.raises(AttributeError):
        d.properties = (prop,)


def test_forward_property_rejects_non_property_own():
    with pytest.raises(TypeError):
        class bad(forward_property):
            properties = (int,)


def test_forward_property_adaptor_with_slots():
    class slotted(forward_property):
        __slots__ = ("up",)
        properties = (host_accessible,)

        def __init__(self, up):
            self.up = up

        def upstream_resource(self):
            return self.up
    s = slotted(upstream_with_stateful_property())
    assert not hasattr(s, "__dict__")
    assert set(s.properties) == {host_accessible, prop_with_value}
    assert get_property(s, prop_with_value) == 42


def test_forward_property_without_own_properties_is_its_upstreams_as_a_tuple():
    """Without properties of its own an adaptor has exactly its upstream's, in their order, as
    a tuple (whatever collection the upstream declares), following the upstream live."""
    class listing:
        properties = [prop, prop_with_value]
    up = listing()
    d = derived_plain(up)
    assert d.properties == (prop, prop_with_value) and type(d.properties) is tuple
    up.properties = [prop_with_value]
    assert d.properties == (prop_with_value,)
    d = derived_plain(upstream_with_both())
    assert d.properties == (prop, prop_with_value)
    assert derived_plain(object()).properties == ()
    # a ref upstream (a frozenset of properties) and an adaptor over an adaptor
    res = counting_resource()
    res.properties = (device_accessible, prop_with_value, prop)
    ref = resource_ref[prop_with_value, prop](res)
    assert set(derived_plain(ref).properties) == {prop_with_value, prop}
    assert set(derived_plain(derived_plain(ref)).properties) == {prop_with_value, prop}
    # own properties come first, the upstream's follow without repeats
    assert derived_override(upstream_with_both()).properties == (prop_with_value, prop)

"""The ref machinery both models share (resource_refs): one specializer of ref classes, one
equality, one hash and one listed-property read, used by the 2.2 refs and cccl3's wrappers."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import cccl3 as c3
from hipmr_ctypes import resource_refs
from hipmr_ctypes.resource_refs import (listed_property, property_names, resource_hash,
                                        same_resource, specializer)


class Family:
    __slots__ = ()
    properties = frozenset()


class Other(Family):
    __slots__ = ()


def test_specializer_makes_one_class_per_property_set():
    specialize = specializer((Family, Other), "somewhere")
    a = specialize(Family, (hmr.device_accessible, hmr.host_accessible))
    assert a is specialize(Family, (hmr.host_accessible, hmr.device_accessible,
                                    hmr.host_accessible))
    assert a.__name__ == "Family[device_accessible, host_accessible]" == a.__qualname__
    assert a.__module__ == "somewhere" and a.properties == {hmr.device_accessible,
                                                            hmr.host_accessible}
    assert issubclass(a, Family) and a.__slots__ == ()
    assert specialize(Family, ()) is Family and specialize(Other, hmr.device_accessible) \
        is not specialize(Family, hmr.device_accessible)
    with pytest.raises(TypeError, match="already has its properties; subscript Family or Other"):
        specialize(a, hmr.device_accessible)
    with pytest.raises(TypeError, match="not a property class"):
        specialize(Family, int)


def test_both_models_specialize_with_the_same_code():
    assert c3._specialize.__code__ is resource_refs._specialize.__code__
    assert c3.any_resource[hmr.device_accessible].__module__ == "hipmr_ctypes.cccl3"
    with pytest.raises(TypeError, match="subscript one of resource_ref, synchronous_resource_ref, "
                                        "any_resource, any_synchronous_resource"):
        c3.any_resource[hmr.device_accessible][hmr.host_accessible]
    with pytest.raises(TypeError, match="subscript resource_ref or async_resource_ref"):
        hmr.resource_ref[hmr.device_accessible][hmr.host_accessible]


class Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return isinstance(other, Unhashable)


def test_equality_and_hash_are_the_resources():
    u = Unhashable()
    assert resource_hash(u) == hash(Unhashable) and resource_hash(5) == hash(5)
    assert same_resource(u, Unhashable()) and not same_resource(u, object())
    assert not same_resource(1, 1.0)        # equal, but not the same type
    assert property_names([hmr.host_accessible, hmr.device_accessible]) == \
        "device_accessible, host_accessible"


def test_listed_property_reads_the_resource_only_for_a_stateful_listed_property():
    empty = c3.any_resource[hmr.device_accessible]()
    assert empty.get_property(hmr.device_accessible) is None     # listed, stateless
    with pytest.raises(TypeError, match="does not have the property host_accessible"):
        empty.get_property(hmr.host_accessible)                  # before the empty check
    ref = hmr.resource_ref[hmr.device_accessible](hmr.AsyncMemoryResource())
    assert listed_property(ref, hmr.device_accessible) is None
    with pytest.raises(TypeError, match="does not have the property host_accessible"):
        listed_property(ref, hmr.host_accessible)
    seen = []
    assert listed_property(ref, hmr.device_accessible, seen.append) is None and seen == []

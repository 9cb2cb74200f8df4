"""resource_ref / async_resource_ref: ports of upstream memory_resource.{resource_ref,
async_resource_ref}/*.pass.cpp and the HEAD any_resource / resource_cast tests (reference §5
items 10-26 and 32-35)."""
import copy
import gc
import pickle
import sys
import types
import weakref

import pytest

from hipmr_ctypes.concepts import is_async_resource_with, is_resource, is_resource_with
from hipmr_ctypes.properties import (Property, device_accessible, forward_property,
                                     get_property, has_property, host_accessible)
from hipmr_ctypes.resource_refs import (DEFAULT_ALIGNMENT, async_resource_ref, resource_cast,
                                       resource_ref, try_get_property)
from hipmr_ctypes.stream_refs import stream_ref


class with_short(Property):
    value_type = int


class with_int(Property):
    value_type = int


class with_double(Property):
    value_type = float


class with_size_t(Property):
    value_type = int


class stateless(Property):
    pass


class resource:
    """Upstream's test ``resource<Properties...>``: stateful properties answer ``val``."""

    properties = (with_short, with_int, stateless)
    POINTER = 0x1000

    def __init__(self, val=42):
        self.val = val
        self.calls = []

    def allocate(self, bytes, alignment=256):
        self.calls.append(("allocate", bytes, alignment))
        return self.POINTER + self.val

    def deallocate(self, ptr, bytes, alignment=256):
        self.calls.append(("deallocate", ptr, bytes, alignment))

    def get_property(self, prop):
        return self.val

    def __eq__(self, other):
        if not isinstance(other, resource):
            return NotImplemented
        return self.val == other.val

    __hash__ = None  # mutable state: unhashable, like most resources with ==


class async_resource(resource):
    def allocate_async(self, bytes, alignment, stream):
        self.calls.append(("allocate_async", bytes, alignment, stream))
        return self.POINTER + self.val

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self.calls.append(("deallocate_async", ptr, bytes, alignment, stream))


class hashable_resource:
    def __init__(self, val):
        self.val = val

    def allocate(self, bytes, alignment=256):
        return 0

    def deallocate(self, ptr, bytes, alignment=256):
        pass

    def __eq__(self, other):
        return isinstance(other, hashable_resource) and self.val == other.val

    def __hash__(self):
        return hash(self.val)


REFS = [resource_ref, async_resource_ref]


# class per property set
def test_one_class_per_property_set():
    assert resource_ref[with_int, stateless] is resource_ref[stateless, with_int, with_int]
    assert resource_ref[with_int] is resource_ref[(with_int,)]
    assert resource_ref[()] is resource_ref
    assert async_resource_ref[()] is async_resource_ref
    assert resource_ref[with_int] is not async_resource_ref[with_int]
    assert resource_ref[with_int].properties == frozenset({with_int})
    assert resource_ref.properties == frozenset()
    assert issubclass(resource_ref[with_int], resource_ref)
    assert issubclass(async_resource_ref[with_int], async_resource_ref)


@pytest.mark.parametrize("bad", [int, None, "with_int", Property, with_int()])
def test_subscript_with_non_property_raises(bad):
    with pytest.raises(TypeError):
        resource_ref[bad]
    with pytest.raises(TypeError):
        async_resource_ref[with_int, bad]


def test_subscripting_a_specialized_class_raises():
    with pytest.raises(TypeError):
        resource_ref[with_int][stateless]


# 10. construction from a resource
@pytest.mark.parametrize("ref", REFS)
def test_construct_with_properties_in_any_order(ref):
    r = async_resource()
    for props in [(with_short, with_int), (with_int, with_short), (stateless, with_int, with_short),
                  (with_short,), ()]:
        assert ref[props](r).resource is r


@pytest.mark.parametrize("ref", REFS)
def test_missing_stateful_or_stateless_property_rejected(ref):
    r = async_resource()
    with pytest.raises(TypeError, match="with_double"):
        ref[with_short, with_double](r)
    with pytest.raises(TypeError, match="device_accessible"):
        ref[device_accessible, with_int](r)


@pytest.mark.parametrize("bad", [None, resource, async_resource, 42, "x", object()])
@pytest.mark.parametrize("ref", REFS)
def test_non_resources_rejected(ref, bad):
    with pytest.raises(TypeError):
        ref(bad)


def test_rejection_names_what_is_missing():
    class no_deallocate:
        def allocate(self, bytes, alignment):
            return 0
    with pytest.raises(TypeError, match="deallocate"):
        resource_ref(no_deallocate())
    with pytest.raises(TypeError, match="allocate_async"):
        async_resource_ref(resource())


def test_rejection_messages_of_every_kind_of_source():
    """Each wrong source gets its own message (checked from the cached concept facts)."""
    ARef = async_resource_ref[with_short]
    for bad in (None, resource, ARef):
        with pytest.raises(TypeError, match="needs a resource instance"):
            ARef(bad)
    with pytest.raises(TypeError, match="allocate_async"):
        ARef(resource())
    with pytest.raises(TypeError, match="from the synchronous"):
        ARef(resource_ref[with_short](async_resource()))
    with pytest.raises(TypeError, match=r"it lacks with_double \(build from ref.resource"):
        async_resource_ref[with_double](ARef(async_resource()))
    with pytest.raises(TypeError, match="it lacks the properties with_double, with_size_t"):
        async_resource_ref[with_size_t, with_int, with_double](async_resource())
    # a ref of a ref refers to the same resource and the same methods
    inner = ARef(async_resource())
    outer = async_resource_ref[with_short](inner)
    assert outer.resource is inner.resource
    assert outer.allocate_async == inner.allocate_async
    assert resource_ref(inner).deallocate == inner.deallocate
    assert not hasattr(resource_ref(inner), "allocate_async")


# 11 (no rvalue / const refs) has no Python meaning.

# 12 / 33. copy and assignment
@pytest.mark.parametrize("ref", REFS)
def test_copy_compares_equal_and_shares_the_resource(ref):
    r = async_resource()
    a = ref[with_int](r)
    for b in (copy.copy(a), copy.deepcopy(a), ref[with_int](a)):
        assert b == a
        assert b.resource is r
    assert a != ref[with_int](async_resource(1337))


def test_assign_from_resource_with_property_superset():
    ref = resource_ref[with_int](resource(1))
    ref = resource_ref[with_int](async_resource(2))   # "rebinding": a new ref
    assert get_property(ref, with_int) == 2


def test_refs_are_immutable():
    ref = resource_ref[with_int](resource())
    with pytest.raises(AttributeError):
        ref.resource = resource()
    with pytest.raises(AttributeError):
        ref.allocate = None
    with pytest.raises(AttributeError):
        del ref.deallocate
    assert not hasattr(ref, "__dict__")


def test_pickle_round_trip():
    ref = async_resource_ref[with_int, stateless](hashable_async())
    back = pickle.loads(pickle.dumps(ref))
    assert type(back) is type(ref)
    assert back == ref


class hashable_async(hashable_resource):
    def __init__(self, val=3):
        super().__init__(val)

    properties = (with_int, stateless)

    def get_property(self, prop):
        return self.val

    def allocate_async(self, bytes, alignment, stream):
        return 0

    def deallocate_async(self, ptr, bytes, alignment, stream):
        pass


# 13 / 14. allocate / deallocate forward; default alignment is 256
@pytest.mark.parametrize("ref", REFS)
def test_allocate_and_deallocate_forward_exactly(ref):
    r = async_resource(42)
    sentinel = object()
    r.allocate = lambda bytes, alignment=256: sentinel   # any result comes back as it is
    rf = ref[with_int](r)
    assert rf.allocate(0) is sentinel
    del r.allocate
    rf = ref[with_int](r)
    assert rf.allocate(0, 0) == r.POINTER + 42
    assert rf.deallocate(1337, 0) is None
    assert r.calls[-1] == ("deallocate", 1337, 0, 256)
    rf.deallocate(7, 100, alignment=64)
    assert r.calls[-1] == ("deallocate", 7, 100, 64)
    assert rf.allocate(bytes=5, alignment=8) == r.POINTER + 42
    assert r.calls[-1] == ("allocate", 5, 8)


def test_canonical_resource_methods_are_bound_directly():
    r = async_resource()
    ref = async_resource_ref[with_int](r)
    assert ref.allocate == r.allocate and isinstance(ref.allocate, types.MethodType)
    assert ref.deallocate == r.deallocate
    assert ref.allocate_async == r.allocate_async
    assert ref.deallocate_async == r.deallocate_async


class default_16(resource):
    def allocate(self, bytes, alignment=16):
        self.calls.append(("allocate", bytes, alignment))
        return 16

    def deallocate(self, ptr, bytes, alignment=16):
        self.calls.append(("deallocate", ptr, bytes, alignment))


class no_default(resource):
    def allocate(self, size, align):
        self.calls.append(("allocate", size, align))
        return 1

    def deallocate(self, p, size, align):
        self.calls.append(("deallocate", p, size, align))

    def allocate_async(self, size, align, s):
        self.calls.append(("allocate_async", size, align, s))
        return 2

    def deallocate_async(self, p, size, align, s):
        self.calls.append(("deallocate_async", p, size, align, s))


@pytest.mark.parametrize("cls", [resource, default_16, no_default])
def test_default_alignment_is_256_through_every_ref(cls):
    assert DEFAULT_ALIGNMENT == 256
    r = cls()
    ref = resource_ref[with_int](r)
    ptr = ref.allocate(10)
    assert r.calls[-1] == ("allocate", 10, 256)
    ref.deallocate(ptr, 10)
    assert r.calls[-1] == ("deallocate", ptr, 10, 256)
    ref.allocate(10, 32)
    assert r.calls[-1] == ("allocate", 10, 32)
    ref.deallocate(ptr, 10, alignment=8)
    assert r.calls[-1] == ("deallocate", ptr, 10, 8)


def test_other_default_is_replaced_without_a_wrapper_frame():
    class base(resource):
        def allocate(self, bytes, alignment=16, tag="x", *, flags=0):
            self.calls.append(("allocate", bytes, alignment, tag, flags))
            return 5

    class derived(base):
        def allocate(self, bytes, alignment=8, tag="y", *, flags=1):
            return super().allocate(bytes, alignment, tag, flags=flags) + 1
    r = derived()
    ref = resource_ref(r)
    assert isinstance(ref.allocate, types.MethodType) and ref.allocate.__self__ is r
    assert ref.allocate(3) == 6                          # zero-argument super() still works
    assert r.calls[-1] == ("allocate", 3, 256, "y", 1)
    assert ref.allocate(3, 4, "z", flags=2) == 6
    assert r.calls[-1] == ("allocate", 3, 4, "z", 2)
    assert r.allocate(3) == 6 and r.calls[-1] == ("allocate", 3, 8, "y", 1)  # untouched


def test_decorated_methods_get_the_default_too():
    import functools

    def logged(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            return fn(*args, **kwargs)
        return inner

    class decorated(resource):
        @logged
        def allocate(self, bytes, alignment=16):
            self.calls.append(("allocate", bytes, alignment))
            return 0
    r = decorated()
    resource_ref(r).allocate(1)
    assert r.calls[-1] == ("allocate", 1, 256)


def test_wrapped_methods_offer_the_canonical_keywords():
    r = no_default()
    ref = async_resource_ref[with_int](r)
    s = stream_ref(5)
    assert ref.allocate_async(bytes=8, alignment=64, stream=s) == 2
    assert r.calls[-1] == ("allocate_async", 8, 64, s)
    ref.deallocate_async(2, 8, 64, s)
    assert r.calls[-1] == ("deallocate_async", 2, 8, 64, s)


# 15. async forwarding
def test_async_allocate_and_deallocate_forward():
    r = async_resource(42)
    ref = async_resource_ref[with_int](r)
    s = stream_ref(0x1234)
    assert ref.allocate_async(0, 0, s) == r.POINTER + 42
    assert r.calls[-1] == ("allocate_async", 0, 0, s)
    assert r.calls[-1][3] is s
    assert ref.deallocate_async(1337, 0, 256, s) is None
    assert r.calls[-1] == ("deallocate_async", 1337, 0, 256, s)
    # the synchronous pair is offered too
    assert ref.allocate(4) == r.POINTER + 42
    assert r.calls[-1] == ("allocate", 4, 256)


# 16 / 17. conversions
@pytest.mark.parametrize("ref", REFS)
def test_subset_conversion_keeps_object_and_methods(ref):
    r = async_resource()
    big = ref[with_short, with_int](r)
    small = ref[with_int](big)
    assert small.resource is big.resource is r
    assert small.allocate is big.allocate          # "same vtable": the same bound callables
    assert small.deallocate is big.deallocate
    if ref is async_resource_ref:
        assert small.allocate_async is big.allocate_async
    assert ref[()](big).resource is r


def test_wrappers_are_not_wrapped_again():
    big = resource_ref[with_short, with_int](no_default())
    small = resource_ref[with_int](big)
    assert small.allocate is big.allocate


@pytest.mark.parametrize("ref", REFS)
def test_conversion_to_a_superset_is_rejected(ref):
    small = ref[with_int](async_resource())
    with pytest.raises(TypeError, match="with_short"):
        ref[with_short, with_int](small)


def test_async_ref_converts_to_sync_ref():
    r = async_resource()
    a = async_resource_ref[with_short, with_int](r)
    s = resource_ref[with_int](a)
    assert type(s) is resource_ref[with_int]
    assert s.resource is r
    assert s.allocate is a.allocate
    assert not hasattr(s, "allocate_async")


def test_sync_ref_never_converts_to_async():
    s = resource_ref[with_int](async_resource())
    with pytest.raises(TypeError, match="synchronous"):
        async_resource_ref[with_int](s)
    with pytest.raises(TypeError):
        async_resource_ref(s)
    assert is_async_resource_with(async_resource_ref[with_int](s.resource), with_int)


# 18-21. equality
@pytest.mark.parametrize("ref", REFS)
def test_equality_delegates_to_the_resource(ref):
    r42, r42b, r1337 = async_resource(42), async_resource(42), async_resource(1337)
    assert ref[with_int](r42) == ref[with_int](r42b)
    assert not (ref[with_int](r42) != ref[with_int](r42b))
    assert ref[with_int](r42) != ref[with_int](r1337)
    assert not (ref[with_int](r42) == ref[with_int](r1337))


def test_equality_ignores_property_order_and_lists():
    a, b = async_resource(42), async_resource(42)
    assert resource_ref[with_short, with_int, stateless](a) == \
        resource_ref[with_int, stateless, with_short](b)
    # item 21: upstream refuses to compile this; property lists do not matter here
    assert resource_ref[with_int](a) == resource_ref[with_short, stateless](b)
    assert resource_ref[with_int](a) == async_resource_ref[with_short](b)


def test_different_resource_types_are_unequal_without_calling_eq():
    class other:
        properties = (with_int,)

        def __init__(self):
            self.val = 42

        def allocate(self, bytes, alignment=256):
            return 0

        def deallocate(self, ptr, bytes, alignment=256):
            pass

        def get_property(self, p):
            return 42

        def __eq__(self, o):
            raise AssertionError("__eq__ called across types")

    class derived(resource):  # same state, different type
        pass

    assert resource_ref[with_int](other()) != resource_ref[with_int](resource(42))
    assert resource_ref[with_int](resource(42)) != resource_ref[with_int](other())
    assert resource_ref[with_int](resource(42)) != resource_ref[with_int](derived(42))
    assert resource_ref(other()) != resource(42)
    assert resource_ref(resource(42)) != other()


def test_ref_compares_equal_to_its_resource():
    r = resource(42)
    ref = resource_ref[with_int](r)
    assert ref == r and r == ref
    assert ref == resource(42)
    assert ref != resource(1)
    assert ref != 42 and ref != None  # noqa: E711


def test_hash_agrees_with_equality():
    a, b = hashable_resource(1), hashable_resource(1)
    ra, rb = resource_ref(a), resource_ref[()](b)
    assert ra == rb and hash(ra) == hash(rb) == hash(a)
    assert len({ra, rb, a}) == 1
    # unhashable resources: the hash still agrees with ==
    u1, u2 = resource(42), resource(42)
    assert hash(resource_ref(u1)) == hash(resource_ref[with_int](u2))


# 22. size does not depend on the properties (HEAD: always 2 pointers)
def test_size_does_not_grow_with_properties():
    r = async_resource()
    assert sys.getsizeof(resource_ref[with_short, with_int, stateless](r)) == \
        sys.getsizeof(resource_ref(r))
    assert sys.getsizeof(async_resource_ref[with_short, with_int](r)) == \
        sys.getsizeof(async_resource_ref(r))


# 23-25. properties through a ref
@pytest.mark.parametrize("ref", REFS)
def test_stateful_property_is_read_live(ref):
    r = async_resource(42)
    rf = ref[with_short, with_int](r)
    assert get_property(rf, with_int) == 42
    assert get_property(rf, with_short) == 42
    r.val = 1337
    assert get_property(rf, with_int) == 1337
    assert rf.get_property(with_int) == 1337


@pytest.mark.parametrize("ref", REFS)
def test_stateless_property_through_ref(ref):
    rf = ref[stateless](async_resource())
    assert get_property(rf, stateless) is None
    assert has_property(rf, stateless)


@pytest.mark.parametrize("ref", REFS)
def test_only_listed_properties_are_visible(ref):
    rf = ref[with_short](async_resource())
    assert not has_property(rf, with_int)
    with pytest.raises(TypeError, match="with_int"):
        get_property(rf, with_int)
    with pytest.raises(TypeError):
        rf.get_property(stateless)
    assert not is_resource_with(rf, with_short, with_int)   # item 25
    assert is_resource_with(rf, with_short)


def test_duplicated_properties_accepted():
    ref = resource_ref[with_int, with_int, stateless, stateless](resource(7))
    assert get_property(ref, with_int) == 7
    assert ref.properties == frozenset({with_int, stateless})


# 26. virtual resources, base references, rebinding
def test_ref_dispatches_to_derived_overrides():
    class base(resource):
        def allocate(self, bytes, alignment=256):
            return 1

    class derived(base):
        def allocate(self, bytes, alignment=256):
            return 2

    obj: base = derived()
    ref = resource_ref[with_int](obj)
    assert ref.allocate(0) == 2
    ref = resource_ref[with_int](base())      # rebinding the name to another ref
    assert ref.allocate(0) == 1


def test_ref_to_a_forward_property_adaptor():
    class adaptor(forward_property):
        properties = (host_accessible,)

        def __init__(self, upstream):
            self.upstream = upstream

        def upstream_resource(self):
            return self.upstream

        def allocate(self, bytes, alignment=256):
            return self.upstream.allocate(bytes, alignment)

        def deallocate(self, ptr, bytes, alignment=256):
            self.upstream.deallocate(ptr, bytes, alignment)

        def __eq__(self, other):
            return isinstance(other, adaptor) and other.upstream == self.upstream

    r = resource(42)
    ref = resource_ref[host_accessible, with_int](adaptor(resource_ref[with_int](r)))
    assert get_property(ref, with_int) == 42
    r.val = 5
    assert get_property(ref, with_int) == 5
    assert ref.allocate(8) == r.POINTER + 5
    assert r.calls[-1] == ("allocate", 8, 256)


# holding, not owning
def test_ref_holds_resource_strongly_and_never_frees():
    r = resource()
    alive = weakref.ref(r)
    ref = resource_ref[with_int](r)
    ref.allocate(10)
    del r
    gc.collect()
    assert alive() is not None
    calls = alive().calls
    del ref
    gc.collect()
    assert alive() is None
    assert [c[0] for c in calls] == ["allocate"]


# 32. no empty refs in Python: None is rejected (see test_non_resources_rejected)
# 34. try_get_property after narrowing
def test_try_get_property_reaches_unlisted_properties():
    r = async_resource(42)
    narrow = resource_ref[()](async_resource_ref[with_int, stateless](r))
    assert try_get_property(narrow, with_int) == 42
    assert try_get_property(narrow, stateless) is True
    assert try_get_property(narrow, device_accessible) is False
    assert try_get_property(narrow, with_double) is None
    r.val = 3
    assert try_get_property(narrow, with_short) == 3
    assert try_get_property(r, with_int) == 3
    with pytest.raises(TypeError):
        try_get_property(narrow, int)


# 35. resource_cast; a failed "dynamic_resource_cast" is a TypeError
def test_resource_cast_exact_type_only():
    class derived(async_resource):
        pass
    r, d = async_resource(), derived()
    ref = resource_ref[with_int](r)
    assert resource_cast(async_resource, ref) is r
    assert resource_cast(resource, ref) is None
    assert resource_cast(derived, resource_ref(d)) is d
    assert resource_cast(async_resource, resource_ref(d)) is None
    assert resource_cast(async_resource, r) is r
    with pytest.raises(TypeError):
        resource_cast("async_resource", ref)


def test_dynamic_cast_to_unsupported_property_raises():
    ref = resource_ref[with_int](async_resource())
    assert resource_ref[with_short](ref.resource).resource is ref.resource
    with pytest.raises(TypeError):
        resource_ref[device_accessible](ref.resource)


def test_repr_names_class_and_resource():
    r = hashable_resource(1)
    assert repr(resource_ref(r)).startswith("resource_ref(")
    assert "with_int" in repr(async_resource_ref[with_int](hashable_async()))


def test_refs_are_resources():
    ref = async_resource_ref[with_int](async_resource())
    assert is_resource(ref)
    assert is_resource(resource_ref(ref))

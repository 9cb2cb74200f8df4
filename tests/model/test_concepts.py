"""Concepts: ports of upstream memory_resource.concepts/{resource,async_resource,resource_with,
async_resource_with}.pass.cpp (reference §5 items 7-9).

C++ checks argument and return *types*; Python checks that the methods can be called with
the positional arguments (``inspect.signature``).  "allocate returns int" has no Python
meaning (pointers are ints); "only == defined" is a resource in Python because != derives
from ==.
"""
import inspect
import types

import pytest

from hipmr_ctypes import concepts
from hipmr_ctypes.concepts import (AsyncResource, Resource, is_async_resource,
                                   is_async_resource_with, is_resource, is_resource_with)
from hipmr_ctypes.properties import (Property, device_accessible, forward_property,
                                     host_accessible)
from hipmr_ctypes.resource_refs import async_resource_ref, resource_ref


class prop_with_value(Property):
    value_type = int


class prop(Property):
    pass


class valid_resource:
    def allocate(self, bytes, alignment):
        return 0

    def deallocate(self, ptr, bytes, alignment):
        pass

    def __eq__(self, other):
        return isinstance(other, valid_resource)

    __hash__ = object.__hash__


class valid_async_resource(valid_resource):
    def allocate_async(self, bytes, alignment, stream):
        return 0

    def deallocate_async(self, ptr, bytes, alignment, stream):
        pass


# 7. resource
def test_valid_resource():
    assert is_resource(valid_resource())
    assert not is_async_resource(valid_resource())


def test_default_identity_equality_is_enough():
    class identity_eq:
        def allocate(self, bytes, alignment=256):
            return 0

        def deallocate(self, ptr, bytes, alignment=256):
            pass
    assert is_resource(identity_eq())


def test_invalid_allocate_argument_count():
    class one_arg(valid_resource):
        def allocate(self, bytes):
            return 0
    assert not is_resource(one_arg())


def test_allocate_with_required_keyword_only_argument():
    class kw_only(valid_resource):
        def allocate(self, bytes, alignment, *, device):
            return 0
    assert not is_resource(kw_only())


def test_invalid_deallocate_argument_count():
    class two_args(valid_resource):
        def deallocate(self, ptr, bytes):
            pass
    assert not is_resource(two_args())


def test_non_callable_or_missing_methods():
    class not_callable(valid_resource):
        allocate = 5

    class no_deallocate:
        def allocate(self, bytes, alignment):
            return 0
    assert not is_resource(not_callable())
    assert not is_resource(no_deallocate())
    assert not is_resource(object())
    assert not is_resource(None)
    assert not is_resource(42)


def test_non_comparable():
    class non_comparable(valid_resource):
        __eq__ = None
    assert not is_resource(non_comparable())


def test_only_not_equal():
    class non_eq_comparable(valid_resource):
        __eq__ = None

        def __ne__(self, other):
            return False
    assert not is_resource(non_eq_comparable())


def test_ne_disabled():
    class no_ne(valid_resource):
        __ne__ = None
    assert not is_resource(no_ne())


def test_classes_are_not_resources():
    assert not is_resource(valid_resource)
    assert not is_async_resource(valid_async_resource)
    assert not is_resource_with(valid_resource)


def test_flexible_signatures_still_qualify():
    class star_args:
        def allocate(self, *args):
            return 0

        def deallocate(self, *args, **kwargs):
            pass

    class static:
        @staticmethod
        def allocate(bytes, alignment, stream=None):
            return 0

        @classmethod
        def deallocate(cls, ptr, bytes, alignment):
            pass
    assert is_resource(star_args())
    assert is_resource(static())


def test_instance_attribute_methods_are_checked_per_instance():
    good = types.SimpleNamespace(allocate=lambda b, a: 0, deallocate=lambda p, b, a: None)
    bad = types.SimpleNamespace(allocate=lambda b: 0, deallocate=lambda p, b, a: None)
    assert is_resource(good)
    assert not is_resource(bad)
    assert is_resource(good)


def test_class_checks_are_cached(monkeypatch):
    class fresh(valid_async_resource):
        pass
    assert is_async_resource(fresh())

    def boom(*args, **kwargs):
        raise AssertionError("signature inspected again")
    monkeypatch.setattr(inspect, "signature", boom)
    assert is_async_resource(fresh())
    assert is_resource(fresh())
    assert is_resource_with(fresh())


# 8. async_resource
def test_valid_async_resource():
    assert is_async_resource(valid_async_resource())
    assert is_resource(valid_async_resource())


def test_async_missing_sync_allocate_or_deallocate():
    class no_allocate:
        def deallocate(self, ptr, bytes, alignment):
            pass

        def allocate_async(self, bytes, alignment, stream):
            return 0

        def deallocate_async(self, ptr, bytes, alignment, stream):
            pass

    class no_deallocate(no_allocate):
        deallocate = None

        def allocate(self, bytes, alignment):
            return 0
    assert not is_async_resource(no_allocate())
    assert not is_async_resource(no_deallocate())


def test_async_wrong_allocate_async_signature():
    class bad_allocate_async(valid_async_resource):
        def allocate_async(self, bytes, stream):
            return 0

    class bad_deallocate_async(valid_async_resource):
        def deallocate_async(self, ptr, bytes, stream):
            pass
    assert not is_async_resource(bad_allocate_async())
    assert is_resource(bad_allocate_async())
    assert not is_async_resource(bad_deallocate_async())


def test_async_not_comparable():
    class non_comparable(valid_async_resource):
        __eq__ = None
    assert not is_async_resource(non_comparable())


# 9. resource_with / async_resource_with
class resource_with_props(valid_async_resource):
    properties = (prop, prop_with_value)

    def get_property(self, p):
        return 42


def test_resource_with_all_listed_properties():
    r = resource_with_props()
    assert is_resource_with(r)
    assert is_resource_with(r, prop)
    assert is_resource_with(r, prop_with_value, prop)
    assert is_async_resource_with(r, prop, prop_with_value)


def test_resource_with_a_missing_property_is_false():
    class int_property(Property):
        value_type = int
    r = resource_with_props()
    assert not is_resource_with(r, prop, int_property)
    assert not is_async_resource_with(r, prop, int_property)
    assert not is_resource_with(r, device_accessible)


def test_properties_without_allocate_fail():
    class only_props:
        properties = (prop,)
    assert not is_resource_with(only_props(), prop)
    assert not is_async_resource_with(only_props(), prop)


def test_sync_resource_is_not_async_resource_with():
    class sync_with_prop(valid_resource):
        properties = (prop,)
    assert is_resource_with(sync_with_prop(), prop)
    assert not is_async_resource_with(sync_with_prop(), prop)


def test_resource_with_rejects_non_properties():
    with pytest.raises(TypeError):
        is_resource_with(resource_with_props(), int)
    with pytest.raises(TypeError):
        is_async_resource_with(resource_with_props(), "prop")


def test_property_checks_are_per_object_for_adaptors():
    class adaptor(forward_property):
        def __init__(self, upstream):
            self.upstream = upstream

        def upstream_resource(self):
            return self.upstream

        def allocate(self, bytes, alignment=256):
            return self.upstream.allocate(bytes, alignment)

        def deallocate(self, ptr, bytes, alignment=256):
            self.upstream.deallocate(ptr, bytes, alignment)

    class host_res(valid_resource):
        properties = (host_accessible,)

    a = adaptor(valid_resource())
    b = adaptor(host_res())
    assert not is_resource_with(a, host_accessible)
    assert is_resource_with(b, host_accessible)
    a.upstream = host_res()
    assert is_resource_with(a, host_accessible)


def test_refs_are_resources_with_only_their_properties():
    r = resource_with_props()
    sync = resource_ref[prop](r)
    asy = async_resource_ref[prop](r)
    assert is_resource(sync) and not is_async_resource(sync)
    assert is_async_resource(asy)
    assert is_resource_with(sync, prop)
    assert not is_resource_with(sync, prop_with_value)   # item 25
    assert is_async_resource_with(asy, prop)
    assert not is_async_resource_with(sync, prop)


def test_why_not_names_the_problem():
    class one_arg(valid_resource):
        def allocate(self, bytes):
            return 0
    assert "allocate" in concepts._why_not(one_arg(), False)
    assert "allocate_async" in concepts._why_not(valid_resource(), True)
    assert concepts._why_not(valid_async_resource(), True) is None


def test_protocols_are_protocol_classes():
    import typing
    for proto in (Resource, AsyncResource):
        assert typing.Protocol in proto.__mro__
    assert Resource in AsyncResource.__mro__
    assert {"allocate", "deallocate"} <= set(vars(Resource))
    assert {"allocate_async", "deallocate_async"} <= set(vars(AsyncResource))


def test_getattr_provided_methods_are_checked_per_instance():
    class dynamic:
        def __init__(self, good):
            self.good = good

        def __getattr__(self, name):
            if name == "allocate":
                return (lambda b, a: 0) if self.good else (lambda b: 0)
            if name == "deallocate":
                return lambda p, b, a: None
            raise AttributeError(name)
    assert is_resource(dynamic(True))
    assert not is_resource(dynamic(False))
    assert is_resource(dynamic(True))


# ---- the cache: keyed by what decides the answer ------------------------------------------------
def _no_inspection(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("signature inspected again")
    monkeypatch.setattr(inspect, "signature", boom)


def test_instances_of_one_class_with_their_own_methods_get_their_own_answers():
    class per_instance:
        def __eq__(self, other):
            return other is self
        __hash__ = object.__hash__

    def make(alloc_async):
        obj = per_instance()
        obj.allocate = lambda bytes, alignment=256: 0
        obj.deallocate = lambda ptr, bytes, alignment=256: None
        if alloc_async is not None:
            obj.allocate_async = alloc_async
            obj.deallocate_async = lambda ptr, bytes, alignment, stream: None
        return obj

    good = make(lambda bytes, alignment, stream: 0)
    short = make(lambda bytes: 0)
    sync = make(None)
    for _ in range(2):  # the second round answers from the cache
        assert is_async_resource(good)
        assert is_resource(short) and not is_async_resource(short)
        assert is_resource(sync) and not is_async_resource(sync)
    assert is_async_resource(make(lambda bytes, alignment, stream: 0))
    # the same code with another default alignment is another shape
    odd = make(lambda bytes, alignment, stream: 0)

    def allocate(bytes, alignment=512):
        return 0
    odd.allocate = allocate
    ref = async_resource_ref(odd)
    assert ref.allocate(8) == 0 and ref.allocate is not odd.allocate  # rebound to 256
    assert async_resource_ref(good).allocate is good.allocate


def test_a_class_changed_after_its_first_check_is_checked_again():
    class mutable(valid_resource):
        pass
    obj = mutable()
    assert is_resource(obj) and not is_async_resource(obj)
    mutable.allocate_async = lambda self, bytes, alignment, stream: 0
    mutable.deallocate_async = lambda self, ptr, bytes, alignment, stream: None
    assert is_async_resource(obj)
    mutable.allocate = lambda self: 0          # no longer callable as allocate(bytes, alignment)
    assert not is_resource(obj)
    del mutable.allocate                       # back to the base class's
    assert is_async_resource(obj)
    mutable.__eq__ = None
    assert not is_resource(obj)


def test_a_base_class_changed_later_is_seen_by_its_subclasses():
    class base(valid_async_resource):
        pass

    class child(base):
        pass
    assert is_async_resource(child())
    base.deallocate_async = None
    assert not is_async_resource(child()) and is_resource(child())


def test_objects_only_inspection_can_judge_are_inspected_every_time():
    class callable_object:
        def __init__(self, nparams):
            self.nparams = nparams

        def __call__(self, *args):
            return 0

        @property
        def __signature__(self):
            return inspect.Signature([inspect.Parameter(f"p{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                      for i in range(self.nparams)])

    class holder(valid_resource):
        pass
    ok, bad = holder(), holder()
    ok.allocate, bad.allocate = callable_object(2), callable_object(1)
    assert is_resource(ok) and not is_resource(bad) and is_resource(ok)

    class dynamic(valid_resource):
        def __getattr__(self, name):
            if name == "allocate_async" and self.flag:
                return lambda bytes, alignment, stream: 0
            if name == "deallocate_async" and self.flag:
                return lambda ptr, bytes, alignment, stream: None
            raise AttributeError(name)
    on, off = dynamic(), dynamic()
    on.flag, off.flag = True, False
    assert is_async_resource(on) and not is_async_resource(off) and is_async_resource(on)


def test_the_package_adaptors_are_one_shape_per_class_and_async_ness(monkeypatch):
    import hipmr_ctypes as hmr
    sync_up = hmr.HostMemoryResource()
    async_up = hmr.AsyncMemoryResource()

    class sync_only(valid_resource):  # a synchronous upstream with device_accessible
        properties = (device_accessible,)
    assert is_async_resource(hmr.StatisticsResource(async_up))
    assert not is_async_resource(hmr.StatisticsResource(sync_only()))
    assert is_resource(hmr.StatisticsResource(sync_only()))
    assert is_async_resource(hmr.PoolResource(async_up))
    assert is_resource(hmr.LimitingResource(sync_up, 1 << 20))
    _no_inspection(monkeypatch)
    # new instances of classes seen before: answered without inspecting anything
    assert is_async_resource(hmr.StatisticsResource(hmr.PoolResource(async_up)))
    assert not is_async_resource(hmr.StatisticsResource(sync_only()))
    ref = async_resource_ref[device_accessible](hmr.StatisticsResource(async_up))
    assert ref.allocate_async.__qualname__ == "StatisticsResource.allocate_async"
    with pytest.raises(TypeError, match="allocate_async"):
        async_resource_ref(hmr.StatisticsResource(sync_only()))


def test_classes_and_refs_answer_without_inspection(monkeypatch):
    is_async_resource(valid_async_resource())
    _no_inspection(monkeypatch)
    assert not is_resource(valid_async_resource) and not is_resource(type)
    ref = async_resource_ref(valid_async_resource())
    assert is_async_resource(ref) and is_resource(resource_ref(ref))
    assert not is_async_resource(resource_ref(ref))

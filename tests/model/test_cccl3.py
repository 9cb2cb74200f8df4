"""hipmr_ctypes.cccl3: CCCL 3.x's names and semantics (the upstream behaviours of the 3.x tests
``memory_resource/{resource,resource_ref,synchronous_resource_ref}``, ``any_resource``,
``shared_resource``, ``synchronous_adapter``, ``properties`` and ``stream_ref`` that apply to
Python), on user-written 3.x resources and on the package's own resources."""
import copy
import gc
import pickle
import weakref

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import cccl3 as c3
from hipmr_ctypes.cccl3 import Accessibility, dynamic_accessibility_property as dyn


class with_int(hmr.Property):
    value_type = int


class with_str(hmr.Property):
    value_type = str


class Sync3:
    """A 3.x synchronous resource: allocate_sync / deallocate_sync."""

    properties = (hmr.host_accessible, with_int)

    def __init__(self, value=42):
        self.value = value
        self.calls = []

    def allocate_sync(self, bytes, alignment):
        self.calls.append(("allocate_sync", bytes, alignment))
        return 0x1000 + bytes

    def deallocate_sync(self, ptr, bytes, alignment):
        self.calls.append(("deallocate_sync", ptr, bytes, alignment))

    def get_property(self, prop):
        return self.value

    def __eq__(self, other):
        return isinstance(other, Sync3) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


class Ordered3(Sync3):
    """A 3.x stream-ordered resource: the stream first."""

    properties = (hmr.device_accessible, with_int)

    def allocate(self, stream, bytes, alignment):
        self.calls.append(("allocate", stream, bytes, alignment))
        return 0x2000 + bytes

    def deallocate(self, stream, ptr, bytes, alignment):
        self.calls.append(("deallocate", stream, ptr, bytes, alignment))


class Other3(Ordered3):
    pass


# ---- concepts ----------------------------------------------------------------------------------
def test_concepts_read_the_3x_shape():
    assert c3.is_synchronous_resource(Sync3()) and not c3.is_resource(Sync3())
    assert c3.is_resource(Ordered3()) and c3.is_synchronous_resource(Ordered3())
    assert c3.is_resource_with(Ordered3(), hmr.device_accessible, with_int)
    assert not c3.is_resource_with(Ordered3(), hmr.host_accessible)
    assert c3.is_synchronous_resource_with(Sync3(), hmr.host_accessible)
    assert not c3.is_synchronous_resource_with(Sync3(), with_str)
    assert not c3.is_resource(Sync3) and not c3.is_synchronous_resource(42)


def test_concepts_refuse_wrong_signatures_and_no_equality():
    class WrongAlloc(Sync3):
        def allocate_sync(self, bytes):
            return 0

    class NoEq(Sync3):
        __eq__ = None

    class WrongOrdered(Sync3):
        def allocate(self, bytes, alignment):  # 2.2's shape on a 3.x object: not stream-first
            return 0

        def deallocate(self, stream, ptr, bytes, alignment):
            pass

    assert not c3.is_synchronous_resource(WrongAlloc())
    assert not c3.is_synchronous_resource(NoEq())
    assert c3.is_synchronous_resource(WrongOrdered()) and not c3.is_resource(WrongOrdered())


def test_the_package_resources_are_3x_resources():
    device = hmr.DeviceMemoryResource()
    assert c3.is_resource(device) and c3.is_synchronous_resource(device)
    assert c3.is_resource_with(device, hmr.device_accessible, dyn)
    assert c3.is_resource(hmr.PoolResource(device, 1 << 20))
    host = hmr.HostMemoryResource()
    assert c3.is_synchronous_resource(host)
    assert c3.is_resource(host) == hmr.is_async_resource(host)


def test_the_top_level_keeps_the_22_model_and_refuses_3x_wrappers():
    device = hmr.DeviceMemoryResource()
    ref = c3.resource_ref(device)
    for wrapper in (ref, c3.any_resource(device), c3.shared_resource(device),
                    c3.synchronous_resource_adapter(device)):
        assert not hmr.is_resource(wrapper)
        with pytest.raises(TypeError, match="CCCL 3.x object"):
            hmr.resource_ref(wrapper)
    assert hmr.is_async_resource(device)  # unchanged


# ---- refs --------------------------------------------------------------------------------------
def test_synchronous_ref_forwards_with_the_default_alignment():
    res = Sync3()
    ref = c3.synchronous_resource_ref[hmr.host_accessible, with_int](res)
    assert ref.allocate_sync(0) == 0x1000
    assert ref.allocate_sync(8, 64) == 0x1008
    ref.deallocate_sync(1337, 0)
    assert res.calls == [("allocate_sync", 0, 256), ("allocate_sync", 8, 64),
                         ("deallocate_sync", 1337, 0, 256)]
    assert ref.resource is res and not hasattr(ref, "allocate")


def test_resource_ref_takes_the_stream_first():
    res = Ordered3()
    ref = c3.resource_ref[hmr.device_accessible](res)
    assert ref.allocate(7, 16) == 0x2010
    ref.deallocate(7, 0x2010, 16, 32)
    assert res.calls == [("allocate", 7, 16, 256), ("deallocate", 7, 0x2010, 16, 32)]


def test_ref_construction_checks_kind_and_properties():
    with pytest.raises(TypeError, match="lacks the properties with_str"):
        c3.resource_ref[with_str](Ordered3())
    with pytest.raises(TypeError, match="allocate is missing"):
        c3.resource_ref(Sync3())
    with pytest.raises(TypeError, match="needs a resource instance"):
        c3.synchronous_resource_ref(None)
    with pytest.raises(TypeError, match="not a property class"):
        c3.resource_ref[int]
    with pytest.raises(TypeError, match="already has its properties"):
        c3.resource_ref[with_int][with_str]


def test_property_sets_are_order_free_and_deduplicated():
    assert c3.resource_ref[with_int, hmr.device_accessible] is \
        c3.resource_ref[hmr.device_accessible, with_int, with_int]
    assert c3.resource_ref[()] is c3.resource_ref


def test_conversions_narrow_and_never_widen():
    res = Ordered3()
    wide = c3.resource_ref[hmr.device_accessible, with_int](res)
    narrow = c3.synchronous_resource_ref[with_int](wide)
    assert narrow.resource is res and narrow.allocate_sync is wide.allocate_sync
    with pytest.raises(TypeError, match="synchronous"):
        c3.resource_ref(narrow)
    with pytest.raises(TypeError, match="lacks device_accessible"):
        c3.resource_ref[hmr.device_accessible](c3.resource_ref[with_int](res))


def test_a_22_ref_converts_with_its_listed_properties():
    device = hmr.DeviceMemoryResource()
    ref22 = hmr.async_resource_ref[hmr.device_accessible](device)
    ref = c3.resource_ref[hmr.device_accessible](ref22)
    assert ref.resource is device
    with pytest.raises(TypeError, match="lacks the properties"):
        c3.resource_ref[hmr.host_accessible](hmr.async_resource_ref(device))
    with pytest.raises(TypeError, match="no allocate_async"):
        c3.resource_ref(hmr.resource_ref(device))


def test_equality_delegates_to_the_resource_and_ignores_properties():
    a, b, c = Ordered3(42), Ordered3(42), Ordered3(1337)
    assert c3.resource_ref[with_int](a) == c3.resource_ref[with_int](b)
    assert c3.resource_ref[with_int](a) != c3.resource_ref[with_int](c)
    assert c3.resource_ref[with_int, hmr.device_accessible](a) == \
        c3.synchronous_resource_ref[hmr.device_accessible](b)
    assert c3.resource_ref(Other3(42)) != c3.resource_ref(a)  # other type, equal state
    assert c3.resource_ref(a) == a and hash(c3.resource_ref(a)) == hash(a)


def test_properties_through_a_ref_are_live_and_only_the_listed_ones():
    res = Ordered3(42)
    ref = c3.resource_ref[with_int, hmr.device_accessible](res)
    assert ref.get_property(with_int) == 42
    res.value = 1337
    assert c3.get_property(ref, with_int) == 1337
    assert ref.get_property(hmr.device_accessible) is None
    narrow = c3.resource_ref[hmr.device_accessible](ref)
    with pytest.raises(TypeError, match="try_get_property"):
        narrow.get_property(with_int)
    assert c3.try_get_property(narrow, with_int) == 1337
    assert c3.try_get_property(narrow, hmr.host_accessible) is False
    assert c3.try_get_property(narrow, with_str) is None


def test_refs_are_immutable_copyable_and_picklable():
    ref = c3.resource_ref[hmr.device_accessible](hmr.DeviceMemoryResource())
    with pytest.raises(AttributeError):
        ref.resource = None  # type: ignore[misc]
    assert copy.copy(ref) is ref and copy.deepcopy(ref) is ref
    back = pickle.loads(pickle.dumps(ref))
    assert type(back) is type(ref) and back == ref


# ---- any_resource ------------------------------------------------------------------------------
def test_empty_any_resources():
    empty, other = c3.any_resource[with_int](), c3.any_resource()
    assert not empty and not empty.has_value()
    assert empty == other                     # empty equals empty
    full = c3.any_resource[with_int](Ordered3())
    assert full and empty != full and full != empty
    with pytest.raises(ValueError, match="empty"):
        empty.allocate(0, 16)
    with pytest.raises(ValueError, match="empty"):
        empty.allocate_sync(16)
    with pytest.raises(TypeError, match="empty"):
        c3.resource_ref(empty)
    assert c3.resource_cast(Ordered3, empty) is None


def test_empty_versus_populated_does_not_call_the_resources_eq():
    class Loud(Ordered3):
        def __eq__(self, other):
            raise AssertionError("== called")

        __hash__ = Ordered3.__hash__

    assert c3.any_resource() != c3.any_resource(Loud())


def test_any_resource_from_a_ref_and_narrowing():
    res = Ordered3()
    ref = c3.resource_ref[with_int, hmr.device_accessible](res)
    owned = c3.any_resource[with_int](ref)
    assert owned.resource is res and owned == ref
    sync = c3.any_synchronous_resource[with_int](owned)
    assert sync.allocate_sync(4) == 0x1004 and not hasattr(sync, "allocate")
    assert c3.try_get_property(c3.any_synchronous_resource(sync), with_int) == 42
    back = c3.resource_ref[with_int](owned)
    assert back.allocate(0, 4) == 0x2004


def test_any_resource_keeps_its_resource_alive():
    res = Ordered3()
    gone = weakref.ref(res)
    owned = c3.any_resource(res)
    del res
    gc.collect()
    assert gone() is not None
    del owned
    gc.collect()
    assert gone() is None


def test_resource_cast_matches_the_exact_type_only():
    res = Other3()
    wrapped = c3.any_resource(res)
    assert c3.resource_cast(Other3, wrapped) is res
    assert c3.resource_cast(Ordered3, wrapped) is None
    with pytest.raises(TypeError):
        c3.resource_cast("Other3", wrapped)  # type: ignore[arg-type]


# ---- shared_resource ---------------------------------------------------------------------------
def test_shared_resource_copies_share_one_block():
    shared = c3.make_shared_resource(Ordered3, 42)
    twin = copy.copy(shared)
    assert twin.get() is shared.get() and twin == shared
    assert c3.shared_resource(Ordered3(42)) == shared      # another block: payloads compared
    assert c3.shared_resource(Ordered3(7)) != shared
    assert twin.allocate(3, 8) == 0x2008 and shared.allocate_sync(8) == 0x1008
    assert c3.is_resource_with(shared, hmr.device_accessible, with_int)
    assert c3.get_property(shared, with_int) == 42
    gone = weakref.ref(shared.get())
    del shared
    gc.collect()
    assert gone() is not None   # the twin holds it
    del twin
    gc.collect()
    assert gone() is None


def test_shared_resource_of_a_synchronous_resource_is_synchronous():
    shared = c3.shared_resource(Sync3())
    assert c3.is_synchronous_resource(shared) and not c3.is_resource(shared)
    with pytest.raises(TypeError, match="needs a resource"):
        c3.shared_resource(object())
    with pytest.raises(TypeError, match="resource class"):
        c3.make_shared_resource(42)  # type: ignore[arg-type]


# ---- synchronous_resource_adapter ----------------------------------------------------------------
def test_adapter_falls_back_to_the_synchronous_pair():
    res = Sync3()
    adapted = c3.synchronous_resource_adapter(res)
    assert c3.is_resource_with(adapted, hmr.host_accessible, with_int)
    assert c3.get_property(adapted, with_int) == 42
    stream = hmr.Stream()
    assert adapted.allocate(stream, 16) == 0x1010
    adapted.deallocate(stream, 0x1010, 16)
    assert res.calls == [("allocate_sync", 16, 256), ("deallocate_sync", 0x1010, 16, 256)]
    with pytest.raises(TypeError, match="stream"):
        adapted.allocate("no stream", 16)
    assert res.calls[-1][0] == "deallocate_sync"       # nothing allocated for a bad stream
    assert adapted == c3.synchronous_resource_adapter(Sync3())
    assert adapted.upstream_resource() is res


def test_adapter_uses_an_upstreams_own_stream_ordered_pair():
    res = Ordered3()
    adapted = c3.synchronous_resource_adapter(res)
    assert adapted.allocate(5, 16) == 0x2010
    assert res.calls == [("allocate", 5, 16, 256)]


def test_adapter_over_a_package_resource():
    pool = hmr.PoolResource(hmr.DeviceMemoryResource(), 1 << 20)
    adapted = c3.synchronous_resource_adapter(pool)
    ref = c3.resource_ref[hmr.device_accessible](adapted)
    with hmr.Stream() as stream:
        ptr = ref.allocate(stream, 4096)
        ref.deallocate(stream, ptr, 4096)
    assert pool.get_allocated_bytes() == 0


# ---- dynamic_accessibility_property ------------------------------------------------------------
def test_every_resource_has_dynamic_accessibility():
    assert c3.get_property(Sync3(), dyn) is Accessibility.host
    assert c3.get_property(Ordered3(), dyn) is Accessibility.device
    assert c3.get_property(hmr.ManagedMemoryResource(), dyn) is Accessibility.host_device
    assert c3.get_property(hmr.PinnedMemoryResource(), dyn) is Accessibility.host_device

    class Bare(Sync3):
        properties = ()

    assert c3.get_property(Bare(), dyn) is Accessibility.unknown
    assert c3.has_property(Bare(), dyn) and not c3.has_property(object(), dyn)
    with pytest.raises(TypeError):
        c3.get_property(object(), dyn)


def test_a_resource_may_declare_its_own_accessibility():
    class Says(Sync3):
        properties = (dyn,)

        def get_property(self, prop):
            return Accessibility.host_device

    ref = c3.synchronous_resource_ref[dyn](Says())
    assert ref.get_property(dyn) is Accessibility.host_device
    # through a ref that lists other properties, the memory's value all the same
    assert c3.resource_ref[with_int](Ordered3()).get_property(dyn) is Accessibility.device


# ---- the package's resources through the 3.x wrappers ------------------------------------------
def test_package_resources_allocate_through_3x_refs():
    mr = hmr.AsyncMemoryResource()
    ref = c3.resource_ref[hmr.device_accessible](mr)
    with hmr.Stream() as stream:
        ptr = ref.allocate(stream, 1 << 16)
        assert ptr % 256 == 0
        ref.deallocate(stream, ptr, 1 << 16)
        stream.synchronize()
    ptr = ref.allocate_sync(100)
    ref.deallocate_sync(ptr, 100)
    with pytest.raises(ValueError):
        ref.allocate(0, -1)
    assert ref.resource is mr and ref == mr


# ---- stream_ref --------------------------------------------------------------------------------
def test_stream_ref_waits_on_events_and_streams():
    with hmr.Stream() as first, hmr.Stream() as second:
        ref = c3.stream_ref(first)
        assert ref == first and isinstance(ref, hmr.stream_ref)
        ref.wait(second)
        ref.wait(ref)                      # the same stream: nothing to do
        ref.wait(hmr.Event().record(second))
        ref.sync()
        assert ref.is_done()
        with pytest.raises(TypeError, match="other"):
            ref.wait("not a stream")
        with pytest.raises(TypeError):
            ref.wait()  # type: ignore[call-arg]
    assert pickle.loads(pickle.dumps(ref)) == ref and type(pickle.loads(pickle.dumps(ref))) \
        is c3.stream_ref


def test_importing_cccl3_loads_no_library():
    import subprocess
    import sys
    code = ("import sys; import hipmr_ctypes.cccl3; "
            "assert 'hipmr_ctypes.stream' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

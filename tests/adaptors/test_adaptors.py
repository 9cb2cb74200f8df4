"""What every adaptor does over every kind of upstream: user-written resources (synchronous
over real host memory, async over an address space), the package's HostMemoryResource and
the emulated device resources, and refs to them.  Properties, async-ness, upstream_resource,
equality, argument checks that leave everything unchanged, stacks of adaptors, and frees that
several adaptors must refuse or race on."""
import ctypes
import inspect
import io
import sys
import threading
import types

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import (async_resource_ref, device_accessible, host_accessible,
                          is_async_resource, is_async_resource_with, is_resource,
                          is_resource_with, resource_ref)
from hipmr_ctypes.adaptors import (AlignedResource, BinningResource, CallbackResource,
                                   FailureCallbackResource, FixedSizeResource,
                                   LimitingResource, LoggingResource, PoolResource,
                                   PrefetchResource, StatisticsResource, TrackingResource)
from hipmr_ctypes.resources import (AsyncMemoryResource, DeviceMemoryResource,
                                    HostMemoryResource, ManagedMemoryResource,
                                    PinnedMemoryResource)

from support import AddressSpaceResource, HostBufferResource

# name -> factory(upstream); each takes the upstream first
ADAPTORS = {
    "pool": lambda up: PoolResource(up),
    "pool-initial": lambda up: PoolResource(up, initial_pool_size=1 << 20,
                                            maximum_pool_size=1 << 26),
    "binning": lambda up: BinningResource(up, [512, 4096]),
    "fixed": lambda up: FixedSizeResource(up, block_size=1 << 16, blocks_to_preallocate=4),
    "limiting": lambda up: LimitingResource(up, 1 << 30),
    "statistics": lambda up: StatisticsResource(up),
    "tracking": lambda up: TrackingResource(up, capture_stacks=True),
    "logging": lambda up: LoggingResource(up, io.StringIO()),
    "failure": lambda up: FailureCallbackResource(up, lambda n: False),
    "aligned": lambda up: AlignedResource(up, alignment=4096),
}
# name -> (factory, writable host memory?)
UPSTREAMS = {
    "user-host": (lambda: HostBufferResource((host_accessible,)), True),
    "user-address-space": (lambda: AddressSpaceResource(properties=(device_accessible,)), False),
    "host": (HostMemoryResource, True),
    "device": (DeviceMemoryResource, False),
    "async": (AsyncMemoryResource, False),
    "managed": (ManagedMemoryResource, True),
    "pinned": (PinnedMemoryResource, True),
}
SIZES = (1, 100, 256, 1000, 4096, 60000)


def _fill_and_check(blocks):
    """Write a distinct byte over each block, then check every block still holds its own."""
    for i, (ptr, size) in enumerate(blocks):
        ctypes.memset(ptr, i % 251 + 1, size)
    for i, (ptr, size) in enumerate(blocks):
        assert ctypes.string_at(ptr, size) == bytes([i % 251 + 1]) * size


@pytest.mark.parametrize("up_name", sorted(UPSTREAMS))
@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_adaptor_over_upstream(name, up_name):
    make_up, writable = UPSTREAMS[up_name]
    up = make_up()
    r = ADAPTORS[name](up)
    assert is_resource(r)
    assert is_async_resource(r) == is_async_resource(up)
    assert set(r.properties) == set(up.properties)
    assert is_resource_with(r, *up.properties)
    assert r.upstream_resource().resource is up
    assert r == r and not (r != r)
    blocks = []
    for size in SIZES:
        for alignment in (1, 64, 256):
            ptr = r.allocate(size, alignment)
            assert ptr and ptr % alignment == 0
            blocks.append((ptr, size, alignment))
    starts = sorted((p, s) for p, s, _ in blocks)
    for (p1, s1), (p2, _) in zip(starts, starts[1:]):
        assert p1 + s1 <= p2, "live blocks overlap"
    if writable:
        _fill_and_check([(p, s) for p, s, _ in blocks])
    for ptr, size, alignment in reversed(blocks):
        r.deallocate(ptr, size, alignment)
    if is_async_resource(r):
        ptr = r.allocate_async(1000, 256, 0)
        r.deallocate_async(ptr, 1000, 256, hmr.stream_ref(0))
    assert r.allocate(0) == 0
    r.deallocate(0, 0)


@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_async_follows_the_upstream(name):
    sync_up = HostBufferResource()
    assert not is_async_resource(sync_up)
    r = ADAPTORS[name](sync_up)
    assert is_resource(r) and not is_async_resource(r)
    assert not hasattr(r, "allocate_async") and not hasattr(r, "deallocate_async")
    with pytest.raises(AttributeError, match="allocate_async"):
        r.allocate_async  # noqa: B018
    # the interface still documents the async methods (the class's own are the slots)
    declared = [k.__dict__["allocate_async"] for k in type(r).__mro__
                if callable(k.__dict__.get("allocate_async"))]
    assert declared and "stream order" in declared[0].__doc__
    async_up = AddressSpaceResource()
    assert is_async_resource(ADAPTORS[name](async_up))
    # a synchronous ref to an async resource gives a synchronous adaptor
    assert not is_async_resource(ADAPTORS[name](resource_ref[device_accessible](async_up)))


@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_upstream_as_ref_and_properties_forwarded(name):
    up = ManagedMemoryResource()
    ref = async_resource_ref[device_accessible](up)
    r = ADAPTORS[name](ref)
    assert r.upstream_resource() is ref
    # the adaptor has what the ref shows, no more
    assert set(r.properties) == {device_accessible}
    assert hmr.get_property(r, device_accessible) is None
    with pytest.raises(TypeError):
        hmr.get_property(r, host_accessible)
    # and can itself be held through a ref of those properties
    outer = async_resource_ref[device_accessible](r)
    p = outer.allocate_async(4096, 256, 0)
    outer.deallocate_async(p, 4096, 256, 0)
    with pytest.raises(TypeError):
        resource_ref[host_accessible](r)


def test_stateful_property_forwarded_live():
    class level(hmr.Property):
        value_type = int

    class Leveled(HostBufferResource):
        def __init__(self):
            super().__init__((host_accessible, level))
            self.value = 1

        def get_property(self, prop):
            return self.value

    up = Leveled()
    r = StatisticsResource(PoolResource(up))
    assert hmr.has_property_with(r, level, int)
    assert hmr.get_property(r, level) == 1
    up.value = 7
    assert hmr.get_property(r, level) == 7


@pytest.mark.parametrize("name", ["limiting", "statistics", "tracking", "logging", "failure",
                                  "aligned"])
def test_pass_through_adaptors_equal_over_equal_upstreams(name):
    up = HostMemoryResource()
    if name == "logging":
        f = io.StringIO()
        a, b = LoggingResource(up, f), LoggingResource(HostMemoryResource(), f)
        assert a == b and hash(a) == hash(b)
        assert a != LoggingResource(up, io.StringIO())
        return
    if name == "failure":
        cb = lambda n: False  # noqa: E731
        a, b = FailureCallbackResource(up, cb), FailureCallbackResource(up, cb)
        assert a == b and hash(a) == hash(b)
        assert a != FailureCallbackResource(up, lambda n: False)
        return
    a, b = ADAPTORS[name](up), ADAPTORS[name](HostMemoryResource())
    assert a == b and hash(a) == hash(b)
    assert a != ADAPTORS[name](HostBufferResource())     # another upstream
    assert a != StatisticsResource(up) or name == "statistics"
    assert resource_ref[host_accessible](a) == resource_ref[host_accessible](b)


def test_settings_take_part_in_equality():
    up = HostMemoryResource()
    assert LimitingResource(up, 100) != LimitingResource(up, 200)
    assert TrackingResource(up) != TrackingResource(up, capture_stacks=True)
    assert AlignedResource(up, 512) != AlignedResource(up, 1024)
    assert AlignedResource(up, 512, 10) != AlignedResource(up, 512, 20)


@pytest.mark.parametrize("name", ["pool", "fixed"])
def test_sub_allocators_equal_only_to_themselves(name):
    up = HostMemoryResource()
    a, b = ADAPTORS[name](up), ADAPTORS[name](up)
    assert a == a and a != b
    assert resource_ref[host_accessible](a) != resource_ref[host_accessible](b)


def test_binning_equal_with_equal_bins():
    up = HostMemoryResource()
    pool = PoolResource(up)
    assert BinningResource(up, [(1024, pool)]) == BinningResource(up, [(1024, pool)])
    assert BinningResource(up, [1024]) != BinningResource(up, [1024])  # separate bins
    assert BinningResource(up) == BinningResource(up)


BAD_ALLOCATIONS = [
    ((-1,), ValueError, "bytes"), ((1.5,), TypeError, "bytes"), ((True,), TypeError, "bytes"),
    (("8",), TypeError, "bytes"), ((None,), TypeError, "bytes"),
    ((8, 3), ValueError, "alignment"), ((8, 0), ValueError, "alignment"),
    ((8, -4), ValueError, "alignment"), ((8, 2.0), TypeError, "alignment"),
    ((8, False), TypeError, "alignment"), ((8, None), TypeError, "alignment"),
    (((1 << 64) + 1,), ValueError, "bytes"),
]


@pytest.mark.parametrize("args,error,word", BAD_ALLOCATIONS)
@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_bad_arguments_change_nothing(name, args, error, word):
    up = AddressSpaceResource()
    r = StatisticsResource(ADAPTORS[name](up))
    keep = r.allocate(1000)
    before, calls, outstanding = r.statistics, up.calls, up.outstanding
    with pytest.raises(error, match=word):
        r.allocate(*args)
    with pytest.raises(error, match=word):
        r.allocate_async(*(args + (256,) * (2 - len(args))), 0)
    bad_free = (keep,) + args + (256,) * (2 - len(args))
    if args[0] is not True and not (isinstance(args[0], int) and args[0] == 1000):
        with pytest.raises((TypeError, ValueError)):
            r.deallocate(*bad_free)
    assert r.statistics == before
    assert up.calls == calls and up.outstanding == outstanding
    r.deallocate(keep, 1000)


@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_float_equal_to_a_live_pointer_is_not_taken_for_it(name):
    up = AddressSpaceResource()
    r = StatisticsResource(ADAPTORS[name](up))
    p = r.allocate(512)
    before, outstanding = r.statistics, up.outstanding
    with pytest.raises(TypeError, match="ptr"):
        r.deallocate(float(p), 512)
    with pytest.raises(TypeError, match="ptr"):
        r.deallocate_async(float(p), 512, 256, 0)
    with pytest.raises(TypeError, match="alignment"):
        r.deallocate(p, 512, None)
    assert r.statistics == before and up.outstanding == outstanding
    r.deallocate(p, 512)


@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_bad_stream_changes_nothing(name):
    up = AddressSpaceResource()
    r = ADAPTORS[name](up)
    keep = r.allocate_async(1000, 256, 0)
    calls = up.calls
    for stream in (-1, "s", 1.5, None):
        with pytest.raises((TypeError, ValueError)):
            r.allocate_async(64, 256, stream)
        with pytest.raises((TypeError, ValueError)):
            r.deallocate_async(keep, 1000, 256, stream)
    assert up.calls == calls
    r.deallocate_async(keep, 1000, 256, 0)


def test_bad_constructor_arguments():
    up = HostMemoryResource()
    for make, error in [
        (lambda: PoolResource(None), TypeError),
        (lambda: PoolResource(HostMemoryResource), TypeError),
        (lambda: PoolResource(object()), TypeError),
        (lambda: PoolResource(up, -1), ValueError),
        (lambda: PoolResource(up, 1.5), ValueError),   # a float is a fraction in (0, 1]
            (lambda: PoolResource(up, b"1"), TypeError),
        (lambda: PoolResource(up, None, True), TypeError),
        (lambda: PoolResource(up, 1 << 21, 1 << 20), ValueError),
        (lambda: LimitingResource(up, -5), ValueError),
        (lambda: LimitingResource(up, "5 apples"), ValueError),
        (lambda: LimitingResource(up, b"5"), TypeError),
        (lambda: AlignedResource(up, 3), ValueError),
        (lambda: AlignedResource(up, 512, -1), ValueError),
        (lambda: FixedSizeResource(up, 0), ValueError),
        (lambda: FixedSizeResource(up, 4096, 0), ValueError),
        (lambda: BinningResource(up, [0]), ValueError),
        (lambda: BinningResource(up, [512, 512]), ValueError),
        (lambda: BinningResource(up, 5), TypeError),
        (lambda: BinningResource(up, [(1, 2, 3)]), TypeError),
        (lambda: BinningResource(up, min_size_exponent=10), ValueError),
        (lambda: TrackingResource(up, capture_stacks=1), TypeError),
        (lambda: LoggingResource(up, 42), TypeError),
        (lambda: FailureCallbackResource(up, None), TypeError),
        (lambda: CallbackResource(up.allocate, None), TypeError),
        (lambda: CallbackResource(up.allocate, up.deallocate, up.allocate_async), TypeError),
        (lambda: CallbackResource(up.allocate, up.deallocate, properties=(int,)), TypeError),
    ]:
        with pytest.raises(error):
            make()


def test_stack_of_adaptors_over_a_pool_is_exact():
    up = AddressSpaceResource(properties=(device_accessible,))
    pool = PoolResource(up, maximum_pool_size=1 << 24)
    stack = StatisticsResource(TrackingResource(LimitingResource(
        AlignedResource(pool, alignment=4096, threshold=1 << 12), 1 << 23)))
    ref = async_resource_ref[device_accessible](stack)
    ptrs = []
    for i in range(200):
        n = 1 + (i * 7919) % 50000
        stream = i % 3
        p = ref.allocate_async(n, 256, stream)
        assert p % (4096 if n >= 4096 else 256) == 0
        ptrs.append((p, n, stream))
    st = stack.statistics
    assert st.current_count == 200 and st.current_bytes == sum(n for _, n, _ in ptrs)
    tracking = stack.upstream_resource().resource
    assert tracking.get_allocated_bytes() == st.current_bytes
    limiting = tracking.upstream_resource().resource
    assert limiting.get_allocated_bytes() == st.current_bytes
    for p, n, stream in ptrs:
        ref.deallocate_async(p, n, 256, (stream + 1) % 3)
    assert stack.statistics.current_bytes == 0 and tracking.outstanding() == {}
    assert limiting.get_allocated_bytes() == 0
    pool.release()
    assert up.outstanding == 0 and pool.pool_size() == 0


@pytest.mark.parametrize("name", sorted(ADAPTORS))
def test_hot_paths_are_named_after_the_public_methods(name):
    """Each instance's hot-path closures carry the public method's name, so that tracebacks,
    profilers and ``help()`` show ``PoolResource.allocate``, not ``_bind.<locals>``."""
    adaptor = ADAPTORS[name](AddressSpaceResource())  # a user-written upstream: all closures
    owner = type(adaptor).__qualname__
    for method in ("allocate", "deallocate", "allocate_async", "deallocate_async"):
        fn = getattr(adaptor, method)
        assert isinstance(fn, types.FunctionType), (name, method)
        assert (fn.__name__, fn.__qualname__) == (method, f"{owner}.{method}")
        assert method not in adaptor.__dict__           # in a slot, read the specialized way
        assert getattr(adaptor, method) is fn
    over_sync = ADAPTORS[name](HostBufferResource())   # no async pair over a sync upstream
    assert not hasattr(over_sync, "allocate_async")
    assert over_sync.allocate.__qualname__ == f"{owner}.allocate"


def test_callback_and_prefetch_hot_paths_are_named_too():
    cb = CallbackResource(lambda n, a: 0, lambda p, n, a: None,
                          lambda n, a, s: 0, lambda p, n, a, s: None)
    pf = PrefetchResource(AddressSpaceResource(), device=0)
    for resource in (cb, pf):
        owner = type(resource).__name__
        for method in ("allocate", "deallocate", "allocate_async", "deallocate_async"):
            assert getattr(resource, method).__qualname__ == f"{owner}.{method}"


@pytest.mark.parametrize("call", ["allocate", "allocate_async", "deallocate"])
def test_a_bad_keyword_reads_as_a_call_of_the_public_method(call):
    pool = PoolResource(AddressSpaceResource())
    args = {"allocate": (256,), "allocate_async": (256, 256, 0), "deallocate": (0, 0)}[call]
    with pytest.raises(TypeError) as info:
        getattr(pool, call)(*args, nbytes=1)
    # Python 3.10 and later name the function by its __qualname__, 3.9 by its code's name
    name = f"PoolResource.{call}" if sys.version_info >= (3, 10) else call
    assert str(info.value).startswith(f"{name}() got an unexpected keyword argument 'nbytes'")
    assert pool.allocation_count() == 0


def test_the_sub_allocators_key_synchronous_use_by_one_sentinel():
    from hipmr_ctypes import _stream_order
    from hipmr_ctypes.adaptors import fixed_size as fixed_module
    from hipmr_ctypes.adaptors import pool as pool_module
    assert not hasattr(_stream_order, "HOST") and repr(_stream_order.SYNC) == "SYNC"
    assert pool_module.SYNC is fixed_module.SYNC is _stream_order.SYNC
    pool = PoolResource(AddressSpaceResource())
    pool.deallocate(pool.allocate(300), 300)
    fixed = FixedSizeResource(AddressSpaceResource(), block_size=512, blocks_to_preallocate=2)
    special = (pool_module._Keyed, pool_module._OwnLists)   # the special handles' entries
    used = {k for k, v in pool._arena.free.items() if not isinstance(v, special)}
    assert used == {_stream_order.SYNC} and set(fixed._state.free) == {_stream_order.SYNC}


def test_adaptor_methods_documented_on_the_class():
    for cls in (PoolResource, StatisticsResource, LimitingResource, TrackingResource,
                LoggingResource, FailureCallbackResource, AlignedResource, PrefetchResource,
                BinningResource, FixedSizeResource, CallbackResource):
        for name in ("allocate", "deallocate", "allocate_async", "deallocate_async"):
            assert inspect.getdoc(getattr(cls, name))   # a slot, documented as help() shows
        assert cls.__doc__


@pytest.mark.parametrize("make", [
    lambda up: FixedSizeResource(up, block_size=512, blocks_to_preallocate=2),
    lambda up: BinningResource(up, bins=[512])], ids=["fixed-size", "binning"])
@pytest.mark.parametrize("stream", [None, 0])
def test_a_free_with_an_alignment_never_given_out_is_refused(make, stream):
    """Blocks come with an alignment of 256 at most: a free that claims 512 is a wrong
    argument, refused before anything changes (the block stays live and frees normally)."""
    r = make(AddressSpaceResource())
    p = r.allocate(300) if stream is None else r.allocate_async(300, 256, stream)
    with pytest.raises(ValueError, match="alignment=512"):
        if stream is None:
            r.deallocate(p, 300, 512)
        else:
            r.deallocate_async(p, 300, 512, stream)
    if stream is None:
        r.deallocate(p, 300, 256)
    else:
        r.deallocate_async(p, 300, 256, stream)
    with pytest.raises(ValueError, match="already deallocated|not a live"):
        r.deallocate(p, 300)


@pytest.mark.parametrize("make", [TrackingResource, lambda up: BinningResource(up, bins=[66]),
                                  lambda up: BinningResource(up, bins=[8]),
                                  lambda up: AlignedResource(PoolResource(up), 1024)],
                         ids=["tracking", "binning-bins", "binning-upstream", "aligned"])
def test_two_threads_freeing_the_same_pointers_free_each_once(make):
    """The claim of a free is one atomic dict.pop: of two threads freeing the same pointers,
    exactly one frees each, the other gets ValueError, and the upstream sees each free once."""
    up = AddressSpaceResource()
    tr = make(up)
    ptrs = [tr.allocate(64 + i % 7) for i in range(3000)]
    sizes = {p: 64 + i % 7 for i, p in enumerate(ptrs)}
    freed, refused = [], []

    def free_all():
        for p in ptrs:
            try:
                tr.deallocate(p, sizes[p])
                freed.append(p)
            except ValueError:
                refused.append(p)

    threads = [threading.Thread(target=free_all) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(freed) == sorted(ptrs) and sorted(refused) == sorted(ptrs)
    if isinstance(tr, TrackingResource):
        assert tr.outstanding() == {}
    elif isinstance(tr, BinningResource):
        assert tr.allocation_count() == 0
    under = tr.upstream_resource()
    for r in (tr, getattr(under, "resource", under)):
        if hasattr(r, "release"):
            r.release()
    assert up.outstanding == 0


def test_resources_and_adaptors_share_one_set_of_argument_checks():
    """``_checks`` is the one home of the argument checks: the resources' and the adaptors'
    modules use its functions, and ``check_args`` returns the checked pair for both (with the
    resource's largest alignment where it has one)."""
    from hipmr_ctypes import _checks
    from hipmr_ctypes.adaptors import _base, limiting, statistics_resource, tracking
    from hipmr_ctypes.resources import _common, device_memory, host

    class Index:  # an integer-like (numpy's, for one)
        def __index__(self):
            return 512

    assert _checks.check_args(Index(), Index()) == (512, 512)
    assert _checks.check_free_args(Index(), 0, 1) == (512, 0, 1)
    with pytest.raises(ValueError, match="larger than 256"):
        _checks.check_args(8, 512, 256)
    for module in (_common, device_memory, host, limiting, statistics_resource, tracking):
        assert getattr(module, "check_args", _checks.check_args) is _checks.check_args
    assert not hasattr(_base, "check_args") and not hasattr(_base, "MAX_PTR")

"""``resource_ref.upstream_chain``: the one walk down ``upstream_resource()`` (Buffer's device
and memory kind, ``export_ipc``, the plot's pool, the Dask plugin), with no depth limit."""
import ctypes

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes._memory_query import memory_device, memory_kind
from hipmr_ctypes.resource_refs import upstream_chain


class Layer:
    """A user's adaptor: only ``upstream_resource()``."""

    def __init__(self, upstream=None):
        self.upstream = upstream

    def upstream_resource(self):
        if self.upstream is None:
            raise LookupError("the bottom of the stack")  # ends the walk, as no method does
        return self.upstream

    def allocate(self, bytes, alignment=256):   # a resource, so that a ref can name it
        raise AssertionError("never called")

    def deallocate(self, ptr, bytes, alignment=256):
        raise AssertionError("never called")


def test_the_chain_is_the_resource_then_each_upstream_in_order():
    bottom = Layer()
    middle = Layer(bottom)
    top = Layer(middle)
    assert list(upstream_chain(top)) == [top, middle, bottom]
    assert list(upstream_chain(bottom)) == [bottom]
    assert list(upstream_chain(object)) == [object]   # no upstream_resource at all


def test_a_stack_deeper_than_any_old_limit_is_walked_to_the_bottom():
    bottom = Layer()
    bottom.device = 3
    top = bottom
    for _ in range(10_000):   # the old walks stopped at 64; recursion would stop near 1,000
        top = Layer(top)
    chain = list(upstream_chain(top))
    assert len(chain) == 10_001 and chain[-1] is bottom and chain[0] is top
    assert memory_device(top) == 3


def test_refs_are_looked_through_to_their_resource(emulator):
    pool = hmr.PoolResource(hmr.DeviceMemoryResource(), initial_pool_size=1 << 16)
    stats = hmr.StatisticsResource(hmr.async_resource_ref[hmr.device_accessible](pool))
    top = hmr.async_resource_ref[hmr.device_accessible](stats)
    chain = list(upstream_chain(top))
    assert chain[:2] == [stats, pool]
    assert not any(isinstance(found, hmr.resource_ref) for found in chain)
    assert type(chain[-1]) is hmr.DeviceMemoryResource


@pytest.mark.parametrize("length", [1, 2, 5])
def test_a_cycle_raises_a_value_error_naming_the_caller(length):
    loop = [Layer() for _ in range(length)]
    for a, b in zip(loop, loop[1:] + loop[:1]):
        a.upstream = hmr.resource_ref(b) if length > 1 else b
    walk = upstream_chain(Layer(loop[0]), "my_walk")
    seen = [next(walk) for _ in range(length + 1)]   # every resource once, the top first
    assert len({id(s) for s in seen}) == length + 1
    with pytest.raises(ValueError, match=rf"my_walk: the resource stack has a cycle: Layer is "
                                         rf"reached again after {length + 1} upstream"):
        next(walk)


def test_a_cycle_is_never_a_silent_answer_of_the_walks_that_use_it(emulator):
    loop = Layer()
    loop.upstream = loop
    with pytest.raises(ValueError, match="cycle"):
        memory_device(loop)
    loop.properties = (hmr.device_accessible, hmr.host_accessible)
    with pytest.raises(ValueError, match="cycle"):
        memory_kind(loop, 0, False)
    from hipmr_ctypes.plot import record
    with pytest.raises(ValueError, match="cycle"):
        record(loop)


def test_an_upstream_that_raises_ends_the_chain():
    class Broken:
        def upstream_resource(self):
            raise RuntimeError("a user's method")

    top = Layer(Broken())
    assert [type(found) for found in upstream_chain(top)] == [Layer, Broken]


def test_the_memory_kind_comes_from_a_resource_below_adaptors(emulator):
    stack = hmr.StatisticsResource(hmr.TrackingResource(hmr.ManagedMemoryResource()))
    with hmr.Buffer(64, resource=stack) as buf:
        assert memory_kind(stack, buf.ptr, False) == "managed" == buf._memory_kind()
    stack = hmr.LimitingResource(hmr.PinnedMemoryResource(), 1 << 20)
    with hmr.Buffer(64, resource=stack) as buf:
        assert memory_kind(stack, buf.ptr, False) == "pinned" == buf._memory_kind()


class _Undeclared:
    """A user's resource over another that says nothing of its memory: the runtime answers."""

    properties = (hmr.device_accessible, hmr.host_accessible)

    def __init__(self, upstream):
        self._up = upstream

    def allocate(self, bytes, alignment=256):
        return self._up.allocate(bytes, alignment)

    def deallocate(self, ptr, bytes, alignment=256):
        self._up.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes, alignment, stream):
        return self._up.allocate(bytes, alignment)

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self._up.deallocate(ptr, bytes, alignment)

    def __eq__(self, other):
        return other is self

    __hash__ = object.__hash__


@pytest.mark.gpu
def test_memory_queries_on_real_memory(gpu_runtime):
    from hipmr_ctypes._memory_query import pointer_device, pointer_kind
    device = hmr.get_device()
    with hmr.Buffer(256, resource=hmr.AsyncMemoryResource(device)) as pool_memory:
        assert pointer_kind(pool_memory.ptr) == ("device", device)
        assert pointer_device(pool_memory.ptr) == device
        assert memory_kind(pool_memory.resource, pool_memory.ptr, False) == "device"
    for resource, kind in ((hmr.PinnedMemoryResource(), "pinned"),
                           (hmr.ManagedMemoryResource(), "managed")):
        with hmr.Buffer(256, resource=hmr.StatisticsResource(resource)) as buf:
            assert buf._memory_kind() == kind
            assert pointer_kind(buf.ptr)[0] == kind and pointer_device(buf.ptr) is None
        with hmr.Buffer(256, resource=_Undeclared(resource)) as buf:   # the runtime says
            assert buf._memory_kind() == kind
    host = bytearray(64)
    address = ctypes.addressof((ctypes.c_char * 64).from_buffer(host))
    assert pointer_kind(address) == (None, None) and pointer_device(address) is None
    assert pointer_kind(0) == (None, None)

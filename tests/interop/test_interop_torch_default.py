"""What ``interop.torch`` allocates from when it is given no resource
(``hipmr_ctypes.interop.torch_default``): a VirtualPoolResource per device where the device has
virtual memory, the per-device resource where the user chose one or where it has none (with a
warning naming why).  The callbacks are called through their C function pointers, as PyTorch
calls them; any PyTorch build will do."""
import ctypes
import gc
import os

import pytest

try:
    import torch  # noqa: F401
except ImportError:
    if os.environ.get("HIPMR_REQUIRE_TORCH") == "1":
        raise
    pytest.skip("PyTorch is not installed (pip install torch==2.13.0: the CPU build will do)",
                allow_module_level=True)

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes.interop import torch as ht  # noqa: E402
from hipmr_ctypes.interop import torch_default  # noqa: E402
from support import AddressSpaceResource, process_runtime  # noqa: E402


def _c(alloc):
    return ht.ALLOC_FN(alloc.alloc_address), ht.FREE_FN(alloc.free_address)


@pytest.fixture
def fresh(emulator, monkeypatch):
    """No per-device resource, no default pool made yet, HIPMR_DEVICE_RESOURCE unset; the
    pools made here are closed afterwards."""
    monkeypatch.delenv("HIPMR_DEVICE_RESOURCE", raising=False)
    saved = (dict(torch_default._pools), dict(torch_default._problems))
    with process_runtime():
        torch_default._pools.clear()
        torch_default._problems.clear()
        torch_default.cache.clear()
        yield emulator
        made = list(torch_default._pools.values())
        torch_default._pools.clear()
        torch_default._problems.clear()
        torch_default.cache.clear()
        for pool in made:
            pool._space.close()
    torch_default._pools.update(saved[0])
    torch_default._problems.update(saved[1])
    gc.collect()


def test_a_virtual_pool_per_device_by_default(fresh):
    alloc = ht.allocator()
    assert alloc.resource is None
    c_alloc, c_free = _c(alloc)
    a = c_alloc(3 << 20, 0, 0)
    pool = torch_default.default_resource(0)
    assert isinstance(pool, hmr.VirtualPoolResource) and pool.device == 0
    assert torch_default._pools == {0: pool} and torch_default.problem(0) is None
    assert pool._space.base <= a < pool._space.base + pool.reserved_bytes
    b = c_alloc(1000, 0, 0)                   # the same pool, found in the cache
    assert pool._space.base <= b < pool._space.base + pool.reserved_bytes
    assert pool.allocation_count() == 2
    c_free(a, 3 << 20, 0, 0)
    c_free(b, 1000, 0, 0)
    assert pool.allocation_count() == 0 and alloc.failures == 0
    assert not hmr.resources.per_device._resources   # the per-device table was not touched


def test_a_resource_the_user_chose_wins(fresh, monkeypatch):
    alloc = ht.allocator()
    c_alloc, c_free = _c(alloc)
    a = c_alloc(4096, 0, 0)                   # the pool first
    chosen = AddressSpaceResource()
    hmr.set_current_device_resource(chosen)
    b = c_alloc(4096, 0, 0)                   # seen at the next allocation
    assert b in chosen.live
    c_free(a, 4096, 0, 0)                     # each freed where it came from
    c_free(b, 4096, 0, 0)
    assert chosen.live == {} and torch_default._pools[0].allocation_count() == 0


def test_the_environment_names_the_per_device_resource(fresh, monkeypatch):
    monkeypatch.setenv("HIPMR_DEVICE_RESOURCE", "async")
    assert isinstance(torch_default.default_resource(0), hmr.AsyncMemoryResource)
    assert torch_default._pools == {}
    monkeypatch.setenv("HIPMR_DEVICE_RESOURCE", "virtual_pool,pool=:64MiB")
    hmr.resources.per_device._resources.clear()
    made = torch_default.default_resource(0)
    assert isinstance(made, hmr.VirtualPoolResource) and made.maximum_pool_size == 64 << 20
    made._space.close()


def test_without_virtual_memory_the_per_device_resource_with_a_warning(fresh, monkeypatch):
    monkeypatch.setattr(fresh._vspace, "supported", False)
    alloc = ht.allocator()
    c_alloc, c_free = _c(alloc)
    with pytest.warns(RuntimeWarning, match="device 0 has no virtual memory"):
        a = c_alloc(4096, 0, 0)
    assert a and alloc.failures == 0
    assert "NotSupportedError" in torch_default.problem(0)
    assert isinstance(torch_default.default_resource(0), hmr.DeviceMemoryResource)
    c_free(a, 4096, 0, 0)


def test_a_warning_turned_into_an_error_does_not_refuse_the_allocation(fresh, monkeypatch):
    import warnings
    monkeypatch.setattr(fresh._vspace, "supported", False)
    c_alloc, c_free = _c(ht.allocator())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = c_alloc(4096, 0, 0)
    assert a
    c_free(a, 4096, 0, 0)
    assert ctypes.c_void_p(a).value == a

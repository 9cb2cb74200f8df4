"""AsyncPinnedMemoryResource / AsyncManagedMemoryResource: stream-ordered pools located on the
host or of managed memory, where the runtime has them."""
import ctypes
import pickle

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._memory_query import pointer_kind
from hipmr_ctypes.resources import async_host

from support import process_runtime


@pytest.fixture
def hip72(emulator):
    """An emulated HIP 7.2 runtime (the first with pools located on the host), current."""
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_VERSION": "7.2.0"})
    with process_runtime(rt):
        yield rt


def test_before_hip_7_2_there_is_no_host_pool(emulator):
    emulator.inject_failure(999, calls="hipMemPoolCreate")
    with pytest.raises(hmr.NotSupportedError, match="HIP 7.2") as info:
        hmr.AsyncPinnedMemoryResource()
    assert "PoolResource(PinnedMemoryResource())" in str(info.value)
    with pytest.raises(hmr.NotSupportedError, match="hipMemAllocationTypeManaged"):
        hmr.AsyncManagedMemoryResource()
    assert emulator.pending_faults() == 1   # no pool was asked for


def test_a_pinned_pool_on_the_host(hip72, monkeypatch):
    created = []
    real = hip72.fn.hipMemPoolCreate
    monkeypatch.setattr(hip72.fn, "hipMemPoolCreate", lambda out, props: created.append(
        (props.allocType, props.location.type, props.handleTypes)) or real(out, props))
    free_before = hmr.Device(0).memory_info()[0]
    mr = hmr.AsyncPinnedMemoryResource(initial_pool_size=1 << 20)
    assert created == [(1, 2, 0)]                  # pinned, located on the host
    assert hmr.has_property(mr, hmr.host_accessible)
    assert hmr.has_property(mr, hmr.device_accessible)
    assert mr.pool.reserved >= 1 << 20 and mr.pool.owned
    with hmr.Stream() as s:
        p = mr.allocate_async(4096, 256, s)
        ctypes.memset(p, 7, 4096)                  # the host writes it directly
        assert pointer_kind(p)[0] == "pinned"
        buf = hmr.Buffer.from_handle(p, 4096)
        assert buf.tobytes() == b"\x07" * 4096
        buf.close()
        mr.deallocate_async(p, 4096, 256, s)
        s.synchronize()
    assert hmr.Device(0).memory_info()[0] == free_before   # host memory, not the device's
    buf = hmr.Buffer(100, resource=mr)
    assert buf._memory_kind() == "pinned"
    buf.close()
    mr.pool.release_threshold = 0
    assert mr == mr and mr != hmr.AsyncPinnedMemoryResource()
    assert type(pickle.loads(pickle.dumps(mr))) is hmr.AsyncPinnedMemoryResource
    assert repr(mr).startswith("AsyncPinnedMemoryResource(device=0")
    mr.close()
    assert hip72.emulator.live_allocations().count == 0


def test_a_host_pool_exports_its_handle(hip72):
    mr = hmr.AsyncPinnedMemoryResource(enable_ipc=True)
    with mr.pool.export_handle() as handle:
        assert handle.device == 0
    mr.close()


def test_a_host_pool_is_no_devices_current_pool(hip72):
    mr = hmr.AsyncPinnedMemoryResource()
    assert hip72.fn.hipDeviceSetMemPool(0, mr.pool.handle) == 1
    hip72.clear_last_error()
    mr.close()


def test_bad_arguments_are_refused_before_the_pool(hip72):
    hip72.emulator.inject_failure(999, calls="hipMemPoolCreate")
    with pytest.raises(ValueError):
        hmr.AsyncPinnedMemoryResource(maximum_pool_size=0)
    with pytest.raises(TypeError):
        hmr.AsyncPinnedMemoryResource(enable_ipc=1)
    assert hip72.emulator.pending_faults() == 1


@pytest.mark.parametrize("platform, version, pinned, managed", [
    ("nvidia", (12, 9, 0), False, False),
    ("nvidia", (13, 0, 0), True, True),
    ("amd", (6, 4, 3), False, False),
    ("amd", (7, 2, 0), True, False),
])
def test_where_each_pool_exists(platform, version, pinned, managed):
    class Runtime:
        def __init__(self):
            self.platform = platform

        def runtime_version(self):
            return version
    for since, expected in ((async_host.HOST_POOLS_SINCE, pinned), (None, managed)):
        if expected:
            async_host._require(Runtime(), "x", since)
        else:
            with pytest.raises(hmr.NotSupportedError):
                async_host._require(Runtime(), "x", since)


@pytest.mark.gpu
def test_host_and_managed_pools_on_a_gpu(gpu_runtime):
    for cls in (hmr.AsyncPinnedMemoryResource, hmr.AsyncManagedMemoryResource):
        try:
            mr = cls()
        except hmr.NotSupportedError:
            version = tuple(gpu_runtime.runtime_version())
            assert gpu_runtime.platform != "nvidia" or version < (13, 0, 0), cls
            continue
        with hmr.Stream() as s:
            buf = hmr.Buffer(1 << 20, resource=mr, stream=s)
            buf.fill(0x5A, stream=s)
            assert buf.tobytes(stream=s) == b"\x5a" * (1 << 20)
            buf.close()
        mr.close()

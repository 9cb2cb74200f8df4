"""The memory pool's own policies: its maximum size at creation (hipMemPoolProps.maxSize) and
the three reuse policies (hipMemPoolReuse*), on the emulator and (``gpu``) on a real GPU."""
import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip

from support import process_runtime

MiB = 1 << 20
POLICIES = ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
            "reuse_allow_internal_dependencies")


def _reused_across_streams(mr, first, second, synchronize=False):
    """Free a block on ``first``, allocate the same size on ``second`` (with ``synchronize``,
    after the host synchronized with ``first``): was the block reused?"""
    a = mr.allocate_async(MiB, 256, first)
    mr.deallocate_async(a, MiB, 256, first)
    if synchronize:
        first.synchronize()
    b = mr.allocate_async(MiB, 256, second)
    mr.deallocate_async(b, MiB, 256, second)
    second.synchronize()
    first.synchronize()
    return a == b


def _fresh(**policies):
    """A new pool (one freed block at a time: no other block to choose) with ``policies``."""
    mr = hmr.AsyncMemoryResource()
    for name, value in policies.items():
        setattr(mr.pool, name, value)
    return mr


def test_policies_read_and_set():
    with hmr.AsyncMemoryResource() as mr:
        pool = mr.pool
        for name in POLICIES:
            assert getattr(pool, name) is True          # every runtime's default
            setattr(pool, name, False)
            assert getattr(pool, name) is False
            setattr(pool, name, True)
            assert getattr(pool, name) is True
            for bad in (1, None, "yes"):
                with pytest.raises(TypeError, match=name):
                    setattr(pool, name, bad)
            assert getattr(pool, name) is True          # a refused value changed nothing
    with pytest.raises(ValueError, match="closed"):
        mr.pool.reuse_allow_opportunistic


def test_policies_change_reuse_across_streams(emulator):
    off = {name: False for name in POLICIES}
    with hmr.Stream() as s1, hmr.Stream() as s2:
        with _fresh() as mr:
            assert _reused_across_streams(mr, s1, s2)
        with _fresh(**off) as mr:
            assert not _reused_across_streams(mr, s1, s2)
        with _fresh(**off) as mr:
            # a free the host synchronized with serves any stream, whatever the policies
            assert _reused_across_streams(mr, s1, s2, synchronize=True)
        with _fresh(**dict(off, reuse_allow_opportunistic=True)) as mr:
            assert _reused_across_streams(mr, s1, s2)
        with _fresh(**dict(off, reuse_allow_internal_dependencies=True)) as mr:
            assert _reused_across_streams(mr, s1, s2)
        with _fresh(**dict(off, reuse_allow_opportunistic=True)) as mr:
            # opportunistic reuse takes only frees whose work is done
            a = mr.allocate_async(MiB, 256, s1)
            emulator.set_stream_busy(s1.handle, 1000)
            mr.deallocate_async(a, MiB, 256, s1)
            b = mr.allocate_async(MiB, 256, s2)
            assert a != b
            mr.deallocate_async(b, MiB, 256, s2)
            s1.synchronize()
        with _fresh(**off) as mr:
            # the same stream always reuses its own frees
            c = mr.allocate_async(MiB, 256, s1)
            mr.deallocate_async(c, MiB, 256, s1)
            assert mr.allocate_async(MiB, 256, s1) == c


def test_maximum_pool_size_stops_the_pool(emulator):
    with hmr.AsyncMemoryResource(maximum_pool_size="4MiB") as mr:
        assert mr.pool.max_size == 4 * MiB
        assert "maximum_pool_size=4194304" in repr(mr)
        first = hmr.Buffer(3 * MiB, resource=mr)
        with pytest.raises(hmr.OutOfMemoryError):
            hmr.Buffer(2 * MiB, resource=mr)
        first.close()
        hmr.Buffer(4 * MiB, resource=mr).close()       # room again once freed
    with hmr.AsyncMemoryResource() as mr:
        assert mr.pool.max_size is None
    total = hmr.Device().memory_info()[1]
    with hmr.AsyncMemoryResource(maximum_pool_size="10%") as mr:
        assert mr.pool.max_size == total // 10 // 256 * 256


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(maximum_pool_size=-1), ValueError, "maximum_pool_size=-1 is negative"),
    (dict(maximum_pool_size="2k"), ValueError, "maximum_pool_size: Could not parse"),
    (dict(maximum_pool_size=b"1"), TypeError, "maximum_pool_size"),
    (dict(maximum_pool_size=0), ValueError, "room for one allocation"),
    (dict(maximum_pool_size=1.5), ValueError, "fraction"),
    (dict(initial_pool_size="4MiB", maximum_pool_size="2MiB"), ValueError,
     "initial_pool_size='4MiB' is larger than maximum_pool_size='2MiB'"),
])
def test_bad_maximum_is_refused_before_any_pool_is_made(kwargs, error, match, emulator):
    before = emulator.live_allocations() if hasattr(emulator, "live_allocations") else None
    with pytest.raises(error, match=match):
        hmr.AsyncMemoryResource(**kwargs)
    if before is not None:
        assert emulator.live_allocations() == before


@pytest.mark.parametrize("version, supported", [("6.1.0", False), ("6.2.0", True),
                                                 ("7.0.0", True)])
def test_maximum_needs_rocm_6_2(version, supported, emulator, monkeypatch):
    from hipmr_ctypes.resources import async_memory
    # before 6.2 pools need HIP_MEM_POOL_SUPPORT=1 (which the emulator does not read): let
    # the pool be made, so that the maximum's own check is what answers
    monkeypatch.setattr(async_memory, "_require_pools", lambda device: None)
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_VERSION": version})
    with process_runtime(rt):
        if supported:
            with hmr.AsyncMemoryResource(maximum_pool_size="1MiB") as mr:
                assert mr.pool.max_size == MiB
        else:
            with pytest.raises(hmr.NotSupportedError, match="ROCm 6.2 or later"):
                hmr.AsyncMemoryResource(maximum_pool_size="1MiB")
            with hmr.AsyncMemoryResource() as mr:      # no maximum: fine before 6.2
                assert mr.pool.max_size is None


@pytest.mark.gpu
def test_policies_and_maximum_on_a_gpu(gpu_runtime):
    with hmr.AsyncMemoryResource(maximum_pool_size="64MiB") as mr:
        assert mr.pool.max_size == 64 * MiB
        keep = hmr.Buffer(48 * MiB, resource=mr)
        with pytest.raises(hmr.OutOfMemoryError):
            hmr.Buffer(32 * MiB, resource=mr)
        keep.close()
        hmr.Buffer(60 * MiB, resource=mr).close()
    with hmr.Stream() as s1, hmr.Stream() as s2:
        with _fresh() as mr:
            assert _reused_across_streams(mr, s1, s2, synchronize=True)
        with _fresh(**{name: False for name in POLICIES}) as mr:
            for name in POLICIES:
                assert getattr(mr.pool, name) is False
            assert not _reused_across_streams(mr, s1, s2)
            # CUDA's rule: a free the host synchronized with serves any stream
            assert _reused_across_streams(mr, s1, s2, synchronize=True)

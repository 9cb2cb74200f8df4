"""One spelling per kind of thing (docs/model.md, "Names"), and the earlier spellings still work."""
import hipmr_ctypes as hmr
from hipmr_ctypes.stream_refs import IntValue


def test_stream_and_ref_read_device_and_priority_alike(emulator):
    with hmr.Stream(priority=-1) as s:
        ref = s.ref
        assert ref.device == s.device == 0 and s.ref.device == 0
        assert ref.device() == s.device() == 0
        assert ref.priority == s.priority == s.priority() == ref.priority()
        assert type(ref.device() ) is int and type(s.priority()) is int
        assert isinstance(s.device, int) and s.device + 1 == 1
        assert hmr.stream_ref(0).device == 0
    with hmr.Event() as e:
        assert e.device == e.device() == 0


def test_int_value_behaves_as_an_int():
    v = IntValue(7)
    assert v == 7 and v() == 7 and hash(v) == hash(7) and repr(v) == "7"
    assert {v: 1}[7] == 1 and v + 1 == 8 and f"{v:#x}" == "0x7"
    import json
    import pickle
    assert json.dumps({"d": v}) == '{"d": 7}'
    assert pickle.loads(pickle.dumps(v)) == 7


def test_pool_sizes_read_as_rmm_names_and_the_earlier_ones(emulator):
    pool = hmr.PoolResource(hmr.AsyncMemoryResource(), initial_pool_size=1 << 20)
    p = pool.allocate(1000)
    assert pool.get_allocated_bytes() == 1024
    assert not hasattr(pool, "allocated_bytes")  # one name: the earlier alias is gone
    assert pool.peak_pool_size == pool.peak_pool_size() == pool.pool_size() == 1 << 20
    assert pool.allocation_count() == 1
    pool.deallocate(p, 1000)
    assert pool.get_allocated_bytes() == 0
    pool.release()
    tracked = hmr.TrackingResource(hmr.HostMemoryResource())
    limited = hmr.LimitingResource(hmr.HostMemoryResource(), 1 << 20)
    for adaptor in (tracked, limited):
        q = adaptor.allocate(100)
        assert adaptor.get_allocated_bytes() >= 100
        adaptor.deallocate(q, 100)

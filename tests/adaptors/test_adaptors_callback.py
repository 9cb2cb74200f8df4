"""CallbackResource: a resource made of plain functions."""

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import device_accessible
from hipmr_ctypes.adaptors import CallbackResource, PoolResource

from support import AddressSpaceResource


def test_callback_resource_sync_and_async():
    up = AddressSpaceResource()
    log = []

    def alloc(n, a):
        log.append(("a", n, a))
        return up.allocate(n, a)

    def dealloc(p, n, a):
        log.append(("d", n, a))
        up.deallocate(p, n, a)

    sync = CallbackResource(alloc, dealloc, properties=(device_accessible,))
    assert hmr.is_resource_with(sync, device_accessible)
    assert not hmr.is_async_resource(sync)
    p = sync.allocate(100)
    sync.deallocate(p, 100)
    assert log == [("a", 100, 256), ("d", 100, 256)]
    streams = []
    full = CallbackResource(alloc, dealloc,
                            lambda n, a, s: streams.append(s) or up.allocate(n, a),
                            lambda p, n, a, s: streams.append(s) or up.deallocate(p, n, a))
    assert hmr.is_async_resource(full)
    q = full.allocate_async(64, 256, hmr.stream_ref(7))
    full.deallocate_async(q, 64, 256, 7)
    assert streams == [7, 7]                     # streams arrive as int handles
    assert full == CallbackResource(*full.functions) and full != sync
    pool = PoolResource(sync)                    # usable as an upstream
    r = pool.allocate(10)
    pool.deallocate(r, 10)


def test_callback_result_must_be_an_address():
    cb = CallbackResource(lambda n, a: "nope", lambda p, n, a: None)
    with pytest.raises(TypeError, match="pointer returned"):
        cb.allocate(10)

"""LimitingResource: exact counts, refusal past the limit, the reservation given back
when the upstream fails."""

import pytest

from hipmr_ctypes import OutOfMemoryError
from hipmr_ctypes.adaptors import LimitingResource

from support import AddressSpaceResource


def test_limiting_counts_exactly_and_refuses_past_the_limit():
    up = AddressSpaceResource()
    lim = LimitingResource(up, 1000)
    a = lim.allocate(600)
    b = lim.allocate_async(400, 256, 0)
    assert lim.get_allocated_bytes() == 1000 and lim.get_allocation_limit() == lim.limit == 1000
    calls = up.calls
    with pytest.raises(OutOfMemoryError, match="1000 of the limit 1000") as info:
        lim.allocate(1)
    assert isinstance(info.value, MemoryError) and info.value.size == 1
    assert up.calls == calls and lim.get_allocated_bytes() == 1000
    lim.deallocate(a, 600)
    c = lim.allocate(600)
    lim.deallocate(c, 600)
    lim.deallocate_async(b, 400, 256, 0)
    assert lim.get_allocated_bytes() == 0


def test_limiting_calls_an_impossible_size_a_bad_argument():
    lim = LimitingResource(AddressSpaceResource(), 1000)
    with pytest.raises(ValueError, match="bytes"):
        lim.allocate((1 << 64) + 1)
    assert lim.get_allocated_bytes() == 0


def test_limiting_gives_the_reservation_back_when_the_upstream_fails():
    lim = LimitingResource(AddressSpaceResource(capacity=500), 1000)
    with pytest.raises(OutOfMemoryError, match="capacity"):
        lim.allocate(800)
    assert lim.get_allocated_bytes() == 0

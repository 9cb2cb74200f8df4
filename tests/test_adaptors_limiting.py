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


class _TrustedRecorder(AddressSpaceResource):
    """An upstream the adaptors trust to check its own arguments (as the package's own
    resources do): the hot paths then leave those checks to it.  It records what the
    limiting adaptor shows while each allocation is in its hands."""

    _checks_arguments = True

    def __init__(self) -> None:
        super().__init__()
        self.seen = []
        self.lim = None

    def _allocate(self, bytes, alignment, stream):
        self.seen.append(self.lim.get_allocated_bytes())
        if bytes < 0:
            raise ValueError("bytes is negative")
        return super()._allocate(bytes, alignment, stream)


@pytest.mark.parametrize("call", ["allocate", "allocate_async"])
def test_a_negative_size_is_refused_before_anything_is_reserved(call):
    """Over an upstream that checks its own arguments, a negative size must still never
    reach the reservation: for as long as the upstream held it, the bytes in use would have
    been lowered, letting another thread's allocation pass the limit."""
    up = _TrustedRecorder()
    lim = up.lim = LimitingResource(up, 1000)
    p = lim.allocate(1000)
    args = (-600,) if call == "allocate" else (-600, 256, 0)
    with pytest.raises(ValueError, match="negative"):
        getattr(lim, call)(*args)
    assert up.seen == [1000] and lim.get_allocated_bytes() == 1000  # not called for it
    with pytest.raises(OutOfMemoryError):
        lim.allocate(1)
    lim.deallocate(p, 1000)
    assert lim.get_allocated_bytes() == 0


@pytest.mark.parametrize("bad, error", [
    ((-1, 256), ValueError), ((1.5, 256), TypeError), ((True, 256), TypeError),
    ((16, 3), ValueError), ((16, 1.0), TypeError), ((1 << 64, 256), ValueError)])
@pytest.mark.parametrize("make", ["statistics", "limiting", "tracking"])
def test_bad_allocations_over_a_user_upstream_never_reach_it(make, bad, error):
    """Over a user-written upstream every argument is checked first, on every path: the
    upstream is never called and the adaptor's state is unchanged."""
    from hipmr_ctypes.adaptors import StatisticsResource, TrackingResource
    up = AddressSpaceResource()
    r = {"statistics": lambda: StatisticsResource(up),
         "limiting": lambda: LimitingResource(up, 1 << 40),
         "tracking": lambda: TrackingResource(up)}[make]()

    def state():
        if make == "statistics":
            return r.statistics
        return r.get_allocated_bytes()

    before = state()
    with pytest.raises(error):
        r.allocate(*bad)
    with pytest.raises(error):
        r.allocate_async(*bad, 0)
    p = r.allocate(64)
    calls = up.calls
    with pytest.raises(error):
        r.deallocate(p, *bad)
    with pytest.raises(error):
        r.deallocate_async(p, *bad, 0)
    with pytest.raises((TypeError, ValueError)):
        r.deallocate(-p, 64)
    assert up.calls == calls
    r.deallocate(p, 64)
    assert state() == (before if make != "statistics"
                       else type(before)(0, 0, 64, 1, 64, 1))

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


def test_a_free_is_a_credit_the_next_allocations_use_exactly():
    """A freed size is taken by the next allocation it covers (the rest stays for later ones):
    the bytes in use stay exact, the limit is reached exactly and not passed."""
    up = AddressSpaceResource()
    lim = LimitingResource(up, 1000)
    a = lim.allocate(600)
    b = lim.allocate_async(400, 256, 0)
    lim.deallocate(a, 600)
    c = lim.allocate_async(100, 256, 0)    # from the 600 freed: 500 left
    assert lim.get_allocated_bytes() == 500
    d = lim.allocate(500)
    e = lim.allocate(0)
    assert lim.get_allocated_bytes() == 1000
    with pytest.raises(OutOfMemoryError, match="1000 of the limit 1000"):
        lim.allocate_async(1, 256, 0)
    lim.deallocate_async(c, 100, 256, 0)
    with pytest.raises(OutOfMemoryError, match="900 of the limit 1000"):
        lim.allocate(101)                 # more than the 100 freed: refused, the credit kept
    f = lim.allocate(100)
    for p, n in ((b, 400), (d, 500), (e, 0), (f, 100)):
        lim.deallocate(p, n)
    assert lim.get_allocated_bytes() == 0 and up.outstanding == 0
    g = lim.allocate(1000)
    lim.deallocate(g, 1000)


@pytest.mark.parametrize("call", ["allocate", "allocate_async"])
def test_a_credit_used_by_a_failed_allocation_is_given_back(call):
    up = AddressSpaceResource()
    lim = LimitingResource(up, 1000)
    lim.deallocate(lim.allocate(600), 600)
    up.capacity = 100
    args = (500,) if call == "allocate" else (500, 256, 0)
    with pytest.raises(OutOfMemoryError, match="capacity"):
        getattr(lim, call)(*args)
    assert lim.get_allocated_bytes() == 0
    up.capacity = None
    lim.deallocate(lim.allocate(1000), 1000)


class _Watermark(AddressSpaceResource):
    """A trusted upstream that records the most bytes ever outstanding at once."""

    _checks_arguments = True

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def _allocate(self, bytes, alignment, stream):
        ptr = super()._allocate(bytes, alignment, stream)
        with self._lock:
            self.most = max(self.most, self.outstanding)
        return ptr


def test_threads_trading_credits_never_pass_the_limit():
    """Eight threads allocate and free sizes of every kind at once (credits taken whole, in
    part, or not at all): the upstream never holds more than the limit, nothing is lost, and
    the whole limit is available again at the end."""
    import random
    import threading
    up = _Watermark()
    limit = 4096
    lim = LimitingResource(up, limit)
    refused = [0]
    errors = []

    def work(seed):
        rng = random.Random(seed)
        held = []
        try:
            for _ in range(3000):
                if held and (len(held) > 4 or rng.random() < 0.45):
                    p, n = held.pop(rng.randrange(len(held)))
                    if rng.random() < 0.5:
                        lim.deallocate(p, n)
                    else:
                        lim.deallocate_async(p, n, 256, 0)
                    continue
                n = rng.choice((0, 64, 256, 256, 300, 512, 1000))
                try:
                    p = (lim.allocate(n) if rng.random() < 0.5
                         else lim.allocate_async(n, 256, 0))
                except OutOfMemoryError:
                    refused[0] += 1
                    continue
                held.append((p, n))
            for p, n in held:
                lim.deallocate(p, n)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert 0 < up.most <= limit and refused[0] > 0
    assert lim.get_allocated_bytes() == 0 and up.outstanding == 0
    lim.deallocate(lim.allocate(limit), limit)


def test_a_credit_taken_by_another_allocation_mid_drain_is_no_error():
    """Allocations take credits without the mutex, so a reader or a reservation draining the
    credits under it may find the last one gone between its test and its pop (another
    thread's allocation took it): that is no error, and the limit still holds."""
    from collections import deque

    class Racing(deque):  # the first pop finds the credit taken by "another thread"
        race = False

        def pop(self):
            if self.race:
                self.race = False
                super().pop()   # the other allocation's pop
                raise IndexError("pop from an empty deque")
            return super().pop()

    lim = LimitingResource(AddressSpaceResource(), 4096)
    def deque_cells(fn, seen):  # the cells holding the credits, through every closure
        for cell in fn.__closure__ or ():
            value = cell.cell_contents
            if type(value) is deque and value is not lim._mutex.tokens:
                yield cell
            elif callable(value) and getattr(value, "__closure__", None) and value not in seen:
                seen.append(value)
                yield from deque_cells(value, seen)

    cells = {id(c): c for c in deque_cells(lim._settle, [])}
    assert len(cells) == 1   # the credits, one cell shared by every closure of the resource
    cells = list(cells.values())
    credits = cells[0].cell_contents = Racing()
    a = lim.allocate(1024)
    lim.deallocate(a, 1024)                    # a credit of 1024
    credits.race = True
    assert lim.get_allocated_bytes() == 1024   # its credit went to the other allocation
    b = lim.allocate(1024)                     # takes no credit: reserved under the mutex
    credits.append(1024)                       # the other allocation, freed
    credits.appendleft(512)
    credits.race = True
    c = lim.allocate(2048)                     # drains the credits, losing one race
    assert lim.get_allocated_bytes() <= 4096
    for ptr, n in ((b, 1024), (c, 2048)):
        lim.deallocate(ptr, n)
    with pytest.raises(OutOfMemoryError):
        lim.allocate(8192)

"""Upstreams that misbehave: what can be checked cheaply is checked (on the slow path), refused
with a clear error, and what was taken is given back.

``AddressSpace`` is a user-written upstream (a ``CallbackResource``) that hands out addresses
of a fake address space and records what is live; its ``bad`` hook makes it misbehave."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import CallbackResource, device_accessible

from support import check_pool_tiles

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("misbehaving_cases")


class AddressSpace:
    """A fake address space: 256-aligned addresses from 1 MiB up, never reused unless
    ``bad`` says otherwise; ``live`` maps each live address to its size.  Thread-safe on
    every build: taking the next address (a read and a write of ``next``) is one step under a
    lock, which the GIL alone does not make atomic once it is off."""

    def __init__(self, bad: Optional[Callable[[int, int], Any]] = None) -> None:
        self.next = 1 << 20
        self.live: Dict[int, int] = {}
        self.freed: list = []
        self.bad = bad
        self.lock = threading.Lock()

    def allocate(self, nbytes: int, alignment: int) -> Any:
        if not nbytes:
            return 0
        with self.lock:
            ptr = self.next
            self.next += (nbytes + 4095) & ~4095
        if self.bad is not None:
            forced = self.bad(ptr, nbytes)
            if forced is not None:
                if type(forced) is int and 0 < forced < 1 << 64:
                    self.live.setdefault(forced, nbytes)
                return forced
        self.live[ptr] = nbytes
        return ptr

    def deallocate(self, ptr: int, nbytes: int, alignment: int) -> None:
        if not ptr and not nbytes:
            return
        if self.live.pop(ptr, None) is None:
            raise ValueError(f"AddressSpace: {ptr:#x} is not live")
        self.freed.append(ptr)

    def resource(self, is_async: bool = True) -> CallbackResource:
        if not is_async:
            return CallbackResource(self.allocate, self.deallocate,
                                    properties=(device_accessible,))
        return CallbackResource(self.allocate, self.deallocate,
                                lambda n, a, s: self.allocate(n, a),
                                lambda p, n, a, s: self.deallocate(p, n, a),
                                properties=(device_accessible,))


class Plain:
    """The same address space behind a plain user-written class (not a CallbackResource, which
    checks its functions' results itself): the adaptors' own checks must catch it."""

    properties = (device_accessible,)

    def __init__(self, space: AddressSpace) -> None:
        self.space = space

    def allocate(self, nbytes: int, alignment: int = 256) -> Any:
        return self.space.allocate(nbytes, alignment)

    def deallocate(self, ptr: int, nbytes: int, alignment: int = 256) -> None:
        self.space.deallocate(ptr, nbytes, alignment)

    def allocate_async(self, nbytes: int, alignment: int, stream: Any) -> Any:
        return self.space.allocate(nbytes, alignment)

    def deallocate_async(self, ptr: int, nbytes: int, alignment: int, stream: Any) -> None:
        self.space.deallocate(ptr, nbytes, alignment)

    def __eq__(self, other: object) -> bool:
        return other is self

    __hash__ = object.__hash__


def _repeat_first(first: list) -> Callable[[int, int], Any]:
    """An upstream that hands out its first address again and again."""
    def bad(ptr: int, nbytes: int) -> Any:
        if first:
            return first[0]
        first.append(ptr)
        return None
    return bad


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
def test_a_sub_allocator_refuses_an_address_handed_out_twice(kind):
    space = AddressSpace(_repeat_first([]))
    up = Plain(space)
    r = (hmr.PoolResource(up) if kind == "PoolResource"
         else hmr.FixedSizeResource(up, 1 << 20, 1))
    first = [r.allocate(1 << 20)]          # the first chunk, all of it in use
    with pytest.raises(ValueError, match="overlaps memory the upstream handed out before"):
        r.allocate(1 << 20)                # the upstream hands out the same chunk again
    assert len(set(first)) == 1 and r.allocation_count() == 1
    r.deallocate(first[0], 1 << 20)


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
def test_two_threads_growing_at_once_get_one_address_once(kind):
    """A sub-allocator lets its lock go while its upstream grows it, so two threads can be in
    the upstream at once.  An upstream that gives both the same address (as a test upstream
    whose address cursor had no lock once did, so that one pool block went to two threads)
    gets one of them refused, and no address is handed to two allocations."""
    meeting = threading.Barrier(2)
    armed: list = []

    def both_inside(ptr: int, nbytes: int) -> Any:
        if not armed:
            return None
        meeting.wait(30)        # both threads are in the upstream now
        armed.append(ptr)
        return armed[1]         # the first to get here: one address for both

    space = AddressSpace(both_inside)
    r = (hmr.PoolResource(Plain(space)) if kind == "PoolResource"
         else hmr.FixedSizeResource(Plain(space), 1 << 20, 1))
    held = [r.allocate(1 << 20)] if kind == "FixedSizeResource" else []  # its first chunk
    armed.append(None)
    outcomes: list = []

    def grow() -> None:
        try:
            outcomes.append(r.allocate(1 << 20))
        except ValueError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=grow) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    ptrs = [o for o in outcomes if type(o) is int]
    errors = [o for o in outcomes if isinstance(o, ValueError)]
    assert len(ptrs) == len(errors) == 1, outcomes
    assert "overlaps memory the upstream handed out before" in str(errors[0])
    assert ptrs[0] == armed[1] and r.allocation_count() == len(held) + 1
    if kind == "PoolResource":
        check_pool_tiles(r)
    for p in ptrs + held:
        r.deallocate(p, 1 << 20)
    r.release()
    assert space.live == {}  # the chunk it kept went back once; the refused one was its twin


def _returning_setup(kind: str, fail: bool):
    """A sub-allocator holding one free chunk, and a ``release()`` running in a thread that is
    inside the upstream's free of that chunk until ``go_on`` is set (the free then raises
    when ``fail``)."""
    space = AddressSpace()
    inside, go_on = threading.Event(), threading.Event()
    real_free = space.deallocate

    def slow_free(ptr: int, nbytes: int, alignment: int) -> None:
        inside.set()
        assert go_on.wait(30)
        if fail:
            raise RuntimeError("the upstream could not take it back")
        real_free(ptr, nbytes, alignment)

    r = (hmr.PoolResource(Plain(space), initial_pool_size=1 << 20) if kind == "PoolResource"
         else hmr.FixedSizeResource(Plain(space), 1 << 20, 1))
    r.deallocate(r.allocate(1 << 20), 1 << 20)
    (chunk,) = space.live
    space.deallocate = slow_free  # type: ignore[method-assign]
    errors: list = []

    def release() -> None:
        try:
            r.release()
        except RuntimeError as exc:
            errors.append(exc)
    t = threading.Thread(target=release)
    t.start()
    assert inside.wait(30)
    return space, r, chunk, go_on, t, errors, real_free


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
def test_growth_refuses_a_chunk_on_its_way_back(kind):
    """``release()`` lets the lock go while the upstream takes chunks back; if another thread
    grows the pool meanwhile and the upstream hands out a chunk it has not been asked to take
    back yet, that chunk is refused (it would be one block for two users)."""
    space = AddressSpace()
    waits, go_on = threading.Event(), threading.Event()
    real_free = space.deallocate
    r = (hmr.PoolResource(Plain(space), initial_pool_size=1 << 20) if kind == "PoolResource"
         else hmr.FixedSizeResource(Plain(space), 1 << 20, 1))
    blocks = [r.allocate(1 << 20), r.allocate(1 << 20)]   # two chunks, both in use
    for b in blocks:
        r.deallocate(b, 1 << 20)
    assert len(space.live) == 2
    asked: list = []

    def slow_free(ptr: int, nbytes: int, alignment: int) -> None:
        asked.append(ptr)
        if len(asked) == 1:     # the first free waits: the second chunk is still on its way
            waits.set()
            assert go_on.wait(30)
        real_free(ptr, nbytes, alignment)
    space.deallocate = slow_free  # type: ignore[method-assign]
    t = threading.Thread(target=r.release)
    t.start()
    assert waits.wait(30)
    (held,) = [c for c in space.live if c not in asked]
    space.bad = lambda ptr, n: held
    try:
        with pytest.raises(ValueError, match="overlaps memory the upstream handed out"):
            r.allocate(1 << 20)
    finally:
        space.bad = None
        go_on.set()
        t.join(30)
    assert not t.is_alive() and space.live == {} and sorted(asked) == sorted(set(asked))
    assert r.allocation_count() == 0


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
def test_a_chunk_the_upstream_could_not_take_back_is_kept_once(kind):
    """A chunk whose upstream free fails goes back into the books, unless the upstream handed
    it out again meanwhile (then the pool already holds it as a new chunk): never twice."""
    space, r, chunk, go_on, t, errors, real_free = _returning_setup(kind, fail=True)
    space.bad = lambda ptr, n: chunk      # hand the chunk out again while its free runs
    try:
        p = r.allocate(1 << 20)
    finally:
        space.bad = None
        go_on.set()
        t.join(30)
    assert not t.is_alive() and len(errors) == 1
    assert p == chunk and r.allocation_count() == 1
    if kind == "PoolResource":
        check_pool_tiles(r)
        assert r.pool_size() == 1 << 20
    space.deallocate = real_free  # type: ignore[method-assign]
    q = r.allocate(1 << 20)
    assert q != p                          # the block in use is not free as well
    r.deallocate(q, 1 << 20)
    r.deallocate(p, 1 << 20)
    r.release()
    assert space.live == {}


@pytest.mark.parametrize("kind", ["PoolResource", "FixedSizeResource"])
@pytest.mark.parametrize("bad", ["unaligned", "null", "float", "past-2**64"])
def test_a_sub_allocator_refuses_a_bad_chunk_and_gives_it_back(kind, bad):
    results = {"unaligned": lambda p, n: p + 16, "null": lambda p, n: 0,
               "float": lambda p, n: float(p), "past-2**64": lambda p, n: (1 << 64) - 4096}
    calls = []

    def misbehave(ptr: int, nbytes: int) -> Any:
        calls.append(ptr)
        return results[bad](ptr, nbytes) if len(calls) > 1 else None

    space = AddressSpace(misbehave)
    r = (hmr.PoolResource(Plain(space), initial_pool_size=1 << 20)
         if kind == "PoolResource" else hmr.FixedSizeResource(Plain(space), 1 << 20, 1))
    held = r.allocate(1 << 20)
    with pytest.raises(ValueError, match="the upstream returned"):
        r.allocate(1 << 20)
    assert r.allocation_count() == 1
    if bad == "unaligned" or bad == "past-2**64":
        assert space.live == {calls[0]: 1 << 20}, "the refused chunk was kept, not given back"
    r.deallocate(held, 1 << 20)
    r.release()
    assert space.live == {} or bad == "past-2**64"


def test_tracking_refuses_an_address_handed_out_twice_and_keeps_its_records():
    space = AddressSpace(_repeat_first([]))
    t = hmr.TrackingResource(Plain(space))
    p = t.allocate(100)
    with pytest.raises(ValueError, match="handed out before and which is still live"):
        t.allocate(100)
    assert list(t.outstanding()) == [p]
    t.deallocate(p, 100)
    assert t.outstanding() == {}


def test_binning_refuses_a_bin_that_hands_out_an_address_twice():
    space = AddressSpace(_repeat_first([]))
    b = hmr.BinningResource(space.resource(),
                            [(4096, space.resource())])
    p = b.allocate(100)
    with pytest.raises(ValueError, match="still live"):
        b.allocate(100)
    b.deallocate(p, 100)
    assert b.allocation_count() == 0


@pytest.mark.parametrize("offset", [16, 128])
def test_aligned_refuses_an_unaligned_upstream_block_and_gives_it_back(offset):
    space = AddressSpace(lambda p, n: p + offset)
    a = hmr.AlignedResource(Plain(space), 4096)
    with pytest.raises(ValueError, match="not aligned to 256"):
        a.allocate(1000)
    assert space.live == {}, "the upstream's block was kept"


@pytest.mark.parametrize("result", [1 << 64, (1 << 64) - 16, -256, 2.5, "0x1000"])
def test_callback_refuses_a_result_that_is_not_an_address(result):
    space = AddressSpace(lambda p, n: result)
    r = space.resource()
    with pytest.raises(ValueError if isinstance(result, int) else TypeError,
                       match="CallbackResource: the pointer returned by the upstream"):
        r.allocate(256)
    with pytest.raises(ValueError if isinstance(result, int) else TypeError,
                       match="pointer returned"):
        r.allocate_async(256, 256, 0)


def test_callback_gives_back_an_unaligned_result():
    space = AddressSpace(lambda p, n: p + 8)
    with pytest.raises(ValueError, match="not aligned to 256"):
        space.resource().allocate(1000)
    assert space.live == {}


def test_binning_refuses_itself_and_stacks_over_itself_as_a_bin():
    b = hmr.BinningResource(hmr.HostMemoryResource(), [256])
    for bin_resource in (b, hmr.StatisticsResource(b), hmr.resource_ref(b),
                         hmr.TrackingResource(hmr.StatisticsResource(b))):
        with pytest.raises(ValueError, match="recurse"):
            b.add_bin(4096, bin_resource)
    assert [s for s, _ in b.bins] == [256]
    p = b.allocate(1000)           # still works, through the upstream
    b.deallocate(p, 1000)

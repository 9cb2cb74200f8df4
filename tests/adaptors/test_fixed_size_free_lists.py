"""FixedSizeResource's named layout of its free lists (``FreeLists``): the contract that
BinningResource serves its fixed-size bins through, pinned field by field."""

from collections import deque

import pytest

from hipmr_ctypes.adaptors import BinningResource, FixedSizeResource
from hipmr_ctypes.adaptors.fixed_size import FreeLists

from support import AddressSpaceResource


def test_the_layout_names_its_fields():
    assert FreeLists.__slots__ == ("streams", "live", "host")
    assert not isinstance(FreeLists({}, {}, deque()), tuple)   # read by name only
    assert FreeLists.__doc__ and "append" in FreeLists.__doc__   # the rules are written down


def test_the_fields_are_the_resources_own_lists_for_its_life():
    fx = FixedSizeResource(AddressSpaceResource(), block_size=256, blocks_to_preallocate=4)
    lists, again = fx._free_lists(), fx._free_lists()
    assert lists.streams is again.streams and lists.live is again.live
    assert lists.host is again.host
    assert len(lists.host) == 4                  # the first chunk's blocks, freed on the host
    p = fx.allocate(100)
    assert lists.live == {p: 100} and p not in lists.host
    fx.deallocate(p, 100)
    assert lists.live == {} and lists.host[-1] == p   # the next allocation pops it
    assert lists.streams.get(1) is None          # a stream with no list of its own yet
    q = fx.allocate_async(100, 256, 1)
    fx.deallocate_async(q, 100, 256, 1)
    mine = lists.streams.get(1)
    assert mine is not None and list(mine) == [q]
    assert fx.allocate_async(100, 256, 1) == q and not mine
    fx.deallocate_async(q, 100, 256, 1)


@pytest.mark.parametrize("stream", [None, 1])
def test_binning_serves_its_fixed_size_bins_through_the_layout(stream):
    """A bin the adaptor made (a FixedSizeResource) sees the adaptor's traffic in its own
    lists, exactly as if it had been called itself."""
    up = AddressSpaceResource()
    binning = BinningResource(up, bins=[1024])
    (_, fixed), = binning.bins
    assert type(fixed) is FixedSizeResource
    lists = fixed._free_lists()

    def allocate(n):
        return binning.allocate(n) if stream is None else binning.allocate_async(n, 256, stream)

    def deallocate(p, n):
        if stream is None:
            binning.deallocate(p, n)
        else:
            binning.deallocate_async(p, n, 256, stream)

    p = allocate(1000)
    assert lists.live == {p: 1000} and fixed.allocation_count() == 1
    deallocate(p, 1000)
    assert lists.live == {} and binning.allocation_count() == 0
    freed_to = lists.host if stream is None else lists.streams.get(stream)
    assert freed_to is not None and freed_to[-1] == p
    assert allocate(1000) == p                   # and popped from there again
    deallocate(p, 1000)
    with pytest.raises(ValueError, match="already deallocated"):
        deallocate(p, 1000)                       # the bin's claim refuses a second free

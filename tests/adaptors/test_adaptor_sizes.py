"""Integer-like sizes through every adaptor, non-integer sizes refused before anything changes,
and errors near 2**63 that name the numbers the caller passed."""
from __future__ import annotations

import pytest

import hipmr_ctypes as hmr

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("size_growth_pickle_cases")


class Index:
    """An integer-like size (as numpy's integers are): only ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def _stacks():
    host = hmr.HostMemoryResource
    return {
        "statistics-over-host": lambda: hmr.StatisticsResource(host()),
        "statistics-over-pool": lambda: hmr.StatisticsResource(hmr.PoolResource(host())),
        "limiting-over-host": lambda: hmr.LimitingResource(host(), 1 << 20),
        "limiting-over-pool": lambda: hmr.LimitingResource(hmr.PoolResource(host()), 1 << 20),
        "tracking": lambda: hmr.TrackingResource(host()),
        "fixed-size": lambda: hmr.FixedSizeResource(host(), 4096, 2),
        "binning": lambda: hmr.BinningResource(host(), [4096]),
        "aligned": lambda: hmr.AlignedResource(host(), 4096),
        "pool": lambda: hmr.PoolResource(host()),
    }


@pytest.mark.parametrize("name", list(_stacks()))
def test_index_sizes_are_ints_everywhere(name):
    r = _stacks()[name]()
    for n in (Index(100), Index(4096)):
        p = r.allocate(n)
        r.deallocate(p, n)
    if hasattr(r, "statistics"):
        s = r.statistics
        assert s.current_bytes == 0 and type(s.total_bytes) is int and s.total_bytes == 4196
    if hasattr(r, "get_allocated_bytes"):
        assert r.get_allocated_bytes() == 0 and type(r.get_allocated_bytes()) is int
    if hasattr(r, "allocation_count"):
        assert r.allocation_count() == 0


@pytest.mark.parametrize("name", list(_stacks()))
@pytest.mark.parametrize("bad", [512.0, "512", None])
def test_non_integer_sizes_are_refused_before_anything_changes(name, bad):
    r = _stacks()[name]()
    p = r.allocate(512)
    with pytest.raises(TypeError, match="bytes"):
        r.deallocate(p, bad)
    with pytest.raises(TypeError, match="bytes"):
        r.allocate(bad)
    r.deallocate(p, 512)   # still live, freed once
    with pytest.raises(ValueError):
        r.deallocate(p, 512) if name not in ("statistics-over-host", "limiting-over-host",
                                             "aligned") else hmr.HostMemoryResource(
        ).deallocate(p, 512)


def test_fixed_size_refuses_a_float_and_a_bool_size_on_free():
    r = hmr.FixedSizeResource(hmr.HostMemoryResource(), 512, 2)
    p = r.allocate(512)
    for bad in (512.0, True):
        with pytest.raises(TypeError):
            r.deallocate(p, bad)
    assert r.allocation_count() == 1
    r.deallocate(p, 512)


@pytest.mark.parametrize("alignment", [256, 4096])
@pytest.mark.parametrize("make", ["PoolResource", "AlignedResource"])
def test_errors_near_2_63_name_the_callers_numbers(make, alignment):
    r = getattr(hmr, make)(hmr.HostMemoryResource())
    for n in ((1 << 63) - 1, 1 << 63):
        with pytest.raises((MemoryError, ValueError)) as info:
            r.allocate(n, alignment)
        import re
        numbers = {int(x) for x in re.findall(r"\d{15,}", str(info.value))}
        assert numbers <= {n, 1 << 63}, str(info.value)

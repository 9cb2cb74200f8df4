"""Copies of an AsyncMemoryResource are closed with its pool."""
from __future__ import annotations

import copy
import gc

import pytest

import hipmr_ctypes as hmr

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("size_growth_pickle_cases")


def test_a_copied_async_resource_is_closed_with_its_pool(emulator):
    a = hmr.AsyncMemoryResource()
    copies = [copy.copy(a), copy.deepcopy(a)]
    held = [(c, c.allocate(100)) for c in copies]
    a.close()
    for c in copies:
        with pytest.raises(ValueError, match="closed"):
            c.allocate(100)
    for c, p in held:
        c.deallocate(p, 100)
    gc.collect()

"""``python -m hipmr_ctypes bench --json`` on a real GPU that is nearly full.

Kept out of the reliability report's sections (which run at once, several to a GPU): filling
the device would make the others' allocations fail.  ``pytest -m gpu tests`` runs it alone.
"""
from __future__ import annotations

import json

import pytest

import hipmr_ctypes as hmr


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_bench_json_on_a_nearly_full_gpu(gpu_runtime, capsys):
    """On a real device filled to less than 64 KiB free (in this process): ``bench --json``
    still prints its JSON, each device row measured or null with its error."""
    from hipmr_ctypes import _selftest
    dev = hmr.DeviceMemoryResource()
    held = []
    try:
        for chunk in (1 << 30, 64 << 20, 1 << 20, 64 << 10):
            while True:
                try:
                    held.append((dev.allocate(chunk), chunk))
                except hmr.OutOfMemoryError:
                    break
        status = _selftest.bench(as_json=True)
    finally:
        for ptr, size in held:
            dev.deallocate(ptr, size)
    report = json.loads(capsys.readouterr().out)
    assert status == (1 if report["errors"] else 0)
    for name in ("AsyncMemoryResource", "PoolResource(AsyncMemoryResource)"):
        row = report["ns_per_pair"][name]
        assert (row is None) == (name in report["errors"]), report
    assert report["ns_per_pair"]["HostMemoryResource"]["256 B"] > 0


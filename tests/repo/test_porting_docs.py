"""Every ``python`` block of docs/porting.md runs, in order, in one namespace (emulated), and
the page names every public RMM entry point it promises."""
from __future__ import annotations

import re

import pytest

from hipmr_ctypes import initialization
from hipmr_ctypes.statistics import default_profiler_records

from support import REPO, process_runtime

DOC = REPO / "docs" / "porting.md"


def blocks():
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)


@pytest.fixture
def restored():
    hooks = list(initialization._hooks)
    with process_runtime():
        yield
    initialization._hooks[:] = hooks
    default_profiler_records.clear()


def test_doc_examples_run(emulator, restored):
    assert len(blocks()) >= 4
    namespace: dict = {"__name__": "docs_porting"}
    for i, code in enumerate(blocks()):
        exec(compile(code, f"{DOC.name}[block {i}]", "exec"), namespace)


def test_doc_names_the_rmm_entry_points():
    text = DOC.read_text()
    for name in ["rmm.reinitialize", "register_reinitialize_hook", "enable_logging",
                 "get_log_filenames", "DeviceBuffer", "CudaMemoryResource",
                 "CudaAsyncMemoryResource", "PoolMemoryResource", "BinningMemoryResource",
                 "FixedSizeMemoryResource", "CallbackMemoryResource", "LimitingResourceAdaptor",
                 "LoggingResourceAdaptor", "StatisticsResourceAdaptor",
                 "TrackingResourceAdaptor", "FailureCallbackResourceAdaptor",
                 "PrefetchResourceAdaptor", "ManagedMemoryResource", "PinnedHostMemoryResource",
                 "SystemMemoryResource", "available_device_memory", "rmm.statistics",
                 "profiler", "rmm_cupy_allocator", "RMMNumbaManager", "rmm_torch_allocator",
                 "PER_THREAD_DEFAULT_STREAM", "resource_ref", "stream_ref", "get_property"]:
        assert name in text, name

"""docs/porting.md names every public RMM entry point it promises (its blocks run in
tests/repo/test_doc_blocks.py)."""
from __future__ import annotations

from support import REPO

DOC = REPO / "docs" / "porting.md"


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

"""Concrete memory resources: device (``hipMalloc``), async (memory pools), pinned, managed,
host and virtual memory, and the per-device resource.  See docs/resources.md."""
from __future__ import annotations

from .async_memory import AsyncMemoryResource
from .device_memory import DeviceMemoryResource
from .host import HostMemoryResource
from .managed import ManagedMemoryResource
from .memory_pool import MAX_RELEASE_THRESHOLD, MemoryPool
from .per_device import (current_device_and_resource, get_current_device_resource,
                         get_per_device_resource, set_current_device_resource,
                         set_per_device_resource)
# for the package's own caches of the table (Buffer's), not public names
from .per_device import per_device_cache as per_device_cache
from .per_device import remember_per_device as remember_per_device
from .pinned import PINNED_FLAGS, PinnedMemoryResource
from .virtual import VirtualMemoryResource

__all__ = ["DeviceMemoryResource", "AsyncMemoryResource", "MemoryPool", "PinnedMemoryResource",
           "ManagedMemoryResource", "HostMemoryResource", "MAX_RELEASE_THRESHOLD",
           "PINNED_FLAGS", "VirtualMemoryResource", "get_current_device_resource", "set_current_device_resource",
           "get_per_device_resource", "set_per_device_resource", "current_device_and_resource"]

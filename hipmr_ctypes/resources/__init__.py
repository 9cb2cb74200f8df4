"""Concrete memory resources: device (``hipMalloc``), async (memory pools), pinned, managed,
host and virtual memory, and the per-device resource.  See docs/resources.md."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .device_memory import DeviceMemoryResource
from .per_device import (current_device_and_resource, get_current_device_resource,
                         get_per_device_resource, set_current_device_resource,
                         set_per_device_resource)
# for the package's own caches of the table (Buffer's), not public names
from .per_device import per_device_cache as per_device_cache
from .per_device import remember_per_device as remember_per_device

if TYPE_CHECKING:
    from .async_memory import AsyncMemoryResource as AsyncMemoryResource
    from .host import HostMemoryResource as HostMemoryResource
    from .managed import ManagedMemoryResource as ManagedMemoryResource
    from .memory_pool import MAX_RELEASE_THRESHOLD as MAX_RELEASE_THRESHOLD
    from .memory_pool import MemoryPool as MemoryPool
    from .pinned import PINNED_FLAGS as PINNED_FLAGS
    from .pinned import PinnedMemoryResource as PinnedMemoryResource
    from .virtual import VirtualMemoryResource as VirtualMemoryResource

__all__ = ["DeviceMemoryResource", "AsyncMemoryResource", "MemoryPool", "PinnedMemoryResource",
           "ManagedMemoryResource", "HostMemoryResource", "MAX_RELEASE_THRESHOLD",
           "PINNED_FLAGS", "VirtualMemoryResource", "get_current_device_resource",
           "set_current_device_resource",
           "get_per_device_resource", "set_per_device_resource", "current_device_and_resource"]

# the other resources load with their first use (PEP 562): a first Buffer on the default
# resource compiles none of them
_LAZY = {"AsyncMemoryResource": "async_memory", "HostMemoryResource": "host",
         "ManagedMemoryResource": "managed", "MAX_RELEASE_THRESHOLD": "memory_pool",
         "MemoryPool": "memory_pool", "PINNED_FLAGS": "pinned",
         "PinnedMemoryResource": "pinned", "VirtualMemoryResource": "virtual"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

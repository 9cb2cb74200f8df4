"""hipmr_ctypes: libhipcxx's ``<cuda/memory_resource>`` model for Python, on the HIP runtime
through ctypes, with the resources, adaptors and buffers hipMM / RMM users expect.

Standard library only; import never fails because the HIP library is missing (the first call
that needs it raises :class:`LibraryNotFoundError`).  Choose the platform with
``HIPMR_PLATFORM=amd|nvidia|emulated``.  See README.md and docs/.
"""
from __future__ import annotations

from ._hip import preload as _preload
from ._hip.errors import (HipError, InvalidHandleError, InvalidValueError, LibraryNotFoundError,
                          NoDeviceError, NotReadyError, NotSupportedError, OutOfMemoryError)
from .properties import (Property, device_accessible, forward_property, get_property,
                         has_property, has_property_with, host_accessible, property_with_value)
from .concepts import (AsyncResource, Resource, is_async_resource, is_async_resource_with,
                       is_resource, is_resource_with)
from .resource_ref import (DEFAULT_ALIGNMENT, async_resource_ref, resource_cast, resource_ref,
                           try_get_property)
from .stream_ref import stream_per_thread, stream_ref
from .device import (Device, device_count, driver_version, get_device, platform,
                     runtime_version, set_device, synchronize)
from .stream import Event, Stream, wait_event
from .resources import (MAX_RELEASE_THRESHOLD, AsyncMemoryResource, DeviceMemoryResource,
                        HostMemoryResource, ManagedMemoryResource, MemoryPool,
                        PinnedMemoryResource, get_current_device_resource,
                        get_per_device_resource, set_current_device_resource,
                        set_per_device_resource)
from .adaptors import (AlignedResource, BinningResource, CallbackResource,
                       FailureCallbackResource, FixedSizeResource, LimitingResource,
                       LoggingResource, PoolResource, PrefetchResource, Statistics,
                       StatisticsResource, TrackedAllocation, TrackingResource)
from .buffer import Buffer

__all__ = ["HipError", "InvalidHandleError", "InvalidValueError", "LibraryNotFoundError",
    "NoDeviceError", "NotReadyError", "NotSupportedError", "OutOfMemoryError", "Property",
    "device_accessible", "forward_property", "get_property", "has_property", "has_property_with",
    "host_accessible", "property_with_value", "AsyncResource", "Resource", "is_async_resource",
    "is_async_resource_with", "is_resource", "is_resource_with", "DEFAULT_ALIGNMENT",
    "async_resource_ref", "resource_cast", "resource_ref", "try_get_property",
    "stream_per_thread", "stream_ref", "Device", "device_count", "driver_version", "get_device",
    "platform", "runtime_version", "set_device", "synchronize", "Event", "Stream", "wait_event",
    "MAX_RELEASE_THRESHOLD", "AsyncMemoryResource", "DeviceMemoryResource", "HostMemoryResource",
    "ManagedMemoryResource", "MemoryPool", "PinnedMemoryResource", "get_current_device_resource",
    "get_per_device_resource", "set_current_device_resource", "set_per_device_resource",
    "AlignedResource", "BinningResource", "CallbackResource", "FailureCallbackResource",
    "FixedSizeResource", "LimitingResource", "LoggingResource", "PoolResource",
    "PrefetchResource", "Statistics", "StatisticsResource", "TrackedAllocation",
    "TrackingResource", "Buffer"]

__version__ = "0.1.0"

_preload()  # load the library and declare its functions once; never raises

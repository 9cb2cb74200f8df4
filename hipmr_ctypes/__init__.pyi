"""What type checkers see of the package: every public name, imported from the module that
defines it (at run time ``__init__.py`` loads each on first use)."""
from ._hip.exceptions import (HipError, InvalidHandleError, InvalidValueError,
                          LibraryNotFoundError, NoDeviceError, NotReadyError,
                          NotSupportedError, OutOfMemoryError)
from ._hip.fork import ForkedChildError
from .properties import (Property, device_accessible, forward_property, get_property,
                         has_property, has_property_with, host_accessible,
                         property_with_value)
from .concepts import (AsyncResource, Resource, is_async_resource, is_async_resource_with,
                       is_resource, is_resource_with)
from .resource_refs import (DEFAULT_ALIGNMENT, async_resource_ref, resource_cast,
                           resource_ref, try_get_property)
from .stream_refs import stream_per_thread, stream_ref
from .device import (Device, device_count, driver_version, get_device, platform,
                     runtime_version, set_device, synchronize)
from .stream import Event, Graph, IpcEventHandle, Stream, wait_event
from .resources import (MAX_RELEASE_THRESHOLD, AsyncMemoryResource, DeviceMemoryResource,
                        HostMemoryResource, ManagedMemoryResource, MemoryPool,
                        PinnedMemoryResource, get_current_device_resource,
                        get_per_device_resource, set_current_device_resource,
                        set_per_device_resource)
from .resources.host_registration import HostRegistration, register_host
from .resources.system import SamHeadroomMemoryResource, SystemMemoryResource
from .resources.async_host import AsyncManagedMemoryResource, AsyncPinnedMemoryResource
from .resources.virtual import VirtualMemoryResource
from .adaptors.virtual_pool import VirtualPoolResource
from .adaptors import (AlignedResource, BinningResource, CallbackResource,
                       FailureCallbackResource, FixedSizeResource, LimitingResource,
                       LoggingResource, PoolResource, PrefetchResource, Statistics,
                       StatisticsResource, TrackedAllocation, TrackingResource)
from .buffer import Buffer
from .ipc import IpcBufferDescriptor, IpcPoolHandle
from .initialization import (available_device_memory, disable_logging, enable_logging,
                             get_log_filenames, is_initialized, register_reinitialize_hook,
                             reinitialize, unregister_reinitialize_hook)
from . import logfile as logfile, plot as plot  # submodules used as hmr.plot.timeline(...)

__all__ = ["HipError", "InvalidHandleError", "InvalidValueError", "LibraryNotFoundError",
    "NoDeviceError", "NotReadyError", "NotSupportedError", "OutOfMemoryError",
    "ForkedChildError", "Property",
    "device_accessible", "forward_property", "get_property", "has_property", "has_property_with",
    "host_accessible", "property_with_value", "AsyncResource", "Resource", "is_async_resource",
    "is_async_resource_with", "is_resource", "is_resource_with", "DEFAULT_ALIGNMENT",
    "async_resource_ref", "resource_cast", "resource_ref", "try_get_property",
    "stream_per_thread", "stream_ref", "Device", "device_count", "driver_version", "get_device",
    "platform", "runtime_version", "set_device", "synchronize", "Event", "Graph", "Stream",
    "wait_event",
    "MAX_RELEASE_THRESHOLD", "AsyncMemoryResource", "DeviceMemoryResource", "HostMemoryResource",
    "ManagedMemoryResource", "MemoryPool", "PinnedMemoryResource", "get_current_device_resource",
    "get_per_device_resource", "set_current_device_resource", "set_per_device_resource",
    "VirtualMemoryResource", "VirtualPoolResource", "AlignedResource", "BinningResource", "CallbackResource", "FailureCallbackResource",
    "FixedSizeResource", "LimitingResource", "LoggingResource", "PoolResource",
    "PrefetchResource", "Statistics", "StatisticsResource", "TrackedAllocation",
    "TrackingResource", "Buffer", "reinitialize", "is_initialized",
    "register_reinitialize_hook", "unregister_reinitialize_hook", "enable_logging",
    "disable_logging", "get_log_filenames", "available_device_memory", "IpcBufferDescriptor",
    "IpcPoolHandle", "HostRegistration", "register_host", "IpcEventHandle",
    "SamHeadroomMemoryResource", "SystemMemoryResource", "AsyncManagedMemoryResource",
    "AsyncPinnedMemoryResource"]

__version__: str


def _default_device_resource(device: int) -> object: ...  # the per-device table's default
def _virtual_range(device: object, granularity: object, sizes: object) -> object: ...  # VirtualPoolResource's range

"""hipmr_ctypes: libhipcxx's ``<cuda/memory_resource>`` model for Python, on the HIP runtime
through ctypes, with the resources, adaptors and buffers hipMM / RMM users expect.

Standard library only; import never fails because the HIP library is missing (the first call
that needs it raises :class:`LibraryNotFoundError`).  Choose the platform with
``HIPMR_PLATFORM=amd|nvidia|emulated``.  See README.md and docs/.
"""
import sys as _sys

from ._hip import preload as _preload

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from types import ModuleType as _ModuleType
else:
    _ModuleType = type(_sys)  # types.ModuleType, without importing types

# Everything but the library loads on first use (PEP 562): module -> the public names it
# provides.  Add a new public name here and to __init__.pyi (its import and __all__).
_LAZY_MODULES = {  # (each module's names in one string: less to compile without .pyc)
    "_hip.exceptions": "HipError InvalidHandleError InvalidValueError LibraryNotFoundError "
                   "NoDeviceError NotReadyError NotSupportedError OutOfMemoryError",
    "_hip.fork": "ForkedChildError",
    "properties": "Property device_accessible forward_property get_property has_property "
                  "has_property_with host_accessible property_with_value",
    "concepts": "AsyncResource Resource is_async_resource is_async_resource_with is_resource "
                "is_resource_with",
    "resource_refs": "DEFAULT_ALIGNMENT async_resource_ref resource_cast resource_ref "
                    "try_get_property",
    "stream_refs": "stream_per_thread stream_ref",
    "device": "Device device_count driver_version get_device platform runtime_version set_device "
              "synchronize",
    "stream": "Event Graph IpcEventHandle Stream wait_event",
    "resources": "MAX_RELEASE_THRESHOLD AsyncMemoryResource DeviceMemoryResource "
                 "HostMemoryResource ManagedMemoryResource MemoryPool PinnedMemoryResource "
                 "get_current_device_resource get_per_device_resource "
                 "set_current_device_resource set_per_device_resource",
    "resources.host_registration": "HostRegistration register_host",
    "resources.system": "SamHeadroomMemoryResource SystemMemoryResource",
    "resources.async_host": "AsyncManagedMemoryResource AsyncPinnedMemoryResource",
    "resources.virtual": "VirtualMemoryResource",
    "adaptors.virtual_pool": "VirtualPoolResource",
    "adaptors": "AlignedResource BinningResource CallbackResource FailureCallbackResource "
                "FixedSizeResource LimitingResource LoggingResource PoolResource "
                "PrefetchResource Statistics StatisticsResource TrackedAllocation "
                "TrackingResource",
    "buffer": "Buffer",
    "ipc": "IpcBufferDescriptor IpcPoolHandle",
    "initialization": "available_device_memory disable_logging enable_logging get_log_filenames "
                      "is_initialized register_reinitialize_hook reinitialize "
                      "unregister_reinitialize_hook",
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names.split()}
# submodules reachable as attributes (``hmr.adaptors``) and listed by dir(), loaded on first use
_SUBMODULES = frozenset("""adaptors buffer cccl3 concepts device properties resource_refs resources stream
    stream_refs ipc _checks _device_sizes _exit _hip _limits _locks _sizes _thread_exit errors
    initialization logfile plot statistics _stream_order _buffer _memory_query
    _log""".split())

__all__ = list(_LAZY)  # pyright: ignore[reportUnsupportedDunderAll]  (listed in __init__.pyi)


def __getattr__(name: str) -> object:
    """Load the submodule that provides ``name`` on first use, and keep the name here."""
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module
        value = getattr(import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        from importlib import import_module
        try:
            return import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    from ._rmm_names import attribute_hint   # RMM's spellings (hmr.DeviceBuffer) name ours
    raise AttributeError(attribute_hint(__name__, name)
                         or f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> "list[str]":
    """What an eager import would show: every public name and the submodules."""
    import os
    here = os.path.dirname(__file__)
    present = {m for m in _SUBMODULES if os.path.exists(os.path.join(here, m)) or
               os.path.exists(os.path.join(here, m + ".py"))}
    return sorted((set(globals()) - _MACHINERY) | set(_LAZY) | present)


def _default_device_resource(device: int) -> object:
    """A device's default resource, as ``HIPMR_DEVICE_RESOURCE`` says (``_config``, loaded by
    the first default made; with the variable unset, as it mostly is, ``_config`` is not
    loaded: the default is ``_config.default_resource``'s, a ``DeviceMemoryResource``).  The
    per-device table (``resources.per_device``) calls it when no other factory was set: the
    resources layer never imports ``_config``, which builds adaptors above it."""
    from os import environ
    if not environ.get("HIPMR_DEVICE_RESOURCE", "").strip():
        from .resources.device_memory import DeviceMemoryResource
        return DeviceMemoryResource(device)
    from ._config import default_resource
    return default_resource(device)


def _virtual_range(device: object, granularity: object, sizes: object) -> object:
    """A new ``resources.virtual_range.VirtualRange``: the reserved range of a
    ``VirtualPoolResource``, whose layer (the adaptors) imports no resource; the package's
    ``__init__`` joins the two, as for the per-device default."""
    from .resources.virtual_range import VirtualRange
    return VirtualRange(device, granularity, sizes)  # type: ignore[arg-type]


class _Package(_ModuleType):
    """This package's module type: pickled by name."""

    def __reduce__(self) -> "tuple[object, tuple[str]]":
        """Pickled by name, as cloudpickle pickles a plain module (it sends the modules a
        function's globals name so, e.g. Dask tasks): the receiving process imports it."""
        import importlib
        return (importlib.import_module, (self.__name__,))


_sys.modules[__name__].__class__ = _Package
_MACHINERY = frozenset("_sys _ModuleType TYPE_CHECKING _LAZY_MODULES _LAZY _SUBMODULES _Package "
                       "_MACHINERY __getattr__ __dir__ _default_device_resource _virtual_range".split())


__version__ = "0.1.0"

_preload()  # choose the platform and open its library; never raises (the first use binds it)

"""The resource PyTorch's memory comes from when ``interop.torch`` is given none
(``use()``, ``allocator()``, ``mem_pool()``): :func:`default_resource`.

* Where the user chose a device's resource (``HIPMR_DEVICE_RESOURCE`` is set, or
  ``set_per_device_resource`` set one for the device), that per-device resource, looked up at
  each allocation as the CuPy and Numba hooks do.
* Otherwise one :class:`~hipmr_ctypes.VirtualPoolResource` per device, made on the device's
  first allocation and kept for the process (PyTorch may free into it until the end): a pool
  that grows in place, so that blocks PyTorch frees coalesce however the pool grew.
* Where the device has no virtual memory (the runtime lacks the calls or the device the
  feature, or the range cannot be reserved), the per-device resource (a
  ``DeviceMemoryResource`` unless set otherwise), with one ``RuntimeWarning`` per device
  naming why; :func:`problem` says it later.

No lock is held while a resource is made but ``_making`` (one pool per device); the lookups
of the callbacks read :data:`cache` first, which the per-device table clears whenever it
changes (a resource set later is then seen at the next allocation).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

from .._hip.exceptions import HipError
from .._memory_query import memory_device
from ..resources import per_device as _per_device

__all__ = ["default_resource", "problem", "cache", "resource_of"]

_pools: Dict[int, Any] = {}       # device -> its VirtualPoolResource, for the process
_problems: Dict[int, str] = {}    # device -> why it has none
_making = threading.Lock()

#: device -> (resource, the device of its memory, its allocate_async, its deallocate_async),
#: what the PyTorch callbacks read first; cleared whenever the per-device table changes
cache: Dict[int, Tuple[Any, int, Any, Any]] = _per_device.per_device_cache({})


def _chosen(device: int) -> bool:
    return bool(os.environ.get("HIPMR_DEVICE_RESOURCE", "").strip()) or \
        _per_device.is_set(device)


def default_resource(device: int) -> Any:
    """The resource ``interop.torch`` allocates from on ``device`` (a checked ordinal) when it
    is given none (see the module's docstring)."""
    if _chosen(device):
        return _per_device.get_per_device_resource(device)
    pool = _pools.get(device)
    if pool is not None:
        return pool
    if device not in _problems:
        with _making:
            pool = _pools.get(device)
            if pool is None and device not in _problems:
                from ..adaptors.virtual_pool import VirtualPoolResource
                try:
                    pool = _pools[device] = VirtualPoolResource(device)
                except HipError as exc:
                    _problems[device] = f"{type(exc).__name__}: {exc}"
                    _warn(device, _problems[device])
        if pool is not None:
            return pool
    return _per_device.get_per_device_resource(device)


def problem(device: int) -> Optional[str]:
    """Why ``device`` has no ``VirtualPoolResource`` as the default of ``interop.torch``
    (None: it has one, or has not been asked for one yet)."""
    return _problems.get(device)


def resource_of(device: int) -> Tuple[Any, int, Any, Any]:
    """The entry of :data:`cache` for ``device``, made now and remembered unless the
    per-device table changed meanwhile."""
    resource = default_resource(device)
    found = memory_device(resource)
    entry = (resource, device if found is None else found, resource.allocate_async,
             resource.deallocate_async)
    if resource is _pools.get(device):
        with _per_device._lock:   # unless a resource was set for the device meanwhile
            if not _chosen(device):
                cache[device] = entry
    else:
        _per_device.remember_per_device(cache, device, resource, entry)
    return entry


def _warn(device: int, why: str) -> None:
    """A ``RuntimeWarning`` that never raises (it may run inside a PyTorch callback)."""
    try:
        import warnings
        warnings.warn(f"hipmr_ctypes.interop.torch: device {device} has no virtual memory "
                      f"({why}); PyTorch's memory comes from the per-device resource instead "
                      f"of a VirtualPoolResource", RuntimeWarning, stacklevel=3)
    except BaseException:  # noqa: BLE001 - warnings turned into errors: the reason stays
        pass

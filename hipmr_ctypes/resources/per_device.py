"""The per-device resource (RMM's ``get/set_per_device_resource``): one async,
device-accessible resource per device, used by ``Buffer`` and the interop hooks when no resource
is given.  The default for a device is made on first use by the default factory: the one given
to :func:`set_default_factory`, else the package's own (``hipmr_ctypes._default_device_resource``,
which builds what ``HIPMR_DEVICE_RESOURCE`` says through ``_config``, a layer above this one:
the package's ``__init__`` is the one place that joins the two).

Thread-safe: a lock guards the table, and is never held while a native call runs (making the
default resource, checking a device ordinal).
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..concepts import AsyncResource, is_async_resource
from ..device import check_device, get_device
from ..properties import _declared, device_accessible
from .device_memory import DeviceMemoryResource

__all__ = ["get_current_device_resource", "set_current_device_resource",
           "get_per_device_resource", "set_per_device_resource"]

_lock = threading.Lock()
_making = threading.RLock()  # held while a default resource is made (never under _lock)
_resources: Dict[int, AsyncResource] = {}
#: the devices whose resource was set (set_per_device_resource), not made by the default
#: factory
_set: Set[int] = set()
#: caches of the table (the interop hooks' ``_current.current``): each is cleared, under
#: ``_lock``, whenever the table changes, so that a cache never holds a resource the table
#: no longer holds
_caches: List[Dict[Any, Any]] = []
#: makes the default resource of a device that has none set (see set_default_factory); None:
#: the package's own
_default_factory: Optional[Callable[[int], Any]] = None


def set_default_factory(factory: Optional[Callable[[int], Any]]) -> None:
    """Make ``factory(ordinal)`` what makes a device's default resource from now on (called
    once per device, under ``_making``, never under the table's lock); None: the package's
    own, which obeys ``HIPMR_DEVICE_RESOURCE``."""
    global _default_factory
    _default_factory = factory


def _package_factory() -> Callable[[int], Any]:
    """The package's default factory (its ``__init__`` joins this layer to ``_config``)."""
    from .. import _default_device_resource
    return _default_device_resource


def per_device_cache(cache: Dict[int, Any]) -> Dict[int, Any]:
    """Register ``cache`` (``{device: what a caller learnt of its resource}``): it is cleared
    whenever the table changes.  Fill it with :func:`remember_per_device` only."""
    with _lock:
        _caches.append(cache)
    return cache


def remember_per_device(cache: Dict[int, Any], device: int, resource: Any, entry: Any) -> None:
    """``cache[device] = entry``, unless the resource of ``device`` is no longer ``resource``
    (the table changed since the caller read it)."""
    with _lock:
        if _resources.get(device) is resource:
            cache[device] = entry


def _changed() -> None:
    """Clear the caches of the table (call with ``_lock`` held, after changing it)."""
    for cache in _caches:
        cache.clear()


def _check_resource(resource: Any, device: int) -> None:
    if not is_async_resource(resource):
        raise TypeError(f"resource must be an async resource (allocate, deallocate, "
                        f"allocate_async, deallocate_async and ==); {type(resource).__name__} "
                        "is not one")
    if device_accessible not in _declared(resource):
        raise TypeError(f"resource must have the property device_accessible; "
                        f"{type(resource).__name__} declares "
                        f"{', '.join(p.__name__ for p in _declared(resource)) or 'none'}")
    # an AsyncMemoryResource exists only once its module is loaded (this one does not load it)
    loaded = sys.modules.get(f"{__package__}.async_memory")
    kinds = (DeviceMemoryResource,) if loaded is None else (DeviceMemoryResource,
                                                             loaded.AsyncMemoryResource)
    if isinstance(resource, kinds) and resource.device != device:
        raise ValueError(f"{resource!r} allocates on device {resource.device}, not on "
                         f"device {device}")


def get_per_device_resource(device: Any) -> AsyncResource:
    """The resource of ``device`` (an ordinal or a ``Device``); a ``DeviceMemoryResource`` for it
    unless one was set."""
    resource = _resources.get(device) if type(device) is int else None  # keys: checked ordinals
    if resource is not None:
        return resource
    ordinal = check_device(device)
    resource = _resources.get(ordinal)
    if resource is not None:
        return resource
    with _making:  # one default made per device; outside _lock: making it asks the runtime
        resource = _resources.get(ordinal)
        if resource is not None:
            return resource
        made = (_default_factory or _package_factory())(ordinal)
        with _lock:
            resource = _resources.setdefault(ordinal, made)
            _changed()
            return resource


def set_per_device_resource(device: Any, resource: Any) -> AsyncResource:
    """Make ``resource`` the resource of ``device``; returns the previous one.

    ``resource`` must be an async resource with ``device_accessible`` (TypeError otherwise,
    naming what is missing); a device-style resource must be for that device (ValueError).
    """
    ordinal = check_device(device)
    _check_resource(resource, ordinal)
    previous = get_per_device_resource(ordinal)
    with _lock:
        previous = _resources.get(ordinal, previous)
        _resources[ordinal] = resource
        _set.add(ordinal)
        _changed()
    return previous


def is_set(device: int) -> bool:
    """True when the resource of ``device`` (a checked ordinal) was set with
    :func:`set_per_device_resource`, False while it is the default factory's (or none)."""
    return device in _set and device in _resources


def current_device_and_resource() -> Tuple[int, Any]:
    """``(the calling thread's current device, its resource)`` (one runtime call)."""
    device = get_device()
    resource = _resources.get(device)
    return device, (resource if resource is not None else get_per_device_resource(device))


def get_current_device_resource() -> AsyncResource:
    """The resource of the calling thread's current device."""
    return get_per_device_resource(get_device())


def set_current_device_resource(resource: Any) -> AsyncResource:
    """Make ``resource`` the resource of the current device; returns the previous one."""
    return set_per_device_resource(get_device(), resource)


def _replace_all(resources: Dict[int, Any]) -> Dict[int, Any]:
    """Forget every per-device resource and set ``resources`` (``{ordinal: resource}``, each
    checked first) in one step; returns the previous table."""
    checked = {}
    for device, resource in resources.items():
        ordinal = check_device(device)
        _check_resource(resource, ordinal)
        checked[ordinal] = resource
    with _lock:
        previous = dict(_resources)
        _resources.clear()
        _resources.update(checked)
        _set.clear()
        _set.update(checked)
        _changed()
    return previous

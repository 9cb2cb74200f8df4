"""What the interop hooks learn once about the resource of a device: the resource itself and
the device its memory lives on.  Shared by the CuPy allocator and the Numba plugin, which read
``current[device]`` on every allocation and come to :func:`resource_of` only when it is not
there: the first time, and after any change of the per-device table (which clears
``current``)."""
from __future__ import annotations

from typing import Any, Dict, Tuple

from .._memory_query import memory_device
from ..resources import per_device as _per_device

__all__ = ["current", "resource_of"]

#: device -> (its per-device resource, the device of that resource's memory, the resource's
#: ``allocate_async`` and ``deallocate_async``, bound once as adaptors bind their upstream's);
#: cleared by ``per_device`` whenever its table changes, so it holds nothing the table does not
current: Dict[int, Tuple[Any, int, Any, Any]] = _per_device.per_device_cache({})


def resource_of(device: int) -> Tuple[Any, int, Any, Any]:
    """The entry of ``current`` for ``device`` (see there), remembered unless the per-device
    table changed meanwhile."""
    resource = _per_device.get_per_device_resource(device)
    found = memory_device(resource)   # its own device, or that of a resource below it
    entry = (resource, device if found is None else found, resource.allocate_async,
             resource.deallocate_async)
    _per_device.remember_per_device(current, device, resource, entry)
    return entry

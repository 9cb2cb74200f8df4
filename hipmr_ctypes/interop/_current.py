"""What the interop hooks learn once about the resource of a device: the device its memory
lives on.  Shared by the CuPy allocator and the Numba plugin, which look the resource up on
every allocation (``per_device._resources``, as ``current_device_and_resource`` does) and come
here only when it changed."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Tuple

from ..buffer import memory_device

__all__ = ["seen", "learn"]

#: device -> (weak reference to the resource last seen there, the device of its memory).  The
#: weak reference confirms that the entry is for that very resource (and keeps nothing alive).
seen: Dict[int, Tuple[Callable[[], Any], int]] = {}


def learn(device: int, resource: Any) -> Tuple[Callable[[], Any], int]:
    """The entry of ``resource``, the resource of ``device``: the device its memory lives on is
    its own (or that of a resource below it), else ``device``.  A resource that takes no weak
    reference is not remembered (learnt again at every allocation)."""
    found = memory_device(resource)
    where = device if found is None else found
    try:
        entry = (weakref.ref(resource), where)
    except TypeError:
        return ((lambda: resource), where)
    seen[device] = entry
    return entry

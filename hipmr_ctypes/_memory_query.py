"""What memory is this: the answers of ``hipPointerGetAttributes`` for a pointer, and what a
stack of resources says of the memory it hands out.

One home for the question, asked by ``Buffer`` (its ``device`` and its memory kind), foreign
memory (``Buffer.from_handle`` / ``from_dlpack``), IPC (what was mapped) and the interop hooks
(the device of a resource).  It works on plain pointers, resources and the binding; it imports
nothing from the resources (a resource class that knows its memory says so with the class
attribute ``_allocation_kind``).

Memory kinds are "device", "pinned" (host memory the runtime registered), "managed", and
"host" (memory the runtime does not know)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _hip
from ._hip.types import MEMORY_TYPE_5, MEMORY_TYPE_6, hipPointerAttribute_t
from .properties import _declared, host_accessible
from .resource_refs import upstream_chain

__all__ = ["memory_types", "pointer_kind", "pointer_device", "memory_device", "memory_kind"]


def memory_types(rt: Any) -> Dict[int, str]:
    """The meaning of ``hipPointerAttribute_t.type`` for the runtime ``rt``: ROCm 5 numbers
    the memory types differently from ROCm 6 and from HIP's NVIDIA mapping."""
    if rt.platform == "amd" and rt.runtime_version()[0] < 6:
        return MEMORY_TYPE_5
    return MEMORY_TYPE_6


def pointer_kind(ptr: int) -> Tuple[Optional[str], Optional[int]]:
    """``(kind, device)`` of the memory at ``ptr``: "device", "pinned" or "managed" and the
    device the runtime names (None when it names none); ``(None, None)`` for memory the
    runtime does not know (plain host memory, or ``ptr`` 0), whose error is cleared so that
    nobody else sees it."""
    if not ptr:
        return None, None
    rt = _hip.get_runtime()
    attrs = hipPointerAttribute_t()
    if rt.fn.hipPointerGetAttributes(attrs, ptr):
        rt.clear_last_error()
        return None, None
    name = memory_types(rt).get(attrs.type)
    device = attrs.device if attrs.device >= 0 else None
    if attrs.isManaged or name in ("managed", "unified"):
        return "managed", device
    if name == "device":
        return "device", device
    if name == "host":
        return "pinned", device
    return None, None


def pointer_device(ptr: int) -> Optional[int]:
    """The device of device-only memory at ``ptr``; None for any other memory."""
    kind, device = pointer_kind(ptr)
    return device if kind == "device" else None


def memory_device(resource: Any) -> Optional[int]:
    """The device the memory of ``resource`` lives on: its ``device`` when that is an int, else
    the first such ``device`` below it through ``upstream_resource()`` (adaptors, refs; any
    depth); None when no resource of the stack names one; ValueError for a stack with a
    cycle."""
    for found in upstream_chain(resource, "memory_device"):
        device = getattr(found, "device", None)
        if type(device) is int:
            return device
    return None


def memory_kind(resource: Any, ptr: int, host_only: bool) -> str:
    """The kind of the memory at ``ptr`` that ``resource`` handed out (``host_only``: the
    resource declares properties, ``device_accessible`` not among them).  A resource that
    declares nothing: what the runtime knows of the pointer.  Device- and host-accessible
    memory is "managed" or "pinned": the resource's stack says which when one of its
    resources has an ``_allocation_kind``, else the runtime does (memory it does not know,
    and ``ptr`` 0, count as pinned)."""
    if host_only:
        return "host"
    props = _declared(resource)
    if not props:
        return pointer_kind(ptr)[0] or "host"
    if host_accessible not in props:
        return "device"
    for found in upstream_chain(resource, "Buffer"):
        kind: Optional[str] = getattr(type(found), "_allocation_kind", None)
        if kind is not None:
            return kind
    return "managed" if pointer_kind(ptr)[0] == "managed" else "pinned"

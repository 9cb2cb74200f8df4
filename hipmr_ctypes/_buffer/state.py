"""What a Buffer knows beyond its address, size, resource and stream (``_State``), and the
per-resource cache that lets a new Buffer find it with one global read.

A buffer keeps its rarely used facts in one ``_State`` (slot ``_state``).  A buffer that is
open, holds no stream object, has the default alignment, its capacity equal to its size and
no cached memory kind ("plain") shares its resource's state; ``Buffer._mutable()`` gives a
buffer its own copy before any of those facts changes.  Closing a plain buffer swaps in the
shared closed twin.

``_plans``: id(resource) -> (weak reference to it, its shared state).  The weak reference
confirms the entry is for this very object (ids are reused) and drops the entry when the
resource goes away: nothing here keeps a resource alive.  A resource that takes no weak
reference is checked for every buffer.  ``_last`` is the shared state of the resource seen
last: its ``owner`` (that weak reference) and ``ref_class`` (the class of a ref to it seen
since, or None) let a buffer on the same resource as the previous one, or on a ref of that
class to it, find its state with one global read (``Buffer.__init__`` reads it as
``_buffer_state._last``: it is rebound here) and one weak-reference call.  ``_current``:
the same for the current device's resource, by device.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Optional, Tuple

from .._memory_query import memory_device
from ..device import current_device_function as _current_device
from ..properties import DEFAULT_ALIGNMENT, _declared, device_accessible
from ..resource_refs import async_resource_ref
from ..resources import get_per_device_resource, per_device_cache, remember_per_device

class _State:
    """What a buffer knows beyond its address, size, resource and stream."""

    __slots__ = ("device", "host_only", "capacity", "alignment", "keep", "kind", "closed",
                 "plain", "shared", "gone", "closed_twin", "empty_twin", "owner", "ref_class",
                 "asks")
    device: Optional[int]      # the device of the memory; None for host-only memory
    host_only: bool
    capacity: Optional[int]    # bytes allocated; None: the buffer's size
    alignment: int
    keep: Any                  # the stream object held for the buffer's stream, or None
    kind: Optional[str]        # the cached memory kind ("device", "pinned", ...)
    closed: bool
    plain: bool                # open, shared: close() frees with (ptr, size, 256, handle)
    shared: bool               # one resource's (never changed), not one buffer's
    gone: bool                 # the buffer owns no memory (closed and freed, or empty)
    closed_twin: "_State"      # for a shared state: its closed counterpart
    empty_twin: "_State"       # for a shared plain state: the one of its empty buffers
    owner: Any                 # for a shared plain state: the weak reference to its resource
    ref_class: Any             # ... and the class of a ref to that resource seen, or None
    asks: bool                 # the resource declares no properties: the memory's kind and
                               # device are the runtime's answer for the pointer (Buffer's
                               # _memory_kind), asked once

    def copy(self) -> "_State":
        """A buffer's own copy (not plain, not shared; owning what the original's buffer
        owns)."""
        state = _State.__new__(_State)
        state.device = self.device
        state.host_only = self.host_only
        state.capacity = self.capacity
        state.alignment = self.alignment
        state.keep = self.keep
        state.kind = self.kind
        state.closed = self.closed
        state.gone = self.gone
        state.asks = self.asks
        state.plain = state.shared = False
        state.closed_twin = state.empty_twin = state
        return state


def _shared_state(device: Optional[int], host_only: bool, asks: bool = False) -> _State:
    """A resource's shared open state and its closed twin (``asks``: see ``_State``)."""
    state = _State.__new__(_State)
    state.asks = asks
    state.device = device
    state.host_only = host_only
    state.capacity = None
    state.alignment = DEFAULT_ALIGNMENT
    state.keep = state.kind = None
    state.closed = False
    state.plain = state.shared = True
    state.gone = False
    twin = state.copy()
    twin.closed = twin.shared = twin.gone = True
    state.closed_twin = twin
    empty = state.empty_twin = state.copy()
    empty.shared = empty.gone = True
    empty.closed_twin = twin
    return state


_plans: Dict[int, Tuple[Any, _State]] = {}


class _Gone:
    __slots__ = ("__weakref__",)


_last: _State = _shared_state(None, True)
_last.owner = weakref.ref(_Gone())   # a weak reference that returns None
_last.ref_class = None


def _forget(key: int) -> Callable[[Any], None]:
    # the table is bound now: the callback may run while shutdown clears module globals
    def forget(wr: Any, _plans: Dict[int, Tuple[Any, _State]] = _plans) -> None:
        entry = _plans.get(key)
        if entry is not None and entry[0] is wr:
            _plans.pop(key, None)
    return forget


def _plan(resource: Any, target: Any) -> Tuple[Any, _State]:
    """Check ``resource`` (an async resource, or an async ref to ``target``) as an
    ``async_resource_ref`` does, and remember what a buffer needs to know of ``target``."""
    if target is resource:
        async_resource_ref(resource)  # TypeError naming what is missing
    props = _declared(target)
    host_only = device_accessible not in props and bool(props)
    state = _shared_state(None if host_only else memory_device(target), host_only,
                          not props)
    try:
        wr = weakref.ref(target, _forget(id(target)))
    except TypeError:
        return (None, state)
    entry = _plans[id(target)] = (wr, state)
    return entry


def _state_for(resource: Any, alignment: int, keep: Any, device: Optional[int]) -> _State:
    """The state of a new buffer on ``resource`` (checked here, once per resource object):
    the resource's shared one, or the buffer's own when it has a stream object to hold, an
    alignment other than the default, or memory whose device only the current device says
    (``device``: the one already read, or None)."""
    global _last
    is_ref = isinstance(resource, async_resource_ref)
    target = resource.resource if is_ref else resource
    entry = _plans.get(id(target))
    if entry is None or entry[0]() is not target:
        entry = _plan(resource, target)
    wr, state = entry
    if wr is not None and (state.device is not None or state.host_only):
        last = _last
        # a cache field of a shared state, read only beside ``owner``: any value is safe
        state.ref_class = (type(resource) if is_ref else
                           last.ref_class if last.owner() is target else None)
        state.owner = wr
        _last = state
    if keep is not None or alignment is not DEFAULT_ALIGNMENT or (
            state.device is None and not state.host_only):
        state = state.copy()
        state.alignment = alignment
        state.keep = keep
        if state.device is None and not state.host_only:
            state.device = _current_device()() if device is None else device
    return state


#: device -> (its per-device resource, the state of a plain buffer on it): what a buffer made
#: without ``resource`` finds in one look-up; cleared by ``per_device`` whenever its table
#: changes, so it holds nothing the table does not
_current: Dict[int, Tuple[Any, _State]] = per_device_cache({})


def _current_entry(device: int) -> Tuple[Any, _State]:
    """The resource of ``device`` and a plain buffer's state on it, remembered in ``_current``
    unless the state is the buffer's own (memory whose device only the current device says)
    or the per-device table changed meanwhile."""
    resource = get_per_device_resource(device)
    state = _state_for(resource, DEFAULT_ALIGNMENT, None, device)
    entry = (resource, state)
    if state.shared:
        remember_per_device(_current, device, resource, entry)
    return entry

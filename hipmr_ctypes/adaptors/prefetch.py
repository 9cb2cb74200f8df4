"""``PrefetchResource``: prefetches every new allocation to a device."""
from __future__ import annotations

from typing import Any, Optional, Tuple

from .. import device as _device
from ..properties import DEFAULT_ALIGNMENT, _declared, host_accessible
from .._checks import check_args, check_stream
from ._base import BoundAdaptor
from ._checked import upstream_calls

__all__ = ["PrefetchResource"]


class PrefetchResource(BoundAdaptor):
    """``PrefetchResource(upstream, device=None)``: after each allocation, prefetches the
    memory to ``device`` (default: the device current when the allocation is made) with
    ``hipMemPrefetchAsync``, on the allocation's stream (the null stream for ``allocate``).
    Memory that cannot be prefetched (device or pinned memory: the runtime answers
    ``hipErrorInvalidValue``) is handed out unchanged, as RMM does, so the adaptor can sit over
    any resource; over an upstream without ``host_accessible`` (which cannot be managed memory)
    no prefetch is even tried.  Any other prefetch failure gives the memory back and raises.
    Deallocation goes to the upstream (after the arguments are checked).  An async resource
    when the upstream is one; equal to another over an equal upstream with the same device.
    """

    def __init__(self, upstream: Any, device: Optional[int] = None) -> None:
        ref = self._set_upstream(upstream)
        if device is not None:
            device = _device.check_device(device)
        self._device = device
        self._bind(ref, device)

    def _bind(self, ref: Any, device: Optional[int]) -> None:
        up_alloc, up_dealloc, up_alloc_async, up_dealloc_async = upstream_calls(ref)

        try_prefetch = _device.prefetch_if_managed
        get_device = _device.get_device
        if host_accessible not in _declared(ref.resource):  # device memory: nothing to do
            def prefetch(ptr: int, nbytes: int, handle: int) -> None:
                pass
        else:
            def prefetch(ptr: int, nbytes: int, handle: int) -> None:
                try_prefetch(ptr, nbytes, get_device() if device is None else device, handle)

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            bytes, alignment = check_args(bytes, alignment)
            ptr = up_alloc(bytes, alignment)
            if ptr and bytes:
                try:
                    prefetch(ptr, bytes, 0)
                except BaseException:
                    up_dealloc(ptr, bytes, alignment)
                    raise
            return ptr

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            bytes, alignment = check_args(bytes, alignment)
            handle = check_stream(stream)
            ptr: int = up_alloc_async(bytes, alignment, stream)
            if ptr and bytes:
                try:
                    prefetch(ptr, bytes, handle)
                except BaseException:
                    up_dealloc_async(ptr, bytes, alignment, stream)
                    raise
            return ptr

        self._build(allocate_async, allocate=allocate)  # frees pass straight through

    def _settings(self) -> Tuple[Any, ...]:
        return (self._device,)

    @property
    def device(self) -> Optional[int]:
        """The target device (None: the current device at each allocation)."""
        return self._device

    def __repr__(self) -> str:
        return f"PrefetchResource({self._upstream.resource!r}, device={self._device})"

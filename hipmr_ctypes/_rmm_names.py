"""RMM's (and hipMM's) spellings, each with ours: what an ``AttributeError`` or ``TypeError``
says to a user who writes RMM by habit (docs/porting.md has the whole table).  Loaded only on
those error paths, never by a working program."""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["attribute_hint", "keyword_hint", "stream_as_alignment_hint"]

#: RMM's name -> what to write here
_NAMES = {
    "DeviceBuffer": "hmr.Buffer(size, resource=..., stream=...) (RMM's mr= is resource=)",
    "CudaMemoryResource": "hmr.DeviceMemoryResource()",
    "CudaAsyncMemoryResource": "hmr.AsyncMemoryResource()",
    "CudaAsyncViewMemoryResource": "hmr.AsyncMemoryResource.from_default_pool()",
    "PinnedHostMemoryResource": "hmr.PinnedMemoryResource()",
    "SystemMemoryResource": "hmr.HostMemoryResource()",
    "PoolMemoryResource": "hmr.PoolResource(upstream, initial_pool_size, maximum_pool_size) "
                          "(RMM's upstream_mr= is upstream=)",
    "FixedSizeMemoryResource": "hmr.FixedSizeResource(upstream, block_size)",
    "BinningMemoryResource": "hmr.BinningResource(upstream, ...)",
    "CallbackMemoryResource": "hmr.CallbackResource(allocate, deallocate)",
    "LimitingResourceAdaptor": "hmr.LimitingResource(upstream, limit)",
    "LoggingResourceAdaptor": "hmr.LoggingResource(upstream, file)",
    "StatisticsResourceAdaptor": "hmr.StatisticsResource(upstream)",
    "TrackingResourceAdaptor": "hmr.TrackingResource(upstream)",
    "FailureCallbackResourceAdaptor": "hmr.FailureCallbackResource(upstream, callback)",
    "PrefetchResourceAdaptor": "hmr.PrefetchResource(upstream)",
    "RMMError": "hmr.HipError (out of memory: hmr.OutOfMemoryError)",
    "mr": "the resources themselves, at the top level (hmr.PoolResource, "
          "hmr.get_current_device_resource, ...)",
    "rmm_cupy_allocator": "hipmr_ctypes.interop.cupy.allocator()",
    "get_current_device_resource_type": "type(hmr.get_current_device_resource())",
}


def attribute_hint(module: str, name: str) -> Optional[str]:
    """The message of the ``AttributeError`` for ``module.name`` when ``name`` is RMM's
    spelling of something the package has, else None."""
    ours = _NAMES.get(name)
    if ours is None:
        return None
    return (f"module {module!r} has no attribute {name!r}: for RMM's {name} write {ours}; "
            f"docs/porting.md lists RMM's names and ours")


def keyword_hint(call: str, rmm: str, ours: str) -> str:
    """The message of the ``TypeError`` for RMM's keyword ``rmm`` passed to ``call``, whose
    keyword for the same is ``ours``."""
    return (f"{call} got RMM's keyword {rmm}=: write {ours}= (docs/porting.md lists RMM's "
            f"names and ours)")


def stream_as_alignment_hint(value: Any, name: str) -> Optional[str]:
    """The message of the ``TypeError`` for a stream passed where the alignment goes (RMM's
    ``mr.allocate(nbytes, stream)``), else None."""
    if name != "alignment":
        return None
    kind = type(value).__name__
    looks = (hasattr(value, "__cuda_stream__") or "stream" in kind.lower()
             or hasattr(value, "cuda_stream") or hasattr(value, "handle"))
    if not looks:
        return None
    return (f"alignment must be an int power of two, not {kind}: allocate(bytes, "
            f"alignment=256) takes no stream (RMM's mr.allocate(nbytes, stream)); write "
            f"mr.allocate_async(nbytes, 256, stream) for an allocation ordered on a stream, "
            f"or mr.allocate(nbytes) for one on the default stream")

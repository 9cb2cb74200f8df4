"""Stream-ordered pinned host memory and managed memory from memory pools:
``AsyncPinnedMemoryResource`` (a pool located on the host) and ``AsyncManagedMemoryResource``
(a pool of managed memory), each an :class:`AsyncMemoryResource` with its ``MemoryPool``,
policies and settings; only the pool's properties differ.

Where the runtime has them: a pool located on the host needs ``hipMemLocationTypeHost``
(HIP 7.2: the 7.2.4 headers have it, the 6.4.3 ones do not) or CUDA 13; a managed pool needs
``hipMemAllocationTypeManaged``, which no ROCm release through 7.2 declares, or CUDA 13.
Elsewhere making one raises ``NotSupportedError`` before any pool is created.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .. import _hip
from .._hip.exceptions import NotSupportedError
from .._hip.types import HOST_POOLS_SINCE, hipMemLocationTypeHost
from ..properties import device_accessible, host_accessible
from .._sizes import Size
from .async_memory import AsyncMemoryResource

__all__ = ["AsyncPinnedMemoryResource", "AsyncManagedMemoryResource"]

#: CUDA's cudaMemAllocationTypeManaged (CUDA 13); no ROCm release through 7.2 declares HIP's
_MANAGED_ALLOCATION = 2
#: the first CUDA runtime with host-located and managed memory pools
_CUDA_POOLS_SINCE = (13, 0, 0)


def _require(rt: Any, what: str, amd_since: Optional[Tuple[int, int, int]]) -> None:
    version = tuple(rt.runtime_version())
    if rt.platform == "nvidia":
        if version < _CUDA_POOLS_SINCE:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    f"{what} needs CUDA 13 or later; this runtime is CUDA "
                                    f"{'.'.join(map(str, version))}", None)
        return
    if amd_since is None:
        raise NotSupportedError(801, "hipErrorNotSupported",
                                f"{what}: no ROCm release through 7.2 has managed memory "
                                "pools (hipMemAllocationTypeManaged); use "
                                "PoolResource(ManagedMemoryResource()) instead",
                                None)
    if version < amd_since:
        raise NotSupportedError(801, "hipErrorNotSupported",
                                f"{what} needs HIP {amd_since[0]}.{amd_since[1]} or later "
                                "(hipMemLocationTypeHost); this runtime is "
                                f"{'.'.join(map(str, version))}: use "
                                "PoolResource(PinnedMemoryResource()) instead",
                                None)


def _settings(resource: AsyncMemoryResource) -> Dict[str, Any]:
    settings = dict(resource._settings)
    return {k: settings.get(k) for k in ("initial_pool_size", "release_threshold",
                                         "enable_ipc")}


class AsyncPinnedMemoryResource(AsyncMemoryResource):
    """Stream-ordered pinned host memory (``hipMallocFromPoolAsync`` / ``hipFreeAsync``) from
    a memory pool it creates located on the host (``hipMemLocationTypeHost``): accessible
    from the host and the devices, reused in stream order like device memory of an
    :class:`AsyncMemoryResource`, whose arguments it takes (``device``: the device whose
    streams use it).  HIP 7.2+ / CUDA 13+; ``NotSupportedError`` elsewhere."""

    __slots__ = ()
    properties: Tuple[type, ...] = (device_accessible, host_accessible)
    _allocation_kind = "pinned"   # what _memory_query.memory_kind says of its memory

    def __init__(self, device: Optional[Any] = None, *, initial_pool_size: Optional[Size] = None,
                 release_threshold: Optional[Size] = None, enable_ipc: bool = False,
                 maximum_pool_size: Optional[Size] = None) -> None:
        _require(_hip.get_runtime(), type(self).__name__, HOST_POOLS_SINCE)
        super().__init__(device, initial_pool_size=initial_pool_size,
                         release_threshold=release_threshold, enable_ipc=enable_ipc,
                         maximum_pool_size=maximum_pool_size)
        # A pool located on the host grants no device access of its own (CUDA 13 refuses a
        # memset of its memory until then): the resource's device reads and writes it.
        self.pool.set_access(self._device)

    _pool_location_type = hipMemLocationTypeHost   # its id is ignored

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild, (type(self), self._device, _settings(self)))


class AsyncManagedMemoryResource(AsyncMemoryResource):
    """Stream-ordered managed memory from a memory pool of managed memory it creates (CUDA
    13's ``cudaMemAllocationTypeManaged``, preferring ``device``), with the arguments of
    :class:`AsyncMemoryResource`.  ``NotSupportedError`` on AMD (no ROCm release through 7.2
    has managed pools) and before CUDA 13."""

    __slots__ = ()
    properties: Tuple[type, ...] = (device_accessible, host_accessible)
    _allocation_kind = "managed"

    def __init__(self, device: Optional[Any] = None, *, initial_pool_size: Optional[Size] = None,
                 release_threshold: Optional[Size] = None, enable_ipc: bool = False,
                 maximum_pool_size: Optional[Size] = None) -> None:
        _require(_hip.get_runtime(), type(self).__name__, None)
        super().__init__(device, initial_pool_size=initial_pool_size,
                         release_threshold=release_threshold, enable_ipc=enable_ipc,
                         maximum_pool_size=maximum_pool_size)

    _pool_alloc_type = _MANAGED_ALLOCATION

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild, (type(self), self._device, _settings(self)))


def _rebuild(cls: Any, device: int, settings: Dict[str, Any]) -> Any:
    """Unpickling: a new pool with the settings the pickled one was made with."""
    return cls(device, **settings)

"""``PinnedMemoryResource``: page-locked host memory from ``hipHostMalloc`` / ``hipHostFree``
(RMM's ``PinnedHostMemoryResource``, CCCL's ``pinned_memory_resource``)."""
from __future__ import annotations

from ctypes import c_void_p
from functools import reduce
from operator import or_
from typing import Tuple

from .. import _hip
from .._hip.types import (hipHostMallocMapped, hipHostMallocPortable,
                          hipHostMallocWriteCombined)
from ..properties import device_accessible, host_accessible
from ._common import FlagsEqual, SyncResource

__all__ = ["PinnedMemoryResource", "PINNED_FLAGS"]

_AMD_ONLY = {"hipHostMallocNumaUser": 0x20000000, "hipHostMallocCoherent": 0x40000000,
             "hipHostMallocNonCoherent": 0x80000000}
#: Every flag ``PinnedMemoryResource`` accepts, by HIP name.
PINNED_FLAGS = {"hipHostMallocDefault": 0, "hipHostMallocPortable": hipHostMallocPortable,
                "hipHostMallocMapped": hipHostMallocMapped,
                "hipHostMallocWriteCombined": hipHostMallocWriteCombined, **_AMD_ONLY}
_MASK = reduce(or_, PINNED_FLAGS.values(), 0)
_COHERENT_BOTH = _AMD_ONLY["hipHostMallocCoherent"] | _AMD_ONLY["hipHostMallocNonCoherent"]


def _check_flags(flags: object) -> int:
    if isinstance(flags, bool) or not isinstance(flags, int):
        raise TypeError(f"flags must be an int, not {type(flags).__name__}")
    if flags < 0 or flags & ~_MASK:
        names = ", ".join(f"{k}={v:#x}" for k, v in PINNED_FLAGS.items())
        raise ValueError(f"flags={flags:#x} is not a combination of {names}")
    if flags & _COHERENT_BOTH == _COHERENT_BOTH:
        raise ValueError("flags: hipHostMallocCoherent and hipHostMallocNonCoherent exclude "
                         "each other")
    return int(flags)


class PinnedMemoryResource(FlagsEqual, SyncResource):
    """Page-locked (pinned) host memory from ``hipHostMalloc(ptr, bytes, flags)``, freed with
    ``hipHostFree``: accessible from the host and from every device.

    ``flags``: a combination of ``PINNED_FLAGS`` (0 = ``hipHostMallocDefault``).  The AMD-only
    flags (NumaUser, Coherent, NonCoherent) are passed as 0 on the ``nvidia`` platform, as
    HIP's NVIDIA header defines them.  Not stream-ordered (see ``SyncResource``).
    Alignment: a power of two up to 256.  Equal when the flags are equal.
    """

    __slots__ = ("_flags", "_native_flags", "_rt", "_malloc", "_free_fn")
    properties: Tuple[type, ...] = (device_accessible, host_accessible)
    _allocation_kind = "pinned"   # what _memory_query.memory_kind says of its memory

    def __init__(self, flags: int = 0) -> None:
        flags = _check_flags(flags)
        rt = _hip.get_runtime()
        self._flags = flags
        self._native_flags = flags & 0x7 if rt.platform == "nvidia" else flags
        self._rt = rt
        self._malloc = rt.fn.hipHostMalloc
        self._free_fn = rt.fn.hipHostFree

    @property
    def flags(self) -> int:
        """The ``hipHostMalloc`` flags."""
        return self._flags

    def _alloc(self, nbytes: int, alignment: int) -> int:
        out = c_void_p()
        st = self._malloc(out, nbytes, self._native_flags)
        if st:
            raise self._rt.error(st, "hipHostMalloc", size=nbytes)
        return out.value or 0

    def _free(self, ptr: int) -> None:
        st = self._free_fn(ptr)
        if st:
            raise self._rt.error(st, "hipHostFree", detail=f"ptr={ptr:#x}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(flags={self._flags:#x})"

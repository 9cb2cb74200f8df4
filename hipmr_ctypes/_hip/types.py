"""Enum values and flags of the HIP runtime ABI (x86-64 Linux, LP64), and its ctypes structures
(defined in ``decls.py`` beside the functions that take them, re-exported here).

Values and layouts follow HIP's headers (``hip_runtime_api.h``, ``driver_types.h``) for every
supported ROCm version and are checked against the real headers by
``tests/binding/test_abi.py`` (a C probe compiled with gcc).
"""
from __future__ import annotations

from .decls import (hipIpcEventHandle_t, hipIpcMemHandle_t, hipMemAccessDesc,
                    hipMemAllocationProp, hipMemAllocationProp_5_2, hipMemLocation,
                    hipMemPoolProps, hipMemPoolPtrExportData, hipPointerAttribute_t)

__all__ = [
    "hipMemLocation", "hipMemAccessDesc", "hipMemPoolProps", "hipPointerAttribute_t",
    "hipIpcMemHandle_t", "hipMemPoolPtrExportData", "hipIpcEventHandle_t", "hipMemAllocationProp",
    "hipMemAllocationProp_5_2", "allocation_prop_type", "STRUCTS", "ENUMS",
]


# name -> ctypes type, with the C type name (for the ABI probe)
STRUCTS = {
    "hipMemLocation": hipMemLocation,
    "hipMemAccessDesc": hipMemAccessDesc,
    "hipMemPoolProps": hipMemPoolProps,
    "hipPointerAttribute_t": hipPointerAttribute_t,
    "hipIpcMemHandle_t": hipIpcMemHandle_t,
    "hipMemPoolPtrExportData": hipMemPoolPtrExportData,
    "hipIpcEventHandle_t": hipIpcEventHandle_t,
}

# ---- enum values and flags (identical in ROCm 5.2.3 ... 7.0 unless noted) ----
hipMemcpyHostToHost = 0
hipMemcpyHostToDevice = 1
hipMemcpyDeviceToHost = 2
hipMemcpyDeviceToDevice = 3
hipMemcpyDefault = 4

hipMemPoolReuseFollowEventDependencies = 1
hipMemPoolReuseAllowOpportunistic = 2
hipMemPoolReuseAllowInternalDependencies = 3
hipMemPoolAttrReleaseThreshold = 4
hipMemPoolAttrReservedMemCurrent = 5
hipMemPoolAttrReservedMemHigh = 6
hipMemPoolAttrUsedMemCurrent = 7
hipMemPoolAttrUsedMemHigh = 8

hipMemAllocationTypePinned = 1
hipMemHandleTypeNone = 0
hipMemHandleTypePosixFileDescriptor = 1
hipMemLocationTypeDevice = 1
hipMemLocationTypeHost = 2          # HIP 7.2 (absent from 6.4's headers); CUDA's value too
#: the first HIP release whose memory pools may be located on the host (the 7.2.4 headers
#: define hipMemLocationTypeHost, the 6.4.3 ones do not)
HOST_POOLS_SINCE = (7, 2, 0)
hipMemAccessFlagsProtNone = 0
hipMemAccessFlagsProtRead = 1
hipMemAccessFlagsProtReadWrite = 3

hipMemAllocationGranularityMinimum = 0
hipMemAllocationGranularityRecommended = 1


def allocation_prop_type(major: int, minor: int) -> type:
    """The ``hipMemAllocationProp`` structure of HIP ``major.minor``: ROCm 5.2's own order
    before 5.3, CUDA's order from then on (tests/binding/test_abi.py checks both against the
    headers of the releases CI runs).  The nvidia platform always takes CUDA's."""
    return hipMemAllocationProp_5_2 if (major, minor) < (5, 3) else hipMemAllocationProp


hipStreamDefault = 0
hipStreamNonBlocking = 1
hipEventDefault = 0
hipEventBlockingSync = 1
hipEventDisableTiming = 2
hipEventInterprocess = 4

hipHostMallocDefault = 0
hipHostMallocPortable = 1
hipHostMallocMapped = 2
hipHostMallocWriteCombined = 4

# hipHostRegister flags (identical in every release).  hipHostRegisterReadOnly (8) is not in
# the 5.2.3 headers; the 6.4.3 and 7.2.4 ones define it as "ignored on AMD devices", on the
# bit of hipExtHostRegisterCoarseGrained: so the package passes it only on the nvidia
# platform, where it is cudaHostRegisterReadOnly
hipHostRegisterDefault = 0
hipHostRegisterPortable = 1
hipHostRegisterMapped = 2
hipHostRegisterIoMemory = 4
hipExtHostRegisterCoarseGrained = 8
cudaHostRegisterReadOnly = 8

hipMemAttachGlobal = 1
hipMemAttachHost = 2
hipMemAttachSingle = 4

# hipDeviceAttribute_t (CUDA-compatible block, never renumbered)
hipDeviceAttributeComputeCapabilityMajor = 23
hipDeviceAttributeManagedMemory = 24
hipDeviceAttributeComputeCapabilityMinor = 61
hipDeviceAttributeMultiprocessorCount = 63
hipDeviceAttributePciBusId = 67
hipDeviceAttributePciDeviceId = 68
hipDeviceAttributeConcurrentManagedAccess = 9
hipDeviceAttributeCanMapHostMemory = 3
hipDeviceAttributeIntegrated = 16
hipDeviceAttributePageableMemoryAccess = 65
hipDeviceAttributeUnifiedAddressing = 85
hipDeviceAttributeWarpSize = 87
hipDeviceAttributeMemoryPoolsSupported = 88
hipDeviceAttributeMemoryPoolSupportedHandleTypes = 91

# hipIpcOpenMemHandle accepts exactly this flag, whose value changed in ROCm 6.0 (0 -> 1);
# CUDA's cudaIpcMemLazyEnablePeerAccess is 1.
def ipc_lazy_enable_peer_access(major: int) -> int:
    """``hipIpcMemLazyEnablePeerAccess`` of HIP ``major``: 0 before 6, 1 from 6 on."""
    return 0 if major < 6 else 1


# hipExtMallocWithFlags flags (values, not bits): Finegrained in every release, Uncached from
# HIP 5.5 (fine-grained memory the device does not cache), Contiguous from 6.2
hipDeviceMallocDefault = 0
hipDeviceMallocFinegrained = 1
hipMallocSignalMemory = 2
hipDeviceMallocUncached = 3
DEVICE_MALLOC_UNCACHED_SINCE = (5, 5)

# hipMemoryAdvise (AMD's numbering, the same in every release; HIP's NVIDIA header numbers
# its own enum from 0, but CUDA's cudaMemoryAdvise, which the nvidia platform calls, has
# these values 1-6; the coarse-grain pair is AMD's alone): advice name -> (set, unset)
MEM_ADVICE = {"read_mostly": (1, 2), "preferred_location": (3, 4), "accessed_by": (5, 6),
              "coarse_grain": (100, 101)}
#: hipCpuDeviceId: "the host" where a device ordinal is expected (cudaCpuDeviceId is -1 too)
hipCpuDeviceId = -1

# Special stream handles
# stream capture (hipStreamCaptureMode, hipStreamCaptureStatus): the same in every release
hipStreamCaptureModeGlobal = 0
hipStreamCaptureModeThreadLocal = 1
hipStreamCaptureModeRelaxed = 2
hipStreamCaptureStatusNone = 0
hipStreamCaptureStatusActive = 1
hipStreamCaptureStatusInvalidated = 2
hipStreamLegacy = 1
hipStreamPerThread = 2

# hipMemoryType: renumbered in ROCm 6.0
MEMORY_TYPE_5 = {0: "host", 1: "device", 2: "array", 3: "unified", 4: "managed"}
MEMORY_TYPE_6 = {0: "unregistered", 1: "host", 2: "device", 3: "managed", 10: "array", 11: "unified"}

# Device attribute names accepted by Device.attribute(name) (lower-case, no prefix)
DEVICE_ATTRIBUTES = {
    "ecc_enabled": 0, "can_map_host_memory": 3, "clock_rate": 5,
    "concurrent_managed_access": 9, "integrated": 16, "l2_cache_size": 19,
    "compute_capability_major": 23, "managed_memory": 24, "max_threads_per_block": 56,
    "memory_bus_width": 59, "memory_clock_rate": 60, "compute_capability_minor": 61,
    "multiprocessor_count": 63, "pageable_memory_access": 65, "pci_bus_id": 67,
    "pci_device_id": 68, "pci_domain_id": 69, "stream_priorities_supported": 78,
    "unified_addressing": 85, "warp_size": 87, "memory_pools_supported": 88,
    "virtual_memory_management_supported": 89, "memory_pool_supported_handle_types": 91,
}

# Enum values the ABI test checks against the headers: C enumerator name -> value
ENUMS = {
    "hipMemcpyHostToHost": hipMemcpyHostToHost, "hipMemcpyHostToDevice": hipMemcpyHostToDevice,
    "hipMemcpyDeviceToHost": hipMemcpyDeviceToHost,
    "hipMemcpyDeviceToDevice": hipMemcpyDeviceToDevice, "hipMemcpyDefault": hipMemcpyDefault,
    "hipMemPoolReuseFollowEventDependencies": hipMemPoolReuseFollowEventDependencies,
    "hipMemPoolReuseAllowOpportunistic": hipMemPoolReuseAllowOpportunistic,
    "hipMemPoolReuseAllowInternalDependencies": hipMemPoolReuseAllowInternalDependencies,
    "hipMemPoolAttrReleaseThreshold": hipMemPoolAttrReleaseThreshold,
    "hipMemPoolAttrReservedMemCurrent": hipMemPoolAttrReservedMemCurrent,
    "hipMemPoolAttrReservedMemHigh": hipMemPoolAttrReservedMemHigh,
    "hipMemPoolAttrUsedMemCurrent": hipMemPoolAttrUsedMemCurrent,
    "hipMemPoolAttrUsedMemHigh": hipMemPoolAttrUsedMemHigh,
    "hipMemAllocationTypePinned": hipMemAllocationTypePinned,
    "hipMemHandleTypeNone": hipMemHandleTypeNone,
    "hipMemHandleTypePosixFileDescriptor": hipMemHandleTypePosixFileDescriptor,
    "hipMemLocationTypeDevice": hipMemLocationTypeDevice,
    "hipMemLocationTypeHost": hipMemLocationTypeHost,
    "hipMemAccessFlagsProtNone": hipMemAccessFlagsProtNone,
    "hipMemAccessFlagsProtRead": hipMemAccessFlagsProtRead,
    "hipMemAccessFlagsProtReadWrite": hipMemAccessFlagsProtReadWrite,
    "hipMemAllocationGranularityMinimum": hipMemAllocationGranularityMinimum,
    "hipMemAllocationGranularityRecommended": hipMemAllocationGranularityRecommended,
    "hipDeviceAttributeComputeCapabilityMajor": hipDeviceAttributeComputeCapabilityMajor,
    "hipDeviceAttributeManagedMemory": hipDeviceAttributeManagedMemory,
    "hipDeviceAttributeComputeCapabilityMinor": hipDeviceAttributeComputeCapabilityMinor,
    "hipDeviceAttributeMultiprocessorCount": hipDeviceAttributeMultiprocessorCount,
    "hipDeviceAttributeConcurrentManagedAccess": hipDeviceAttributeConcurrentManagedAccess,
    "hipDeviceAttributeCanMapHostMemory": hipDeviceAttributeCanMapHostMemory,
    "hipDeviceAttributeIntegrated": hipDeviceAttributeIntegrated,
    "hipDeviceAttributePageableMemoryAccess": hipDeviceAttributePageableMemoryAccess,
    "hipMemAdviseSetReadMostly": 1, "hipMemAdviseUnsetReadMostly": 2,
    "hipMemAdviseSetPreferredLocation": 3, "hipMemAdviseUnsetPreferredLocation": 4,
    "hipMemAdviseSetAccessedBy": 5, "hipMemAdviseUnsetAccessedBy": 6,
    "hipMemAdviseSetCoarseGrain": 100, "hipMemAdviseUnsetCoarseGrain": 101,
    "hipDeviceAttributeUnifiedAddressing": hipDeviceAttributeUnifiedAddressing,
    "hipDeviceAttributeWarpSize": hipDeviceAttributeWarpSize,
    "hipDeviceAttributeMemoryPoolsSupported": hipDeviceAttributeMemoryPoolsSupported,
    "hipDeviceAttributeMemoryPoolSupportedHandleTypes":
        hipDeviceAttributeMemoryPoolSupportedHandleTypes,
    "hipErrorOutOfMemory": 2, "hipErrorInvalidValue": 1, "hipErrorNoDevice": 100,
    "hipErrorInvalidHandle": 400, "hipErrorNotReady": 600, "hipErrorNotSupported": 801,
    "hipStreamCaptureModeGlobal": hipStreamCaptureModeGlobal,
    "hipStreamCaptureModeThreadLocal": hipStreamCaptureModeThreadLocal,
    "hipStreamCaptureModeRelaxed": hipStreamCaptureModeRelaxed,
    "hipStreamCaptureStatusNone": hipStreamCaptureStatusNone,
    "hipStreamCaptureStatusActive": hipStreamCaptureStatusActive,
    "hipStreamCaptureStatusInvalidated": hipStreamCaptureStatusInvalidated,
    "hipErrorStreamCaptureUnsupported": 900, "hipErrorStreamCaptureInvalidated": 901,
    "hipErrorStreamCaptureUnmatched": 903, "hipErrorStreamCaptureUnjoined": 904,
    "hipErrorStreamCaptureIsolation": 905, "hipErrorStreamCaptureImplicit": 906,
    "hipErrorCapturedEvent": 907, "hipErrorStreamCaptureWrongThread": 908,
}
# Enumerators newer than ROCm 5.2: name -> (major, minor) of the first header that has them
ENUMS_SINCE = {"hipDeviceAttributeMemoryPoolSupportedHandleTypes": (6, 1),
               "hipMemLocationTypeHost": (7, 2)}

# Macros (#define) the ABI test checks: name -> value
MACROS = {
    "hipStreamDefault": hipStreamDefault, "hipStreamNonBlocking": hipStreamNonBlocking,
    "hipEventDefault": hipEventDefault, "hipEventBlockingSync": hipEventBlockingSync,
    "hipEventDisableTiming": hipEventDisableTiming, "hipEventInterprocess": hipEventInterprocess,
    "hipHostMallocDefault": hipHostMallocDefault, "hipHostMallocPortable": hipHostMallocPortable,
    "hipHostMallocMapped": hipHostMallocMapped,
    "hipHostMallocWriteCombined": hipHostMallocWriteCombined,
    "hipMemAttachGlobal": hipMemAttachGlobal, "hipMemAttachHost": hipMemAttachHost,
    "hipMemAttachSingle": hipMemAttachSingle,
    "hipDeviceMallocDefault": hipDeviceMallocDefault,
    "hipDeviceMallocFinegrained": hipDeviceMallocFinegrained,
    "hipMallocSignalMemory": hipMallocSignalMemory,
    "hipHostRegisterDefault": hipHostRegisterDefault,
    "hipHostRegisterPortable": hipHostRegisterPortable,
    "hipHostRegisterMapped": hipHostRegisterMapped,
    "hipHostRegisterIoMemory": hipHostRegisterIoMemory,
    "hipExtHostRegisterCoarseGrained": hipExtHostRegisterCoarseGrained,
}

"""The ``nvidia`` back end: the HIP function table through libcudart, as HIP's own
``nvidia_detail/nvidia_hip_runtime_api.h`` maps it (docs/internals.md, "Back ends").

Most functions are the CUDA runtime function of the same shape, bound directly (no Python in
between, so hot calls cost one ctypes call).  The few that HIP maps onto the driver API or onto
a different signature get a small shim here.  Statuses stay in CUDA's numbering on the success
path; ``Runtime.error`` translates a failure with :func:`cuda_to_hip`.
"""
from __future__ import annotations

import ctypes
from _thread import allocate_lock
from ctypes import POINTER, Structure, c_char_p, c_int, c_size_t, c_uint, c_void_p
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .decls import DECL_BY_NAME
from .errors import ERROR_NAMES, NotSupportedError
from .loader import load_first, nvidia_candidates
from .runtime import Functions, Runtime, decode_cuda_version, missing_function

__all__ = ["create_nvidia_runtime", "cuda_to_hip", "hip_to_cuda", "NAME_MAP", "ATTRIBUTE_MAP"]

# hip name -> cudart symbol, for calls mapped one to one
NAME_MAP: Dict[str, str] = {
    "hipRuntimeGetVersion": "cudaRuntimeGetVersion", "hipDriverGetVersion": "cudaDriverGetVersion",
    "hipGetLastError": "cudaGetLastError", "hipPeekAtLastError": "cudaPeekAtLastError",
    "hipGetDeviceCount": "cudaGetDeviceCount", "hipGetDevice": "cudaGetDevice",
    "hipSetDevice": "cudaSetDevice", "hipDeviceSynchronize": "cudaDeviceSynchronize",
    "hipDeviceCanAccessPeer": "cudaDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess": "cudaDeviceEnablePeerAccess",
    "hipDeviceDisablePeerAccess": "cudaDeviceDisablePeerAccess",
    "hipMemcpyPeer": "cudaMemcpyPeer", "hipMemcpyPeerAsync": "cudaMemcpyPeerAsync",
    "hipMemGetInfo": "cudaMemGetInfo", "hipMalloc": "cudaMalloc", "hipFree": "cudaFree",
    "hipHostMalloc": "cudaHostAlloc", "hipHostFree": "cudaFreeHost",
    "hipMallocManaged": "cudaMallocManaged", "hipMemcpy": "cudaMemcpy",
    "hipMemcpyAsync": "cudaMemcpyAsync", "hipMemset": "cudaMemset",
    "hipMemsetAsync": "cudaMemsetAsync", "hipMallocAsync": "cudaMallocAsync",
    "hipFreeAsync": "cudaFreeAsync", "hipMallocFromPoolAsync": "cudaMallocFromPoolAsync",
    "hipMemPoolCreate": "cudaMemPoolCreate", "hipMemPoolDestroy": "cudaMemPoolDestroy",
    "hipMemPoolSetAttribute": "cudaMemPoolSetAttribute",
    "hipMemPoolGetAttribute": "cudaMemPoolGetAttribute", "hipMemPoolTrimTo": "cudaMemPoolTrimTo",
    "hipMemPoolSetAccess": "cudaMemPoolSetAccess", "hipMemPoolGetAccess": "cudaMemPoolGetAccess",
    "hipDeviceGetDefaultMemPool": "cudaDeviceGetDefaultMemPool",
    "hipDeviceGetMemPool": "cudaDeviceGetMemPool", "hipDeviceSetMemPool": "cudaDeviceSetMemPool",
    "hipMemPoolExportPointer": "cudaMemPoolExportPointer",
    "hipMemPoolImportPointer": "cudaMemPoolImportPointer",
    "hipMemPoolExportToShareableHandle": "cudaMemPoolExportToShareableHandle",
    "hipMemPoolImportFromShareableHandle": "cudaMemPoolImportFromShareableHandle",
    "hipIpcGetMemHandle": "cudaIpcGetMemHandle", "hipIpcOpenMemHandle": "cudaIpcOpenMemHandle",
    "hipIpcCloseMemHandle": "cudaIpcCloseMemHandle",
    "hipStreamCreateWithPriority": "cudaStreamCreateWithPriority",
    "hipStreamDestroy": "cudaStreamDestroy", "hipStreamSynchronize": "cudaStreamSynchronize",
    "hipStreamQuery": "cudaStreamQuery", "hipStreamWaitEvent": "cudaStreamWaitEvent",
    "hipStreamGetPriority": "cudaStreamGetPriority", "hipStreamGetFlags": "cudaStreamGetFlags",
    "hipStreamGetDevice": "cudaStreamGetDevice", "hipStreamGetId": "cudaStreamGetId",
    "hipDeviceGetStreamPriorityRange": "cudaDeviceGetStreamPriorityRange",
    "hipEventCreateWithFlags": "cudaEventCreateWithFlags", "hipEventRecord": "cudaEventRecord",
    "hipEventSynchronize": "cudaEventSynchronize", "hipEventQuery": "cudaEventQuery",
    "hipEventElapsedTime": "cudaEventElapsedTime", "hipEventDestroy": "cudaEventDestroy",
}

# hipDeviceAttribute_t -> cudaDeviceAttr (only the attributes HIP's header maps that we use)
ATTRIBUTE_MAP: Dict[int, int] = {
    0: 32,    # EccEnabled
    3: 19,    # CanMapHostMemory
    5: 13,    # ClockRate
    9: 89,    # ConcurrentManagedAccess
    16: 18,   # Integrated
    19: 38,   # L2CacheSize
    23: 75,   # ComputeCapabilityMajor
    24: 83,   # ManagedMemory
    56: 1,    # MaxThreadsPerBlock
    59: 37,   # MemoryBusWidth (GlobalMemoryBusWidth)
    60: 36,   # MemoryClockRate
    61: 76,   # ComputeCapabilityMinor
    63: 16,   # MultiprocessorCount
    65: 88,   # PageableMemoryAccess
    67: 33,   # PciBusId
    68: 34,   # PciDeviceId
    69: 50,   # PciDomainID
    78: 78,   # StreamPrioritiesSupported
    85: 41,   # UnifiedAddressing
    87: 10,   # WarpSize
    88: 115,  # MemoryPoolsSupported
    91: 119,  # MemoryPoolSupportedHandleTypes
}
_DRIVER_ATTRIBUTES = {89: 102}  # VirtualMemoryManagementSupported -> CU_DEVICE_ATTRIBUTE_...

# CUDA runtime codes that HIP maps to a HIP code with a different number
_CUDA_RENUMBERED = {20: 911, 18: 912}
# CUDA codes that keep their number in hipCUDAErrorTohipError (every other code -> 999)
_CUDA_KEPT = frozenset({
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 21, 35, 52, 53, 98, 100, 101, 200, 201, 205, 206,
    207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 300, 301, 302, 303, 304,
    400, 401, 500, 600, 700, 701, 702, 704, 705, 708, 709, 710, 712, 713, 719, 720, 801, 900,
    901, 902, 903, 904, 905, 906, 907, 908, 910, 914, 915,
})
_HIP_TO_CUDA = {v: k for k, v in _CUDA_RENUMBERED.items()}

# CUresult -> cudaError_t for the few driver calls (same numbers for every code we can get)
_CU_KEPT = frozenset({1, 2, 3, 4, 100, 101, 201, 400, 500, 600, 801})


def cuda_to_hip(code: int) -> int:
    """hipCUDAErrorTohipError: a CUDA runtime status -> the HIP status."""
    if code in _CUDA_KEPT:
        return code
    return _CUDA_RENUMBERED.get(code, 999)


def hip_to_cuda(code: int) -> int:
    """hipErrorToCudaError (used for names and messages)."""
    return _HIP_TO_CUDA.get(code, code)


def _cu_status(result: int) -> int:
    if result == 0:
        return 0
    if result == 500:  # CUDA_ERROR_NOT_FOUND -> hipErrorNotFound == cudaErrorSymbolNotFound
        return 500
    return result if result in _CU_KEPT else 999


class _cudaPointerAttributes(Structure):
    # CUDA 13 appends ``long reserved[8]`` (88 bytes in all); a larger buffer is harmless on 12
    _fields_ = [("type", c_int), ("device", c_int), ("devicePointer", c_void_p),
                ("hostPointer", c_void_p), ("reserved", ctypes.c_long * 8)]


class _cudaMemLocation(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


HINT = ("Set HIPMR_LIBRARY to the exact libcudart file, or CUDA_HOME to the CUDA toolkit; "
        "or choose HIPMR_PLATFORM=amd or HIPMR_PLATFORM=emulated.")


def _bind(lib: Any, symbol: str, decl_name: str) -> Any:
    cfunc = getattr(lib, symbol)
    decl = DECL_BY_NAME[decl_name]
    cfunc.restype = decl.restype
    cfunc.argtypes = list(decl.argtypes)
    return cfunc


def _required_missing(symbol: str, where: str, name: str) -> NotSupportedError:
    return NotSupportedError(801, "hipErrorNotSupported",
                             f"required symbol {symbol} is missing from {where}; this is not a "
                             "CUDA runtime library, or it is too old", name)


def _raw(lib: Any, symbol: str, restype: Any, argtypes: List[Any]) -> Callable[..., Any]:
    """``symbol`` of ``lib`` with this C signature."""
    try:
        cfunc = getattr(lib, symbol)
    except AttributeError:
        raise _required_missing(symbol, getattr(lib, "_name", "the library"), symbol) from None
    cfunc.restype = restype
    cfunc.argtypes = argtypes
    bound: Callable[..., Any] = cfunc
    return bound


def create_nvidia_runtime(env: Optional[Mapping[str, str]] = None) -> Runtime:
    """Load libcudart (and libcuda) and build the HIP function table over them."""
    cudart, path = load_first(nvidia_candidates(env), "libcudart (CUDA runtime)", HINT)
    where = path
    fn = Functions()
    for name, symbol in NAME_MAP.items():
        try:
            setattr(fn, name, _bind(cudart, symbol, name))
        except AttributeError:
            if DECL_BY_NAME[name].required:
                raise _required_missing(symbol, where, name) from None
            setattr(fn, name, missing_function(name, where))

    version = c_int()
    fn.hipRuntimeGetVersion(version)
    cuda_version = version.value

    cuda_get_name = _raw(cudart, "cudaGetErrorName", c_char_p, [c_int])
    cuda_get_string = _raw(cudart, "cudaGetErrorString", c_char_p, [c_int])
    fn.hipGetErrorName = lambda code: cuda_get_name(hip_to_cuda(code))
    fn.hipGetErrorString = lambda code: cuda_get_string(hip_to_cuda(code))
    fn.hipExtGetLastError = missing_function("hipExtGetLastError", "the CUDA runtime (AMD only)")

    # --- driver API pieces (libcuda), as HIP's header uses them, opened on first use ---
    driver = _Driver(_open_libcuda)
    _install_driver_shims(fn, driver)

    get_attr: Callable[..., int] = _raw(cudart, "cudaDeviceGetAttribute", c_int, [POINTER(c_int), c_int, c_int])

    def hipDeviceGetAttribute(out: Any, attr: int, device: int) -> int:
        if attr in ATTRIBUTE_MAP:
            return get_attr(out, ATTRIBUTE_MAP[attr], device)
        if attr in _DRIVER_ATTRIBUTES:
            cu = driver.functions()
            if cu is not None:
                dev = c_int()
                st = _cu_status(cu["cuDeviceGet"](dev, device))
                if st:
                    return st
                return _cu_status(cu["cuDeviceGetAttribute"](out, _DRIVER_ATTRIBUTES[attr],
                                                             dev.value))
        return 1  # unmapped attribute: hipErrorInvalidValue, as HIP's header does

    fn.hipDeviceGetAttribute = hipDeviceGetAttribute

    cuda_ptr_attrs: Callable[..., int] = _raw(cudart, "cudaPointerGetAttributes", c_int,
                          [POINTER(_cudaPointerAttributes), c_void_p])

    def hipPointerGetAttributes(out: Any, ptr: int) -> int:
        raw = _cudaPointerAttributes()
        st = cuda_ptr_attrs(raw, ptr)
        if st:
            return st
        if raw.type not in (1, 2, 3):  # HIP's header: anything else is invalid value
            return 1
        out.type = raw.type  # cudaMemoryType Host/Device/Managed == hipMemoryType (6.x) 1/2/3
        out.device = raw.device
        out.devicePointer = raw.devicePointer
        out.hostPointer = raw.hostPointer
        out.isManaged = 0
        out.allocationFlags = 0
        return 0

    fn.hipPointerGetAttributes = hipPointerGetAttributes

    if cuda_version >= 13000:  # CUDA 13 takes a cudaMemLocation by value and a flags word
        prefetch: Callable[..., int] = _raw(cudart, "cudaMemPrefetchAsync", c_int,
                        [c_void_p, c_size_t, _cudaMemLocation, c_uint, c_void_p])

        def hipMemPrefetchAsync(ptr: int, count: int, device: int, stream: int) -> int:
            loc = _cudaMemLocation(1 if device >= 0 else 2, device if device >= 0 else 0)
            return prefetch(ptr, count, loc, 0, stream)
    else:
        prefetch12: Callable[..., int] = _raw(cudart, "cudaMemPrefetchAsync", c_int,
                          [c_void_p, c_size_t, c_int, c_void_p])

        def hipMemPrefetchAsync(ptr: int, count: int, device: int,
                                stream: int) -> int:
            return prefetch12(ptr, count, device, stream)
    fn.hipMemPrefetchAsync = hipMemPrefetchAsync

    def error_name(code: int) -> Optional[str]:
        return ERROR_NAMES.get(code)

    def error_string(status: int) -> Optional[str]:
        raw = cuda_get_string(status)
        return raw.decode() if raw else None

    return Runtime("nvidia", fn, path, cudart, error_name, error_string, to_hip=cuda_to_hip,
                   version_decoder=decode_cuda_version, not_ready=600,
                   extra={"driver": driver, "cuda_version": cuda_version})


def _open_libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


#: where the driver shims say a missing libcuda is
_NO_DRIVER = "this system (libcuda.so.1 not found)"


class _Driver:
    """libcuda.so.1 (the driver API), opened by the first call that needs it: hipInit,
    hipDeviceGetName, hipDeviceTotalMem and the device attributes HIP's NVIDIA header reads
    through the driver.  libcudart opens the driver itself when it first needs it, so opening
    it at import only made the import slower (a large library whose symbols ctypes binds all
    at once).  ``functions()``: the driver functions by name, or None without libcuda."""

    _SIGNATURES: Dict[str, List[Any]] = {
        "cuInit": [c_uint],
        "cuDeviceGet": [POINTER(c_int), c_int],
        "cuDeviceGetName": [c_char_p, c_int, c_int],
        "cuDeviceTotalMem_v2": [POINTER(c_size_t), c_int],
        "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int],
    }

    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener
        self._lock = allocate_lock()
        self._functions: Optional[Dict[str, Callable[..., int]]] = None  # {} without libcuda

    def functions(self) -> Optional[Dict[str, Callable[..., int]]]:
        found = self._functions
        if found is None:
            with self._lock:
                found = self._functions
                if found is None:
                    try:
                        lib = self._opener()
                    except OSError:
                        lib = None
                    # a libcuda without one of these raises NotSupportedError, every time
                    found = {} if lib is None else {
                        name: _raw(lib, name, c_int, argtypes)
                        for name, argtypes in self._SIGNATURES.items()}
                    self._functions = found
        return found or None


def _install_driver_shims(fn: Functions, driver: _Driver) -> None:
    """hipInit, hipDeviceGetName, hipDeviceTotalMem: driver calls in HIP's NVIDIA header."""

    def functions(name: str) -> Dict[str, Callable[..., int]]:
        cu = driver.functions()
        if cu is None:  # what an optional symbol the library lacks raises (missing_function)
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    f"{name} is not exported by {_NO_DRIVER}", name)
        return cu

    def hipInit(flags: int) -> int:
        return _cu_status(functions("hipInit")["cuInit"](flags))

    def _device(cu: Dict[str, Callable[..., int]], ordinal: int) -> Tuple[int, Optional[int]]:
        st = _cu_status(cu["cuInit"](0))
        if st:
            return st, None
        dev = c_int()
        st = _cu_status(cu["cuDeviceGet"](dev, ordinal))
        return st, dev.value

    def hipDeviceGetName(buf: Any, length: int, ordinal: int) -> int:
        cu = functions("hipDeviceGetName")
        st, dev = _device(cu, ordinal)
        return st or _cu_status(cu["cuDeviceGetName"](buf, length, dev))

    def hipDeviceTotalMem(out: Any, ordinal: int) -> int:
        cu = functions("hipDeviceTotalMem")
        st, dev = _device(cu, ordinal)
        return st or _cu_status(cu["cuDeviceTotalMem_v2"](out, dev))

    fn.hipInit = hipInit
    fn.hipDeviceGetName = hipDeviceGetName
    fn.hipDeviceTotalMem = hipDeviceTotalMem

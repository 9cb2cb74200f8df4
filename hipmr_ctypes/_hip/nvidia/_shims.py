"""The ``nvidia`` back end's shims: the HIP functions that HIP's NVIDIA header implements over the
driver API (hipInit, hipDeviceGetName, hipDeviceTotalMem, device attributes libcudart does not
have, hipMemsetD8/D16/D32 and their Async forms, hipMemGetAddressRange, the virtual-memory
calls hipMemAddressReserve ... hipMemGetAllocationGranularity) or over a CUDA
function of another signature (hipPointerGetAttributes, hipMemPrefetchAsync, and by CUDA
runtime version hipGraphInstantiate and hipStreamGetCaptureInfo).  Built by the first call of any of them (``build_shims``); the package
(``__init__.py``) binds everything else at load.
"""
from __future__ import annotations

from _thread import allocate_lock
from ctypes import (POINTER, Structure, c_char_p, c_int, c_long, c_size_t, c_ubyte, c_uint,
                    c_ulonglong, c_ushort, c_void_p)
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

from ..decls import hipMemAccessDesc, hipMemLocation
from ..exceptions import NotSupportedError
from . import _raw

__all__ = ["build_shims", "ATTRIBUTE_MAP"]

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

# CUresult -> cudaError_t for the few driver calls (same numbers for every code we can get)
_CU_KEPT = frozenset({1, 2, 3, 4, 100, 101, 201, 400, 500, 600, 801})


def _cu_status(result: int) -> int:
    if result == 0:
        return 0
    if result == 500:  # CUDA_ERROR_NOT_FOUND -> hipErrorNotFound == cudaErrorSymbolNotFound
        return 500
    return result if result in _CU_KEPT else 999


class _cudaPointerAttributes(Structure):
    # CUDA 13 appends ``long reserved[8]`` (88 bytes in all); a larger buffer is harmless on 12
    _fields_ = [("type", c_int), ("device", c_int), ("devicePointer", c_void_p),
                ("hostPointer", c_void_p), ("reserved", c_long * 8)]


class _cudaMemLocation(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


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
        # CUdeviceptr is a 64-bit integer, passed like a void*; CUstream is a pointer; D32's
        # value is an unsigned int in cuda.h, passed as the same 32 bits of HIP's int
        "cuMemsetD8_v2": [c_void_p, c_ubyte, c_size_t],
        "cuMemsetD16_v2": [c_void_p, c_ushort, c_size_t],
        "cuMemsetD32_v2": [c_void_p, c_int, c_size_t],
        "cuMemsetD8Async": [c_void_p, c_ubyte, c_size_t, c_void_p],
        "cuMemsetD16Async": [c_void_p, c_ushort, c_size_t, c_void_p],
        "cuMemsetD32Async": [c_void_p, c_int, c_size_t, c_void_p],
        "cuMemGetAddressRange_v2": [POINTER(c_void_p), POINTER(c_size_t), c_void_p],
        # virtual memory: CUdeviceptr and CUmemGenericAllocationHandle are 64-bit integers,
        # passed like the table's void* (an out-argument is a c_void_p instance); the
        # properties, access descriptors and locations are HIP's structures, whose layouts
        # are CUDA's (decls.hipMemAllocationProp)
        "cuMemAddressReserve": [POINTER(c_void_p), c_size_t, c_size_t, c_void_p, c_ulonglong],
        "cuMemAddressFree": [c_void_p, c_size_t],
        "cuMemCreate": [POINTER(c_void_p), c_size_t, c_void_p, c_ulonglong],
        "cuMemRelease": [c_void_p],
        "cuMemMap": [c_void_p, c_size_t, c_size_t, c_void_p, c_ulonglong],
        "cuMemUnmap": [c_void_p, c_size_t],
        "cuMemSetAccess": [c_void_p, c_size_t, POINTER(hipMemAccessDesc), c_size_t],
        "cuMemGetAccess": [POINTER(c_ulonglong), POINTER(hipMemLocation), c_void_p],
        "cuMemGetAllocationGranularity": [POINTER(c_size_t), c_void_p, c_int],
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


def _driver_shims(driver: _Driver) -> Dict[str, Callable[..., int]]:
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

    return {"hipInit": hipInit, "hipDeviceGetName": hipDeviceGetName,
            "hipDeviceTotalMem": hipDeviceTotalMem}


_CU_INVALID_CONTEXT = 201


def _context_shims(driver: _Driver, init_context: Callable[[], int]
                   ) -> Dict[str, Callable[..., int]]:
    """The driver calls that ask the calling thread's current context, as HIP's NVIDIA header
    maps them: hipMemsetD8/D16/D32 and their Async forms (``cuMemsetD8_v2`` ...
    ``cuMemsetD32Async``), hipMemGetAddressRange (``cuMemGetAddressRange_v2``) and the
    virtual-memory calls (``cuMemAddressReserve`` ... ``cuMemGetAllocationGranularity``, one
    to one).  Where the
    thread has none yet (CUDA_ERROR_INVALID_CONTEXT: an importing process that only mapped
    pool memory, a new thread), ``init_context`` makes the runtime's primary context current
    (``cudaFree(NULL)``) and the call is made once more."""

    def shim(name: str, symbol: str) -> Callable[..., int]:
        def call(*args: Any) -> int:
            cu = driver.functions()
            if cu is None:
                raise NotSupportedError(801, "hipErrorNotSupported",
                                        f"{name} is not exported by {_NO_DRIVER}", name)
            result = cu[symbol](*args)
            if result == _CU_INVALID_CONTEXT and not init_context():
                result = cu[symbol](*args)
            return _cu_status(result)
        call.__name__ = call.__qualname__ = name
        return call

    return {name: shim(name, symbol) for name, symbol in (
        ("hipMemsetD8", "cuMemsetD8_v2"), ("hipMemsetD16", "cuMemsetD16_v2"),
        ("hipMemsetD32", "cuMemsetD32_v2"), ("hipMemsetD8Async", "cuMemsetD8Async"),
        ("hipMemsetD16Async", "cuMemsetD16Async"), ("hipMemsetD32Async", "cuMemsetD32Async"),
        ("hipMemGetAddressRange", "cuMemGetAddressRange_v2"),
        ("hipMemAddressReserve", "cuMemAddressReserve"), ("hipMemAddressFree", "cuMemAddressFree"),
        ("hipMemCreate", "cuMemCreate"), ("hipMemRelease", "cuMemRelease"),
        ("hipMemMap", "cuMemMap"), ("hipMemUnmap", "cuMemUnmap"),
        ("hipMemSetAccess", "cuMemSetAccess"), ("hipMemGetAccess", "cuMemGetAccess"),
        ("hipMemGetAllocationGranularity", "cuMemGetAllocationGranularity"))}


def build_shims(cudart: Any, cuda_version: int,
                open_libcuda: Callable[[], Any]) -> Dict[str, Callable[..., int]]:
    """The shims over ``cudart`` (of CUDA ``cuda_version``), libcuda opened by the first call
    that needs it (``open_libcuda``): hip name -> function, one per name of the package's
    ``_SHIMS``."""
    # --- driver API pieces (libcuda), as HIP's header uses them, opened on first use ---
    driver = _Driver(open_libcuda)
    cuda_free: Callable[..., int] = _raw(cudart, "cudaFree", c_int, [c_void_p])
    shims = _driver_shims(driver)
    shims.update(_context_shims(driver, lambda: cuda_free(None)))

    get_attr: Callable[..., int] = _raw(cudart, "cudaDeviceGetAttribute", c_int,
                                        [POINTER(c_int), c_int, c_int])

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

    if cuda_version >= 13000:  # CUDA 13 takes a cudaMemLocation by value and a flags word
        prefetch: Callable[..., int] = _raw(cudart, "cudaMemPrefetchAsync", c_int,
                                            [c_void_p, c_size_t, _cudaMemLocation, c_uint,
                                             c_void_p])

        def hipMemPrefetchAsync(ptr: int, count: int, device: int, stream: int) -> int:
            loc = _cudaMemLocation(1 if device >= 0 else 2, device if device >= 0 else 0)
            return prefetch(ptr, count, loc, 0, stream)
    else:
        prefetch12: Callable[..., int] = _raw(cudart, "cudaMemPrefetchAsync", c_int,
                                              [c_void_p, c_size_t, c_int, c_void_p])

        def hipMemPrefetchAsync(ptr: int, count: int, device: int,
                                stream: int) -> int:
            return prefetch12(ptr, count, device, stream)

    # hipMemAdvise: AMD's advice numbers 1-6 are cudaMemoryAdvise's (the coarse-grain pair,
    # 100 and 101, is AMD's alone: hipErrorNotSupported, which is CUDA's 801 too)
    if cuda_version >= 13000:
        advise: Callable[..., int] = _raw(cudart, "cudaMemAdvise", c_int,
                                          [c_void_p, c_size_t, c_int, _cudaMemLocation])

        def hipMemAdvise(ptr: int, count: int, advice: int, device: int) -> int:
            if not 1 <= advice <= 6:
                return 801
            loc = _cudaMemLocation(1 if device >= 0 else 2, device if device >= 0 else 0)
            return advise(ptr, count, advice, loc)
    else:
        advise12: Callable[..., int] = _raw(cudart, "cudaMemAdvise", c_int,
                                            [c_void_p, c_size_t, c_int, c_int])

        def hipMemAdvise(ptr: int, count: int, advice: int, device: int) -> int:
            if not 1 <= advice <= 6:
                return 801
            return advise12(ptr, count, advice, device)

    shims.update(_capture_shims(cudart, cuda_version))
    shims.update(hipDeviceGetAttribute=hipDeviceGetAttribute,
                 hipPointerGetAttributes=hipPointerGetAttributes,
                 hipMemPrefetchAsync=hipMemPrefetchAsync, hipMemAdvise=hipMemAdvise)
    return shims


def _capture_shims(cudart: Any, cuda_version: int) -> Dict[str, Callable[..., int]]:
    """hipGraphInstantiate and hipStreamGetCaptureInfo, whose CUDA counterparts changed:

    * ``cudaGraphInstantiate`` takes ``(exec*, graph, errorNode*, logBuffer, bufferSize)``
      before CUDA 12 and ``(exec*, graph, unsigned long long flags)`` from 12 on (no error
      node or log: HIP's NVIDIA header passes flags 0 and leaves them alone);
    * ``cudaStreamGetCaptureInfo`` is ``(stream, status*, id*)`` before CUDA 12, the former
      ``_v2`` from 12 on (``graph_out``, ``dependencies_out``, ``numDependencies_out`` after
      the id) and, from 13 on, the former ``_v3`` (``edgeData_out`` before the count): the
      extra outputs are optional and passed as NULL."""
    if cuda_version >= 12000:
        instantiate12: Callable[..., int] = _raw(cudart, "cudaGraphInstantiate", c_int,
                                                 [POINTER(c_void_p), c_void_p, c_ulonglong])

        def hipGraphInstantiate(exec_out: Any, graph: int, error_node: Any, log: Any,
                                size: int) -> int:
            return instantiate12(exec_out, graph, 0)
    else:
        instantiate11: Callable[..., int] = _raw(
            cudart, "cudaGraphInstantiate", c_int,
            [POINTER(c_void_p), c_void_p, POINTER(c_void_p), c_char_p, c_size_t])

        def hipGraphInstantiate(exec_out: Any, graph: int, error_node: Any, log: Any,
                                size: int) -> int:
            return instantiate11(exec_out, graph, error_node, log, size)

    status_t, id_t = POINTER(c_int), POINTER(c_ulonglong)
    if cuda_version >= 13000:
        info13: Callable[..., int] = _raw(
            cudart, "cudaStreamGetCaptureInfo", c_int,
            [c_void_p, status_t, id_t, c_void_p, c_void_p, c_void_p, c_void_p])

        def hipStreamGetCaptureInfo(stream: int, status: Any, ident: Any) -> int:
            return info13(stream, status, ident, None, None, None, None)
    elif cuda_version >= 12000:
        info12: Callable[..., int] = _raw(
            cudart, "cudaStreamGetCaptureInfo", c_int,
            [c_void_p, status_t, id_t, c_void_p, c_void_p, c_void_p])

        def hipStreamGetCaptureInfo(stream: int, status: Any, ident: Any) -> int:
            return info12(stream, status, ident, None, None, None)
    else:
        info11: Callable[..., int] = _raw(cudart, "cudaStreamGetCaptureInfo", c_int,
                                          [c_void_p, status_t, id_t])

        def hipStreamGetCaptureInfo(stream: int, status: Any, ident: Any) -> int:
            return info11(stream, status, ident)

    return {"hipGraphInstantiate": hipGraphInstantiate,
            "hipStreamGetCaptureInfo": hipStreamGetCaptureInfo}

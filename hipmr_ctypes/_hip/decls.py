"""The one declaration table of every C function the package calls.

Each row: HIP name, result type, argument types, first HIP version that exports it, and
whether it is required.  The back ends (``amd``, ``nvidia``, ``emulated``) all provide
exactly these names with these C signatures; nothing else in the package sets ``argtypes``.

Calling convention for every back end: output arguments are passed as ctypes *instances*
(``c_void_p()``, ``c_int()``, a Structure); ctypes passes them by reference because the
argument type is a ``POINTER``.  ``void*`` value arguments of ``hipMemPool{Get,Set}Attribute``
take ``ctypes.byref(c_uint64 | c_int)``.  Every function returns the status as an ``int`` in
the back end's own numbering (CUDA's on ``nvidia``); only a non-zero status is translated.
"""
from __future__ import annotations

from ctypes import (POINTER, c_char_p, c_float, c_int, c_size_t, c_uint,
                    c_ulonglong, c_void_p)
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Tuple

from .types import (hipIpcMemHandle_t, hipMemAccessDesc, hipMemLocation, hipMemPoolProps,
                    hipMemPoolPtrExportData, hipPointerAttribute_t)

__all__ = ["Decl", "DECLS", "DECL_BY_NAME", "HOT"]

P_void = POINTER(c_void_p)
P_int = POINTER(c_int)
P_uint = POINTER(c_uint)
P_size = POINTER(c_size_t)
P_float = POINTER(c_float)
hipError_t = c_int
hipStream_t = c_void_p
hipEvent_t = c_void_p
hipMemPool_t = c_void_p


class Decl(tuple):  # type: ignore[type-arg]  # a NamedTuple, without importing typing
    """One C function: ``name``, ``restype``, ``argtypes``, ``since`` (HIP version), ``required``."""

    __slots__ = ()

    def __new__(cls, name: str, restype: object, argtypes: Tuple[object, ...], since: str,
                required: bool = True) -> "Decl":
        return tuple.__new__(cls, (name, restype, argtypes, since, required))

    @property
    def name(self) -> str:
        return self[0]  # type: ignore[no-any-return]

    @property
    def restype(self) -> object:
        return self[1]

    @property
    def argtypes(self) -> Tuple[object, ...]:
        return self[2]  # type: ignore[no-any-return]

    @property
    def since(self) -> str:
        return self[3]  # type: ignore[no-any-return]

    @property
    def required(self) -> bool:
        return self[4]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return "Decl(name=%r, restype=%r, argtypes=%r, since=%r, required=%r)" % self


R = True   # required
O = False  # optional: may be missing from a library; calling it raises NotSupportedError

DECLS: Tuple[Decl, ...] = (
    # init, versions, errors
    Decl("hipInit", hipError_t, (c_uint,), "4.2", R),
    Decl("hipRuntimeGetVersion", hipError_t, (P_int,), "4.2", R),
    Decl("hipDriverGetVersion", hipError_t, (P_int,), "4.2", R),
    Decl("hipGetErrorName", c_char_p, (hipError_t,), "4.2", R),
    Decl("hipGetErrorString", c_char_p, (hipError_t,), "4.2", R),
    Decl("hipGetLastError", hipError_t, (), "4.2", R),
    Decl("hipPeekAtLastError", hipError_t, (), "4.2", R),
    # devices
    Decl("hipGetDeviceCount", hipError_t, (P_int,), "4.2", R),
    Decl("hipGetDevice", hipError_t, (P_int,), "4.2", R),
    Decl("hipSetDevice", hipError_t, (c_int,), "4.2", R),
    Decl("hipDeviceGetAttribute", hipError_t, (P_int, c_int, c_int), "4.2", R),
    Decl("hipDeviceGetName", hipError_t, (c_char_p, c_int, c_int), "4.2", R),
    Decl("hipDeviceTotalMem", hipError_t, (P_size, c_int), "4.2", R),
    Decl("hipDeviceSynchronize", hipError_t, (), "4.2", R),
    Decl("hipDeviceCanAccessPeer", hipError_t, (P_int, c_int, c_int), "4.2", R),
    Decl("hipDeviceEnablePeerAccess", hipError_t, (c_int, c_uint), "4.2", R),
    Decl("hipDeviceDisablePeerAccess", hipError_t, (c_int,), "4.2", R),
    Decl("hipMemGetInfo", hipError_t, (P_size, P_size), "4.2", R),
    # plain memory
    Decl("hipMalloc", hipError_t, (P_void, c_size_t), "4.2", R),
    Decl("hipFree", hipError_t, (c_void_p,), "4.2", R),
    Decl("hipHostMalloc", hipError_t, (P_void, c_size_t, c_uint), "4.2", R),
    Decl("hipHostFree", hipError_t, (c_void_p,), "4.2", R),
    Decl("hipMallocManaged", hipError_t, (P_void, c_size_t, c_uint), "4.2", R),
    Decl("hipMemcpy", hipError_t, (c_void_p, c_void_p, c_size_t, c_int), "4.2", R),
    Decl("hipMemcpyAsync", hipError_t, (c_void_p, c_void_p, c_size_t, c_int, hipStream_t),
         "4.2", R),
    Decl("hipMemcpyPeer", hipError_t, (c_void_p, c_int, c_void_p, c_int, c_size_t), "4.2", R),
    Decl("hipMemcpyPeerAsync", hipError_t,
         (c_void_p, c_int, c_void_p, c_int, c_size_t, hipStream_t), "4.2", R),
    Decl("hipMemset", hipError_t, (c_void_p, c_int, c_size_t), "4.2", R),
    Decl("hipMemsetAsync", hipError_t, (c_void_p, c_int, c_size_t, hipStream_t), "4.2", R),
    Decl("hipMemPrefetchAsync", hipError_t, (c_void_p, c_size_t, c_int, hipStream_t), "4.2", R),
    Decl("hipPointerGetAttributes", hipError_t, (POINTER(hipPointerAttribute_t), c_void_p),
         "4.2", R),
    # stream-ordered allocation and memory pools
    Decl("hipMallocAsync", hipError_t, (P_void, c_size_t, hipStream_t), "5.1", R),
    Decl("hipFreeAsync", hipError_t, (c_void_p, hipStream_t), "5.1", R),
    Decl("hipMallocFromPoolAsync", hipError_t, (P_void, c_size_t, hipMemPool_t, hipStream_t),
         "5.1", R),
    Decl("hipMemPoolCreate", hipError_t, (P_void, POINTER(hipMemPoolProps)), "5.1", R),
    Decl("hipMemPoolDestroy", hipError_t, (hipMemPool_t,), "5.1", R),
    Decl("hipMemPoolSetAttribute", hipError_t, (hipMemPool_t, c_int, c_void_p), "5.1", R),
    Decl("hipMemPoolGetAttribute", hipError_t, (hipMemPool_t, c_int, c_void_p), "5.1", R),
    Decl("hipMemPoolTrimTo", hipError_t, (hipMemPool_t, c_size_t), "5.1", R),
    Decl("hipMemPoolSetAccess", hipError_t,
         (hipMemPool_t, POINTER(hipMemAccessDesc), c_size_t), "5.1", R),
    Decl("hipMemPoolGetAccess", hipError_t,
         (P_int, hipMemPool_t, POINTER(hipMemLocation)), "5.1", R),
    Decl("hipDeviceGetDefaultMemPool", hipError_t, (P_void, c_int), "5.1", R),
    Decl("hipDeviceGetMemPool", hipError_t, (P_void, c_int), "5.1", R),
    Decl("hipDeviceSetMemPool", hipError_t, (c_int, hipMemPool_t), "5.1", R),
    # interprocess: pools shared through a POSIX file descriptor, legacy per-allocation handles.
    # The export writes the fd through its void* (an int*); the import takes the fd itself,
    # by value, in the void*.
    Decl("hipMemPoolExportToShareableHandle", hipError_t, (c_void_p, hipMemPool_t, c_int, c_uint),
         "5.1", R),
    Decl("hipMemPoolImportFromShareableHandle", hipError_t, (P_void, c_void_p, c_int, c_uint),
         "5.1", R),
    Decl("hipMemPoolExportPointer", hipError_t, (POINTER(hipMemPoolPtrExportData), c_void_p),
         "5.1", R),
    Decl("hipMemPoolImportPointer", hipError_t,
         (P_void, hipMemPool_t, POINTER(hipMemPoolPtrExportData)), "5.1", R),
    Decl("hipIpcGetMemHandle", hipError_t, (POINTER(hipIpcMemHandle_t), c_void_p), "4.2", R),
    Decl("hipIpcOpenMemHandle", hipError_t, (P_void, hipIpcMemHandle_t, c_uint), "4.2", R),
    Decl("hipIpcCloseMemHandle", hipError_t, (c_void_p,), "4.2", R),
    # streams
    Decl("hipStreamCreateWithPriority", hipError_t, (P_void, c_uint, c_int), "4.2", R),
    Decl("hipStreamDestroy", hipError_t, (hipStream_t,), "4.2", R),
    Decl("hipStreamSynchronize", hipError_t, (hipStream_t,), "4.2", R),
    Decl("hipStreamQuery", hipError_t, (hipStream_t,), "4.2", R),
    Decl("hipStreamWaitEvent", hipError_t, (hipStream_t, hipEvent_t, c_uint), "4.2", R),
    Decl("hipStreamGetPriority", hipError_t, (hipStream_t, P_int), "4.2", R),
    Decl("hipStreamGetFlags", hipError_t, (hipStream_t, P_uint), "4.2", R),
    Decl("hipStreamGetDevice", hipError_t, (hipStream_t, P_int), "5.6", O),
    Decl("hipDeviceGetStreamPriorityRange", hipError_t, (P_int, P_int), "4.2", R),
    # events
    Decl("hipEventCreateWithFlags", hipError_t, (P_void, c_uint), "4.2", R),
    Decl("hipEventRecord", hipError_t, (hipEvent_t, hipStream_t), "4.2", R),
    Decl("hipEventSynchronize", hipError_t, (hipEvent_t,), "4.2", R),
    Decl("hipEventQuery", hipError_t, (hipEvent_t,), "4.2", R),
    Decl("hipEventElapsedTime", hipError_t, (P_float, hipEvent_t, hipEvent_t), "4.2", R),
    Decl("hipEventDestroy", hipError_t, (hipEvent_t,), "4.2", R),
    # newer, optional
    Decl("hipExtGetLastError", hipError_t, (), "6.0", O),
    Decl("hipStreamGetId", hipError_t, (hipStream_t, POINTER(c_ulonglong)), "7.1", O),
)

DECL_BY_NAME = {d.name: d for d in DECLS}

# Functions on allocation hot paths: resolved once, called with no look-up.
HOT = ("hipMalloc", "hipFree", "hipMallocAsync", "hipFreeAsync", "hipMallocFromPoolAsync",
       "hipStreamQuery")

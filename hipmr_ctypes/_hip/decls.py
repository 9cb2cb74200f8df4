"""The one declaration table of every C function the package calls (HIP's; the C library's and
Python's own few are in ``native.py``), with the C structures those functions take.

Each row: HIP name, first HIP version that exports it, whether it is required (``R``) or
optional (``O``: it may be missing from a library, and calling it then raises
NotSupportedError), result type and the arguments as ``name:type``, named as HIP's header
names them.  The back ends (``amd``, ``nvidia``,
``emulated``) all provide exactly these names with these C signatures; nothing else in the
package sets ``argtypes``.

The rows are one string, read into :class:`Decl` tuples when this module is imported: from a
vendored folder with no ``.pyc``, a table of literal calls took longer to compile than the rest
of the import put together.

Calling convention for every back end: output arguments are passed as ctypes *instances*
(``c_void_p()``, ``c_int()``, a Structure); ctypes passes them by reference because the
argument type is a ``POINTER``.  ``void*`` value arguments of ``hipMemPool{Get,Set}Attribute``
take ``ctypes.byref(c_uint64 | c_int)``.  Every function returns the status as an ``int`` in
the back end's own numbering (CUDA's on ``nvidia``); only a non-zero status is translated.

``Decl.argtypes`` are the header's types (the ABI test compiles them); the back ends bind
:func:`call_argtypes`, which converts ``size_t``, ``int`` and ``unsigned int`` value arguments
faster (the same bits; see there).
"""
from __future__ import annotations

from ctypes import (POINTER, Structure, c_char, c_char_p, c_float, c_int, c_size_t, c_ubyte,
                    c_uint, c_ulonglong, c_ushort, c_void_p, sizeof)
from operator import index
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Dict, List, Tuple

__all__ = ["Decl", "DECLS", "DECL_BY_NAME", "call_argtypes", "hipMemLocation",
           "hipMemAccessDesc", "hipMemPoolProps", "hipPointerAttribute_t", "hipIpcMemHandle_t",
           "hipMemPoolPtrExportData", "hipIpcEventHandle_t", "hipMemAllocationProp",
           "hipMemAllocationProp_5_2"]


# ---- the structures (x86-64 Linux, LP64; tests/binding/test_abi.py checks them against the
# headers; ``types.py`` re-exports them with the enum values and flags) -----------------------
class hipMemLocation(Structure):
    """``hipMemLocation``: where memory lives (type 1 = device, id = device ordinal)."""
    _fields_ = [("type", c_int), ("id", c_int)]


class hipMemAccessDesc(Structure):
    """``hipMemAccessDesc``: an access right for one location."""
    _fields_ = [("location", hipMemLocation), ("flags", c_int)]


class hipMemPoolProps(Structure):
    """``hipMemPoolProps`` (88 bytes). ``maxSize`` exists from ROCm 6.2 on; zero keeps the default.

    Before 6.2 the 64 bytes from offset 24 are ``reserved``; writing 0 there is the same thing.
    The CUDA ``cudaMemPoolProps`` has the same size and leading fields.
    """
    _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("location", hipMemLocation),
                ("win32SecurityAttributes", c_void_p), ("maxSize", c_size_t),
                ("reserved", c_ubyte * 56)]


class hipPointerAttribute_t(Structure):
    """``hipPointerAttribute_t`` (32 bytes). The first field's name and the meaning of its values
    changed between ROCm 5 and 6 (see ``types.MEMORY_TYPE_5`` / ``types.MEMORY_TYPE_6``)."""
    _fields_ = [("type", c_int), ("device", c_int), ("devicePointer", c_void_p),
                ("hostPointer", c_void_p), ("isManaged", c_int), ("allocationFlags", c_uint)]


class hipIpcMemHandle_t(Structure):
    """``hipIpcMemHandle_t``: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", c_char * 64)]


class hipIpcEventHandle_t(Structure):
    """``hipIpcEventHandle_t``: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", c_char * 64)]


class hipMemPoolPtrExportData(Structure):
    """``hipMemPoolPtrExportData``: 64 opaque bytes."""
    _fields_ = [("reserved", c_ubyte * 64)]


class hipMemAllocationProp(Structure):
    """``hipMemAllocationProp`` (32 bytes) of the releases after 5.2 and CUDA's
    ``CUmemAllocationProp``: ``allocFlags`` (an unnamed structure in the headers) is flattened
    into its three fields, at the same offsets; the last 4 bytes are padding (CUDA:
    ``reserved[4]``, zero).  ROCm 7.2 names the second field also ``requestedHandleTypes``
    (a union)."""
    _fields_ = [("type", c_int), ("requestedHandleType", c_int),
                ("location", hipMemLocation), ("win32HandleMetaData", c_void_p),
                ("compressionType", c_ubyte), ("gpuDirectRDMACapable", c_ubyte),
                ("usage", c_ushort)]


class hipMemAllocationProp_5_2(Structure):
    """``hipMemAllocationProp`` of ROCm 5.2's headers: the same 32 bytes in another order
    (``types.allocation_prop_type`` picks the structure of the library loaded)."""
    _fields_ = [("compressionType", c_ubyte), ("location", hipMemLocation),
                ("requestedHandleType", c_int), ("type", c_int), ("usage", c_ushort),
                ("win32HandleMetaData", c_void_p)]


# ---- the functions -------------------------------------------------------------------------
class Decl(tuple):  # type: ignore[type-arg]  # a NamedTuple, without importing typing
    """One C function: ``name``, ``restype``, ``argtypes``, ``since`` (HIP version),
    ``required``, and ``argnames`` (the header's parameter names, one per argument type)."""

    __slots__ = ()

    def __new__(cls, name: str, restype: object, argtypes: Tuple[object, ...], since: str,
                required: bool = True, argnames: Tuple[str, ...] = ()) -> "Decl":
        return tuple.__new__(cls, (name, restype, argtypes, since, required, argnames))

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

    @property
    def argnames(self) -> Tuple[str, ...]:
        return self[5]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return ("Decl(name=%r, restype=%r, argtypes=%r, since=%r, required=%r, argnames=%r)"
                % self)


# The table's type names: ``status`` is hipError_t (an int); ``stream``, ``event`` and ``pool``
# are the opaque handles (void*); ``T*`` is a pointer to ``T`` (such an argument takes a ctypes
# instance, passed by reference); a structure's bare name passes it by value.
_TYPES: Dict[str, object] = {
    "status": c_int, "int": c_int, "uint": c_uint, "size_t": c_size_t, "ulonglong": c_ulonglong,
    "uchar": c_ubyte, "ushort": c_ushort,
    "float": c_float, "char*": c_char_p, "void*": c_void_p, "stream": c_void_p,
    "event": c_void_p, "pool": c_void_p, "graph": c_void_p, "graphExec": c_void_p,
    "hipMemLocation": hipMemLocation,
    "hipMemAccessDesc": hipMemAccessDesc, "hipMemPoolProps": hipMemPoolProps,
    "hipPointerAttribute_t": hipPointerAttribute_t, "hipIpcMemHandle_t": hipIpcMemHandle_t,
    "hipMemPoolPtrExportData": hipMemPoolPtrExportData,
    "hipIpcEventHandle_t": hipIpcEventHandle_t,
}

_TABLE = """
# name                              since R|O   result  arguments, name:type ("-": none)
# init, versions, errors
hipInit                             4.2  R    status  flags:uint
hipRuntimeGetVersion                4.2  R    status  runtimeVersion:int*
hipDriverGetVersion                 4.2  R    status  driverVersion:int*
hipGetErrorName                     4.2  R    char*   hip_error:status
hipGetErrorString                   4.2  R    char*   hipError:status
hipGetLastError                     4.2  R    status  -
hipPeekAtLastError                  4.2  R    status  -
# devices
hipGetDeviceCount                   4.2  R    status  count:int*
hipGetDevice                        4.2  R    status  deviceId:int*
hipSetDevice                        4.2  R    status  deviceId:int
hipDeviceGetAttribute               4.2  R    status  pi:int* attr:int deviceId:int
hipDeviceGetName                    4.2  R    status  name:char* len:int device:int
hipDeviceTotalMem                   4.2  R    status  bytes:size_t* device:int
hipDeviceSynchronize                4.2  R    status  -
hipDeviceCanAccessPeer              4.2  R    status  canAccessPeer:int* deviceId:int peerDeviceId:int
hipDeviceEnablePeerAccess           4.2  R    status  peerDeviceId:int flags:uint
hipDeviceDisablePeerAccess          4.2  R    status  peerDeviceId:int
hipMemGetInfo                       4.2  R    status  free:size_t* total:size_t*
# plain memory
hipMalloc                           4.2  R    status  ptr:void** size:size_t
hipFree                             4.2  R    status  ptr:void*
hipHostMalloc                       4.2  R    status  ptr:void** size:size_t flags:uint
hipHostFree                         4.2  R    status  ptr:void*
hipMallocManaged                    4.2  R    status  dev_ptr:void** size:size_t flags:uint
hipMemcpy                           4.2  R    status  dst:void* src:void* sizeBytes:size_t kind:int
hipMemcpyAsync                      4.2  R    status  dst:void* src:void* sizeBytes:size_t kind:int stream:stream
hipMemcpyPeer                       4.2  R    status  dst:void* dstDeviceId:int src:void* srcDeviceId:int sizeBytes:size_t
hipMemcpyPeerAsync                  4.2  R    status  dst:void* dstDeviceId:int src:void* srcDevice:int sizeBytes:size_t stream:stream
hipMemset                           4.2  R    status  dst:void* value:int sizeBytes:size_t
hipMemsetAsync                      4.2  R    status  dst:void* value:int sizeBytes:size_t stream:stream
# element-wise memset: count elements of 1, 2 or 4 bytes (hipDeviceptr_t is void*)
hipMemsetD8                         4.2  R    status  dest:void* value:uchar count:size_t
hipMemsetD8Async                    4.2  R    status  dest:void* value:uchar count:size_t stream:stream
hipMemsetD16                        4.2  R    status  dest:void* value:ushort count:size_t
hipMemsetD16Async                   4.2  R    status  dest:void* value:ushort count:size_t stream:stream
hipMemsetD32                        4.2  R    status  dest:void* value:int count:size_t
hipMemsetD32Async                   4.2  R    status  dst:void* value:int count:size_t stream:stream
hipMemPrefetchAsync                 4.2  R    status  dev_ptr:void* count:size_t device:int stream:stream
hipPointerGetAttributes             4.2  R    status  attributes:hipPointerAttribute_t* ptr:void*
hipMemGetAddressRange               4.2  R    status  pbase:void** psize:size_t* dptr:void*
# stream-ordered allocation and memory pools
hipMallocAsync                      5.1  R    status  dev_ptr:void** size:size_t stream:stream
hipFreeAsync                        5.1  R    status  dev_ptr:void* stream:stream
hipMallocFromPoolAsync              5.1  R    status  dev_ptr:void** size:size_t mem_pool:pool stream:stream
hipMemPoolCreate                    5.1  R    status  mem_pool:void** pool_props:hipMemPoolProps*
hipMemPoolDestroy                   5.1  R    status  mem_pool:pool
hipMemPoolSetAttribute              5.1  R    status  mem_pool:pool attr:int value:void*
hipMemPoolGetAttribute              5.1  R    status  mem_pool:pool attr:int value:void*
hipMemPoolTrimTo                    5.1  R    status  mem_pool:pool min_bytes_to_hold:size_t
hipMemPoolSetAccess                 5.1  R    status  mem_pool:pool desc_list:hipMemAccessDesc* count:size_t
hipMemPoolGetAccess                 5.1  R    status  flags:int* mem_pool:pool location:hipMemLocation*
hipDeviceGetDefaultMemPool          5.1  R    status  mem_pool:void** device:int
hipDeviceGetMemPool                 5.1  R    status  mem_pool:void** device:int
hipDeviceSetMemPool                 5.1  R    status  device:int mem_pool:pool
# interprocess: pools shared through a POSIX file descriptor, legacy per-allocation handles.
# The export writes the fd through its void* (an int*); the import takes the fd itself,
# by value, in the void*.
hipMemPoolExportToShareableHandle   5.1  R    status  shared_handle:void* mem_pool:pool handle_type:int flags:uint
hipMemPoolImportFromShareableHandle 5.1  R    status  mem_pool:void** shared_handle:void* handle_type:int flags:uint
hipMemPoolExportPointer             5.1  R    status  export_data:hipMemPoolPtrExportData* dev_ptr:void*
hipMemPoolImportPointer             5.1  R    status  dev_ptr:void** mem_pool:pool export_data:hipMemPoolPtrExportData*
hipIpcGetMemHandle                  4.2  R    status  handle:hipIpcMemHandle_t* devPtr:void*
hipIpcOpenMemHandle                 4.2  R    status  devPtr:void** handle:hipIpcMemHandle_t flags:uint
hipIpcCloseMemHandle                4.2  R    status  devPtr:void*
# virtual memory: address ranges reserved, physical allocations mapped into them.  An allocation
# handle (hipMemGenericAllocationHandle_t) is an opaque pointer, CUDA's an unsigned long long:
# the same 64 bits, a void* here.  hipMemAllocationProp's layout depends on the release
# (decls.hipMemAllocationProp_5_2), so its argument is a void* that takes byref() of the
# structure types.allocation_prop_type gives.
hipMemAddressReserve                5.1  O    status  ptr:void** size:size_t alignment:size_t addr:void* flags:ulonglong
hipMemAddressFree                   5.1  O    status  devPtr:void* size:size_t
hipMemCreate                        5.1  O    status  handle:void** size:size_t prop:void* flags:ulonglong
hipMemRelease                       5.1  O    status  handle:void*
hipMemMap                           5.1  O    status  ptr:void* size:size_t offset:size_t handle:void* flags:ulonglong
hipMemUnmap                         5.1  O    status  ptr:void* size:size_t
hipMemSetAccess                     5.1  O    status  ptr:void* size:size_t desc:hipMemAccessDesc* count:size_t
hipMemGetAccess                     5.1  O    status  flags:ulonglong* location:hipMemLocation* ptr:void*
hipMemGetAllocationGranularity      5.1  O    status  granularity:size_t* prop:void* option:int
# streams
hipStreamCreateWithPriority         4.2  R    status  stream:void** flags:uint priority:int
hipStreamDestroy                    4.2  R    status  stream:stream
hipStreamSynchronize                4.2  R    status  stream:stream
hipStreamQuery                      4.2  R    status  stream:stream
hipStreamWaitEvent                  4.2  R    status  stream:stream event:event flags:uint
hipStreamGetPriority                4.2  R    status  stream:stream priority:int*
hipStreamGetFlags                   4.2  R    status  stream:stream flags:uint*
hipStreamGetDevice                  5.6  O    status  stream:stream device:int*
hipDeviceGetStreamPriorityRange     4.2  R    status  leastPriority:int* greatestPriority:int*
# events
hipEventCreateWithFlags             4.2  R    status  event:void** flags:uint
hipEventRecord                      4.2  R    status  event:event stream:stream
hipEventSynchronize                 4.2  R    status  event:event
hipEventQuery                       4.2  R    status  event:event
hipEventElapsedTime                 4.2  R    status  ms:float* start:event stop:event
hipEventDestroy                     4.2  R    status  event:event
# AMD memory: pinning existing host memory, interprocess events
hipHostRegister                     4.2  R    status  hostPtr:void* sizeBytes:size_t flags:uint
hipHostUnregister                   4.2  R    status  hostPtr:void*
hipHostGetDevicePointer             4.2  R    status  devPtr:void** hstPtr:void* flags:uint
hipIpcGetEventHandle                4.2  R    status  handle:hipIpcEventHandle_t* event:event
hipIpcOpenEventHandle               4.2  R    status  event:void** handle:hipIpcEventHandle_t
hipMemAdvise                        4.2  R    status  dev_ptr:void* count:size_t advice:int device:int
hipMemDiscardBatchAsync             7.3  O    status  dptrs:void** sizes:size_t* count:size_t flags:ulonglong stream:stream
# (AMD's alone: optional, so that the nvidia platform, which has no counterpart, lacks it)
hipExtMallocWithFlags               4.2  O    status  ptr:void** sizeBytes:size_t flags:uint
# stream capture and graphs: optional, so that a library without them still loads (the
# package's capture checks then report "not capturing").  ``mode`` and ``pCaptureStatus`` are
# hipStreamCaptureMode / hipStreamCaptureStatus (enums: ints).  hipGraphInstantiate's error node
# (hipGraphNode_t*) and log buffer may be NULL.
hipStreamBeginCapture               4.3  O    status  stream:stream mode:int
hipStreamEndCapture                 4.3  O    status  stream:stream pGraph:void**
hipStreamIsCapturing                4.3  O    status  stream:stream pCaptureStatus:int*
hipStreamGetCaptureInfo             4.5  O    status  stream:stream pCaptureStatus:int* pId:ulonglong*
hipThreadExchangeStreamCaptureMode  5.0  O    status  mode:int*
hipGraphInstantiate                 4.3  O    status  pGraphExec:void** graph:graph pErrorNode:void** pLogBuffer:char* bufferSize:size_t
hipGraphLaunch                      4.3  O    status  graphExec:graphExec stream:stream
hipGraphDestroy                     4.3  O    status  graph:graph
hipGraphExecDestroy                 4.3  O    status  graphExec:graphExec
# newer, optional
hipExtGetLastError                  6.0  O    status  -
hipStreamGetId                      7.1  O    status  stream:stream streamId:ulonglong*
"""


def _type(name: str) -> object:
    found = _TYPES.get(name)
    if found is None:  # "T*": ctypes' one POINTER type of T
        found = _TYPES[name] = POINTER(_type(name[:-1]))  # type: ignore[call-overload]
    return found


def _read(table: str) -> Tuple[Decl, ...]:
    """The rows of ``table`` (the format of :data:`_TABLE`), in order."""
    rows = []
    for line in table.splitlines():
        if line and line[0] != "#":
            name, since, required, result, *args = line.split()
            params = [a.split(":") for a in args if a != "-"]
            rows.append(Decl(name, _type(result), tuple(_type(t) for _, t in params), since,
                             required == "R", tuple(n for n, _ in params)))
    return tuple(rows)


DECLS: Tuple[Decl, ...] = _read(_TABLE)

DECL_BY_NAME = {d.name: d for d in DECLS}

# What a back end binds as a value argument's type, where it differs from the header's.  For
# every simple type but ``c_void_p``, ctypes converts an argument by first asking ``isinstance``
# through the type's metaclass, a large part of a short call (the figures:
# benchmarks/results/history.md, "Figures behind the rules").
# - ``size_t`` has the width and register class of ``void*`` on every ABI the package runs on
#   (x86-64, AArch64, POWER: one integer register or stack slot), so it is passed as
#   ``c_void_p``, whose conversion of an int is direct, and arrives bit for bit.
# - ``int`` and ``unsigned int`` take a ``from_param`` that gives the int itself
#   (``operator.index``: an int or bool as it is, anything else a TypeError that ctypes
#   reports as ArgumentError); ctypes passes an int as a C ``int`` with no conversion object,
#   the same 32 bits its own ``c_int`` / ``c_uint`` pass.
# The package checks every value before a native call, so nothing but an int in range gets
# this far.


class _IntValue(c_int):
    """A C ``int`` value argument, converted without ctypes' ``isinstance`` test."""
    from_param = staticmethod(index)


class _UIntValue(c_uint):
    """A C ``unsigned int`` value argument (the same 32 bits as an ``int``)."""
    from_param = staticmethod(index)


_PASSED_AS: Dict[object, object] = {c_int: _IntValue, c_uint: _UIntValue}
if sizeof(c_size_t) == sizeof(c_void_p):
    _PASSED_AS[c_size_t] = c_void_p


def call_argtypes(decl: Decl) -> List[object]:
    """The ``argtypes`` a back end sets for ``decl``: its own, with a ``size_t`` value
    argument passed as ``c_void_p`` and an ``int`` / ``unsigned int`` one as the int itself
    (the same bits, converted faster)."""
    return [_PASSED_AS.get(t, t) for t in decl.argtypes]

"""Device memory shared between processes (see docs/scale.md).

Two kinds, as in HIP and CUDA:

* **pool memory** of an ``AsyncMemoryResource(enable_ipc=True)``: the exporter sends the
  pool's :class:`IpcPoolHandle` once (``resource.pool.export_handle()``); the importer makes an
  importing resource of it (``AsyncMemoryResource.from_ipc(handle)``); then every buffer
  travels as a small :class:`IpcBufferDescriptor` (``buf.export_ipc()``,
  ``hipMemPoolExportPointer``) and is mapped with ``Buffer.from_ipc(descriptor, resource)``
  (``hipMemPoolImportPointer``).
* **legacy memory** of a ``DeviceMemoryResource`` (``hipMalloc``): the descriptor alone carries
  a ``hipIpcGetMemHandle`` handle; ``Buffer.from_ipc(descriptor)`` opens it
  (``hipIpcOpenMemHandle``).

Closing an imported Buffer unmaps it; it never frees the exporter's memory.  The exporter must
keep its Buffer alive until every importer has closed its mapping.
"""
from __future__ import annotations

import struct
import zlib
from ctypes import c_void_p
from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _hip
from .errors import NotSupportedError
from .properties import DEFAULT_ALIGNMENT
from ._hip.types import hipIpcMemHandle_t, hipMemPoolPtrExportData
from .resources.ipc import POOL_ID_BYTES, IpcPoolHandle

if TYPE_CHECKING:
    from .buffer import Buffer

__all__ = ["IpcBufferDescriptor", "IpcPoolHandle", "export_buffer", "import_buffer"]

_MAGIC = b"HMRBUF01"
_KINDS = {1: "pool", 2: "legacy"}
_CODES = {v: k for k, v in _KINDS.items()}
# magic, kind, device, size, offset, pool id, export data / handle; then a CRC32 of all that
_BODY = struct.Struct(f"<8sBxxxiQQ{POOL_ID_BYTES}s64s")
_CRC = struct.Struct("<I")
SIZE = _BODY.size + _CRC.size


class IpcBufferDescriptor:
    """What another process needs to map one exported Buffer: plain bytes (the export data or
    legacy handle, the size, the device, the offset into the allocation and which pool it
    belongs to), immutable and picklable.  ``bytes(descriptor)`` and
    :meth:`from_bytes` turn it into bytes and back (for MPI or sockets); bytes that are
    truncated or corrupted raise ValueError.

    A descriptor grants access to the memory it names: send it only to processes you trust.
    """

    __slots__ = ("_raw",)
    _raw: bytes

    def __init__(self, kind: str, device: int, size: int, offset: int, pool_id: bytes,
                 data: bytes) -> None:
        if kind not in _CODES:
            raise ValueError(f"kind must be 'pool' or 'legacy', not {kind!r}")
        for name, value in (("device", device), ("size", size), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, not {value!r}")
        if not isinstance(pool_id, bytes) or len(pool_id) != POOL_ID_BYTES:
            raise ValueError(f"pool_id must be {POOL_ID_BYTES} bytes")
        if not isinstance(data, bytes) or len(data) != 64:
            raise ValueError("data must be 64 bytes")
        _check_fields(kind, device, size, offset)
        body = _BODY.pack(_MAGIC, _CODES[kind], device, size, offset, pool_id, data)
        object.__setattr__(self, "_raw", body + _CRC.pack(zlib.crc32(body)))

    @classmethod
    def from_bytes(cls, data: Any) -> "IpcBufferDescriptor":
        """The descriptor that ``bytes(descriptor)`` gave; ValueError for anything else."""
        try:
            raw = bytes(memoryview(data))
        except TypeError:
            raise TypeError(f"data must be bytes-like, not {type(data).__name__}") from None
        if len(raw) != SIZE:
            raise ValueError(f"an IpcBufferDescriptor is {SIZE} bytes, not {len(raw)}")
        body, (crc,) = raw[:_BODY.size], _CRC.unpack(raw[_BODY.size:])
        magic, code = body[:8], body[8]
        if magic != _MAGIC or code not in _KINDS:
            raise ValueError("these bytes are not an IpcBufferDescriptor")
        if zlib.crc32(body) != crc:
            raise ValueError("IpcBufferDescriptor: the bytes are corrupted (checksum mismatch)")
        fields = _BODY.unpack(body)
        _check_fields(_KINDS[code], fields[2], fields[3], fields[4])
        self = cls.__new__(cls)
        object.__setattr__(self, "_raw", raw)
        return self

    def _fields(self) -> Tuple[Any, ...]:
        return _BODY.unpack(self._raw[:_BODY.size])

    @property
    def kind(self) -> str:
        """``"pool"`` (memory-pool memory) or ``"legacy"`` (``hipMalloc`` memory)."""
        return _KINDS[self._fields()[1]]

    @property
    def device(self) -> int:
        """The device the memory lives on (the exporting process's numbering)."""
        return int(self._fields()[2])

    @property
    def size(self) -> int:
        """Bytes of the exported Buffer."""
        return int(self._fields()[3])

    @property
    def offset(self) -> int:
        """Where the Buffer starts in the allocation a legacy handle names (0 for pools)."""
        return int(self._fields()[4])

    @property
    def pool_id(self) -> Optional[bytes]:
        """The identity of the pool the memory belongs to (None for legacy memory)."""
        fields = self._fields()
        return bytes(fields[5]) if _KINDS[fields[1]] == "pool" else None

    @property
    def data(self) -> bytes:
        """The 64 bytes of ``hipMemPoolPtrExportData`` or ``hipIpcMemHandle_t``."""
        return bytes(self._fields()[6])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IpcBufferDescriptor is immutable")

    def __bytes__(self) -> bytes:
        return self._raw

    def __reduce__(self) -> Any:
        # a module-level function: pickled by reference by every pickler (cloudpickle, Dask's
        # serializer, pickles a classmethod by value, with the module's globals)
        return (_descriptor, (self._raw,))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IpcBufferDescriptor):
            return NotImplemented
        return other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def __repr__(self) -> str:
        return (f"<IpcBufferDescriptor {self.kind} size={self.size} device={self.device}"
                f"{'' if self.pool_id is None else ' pool=' + self.pool_id.hex()[:8]}>")


def _check_fields(kind: str, device: int, size: int, offset: int) -> None:
    """ValueError for fields no exported Buffer has (the checksum proves nothing: anyone can
    compute it), before anything is packed or mapped."""
    if not 0 <= device < 1 << 31:
        raise ValueError(f"IpcBufferDescriptor: device={device} is not a device ordinal")
    if not 0 < size < 1 << 64:
        raise ValueError(f"IpcBufferDescriptor: size={size} is not the size of an exported "
                         "Buffer (1 to 2**64 - 1 bytes)")
    if not 0 <= offset < 1 << 64 or offset + size >= 1 << 64:
        raise ValueError(f"IpcBufferDescriptor: offset={offset} with size={size} does not fit "
                         "an address space")
    if kind == "pool" and offset:
        raise ValueError(f"IpcBufferDescriptor: a pool descriptor has offset 0, not {offset}")


def _descriptor(raw: bytes) -> IpcBufferDescriptor:
    """Unpickling: :meth:`IpcBufferDescriptor.from_bytes` (which checks everything again)."""
    return IpcBufferDescriptor.from_bytes(raw)


# ---- export ----------------------------------------------------------------------------------
def _source(resource: Any) -> Any:
    """The resource that made the memory, through adaptors that hand out their upstream's
    pointers unchanged; NotSupportedError naming the first one that does not."""
    from .adaptors import (FailureCallbackResource, LimitingResource, LoggingResource,
                           StatisticsResource, TrackingResource)
    from .resources import AsyncMemoryResource, DeviceMemoryResource
    passing = (FailureCallbackResource, LimitingResource, LoggingResource, StatisticsResource,
               TrackingResource)
    from .resource_ref import upstream_chain
    for resource in upstream_chain(resource, "Buffer.export_ipc"):   # any depth; a cycle raises
        if isinstance(resource, (AsyncMemoryResource, DeviceMemoryResource)):
            return resource
        if not isinstance(resource, passing):
            break
    raise NotSupportedError(
        801, "hipErrorNotSupported",
        f"memory from {type(resource).__name__} cannot be shared with another process: only "
        "whole allocations of DeviceMemoryResource (hipMalloc) or of an "
        "AsyncMemoryResource(enable_ipc=True) can (directly or through statistics, tracking, "
        "logging, limiting or failure-callback adaptors)", "Buffer.export_ipc")


def export_buffer(buf: "Buffer") -> IpcBufferDescriptor:
    """``buf.export_ipc()``: see :meth:`hipmr_ctypes.Buffer.export_ipc`."""
    from .resources import AsyncMemoryResource
    ptr = buf._live()
    buf._own_stream()   # a closed stream's handle never reaches the runtime
    if not buf.size:
        raise ValueError("an empty Buffer has no memory to share")
    kind = buf._memory_kind()
    if kind != "device":
        raise NotSupportedError(801, "hipErrorNotSupported",
                                f"{kind} memory cannot be shared with another process (HIP "
                                "shares device memory only)", "Buffer.export_ipc")
    source = _source(buf.resource)
    rt = _hip.get_runtime()
    device = buf.device if buf.device is not None else source.device
    if isinstance(source, AsyncMemoryResource):
        pool = source.pool
        pool._live()
        if pool.imported:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "memory imported from another process cannot be exported "
                                    "again", "Buffer.export_ipc")
        if pool._ipc_id is None:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "this Buffer's memory pool cannot be shared: make its "
                                    "resource with AsyncMemoryResource(enable_ipc=True)",
                                    "Buffer.export_ipc")
        if pool._shared is None:
            # a pointer is exported only from a pool that was exported itself (CUDA and HIP:
            # "an already shared memory pool"); the pool keeps this handle until it closes
            pool._shared = pool.export_handle()
        buf._wait_own()   # the allocation and the writes before it are done for importers
        export = hipMemPoolPtrExportData()
        rt.check(rt.fn.hipMemPoolExportPointer(export, ptr), "hipMemPoolExportPointer",
                 device=device)
        return IpcBufferDescriptor("pool", device, buf.size, 0, pool._ipc_id, bytes(export))
    buf._wait_own()
    handle = hipIpcMemHandle_t()
    rt.check(rt.fn.hipIpcGetMemHandle(handle, ptr), "hipIpcGetMemHandle", device=device)
    return IpcBufferDescriptor("legacy", device, buf.size, 0, bytes(POOL_ID_BYTES),
                               bytes(handle))


# ---- import ----------------------------------------------------------------------------------
#
# What an importer can check, and does, before a Buffer exists (docs/scale.md, "Trust"): the
# fields are in range (``from_bytes``), the pool's identity and device match the importing
# resource's, and what the runtime actually mapped is device memory of that device whose
# range (``hipMemGetAddressRange``) holds ``offset + size`` bytes from the mapped base.
# Anything else is a ValueError with nothing left mapped.  The runtime maps an allocation once
# per process: importing the same descriptor again shares that mapping (counted).


def _refuse(why: str) -> ValueError:
    return ValueError(f"Buffer.from_ipc: {why}; the descriptor is damaged or forged (nothing "
                      "was mapped)")


def _check_mapping(rt: Any, base: int, device: int, need: int) -> int:
    """The bytes mapped from ``base`` on (to the end of the range the runtime reports for
    it: the allocation, or a larger segment that holds it); ValueError when that is not
    device memory of ``device`` with at least ``need`` bytes."""
    from ctypes import c_size_t
    from ._memory_query import pointer_device
    found, extent = c_void_p(), c_size_t()
    if rt.fn.hipMemGetAddressRange(found, extent, base):
        rt.clear_last_error()
        raise _refuse("the runtime does not know the memory it mapped")
    start = found.value or 0
    available = start + extent.value - base
    if not start <= base or available < need:
        raise _refuse(f"it asks for {need} bytes of an allocation of {max(available, 0)}")
    actual = pointer_device(base)
    if actual != device:
        raise _refuse(f"it says device {device}, but the memory mapped is "
                      + ("not device memory" if actual is None else f"on device {actual}"))
    return available


def import_buffer(descriptor: IpcBufferDescriptor, resource: Any = None) -> "Buffer":
    """``Buffer.from_ipc(descriptor, resource)``: see :meth:`hipmr_ctypes.Buffer.from_ipc`."""
    from .buffer import Buffer
    from .device import check_device
    from .resources import AsyncMemoryResource
    from .resources.ipc import LEGACY_MAPPINGS, LegacyIpcMapping, Mapped, ipc_open_flags
    if not isinstance(descriptor, IpcBufferDescriptor):
        raise TypeError(f"descriptor must be an IpcBufferDescriptor, not "
                        f"{type(descriptor).__name__}")
    size, device, offset = descriptor.size, descriptor.device, descriptor.offset
    key = descriptor.data
    if descriptor.kind == "pool":
        if resource is None:
            raise ValueError("pool memory is mapped through the importing resource of its "
                             "pool: Buffer.from_ipc(descriptor, "
                             "AsyncMemoryResource.from_ipc(pool_handle))")
        if not isinstance(resource, AsyncMemoryResource) or not resource.pool.imported:
            raise TypeError("resource must be an importing AsyncMemoryResource "
                            "(AsyncMemoryResource.from_ipc), not "
                            f"{type(resource).__name__}")
        pool = resource.pool
        handle = pool._live()
        if descriptor.pool_id != pool._ipc_id:
            raise ValueError("this descriptor belongs to another memory pool than the "
                             "resource's (import that pool's handle first)")
        if device != pool.device:
            raise _refuse(f"it says device {device}, but its pool's handle says device "
                          f"{pool.device}")
        mappings = pool._mapped
        assert mappings is not None
        shared = mappings.share(key)
        if shared is None:
            rt = _hip.get_runtime()
            out = c_void_p()
            export = hipMemPoolPtrExportData.from_buffer_copy(key)
            rt.check(rt.fn.hipMemPoolImportPointer(out, handle, export),
                     "hipMemPoolImportPointer", device=device)
            ptr = out.value or 0
            try:
                extent = _check_mapping(rt, ptr, device, size)
            except BaseException:
                rt.fn.hipFreeAsync(ptr, 0)   # unmapped at once: never known to the resource
                rt.clear_last_error()
                raise
            shared = Mapped(key, ptr, extent)
            mappings.add(shared)   # from now on the resource's free unmaps it
        elif shared.extent < size:
            resource.deallocate_async(shared.ptr, size, DEFAULT_ALIGNMENT, 0)  # the count taken above
            raise _refuse(f"it asks for {size} bytes of an allocation of {shared.extent}")
        try:
            return Buffer._adopt(shared.ptr, size, resource, device)
        except BaseException:
            resource.deallocate_async(shared.ptr, size, DEFAULT_ALIGNMENT, 0)
            raise
    if resource is not None:
        raise ValueError("legacy (hipMalloc) memory is opened without a resource: "
                         "Buffer.from_ipc(descriptor)")
    try:
        check_device(device, "the descriptor's device")
    except ValueError as exc:
        raise _refuse(str(exc)) from None
    rt = _hip.get_runtime()
    shared = LEGACY_MAPPINGS.share(key)
    if shared is None:
        out = c_void_p()
        handle_struct = hipIpcMemHandle_t.from_buffer_copy(key)
        try:
            rt.check(rt.fn.hipIpcOpenMemHandle(out, handle_struct, ipc_open_flags(rt)),
                     "hipIpcOpenMemHandle", device=device)
        except NotSupportedError as exc:
            if rt.platform != "emulated":
                raise
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    "the emulated platform cannot map hipMalloc memory of "
                                    "another process (legacy IPC handles); share memory of an "
                                    "AsyncMemoryResource(enable_ipc=True) instead",
                                    "hipIpcOpenMemHandle") from exc
        base = out.value or 0
        try:
            extent = _check_mapping(rt, base, device, offset + size)
        except BaseException:
            rt.fn.hipIpcCloseMemHandle(base)
            rt.clear_last_error()
            raise
        shared = Mapped(key, base, extent)
        LEGACY_MAPPINGS.add(shared)
    base = shared.ptr
    mapping = LegacyIpcMapping(base, base + offset, device)
    try:
        if shared.extent < offset + size:
            raise _refuse(f"it asks for bytes {offset} to {offset + size} of an allocation of "
                          f"{shared.extent}")
        return Buffer._adopt(base + offset, size, mapping, device)
    except BaseException:
        mapping.deallocate(base + offset, size)   # the count taken above
        raise

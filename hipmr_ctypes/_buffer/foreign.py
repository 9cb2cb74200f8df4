"""Memory the package did not allocate, as Buffers.

:func:`from_handle` / :func:`from_dlpack` check what ``Buffer.from_handle`` /
``Buffer.from_dlpack`` are given and call the ``build`` function the Buffer passes
(``Buffer._over``) for a Buffer whose ``resource`` is a :class:`ForeignMemory` (a view: it keeps
its owner alive and frees nothing) or, for ``from_handle(..., resource=r)``, ``r`` itself (the
Buffer owns the memory and frees it through ``r``): this module never imports ``buffer``.  :func:`check_writable` refuses writes to memory its
producer marked read-only.

Lifetime of a view: the Buffer's free is claimed exactly once (``Buffer._claim``); that claim
calls :meth:`ForeignMemory.deallocate_async`, which waits for the Buffer's stream (device-
accessible memory: work queued on the view must finish before its owner may reuse the memory)
and then drops the owner, or calls the DLPack deleter once.  This module is imported by the
first use of any of these (or of a host view), never by ``import hipmr_ctypes``.
"""
from __future__ import annotations

import weakref
from ctypes import CFUNCTYPE, c_void_p
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple, TypeVar

from .. import _hip
from . import dlpack as dl
from .._checks import MAX_SIZE, check_ptr, check_size, check_stream
from .._limits import MAX_ADDRESS
from .._memory_query import pointer_kind
from .._hip.native import PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_SetName, strdup
from ..device import check_device, on_device_or_current
from ..properties import DEFAULT_ALIGNMENT, _declared, device_accessible, host_accessible
from ..resource_refs import async_resource_ref
from ..stream_refs import stream_ref

if TYPE_CHECKING:   # what is read of a Buffer (``buffer`` imports this module)
    from .contract import BufferView

__all__ = ["ForeignMemory", "from_handle", "from_dlpack", "readonly", "check_writable",
           "move_owner"]

#: what the ``build`` function of :func:`from_handle` / :func:`from_dlpack` makes (a Buffer)
_B = TypeVar("_B")


class ForeignMemory:
    """The resource of a Buffer over memory another object owns (``Buffer.from_handle``
    without ``resource``, ``Buffer.from_dlpack``): it allocates nothing and frees nothing.

    ``owner`` is held until the Buffer gives the memory back (``close()`` or garbage
    collection); then ``deallocate_async`` waits for the Buffer's stream (device-accessible
    memory) and drops the owner, or calls the DLPack deleter, exactly once.  ``kind`` is the
    memory's kind ("device", "pinned", "managed", "host"), ``device`` its device (None for
    host memory), ``readonly`` whether the producer said it must not be written."""

    __slots__ = ("owner", "_release", "kind", "device", "readonly", "properties", "__weakref__")

    def __init__(self, owner: Any, release: Optional[Callable[[], Any]], kind: str,
                 device: Optional[int], readonly: bool = False) -> None:
        self.owner = owner
        self._release = release
        self.kind = kind
        self.device = device
        self.readonly = readonly
        self.properties: Tuple[type, ...] = (
            (host_accessible,) if kind == "host" else
            (device_accessible,) if kind == "device" else (device_accessible, host_accessible))

    def _refuse(self) -> int:
        raise BufferError("a Buffer over foreign memory (Buffer.from_handle without a resource, "
                          "Buffer.from_dlpack) cannot allocate: copy it into memory of a "
                          "resource with buf.copy(resource=...)")

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Refused (BufferError): a view allocates nothing."""
        return self._refuse()

    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """Refused (BufferError): a view allocates nothing."""
        return self._refuse()

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Let the memory go: release the owner (after the null stream's work)."""
        self.deallocate_async(ptr, bytes, alignment, 0)

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """Let the memory go: wait for ``stream`` (device-accessible memory), then drop the
        owner or call the DLPack deleter; later calls do nothing.  A failed wait raises and
        keeps the owner (the Buffer still owns the view then)."""
        if self.kind != "host" and (self.owner is not None or self._release is not None):
            handle = check_stream(stream)
            rt = _hip.get_runtime()
            device = self.device
            with on_device_or_current(device):
                rt.check(rt.fn.hipStreamSynchronize(handle), "hipStreamSynchronize")
        release, self._release = self._release, None
        self.owner = None
        if release is not None:
            release()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return (f"<ForeignMemory kind={self.kind} device={self.device}"
                f"{' readonly' if self.readonly else ''}>")


def _check_range(ptr: int, size: int, what: str) -> None:
    """ValueError unless ``[ptr, ptr + size)`` is memory a Buffer can span: a size of at
    most 2**63 bytes (as every size), not at address 0 (NULL), not past the end of the
    address space.  ``what`` prefixes the message (``"obj: "`` for DLPack)."""
    if size > MAX_SIZE:
        raise ValueError(f"{what}size={size} is larger than 2**63")
    if ptr == 0 and size:
        raise ValueError(f"{what}ptr is 0 (NULL) but size={size}: no memory is there")
    if ptr + size > MAX_ADDRESS + 1:
        raise ValueError(f"{what}ptr={ptr:#x} + size={size} runs past the end of the "
                         "address space")


def _stream_and_keep(stream: Any) -> Tuple[int, Any]:
    if stream is None:
        return 0, None
    handle = check_stream(stream)
    return handle, (None if type(stream) in (int, stream_ref) else stream)


_owners: "weakref.WeakKeyDictionary[object, Any]" = weakref.WeakKeyDictionary()


def from_handle(ptr: Any, size: Any, owner: Any, resource: Any, device: Any, stream: Any,
                build: Callable[..., _B]) -> _B:
    """``Buffer.from_handle``: every argument checked before any native call, then
    ``build(ptr, size, ref, kind, device, handle, keep, owns)`` makes the Buffer over
    ``[ptr, ptr + size)`` given back through ``ref.deallocate_async`` (on the stream
    ``handle``) when ``owns``."""
    ptr = check_ptr(ptr, "ptr")
    size = check_size(size, "size")
    _check_range(ptr, size, "")
    handle, keep = _stream_and_keep(stream)
    host_only_resource = False
    ref = None
    if resource is not None:
        ref = async_resource_ref(resource)  # TypeError naming what is missing
        target = ref.resource
        props = _declared(target)
        host_only_resource = device_accessible not in props and bool(props)
    dev = None if device is None else check_device(device)
    # ---- native calls from here on
    if host_only_resource:
        kind, found = "host", None
    else:
        found_kind, found = pointer_kind(ptr)
        if found_kind is not None:
            kind = found_kind
        elif ref is not None:   # the resource's memory, unknown to the runtime
            kind = "pinned" if host_accessible in _declared(ref.resource) else "device"
        else:
            kind = "device" if dev is not None and ptr else "host"
    if dev is None:
        dev = found
    if ref is None:
        view = ForeignMemory(owner, None, kind, None if kind == "host" else dev)
        return build(ptr, size, view, kind, dev, handle, keep, True)
    buf = build(ptr, size, resource, kind, dev, handle, keep, bool(size))
    if owner is not None:
        _owners[buf] = owner   # held as long as the Buffer
    return buf


def move_owner(old: object, new: object) -> None:
    """``old.release()`` moved its memory into ``new``: the ``owner`` given to
    ``from_handle(..., resource=r)`` for it is held by ``new`` from now on."""
    owner = _owners.pop(old, None)
    if owner is not None:
        _owners[new] = owner


# ---- DLPack import -------------------------------------------------------------------------

# never freed: a capsule keeps its name's char* (see dlpack.py)
_USED = strdup(b"used_dltensor")
_USED_VERSIONED = strdup(b"used_dltensor_versioned")
_DELETER_T = CFUNCTYPE(None, c_void_p)
_READ_ONLY = dl.FLAG_READ_ONLY
_MAX_NDIM = 64
_DEVICE_KINDS = {dl.kDLCPU: "host", dl.kDLCUDA: "device", dl.kDLROCM: "device",
                 dl.kDLCUDAHost: "pinned", dl.kDLROCMHost: "pinned",
                 dl.kDLCUDAManaged: "managed"}
_PLATFORM_TYPES = {"amd": frozenset({dl.kDLCPU, dl.kDLROCM, dl.kDLROCMHost}),
                   "nvidia": frozenset({dl.kDLCPU, dl.kDLCUDA, dl.kDLCUDAHost,
                                        dl.kDLCUDAManaged})}


def _contiguous_nbytes(tensor: dl.DLTensor) -> int:
    """The bytes of a C-contiguous ``tensor``; ValueError for anything else."""
    ndim = tensor.ndim
    if not 0 <= ndim <= _MAX_NDIM:
        raise ValueError(f"obj: DLPack tensor with ndim={ndim}")
    bits, lanes = tensor.dtype.bits, tensor.dtype.lanes
    if not bits or not lanes or (bits * lanes) % 8:
        raise ValueError(f"obj: DLPack dtype of {bits} bits x {lanes} lanes is not a whole "
                         "number of bytes per element")
    itemsize = bits * lanes // 8
    if ndim and not tensor.shape:
        raise ValueError("obj: DLPack tensor without a shape")
    shape = [tensor.shape[i] for i in range(ndim)]
    if any(extent < 0 for extent in shape):
        raise ValueError(f"obj: DLPack shape {tuple(shape)} has a negative extent")
    count = 1
    for extent in shape:
        count *= extent
    if tensor.strides and count:
        expected = 1
        for i in reversed(range(ndim)):
            if shape[i] != 1 and tensor.strides[i] != expected:
                raise ValueError(
                    f"obj is not C-contiguous (shape {tuple(shape)}, strides "
                    f"{tuple(tensor.strides[j] for j in range(ndim))} in elements): "
                    "Buffer.from_dlpack takes contiguous arrays only (make one with the "
                    "producer's own copy, e.g. .copy() or .contiguous())")
            expected *= shape[i]
    return int(count * itemsize)


def _take(capsule: Any) -> Tuple[int, bool]:
    """(address of the managed tensor, versioned) of an unused DLPack capsule."""
    address = id(capsule)   # CPython: the object's address, valid while we hold it
    if type(capsule).__name__ == "PyCapsule":
        for name, versioned in ((dl._NAME_VERSIONED, True), (dl._NAME, False)):
            if PyCapsule_IsValid(address, name):
                return PyCapsule_GetPointer(address, name) or 0, versioned
    raise TypeError(f"obj.__dlpack__() returned {type(capsule).__name__}, not an unused "
                    "DLPack capsule ('dltensor' or 'dltensor_versioned')")


def from_dlpack(obj: Any, build: Callable[..., _B]) -> _B:
    """``Buffer.from_dlpack``: ``build`` as for :func:`from_handle`."""
    export = getattr(obj, "__dlpack__", None)
    if export is None or not callable(export):
        raise TypeError(f"obj must support DLPack (have __dlpack__): CuPy, PyTorch, NumPy "
                        f"arrays, a Buffer..., not {type(obj).__name__}")
    try:
        capsule = export(max_version=(dl.DLPACK_MAJOR, dl.DLPACK_MINOR))
    except TypeError:   # a producer from before DLPack 1.0: no max_version
        capsule = export()
    managed, versioned = _take(capsule)
    if not managed:
        raise ValueError("obj: the DLPack capsule holds a NULL tensor")
    flags = 0
    if versioned:
        record = dl.DLManagedTensorVersioned.from_address(managed)
        if record.version.major != dl.DLPACK_MAJOR:
            raise ValueError(f"obj: DLPack {record.version.major}.{record.version.minor} "
                             f"tensor; this package reads DLPack {dl.DLPACK_MAJOR}.x")
        flags = record.flags
        tensor = record.dl_tensor
        deleter = record.deleter or 0
    else:
        legacy = dl.DLManagedTensor.from_address(managed)
        tensor = legacy.dl_tensor
        deleter = legacy.deleter or 0
    nbytes = _contiguous_nbytes(tensor)
    device_type, device_id = tensor.device.device_type, tensor.device.device_id
    kind = _DEVICE_KINDS.get(device_type)
    platform = _hip.get_runtime().platform
    allowed = _PLATFORM_TYPES.get(platform)
    if kind is None or (allowed is not None and device_type not in allowed):
        raise ValueError(f"obj: memory of DLPack device type {device_type} is not memory the "
                         f"{platform} platform can use")
    ptr = ((tensor.data or 0) + tensor.byte_offset) if nbytes else (tensor.data or 0)
    if ptr > MAX_ADDRESS or (ptr == 0 and nbytes):
        raise ValueError("obj: the DLPack tensor has no valid data pointer")
    _check_range(ptr, nbytes, "obj: the DLPack tensor's ")   # from_handle's checks
    device: Optional[int] = None
    if kind in ("device", "managed"):
        device = check_device(device_id, "the DLPack device id")
    elif nbytes:   # host memory: the runtime may know it as pinned or managed
        found_kind, found_device = pointer_kind(ptr)
        if found_kind is not None:
            kind, device = found_kind, found_device
    # ---- ours from here: the capsule is renamed, so its destructor will not call the deleter
    if PyCapsule_SetName(id(capsule), _USED_VERSIONED if versioned else _USED):
        raise RuntimeError("PyCapsule_SetName failed")  # pragma: no cover - a valid capsule

    def release(_call: Any = _DELETER_T(deleter) if deleter else None,
                _managed: int = managed) -> None:
        if _call is not None:
            _call(_managed)

    view = ForeignMemory(None, release, kind, device, bool(flags & _READ_ONLY))
    try:
        return build(ptr, nbytes, view, kind, device, 0, None, True)
    except BaseException:
        release()
        raise


def readonly(buf: BufferView) -> bool:
    """Whether ``buf`` views memory its producer marked read-only."""
    ref = buf._ref
    return type(ref) is ForeignMemory and ref.readonly


def check_writable(buf: BufferView, what: str) -> None:
    """BufferError for a view of memory its producer marked read-only."""
    if readonly(buf):
        raise BufferError(f"Buffer.{what}: this Buffer views read-only memory (its DLPack "
                          "producer marked it read-only)")

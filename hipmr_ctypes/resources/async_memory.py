"""``AsyncMemoryResource``: stream-ordered allocation from a HIP memory pool
(``hipMallocFromPoolAsync`` / ``hipFreeAsync``; RMM's ``CudaAsyncMemoryResource``) over a
:class:`~hipmr_ctypes.resources.memory_pool.MemoryPool`, which it exposes as ``.pool``."""
from __future__ import annotations

from ctypes import c_int, c_void_p
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

from .. import _hip
from ..errors import NotSupportedError
from .._hip.types import (hipMemAccessFlagsProtReadWrite, hipMemAllocationTypePinned,
                          hipMemHandleTypeNone, hipMemHandleTypePosixFileDescriptor,
                          hipMemLocation, hipMemLocationTypeDevice, hipMemPoolProps)
from ..device import Device, check_device, device_count, get_device
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from .._checks import FAST_ALIGNMENTS
from .._checks import check_args, check_ptr, check_stream
from .._limits import MAX_ADDRESS, MAX_ONE_DIGIT_INT
from .._thread_exit import arm
from ..stream_refs import PER_THREAD_HANDLE
from .._device_sizes import parse_config_size, resolve_size
from .._sizes import Size
from ._common import MAX_DEVICE_ALIGNMENT
from .memory_pool import MAX_RELEASE_THRESHOLD, MemoryPool, _check_threshold, _parse_threshold

if TYPE_CHECKING:
    from ..ipc import IpcPoolHandle

__all__ = ["AsyncMemoryResource"]

# The hot paths test ``alignment is DEFAULT_ALIGNMENT``: true for the int 256 only (CPython
# keeps one object for each small int), never for ``256.0`` or a numpy integer.  Sizes up to
# MAX_ONE_DIGIT_INT are tested inline; larger ones (up to ``2**63``) take the checked path.
#: ``_ptr`` and ``_bytes`` before the first allocation: no argument is this object (None and 0,
#: which must be tested, would be)
_NO_ALLOCATION = object()

_POOL_SUPPORT_HINT = (
    "device {device} reports no memory-pool support (hipDeviceAttributeMemoryPoolsSupported "
    "is 0). ROCm before 6.2 disables memory pools by default: set HIP_MEM_POOL_SUPPORT=1 in the "
    "environment before the process starts to enable them, or use DeviceMemoryResource")


#: the first runtime versions whose hipMemPoolProps has maxSize: ROCm 6.2, CUDA 12.2
_MAX_SIZE_SINCE = {"amd": (6, 2, 0), "emulated": (6, 2, 0), "nvidia": (12, 2, 0)}


def _require_max_size(rt: Any) -> None:
    since = _MAX_SIZE_SINCE.get(rt.platform, (6, 2, 0))
    version = rt.runtime_version()
    if tuple(version) < since:
        name = "CUDA" if rt.platform == "nvidia" else "ROCm"
        raise NotSupportedError(801, "hipErrorNotSupported",
                                f"maximum_pool_size needs {name} {since[0]}.{since[1]} or later "
                                f"(hipMemPoolProps.maxSize); this runtime is "
                                f"{'.'.join(map(str, version))}", "AsyncMemoryResource")


def _require_pools(device: int) -> None:
    if not Device(device).supports_memory_pools:
        raise NotSupportedError(801, "hipErrorNotSupported",
                                _POOL_SUPPORT_HINT.format(device=device), "AsyncMemoryResource")


def _handle_types(device: int) -> int:
    try:
        return Device(device).attribute("memory_pool_supported_handle_types")
    except (NotSupportedError, ValueError):
        return 0


def _closed_pool(*args: Any) -> int:
    """The allocation function of a resource whose pool was closed."""
    raise ValueError("AsyncMemoryResource: its memory pool is closed")


def _free_then_destroy(free: Any, destroy: Callable[[Optional[int]], None]) -> Any:
    """``hipFreeAsync`` for a resource whose owned pool was closed with allocations still out:
    after each free, ``destroy(stream)`` destroys the pool if that was the last one."""
    def free_async(ptr: int, stream: int) -> int:
        st: int = free(ptr, stream)
        if not st:
            destroy(stream)
        return st
    return free_async


class AsyncMemoryResource:
    """Stream-ordered device memory from a memory pool: ``hipMallocFromPoolAsync`` /
    ``hipFreeAsync`` (RMM's ``CudaAsyncMemoryResource``).

    ``AsyncMemoryResource(device=None, *, initial_pool_size=None, release_threshold=None,
    enable_ipc=False, maximum_pool_size=None)`` creates and owns a new pool on ``device``
    (default: the current one): ``release_threshold`` defaults to ``2**64-1`` so freed memory
    stays in the pool; ``initial_pool_size`` bytes are allocated and freed once to prime it;
    ``enable_ipc`` makes the pool exportable as POSIX file descriptors; ``maximum_pool_size``
    caps what the pool may reserve (``hipMemPoolProps.maxSize``: ROCm 6.2+ / CUDA 12.2+,
    NotSupportedError before).  Sizes as everywhere: bytes, ``"4GiB"``, ``"80%"``.  :meth:`from_default_pool` uses a device's
    current pool instead (not owned, never destroyed).

    Raises :class:`NotSupportedError` when the device has no memory-pool support (ROCm before
    6.2 unless ``HIP_MEM_POOL_SUPPORT=1``).  ``allocate`` / ``deallocate`` run on the null
    stream and wait for it.  Alignment: a power of two up to 256.  Equal when using the same
    pool.  ``.pool`` is the :class:`MemoryPool`; ``close()`` closes it.
    """

    #: validates every argument before any native call (adaptors over it rely on this)
    _checks_arguments = True
    #: its memory is shared with other processes as pool memory (hipmr_ctypes.ipc)
    _ipc_memory = "pool"

    __slots__ = ("_pool", "_handle", "_device", "_rt", "_malloc", "_free_fn", "_settings",
                 "_stream", "_ptr", "_bytes", "__weakref__")
    _ptr: object
    _bytes: object
    properties: Tuple[type, ...] = (device_accessible,)

    #: ``allocate_async`` on a stream that captures a graph is a graph memory node (the
    #: runtime's; its address is the graph's): a pool over this resource passes an allocation
    #: it cannot serve during a capture through to it (``adaptors.pool``)
    _graph_allocations = True

    def __init__(self, device: Optional[Any] = None, *, initial_pool_size: Optional[Size] = None,
                 release_threshold: Optional[Size] = None, enable_ipc: bool = False,
                 maximum_pool_size: Optional[Size] = None) -> None:
        initial = (None if initial_pool_size is None
                   else parse_config_size(initial_pool_size, "initial_pool_size"))
        most = (None if maximum_pool_size is None
                else parse_config_size(maximum_pool_size, "maximum_pool_size"))
        if type(initial) is int and type(most) is int and initial > most:
            raise ValueError(f"initial_pool_size={initial_pool_size!r} is larger than "
                             f"maximum_pool_size={maximum_pool_size!r}")
        threshold_size = (None if release_threshold is None
                          else _parse_threshold(release_threshold))
        if not isinstance(enable_ipc, bool):
            raise TypeError(f"enable_ipc must be a bool, not {type(enable_ipc).__name__}")
        rt = _hip.get_runtime()
        dev = get_device() if device is None else check_device(device)
        initial_pool_size = (None if initial is None
                             else resolve_size(initial, "initial_pool_size", dev))
        threshold = (MAX_RELEASE_THRESHOLD if threshold_size is None
                     else _check_threshold(threshold_size, device=dev))
        maximum = None if most is None else resolve_size(most, "maximum_pool_size", dev)
        if maximum is not None:
            if maximum == 0:
                raise ValueError("maximum_pool_size=0: a pool needs room for one allocation "
                                 "(None: no maximum)")
            if initial_pool_size is not None and initial_pool_size > maximum:
                raise ValueError(f"initial_pool_size={initial_pool_size} bytes is larger than "
                                 f"maximum_pool_size={maximum} bytes")
            _require_max_size(rt)
        _require_pools(dev)
        if enable_ipc and not _handle_types(dev) & hipMemHandleTypePosixFileDescriptor:
            raise NotSupportedError(801, "hipErrorNotSupported",
                                    f"device {dev} cannot export memory pools as POSIX file "
                                    "descriptors (enable_ipc=True)", "AsyncMemoryResource")
        props = self._pool_props(dev, enable_ipc, maximum)
        out = c_void_p()
        rt.check(rt.fn.hipMemPoolCreate(out, props), "hipMemPoolCreate", device=dev)
        ipc = None
        if enable_ipc:
            from ..ipc import PoolIpc
            ipc = PoolIpc.exporting()
        pool = MemoryPool(out.value or 0, dev, True, rt, max_size=maximum, ipc=ipc)
        try:
            pool.release_threshold = threshold
            if initial_pool_size:
                _prime(rt, pool, dev, initial_pool_size)
        except BaseException:
            pool.close()
            raise
        self._bind(pool, rt, (("initial_pool_size", initial_pool_size),
                              ("release_threshold", threshold), ("enable_ipc", enable_ipc),
                              ("maximum_pool_size", maximum)))

    #: the kind of memory and where the pool this resource creates puts it (subclasses place
    #: it elsewhere: on the host, or managed); a pool on a device is located by its ordinal
    _pool_alloc_type: int = hipMemAllocationTypePinned
    _pool_location_type: int = hipMemLocationTypeDevice

    def _pool_props(self, device: int, enable_ipc: bool,
                    maximum: Optional[int]) -> hipMemPoolProps:
        """The properties of the pool this resource creates: ``_pool_alloc_type`` memory at
        ``_pool_location_type`` (``device`` when that is a device)."""
        props = hipMemPoolProps()
        props.allocType = self._pool_alloc_type
        props.handleTypes = (hipMemHandleTypePosixFileDescriptor if enable_ipc
                             else hipMemHandleTypeNone)
        props.location.type = self._pool_location_type
        props.location.id = device if self._pool_location_type == hipMemLocationTypeDevice else 0
        props.maxSize = maximum or 0
        return props

    @classmethod
    def from_default_pool(cls, device: Optional[Any] = None) -> "AsyncMemoryResource":
        """A resource over ``device``'s current memory pool (``hipDeviceGetMemPool``; default
        device: the current one).  The pool is not owned: closing never destroys it."""
        rt = _hip.get_runtime()
        dev = get_device() if device is None else check_device(device)
        _require_pools(dev)
        out = c_void_p()
        rt.check(rt.fn.hipDeviceGetMemPool(out, dev), "hipDeviceGetMemPool", device=dev)
        self = cls.__new__(cls)
        self._bind(MemoryPool(out.value or 0, dev, False, rt), rt, (("default_pool", True),))
        return self

    @classmethod
    def from_ipc(cls, handle: "IpcPoolHandle", device: Optional[Any] = None
                 ) -> "AsyncMemoryResource":
        """An importing resource over the pool of ``handle`` (exported by another process with
        ``MemoryPool.export_handle()``; ``hipMemPoolImportFromShareableHandle``).

        It only maps: ``Buffer.from_ipc(descriptor, resource)`` gives a Buffer over memory of
        that pool, and closing the Buffer unmaps it.  Allocating raises NotSupportedError.
        ``device`` (default: the current one) is the device this process reads the memory
        from: when it is not the pool's device, the importing resource grants it access to the
        imported pool (``hipMemPoolSetAccess``; the exporter's grants do not carry over).
        ``close()`` destroys the imported pool once nothing mapped from it is left; ``handle``
        stays open (close it when no other import needs it)."""
        from ..ipc import IpcPoolHandle, PoolIpc, cannot_allocate, import_pool, unmap_only
        if not isinstance(handle, IpcPoolHandle):
            raise TypeError(f"handle must be an IpcPoolHandle, not {type(handle).__name__}")
        handle.fd   # ValueError when closed
        rt = _hip.get_runtime()
        dev = get_device() if device is None else check_device(device)
        pool_device = handle.device
        if pool_device != dev:
            check_device(pool_device, "the handle's device")
        ipc = PoolIpc.importing(handle)
        pool = MemoryPool(import_pool(handle), pool_device, True, rt, ipc=ipc)
        try:
            if dev != pool_device:
                pool.set_access(dev)
        except BaseException:
            pool.close()
            raise
        self = cls.__new__(cls)
        self._bind(pool, rt, (("imported_from_device", pool_device), ("accessed_from", dev)))
        self._malloc = cannot_allocate
        assert ipc.mappings is not None
        self._free_fn = unmap_only(self._free_fn, ipc.mappings)
        return self

    @classmethod
    def from_pool_handle(cls, handle: Any, device: Optional[Any] = None
                         ) -> "AsyncMemoryResource":
        """A resource over another library's memory pool: ``handle`` is a live
        ``hipMemPool_t`` (``cudaMemPool_t`` on nvidia) as an int, a ``ctypes.c_void_p``, or an
        object that ``int()`` turns into one (hip-python's ``hipMemPool_t``,
        cuda-bindings' ``cudaMemPool_t`` / ``CUmemoryPool``); CuPy's ``MemoryAsyncPool``
        is one such library.  The pool is not owned: nothing here destroys it, so keep the
        library that made it from destroying it while the resource (or memory from it) is
        in use.

        ``device`` (default: found from the pool) is the device the pool's memory lives on:
        without it, the one device that has read-write access to the pool
        (``hipMemPoolGetAccess``); a pool that grants that access to peers too needs
        ``device``.  A handle the runtime does not know raises ValueError; TypeError /
        ValueError for a handle that is not a pointer, before any native call."""
        value = _pool_handle_value(handle)
        dev = None if device is None else check_device(device)
        rt = _hip.get_runtime()
        devices = range(device_count()) if dev is None else (dev,)
        read_write = []
        for ordinal in devices:
            loc = hipMemLocation()
            loc.type = hipMemLocationTypeDevice
            loc.id = ordinal
            flags = c_int()
            if rt.fn.hipMemPoolGetAccess(flags, value, loc):
                rt.clear_last_error()
                raise ValueError(f"handle={value:#x} is not a memory pool the runtime knows "
                                 "(hipMemPoolGetAccess refused it)")
            if flags.value == hipMemAccessFlagsProtReadWrite:
                read_write.append(ordinal)
        if dev is None:
            if len(read_write) != 1:
                raise ValueError(f"the pool {value:#x} is read-write on devices {read_write}: "
                                 "pass device= (the device its memory lives on)")
            dev = read_write[0]
        elif not read_write:
            raise ValueError(f"the pool {value:#x} cannot be used from device {dev} (no "
                             "read-write access): pass the pool's own device")
        self = cls.__new__(cls)
        self._bind(MemoryPool(value, dev, False, rt), rt, (("foreign_pool", True),))
        return self

    def _bind(self, pool: MemoryPool, rt: Any, settings: Tuple[Any, ...]) -> None:
        self._pool = pool
        self._handle = pool.handle
        self._device = pool.device
        self._rt = rt
        self._settings = settings
        self._malloc = rt.fn.hipMallocFromPoolAsync
        self._free_fn = rt.fn.hipFreeAsync
        self._stream = 0  # the stream handle last validated (see _stream_arg)
        self._ptr = _NO_ALLOCATION  # the pointer last allocated (see allocate_async)
        self._bytes = _NO_ALLOCATION  # the size last allocated (see allocate_async)
        pool._add_user(self)

    def _pool_closed(self, destroy: Optional[Callable[[Optional[int]], None]]) -> None:
        """``MemoryPool.close()`` of this resource's pool: allocating raises ValueError from
        now on; frees go on, and with ``destroy`` (an owned pool) each successful free calls
        ``destroy(stream)``, which destroys the pool once nothing of it is outstanding."""
        self._malloc = _closed_pool
        if destroy is not None:
            self._free_fn = _free_then_destroy(self._free_fn, destroy)

    def __copy__(self) -> "AsyncMemoryResource":
        """Another resource on the same pool, which ``pool.close()`` closes too (a copy of
        the slots alone would not be known to the pool, and go on allocating from it)."""
        cls = type(self)
        new = cls.__new__(cls)
        for name in ("_pool", "_handle", "_device", "_rt", "_malloc", "_free_fn", "_settings",
                     "_stream", "_ptr", "_bytes"):
            setattr(new, name, getattr(self, name))
        self._pool._add_user(new)
        new._malloc, new._free_fn = self._malloc, self._free_fn  # if closed meanwhile
        return new

    def __deepcopy__(self, memo: Any) -> "AsyncMemoryResource":
        return self.__copy__()

    def __reduce__(self) -> Tuple[Any, ...]:
        """Pickled by its settings, as every resource is: unpickling makes a new pool with
        the settings this one was made with (``AsyncMemoryResource(device, ...)``), or
        takes the device's current pool again (:meth:`from_default_pool`).  A pool's memory
        never travels: an importing resource (:meth:`from_ipc`) or one over another
        library's pool raises TypeError (send the :class:`IpcPoolHandle` instead)."""
        settings = dict(self._settings)
        if settings.get("default_pool"):
            return (_rebuild, (self._device, None))
        if "enable_ipc" in settings:
            return (_rebuild, (self._device, {
                "initial_pool_size": settings.get("initial_pool_size"),
                "release_threshold": settings.get("release_threshold"),
                "enable_ipc": settings["enable_ipc"]}))
        raise TypeError(f"{self!r} cannot be pickled: its pool belongs to another process or "
                        "library (pickle the IpcPoolHandle of an exported pool, through "
                        "multiprocessing, instead)")

    @property
    def pool(self) -> MemoryPool:
        """The :class:`MemoryPool` this resource allocates from."""
        return self._pool

    @property
    def device(self) -> int:
        """The device ordinal the memory lives on."""
        return self._device

    # ---- hot path.  Invariants:
    # - one inlined test passes the usual call: an int size, the default alignment, and the
    #   stream last validated here (the same object) or a created stream's int handle in
    #   (2, 2**63]; a free's pointer is the int the last allocation returned or any int in
    #   (0, 2**63]; a size that is the object the last allocation took needs no test again;
    # - everything else takes the checked path, which converts what it may (Stream,
    #   stream_ref, numpy integers, handles above 2**63), names what it rejects, and remembers
    #   a validated int handle;
    # - the per-thread stream (handle 2) always takes the checked path, which arms the
    #   thread's wait for it at exit (_thread_exit), so handle 2 is never remembered;
    # - the test stays outside the native call's error handling: no error is swallowed.
    def allocate_async(self, bytes: int, alignment: int, stream: Any) -> int:
        """``hipMallocFromPoolAsync(bytes)`` on ``stream`` (anything ``stream_ref`` accepts);
        returns the pointer as an int (0 for ``bytes == 0``)."""
        if not ((stream is self._stream or type(stream) is int and 2 < stream <= 1 << 63)
                and (bytes is self._bytes or type(bytes) is int and 0 < bytes <= MAX_ONE_DIGIT_INT)
                and alignment is DEFAULT_ALIGNMENT):
            bytes, stream = self._alloc_args(bytes, alignment, stream)
            if not bytes:
                return 0
        out = c_void_p()
        malloc = self._malloc
        st = malloc(out, bytes, self._handle, stream)
        if st:
            raise self._rt.error(st, "hipMallocFromPoolAsync", size=bytes,
                                 device=self._device)
        ptr: int = out.value  # type: ignore[assignment]  # not NULL on success
        self._ptr = ptr
        self._bytes = bytes
        return ptr

    def deallocate_async(self, ptr: int, bytes: int, alignment: int, stream: Any) -> None:
        """``hipFreeAsync(ptr)`` on ``stream``; ``ptr == 0`` does nothing."""
        if not ((stream is self._stream or type(stream) is int and 0 <= stream <= 1 << 63)
                and (ptr is self._ptr or type(ptr) is int and 0 < ptr <= 1 << 63)
                and (bytes is self._bytes or type(bytes) is int and 0 <= bytes <= MAX_ONE_DIGIT_INT)
                and alignment is DEFAULT_ALIGNMENT):
            ptr, stream = self._free_args(ptr, bytes, alignment, stream)
            if not ptr:
                return
        free = self._free_fn
        st = free(ptr, stream)
        if st:
            raise self._rt.error(st, "hipFreeAsync", device=self._device,
                                 detail=f"ptr={ptr:#x}")

    def _alloc_args(self, nbytes: Any, alignment: Any, stream: Any) -> Tuple[int, int]:
        """The checked path of ``allocate_async``'s test: (size, stream handle), or the
        precise TypeError / ValueError."""
        try:
            fast = (type(nbytes) is int and 0 <= nbytes <= 1 << 63
                    and FAST_ALIGNMENTS[alignment] is alignment)
        except (KeyError, TypeError):  # an alignment that is no key / not hashable
            fast = False
        if not fast:
            nbytes = check_args(nbytes, alignment, MAX_DEVICE_ALIGNMENT)[0]
        handle = self._stream_arg(stream)
        if handle == PER_THREAD_HANDLE:  # the calling thread's own: waited for when it ends
            arm(self._rt)
        return nbytes, handle

    def _free_args(self, ptr: Any, nbytes: Any, alignment: Any, stream: Any
                   ) -> Tuple[int, int]:
        """The checked path of ``deallocate_async``'s test: (pointer, stream handle)."""
        try:
            fast = (type(ptr) is int is type(nbytes) and 0 <= ptr <= MAX_ADDRESS
                    and 0 <= nbytes <= 1 << 63 and FAST_ALIGNMENTS[alignment] is alignment)
        except (KeyError, TypeError):
            fast = False
        if not fast:
            ptr = check_ptr(ptr)
            check_args(nbytes, alignment, MAX_DEVICE_ALIGNMENT)
        return ptr, self._stream_arg(stream)

    def _stream_arg(self, stream: Any) -> int:
        """The handle of ``stream``; a valid int handle is remembered, so that the hot paths
        know it by identity next time (any value in ``[0, 2**64)`` is a valid handle, so an
        int once validated is valid for ever; the slot is one atomic store)."""
        handle = check_stream(stream)
        if stream is handle and handle != PER_THREAD_HANDLE:  # see allocate_async's test
            self._stream = handle
        return handle

    def allocate(self, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Allocate on the null stream and wait for it."""
        ptr = self.allocate_async(bytes, alignment, 0)
        if ptr:
            st = self._rt.fn.hipStreamSynchronize(0)
            if st:
                self._free_fn(ptr, 0)
                raise self._rt.error(st, "hipStreamSynchronize", device=self._device)
        return ptr

    def deallocate(self, ptr: int, bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        """Free on the null stream and wait for it."""
        self.deallocate_async(ptr, bytes, alignment, 0)
        if ptr:
            self._rt.check(self._rt.fn.hipStreamSynchronize(0), "hipStreamSynchronize",
                           device=self._device)

    def close(self) -> None:
        """Close the pool (see :meth:`MemoryPool.close`)."""
        self._pool.close()

    def __enter__(self) -> "AsyncMemoryResource":
        self._pool.handle   # ValueError when closed
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        # isinstance as well: mypy before 2.0 (Python 3.9's) narrows only through it
        if type(other) is not type(self) or not isinstance(other, type(self)):
            return NotImplemented
        return other._handle == self._handle

    def __hash__(self) -> int:
        return hash((type(self), self._handle))

    def __repr__(self) -> str:
        settings = "".join(f", {k}={v}" for k, v in self._settings if v is not None)
        state = "closed" if self._pool.closed else f"{self._handle:#x}"
        return f"{type(self).__name__}(device={self._device}{settings}) [pool {state}]"


def _pool_handle_value(handle: Any) -> int:
    """The address of a pool handle given as an int, a ``c_void_p`` or a binding's handle
    object (``int()``); TypeError / ValueError for anything else or NULL."""
    if isinstance(handle, c_void_p):
        value: Any = handle.value or 0
    elif handle is None or isinstance(handle, (bool, float, str, bytes)):
        raise TypeError(f"handle must be a hipMemPool_t (an int address), not "
                        f"{type(handle).__name__}")
    elif isinstance(handle, int):
        value = handle
    else:
        # the handle's own value: cuda-bindings' and hip-python's handle objects give it to
        # int(); their getPtr() is the address of the object's storage, not the handle
        try:
            value = int(handle)
        except (TypeError, ValueError):
            raise TypeError(f"handle must be a hipMemPool_t (an int address), not "
                            f"{type(handle).__name__}") from None
    value = check_ptr(value, "handle")
    if not value:
        raise ValueError("handle is NULL: not a memory pool")
    return int(value)


def _rebuild(device: int, settings: Optional[Any]) -> AsyncMemoryResource:
    """Unpickling an :class:`AsyncMemoryResource` (see its ``__reduce__``)."""
    if settings is None:
        return AsyncMemoryResource.from_default_pool(device)
    return AsyncMemoryResource(device, **settings)


def _prime(rt: Any, pool: MemoryPool, device: int, nbytes: int) -> None:
    """Allocate then free ``nbytes`` once on the null stream of ``device`` and wait."""
    with Device(device):
        out = c_void_p()
        rt.check(rt.fn.hipMallocFromPoolAsync(out, nbytes, pool.handle, 0),
                 "hipMallocFromPoolAsync", size=nbytes, device=device)
        st = rt.fn.hipFreeAsync(out.value, 0)
        st2 = rt.fn.hipStreamSynchronize(0)
        rt.check(st, "hipFreeAsync", device=device)
        rt.check(st2, "hipStreamSynchronize", device=device)

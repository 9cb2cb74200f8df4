# pyright: reportMissingImports=false, reportAttributeAccessIssue=false
# (PyTorch is optional: this module is imported only where it is installed)
"""PyTorch allocations through hipmr_ctypes, with no compiled code.

PyTorch's pluggable allocator takes the addresses of two C functions,
``void* alloc(size_t size, int device, cudaStream_t stream)`` and
``void free(void* ptr, size_t size, int device, cudaStream_t stream)``
(``torch._C._cuda_customAllocator``, what ``torch.cuda.memory.CUDAPluggableAllocator`` calls
after looking the two up in a shared library).  A ctypes callback has such an address, so
:class:`Allocator` builds the two from Python functions that allocate through a resource:

* :func:`use` makes PyTorch take its memory from it for the whole process: by default through
  the *pool route* (``hipmr_ctypes.interop.torch_route``: PyTorch's caching allocator stays on
  top, every allocation of a device served from a ``torch.cuda.MemPool`` over it), or, with
  ``route="allocator"`` (and where this PyTorch does not allow the pool route), as PyTorch's
  allocator itself (``torch.cuda.memory.change_current_allocator``: possible only before
  PyTorch initializes CUDA in the process);
* :func:`mem_pool` gives a ``torch.cuda.MemPool`` over it, for
  ``with torch.cuda.use_mem_pool(pool):`` around a block of code;
* :func:`memory_snapshot` shows our memory in PyTorch's snapshot format
  (``hipmr_ctypes.interop.torch_snapshot``).

Each allocation is made on the stream PyTorch passes (its current stream) through the
resource (default: ``hipmr_ctypes.interop.torch_default``'s for the device PyTorch passes: the
per-device resource where the user chose one, else a ``VirtualPoolResource`` per device where
the device has virtual memory), and freed once, on that stream, when PyTorch frees it.  What the
callbacks guarantee:

* what the resource returns is checked as the adaptors check a user-written upstream (an int
  address, non-null, aligned to 256, ending below 2**64, not live already): anything else is
  given back where it is an address and refused;
* no exception ever leaves a callback (ctypes would print it and return NULL anyway): a
  failed allocation returns NULL and is counted (:attr:`Allocator.failures`, with
  :attr:`Allocator.last_error`) and reported as a ``RuntimeWarning``;
* every pointer handed out is remembered with its size, stream and resource until it is
  freed: a free of a pointer the allocator does not hold (never allocated, or freed already)
  is counted (:attr:`Allocator.unknown_frees`), reported and passed to no resource;
* a zero-byte request returns NULL without asking the resource (PyTorch frees no NULL);
* the callbacks are never freed: each :class:`Allocator` lives until the process ends, as
  PyTorch may call it until then.  Once the interpreter exits (the package's exit hook has
  run), frees do nothing: the memory stays valid for whatever still reaches it, and the
  driver reclaims it with the process;
* no lock is taken: the table of live pointers is a ``dict`` changed by single atomic
  operations, so a free that the garbage collector runs inside an allocation on the same
  thread cannot deadlock.

See docs/interop.md for what each route gives (PyTorch's statistics, its
``torch.cuda.OutOfMemoryError``, ``Tensor.record_stream``, ``empty_cache``, graph capture) and
costs.
"""
from __future__ import annotations

import ctypes
import operator
import sys
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple

import torch

from .._exit import _state as _exit_state
from .._hip import native as _native
from .._limits import MAX_ADDRESS
from .._memory_query import memory_device
from ..adaptors._checked import check_upstream_ptr
from ..properties import DEFAULT_ALIGNMENT, device_accessible
from ..resource_refs import async_resource_ref
from . import torch_route
from .torch_default import cache as _current_resources, resource_of as _resource_of
from .torch_snapshot import memory_snapshot

__all__ = ["Allocator", "allocator", "use", "mem_pool", "installed", "memory_snapshot", "ROUTES",
           "ALLOC_FN", "FREE_FN", "platform_problem"]

#: the C type of PyTorch's allocation function: ``void* (size_t, int, cudaStream_t)``
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
#: the C type of PyTorch's free function: ``void (void*, size_t, int, cudaStream_t)``
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                           ctypes.c_void_p)
ALLOC_FN.__doc__ = "PyTorch's allocation function: ``void* alloc(size_t, int, cudaStream_t)``."
FREE_FN.__doc__ = "PyTorch's free function: ``void free(void*, size_t, int, cudaStream_t)``."

#: every callback ever made, never let go (PyTorch may call one until the process ends);
#: each is also given one extra reference, so that even the teardown of this module's
#: globals at exit cannot free it
_KEEP: List[Any] = []
#: the Allocator :func:`use` installed in this process, if any
_installed: List["Allocator"] = []
_install_lock = threading.Lock()

#: one entry of the table of live pointers: (size, stream handle, the resource's
#: deallocate_async)
_Entry = Tuple[int, int, Callable[..., Any]]


def _keep_forever(cfunc: Any) -> None:
    _KEEP.append(cfunc)
    _native.Py_IncRef(cfunc)


def _report(alloc: "Allocator", message: str) -> None:
    """A ``RuntimeWarning`` from a callback; never raises (warnings turned into errors, a
    finalizing interpreter)."""
    try:
        if not sys.is_finalizing():
            import warnings
            warnings.warn(f"hipmr_ctypes PyTorch allocator: {message}", RuntimeWarning,
                          stacklevel=2)
    except BaseException:  # noqa: BLE001 - nothing may leave a callback
        pass


class Allocator:
    """PyTorch's allocator (what ``torch.cuda.memory.CUDAPluggableAllocator`` builds from a
    shared library) over ``resource``: :func:`use` installs it for the process, and
    :func:`mem_pool` makes a ``torch.cuda.MemPool`` over it.  Its :meth:`allocator` is
    PyTorch's own object, what ``torch.cuda.memory.change_current_allocator`` (wrapped in
    ``torch.cuda.memory._CUDAAllocator``) and ``torch.cuda.MemPool`` take.

    ``resource``: an async, device-accessible resource (or ref), checked now (TypeError naming
    what is missing); None uses :func:`~hipmr_ctypes.interop.torch_default.default_resource`
    of the device PyTorch passes: its per-device resource where ``HIPMR_DEVICE_RESOURCE`` or
    ``set_per_device_resource`` chose one (looked up at each allocation: a change of the
    per-device table is seen at the next one), else a ``VirtualPoolResource`` of the device
    (made at its first allocation, kept for the process), else, where the device has no
    virtual memory, its per-device resource (with a ``RuntimeWarning`` naming why).  A
    resource whose memory lives on one device refuses allocations PyTorch makes for another.

    Builds on any PyTorch; :meth:`allocator` needs one built with CUDA or ROCm.  The C
    functions are at :attr:`alloc_address` and :attr:`free_address`.
    """

    resource: Any
    alloc_address: int
    free_address: int
    last_error: Optional[BaseException]

    def __init__(self, resource: Any = None) -> None:
        live: Dict[int, _Entry] = {}
        failed: Deque[None] = deque()
        unknown: Deque[None] = deque()
        hooks: List[Any] = []   # (capturing, side_stream) once a pool route is installed
        self._capture_hooks = hooks
        self.route: Optional[str] = None   # how use() installed it: "pool" / "allocator"
        self._route: Any = None            # the pool route (torch_route.Route), if any
        self._live = live
        self._failed = failed
        self._unknown = unknown
        self.last_error = None
        if resource is None:
            self.resource = None
            alloc = _default_alloc(self, live, failed, hooks)
        else:
            ref = async_resource_ref[device_accessible](resource)  # TypeError now, not later
            self.resource = ref.resource
            alloc = _fixed_alloc(self, live, failed, hooks, ref.allocate_async,
                                 ref.deallocate_async, memory_device(ref.resource))
        alloc_fn = ALLOC_FN(alloc)
        free_fn = FREE_FN(_free(self, live, unknown))
        _keep_forever(alloc_fn)
        _keep_forever(free_fn)
        self.alloc_address = int(ctypes.cast(alloc_fn, ctypes.c_void_p).value or 0)
        self.free_address = int(ctypes.cast(free_fn, ctypes.c_void_p).value or 0)
        custom = getattr(torch._C, "_cuda_customAllocator", None)
        self._allocator: Any = (None if custom is None
                                else custom(self.alloc_address, self.free_address))

    def allocator(self) -> Any:
        """PyTorch's own allocator object (``torch._C._cuda_CUDAAllocator``), what
        ``change_current_allocator`` and ``torch.cuda.MemPool`` take.  RuntimeError where this
        PyTorch has no CUDA or ROCm support."""
        if self._allocator is None:
            raise RuntimeError(f"this PyTorch ({torch.__version__}) is built without CUDA or "
                               f"ROCm support (torch._C has no _cuda_customAllocator): its "
                               f"allocator cannot be replaced")
        problem = platform_problem()
        if problem is not None:
            raise RuntimeError(problem)
        return self._allocator

    @property
    def failures(self) -> int:
        """Allocations refused so far (NULL returned to PyTorch)."""
        return len(self._failed)

    @property
    def unknown_frees(self) -> int:
        """Frees of pointers this allocator did not hold, so far (passed to no resource)."""
        return len(self._unknown)

    def outstanding(self) -> Tuple[int, int]:
        """``(allocations, bytes)`` handed to PyTorch and not freed yet."""
        entries = list(self._live.values())
        return len(entries), sum(entry[0] for entry in entries)

    def __repr__(self) -> str:
        count, nbytes = self.outstanding()
        return (f"<hipmr_ctypes PyTorch Allocator over {self.resource!r}: {count} allocations, "
                f"{nbytes} bytes outstanding>")


def platform_problem() -> Optional[str]:
    """Why this PyTorch and this package's platform cannot share memory (a sentence), or None
    where they can.  A ROCm build of PyTorch (``torch.version.hip`` set) passes HIP streams and
    takes HIP device memory, which the ``amd`` platform (libamdhip64) gives; a CUDA build
    (``torch.version.cuda``), the ``nvidia`` platform.  Both use the same ``torch.cuda`` names
    (``_cuda_customAllocator``, ``MemPool``, ...), so nothing else differs here.  A build with
    neither (the CPU build) is paired with nothing."""
    version = getattr(torch, "version", None)
    hip, cuda = getattr(version, "hip", None), getattr(version, "cuda", None)
    if not hip and not cuda:
        return None
    wanted = "amd" if hip else "nvidia"
    ours = _platform()
    if ours == wanted:
        return None
    build = f"ROCm (HIP {hip})" if hip else f"CUDA {cuda}"
    return (f"this PyTorch ({torch.__version__}) is built for {build}, and hipmr_ctypes runs on "
            f"the {ours!r} platform, whose streams and memory PyTorch cannot use: set "
            f"HIPMR_PLATFORM={wanted} before importing hipmr_ctypes")


def _platform() -> str:
    from ..device import platform
    return platform()


def _refused(alloc: Allocator, failed: Deque[None], size: int, device: int,
             exc: BaseException) -> None:
    try:
        alloc.last_error = exc
        failed.append(None)
        _report(alloc, f"allocating {size} bytes on device {device} failed: "
                       f"{type(exc).__name__}: {exc}")
    except BaseException:  # noqa: BLE001 - nothing may leave a callback
        pass


#: the last byte an allocation may end at, and the mask of the alignment PyTorch is given
_LAST_ADDRESS = MAX_ADDRESS + 1
_ALIGNMENT_MASK = DEFAULT_ALIGNMENT - 1


def _bad_result(ptr: Any, size: int, stream: int, deallocate_async: Callable[..., Any],
                live: Dict[int, _Entry]) -> None:
    """Refuse what the resource returned for ``size`` bytes on ``stream`` when it is not an
    address PyTorch may be given (the adaptors' own check of a user-written upstream): give it
    back to the resource where it is an address (an integer type such as ``numpy.uint64``
    included, as that int) that PyTorch does not hold already, then raise.  Always raises."""
    if type(ptr) is int and ptr in live and 0 < ptr:
        # handed out twice: giving it back would free the live allocation
        raise RuntimeError(f"the resource returned {ptr:#x}, which PyTorch holds already (a "
                           f"live allocation): refused")
    address: Optional[int] = None
    if type(ptr) is int:
        address = ptr
    elif not isinstance(ptr, (bool, float, complex, str, bytes)):
        try:
            address = operator.index(ptr)  # numpy integers and the like
        except BaseException:  # noqa: BLE001 - not an integer: nothing to give back
            address = None
    if address is not None and 0 < address <= MAX_ADDRESS and address not in live:
        try:
            deallocate_async(address, size, DEFAULT_ALIGNMENT, stream)
        except Exception:  # noqa: BLE001 - the refusal below is the error to report
            pass
    check_upstream_ptr(ptr, size, DEFAULT_ALIGNMENT, _nothing, "the resource")
    raise RuntimeError(f"the resource returned {ptr!r} for {size} bytes: refused")


def _nothing(ptr: int, nbytes: int, alignment: int) -> None:
    """What :func:`check_upstream_ptr` gives back to: nothing (done before it)."""


def _captured(size: int, device: int, side_stream: Callable[[int], Any],
              allocate_async: Callable[..., Any], deallocate_async: Callable[..., Any],
              live: Dict[int, _Entry]) -> int:
    """A segment PyTorch asks for while its stream is being captured (the pool route): made
    on our own non-capturing stream of ``device`` and waited for there, so that nothing
    stream-ordered is recorded into the graph; freed on that stream too."""
    side = side_stream(device)
    handle = side.get()
    ptr: Any = allocate_async(size, DEFAULT_ALIGNMENT, handle)
    if (type(ptr) is not int or not 0 < ptr <= _LAST_ADDRESS - size
            or ptr & _ALIGNMENT_MASK or ptr in live):
        _bad_result(ptr, size, handle, deallocate_async, live)
    try:
        side.wait()
    except BaseException:
        deallocate_async(ptr, size, DEFAULT_ALIGNMENT, handle)
        raise
    live[ptr] = (size, handle, deallocate_async)
    return ptr  # type: ignore[no-any-return]  # an int: checked above


def _fixed_alloc(alloc: Allocator, live: Dict[int, _Entry], failed: Deque[None],
                 hooks: List[Any], allocate_async: Callable[..., int],
                 deallocate_async: Callable[..., Any], fixed: Optional[int]
                 ) -> Callable[[int, int, Optional[int]], Optional[int]]:
    last, mask = _LAST_ADDRESS, _ALIGNMENT_MASK   # closure cells, not global look-ups
    def torch_alloc(size: int, device: int, stream: Optional[int]) -> Optional[int]:
        """PyTorch's ``alloc(size, device, stream)`` over the allocator's resource."""
        try:
            if not size:
                return None
            if fixed is not None and device != fixed:
                raise ValueError(f"the resource's memory is on device {fixed}, PyTorch asked "
                                 f"for device {device}")
            handle = stream or 0
            if hooks and hooks[0][0]():
                return _captured(size, device, hooks[0][1], allocate_async,
                                 deallocate_async, live)
            ptr: Any = allocate_async(size, DEFAULT_ALIGNMENT, handle)
            if (type(ptr) is not int or not 0 < ptr <= last - size or ptr & mask
                    or ptr in live):
                _bad_result(ptr, size, handle, deallocate_async, live)
            live[ptr] = (size, handle, deallocate_async)
            return ptr  # type: ignore[no-any-return]  # an int: checked above
        except BaseException as exc:  # noqa: BLE001 - nothing may leave a callback
            _refused(alloc, failed, size, device, exc)
            return None
    torch_alloc.__qualname__ = "Allocator.torch_alloc"
    return torch_alloc


def _default_alloc(alloc: Allocator, live: Dict[int, _Entry], failed: Deque[None],
                   hooks: List[Any], current: Dict[int, Any] = _current_resources,
                   resource_of: Callable[[int], Any] = _resource_of
                   ) -> Callable[[int, int, Optional[int]], Optional[int]]:
    last, mask = _LAST_ADDRESS, _ALIGNMENT_MASK   # closure cells, not global look-ups

    def torch_alloc_current(size: int, device: int, stream: Optional[int]) -> Optional[int]:
        """PyTorch's ``alloc(size, device, stream)`` over the default resource of
        ``device`` (``torch_default``)."""
        try:
            if not size:
                return None
            try:
                _, where, allocate_async, deallocate_async = current[device]
            except KeyError:
                _, where, allocate_async, deallocate_async = resource_of(device)
            if where != device:
                raise ValueError(f"the resource of device {device} has its memory "
                                 f"on device {where}")
            handle = stream or 0
            if hooks and hooks[0][0]():
                return _captured(size, device, hooks[0][1], allocate_async,
                                 deallocate_async, live)
            ptr: Any = allocate_async(size, DEFAULT_ALIGNMENT, handle)
            if (type(ptr) is not int or not 0 < ptr <= last - size or ptr & mask
                    or ptr in live):
                _bad_result(ptr, size, handle, deallocate_async, live)
            live[ptr] = (size, handle, deallocate_async)
            return ptr  # type: ignore[no-any-return]  # an int: checked above
        except BaseException as exc:  # noqa: BLE001 - nothing may leave a callback
            _refused(alloc, failed, size, device, exc)
            return None
    torch_alloc_current.__qualname__ = "Allocator.torch_alloc_current"
    return torch_alloc_current


def _free(alloc: Allocator, live: Dict[int, _Entry], unknown: Deque[None],
          state: Dict[str, bool] = _exit_state,
          finalizing: Callable[[], bool] = sys.is_finalizing
          ) -> Callable[[Optional[int], int, int, Optional[int]], None]:
    def torch_free(ptr: Optional[int], size: int, device: int, stream: Optional[int]) -> None:
        """PyTorch's ``free(ptr, size, device, stream)``: frees ``ptr`` once, with the size
        and on the stream it was allocated with."""
        try:
            if not ptr or state["keep"] or finalizing():
                return  # exiting: memory that may still be reachable stays valid
            entry = live.pop(ptr, None)
            if entry is None:
                unknown.append(None)
                _report(alloc, f"free of {ptr:#x} ({size} bytes, device {device}), which this "
                               f"allocator does not hold (never allocated here, or freed "
                               f"already): ignored")
                return
            nbytes, handle, deallocate_async = entry
            deallocate_async(ptr, nbytes, DEFAULT_ALIGNMENT, handle)
        except BaseException as exc:  # noqa: BLE001 - nothing may leave a callback
            try:
                alloc.last_error = exc
                _report(alloc, f"freeing {ptr!r} failed: {type(exc).__name__}: {exc}")
            except BaseException:  # noqa: BLE001
                pass
    torch_free.__qualname__ = "Allocator.torch_free"
    return torch_free


def allocator(resource: Any = None) -> Allocator:
    """An :class:`Allocator` over ``resource`` (None: the default of the device PyTorch
    passes, see :class:`Allocator`), for ``torch.cuda.memory.change_current_allocator`` or
    ``MemPool``."""
    return Allocator(resource)


def installed() -> Optional[Allocator]:
    """The :class:`Allocator` that :func:`use` installed in this process, or None."""
    return _installed[0] if _installed else None


#: the ways :func:`use` can put an :class:`Allocator` under PyTorch
ROUTES: Tuple[str, ...] = ("auto", "pool", "allocator")


def use(resource: Any = None, *, route: str = "auto",
        devices: Optional[Iterable[int]] = None) -> Allocator:
    """Make PyTorch take its CUDA (or ROCm) memory from an :class:`Allocator` over
    ``resource`` for the rest of the process, and return the Allocator (its ``route``
    attribute says which route was taken).  Only once per process.

    ``route``:

    * ``"pool"``: PyTorch's caching allocator stays on top, and every allocation of each
      routed device comes from a ``torch.cuda.MemPool`` over the Allocator
      (``hipmr_ctypes.interop.torch_route`` says how): PyTorch's statistics, its
      ``OutOfMemoryError``, ``record_stream``, ``empty_cache`` and graph capture work, and
      our resource sees the segments PyTorch caches.  Built on private PyTorch functions,
      so taken only where this PyTorch passes :func:`~hipmr_ctypes.interop.torch_route.
      route_problem`'s checks, and checked once more on each device by one allocation that
      must reach the Allocator; RuntimeError naming the problem otherwise (and nothing is
      left routed).  Possible after PyTorch initialized CUDA too (memory PyTorch holds
      already stays where it is);
    * ``"allocator"``: the Allocator replaces PyTorch's allocator
      (``change_current_allocator``): every tensor is one allocation of the resource, with
      none of the above (see docs/interop.md).  Possible only before PyTorch initializes
      CUDA in the process;
    * ``"auto"`` (default): ``"pool"`` where this PyTorch passes the checks, else
      ``"allocator"`` with a ``RuntimeWarning`` naming why.

    ``devices``: the devices to route (``"pool"``; default: every visible device, or the one
    device a resource's memory lives on).  ValueError for an unknown route, TypeError /
    ValueError for a bad device and TypeError for a resource that is not async and
    device-accessible, all before anything changes; RuntimeError where this PyTorch has no
    CUDA or ROCm support.
    """
    if not isinstance(route, str) or route not in ROUTES:
        raise ValueError(f"route={route!r}: expected one of {', '.join(map(repr, ROUTES))}")
    wanted = None if devices is None else _device_list(devices)
    made = Allocator(resource)
    made.allocator()  # RuntimeError without CUDA / ROCm, before anything changes
    with _install_lock:
        if _installed:
            raise RuntimeError("hipmr_ctypes.interop.torch.use() was already called in this "
                               "process: PyTorch's allocator can be changed only once")
        backend = torch_route.backend_problem()
        if backend is not None:
            raise RuntimeError(f"hipmr_ctypes.interop.torch.use(): {backend}; remove the "
                               f"'backend:' setting (use(AsyncMemoryResource()) gives "
                               f"stream-ordered memory under PyTorch's own cache)")
        problem = None if route == "allocator" else torch_route.route_problem()
        if problem is not None and route == "pool":
            raise RuntimeError(f"the pool route is not available: {problem} (use "
                               f"route='allocator' before PyTorch initializes CUDA)")
        if problem is None and route != "allocator":
            _route(made, wanted)
        else:
            if problem is not None:
                import warnings
                warnings.warn(f"hipmr_ctypes.interop.torch.use(): the pool route is not "
                              f"available ({problem}); replacing PyTorch's allocator instead, "
                              f"which gives up PyTorch's memory statistics, its "
                              f"OutOfMemoryError, record_stream, empty_cache and graph capture "
                              f"(see docs/interop.md)", RuntimeWarning, stacklevel=2)
            _replace(made)
        _installed.append(made)
    return made


def _device_list(devices: Iterable[int]) -> List[int]:
    try:
        found = list(devices)
    except TypeError:
        raise TypeError(f"devices must be an iterable of device ordinals, not "
                        f"{type(devices).__name__}") from None
    for device in found:
        if type(device) is not int:
            raise TypeError(f"devices: {device!r} is not an int device ordinal")
        if device < 0:
            raise ValueError(f"devices: {device} is negative")
    if not found:
        raise ValueError("devices is empty: nothing would be routed")
    return sorted(set(found))


def _replace(made: Allocator) -> None:
    """The allocator route: ``change_current_allocator`` (only before CUDA starts)."""
    if torch.cuda.is_initialized():
        raise RuntimeError("PyTorch has already initialized CUDA in this process, and "
                           "its allocator can be replaced only before that: call "
                           "hipmr_ctypes.interop.torch.use() before the first CUDA "
                           "tensor (or use mem_pool() for a block of code)")
    try:
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory._CUDAAllocator(made.allocator()))
    except RuntimeError as exc:
        raise RuntimeError(f"PyTorch refused to replace its CUDA allocator ({exc}); it "
                           f"allows that only once, before its first CUDA allocation in "
                           f"the process: call hipmr_ctypes.interop.torch.use() earlier "
                           f"(or use mem_pool() for a block of code)") from exc
    made.route = "allocator"


def _route(made: Allocator, devices: Optional[List[int]]) -> None:
    """The pool route over every device of ``devices`` (see :func:`use`)."""
    fixed = None if made.resource is None else memory_device(made.resource)
    if devices is None:
        devices = [fixed] if fixed is not None else list(range(torch.cuda.device_count()))
    elif fixed is not None and devices != [fixed]:
        raise ValueError(f"the resource's memory is on device {fixed}: it can serve only "
                         f"that device, not devices={devices}")
    if not devices:
        raise RuntimeError("PyTorch sees no CUDA device: nothing to route")
    route = torch_route.Route(made.allocator())

    def check(device: int) -> Optional[str]:
        """None when one allocation on ``device`` reached the Allocator, else what went
        wrong."""
        count = made.outstanding()[0]
        try:
            probe = torch.empty(1, dtype=torch.uint8, device=f"cuda:{device}")
        except Exception as exc:  # noqa: BLE001 - reported as the route's problem
            return (f"the first allocation through the pool route on device {device} "
                    f"failed: {type(exc).__name__}: {exc}")
        ptr = probe.data_ptr()
        held = any(start <= ptr < start + entry[0] for start, entry in list(made._live.items()))
        del probe
        if made.outstanding()[0] <= count and not held:
            return (f"PyTorch did not take the memory of a tensor on device {device} from "
                    f"the routed pool: torch._C._cuda_beginAllocateToPool of PyTorch "
                    f"{torch.__version__} does not route as the pool route needs")
        return None

    route.install(devices, check)
    made._capture_hooks.append((torch_route.capturing(), route.side_stream))
    made._route = route
    made.route = "pool"


def mem_pool(resource: Any = None, **options: Any) -> Any:
    """A ``torch.cuda.MemPool`` whose memory comes from an :class:`Allocator` over
    ``resource`` (an :class:`Allocator` itself is used as it is): allocations made inside
    ``with torch.cuda.use_mem_pool(pool):`` (on that thread) go through it.  ``options``
    go to ``MemPool`` (``use_on_oom``, ``no_split``).  PyTorch's caching allocator keeps the
    pool's freed blocks for reuse until the pool is dropped (or ``torch.cuda.empty_cache()``),
    and a NULL from the resource becomes ``torch.cuda.OutOfMemoryError``.

    RuntimeError where this PyTorch has no ``torch.cuda.MemPool`` or no CUDA / ROCm support,
    and after :func:`use` (a pool needs PyTorch's caching allocator).
    """
    made = resource if isinstance(resource, Allocator) else Allocator(resource)
    if _installed:
        raise RuntimeError("use() already routes PyTorch's allocations in this process: "
                           "under the allocator route no MemPool is reached, and under the "
                           "pool route every allocation goes to use()'s pool before any "
                           "use_mem_pool")
    pool_class = getattr(torch.cuda, "MemPool", None)
    if pool_class is None:
        raise RuntimeError(f"this PyTorch ({torch.__version__}) has no torch.cuda.MemPool")
    native = made.allocator()
    torch.cuda.init()  # PyTorch's CUDA state, which a MemPool is made in
    pool = pool_class(native, **options)
    return pool

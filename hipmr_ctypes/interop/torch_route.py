# pyright: reportMissingImports=false, reportAttributeAccessIssue=false
# (PyTorch is optional: this module is imported only where it is installed)
"""Every PyTorch allocation of a device through a ``torch.cuda.MemPool`` over our allocator,
with PyTorch's caching allocator kept on top: what ``interop.torch.use()`` installs where
this PyTorch allows it (the *pool route*).

PyTorch's caching allocator keeps pools of segments; a ``MemPool`` made with an allocator gets
its segments from that allocator.  ``torch._C._cuda_beginAllocateToPool(device, pool_id)``
(private, the one call that routes every allocation of a device, from every thread and
stream, into one pool) makes that pool the one every allocation of the device is served
from.  PyTorch itself then does what it does for its own memory: ``memory_stats()``,
``memory_allocated()``, ``memory_snapshot()``, ``torch.cuda.OutOfMemoryError`` when our
resource refuses (after it gave its cached segments back and tried again),
``Tensor.record_stream``, and the reuse of freed blocks with no call into Python.  Our
resource sees (and our statistics, limits and logs count) the segments PyTorch holds.

Which routed pool serves an allocation depends on the release: earlier ones take the
first pool begun whose filter matches the stream, later ones the last one begun (so that a
pool begun inside another's scope wins).  :meth:`Route.install` finds out which by trying it
once, with two pools over our allocator, before it routes anything (``newest_first``).
PyTorch's own calls are wrapped while the route is installed, because a graph or a per-thread
pool must win over the route, and PyTorch never releases the cached segments of a pool still
in use:

* ``CUDAGraph.capture_begin``: a graph captures into a pool of its own (PyTorch's rule: what
  a graph uses is never handed to anything else before the graph is gone).  Where the first
  pool begun wins, the route steps aside for the call so that the graph's pool comes first;
  a graph given no pool gets a new ``MemPool`` over our allocator, kept for the rest of the
  process (its memory is ours too): a MemPool destroyed while a device is routed aborts
  PyTorch;
* ``torch.cuda.graph_pool_handle``: a ``MemPool`` over our allocator (kept for the rest of
  the process, as PyTorch keeps the pools it hands out), so graphs that share a pool, and
  ``torch.compile(mode="reduce-overhead")``, take memory from our resource;
* ``torch.cuda.empty_cache`` (``torch._C._cuda_emptyCache``): the route moves to a fresh pool
  and lets the previous one go, so that PyTorch gives that pool's cached segments back to our
  resource (the segments still in use go back once their tensors are freed, at the next
  ``empty_cache`` or when an allocation runs short).  Where the last pool begun wins, a
  device with a graph capture or a per-thread pool under way keeps its route pool (a fresh
  one would be begun last and win over theirs);
* the per-thread ``_cuda_beginAllocateCurrentThreadToPool`` / ``...CurrentStreamToPool``
  (``use_mem_pool``, the graph trees of ``torch.compile(mode="reduce-overhead")``): where
  the first pool begun wins, the route steps aside for the call and comes back after it;
  where the last one wins, the call is counted (until ``_cuda_endAllocateToPool`` ends that
  pool) for ``empty_cache``'s rule above.

While a stream is being captured, the segments PyTorch asks for are allocated on a
non-capturing stream of our own (made once per device) and waited for, so that nothing
stream-ordered is recorded into the graph.
"""
from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ["route_problem", "backend_problem", "Route", "capturing", "MIN_TORCH"]

#: the first PyTorch release whose pool route has been measured
MIN_TORCH: Tuple[int, int] = (2, 8)
#: an int as pybind11 spells it: ``int``, or ``typing.SupportsInt`` (newer pybind11 releases)
_INT = r"(?:int|typing\.SupportsInt|SupportsInt)"
_SIGNATURE = re.compile(r"^_cuda_beginAllocateToPool\(\s*\w+\s*:\s*" + _INT + r"\s*,\s*\w+\s*:\s*"
                        r"tuple\[\s*" + _INT + r"\s*,\s*" + _INT + r"\s*\]\s*\)\s*->\s*None",
                        re.IGNORECASE)
#: PyTorch's per-thread "allocate to this pool" calls, which the route steps aside for
_PER_THREAD_BEGIN = ("_cuda_beginAllocateCurrentThreadToPool",
                     "_cuda_beginAllocateCurrentStreamToPool")
#: the variables that turn PyTorch's caching off: the CUDA spelling, and the HIP one a ROCm
#: build (made from the CUDA sources by renaming) may read
_NO_CACHING = ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_NO_HIP_MEMORY_CACHING")
_PRIVATE = ("_cuda_beginAllocateToPool", "_cuda_endAllocateToPool", "_cuda_releasePool",
            "_cuda_emptyCache", "_cuda_isCurrentStreamCapturing")


def _version(text: str) -> Tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def backend_problem() -> Optional[str]:
    """Why PyTorch's allocator backend keeps our memory out (a sentence), or None for its
    caching allocator (``native``).  Under another backend (``backend:cudaMallocAsync``)
    neither route is taken: replacing that allocator has been seen to leave Python errors
    set inside PyTorch's calls."""
    backend = getattr(torch._C, "_cuda_getAllocatorBackend", None)
    if callable(backend) and backend() != "native":
        return (f"PyTorch's allocator backend is {backend()!r} (PYTORCH_ALLOC_CONF, "
                f"PYTORCH_CUDA_ALLOC_CONF or PYTORCH_HIP_ALLOC_CONF 'backend:'), not its "
                f"caching allocator ('native'), which the pool route keeps on top")
    return None


def route_problem() -> Optional[str]:
    """Why this PyTorch cannot take the pool route (a sentence), or None where it can: a
    release from :data:`MIN_TORCH` on, ``torch.cuda.MemPool`` taking an allocator, the
    private functions the route calls present with the signatures it was written for, and
    PyTorch's caching allocator in use (its ``native`` backend, caching not turned off).  A
    ROCm build (``torch.version.hip``) has the same names and is checked the same way."""
    version = _version(torch.__version__)
    if version < MIN_TORCH:
        return (f"PyTorch {torch.__version__} is older than "
                f"{MIN_TORCH[0]}.{MIN_TORCH[1]}, the first release the pool route is "
                f"written for")
    if not hasattr(torch._C, "_cuda_customAllocator"):
        return f"PyTorch {torch.__version__} is built without CUDA or ROCm support"
    pool_class = getattr(torch.cuda, "MemPool", None)
    if pool_class is None:
        return f"PyTorch {torch.__version__} has no torch.cuda.MemPool"
    for name in _PRIVATE:
        fn = getattr(torch._C, name, None)
        if fn is None or isinstance(fn, type) or not callable(fn):
            return f"PyTorch {torch.__version__} has no torch._C.{name}"
    doc = getattr(torch._C._cuda_beginAllocateToPool, "__doc__", None) or ""
    if not _SIGNATURE.match(doc.strip()):
        first = doc.strip().splitlines()[0] if doc.strip() else "no signature"
        return (f"torch._C._cuda_beginAllocateToPool of PyTorch {torch.__version__} is "
                f"not (device: int, mempool_id: tuple[int, int]) -> None: {first!r}")
    graph_class = getattr(getattr(torch.cuda, "graphs", None), "CUDAGraph", None)
    if graph_class is None or not callable(getattr(graph_class, "capture_begin", None)):
        return f"PyTorch {torch.__version__} has no torch.cuda.graphs.CUDAGraph.capture_begin"
    other = backend_problem()
    if other is not None:
        return other
    for name in _NO_CACHING:
        if name in os.environ:   # any value: PyTorch releases differ on what one means
            return (f"{name} is set: PyTorch's caching allocator, which the pool route keeps "
                    f"on top, may be off")
    return None


class Route:
    """The pool route of one :class:`~hipmr_ctypes.interop.torch.Allocator` (see the module
    docstring).  :meth:`install` routes every device; nothing is undone afterwards (PyTorch
    may hold memory of the pools until the process ends)."""

    native: Any
    pools: Dict[int, Any]
    kept: List[Any]
    lock: Any
    side: Dict[int, Any]
    newest_first: bool
    others: Dict[Tuple[int, Any], int]

    def __init__(self, native: Any) -> None:
        self.native = native                      # PyTorch's allocator object over ours
        self.pools: Dict[int, Any] = {}           # device -> the MemPool routed to
        self.kept: List[Any] = []                 # pools PyTorch may still name: never dropped
        self.lock = threading.RLock()
        self.side: Dict[int, Any] = {}            # device -> our non-capturing stream
        self.newest_first = False                 # which routed pool PyTorch serves from
        # (device, pool id) -> how many times begun and not yet ended, of the pools begun by
        # a graph capture or per thread while the route is installed (newest_first only)
        self.others: Dict[Tuple[int, Any], int] = {}
        self._end_pool: Callable[[Any, Any], Any] = torch._C._cuda_endAllocateToPool

    # ------------------------------------------------------------------- the routing
    def _new_pool(self, device: int) -> Any:
        with torch.cuda.device(device):
            return torch.cuda.MemPool(self.native)

    def _begin(self, device: int) -> None:
        torch._C._cuda_beginAllocateToPool(device, self.pools[device].id)

    def _end(self, device: int) -> None:
        pool_id = self.pools[device].id
        self._end_pool(device, pool_id)
        torch._C._cuda_releasePool(device, pool_id)   # the reference begin took

    def _probe_order(self, device: int) -> bool:
        """Whether this PyTorch serves an allocation from the pool begun last among those
        whose filter matches (else the first): found by beginning one pool for every stream,
        then one for this thread, and asking which holds a one-byte tensor.  Run before any
        device is routed, so that both pools can be dropped (they give their segments back
        to our allocator)."""
        thread_begin = getattr(torch._C, _PER_THREAD_BEGIN[0], None)
        if thread_begin is None:
            return False   # no per-thread pools: nothing begins a pool the route must yield to
        older, newer = self._new_pool(device), self._new_pool(device)
        torch._C._cuda_beginAllocateToPool(device, older.id)
        try:
            thread_begin(device, newer.id)
            try:
                tensor = torch.empty(1, dtype=torch.uint8, device=f"cuda:{device}")
                found = _holds(device, newer.id, tensor.data_ptr())
                del tensor
            finally:
                self._end_pool(device, newer.id)
                torch._C._cuda_releasePool(device, newer.id)
        finally:
            self._end_pool(device, older.id)
            torch._C._cuda_releasePool(device, older.id)
        return found

    def install(self, devices: List[int], check: Callable[[int], Optional[str]]) -> None:
        """Route each device of ``devices``; ``check(device)`` then says what went wrong
        (None: the route serves that device), and a problem undoes the routing of every
        device and raises RuntimeError naming it."""
        with self.lock:
            torch.cuda.init()  # PyTorch's CUDA state, which a MemPool is made in
            self.newest_first = self._probe_order(devices[0])
            try:
                for device in devices:
                    self.pools[device] = self._new_pool(device)
                    self._begin(device)
                    problem = check(device)
                    if problem is not None:
                        raise RuntimeError(problem)
            except BaseException:
                for device in list(self.pools):
                    try:
                        self._end(device)
                    except Exception:  # noqa: BLE001 - undoing what was begun, best effort
                        pass
                self.pools.clear()   # each MemPool's end releases it and empties its cache
                raise
            self._wrap_pytorch()

    def _others_on(self, device: int) -> bool:
        return any(count and key[0] == device for key, count in self.others.items())

    def rotate(self) -> None:
        """Move every routed device to a fresh pool and let the previous pools go, so that
        PyTorch can give their cached segments back (``empty_cache``).  Where the last pool
        begun wins, a device with another pool under way (a capture, a per-thread pool) keeps
        its pool: a fresh one would be begun last and win over it."""
        with self.lock:
            devices = [device for device in self.pools
                       if not (self.newest_first and self._others_on(device))]
            for device in devices:
                self._end(device)
            # A MemPool is destroyed only while no device is routed: PyTorch's destructor
            # asserts that no allocation to a pool is under way, and aborts the process.
            if len(devices) == len(self.pools):
                old = [self.pools.pop(device) for device in devices]
                del old   # each MemPool's end releases it and empties its cache
            else:   # a routed device remains: the previous pools are kept, never destroyed
                self.kept.extend(self.pools.pop(device) for device in devices)
            for device in devices:
                self.pools[device] = self._new_pool(device)
                self._begin(device)

    def _count(self, device: int, pool_id: Any, step: int) -> None:
        key = (device, tuple(pool_id))
        left = self.others.get(key, 0) + step
        if left > 0:
            self.others[key] = left
        else:
            self.others.pop(key, None)

    # ------------------------------------------------------------ PyTorch's own calls
    def _wrap_pytorch(self) -> None:
        route = self
        graphs = torch.cuda.graphs
        graph_class = graphs.CUDAGraph
        capture_begin = graph_class.capture_begin
        capture_end = graph_class.capture_end
        empty = torch._C._cuda_emptyCache
        end_pool = self._end_pool
        capturing_graphs: Dict[int, Tuple[int, Any]] = {}   # id(graph) -> (device, pool id)

        def routed_capture_begin(graph: Any, pool: Any = None, *args: Any, **kw: Any) -> Any:
            """``CUDAGraph.capture_begin`` with a graph given no pool given a MemPool over
            our allocator, and the route stepped aside for the call where the first pool
            begun wins."""
            device = torch.cuda.current_device()
            with route.lock:
                if device not in route.pools:
                    return capture_begin(graph, pool, *args, **kw)
                if pool is None:
                    # kept for the rest of the process, never tied to the graph: a MemPool
                    # destroyed while a device is routed aborts PyTorch (see rotate)
                    made = route._new_pool(device)
                    route.kept.append(made)
                    pool = made.id
                if route.newest_first:
                    result = capture_begin(graph, pool, *args, **kw)
                    capturing_graphs[id(graph)] = (device, pool)
                    route._count(device, pool, 1)
                    return result
                route._end(device)
                try:
                    return capture_begin(graph, pool, *args, **kw)
                finally:
                    route._begin(device)

        def routed_capture_end(graph: Any, *args: Any, **kw: Any) -> Any:
            """``CUDAGraph.capture_end``: the graph's pool no longer counts as under way."""
            try:
                return capture_end(graph, *args, **kw)
            finally:
                with route.lock:
                    begun = capturing_graphs.pop(id(graph), None)
                    if begun is not None:
                        route._count(begun[0], begun[1], -1)

        def routed_graph_pool_handle() -> Any:
            """``torch.cuda.graph_pool_handle()``: the id of a MemPool over our allocator,
            kept for the rest of the process."""
            made = route._new_pool(torch.cuda.current_device())
            route.kept.append(made)
            handle_type = getattr(torch.cuda, "_POOL_HANDLE", None)
            return made.id if handle_type is None else handle_type(made.id)

        def routed_empty_cache(*args: Any, **kw: Any) -> Any:
            """``torch._C._cuda_emptyCache``: the route moves to fresh pools first, so that
            the cached segments of the previous ones go back to our resource."""
            route.rotate()
            return empty(*args, **kw)

        def step_aside(begin: Callable[..., Any]) -> Callable[..., Any]:
            """PyTorch's ``_cuda_beginAllocateCurrentThreadToPool`` (``use_mem_pool``, and
            the graph trees of ``torch.compile(mode="reduce-overhead")``): where the first
            pool begun wins, the route steps aside for the call and comes back after it, so
            that the pool begun there is found first; where the last one wins, the pool is
            counted as under way until it ends."""
            def routed_begin(device: Any, pool_id: Any, *args: Any, **kw: Any) -> Any:
                index = int(device)
                with route.lock:
                    if index not in route.pools:
                        return begin(device, pool_id, *args, **kw)
                    if route.newest_first:
                        result = begin(device, pool_id, *args, **kw)
                        route._count(index, pool_id, 1)
                        return result
                    route._end(index)
                    try:
                        return begin(device, pool_id, *args, **kw)
                    finally:
                        route._begin(index)
            routed_begin.__wrapped__ = begin  # type: ignore[attr-defined]
            return routed_begin

        def routed_end(device: Any, pool_id: Any, *args: Any, **kw: Any) -> Any:
            """``_cuda_endAllocateToPool``: a pool counted as under way is so no longer."""
            result = end_pool(device, pool_id, *args, **kw)
            with route.lock:
                if route.others:
                    route._count(int(device), pool_id, -1)
            return result

        memory = torch.cuda.memory
        for name in _PER_THREAD_BEGIN:
            found = getattr(torch._C, name, None)
            if found is None:
                continue
            routed = step_aside(found)
            setattr(torch._C, name, routed)
            if getattr(memory, name, None) is found:   # use_mem_pool's own reference
                setattr(memory, name, routed)
        if self.newest_first:
            routed_end.__wrapped__ = end_pool  # type: ignore[attr-defined]
            setattr(torch._C, "_cuda_endAllocateToPool", routed_end)
            if getattr(memory, "_cuda_endAllocateToPool", None) is end_pool:
                setattr(memory, "_cuda_endAllocateToPool", routed_end)

        routed_capture_begin.__wrapped__ = capture_begin  # type: ignore[attr-defined]
        routed_capture_end.__wrapped__ = capture_end  # type: ignore[attr-defined]
        graph_class.capture_begin = routed_capture_begin
        graph_class.capture_end = routed_capture_end
        torch.cuda.graph_pool_handle = routed_graph_pool_handle
        graphs.graph_pool_handle = routed_graph_pool_handle
        torch._C._cuda_emptyCache = routed_empty_cache

    # ---------------------------------------------------------------- graph capture
    def side_stream(self, device: int) -> Any:
        """The ``stream_ref`` of our own non-blocking stream on ``device`` (made on first
        use, kept for the rest of the process): where segments asked for during a capture
        are made, and waited for."""
        found = self.side.get(device)
        if found is None:
            from ..stream import Stream
            with self.lock:
                found = self.side.get(device)
                if found is None:
                    found = self.side[device] = Stream(flags=1, device=device)
        return found.ref


def _holds(device: int, pool_id: Any, ptr: int) -> bool:
    """Whether PyTorch's pool ``pool_id`` on ``device`` holds the allocation at ``ptr``."""
    check = getattr(torch._C, "_cuda_checkPoolLiveAllocations", None)
    if check is not None:
        return bool(check(device, pool_id, {ptr}))
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= ptr < segment["address"] + segment["total_size"]:
            return tuple(segment.get("segment_pool_id", (0, 0))) == tuple(pool_id)
    return False


def capturing() -> Callable[[], bool]:
    """PyTorch's own test of whether its current stream is being captured (the stream it
    passes to an allocation)."""
    test: Callable[[], bool] = torch._C._cuda_isCurrentStreamCapturing
    return test

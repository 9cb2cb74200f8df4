"""Stream capture and graphs: hipStreamBeginCapture ... hipGraphExecDestroy, and what a capture
under way does to the other calls (docs/emulated.md, "Stream capture").

While any capture is under way, the call wrapper (``EmulatorCore._wrap``) hands every call
named in ``_CAPTURE_GATED`` to :meth:`CaptureMixin._capture_gate` first, which

* records work queued on a capturing stream as a node of the capture instead of running it
  (copies, memsets, prefetches, event records, stream-ordered allocations and frees of graph
  memory, graph launches); an allocation node reserves its address at once, fixed for the
  graph's life;
* joins a stream into the capture when it waits for an event recorded in it (cross-stream
  capture); a wait for an event recorded outside any capture adds nothing (it is satisfied);
* refuses what a capture forbids, as HIP and CUDA do: synchronizing or querying a capturing
  stream (hipErrorStreamCaptureUnsupported) or an event recorded in a capture
  (hipErrorCapturedEvent), both invalidating the capture; a use of the legacy null stream
  while a blocking stream of its device captures (hipErrorStreamCaptureImplicit, invalidating
  it); and, by the calling thread's capture mode (hipThreadExchangeStreamCaptureMode), the
  potentially unsafe calls (synchronous allocation, free, copy and memset, device-wide
  synchronization, from HIP 7.0 hipEventQuery: hipErrorStreamCaptureUnsupported, the capture
  left as it was).

hipGraphLaunch replays the nodes in capture order on the launch stream.  With no capture under
way nothing of this runs (one test of an empty dict per call).
"""
from __future__ import annotations

import threading
from ctypes import c_int, c_ulonglong, c_void_p
from typing import Any, Dict, List, Optional, Set, Tuple

from ._args import Status, addr, i32, out, u64
from ._core import (GRAPH, INVALID_HANDLE, INVALID_VALUE, OUT_OF_MEMORY, SPECIAL_HANDLES, Alloc,
                    EmulatorCore, Stream, round_up)

__all__ = ["CaptureMixin", "Capture", "Graph", "GraphAlloc"]

ILLEGAL_STATE = 401
CAPTURE_UNSUPPORTED = 900
CAPTURE_INVALIDATED = 901
CAPTURE_MERGE = 902
CAPTURE_UNMATCHED = 903
CAPTURE_UNJOINED = 904
CAPTURE_IMPLICIT = 906
CAPTURED_EVENT = 907
CAPTURE_WRONG_THREAD = 908

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
ACTIVE, INVALIDATED, ENDED = 1, 2, 3   # (ENDED: the capture's events are plain events again)

#: stream-ordered work captured as a node: name -> position of the stream argument
_QUEUED = {"hipMemcpyAsync": 4, "hipMemcpyPeerAsync": 5, "hipMemsetAsync": 3,
           "hipMemsetD8Async": 3, "hipMemsetD16Async": 3, "hipMemsetD32Async": 3,
           "hipMemPrefetchAsync": 3, "hipEventRecord": 1, "hipStreamWaitEvent": 0,
           "hipMallocAsync": 2, "hipMallocFromPoolAsync": 3, "hipFreeAsync": 1,
           "hipGraphLaunch": 1, "hipMemDiscardBatchAsync": 4}
#: potentially unsafe calls (they may synchronize the device): refused by the capture mode.
#: Synchronizing or querying a stream or event outside the capture is not among them (only the
#: capture's own, and the legacy stream's, are refused); hipEventQuery is from HIP 7.0 on.
_UNSAFE = frozenset({"hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree", "hipMallocManaged",
                     "hipExtMallocWithFlags", "hipMemcpy", "hipMemcpyPeer", "hipMemset",
                     "hipMemsetD8", "hipMemsetD16", "hipMemsetD32", "hipDeviceSynchronize",
                     "hipEventQuery"})
#: calls that wait for every stream of the device (so for a capturing one too)
_DEVICE_WIDE = frozenset({"hipDeviceSynchronize", "hipFree"})
_ids = iter(range(1, 1 << 62))


class GraphAlloc:
    """The memory of one allocation node: its address is reserved when captured and stays the
    graph's until the graph and every executable graph made from it are destroyed; ``live``
    between a launch's allocation and the free (a free node, or hipFreeAsync / hipFree)."""

    __slots__ = ("ptr", "size", "block", "device", "live", "owners")

    def __init__(self, ptr: int, size: int, block: int, device: int) -> None:
        self.ptr, self.size, self.block, self.device = ptr, size, block, device
        self.live = False
        self.owners = 1   # the graph being captured, then the graph and its executables

    def reclaim(self, emu: EmulatorCore) -> None:
        """Give the address back once no graph owns it and it is not allocated (lock held)."""
        if self.owners <= 0 and not self.live and self.block:
            emu._heap.free(self.ptr)
            emu._commit(False, self.device, -self.block)
            self.block = 0


class Capture:
    """One capture sequence: its origin stream, the streams joined to it, its nodes."""

    __slots__ = ("id", "mode", "thread", "origin", "streams", "nodes", "status", "allocs",
                 "joined")

    def __init__(self, origin: Stream, mode: int) -> None:
        self.id = next(_ids)
        self.mode = mode
        self.thread = threading.get_ident()
        self.origin = origin
        self.streams: Set[Stream] = {origin}
        self.nodes: List[Tuple[Any, ...]] = []
        self.status = ACTIVE
        self.allocs: Dict[int, GraphAlloc] = {}
        self.joined: Set[Stream] = set()   # forked streams the origin has waited for since


class Graph:
    """A captured graph, or an executable one instantiated from it (the same nodes)."""

    __slots__ = ("nodes", "allocs", "alive")

    def __init__(self, nodes: List[Tuple[Any, ...]], allocs: List[GraphAlloc]) -> None:
        self.nodes, self.allocs = nodes, allocs
        self.alive = True


class CaptureMixin(EmulatorCore):
    """hipStreamBeginCapture, hipStreamEndCapture, hipStreamIsCapturing,
    hipStreamGetCaptureInfo, hipThreadExchangeStreamCaptureMode, hipGraphInstantiate,
    hipGraphLaunch, hipGraphDestroy, hipGraphExecDestroy; the capture gate."""

    _CAPTURE_GATED = frozenset(_QUEUED) | _UNSAFE | {
        "hipStreamIsCapturing", "hipStreamGetCaptureInfo", "hipStreamSynchronize",
        "hipStreamQuery", "hipEventSynchronize"}

    # ---- the gate (a capture is under way) ------------------------------------------------
    def _capture_gate(self, name: str, args: Tuple[Any, ...]) -> Optional[int]:
        with self._lock:
            try:
                return self._gate(name, args)
            except Status as exc:
                return exc.code

    def _gate(self, name: str, args: Tuple[Any, ...]) -> Optional[int]:
        if name in _QUEUED:
            s = self._stream(addr(args[_QUEUED[name]]))
            if s is None:
                return None   # the call's own error
            if s.capture is not None:
                return self._record(name, args, s)
            if name == "hipEventRecord":   # recorded outside any capture from now on
                ev = self._events.get(addr(args[0]))
                if ev is not None:
                    ev.captured = None
            elif name == "hipStreamWaitEvent":
                return self._maybe_join(s, args[1])
            return self._legacy_use(s)
        if name in ("hipStreamSynchronize", "hipStreamQuery", "hipStreamIsCapturing",
                    "hipStreamGetCaptureInfo"):
            s = self._stream(addr(args[0]))
            if s is None:
                return None
            if s.capture is not None and name in ("hipStreamSynchronize", "hipStreamQuery"):
                self._invalidate(s.capture)
                return CAPTURE_UNSUPPORTED
            status = self._legacy_use(s)
            if status is not None or name in ("hipStreamIsCapturing", "hipStreamGetCaptureInfo"):
                return status
        elif name in ("hipEventSynchronize", "hipEventQuery"):
            ev = self._events.get(addr(args[0]))
            if ev is not None and ev.captured is not None and ev.captured.status == ACTIVE:
                self._invalidate(ev.captured)
                return CAPTURED_EVENT
        if name in _DEVICE_WIDE:
            device = self._tls.device
            if any(c.origin.device == device for c in self._captures.values()):
                return CAPTURE_UNSUPPORTED   # it would wait for a capturing stream
        if name in _UNSAFE and (name != "hipEventQuery" or self.version >= (7, 0, 0)) \
                and self._prohibited():
            return CAPTURE_UNSUPPORTED
        return None

    def _prohibited(self) -> bool:
        """Whether the calling thread may not make a potentially unsafe call now: in Global
        mode while this thread captures (not Relaxed) or any thread captures in Global mode;
        in ThreadLocal mode only for this thread's own captures; never in Relaxed mode."""
        mode = self._tls.capture_mode
        if mode == RELAXED:
            return False
        me = threading.get_ident()
        for c in self._captures.values():
            if c.status != ACTIVE:
                continue
            if c.thread == me and c.mode != RELAXED:
                return True
            if mode == GLOBAL and c.mode == GLOBAL:
                return True
        return False

    def _legacy_use(self, s: Stream) -> Optional[int]:
        """The legacy null stream synchronizes with every blocking stream of its device: used
        while one of them captures, it invalidates that capture (CaptureImplicit)."""
        if s.handle not in (0, 1):
            return None
        hit = [c for c in self._captures.values() if c.status == ACTIVE and any(
            t.device == s.device and not t.flags & 1 for t in c.streams)]
        for c in hit:
            self._invalidate(c)
        return CAPTURE_IMPLICIT if hit else None

    def _invalidate(self, capture: Capture) -> None:
        capture.status = INVALIDATED

    def _maybe_join(self, s: Stream, event: Any) -> Optional[int]:
        """A stream outside any capture waits for an event: recorded in a capture under way,
        the stream joins that capture."""
        ev = self._events.get(addr(event))
        if ev is None or ev.captured is None or ev.captured.status == ENDED:
            return self._legacy_use(s)
        capture = ev.captured
        if capture.status != ACTIVE:
            return CAPTURE_INVALIDATED
        if s.handle in SPECIAL_HANDLES:   # the legacy and null streams cannot be captured
            self._invalidate(capture)
            return CAPTURE_IMPLICIT if s.handle in (0, 1) else CAPTURE_UNSUPPORTED
        s.capture = capture
        s.tail = 0   # no captured work of its own yet
        capture.streams.add(s)
        return 0

    def _record(self, name: str, args: Tuple[Any, ...], s: Stream) -> int:
        """Work queued on the capturing stream ``s``: a node, not run."""
        capture = s.capture
        if capture.status != ACTIVE:
            return CAPTURE_INVALIDATED
        if name == "hipEventRecord":
            ev = self._events.get(addr(args[0]))
            if ev is None:
                raise Status(INVALID_HANDLE)
            ev.captured, ev.captured_on, ev.captured_at = capture, s, s.tail
            ev.recorded = True
            capture.nodes.append(("hipEventRecord", args, 1))
            return 0
        if name == "hipStreamWaitEvent":
            ev = self._events.get(addr(args[1]))
            if ev is None:
                raise Status(INVALID_HANDLE)
            if ev.captured is not None and ev.captured is not capture \
                    and ev.captured.status == ACTIVE:
                self._invalidate(capture)
                return CAPTURE_MERGE
            on = ev.captured_on
            if ev.captured is capture and on is not None and on is not s:
                s.tail = max(s.tail, ev.captured_at)   # s now follows on's work so far
                if s is capture.origin and ev.captured_at >= on.tail:
                    capture.joined.add(on)
            return 0   # an event recorded outside the capture: satisfied, adds nothing
        if name in ("hipMallocAsync", "hipMallocFromPoolAsync"):
            return self._alloc_node(args, s, capture, name == "hipMallocFromPoolAsync")
        if name == "hipFreeAsync":
            ptr = addr(args[0])
            found = capture.allocs.get(ptr)
            if found is None:   # another graph's allocation, allocated by a launch
                alloc = self._allocs.get(ptr)
                found = alloc.graph if alloc is not None and alloc.kind == GRAPH else None
            if found is not None:
                capture.nodes.append(("free", found))
            elif ptr or self.version < (7, 0, 0):
                # a free node frees only graph memory (CUDA's rule for cudaFreeAsync in a
                # capture and cudaGraphAddMemFreeNode)
                raise Status(INVALID_VALUE)
            self._captured_work(s)
            return 0
        capture.nodes.append((name, args, _QUEUED[name]))
        self._captured_work(s)
        return 0

    def _captured_work(self, s: Stream) -> None:
        capture = s.capture
        s.tail = len(capture.nodes)
        capture.joined.discard(s)   # (the origin must wait for its new work again)

    def _alloc_node(self, args: Tuple[Any, ...], s: Stream, capture: Capture,
                    from_pool: bool) -> int:
        target = out(args[0], c_void_p)
        nbytes = u64(args[1])
        if from_pool:
            pool = self._pools.get(addr(args[2]))
            if pool is None or pool.imported:
                raise Status(INVALID_VALUE)
        if not nbytes:
            target.value = None
            return 0
        block = round_up(nbytes)
        if block > self._room(False, s.device):
            target.value = None
            raise Status(OUT_OF_MEMORY)
        ptr = self._heap.alloc(block)
        if not ptr:
            target.value = None
            raise Status(OUT_OF_MEMORY)
        self._commit(False, s.device, block)
        found = capture.allocs[ptr] = GraphAlloc(ptr, nbytes, block, s.device)
        capture.nodes.append(("alloc", found))
        self._captured_work(s)
        target.value = ptr
        return 0

    # ---- HIP functions --------------------------------------------------------------------
    def hipStreamBeginCapture(self, stream: Any, mode: Any) -> None:
        """hipStreamBeginCapture(hipStream_t, hipStreamCaptureMode): not on the null, legacy
        or per-thread stream here; a stream already capturing is an illegal state."""
        m = i32(mode)
        with self._lock:
            s = self._stream_or(addr(stream))
            if m not in (GLOBAL, THREAD_LOCAL, RELAXED):
                raise Status(INVALID_VALUE)
            if s.handle in SPECIAL_HANDLES:
                raise Status(CAPTURE_UNSUPPORTED)
            if s.capture is not None:
                raise Status(ILLEGAL_STATE)
            capture = Capture(s, m)
            s.capture = capture
            s.tail = 0
            self._captures[capture.id] = capture

    def hipStreamEndCapture(self, stream: Any, graph: Any) -> None:
        """hipStreamEndCapture(hipStream_t, hipGraph_t*): the graph of the capture begun on
        this stream; every stream leaves the capture, also when it fails."""
        target = out(graph, c_void_p)
        with self._lock:
            s = self._stream_or(addr(stream))
            capture = s.capture
            if capture is None:
                raise Status(ILLEGAL_STATE)
            if capture.origin is not s:
                raise Status(CAPTURE_UNMATCHED)
            if capture.mode != RELAXED and capture.thread != threading.get_ident():
                raise Status(CAPTURE_WRONG_THREAD)
            for t in capture.streams:
                t.capture = None
            del self._captures[capture.id]
            target.value = None
            forked = [t for t in capture.streams
                      if t is not s and t.tail and t not in capture.joined]
            failed = (CAPTURE_INVALIDATED if capture.status != ACTIVE
                      else CAPTURE_UNJOINED if forked else 0)
            capture.status = ENDED
            if failed:
                for found in capture.allocs.values():
                    found.owners = 0
                    found.reclaim(self)
                raise Status(failed)
            handle = self._new_handle()
            self._graphs[handle] = Graph(capture.nodes, list(capture.allocs.values()))
            target.value = handle

    def hipStreamIsCapturing(self, stream: Any, status: Any) -> None:
        """hipStreamIsCapturing(hipStream_t, hipStreamCaptureStatus*)."""
        target = out(status, c_int)
        with self._lock:
            capture = self._stream_or(addr(stream)).capture
            target.value = 0 if capture is None else capture.status

    def hipStreamGetCaptureInfo(self, stream: Any, status: Any, ident: Any) -> None:
        """hipStreamGetCaptureInfo(hipStream_t, hipStreamCaptureStatus*, unsigned long long*):
        the id (may be NULL) is set while the stream takes part in a capture."""
        target = out(status, c_int)
        with self._lock:
            capture = self._stream_or(addr(stream)).capture
            target.value = 0 if capture is None else capture.status
            if ident is not None and capture is not None:
                out(ident, c_ulonglong).value = capture.id

    def hipThreadExchangeStreamCaptureMode(self, mode: Any) -> None:
        """hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode*): the calling thread's
        mode becomes ``*mode``, and ``*mode`` the mode it had."""
        cell = out(mode, c_int)
        if cell.value not in (GLOBAL, THREAD_LOCAL, RELAXED):
            raise Status(INVALID_VALUE)
        tls = self._tls
        tls.capture_mode, cell.value = cell.value, tls.capture_mode

    def hipGraphInstantiate(self, graph_exec: Any, graph: Any, error_node: Any, log: Any,
                            size: Any) -> None:
        """hipGraphInstantiate(hipGraphExec_t*, hipGraph_t, hipGraphNode_t*, char*, size_t):
        an executable graph of the same nodes (the error node and log are left alone)."""
        target = out(graph_exec, c_void_p)
        with self._lock:
            g = self._graphs.get(addr(graph))
            if g is None:
                raise Status(INVALID_VALUE)
            for found in g.allocs:
                found.owners += 1
            handle = self._new_handle()
            self._execs[handle] = Graph(g.nodes, g.allocs)
            target.value = handle

    def hipGraphLaunch(self, graph_exec: Any, stream: Any) -> None:
        """hipGraphLaunch(hipGraphExec_t, hipStream_t): the nodes run in capture order on
        ``stream``.  A graph whose allocation from an earlier launch was not freed yet cannot
        be launched (hipErrorInvalidValue, nothing run)."""
        with self._lock:
            g = self._execs.get(addr(graph_exec))
            if g is None:
                raise Status(INVALID_VALUE)
            self._stream_or(addr(stream))
            if any(found.live for found in g.allocs):
                raise Status(INVALID_VALUE)
            nodes = list(g.nodes)
        handle = addr(stream)
        for node in nodes:
            kind = node[0]
            if kind == "alloc":
                found = node[1]
                with self._lock:
                    found.live = True
                    self._register(Alloc(found.ptr, found.size, found.block, found.device,
                                         GRAPH, graph=found))
            elif kind == "free":
                with self._lock:
                    alloc = self._allocs.get(node[1].ptr)
                    if alloc is None or alloc.kind != GRAPH:
                        raise Status(INVALID_VALUE)
                    self._release_alloc(alloc)
            else:
                name, args, at = node
                replay = list(args)
                replay[at] = handle
                getattr(self, name)(*replay)

    def hipGraphDestroy(self, graph: Any) -> None:
        """hipGraphDestroy(hipGraph_t)."""
        self._drop(self._graphs, graph)

    def hipGraphExecDestroy(self, graph_exec: Any) -> None:
        """hipGraphExecDestroy(hipGraphExec_t)."""
        self._drop(self._execs, graph_exec)

    def _drop(self, table: Dict[int, Graph], handle: Any) -> None:
        with self._lock:
            g = table.pop(addr(handle), None)
            if g is None:
                raise Status(INVALID_VALUE)
            for found in g.allocs:
                found.owners -= 1
                found.reclaim(self)

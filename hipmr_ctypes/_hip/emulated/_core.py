"""State of the emulated HIP runtime: devices, the allocation table, handles, faults, last error.

The HIP functions themselves live in four parts that each build on :class:`EmulatorCore` alone
(``_pools``, ``_memory``, ``_streams``, ``_devices``) and call one another only through what
this module holds: the state and the helpers they share.
Every piece of mutable state is guarded by the one ``EmulatorCore._lock``.
"""
from __future__ import annotations

import bisect
import ctypes
import threading
import sys
import weakref
from typing import (Any, Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Set,
                    Tuple, Union)

from ..._locks import AbandonedLockError, DeferringLock
from ..decls import DECL_BY_NAME, DECLS
from ..exceptions import ERROR_NAMES
from ..native import memalign_and_free
from ..runtime import Functions, missing_function
from ._args import Status, addr, raise_own_error
from ._shared import SharedArena
from ._vspace import VirtualSpace, release_unless_exiting

__all__ = ["EmulatorCore", "EmulatorConfig", "LiveAllocations", "HostHeap", "Alloc", "Pool",
           "Stream", "Event", "Device"]

# HIP statuses used by the emulation (errors.ERROR_NAMES has them all)
SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
DEINITIALIZED = 4
INVALID_MEMCPY_DIRECTION = 21
NO_DEVICE = 100
INVALID_DEVICE = 101
INVALID_HANDLE = 400
NOT_READY = 600
PEER_ACCESS_ALREADY_ENABLED = 704
PEER_ACCESS_NOT_ENABLED = 705
HOST_MEMORY_ALREADY_REGISTERED = 712
HOST_MEMORY_NOT_REGISTERED = 713

ALIGNMENT = 256                      # of every allocation; sizes are accounted rounded up to it
HANDLE_BASE = 0x7E5A_0000_0000       # stream / event / pool handles: HANDLE_BASE + n * HANDLE_STEP
HANDLE_STEP = 0x40
SPECIAL_HANDLES = (0, 1, 2)          # null stream, hipStreamLegacy, hipStreamPerThread
MIN_HOST_ADDRESS = 0x10000           # host pointers below this (Linux mmap_min_addr) are invalid

# memory kinds
DEVICE = "device"
PINNED = "pinned"
MANAGED = "managed"
REGISTERED = "registered"            # host memory of the caller's, pinned by hipHostRegister
GRAPH = "graph"                      # device memory of a graph's allocation node (``_capture``)

# Calls that fail when there are no devices (everything but versions and error queries)
NO_DEVICE_OK = frozenset({"hipRuntimeGetVersion", "hipDriverGetVersion", "hipGetErrorName",
                          "hipGetErrorString", "hipGetLastError", "hipPeekAtLastError",
                          "hipExtGetLastError", "hipGetDeviceCount"})
# Calls a fault injected with calls=None applies to
DEFAULT_FAULT_CALLS = frozenset({
    "hipMalloc", "hipMallocAsync", "hipMallocFromPoolAsync", "hipHostMalloc", "hipMallocManaged",
    "hipMemPoolCreate", "hipStreamCreateWithPriority", "hipEventCreateWithFlags", "hipMemcpy",
    "hipMemcpyAsync"})
# Calls that neither set nor are subject to the last error / fault machinery
_ERROR_QUERIES = frozenset({"hipGetErrorName", "hipGetErrorString", "hipGetLastError",
                            "hipPeekAtLastError", "hipExtGetLastError"})

_ERROR_STRINGS = {
    0: "no error", 1: "invalid argument", 2: "out of memory", 3: "initialization error",
    17: "invalid device pointer", 21: "invalid copy direction for memcpy",
    100: "no ROCm-capable device is detected", 101: "invalid device ordinal",
    400: "invalid resource handle", 600: "device not ready",
    704: "peer access is already enabled", 705: "peer access has not been enabled",
    712: "part or all of the requested memory range is already mapped",
    713: "pointer does not correspond to a registered memory region",
    801: "operation not supported", 999: "unknown error",
}


def round_up(size: int) -> int:
    """``size`` rounded up to the allocation granularity (256 bytes)."""
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def error_name(code: int) -> str:
    """The HIP name of ``code`` (``hipErrorUnknown`` for codes HIP does not define)."""
    return ERROR_NAMES.get(code, "hipErrorUnknown")


def error_string(code: int) -> str:
    """The message of ``code``, in the style of recent ROCm (CUDA-like text)."""
    return _ERROR_STRINGS.get(code) or error_name(code)


class EmulatorConfig(NamedTuple):
    """What an emulator emulates (see ``config_from_env`` for the environment variables)."""
    devices: int = 1
    memory: int = 1 << 30
    host_memory: int = 64 << 30
    version: Tuple[int, int, int] = (6, 2, 0)
    missing: FrozenSet[str] = frozenset()
    apu: bool = False   # devices integrated with pageable memory access (an MI300A-class APU)


class LiveAllocations(NamedTuple):
    """Live emulated allocations (device, pool, pinned and managed): count and requested bytes."""
    count: int  # type: ignore[assignment]  # a field named like tuple.count
    bytes: int


# ------------------------------------------------------------------------------------------------
# host memory
class HostHeap:
    """256-byte aligned blocks from libc (``posix_memalign`` / ``free``).

    It frees only pointers it handed out itself, so no argument can make it free a foreign
    pointer.  Where libc lacks ``posix_memalign`` it falls back to ctypes buffers.
    """

    def __init__(self) -> None:
        self._outstanding: Dict[int, object] = {}   # ptr -> ctypes buffer (fallback) or None
        self._memalign = self._libc_free = None
        found = memalign_and_free()
        if found is not None:
            self._memalign, self._libc_free = found

    def alloc(self, nbytes: int) -> int:
        """A new block of ``nbytes`` (> 0); 0 when the host cannot provide it."""
        if self._memalign is not None:
            out = ctypes.c_void_p()
            try:
                if self._memalign(ctypes.byref(out), ALIGNMENT, nbytes) != 0 or not out.value:
                    return 0
            except (ctypes.ArgumentError, OverflowError) as exc:
                raise_own_error(exc)       # the interpreter's own error is no lack of memory
                return 0
            self._outstanding[out.value] = None
            return out.value
        try:
            buf = (ctypes.c_char * (nbytes + ALIGNMENT))()
        except (MemoryError, OverflowError, ValueError):
            return 0
        ptr = (ctypes.addressof(buf) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self._outstanding[ptr] = buf
        return ptr

    def free(self, ptr: int) -> None:
        """Give back a block from :meth:`alloc`; anything else is ignored."""
        if ptr not in self._outstanding:
            return
        self._outstanding.pop(ptr)
        if self._libc_free is not None:
            self._libc_free(ptr)

    def release_all(self) -> None:
        """Free every outstanding block (emulator reset or garbage collection)."""
        for ptr in list(self._outstanding):
            self.free(ptr)


def _release_unless_exiting(heap: HostHeap,
                            exiting: Callable[[], bool] = sys.is_finalizing) -> None:
    """The emulator's finalizer: its host memory back to libc, unless the interpreter is
    exiting (``exiting`` bound now: module globals may be gone by then)."""
    if not exiting():
        heap.release_all()


# ------------------------------------------------------------------------------------------------
# records
class Alloc:
    """One live allocation: requested ``size``, accounted ``block`` (rounded), owner and kind."""
    __slots__ = ("ptr", "size", "block", "device", "kind", "flags", "pool", "graph")

    def __init__(self, ptr: int, size: int, block: int, device: int, kind: str, flags: int = 0,
                 pool: Optional["Pool"] = None, graph: Any = None) -> None:
        self.ptr, self.size, self.block = ptr, size, block
        self.device, self.kind, self.flags, self.pool = device, kind, flags, pool
        self.graph = graph   # kind GRAPH: the graph allocation (``_capture.GraphAlloc``)


class Pool:
    """A stream-ordered memory pool: reserved blocks, either in use or cached for reuse."""
    __slots__ = ("handle", "device", "is_default", "handle_types", "max_size", "threshold",
                 "reuse", "used", "used_high", "reserved", "reserved_high", "cache", "live",
                 "access", "alive", "arena", "imported", "shared", "freed_on", "host")

    def __init__(self, handle: int, device: int, is_default: bool, handle_types: int = 0,
                 max_size: int = 0) -> None:
        self.handle, self.device, self.is_default = handle, device, is_default
        self.handle_types, self.max_size = handle_types, max_size
        self.threshold = 0
        self.reuse = [1, 1, 1]     # hipMemPoolReuse* attributes 1..3 (all enabled, as on AMD)
        self.used = self.used_high = self.reserved = self.reserved_high = 0
        self.cache: List[Tuple[int, int]] = []   # (block size, ptr) of freed blocks
        self.freed_on: Dict[int, int] = {}       # ptr of a cached block -> the stream of its
                                                 # hipFreeAsync (none: freed synchronously)
        self.live = 0                            # allocations in use
        self.access: Dict[int, int] = {}         # peer device -> hipMemAccessFlags
        self.alive = True
        self.arena: Optional[SharedArena] = None  # shared memory of an IPC-enabled pool
        self.imported = False                    # mapped from another process's pool
        self.shared = False                      # exported to a shareable handle once
        self.host = False                        # located on the host (pinned host memory):
                                                 # its blocks count against the host's memory


class Stream:
    """A stream (created, or one of a device's null / legacy / per-thread streams)."""
    __slots__ = ("handle", "device", "flags", "priority", "sid", "busy", "epoch", "alive",
                 "capture", "tail")

    def __init__(self, handle: int, device: int, flags: int, priority: int, sid: int) -> None:
        self.handle, self.device, self.flags, self.priority, self.sid = (
            handle, device, flags, priority, sid)
        self.busy = 0     # the next `busy` queries report hipErrorNotReady (set_stream_busy)
        self.epoch = 0    # bumped by set_stream_busy: events recorded before stay complete
        self.alive = True
        self.capture: Any = None   # the capture (``_capture.Capture``) it takes part in
        self.tail = 0     # in a capture: the number of nodes when it last captured work


class Event:
    """An event: recorded time stamp and the stream work it waits for."""
    __slots__ = ("handle", "device", "flags", "recorded", "stamp", "stream", "epoch", "ipc",
                 "captured", "captured_on", "captured_at")

    def __init__(self, handle: int, device: int, flags: int) -> None:
        self.handle, self.device, self.flags = handle, device, flags
        self.recorded = False
        self.stamp = 0.0
        self.stream: Optional[Stream] = None   # set when recorded on a busy stream
        self.epoch = 0
        self.ipc: Any = None   # the state shared with other processes (``_ipc``), if any
        self.captured: Any = None       # last recorded in this capture (``_capture``)
        self.captured_on: Optional[Stream] = None   # ... on this stream
        self.captured_at = 0                        # ... after this many nodes

    def pending(self) -> bool:
        """True while the stream work this event was recorded after is 'still running'."""
        s = self.stream
        return s is not None and s.alive and s.epoch == self.epoch and s.busy > 0


class Device:
    """One emulated device: capacity, committed bytes, memory pools, special streams."""
    __slots__ = ("ordinal", "capacity", "committed", "default_pool", "current_pool", "peers",
                 "special")

    def __init__(self, ordinal: int, capacity: int) -> None:
        self.ordinal, self.capacity = ordinal, capacity
        self.committed = 0     # hipMalloc + managed bytes + every pool's reserved bytes
        self.default_pool: Pool
        self.current_pool: Pool
        self.peers: Set[int] = set()
        self.special: Dict[int, Stream] = {}


class _Fault:
    __slots__ = ("code", "remaining", "calls")

    def __init__(self, code: int, remaining: int, calls: FrozenSet[str]) -> None:
        self.code, self.remaining, self.calls = code, remaining, calls


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.device = 0
        self.last_error = SUCCESS      # what hipGetLastError / hipPeekAtLastError report
        self.last_command = SUCCESS    # what hipExtGetLastError reports
        self.capture_mode = 0          # hipThreadExchangeStreamCaptureMode's (Global)


# ------------------------------------------------------------------------------------------------
class _Reentered(Exception):
    """The emulator's lock was asked for again by the thread that holds it."""


class _StateLock(DeferringLock):
    """The emulator's one lock.  The garbage collector can run a finalizer (which frees memory
    or destroys a pool through the emulator) at any allocation, also while this thread is
    inside the emulator holding the lock: entering again raises :class:`_Reentered`, and the
    call wrapper defers that call until the outer call lets go of the lock."""

    __slots__ = ()

    def __enter__(self) -> "_StateLock":
        if self.held_here():
            raise _Reentered
        self.acquire()
        return self


class EmulatorCore:
    """Shared state and the test-facing API of the emulated runtime."""

    #: the calls a capture under way looks at first (``_capture.CaptureMixin._capture_gate``)
    _CAPTURE_GATED: FrozenSet[str] = frozenset()

    def _capture_gate(self, name: str, args: Tuple[Any, ...]) -> Optional[int]:
        """While a capture is under way: the status of call ``name`` if the capture decides
        it (captured, or refused), None to run it as usual (``_capture`` overrides this)."""
        return None

    def __init__(self, config: Optional[EmulatorConfig] = None) -> None:
        config = EmulatorConfig() if config is None else config
        self.config = config
        self.version: Tuple[int, int, int] = config.version
        self.version_number: int = (config.version[0] * 10_000_000 + config.version[1] * 100_000
                                    + config.version[2])
        self._sticky_errors = config.version >= (7, 0, 0)
        self._lock = _StateLock()
        self._tls = _ThreadState()
        self._heap = HostHeap()
        # memory goes back to libc when the emulator is collected, never while the interpreter
        # exits (the OS takes it back then, and a daemon thread may still be using it: the
        # emulator can be collected during the teardown of modules, after the exit hooks)
        self._finalizer = weakref.finalize(self, _release_unless_exiting, self._heap)
        setattr(self._finalizer, "atexit", False)  # (Python 3.9's typeshed has no .atexit)
        self._vspace = VirtualSpace()   # virtual memory: reservations and physical memory
        self._vspace_finalizer = weakref.finalize(self, release_unless_exiting, self._vspace)
        setattr(self._vspace_finalizer, "atexit", False)
        self._handle_seq = 0
        self._allocs: Dict[int, Alloc] = {}
        self._bases: List[int] = []        # sorted keys of _allocs, for interior-pointer lookups
        self._host_committed = 0
        self._pools: Dict[int, Pool] = {}
        self._streams: Dict[int, Stream] = {}
        # handles of destroyed streams (never reused here), and every call that got one: on
        # CUDA some of those calls crash the process (hipStreamGetDevice), so tests assert
        # that the package never makes them for the streams it owns
        self._destroyed_streams: Set[int] = set()
        self.destroyed_stream_calls: List[Tuple[str, int]] = []
        self._events: Dict[int, Event] = {}
        self._ipc_events: Dict[int, Event] = {}   # events shared with other processes
        self._faults: List[_Fault] = []
        # stream capture (``_capture``): the captures under way, graphs, executable graphs
        self._captures: Dict[int, Any] = {}
        self._graphs: Dict[int, Any] = {}
        self._execs: Dict[int, Any] = {}
        self._devices: List[Device] = []
        for ordinal in range(config.devices):
            dev = Device(ordinal, config.memory)
            pool = Pool(self._new_handle(), ordinal, True)
            self._pools[pool.handle] = pool
            dev.default_pool = dev.current_pool = pool
            self._make_special_streams(dev)
            self._devices.append(dev)

    # ---- test API -------------------------------------------------------------------------
    def capacity(self, device: int = 0) -> int:
        """The memory capacity of ``device`` in bytes (``HIPMR_EMULATED_MEMORY``)."""
        return self._devices[device].capacity

    @property
    def device_count(self) -> int:
        """Number of emulated devices (``HIPMR_EMULATED_DEVICES``)."""
        return len(self._devices)

    def live_allocations(self) -> LiveAllocations:
        """Count and requested bytes of all live allocations (device, pool, pinned, managed)."""
        with self._lock:
            return LiveAllocations(len(self._allocs), sum(a.size for a in self._allocs.values()))

    def inject_failure(self, code: int = OUT_OF_MEMORY, count: int = 1,
                       calls: Union[None, str, Iterable[str]] = None) -> None:
        """Make the next ``count`` calls return ``code`` without touching any state.

        ``calls`` names the HIP functions concerned (a name or several); by default the
        allocating and copying calls (``DEFAULT_FAULT_CALLS``).  Faults add up: each pending one
        applies in the order injected.
        """
        if isinstance(code, bool) or not isinstance(code, int) or code == 0:
            raise ValueError(f"code must be a non-zero HIP status, not {code!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive int, not {count!r}")
        names = DEFAULT_FAULT_CALLS if calls is None else (
            frozenset([calls]) if isinstance(calls, str) else frozenset(calls))
        unknown = sorted(n for n in names if n not in DECL_BY_NAME or n in _ERROR_QUERIES)
        if unknown or not names:
            raise ValueError(f"cannot inject failures into {unknown or 'no calls'}")
        with self._lock:
            self._faults.append(_Fault(code, count, names))

    def clear_faults(self) -> None:
        """Forget every pending injected failure."""
        with self._lock:
            self._faults.clear()

    def pending_faults(self) -> int:
        """How many injected failures have not fired yet."""
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def set_stream_busy(self, stream: Union[int, None, ctypes.c_void_p], count: int) -> None:
        """Make the next ``count`` hipStreamQuery / hipEventQuery calls on ``stream`` not ready.

        Events recorded on it from now on stay pending while it is busy.  hipStreamSynchronize,
        hipDeviceSynchronize, hipEventSynchronize of such an event and hipFree clear it.
        ``0``, ``1`` and ``2`` name the calling thread's current device's special streams.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, not {count!r}")
        with self._lock:
            s = self._stream(addr(stream)) if self._devices else None
            if s is None:
                raise ValueError(f"unknown stream {stream!r}")
            s.busy = count
            s.epoch += 1
            self._publish_ipc_locked()

    def reset(self) -> None:
        """Free everything and return to the state of a new emulator.

        Default pool handles survive (with default attributes); every other stream, event and
        pool handle becomes invalid; each thread's current device becomes 0 and its last error
        success; pending faults are dropped.
        """
        with self._lock:
            self._heap.release_all()
            self._vspace.release_all()
            self._allocs.clear()
            self._bases.clear()
            self._host_committed = 0
            for pool in self._pools.values():
                pool.alive = False
                if pool.arena is not None:
                    pool.arena.close()
            for s in self._streams.values():
                s.alive = False
            self._destroyed_streams.update(self._streams)
            self._pools.clear()
            self._streams.clear()
            for ev in self._ipc_events.values():
                ev.ipc.close()
            self._ipc_events.clear()
            self._events.clear()
            self._faults.clear()
            self._captures.clear()
            self._graphs.clear()
            self._execs.clear()
            for dev in self._devices:
                handle = dev.default_pool.handle
                pool = Pool(handle, dev.ordinal, True)
                self._pools[handle] = pool
                dev.default_pool = dev.current_pool = pool
                dev.committed = 0
                dev.peers.clear()
                for s in dev.special.values():
                    s.alive = False
                self._make_special_streams(dev)
            self._tls = _ThreadState()

    # ---- binding --------------------------------------------------------------------------
    def functions(self) -> Functions:
        """The function table: one callable per row of ``decls.DECLS``."""
        fn = Functions()
        for decl in DECLS:
            if decl.name in self.config.missing:
                setattr(fn, decl.name, missing_function(decl.name, "the emulated runtime"))
                continue
            impl = getattr(self, decl.name)
            wrapped = impl if decl.name in _ERROR_QUERIES else self._wrap(decl.name, impl)
            setattr(fn, decl.name, wrapped)
        return fn

    def _wrap(self, name: str, impl: Callable[..., Optional[int]]) -> Callable[..., int]:
        """The C-level function: faults, no-device check, argument errors, last error."""
        emu = self
        needs_device = name not in NO_DEVICE_OK
        gated = self._CAPTURE_GATED

        def call(*args: Any) -> int:
            try:
                if emu._faults:
                    status = emu._take_fault(name)
                    if status:
                        emu._note(status)
                        return status
                if needs_device and not emu._devices:
                    status = NO_DEVICE
                elif emu._captures and name in gated:   # a capture is under way
                    decided = emu._capture_gate(name, args)
                    status = impl(*args) or SUCCESS if decided is None else decided
                else:
                    status = impl(*args) or SUCCESS
            except _Reentered:
                # called by a finalizer that the garbage collector ran while this thread
                # was inside the emulator: run it once the outer call lets go (a finalizer
                # ignores the status; the real runtime cannot be re-entered like this)
                emu._lock.defer(impl, *args)
                return SUCCESS
            except Status as exc:
                status = exc.code
            except (TypeError, ValueError, OverflowError, ctypes.ArgumentError) as exc:
                raise_own_error(exc)       # the emulator's own Python errors stay Python's
                status = INVALID_VALUE
            except AbandonedLockError:
                # the interpreter is finalizing and a thread it stopped holds the lock (in
                # the middle of an update): what a real runtime answers once it is torn down
                status = DEINITIALIZED
            if emu._ipc_events:
                emu._publish_ipc_events()
            emu._note(status)
            return status

        call.__name__ = call.__qualname__ = name
        call.__doc__ = impl.__doc__
        return call

    def _publish_ipc_events(self) -> None:
        """After every call while events are shared with other processes: an interprocess
        event this process recorded, whose work has completed since, says so to the others
        (the device's write of the event's shared signal)."""
        if self._lock.held_here():   # a deferred finalizer: the outer call publishes
            return
        with self._lock:
            self._publish_ipc_locked()

    def _publish_ipc_locked(self) -> None:
        for ev in self._ipc_events.values():
            if ev.stream is not None and not ev.pending():
                ev.stream = None
                ev.ipc.set_pending(False)

    def _take_fault(self, name: str) -> int:
        with self._lock:
            for fault in self._faults:
                if name in fault.calls:
                    fault.remaining -= 1
                    if not fault.remaining:
                        self._faults.remove(fault)
                    return fault.code
        return SUCCESS

    def _note(self, status: int) -> None:
        """Record ``status`` as the thread's last result (HIP 6 and HIP 7 rules)."""
        tls = self._tls
        tls.last_command = status
        if not self._sticky_errors:
            tls.last_error = status           # HIP < 7: the result of the last call
        elif status and status != NOT_READY:
            tls.last_error = status           # HIP >= 7: the last real error, like CUDA

    # ---- shared helpers (call with the lock held unless stated) ---------------------------
    def _new_handle(self) -> int:
        self._handle_seq += 1
        return HANDLE_BASE + self._handle_seq * HANDLE_STEP

    def _make_special_streams(self, dev: Device) -> None:
        for handle in SPECIAL_HANDLES:
            dev.special[handle] = Stream(handle, dev.ordinal, 0, 0, self._new_handle())

    def _device(self, ordinal: int, code: int = INVALID_DEVICE) -> Device:
        """The device ``ordinal`` (lock not needed: the device list never changes)."""
        if 0 <= ordinal < len(self._devices):
            return self._devices[ordinal]
        raise Status(code)

    def _current(self) -> Device:
        return self._devices[self._tls.device]

    def _stream(self, handle: int) -> Optional[Stream]:
        """The stream ``handle`` names for the calling thread, or None."""
        if handle in SPECIAL_HANDLES:
            return self._current().special[handle]
        return self._streams.get(handle)

    def _stream_or(self, handle: int, code: int = INVALID_HANDLE) -> Stream:
        s = self._stream(handle)
        if s is None:
            if handle in self._destroyed_streams:
                self.destroyed_stream_calls.append((sys._getframe(1).f_code.co_name, handle))
            raise Status(code)
        return s

    def _register(self, alloc: Alloc) -> None:
        stale = self._allocs.get(alloc.ptr)
        if stale is not None:
            # only a registration can be there: caller memory (hipHostRegister) that was
            # freed while still registered, now handed out again; the table keeps one entry
            # per address, and each base once
            self._unregister(stale)
        self._allocs[alloc.ptr] = alloc
        bisect.insort(self._bases, alloc.ptr)

    def _unregister(self, alloc: Alloc) -> None:
        if self._allocs.get(alloc.ptr) is not alloc:   # already gone (a stale registration)
            return
        # the base goes first and the entry after it (_register adds them the other way
        # round): a lookup that runs without the lock (a copy's range check) and finds a
        # base always finds its entry
        i = bisect.bisect_left(self._bases, alloc.ptr)
        if i < len(self._bases) and self._bases[i] == alloc.ptr:
            del self._bases[i]
        del self._allocs[alloc.ptr]

    def _find(self, ptr: int) -> Optional[Alloc]:
        """The live allocation containing address ``ptr``, or None.  Safe without the lock:
        a table changed by another thread meanwhile gives an answer of before or after the
        change, never an exception."""
        bases = self._bases
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            try:
                alloc = self._allocs.get(bases[i])
            except IndexError:   # the list shrank under us: the allocation was going
                return None
            if alloc is not None and alloc.ptr <= ptr < alloc.ptr + alloc.size:
                return alloc
        return None

    def _overlaps_allocation(self, ptr: int, nbytes: int) -> bool:
        """True when [ptr, ptr + nbytes) touches any live allocation."""
        if self._find(ptr) is not None:
            return True
        i = bisect.bisect_right(self._bases, ptr)
        return i < len(self._bases) and self._bases[i] < ptr + nbytes

    def _complete_device(self, ordinal: int) -> None:
        """All work queued on device ``ordinal`` is done: no stream of it stays busy."""
        for s in self._devices[ordinal].special.values():
            s.busy = 0
        for s in self._streams.values():
            if s.device == ordinal:
                s.busy = 0

    # ---- giving memory back (lock held): used by pools, plain frees and synchronize points
    def _pool_release(self, pool: Pool, keep: int) -> None:
        """Release cached blocks, largest first, until the pool reserves at most ``keep`` bytes."""
        if pool.reserved <= keep or not pool.cache:
            return
        pool.cache.sort()
        while pool.cache and pool.reserved > keep:
            block, ptr = pool.cache.pop()
            pool.freed_on.pop(ptr, None)
            if pool.arena is not None:
                pool.arena.free(ptr, block)
            else:
                self._heap.free(ptr)
            pool.reserved -= block
            self._commit(pool.host, pool.device, -block)

    def _commit(self, host: bool, device: int, delta: int) -> None:
        """Count ``delta`` bytes against the host's memory or ``device``'s (lock held)."""
        if host:
            self._host_committed += delta
        else:
            self._devices[device].committed += delta

    def _room(self, host: bool, device: int) -> int:
        """Bytes the host's memory or ``device``'s can still commit (lock held)."""
        if host:
            return self.config.host_memory - self._host_committed
        dev = self._devices[device]
        return dev.capacity - dev.committed

    def _release_device_pools(self, ordinal: int, stream: Optional[int] = None) -> None:
        """A synchronize point on device ``ordinal`` (with ``stream``: that stream's): the frees
        it waited for serve any stream from now on, whatever the reuse policies say (CUDA's
        rule for frees known to be done), and pools give back what exceeds their threshold."""
        for pool in self._pools.values():
            if pool.device == ordinal:
                if stream is None:
                    pool.freed_on.clear()
                else:
                    for ptr in [p for p, s in pool.freed_on.items() if s == stream]:
                        del pool.freed_on[ptr]
                self._pool_release(pool, pool.threshold)

    def _release_alloc(self, alloc: Alloc) -> None:
        """Free a live allocation: back to its pool's cache, or to the host."""
        self._unregister(alloc)
        if alloc.kind == REGISTERED:   # the caller's memory: unpinned, never freed
            return
        if alloc.kind == GRAPH:        # freed; the address stays the graph's
            alloc.graph.live = False
            alloc.graph.reclaim(self)
            return
        pool = alloc.pool
        if pool is not None and pool.imported:   # unmapped; the exporter's memory stays
            pool.live -= 1
            if not pool.alive and not pool.live and pool.arena is not None:
                pool.arena.close()
            return
        if pool is not None:
            pool.used -= alloc.block
            pool.live -= 1
            if pool.alive:
                pool.cache.append((alloc.block, alloc.ptr))
                return
            pool.reserved -= alloc.block   # destroyed pool: its last blocks go straight back
            if pool.arena is not None:
                pool.arena.free(alloc.ptr, alloc.block)
                self._commit(pool.host, alloc.device, -alloc.block)
                if not pool.live:
                    pool.arena.close()
                return
        self._heap.free(alloc.ptr)
        if alloc.kind == PINNED:
            self._host_committed -= alloc.block
        else:
            self._devices[alloc.device].committed -= alloc.block

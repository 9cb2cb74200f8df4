"""Test doubles and checks the test suite shares (``from support import ...``: pytest puts
this folder, where ``conftest.py`` is, on ``sys.path``; the test files sit in its subfolders).

* The reference model of the sub-allocators, re-exported from ``scripts/pool_model.py``
  (``scripts/fuzz_pool.py`` runs on it; a script does not import from ``tests/``):
  :class:`AddressSpaceResource` (a user-written async upstream handing out addresses, checking
  how it is used), :class:`StreamModel` (fake events with vector clocks), :class:`FreedRanges`,
  :func:`check_pool_tiles` (a PoolResource's blocks tile its chunks exactly), ``HOST`` and
  ``STREAMS``, and :class:`Corruption` (what they raise).
* :class:`Crash`, :class:`Hang`, :class:`Leak` (and :class:`Corruption`): the failures
  ``scripts/reliability_report.py`` counts by kind (their ``reliability_kind``);
  :func:`no_crash` raises :class:`Crash` for a child process that died of a signal.
* :class:`HostBufferResource`: a user-written synchronous resource over real host memory.
* :func:`recording_events`: fake events that log their calls, in place of the events the
  sub-allocators order streams with.
* :class:`LiveRanges`: live allocations of many threads, checked for overlap.
* :func:`no_native_call`: a block that must make no HIP call and change no allocation.
* :func:`past_deadline`: whether long loops must stop (``scripts/reliability_report.py
  --budget`` sets ``HIPMR_TEST_DEADLINE``).
* ``REPO`` (the repository's root) and ``TESTS`` (this folder), as :class:`pathlib.Path`: the
  test files live in subfolders and take every path from these.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading
import time
from bisect import bisect_left, insort
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from hipmr_ctypes import host_accessible
from hipmr_ctypes._hip.decls import DECLS
from hipmr_ctypes import _stream_order

#: the repository's root and the tests' folder (the test files sit in its subfolders)
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

sys.path.insert(0, str(REPO / "scripts"))
from pool_model import (HOST, STREAMS, AddressSpaceResource, Corruption,  # noqa: E402
                        FreedRanges, StreamModel, check_pool_tiles)

__all__ = ["REPO", "TESTS", "HOST", "STREAMS", "StreamModel", "recording_events", "FreedRanges",
           "AddressSpaceResource", "HostBufferResource", "check_pool_tiles", "LiveRanges",
           "NATIVE", "no_native_call", "past_deadline", "process_runtime", "Crash", "Hang",
           "Leak", "Corruption", "no_crash"]


#: seconds since the epoch at which the long loops of the thread tests stop early (and count
#: what they ran): ``HIPMR_TEST_DEADLINE``, set by ``scripts/reliability_report.py --budget``
#: so that a report sized to its budget still runs every test; unset: no deadline
DEADLINE = float(os.environ.get("HIPMR_TEST_DEADLINE") or "inf")


def past_deadline() -> bool:
    """True once :data:`DEADLINE` has passed (a long loop stops there)."""
    return time.time() > DEADLINE


# --------------------------------------------------------------------------- fake events
def recording_events(setattr_: Any) -> List[Tuple[Any, ...]]:
    """Replace the adaptors' events by fakes that log every call as ``("record", stream)``,
    ``("wait", stream)``, ``("synchronize",)`` or ``("close",)``; ``setattr_(obj, name,
    value)`` does the replacing (pytest's ``monkeypatch.setattr`` undoes it afterwards).
    Returns the log."""
    calls: List[Tuple[Any, ...]] = []

    class RecordingEvent:
        def record(self, stream: Any) -> None:
            calls.append(("record", stream))

        def synchronize(self) -> None:
            calls.append(("synchronize",))

        def close(self) -> None:
            calls.append(("close",))

    setattr_(_stream_order, "event_for", lambda stream, device=None: RecordingEvent())
    setattr_(_stream_order, "device_of", lambda handle: 0)
    setattr_(_stream_order, "wait_event", lambda stream, ev: calls.append(("wait", stream)))
    return calls


# ---------------------------------------------------------------------- test upstreams
class HostBufferResource:
    """A user-written synchronous resource over real host memory (ctypes buffers), with the
    properties it is given.  Each allocation is a fresh buffer, so the bytes can be written
    and read back; outstanding buffers are kept alive in ``live``."""

    def __init__(self, properties: Tuple[type, ...] = (host_accessible,)) -> None:
        self.properties = properties
        self.live: Dict[int, Tuple[Any, int]] = {}

    def allocate(self, bytes: int, alignment: int = 256) -> int:
        if type(bytes) is not int or bytes < 0:
            raise ValueError(f"bytes={bytes!r}")
        if not bytes:
            return 0
        buf = ctypes.create_string_buffer(bytes + alignment)
        ptr = -(-ctypes.addressof(buf) // alignment) * alignment
        self.live[ptr] = (buf, bytes)
        return ptr

    def deallocate(self, ptr: int, bytes: int, alignment: int = 256) -> None:
        if not ptr and not bytes:
            return
        buf, size = self.live.pop(ptr)
        if size != bytes:
            self.live[ptr] = (buf, size)
            raise ValueError(f"size {bytes} != {size}")

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    __hash__ = object.__hash__



# ------------------------------------------------------------------------ thread checks
class LiveRanges:
    """Every live allocation's [start, end) (an empty one counts as one byte), of any number of
    threads, checked for overlap under one lock; ``errors`` lists the overlaps found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: List[int] = []
        self.ends: Dict[int, int] = {}
        self.errors: List[str] = []

    def add(self, ptr: int, size: int) -> None:
        end = ptr + max(size, 1)
        with self.lock:
            i = bisect_left(self.starts, ptr)
            if i < len(self.starts) and self.starts[i] < end:
                self.errors.append(f"{ptr:#x}+{size} overlaps {self.starts[i]:#x}")
            if i and self.ends[self.starts[i - 1]] > ptr:
                self.errors.append(f"{ptr:#x}+{size} overlaps {self.starts[i - 1]:#x}")
            insort(self.starts, ptr)
            self.ends[ptr] = end

    def remove(self, ptr: int) -> None:
        with self.lock:
            del self.starts[bisect_left(self.starts, ptr)]
            del self.ends[ptr]


# ------------------------------------------------------------------------- native calls
#: The error queries, which report and never act: every other function of the table is native
#: work that :func:`no_native_call` forbids.
ERROR_QUERIES = frozenset({"hipGetErrorName", "hipGetErrorString", "hipGetLastError",
                           "hipPeekAtLastError", "hipExtGetLastError"})
NATIVE = [d.name for d in DECLS if d.name not in ERROR_QUERIES]


#: what the driver's free-memory figure may move by for reasons of its own between two reads
GPU_FREE_SLACK = 64 << 20


def free_device_memory() -> int:
    """The current device's free memory after every device has finished its work."""
    import hipmr_ctypes as hmr
    hmr.synchronize()
    free: int = hmr.available_device_memory()[0]
    return free


def need_gpu_torch() -> Any:
    """PyTorch with CUDA / ROCm support and a device (the module), else skip saying why;
    fail instead under HIPMR_REQUIRE_TORCH=1."""
    import pytest
    required = os.environ.get("HIPMR_REQUIRE_TORCH") == "1"
    try:
        import torch
    except ImportError:
        if required:
            pytest.fail("PyTorch is required (HIPMR_REQUIRE_TORCH=1) but not installed")
        pytest.skip("PyTorch is not installed")
    if not hasattr(torch._C, "_cuda_customAllocator") or not torch.cuda.is_available():
        if required:
            pytest.fail(f"PyTorch {torch.__version__} has no CUDA / ROCm support")
        pytest.skip(f"PyTorch {torch.__version__} has no CUDA / ROCm support")
    return torch


@contextlib.contextmanager
def failing_nth(rt: Any, call: str, nth: int, status: int = 2) -> Iterator[None]:
    """Inside the block, the ``nth`` call of ``rt.fn.<call>`` returns ``status`` (default
    hipErrorOutOfMemory's 2) without running; the others run as they are."""
    real, count = getattr(rt.fn, call), [0]

    def flaky(*args: Any) -> Any:
        count[0] += 1
        return status if count[0] == nth else real(*args)
    setattr(rt.fn, call, flaky)
    try:
        yield
    finally:
        setattr(rt.fn, call, real)


@contextlib.contextmanager
def no_native_call(emulator: Any) -> Iterator[None]:
    """Assert that the block makes no HIP call at all and changes no allocation (garbage
    collection is off meanwhile: earlier tests' garbage must not be freed inside it)."""
    enabled = gc.isenabled()
    gc.disable()
    before = emulator.live_allocations()
    emulator.inject_failure(code=999, count=1, calls=NATIVE)
    try:
        yield
    finally:
        pending = emulator.pending_faults()
        emulator.clear_faults()
        if enabled:
            gc.enable()
    assert pending == 1, "a native call was made"
    assert emulator.live_allocations() == before


@contextlib.contextmanager
def process_runtime(rt: Any = None) -> Iterator[Any]:
    """Make ``rt`` the process-wide runtime (``None``: keep the current one) with an empty
    per-device resource table for the block; the previous runtime and table come back after.
    Yields the runtime in use."""
    from hipmr_ctypes import _hip
    from hipmr_ctypes.resources import per_device
    saved = dict(per_device._resources)
    previous = _hip.set_runtime(rt) if rt is not None else None
    with per_device._lock:
        per_device._resources.clear()
        per_device._changed()
    try:
        yield _hip.get_runtime() if rt is None else rt
    finally:
        if rt is not None:
            _hip.set_runtime(previous)
        with per_device._lock:
            per_device._resources.clear()
            per_device._resources.update(saved)
            per_device._changed()


def run_in_thread(fn: Callable[[], Any]) -> Tuple[Optional[int], Any]:
    """Run ``fn`` in a new thread; return (the thread's ident, ``fn``'s result) once ``join``
    returned (a thread still running after 60 s fails the test)."""
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(timeout=60)
    if t.is_alive():
        raise Hang("thread hung")
    return t.ident, out[0]


@contextlib.contextmanager
def held_by_another_thread(lock: Any, timeout: float = 120) -> Iterator[None]:
    """Hold ``lock`` (a context manager: a ``DeferringLock``, the emulator's lock...) in a new
    thread for the whole ``with`` block, which starts once the lock is held; the thread lets
    go of it and is joined when the block ends (a lock not taken within ``timeout`` seconds
    fails the test)."""
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            done.wait(timeout)

    t = threading.Thread(target=holder)
    t.start()
    try:
        if not held.wait(timeout):
            raise Hang("the other thread did not get the lock")
        yield
    finally:
        done.set()
        t.join(timeout)


# --------------------------------------------------------------------- kinds of failure
class Crash(AssertionError):
    """A child process died (of a signal)."""

    reliability_kind = "crash"


class Hang(AssertionError):
    """A thread or child process did not end in time (a deadlock)."""

    reliability_kind = "hang"


class Leak(AssertionError):
    """Memory (or another resource) was left allocated."""

    reliability_kind = "leak"


def no_crash(proc: Any) -> None:
    """Raise :class:`Crash` when the child process ``proc`` (a ``CompletedProcess`` or a
    ``Popen``) died of a signal; its stderr's end is the message."""
    rc = proc.returncode
    if rc is not None and rc < 0:
        err = proc.stderr if isinstance(getattr(proc, "stderr", None), str) else ""
        raise Crash(f"the child process died of signal {-rc}: {err[-3000:]}")


# CPython 3.13t (free-threaded) can hang in finalization while daemon threads run Python code:
# a pure-Python script with four busy daemon threads hangs in about 1 of 6 runs under load,
# without this package; the GIL build never does.
DAEMON_EXIT_HANGS = sys.version_info[:2] == (3, 13) and "free-threading" in sys.version
DAEMON_EXIT_REASON = ("CPython 3.13t can hang at exit while daemon threads run Python code "
                      "(reproduced without this package)")


def spy_runtime_calls(monkeypatch: Any, rt: Any, *names: str) -> List[str]:
    """Record the name of every call of the runtime functions ``names`` (still made) in the
    list returned."""
    calls: List[str] = []
    for name in names:
        real = getattr(rt.fn, name)
        monkeypatch.setattr(rt.fn, name,
                            lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    return calls

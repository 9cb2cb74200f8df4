"""Bad input, table-driven: for every public callable of ``hipmr_ctypes.__all__``, the wrong
things users really pass.

Every case must

* raise a specific exception (TypeError / ValueError / a HipError subclass; IndexError and
  BufferError where the protocol says so) whose message names the argument;
* raise it before any native call: a spy replaces every function of the runtime's table
  *before* the case builds anything (hot paths cache function pointers at construction, so
  they cache the spy), and only the read-only queries in ``QUERIES`` may run (a device
  ordinal cannot be range-checked without asking how many devices there are).  Cases the
  runtime itself detects (a pointer the emulated device never gave out) say so;
* leave everything as it was: the runtime's live allocations (the spy's own table, and the
  emulator's), the resource's statistics / pool size / outstanding allocations, and the
  resource still allocates and frees; after the case drops its objects, nothing it allocated
  is still live.

``test_every_public_name_is_covered`` checks that each name of ``__all__`` has cases or a
reason not to.  Cases that could crash the process if a check were missing (freeing a
pointer that libc never gave out) run in a child process, and ``test_junk_never_crashes``
throws junk at every public callable and method in a child process that must exit cleanly.
Cases that need two devices run in a child process with ``HIPMR_EMULATED_DEVICES=2``.
"""
from __future__ import annotations

import ctypes
import gc
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Optional

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.exceptions import InvalidValueError

from support import REPO, TESTS, Leak, no_crash


#: Read-only native queries a check may make before raising (they change no state).
QUERIES = frozenset({"hipGetDeviceCount", "hipGetDevice"})
#: "Any native call may happen": the runtime is what detects the misuse.
ANY = None

ALLOC_CALLS = frozenset({"hipMalloc", "hipMallocManaged", "hipHostMalloc", "hipMallocAsync",
                         "hipMallocFromPoolAsync"})
FREE_CALLS = frozenset({"hipFree", "hipHostFree", "hipFreeAsync"})


# ================================================================================= the spy
def _address(value: Any) -> int:
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    return int(value or 0)


class Spy:
    """Replaces every function of ``rt.fn`` with a wrapper that records the call and keeps
    the set of pointers the runtime handed out and has not taken back (``live``)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.calls: List[str] = []
        self.live: set = set()
        self._saved: Dict[str, Any] = {}

    def __enter__(self) -> "Spy":
        fn = self.rt.fn
        for name, func in list(vars(fn).items()):
            self._saved[name] = func
            setattr(fn, name, self._wrap(name, func))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, func in self._saved.items():
            setattr(self.rt.fn, name, func)
        self._saved.clear()

    def _wrap(self, name: str, func: Any) -> Any:
        calls, live = self.calls, self.live
        if name in ALLOC_CALLS:
            def spy(*args):
                calls.append(name)
                st = func(*args)
                if st == 0 and _address(args[0]):
                    live.add(_address(args[0]))
                return st
        elif name in FREE_CALLS:
            def spy(*args):
                calls.append(name)
                st = func(*args)
                if st == 0:
                    live.discard(_address(args[0]))
                return st
        else:
            def spy(*args):
                calls.append(name)
                return func(*args)
        spy.__name__ = name
        return spy


# ================================================================================= the cases
@dataclass
class Case:
    """One bad input: ``make()`` builds what the case needs (after the spy is installed),
    ``call(ctx)`` is the bad call; it must raise ``exc`` with ``match`` in the message."""

    id: str
    target: str                      # the name of __all__ this case exercises
    make: Callable[[], Any]
    call: Callable[[Any], Any]
    exc: Any
    match: str
    native: Optional[FrozenSet[str]] = QUERIES   # native calls allowed before the raise
    emulated_only: bool = False      # the runtime (emulated device) is what tells
    isolate: bool = False            # could crash the process if a check were missing
    two_devices: bool = False        # needs HIPMR_EMULATED_DEVICES=2 (child process)
    state: Optional[Callable[[Any], Any]] = None   # snapshot that must not change
    serve: Optional[Callable[[Any], Any]] = None   # must still work afterwards


CASES: List[Case] = []
EXEMPT: Dict[str, str] = {}


def case(id: str, target: str, make: Callable[[], Any], call: Callable[[Any], Any], exc: Any,
         match: str, **kw: Any) -> None:
    CASES.append(Case(id, target, make, call, exc, match, **kw))


# ---- bad values -----------------------------------------------------------------------------
class Junk:
    """A plain object: not an int, not a stream, not a resource."""

    def __repr__(self) -> str:
        return "Junk()"


BAD_SIZES = [("negative", -1, ValueError), ("float", 64.0, TypeError), ("bool", True, TypeError),
             ("huge", (1 << 64) + 1, ValueError), ("string", "64", TypeError),
             ("None", None, TypeError)]
#: Sizes that configure a resource also take strings ("64", "4MiB"): a bad one is a ValueError.
BAD_CONFIG_SIZES = [(label, "64 apples", ValueError) if label == "string" else (label, v, exc)
                    for label, v, exc in BAD_SIZES]
CONFIG_SIZE_ARGS = {"initial_pool_size", "maximum_pool_size", "block_size", "limit", "threshold"}
#: ... and a float is a fraction of the device's memory: one outside (0, 1] is a ValueError
FRACTION_SIZE_ARGS = {"initial_pool_size", "maximum_pool_size", "limit", "release_threshold"}
BAD_ALIGNMENTS = [("zero", 0, ValueError), ("negative", -256, ValueError),
                  ("not-pow2", 48, ValueError), ("float", 256.0, TypeError),
                  ("bool", True, TypeError), ("string", "256", TypeError),
                  ("None", None, TypeError)]
TOO_ALIGNED = [("512", 512, ValueError), ("1MiB", 1 << 20, ValueError)]
BAD_STREAMS = [("None", None, TypeError), ("negative", -1, ValueError),
               ("float", 0.0, TypeError), ("string", "0", TypeError), ("bool", False, TypeError),
               ("huge", 1 << 64, ValueError), ("class", hmr.Stream, TypeError),
               ("object", Junk(), TypeError)]
BAD_PTRS = [("negative", -4096, ValueError), ("huge", 1 << 64, ValueError),
            ("string", "0x1000", TypeError), ("None", None, TypeError),
            ("bool", True, TypeError)]
BAD_DEVICES = [("negative", -1, ValueError), ("out-of-range", 64, ValueError),
               ("float", 0.0, TypeError), ("string", "0", TypeError), ("bool", False, TypeError),
               ("class", hmr.Device, TypeError)]
NOT_PROPERTIES = [("int", 5), ("string", "device_accessible"), ("None", None),
                  ("base-class", hmr.Property), ("instance", hmr.device_accessible()),
                  ("other-class", int)]


# ---- subjects: the resources every resource case runs against --------------------------------
def _async() -> Any:
    return hmr.AsyncMemoryResource()


@dataclass
class Subject:
    make: Callable[[], Any]
    device_style: bool        # alignment above 256 is refused
    tells: bool               # foreign pointers / double frees / wrong sizes detected in Python
    runtime_tells: bool       # else the emulated device detects foreign pointers / double frees
    free_call: str = ""
    is_async: bool = True     # has allocate_async / deallocate_async


SUBJECTS: Dict[str, Subject] = {
    "DeviceMemoryResource": Subject(hmr.DeviceMemoryResource, True, False, True, "hipFree"),
    "AsyncMemoryResource": Subject(_async, True, False, True, "hipFreeAsync"),
    "AsyncMemoryResource.from_default_pool": Subject(hmr.AsyncMemoryResource.from_default_pool,
                                                     True, False, True, "hipFreeAsync"),
    "PinnedMemoryResource": Subject(hmr.PinnedMemoryResource, True, False, True, "hipHostFree"),
    "ManagedMemoryResource": Subject(hmr.ManagedMemoryResource, True, False, True, "hipFree"),
    "HostMemoryResource": Subject(hmr.HostMemoryResource, False, True, False),
    "VirtualMemoryResource": Subject(hmr.VirtualMemoryResource, True, True, False),
    "VirtualPoolResource": Subject(hmr.VirtualPoolResource, False, True, False),
    "PoolResource": Subject(lambda: hmr.PoolResource(_async(), initial_pool_size=1 << 20),
                            False, True, False),
    "PoolResource(DeviceMemoryResource)": Subject(
        lambda: hmr.PoolResource(hmr.DeviceMemoryResource()), False, True, False),
    "FixedSizeResource": Subject(lambda: hmr.FixedSizeResource(_async(), 4096, 8),
                                 True, True, False),
    "BinningResource": Subject(lambda: hmr.BinningResource(_async(), [256, 4096]),
                               True, True, False),
    "LimitingResource": Subject(lambda: hmr.LimitingResource(_async(), 1 << 24),
                                True, False, True, "hipFreeAsync"),
    "StatisticsResource": Subject(lambda: hmr.StatisticsResource(_async()),
                                  True, False, True, "hipFreeAsync"),
    "TrackingResource": Subject(lambda: hmr.TrackingResource(_async()), True, True, False),
    "LoggingResource": Subject(lambda: hmr.LoggingResource(_async(), io.StringIO()),
                               True, False, True, "hipFreeAsync"),
    "FailureCallbackResource": Subject(
        lambda: hmr.FailureCallbackResource(_async(), lambda n: False), True, False, True,
        "hipFreeAsync"),
    "AlignedResource": Subject(lambda: hmr.AlignedResource(_async(), 256), False, False, True,
                               "hipFreeAsync"),
    "PrefetchResource": Subject(lambda: hmr.PrefetchResource(hmr.ManagedMemoryResource()),
                                True, False, True, "hipFree"),
    "CallbackResource": Subject(lambda: _callback_over(hmr.DeviceMemoryResource()), True, False,
                                True, "hipFree"),
    "async_resource_ref": Subject(
        lambda: hmr.async_resource_ref[hmr.device_accessible](
            hmr.PoolResource(_async(), initial_pool_size=1 << 20)), False, True, False),
    "resource_ref": Subject(
        lambda: hmr.resource_ref[hmr.device_accessible](hmr.TrackingResource(_async())),
        True, True, False, is_async=False),
    "StatisticsResource(LimitingResource(PoolResource))": Subject(
        lambda: hmr.StatisticsResource(hmr.LimitingResource(
            hmr.PoolResource(_async(), initial_pool_size=1 << 20), 1 << 24)), False, True, False),
    "StatisticsResource(HostMemoryResource)": Subject(
        lambda: hmr.StatisticsResource(hmr.HostMemoryResource()), False, True, False),
}


def _callback_over(r: Any) -> Any:
    return hmr.CallbackResource(r.allocate, r.deallocate, r.allocate_async, r.deallocate_async,
                                properties=(hmr.device_accessible,))


def _base(name: str) -> str:
    return name.split("(")[0].split(".")[0]


def _is_async(obj: Any) -> bool:
    return hmr.is_async_resource(obj)


# ---- snapshots -----------------------------------------------------------------------------------
def snapshot(obj: Any, depth: int = 0) -> tuple:
    """Everything observable about a resource's bookkeeping (and its upstreams')."""
    from hipmr_ctypes.adaptors import (BinningResource, FixedSizeResource, LimitingResource,
                                       PoolResource, StatisticsResource, TrackingResource)
    from hipmr_ctypes.resources import AsyncMemoryResource
    if depth > 8 or obj is None:
        return ()
    if isinstance(obj, hmr.resource_ref):
        return snapshot(obj.resource, depth + 1)
    out: list = [type(obj).__name__]
    if isinstance(obj, StatisticsResource):
        out.append(obj.statistics)
    if isinstance(obj, LimitingResource):
        out.append(obj.get_allocated_bytes())
    if isinstance(obj, TrackingResource):
        out.append(sorted((a.ptr, a.size) for a in obj.outstanding().values()))
    if isinstance(obj, PoolResource):
        out.append((obj.pool_size(), obj.allocation_count(), obj.free_bytes()))
    if isinstance(obj, FixedSizeResource):
        out.append((obj.pool_size(), obj.allocation_count()))
    if isinstance(obj, BinningResource):
        out.append(obj.allocation_count())
    if isinstance(obj, AsyncMemoryResource) and not obj.pool.closed:
        out.append((obj.pool.used, obj.pool.reserved))
    up = getattr(obj, "upstream_resource", None)
    if callable(up):
        out.append(snapshot(up(), depth + 1))
    return tuple(out)


def serve(obj: Any, stream: Any = None) -> None:
    """The resource still allocates and frees, synchronously and on a stream."""
    p = obj.allocate(1000)
    assert type(p) is int and p > 0 and p % 256 == 0, p
    obj.deallocate(p, 1000)
    if _is_async(obj):
        q = obj.allocate_async(3000, 256, 0 if stream is None else stream)
        assert type(q) is int and q > 0, q
        obj.deallocate_async(q, 3000, 256, 0 if stream is None else stream)


class Ctx:
    """What a resource case works with: the resource, one live allocation that must survive
    (``witness``), a pointer from a finished allocation (``freed``), the stream the case
    passes and one for serving afterwards (pools keep referring to the streams blocks were
    freed on until ``release()``: they are closed only after it)."""

    def __init__(self, name: str) -> None:
        self.r = SUBJECTS[name].make()
        self.stream = hmr.Stream()
        self.serve_stream = hmr.Stream()
        self.closed_stream = _closed(hmr.Stream())
        self.witness = self.r.allocate(512)
        self.freed = self.r.allocate(768)
        self.r.deallocate(self.freed, 768)
        self.foreign = _foreign_pointer()

    def close(self) -> None:
        self.r.deallocate(self.witness, 512)
        release = getattr(getattr(self.r, "resource", self.r), "release", None)
        if callable(release):
            release()
        self.stream.close()
        self.serve_stream.close()


_FOREIGN = ctypes.create_string_buffer(1 << 16)
_LOG_PATH = os.path.join(tempfile.mkdtemp(prefix="hipmr-bad-input-"), "log.csv")


def _foreign_pointer() -> int:
    """A real, writable address no resource ever handed out (inside a ctypes buffer)."""
    return (ctypes.addressof(_FOREIGN) + 4095) & ~4095


def _resource_state(ctx: Ctx) -> Any:
    return snapshot(ctx.r)


def _resource_serve(ctx: Ctx) -> None:
    serve(ctx.r, ctx.serve_stream)


def resource_case(subject: str, method: str, what: str, label: str, call: Callable[[Ctx], Any],
                  exc: Any, match: str, **kw: Any) -> None:
    if method.endswith("_async") and not SUBJECTS[subject].is_async:
        return
    case(f"{subject}.{method}-{what}-{label}", _base(subject), lambda: Ctx(subject), call, exc,
         match, state=_resource_state, serve=_resource_serve, **kw)


def _build_resource_cases() -> None:
    for name, sub in SUBJECTS.items():
        for label, v, exc in BAD_SIZES:
            resource_case(name, "allocate", "bytes", label, lambda c, v=v: c.r.allocate(v), exc,
                          "bytes")
            resource_case(name, "allocate_async", "bytes", label,
                          lambda c, v=v: c.r.allocate_async(v, 256, c.stream), exc, "bytes")
            resource_case(name, "deallocate", "bytes", label,
                          lambda c, v=v: c.r.deallocate(c.witness, v), exc, "bytes")
            resource_case(name, "deallocate_async", "bytes", label,
                          lambda c, v=v: c.r.deallocate_async(c.witness, v, 256, c.stream), exc,
                          "bytes")
        aligns = BAD_ALIGNMENTS + (TOO_ALIGNED if sub.device_style else [])
        for label, v, exc in aligns:
            resource_case(name, "allocate", "alignment", label,
                          lambda c, v=v: c.r.allocate(64, v), exc, "alignment")
            resource_case(name, "allocate_async", "alignment", label,
                          lambda c, v=v: c.r.allocate_async(64, v, c.stream), exc, "alignment")
            # FixedSize and Binning refuse such alignments when allocating; a free with one
            # is a mismatch they do not record, and harmless
            if label not in ("512", "1MiB") or _base(name) not in ("FixedSizeResource",
                                                                  "BinningResource"):
                resource_case(name, "deallocate", "alignment", label,
                              lambda c, v=v: c.r.deallocate(c.witness, 512, v), exc, "alignment")
        for label, v, exc in BAD_STREAMS:
            resource_case(name, "allocate_async", "stream", label,
                          lambda c, v=v: c.r.allocate_async(64, 256, v), exc, "stream")
            resource_case(name, "deallocate_async", "stream", label,
                          lambda c, v=v: c.r.deallocate_async(c.witness, 512, 256, v), exc,
                          "stream")
        for label, v, exc in BAD_PTRS:
            resource_case(name, "deallocate", "ptr", label,
                          lambda c, v=v: c.r.deallocate(v, 512), exc, "ptr")
            resource_case(name, "deallocate_async", "ptr", label,
                          lambda c, v=v: c.r.deallocate_async(v, 512, 256, c.stream), exc, "ptr")
        # a float that equals a live pointer must not be taken for it
        resource_case(name, "deallocate", "ptr", "float-equal-to-live",
                      lambda c: c.r.deallocate(float(c.witness), 512), TypeError, "ptr")
        resource_case(name, "deallocate_async", "ptr", "float-equal-to-live",
                      lambda c: c.r.deallocate_async(float(c.witness), 512, 256, c.stream),
                      TypeError, "ptr")
        resource_case(name, "allocate_async", "stream", "closed-Stream",
                      lambda c: c.r.allocate_async(64, 256, c.closed_stream), ValueError,
                      "closed")
        resource_case(name, "deallocate_async", "stream", "closed-Stream",
                      lambda c: c.r.deallocate_async(c.witness, 512, 256, c.closed_stream),
                      ValueError, "closed")
        # pointers the resource never gave out, double frees, wrong sizes
        host = _base(name) == "HostMemoryResource" or "HostMemoryResource" in name
        if sub.tells:
            kw = dict(isolate=host)
            resource_case(name, "deallocate", "ptr", "foreign",
                          lambda c: c.r.deallocate(c.foreign, 512), ValueError, "ptr", **kw)
            resource_case(name, "deallocate", "ptr", "interior",
                          lambda c: c.r.deallocate(c.witness + 256, 256), ValueError, "ptr",
                          **kw)
            resource_case(name, "deallocate", "ptr", "double-free",
                          lambda c: c.r.deallocate(c.freed, 768), ValueError, "ptr", **kw)
            resource_case(name, "deallocate_async", "ptr", "double-free",
                          lambda c: c.r.deallocate_async(c.freed, 768, 256, c.stream),
                          ValueError, "ptr", **kw)
            resource_case(name, "deallocate", "bytes", "wrong-size",
                          lambda c: c.r.deallocate(c.witness, 1024), ValueError, "bytes", **kw)
            resource_case(name, "deallocate_async", "bytes", "wrong-size",
                          lambda c: c.r.deallocate_async(c.witness, 100, 256, c.stream),
                          ValueError, "bytes", **kw)
        if "Tracking" in name or name == "resource_ref":  # it records each alignment
            resource_case(name, "deallocate", "alignment", "wrong-alignment",
                          lambda c: c.r.deallocate(c.witness, 512, 64), ValueError,
                          "alignment")
        if sub.runtime_tells and not sub.tells:
            kw = dict(native=ANY, emulated_only=True)
            resource_case(name, "deallocate", "ptr", "foreign",
                          lambda c: c.r.deallocate(c.foreign, 512), InvalidValueError, "ptr",
                          **kw)
            resource_case(name, "deallocate", "ptr", "double-free",
                          lambda c: c.r.deallocate(c.freed, 768), InvalidValueError, "ptr", **kw)
            resource_case(name, "deallocate_async", "ptr", "double-free",
                          lambda c: c.r.deallocate_async(c.freed, 768, 256, c.stream),
                          InvalidValueError, "ptr", **kw)


_build_resource_cases()


# ---- helpers for the other cases -------------------------------------------------------------
def _none() -> None:
    return None


def _buffer() -> Any:
    return hmr.Buffer.from_host(bytes(range(64)))


def _buffer_state(b: Any) -> Any:
    return (b.closed, b.size) if b.closed else (b.size, b.tobytes())


def _closed(obj: Any) -> Any:
    obj.close()
    return obj


def _sync_resource() -> Any:
    h = hmr.HostMemoryResource()
    return hmr.CallbackResource(h.allocate, h.deallocate, properties=(hmr.device_accessible,))


def _per_device_state(_: Any) -> Any:
    return id(hmr.get_current_device_resource())


def _closed_pool() -> Any:
    a = hmr.AsyncMemoryResource()
    a.pool.close()
    return a


# ---- properties, concepts, refs ------------------------------------------------------------------
for label, p in NOT_PROPERTIES:
    for target, call in [
            ("get_property", lambda x, p=p: hmr.get_property(x, p)),
            ("has_property", lambda x, p=p: hmr.has_property(x, p)),
            ("has_property_with", lambda x, p=p: hmr.has_property_with(x, p, int)),
            ("property_with_value", lambda x, p=p: hmr.property_with_value(p)),
            ("try_get_property", lambda x, p=p: hmr.try_get_property(x, p)),
            ("is_resource_with", lambda x, p=p: hmr.is_resource_with(x, p)),
            ("is_async_resource_with", lambda x, p=p: hmr.is_async_resource_with(x, p)),
            ("resource_ref", lambda x, p=p: hmr.resource_ref[p]),
            ("async_resource_ref", lambda x, p=p: hmr.async_resource_ref[hmr.device_accessible,
                                                                         p]),
            ("CallbackResource", lambda x, p=p: hmr.CallbackResource(
                x.allocate, x.deallocate, properties=(p,))),
            ("forward_property", lambda x, p=p: type("Bad", (hmr.forward_property,),
                                                      {"properties": (p,)})),
    ]:
        case(f"{target}-prop-{label}", target, hmr.HostMemoryResource, call, TypeError,
             "propert")

for target in ("resource_ref", "async_resource_ref"):
    ref_cls = getattr(hmr, target)
    for label, value in [("None", None), ("class", hmr.DeviceMemoryResource), ("int", 5),
                         ("object", Junk())]:
        case(f"{target}-source-{label}", target, _none,
             lambda _, v=value, c=ref_cls: c[hmr.device_accessible](v), TypeError,
             "resource|allocate")
    case(f"{target}-source-missing-property", target, hmr.HostMemoryResource,
         lambda h, c=ref_cls: c[hmr.device_accessible](h), TypeError, "device_accessible")
    case(f"{target}-resubscript", target, _none,
         lambda _, c=ref_cls: c[hmr.device_accessible][hmr.host_accessible], TypeError,
         "propert")
case("async_resource_ref-source-sync-resource", "async_resource_ref", _sync_resource,
     lambda r: hmr.async_resource_ref(r), TypeError, "allocate_async")
case("async_resource_ref-source-sync-ref", "async_resource_ref", _sync_resource,
     lambda r: hmr.async_resource_ref(hmr.resource_ref(r)), TypeError, "synchronous")
case("resource_ref-get_property-unlisted", "resource_ref",
     lambda: hmr.resource_ref[hmr.device_accessible](hmr.PinnedMemoryResource()),
     lambda ref: hmr.get_property(ref, hmr.host_accessible), TypeError, "host_accessible")
case("resource_cast-cls-int", "resource_cast", hmr.HostMemoryResource,
     lambda h: hmr.resource_cast(5, h), TypeError, "class")
case("resource_cast-cls-instance", "resource_cast", hmr.HostMemoryResource,
     lambda h: hmr.resource_cast(h, h), TypeError, "class")
case("get_property-undeclared", "get_property", hmr.HostMemoryResource,
     lambda h: hmr.get_property(h, hmr.device_accessible), TypeError, "device_accessible")

# ---- stream_ref, streams, events -----------------------------------------------------------------
for label, v, exc in BAD_STREAMS:
    case(f"stream_ref-handle-{label}", "stream_ref", _none, lambda _, v=v: hmr.stream_ref(v),
         exc, "stream")
case("stream_ref-closed-Stream", "stream_ref", lambda: _closed(hmr.Stream()),
     lambda s: hmr.stream_ref(s), ValueError, "closed")
case("stream_ref-bad-__hip_stream__", "stream_ref", _none,
     lambda _: hmr.stream_ref(type("S", (), {"__hip_stream__": lambda self: 5})()), TypeError,
     "__hip_stream__")
case("stream_ref-immutable", "stream_ref", _none,
     lambda _: setattr(hmr.stream_ref(0), "_handle", 5), AttributeError, "immutable")
case("stream_per_thread-immutable", "stream_per_thread", _none,
     lambda _: setattr(hmr.stream_per_thread, "_handle", 0), AttributeError, "immutable")

for label, v, exc in [("float", 0.0, TypeError), ("bool", True, TypeError),
                      ("string", "0", TypeError), ("None", None, TypeError),
                      ("two", 2, ValueError), ("negative", -1, ValueError)]:
    case(f"Stream-flags-{label}", "Stream", _none, lambda _, v=v: hmr.Stream(flags=v), exc,
         "flags")
for label, v, exc in [("float", 0.0, TypeError), ("bool", True, TypeError),
                      ("string", "0", TypeError), ("None", None, TypeError),
                      ("huge", 1 << 70, ValueError), ("huge-negative", -(1 << 40), ValueError)]:
    case(f"Stream-priority-{label}", "Stream", _none, lambda _, v=v: hmr.Stream(priority=v), exc,
         "priority")
for label, v, exc in BAD_DEVICES:
    case(f"Stream-device-{label}", "Stream", _none, lambda _, v=v: hmr.Stream(device=v), exc,
         "device")


class Kit:
    """Objects a case needs besides the one under test, built in ``make`` (outside the window
    in which native calls are counted)."""

    def __init__(self, **objs: Any) -> None:
        self.__dict__.update(objs)


def _closed_stream_kit() -> Kit:
    return Kit(s=_closed(hmr.Stream()), ev=hmr.Event(), other=hmr.Stream())


STREAM_USES = {"handle": lambda k: k.s.handle, "ref": lambda k: k.s.ref,
               "priority": lambda k: k.s.priority, "synchronize": lambda k: k.s.synchronize(),
               "query": lambda k: k.s.query(), "wait_event": lambda k: k.s.wait_event(k.ev),
               "__enter__": lambda k: k.s.__enter__(),
               "__hip_stream__": lambda k: k.s.__hip_stream__(),
               "__cuda_stream__": lambda k: k.s.__cuda_stream__(),
               "as-Event.record-stream": lambda k: k.ev.record(k.s),
               "as-wait_event-stream": lambda k: hmr.wait_event(k.s, k.ev),
               "as-stream_ref": lambda k: hmr.stream_ref(k.s),
               "as-Buffer-stream": lambda k: hmr.Buffer(64, stream=k.s)}
for label, use in STREAM_USES.items():
    case(f"Stream-closed-{label}", "Stream", _closed_stream_kit, use, ValueError, "closed")
case("Stream-wait_event-not-an-Event", "Stream", hmr.Stream, lambda s: s.wait_event(5),
     TypeError, "event")

for label, v, exc in [("float", 0.0, TypeError), ("bool", True, TypeError),
                      ("string", "0", TypeError), ("None", None, TypeError),
                      ("unknown-bit", 8, ValueError), ("negative", -1, ValueError),
                      ("huge", 1 << 40, ValueError)]:
    case(f"Event-flags-{label}", "Event", _none, lambda _, v=v: hmr.Event(v), exc, "flags")
for label, v, exc in BAD_STREAMS:
    case(f"Event.record-stream-{label}", "Event", hmr.Event, lambda e, v=v: e.record(v), exc,
         "stream")
def _closed_event_kit() -> Kit:
    return Kit(e=_closed(hmr.Event()), other=hmr.Event().record(), s=hmr.Stream())


EVENT_USES = {"handle": lambda k: k.e.handle, "record": lambda k: k.e.record(0),
              "synchronize": lambda k: k.e.synchronize(), "query": lambda k: k.e.query(),
              "elapsed_time": lambda k: k.e.elapsed_time(k.other),
              "elapsed_time-other": lambda k: k.other.elapsed_time(k.e),
              "__enter__": lambda k: k.e.__enter__(),
              "as-wait_event-event": lambda k: hmr.wait_event(0, k.e),
              "as-Stream.wait_event-event": lambda k: k.s.wait_event(k.e)}
for label, use in EVENT_USES.items():
    case(f"Event-closed-{label}", "Event", _closed_event_kit, use, ValueError, "closed")
for label, v in [("None", None), ("int", 5), ("class", hmr.Event)]:
    case(f"Event.elapsed_time-other-{label}", "Event", lambda: hmr.Event().record(),
         lambda e, v=v: e.elapsed_time(v), TypeError, "other")
case("Event.elapsed_time-disable-timing", "Event",
     lambda: Kit(a=hmr.Event(2).record(), b=hmr.Event(2).record()),
     lambda k: k.a.elapsed_time(k.b), ValueError, "flag 2|timing")
STREAM_USES_CAPTURE = {"begin_capture": lambda k: k.s.begin_capture(),
                       "end_capture": lambda k: k.s.end_capture(),
                       "is_capturing": lambda k: k.s.is_capturing}
for label, use in STREAM_USES_CAPTURE.items():
    case(f"Stream-closed-{label}", "Stream", _closed_stream_kit, use, ValueError, "closed")
for label, v, exc in [("unknown", "sometimes", ValueError), ("int", 0, ValueError),
                      ("None", None, ValueError), ("upper", "GLOBAL", ValueError)]:
    case(f"Stream.begin_capture-mode-{label}", "Stream", lambda: hmr.Stream(flags=1),
         lambda s, v=v: s.begin_capture(v), exc, "mode")


def _graph() -> Any:
    """An executable graph of an empty capture."""
    s = hmr.Stream(flags=1)
    s.begin_capture()
    return s.end_capture()


case("Graph-constructed", "Graph", _none, lambda _: hmr.Graph(), TypeError, "end_capture")
for label, v, exc in BAD_STREAMS:
    case(f"Graph.launch-stream-{label}", "Graph", _graph, lambda g, v=v: g.launch(v), exc,
         "stream")
case("Graph-closed-launch", "Graph", lambda: _closed(_graph()), lambda g: g.launch(0),
     ValueError, "closed")
for label, v, exc in BAD_STREAMS:
    case(f"wait_event-stream-{label}", "wait_event", hmr.Event,
         lambda e, v=v: hmr.wait_event(v, e), exc, "stream")
for label, v in [("None", None), ("int", 5), ("class", hmr.Event), ("Stream", "stream")]:
    case(f"wait_event-event-{label}", "wait_event", hmr.Stream,
         lambda s, v=v: hmr.wait_event(s, s if v == "stream" else v), TypeError, "event")

# ---- runtime and devices --------------------------------------------------------------------------
for label, v, exc in BAD_DEVICES:
    case(f"Device-device-{label}", "Device", _none, lambda _, v=v: hmr.Device(v), exc, "device")
    case(f"set_device-device-{label}", "set_device", _none, lambda _, v=v: hmr.set_device(v),
         exc, "device")
for label, v, exc in [("unknown-name", "no_such_attribute", ValueError),
                      ("float", 1.0, TypeError), ("None", None, TypeError),
                      ("bool", True, TypeError), ("huge", 1 << 40, ValueError),
                      ("negative", -1, ValueError)]:
    case(f"Device.attribute-attr-{label}", "Device", hmr.Device,
         lambda d, v=v: d.attribute(v), exc, "attr|attribute")
for name in ("device_count", "driver_version", "get_device", "platform", "runtime_version",
             "synchronize"):
    case(f"{name}-extra-argument", name, _none, lambda _, n=name: getattr(hmr, n)(0), TypeError,
         "argument")

# ---- concrete resources: constructors and MemoryPool ---------------------------------------------
for label, v, exc in BAD_DEVICES:
    for target, call in [
            ("DeviceMemoryResource", lambda _, v=v: hmr.DeviceMemoryResource(v)),
            ("AsyncMemoryResource", lambda _, v=v: hmr.AsyncMemoryResource(v)),
            ("VirtualMemoryResource", lambda _, v=v: hmr.VirtualMemoryResource(v)),
            ("VirtualPoolResource", lambda _, v=v: hmr.VirtualPoolResource(v)),
            ("AsyncMemoryResource.from_default_pool",
             lambda _, v=v: hmr.AsyncMemoryResource.from_default_pool(v)),
            ("PrefetchResource", lambda _, v=v: hmr.PrefetchResource(
                hmr.ManagedMemoryResource(), v)),
            ("get_per_device_resource", lambda _, v=v: hmr.get_per_device_resource(v)),
            ("set_per_device_resource", lambda _, v=v: hmr.set_per_device_resource(
                v, hmr.get_per_device_resource(0))),
            ("MemoryPool.set_access", lambda a, v=v: a.pool.set_access(v)),
            ("MemoryPool.access", lambda a, v=v: a.pool.access(v))]:
        case(f"{target}-device-{label}", _base(target),
             _async if target.startswith("MemoryPool") else _none, call, exc, "device",
             state=_per_device_state)
for label, v, exc in [("zero", 0, ValueError), ("negative", -4096, ValueError),
                      ("float", 2.0 * (1 << 20), TypeError), ("string", "2MiB", TypeError),
                      ("bool", True, TypeError), ("not-a-multiple", (2 << 20) + 4096, ValueError)]:
    # a multiple of the device's minimum: known only once the runtime is asked
    case(f"VirtualMemoryResource-granularity-{label}", "VirtualMemoryResource", _none,
         lambda _, v=v: hmr.VirtualMemoryResource(granularity=v), exc, "granularity",
         native=QUERIES | {"hipDeviceGetAttribute", "hipRuntimeGetVersion",
                           "hipMemGetAllocationGranularity"})
    if label != "not-a-multiple":   # (checked before any native call)
        case(f"VirtualPoolResource-granularity-{label}", "VirtualPoolResource", _none,
             lambda _, v=v: hmr.VirtualPoolResource(granularity=v), exc, "granularity",
             native=frozenset())
case("VirtualPoolResource-granularity-not-a-multiple", "VirtualPoolResource", _none,
     lambda _: hmr.VirtualPoolResource(granularity=(2 << 20) + 4096), ValueError,
     "granularity", native=QUERIES | {"hipDeviceGetAttribute", "hipRuntimeGetVersion",
                                      "hipMemGetAllocationGranularity"})
for name in ("initial_pool_size", "maximum_pool_size", "release_threshold", "reserve_size"):
    for label, v, exc in BAD_CONFIG_SIZES:
        if v is not None:  # None: the default
            case(f"VirtualPoolResource-{name}-{label}", "VirtualPoolResource", _none,
                 lambda _, v=v, n=name: hmr.VirtualPoolResource(**{n: v}),
                 ValueError if label == "float" else exc, name, native=frozenset())
for label, call, exc in [
        ("pause-backup-int", lambda r: r.pause(backup=1), TypeError),
        ("pause-backup-None", lambda r: r.pause(backup=None), TypeError),
        ("pause-tag-int", lambda r: r.pause(3), TypeError),
        ("pause-tag-empty", lambda r: r.pause(""), TypeError),
        ("resume-tag-bytes", lambda r: r.resume(b"w"), TypeError),
        ("paused-tag-object", lambda r: r.paused(Junk()), TypeError),
        ("tag-None", lambda r: r.tag(None).__enter__(), TypeError),
        ("tag-empty", lambda r: r.tag("").__enter__(), ValueError)]:
    case(f"VirtualMemoryResource.{label}", "VirtualMemoryResource", hmr.VirtualMemoryResource,
         call, exc, "tag|backup")
for label, v, exc in BAD_CONFIG_SIZES:
    if v is not None:  # None: the default
        case(f"AsyncMemoryResource-initial_pool_size-{label}", "AsyncMemoryResource", _none,
             lambda _, v=v: hmr.AsyncMemoryResource(initial_pool_size=v),
             ValueError if label == "float" else exc, "initial_pool_size")
for label, v, exc in BAD_SIZES:
    case(f"MemoryPool.trim_to-bytes-{label}", "MemoryPool", _async,
         lambda a, v=v: a.pool.trim_to(v), exc, "bytes", state=snapshot, serve=serve)
for label, v, exc in [("negative", -1, ValueError), ("float", 1.5, ValueError),
                      ("bool", True, TypeError), ("huge", 1 << 64, ValueError),
                      ("string", "zero", ValueError), ("bytes", b"0", TypeError)]:
    case(f"AsyncMemoryResource-release_threshold-{label}", "AsyncMemoryResource", _none,
         lambda _, v=v: hmr.AsyncMemoryResource(release_threshold=v), exc, "release_threshold")
    case(f"MemoryPool.release_threshold-{label}", "MemoryPool", _async,
         lambda a, v=v: setattr(a.pool, "release_threshold", v), exc, "release_threshold",
         state=snapshot, serve=serve)
for label, v in [("int", 1), ("None", None), ("string", "yes")]:
    case(f"AsyncMemoryResource-enable_ipc-{label}", "AsyncMemoryResource", _none,
         lambda _, v=v: hmr.AsyncMemoryResource(enable_ipc=v), TypeError, "enable_ipc")
    case(f"MemoryPool.set_access-read_write-{label}", "MemoryPool", _async,
         lambda a, v=v: a.pool.set_access(0, v), TypeError, "read_write")
case("AsyncMemoryResource-unknown-keyword", "AsyncMemoryResource", _none,
     lambda _: hmr.AsyncMemoryResource(pool_size=1), TypeError, "pool_size")
POOL_USES = {"allocate": lambda a: a.allocate(64), "allocate_async": lambda a: a.allocate_async(
    64, 256, 0), "__enter__": lambda a: a.__enter__(), "pool.handle": lambda a: a.pool.handle,
    "pool.reserved": lambda a: a.pool.reserved, "pool.used": lambda a: a.pool.used,
    "pool.reserved_high": lambda a: a.pool.reserved_high,
    "pool.used_high": lambda a: a.pool.used_high,
    "pool.release_threshold": lambda a: a.pool.release_threshold,
    "pool.release_threshold=": lambda a: setattr(a.pool, "release_threshold", 0),
    "pool.reset_high": lambda a: a.pool.reset_high(), "pool.trim_to": lambda a: a.pool.trim_to(0),
    "pool.set_access": lambda a: a.pool.set_access(0), "pool.access": lambda a: a.pool.access(0),
    "pool.__enter__": lambda a: a.pool.__enter__(),
    "Buffer": lambda a: hmr.Buffer(64, resource=a),
    "PoolResource-growth": lambda a: hmr.PoolResource(a).allocate(64)}
for label, use in POOL_USES.items():
    case(f"AsyncMemoryResource-closed-pool-{label}", "AsyncMemoryResource", _closed_pool, use,
         ValueError, "closed")
    case(f"MemoryPool-closed-{label}", "MemoryPool", _closed_pool, use, ValueError, "closed")

for label, v, exc in [("float", 0.0, TypeError), ("bool", True, TypeError),
                      ("string", "0", TypeError), ("None", None, TypeError),
                      ("unknown-bit", 0x100, ValueError), ("negative", -1, ValueError),
                      ("coherent-and-noncoherent", 0xC0000000, ValueError)]:
    case(f"PinnedMemoryResource-flags-{label}", "PinnedMemoryResource", _none,
         lambda _, v=v: hmr.PinnedMemoryResource(v), exc, "flags")
for label, v, exc in [("float", 1.0, TypeError), ("bool", True, TypeError),
                      ("string", "1", TypeError), ("None", None, TypeError),
                      ("zero", 0, ValueError), ("three", 3, ValueError)]:
    case(f"ManagedMemoryResource-flags-{label}", "ManagedMemoryResource", _none,
         lambda _, v=v: hmr.ManagedMemoryResource(v), exc, "flags")
case("HostMemoryResource-extra-argument", "HostMemoryResource", _none,
     lambda _: hmr.HostMemoryResource(0), TypeError, "argument")

# ---- the per-device resource --------------------------------------------------------------------
for label, v, match in [("None", None, "async resource"),
                        ("class", hmr.AsyncMemoryResource, "async resource"),
                        ("int", 5, "async resource"),
                        ("host-only", hmr.HostMemoryResource(), "device_accessible"),
                        ("sync-only", "sync", "async resource")]:
    for target, call in [
            ("set_current_device_resource", lambda _, v=v: hmr.set_current_device_resource(
                _sync_resource() if v == "sync" else v)),
            ("set_per_device_resource", lambda _, v=v: hmr.set_per_device_resource(
                0, _sync_resource() if v == "sync" else v))]:
        case(f"{target}-resource-{label}", target, _none, call, TypeError, match,
             state=_per_device_state)
case("get_current_device_resource-extra-argument", "get_current_device_resource", _none,
     lambda _: hmr.get_current_device_resource(0), TypeError, "argument")

# ---- adaptors: constructors and their own methods -------------------------------------------------
ADAPTORS = {
    "PoolResource": lambda up: hmr.PoolResource(up),
    "FixedSizeResource": lambda up: hmr.FixedSizeResource(up, 4096, 2),
    "BinningResource": lambda up: hmr.BinningResource(up, [256]),
    "LimitingResource": lambda up: hmr.LimitingResource(up, 1 << 20),
    "StatisticsResource": lambda up: hmr.StatisticsResource(up),
    "TrackingResource": lambda up: hmr.TrackingResource(up),
    "LoggingResource": lambda up: hmr.LoggingResource(up, io.StringIO()),
    "FailureCallbackResource": lambda up: hmr.FailureCallbackResource(up, lambda n: False),
    "AlignedResource": lambda up: hmr.AlignedResource(up, 4096),
    "PrefetchResource": lambda up: hmr.PrefetchResource(up),
}
for target, build in ADAPTORS.items():
    for label, v in [("None", None), ("class", hmr.AsyncMemoryResource), ("int", 5),
                     ("string", "device"), ("object", Junk())]:
        case(f"{target}-upstream-{label}", target, _none, lambda _, b=build, v=v: b(v),
             TypeError, "upstream")
ADAPTOR_SIZE_ARGS = [
    ("PoolResource", "initial_pool_size", lambda up, v: hmr.PoolResource(up, initial_pool_size=v)),
    ("PoolResource", "maximum_pool_size", lambda up, v: hmr.PoolResource(up, maximum_pool_size=v)),
    ("FixedSizeResource", "block_size", lambda up, v: hmr.FixedSizeResource(up, block_size=v)),
    ("FixedSizeResource", "blocks_to_preallocate",
     lambda up, v: hmr.FixedSizeResource(up, 4096, blocks_to_preallocate=v)),
    ("LimitingResource", "limit", lambda up, v: hmr.LimitingResource(up, v)),
    ("AlignedResource", "threshold", lambda up, v: hmr.AlignedResource(up, 256, threshold=v)),
    ("BinningResource", "bins", lambda up, v: hmr.BinningResource(up, [v])),
    ("BinningResource", "add_bin", lambda up, v: hmr.BinningResource(up).add_bin(v)),
    ("BinningResource", "min_size_exponent",
     lambda up, v: hmr.BinningResource(up, min_size_exponent=v, max_size_exponent=10)),
]
for (label, plain_v, plain_exc), (_, cv, cexc) in zip(BAD_SIZES, BAD_CONFIG_SIZES):
    for target, arg, build in ADAPTOR_SIZE_ARGS:
        v, exc = (cv, cexc) if arg in CONFIG_SIZE_ARGS else (plain_v, plain_exc)
        if label == "float" and arg in FRACTION_SIZE_ARGS:
            exc = ValueError
        name = "size" if arg in ("bins", "add_bin") else arg
        if v is None and arg in ("initial_pool_size", "maximum_pool_size", "min_size_exponent"):
            continue  # None is the default
        case(f"{target}-{arg}-{label}", target, _async, lambda up, b=build, v=v: b(up, v), exc,
             name)
for label, v, exc in BAD_ALIGNMENTS:
    case(f"AlignedResource-alignment-{label}", "AlignedResource", _async,
         lambda up, v=v: hmr.AlignedResource(up, v), exc, "alignment")
case("PoolResource-initial-above-maximum", "PoolResource", _async,
     lambda up: hmr.PoolResource(up, 1 << 20, 1 << 10), ValueError, "maximum_pool_size")
case("FixedSizeResource-block_size-zero", "FixedSizeResource", _async,
     lambda up: hmr.FixedSizeResource(up, 0), ValueError, "block_size")
case("FixedSizeResource.allocate-bytes-above-block", "FixedSizeResource",
     lambda: hmr.FixedSizeResource(_async(), 4096, 2), lambda f: f.allocate(4097), ValueError,
     "bytes", state=snapshot, serve=serve)
case("BinningResource-bins-not-iterable", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, 5), TypeError, "bins")
case("BinningResource-bins-triple", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, [(1, 2, 3)]), TypeError, "bins")
case("BinningResource-bins-duplicate", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, [256, 256]), ValueError, "256")
case("BinningResource-bin-lacks-property", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, [(256, hmr.HostMemoryResource())]), TypeError,
     "resource")
case("BinningResource-bin-not-async", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, [(256, _sync_resource())]), TypeError, "resource")
case("BinningResource-bin-class", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, [(256, hmr.PoolResource)]), TypeError, "resource")
case("BinningResource-min-without-max", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, min_size_exponent=8), ValueError,
     "max_size_exponent")
case("BinningResource-max-below-min", "BinningResource", _async,
     lambda up: hmr.BinningResource(up, min_size_exponent=10, max_size_exponent=8),
     ValueError, "max_size_exponent")
case("BinningResource.add_bin-duplicate-bad-resource", "BinningResource",
     lambda: hmr.BinningResource(_async(), [256]), lambda b: b.add_bin(256, 5), TypeError,
     "resource", state=snapshot, serve=serve)   # (a size that has a bin keeps it, as in RMM)
case("StatisticsResource.pop_counters-empty", "StatisticsResource",
     lambda: hmr.StatisticsResource(_async()), lambda s: s.pop_counters(), IndexError,
     "pop_counters", state=snapshot, serve=serve)
for label, v in [("int", 1), ("None", None), ("string", "yes")]:
    case(f"TrackingResource-capture_stacks-{label}", "TrackingResource", _async,
         lambda up, v=v: hmr.TrackingResource(up, v), TypeError, "capture_stacks")
    case(f"LoggingResource-auto_flush-{label}", "LoggingResource", _async,
         lambda up, v=v: hmr.LoggingResource(up, io.StringIO(), v), TypeError,
         "auto_flush")
for label, v in [("int", 5), ("None", None), ("object", Junk())]:
    case(f"LoggingResource-file-{label}", "LoggingResource", _async,
         lambda up, v=v: hmr.LoggingResource(up, v), TypeError, "file")
    case(f"FailureCallbackResource-callback-{label}", "FailureCallbackResource", _async,
         lambda up, v=v: hmr.FailureCallbackResource(up, v), TypeError, "callback")
    for arg in ("allocate", "deallocate"):
        case(f"CallbackResource-{arg}-{label}", "CallbackResource", _none,
             lambda _, v=v, a=arg: hmr.CallbackResource(
                 **{"allocate": print, "deallocate": print, a: v}), TypeError, arg)
case("CallbackResource-async-half", "CallbackResource", _none,
     lambda _: hmr.CallbackResource(print, print, allocate_async=print), TypeError,
     "deallocate_async")
case("CallbackResource-properties-not-tuple", "CallbackResource", _none,
     lambda _: hmr.CallbackResource(print, print, properties=5), TypeError, "properties")
case("CallbackResource-returns-junk", "CallbackResource",
     lambda: hmr.CallbackResource(lambda n, a: "0x10", lambda p, n, a: None),
     lambda r: r.allocate(64), TypeError, "pointer|allocate")
case("CallbackResource-returns-negative", "CallbackResource",
     lambda: hmr.CallbackResource(lambda n, a: -256, lambda p, n, a: None),
     lambda r: r.allocate(64), ValueError, "pointer|allocate")
case("LoggingResource-closed", "LoggingResource",
     lambda: _closed(hmr.LoggingResource(_async(), _LOG_PATH)), lambda r: r.allocate(64),
     ValueError, "closed")
case("PoolResource-sync-upstream-has-no-allocate_async", "PoolResource",
     lambda: hmr.PoolResource(_sync_resource()), lambda p: p.allocate_async(64, 256, 0),
     AttributeError, "allocate_async")
case("LimitingResource-over-limit", "LimitingResource",
     lambda: hmr.LimitingResource(_async(), 1000), lambda r: r.allocate(1001),
     hmr.OutOfMemoryError, "1001", state=snapshot)

# ---- Buffer -----------------------------------------------------------------------------------------
for label, v, exc in BAD_SIZES:
    case(f"Buffer-size-{label}", "Buffer", _none, lambda _, v=v: hmr.Buffer(v), exc, "size",
         state=_per_device_state)
for label, v, exc in BAD_ALIGNMENTS:
    case(f"Buffer-alignment-{label}", "Buffer", _none, lambda _, v=v: hmr.Buffer(64, alignment=v),
         exc, "alignment")
for label, v, exc in TOO_ALIGNED:
    case(f"Buffer-alignment-device-{label}", "Buffer", _none,
         lambda _, v=v: hmr.Buffer(64, resource=hmr.DeviceMemoryResource(), alignment=v), exc,
         "alignment")
for label, v, exc in BAD_STREAMS:
    if v is not None:  # None is the default stream
        case(f"Buffer-stream-{label}", "Buffer", _none, lambda _, v=v: hmr.Buffer(64, stream=v),
             exc, "stream")
for label, v in [("class", hmr.DeviceMemoryResource), ("int", 5), ("object", Junk()),
                 ("sync-only", "sync")]:
    case(f"Buffer-resource-{label}", "Buffer", _none,
         lambda _, v=v: hmr.Buffer(64, resource=_sync_resource() if v == "sync" else v),
         TypeError, "resource")
case("Buffer-unknown-keyword", "Buffer", _none, lambda _: hmr.Buffer(64, device=0), TypeError,
     "device")
for label, v, exc in [("int", 5, TypeError), ("None", None, TypeError), ("str", "abc", TypeError),
                      ("non-contiguous", memoryview(bytes(128))[::2], ValueError)]:
    case(f"Buffer.from_host-obj-{label}", "Buffer", _none,
         lambda _, v=v: hmr.Buffer.from_host(v), exc, "obj")
    case(f"Buffer.copy_from_host-obj-{label}", "Buffer", _buffer,
         lambda b, v=v: b.copy_from_host(v), exc, "obj", state=_buffer_state)
case("Buffer.copy_from_host-obj-too-large", "Buffer", _buffer,
     lambda b: b.copy_from_host(bytes(65)), ValueError, "obj", state=_buffer_state)
for label, v, exc in [("int", 5, TypeError), ("bytes-read-only", bytes(64), TypeError),
                      ("too-small", bytearray(63), ValueError),
                      ("non-contiguous", memoryview(bytearray(128))[::2], ValueError)]:
    case(f"Buffer.copy_to_host-out-{label}", "Buffer", _buffer,
         lambda b, v=v: b.copy_to_host(v), exc, "out", state=_buffer_state)
for label, v, exc in BAD_SIZES:
    for method in ("resize", "reserve"):
        case(f"Buffer.{method}-{label}", "Buffer", _buffer,
             lambda b, v=v, m=method: getattr(b, m)(v), exc, "new_", state=_buffer_state)
for label, v, exc in BAD_STREAMS:
    if v is not None:
        case(f"Buffer.resize-stream-{label}", "Buffer", _buffer,
             lambda b, v=v: b.resize(128, stream=v), exc, "stream", state=_buffer_state)
for label, v, exc in BAD_DEVICES:
    case(f"Buffer.prefetch-device-{label}", "Buffer", _buffer,
         lambda b, v=v: b.prefetch(v), exc, "device", state=_buffer_state)
for label, v, exc in [("int", 5, TypeError), ("None", None, TypeError),
                      ("bytes", bytes(64), TypeError), ("too-large", "large", ValueError)]:
    case(f"Buffer.copy_from_device-other-{label}", "Buffer",
         lambda: Kit(b=_buffer(), large=hmr.Buffer(65)),
         lambda k, v=v: k.b.copy_from_device(k.large if v == "large" else v), exc, "other",
         state=lambda k: _buffer_state(k.b))
for label, v, exc in [("256", 256, ValueError), ("negative", -1, ValueError),
                      ("float", 1.0, TypeError), ("bool", True, TypeError),
                      ("string", "a", TypeError), ("None", None, TypeError)]:
    case(f"Buffer.memset-value-{label}", "Buffer", _buffer, lambda b, v=v: b.memset(v), exc,
         "value", state=_buffer_state)
for label, v, exc in BAD_STREAMS:
    if v is None:
        continue
    for method, call in [("copy_from_host", lambda b, v: b.copy_from_host(bytes(64), stream=v)),
                         ("copy_to_host", lambda b, v: b.copy_to_host(stream=v)),
                         ("copy_from_device", lambda b, v: b.copy_from_device(b, stream=v)),
                         ("memset", lambda b, v: b.memset(0, stream=v)),
                         ("close", lambda b, v: b.close(stream=v))]:
        case(f"Buffer.{method}-stream-{label}", "Buffer", _buffer,
             lambda b, v=v, c=call: c(b, v), exc, "stream", state=_buffer_state)
for label, v in [("string", "0"), ("float", 0.0), ("object", Junk())]:
    case(f"Buffer.__dlpack__-stream-{label}", "Buffer", _buffer,
         lambda b, v=v: b.__dlpack__(stream=v), TypeError, "stream", state=_buffer_state)
case("Buffer.__dlpack__-max_version-int", "Buffer", _buffer,
     lambda b: b.__dlpack__(max_version=5), TypeError, "max_version", state=_buffer_state)
case("Buffer.__dlpack__-copy", "Buffer", _buffer, lambda b: b.__dlpack__(copy=True),
     BufferError, "copy", state=_buffer_state)
case("Buffer.__dlpack__-dl_device", "Buffer", _buffer,
     lambda b: b.__dlpack__(dl_device=(99, 7)), BufferError, "device", state=_buffer_state)
BUFFER_USES = {"ptr": lambda k: k.b.ptr, "copy_to_host": lambda k: k.b.copy_to_host(),
               "tobytes": lambda k: k.b.tobytes(), "bytes": lambda k: bytes(k.b),
               "copy_from_host": lambda k: k.b.copy_from_host(bytes(64)),
               "copy_from_device-self": lambda k: k.b.copy_from_device(k.other),
               "copy_from_device-other": lambda k: k.other.copy_from_device(k.b),
               "memset": lambda k: k.b.memset(1), "__enter__": lambda k: k.b.__enter__(),
               "__cuda_array_interface__": lambda k: k.b.__cuda_array_interface__,
               "__dlpack__": lambda k: k.b.__dlpack__(),
               "__dlpack_device__": lambda k: k.b.__dlpack_device__(),
               "pickle": lambda k: pickle.dumps(k.b)}
for label, use in BUFFER_USES.items():
    case(f"Buffer-closed-{label}", "Buffer",
         lambda: Kit(b=_closed(_buffer()), other=hmr.Buffer(64)), use, ValueError, "closed",
         state=lambda k: _buffer_state(k.b))

# ---- two devices (child process): a stream, a resource or a device of the other device -----------
case("set_per_device_resource-resource-of-other-device", "set_per_device_resource",
     lambda: hmr.AsyncMemoryResource(1), lambda a: hmr.set_per_device_resource(0, a),
     ValueError, "device", two_devices=True, state=_per_device_state)
case("set_current_device_resource-resource-of-other-device", "set_current_device_resource",
     _none, lambda _: hmr.set_current_device_resource(hmr.DeviceMemoryResource(1)), ValueError,
     "device", two_devices=True, state=_per_device_state)


def _other_device_stream() -> Any:
    with hmr.Device(1):
        return hmr.Stream()


case("Event.record-stream-of-other-device", "Event",
     lambda: (hmr.Event(), _other_device_stream()), lambda c: c[0].record(c[1]),
     ValueError, "stream.*device 1", two_devices=True)
case("Event.record-raw-handle-of-other-device", "Event",
     lambda: (hmr.Event(), _other_device_stream()), lambda c: c[0].record(c[1].handle),
     hmr.InvalidHandleError, "hipEventRecord", native=ANY, two_devices=True)
case("Stream-device-2-of-2", "Stream", _none, lambda _: hmr.Stream(device=2), ValueError,
     "device", two_devices=True)
case("MemoryPool.set_access-device-2-of-2", "MemoryPool", _async,
     lambda a: a.pool.set_access(2), ValueError, "device", two_devices=True, state=snapshot,
     serve=serve)

# ---- processes: pool handles and buffer descriptors ---------------------------------------------
def _ipc_handle() -> Any:
    return hmr.AsyncMemoryResource(enable_ipc=True).pool.export_handle()


case("IpcPoolHandle-fd-negative", "IpcPoolHandle", _none,
     lambda _: hmr.IpcPoolHandle(-1, 0, bytes(16)), ValueError, "fd")
case("IpcPoolHandle-pool_id-short", "IpcPoolHandle", _none,
     lambda _: hmr.IpcPoolHandle(0, 0, b"x"), ValueError, "pool_id")
case("IpcPoolHandle-pickle", "IpcPoolHandle", _ipc_handle, lambda h: pickle.dumps(h),
     TypeError, "multiprocessing", native=ANY)
case("IpcPoolHandle.receive-not-a-socket", "IpcPoolHandle", _none,
     lambda _: hmr.IpcPoolHandle.receive(Junk()), TypeError, "AF_UNIX")
case("IpcPoolHandle-closed-import", "IpcPoolHandle",
     lambda: _closed(_ipc_handle()), lambda h: hmr.AsyncMemoryResource.from_ipc(h),
     ValueError, "closed", native=ANY)
case("AsyncMemoryResource.from_ipc-not-a-handle", "AsyncMemoryResource", _none,
     lambda _: hmr.AsyncMemoryResource.from_ipc(Junk()), TypeError, "IpcPoolHandle")
case("IpcBufferDescriptor-kind", "IpcBufferDescriptor", _none,
     lambda _: hmr.IpcBufferDescriptor("disk", 0, 1, 0, bytes(16), bytes(64)), ValueError,
     "kind")
case("IpcBufferDescriptor.from_bytes-truncated", "IpcBufferDescriptor", _none,
     lambda _: hmr.IpcBufferDescriptor.from_bytes(b"HMRBUF01"), ValueError, "bytes")
case("IpcBufferDescriptor.from_bytes-int", "IpcBufferDescriptor", _none,
     lambda _: hmr.IpcBufferDescriptor.from_bytes(7), TypeError, "bytes-like")
case("Buffer.from_ipc-not-a-descriptor", "Buffer", _none,
     lambda _: hmr.Buffer.from_ipc(Junk()), TypeError, "IpcBufferDescriptor")
case("Buffer.copy-resource-junk", "Buffer", _buffer, lambda b: b.copy(resource=Junk()),
     TypeError, "resource", state=_buffer_state)
case("Buffer.export_ipc-host", "Buffer", lambda: hmr.Buffer(64, resource=hmr.HostMemoryResource()),
     lambda b: b.export_ipc(), hmr.NotSupportedError, "host memory")
case("Device.enable_peer_access-itself", "Device", _none,
     lambda _: hmr.Device(0).enable_peer_access(0), ValueError, "own peer")
case("Device.can_access_peer-string", "Device", _none,
     lambda _: hmr.Device(0).can_access_peer("1"), TypeError, "peer")


# ---- names with nothing to misuse -----------------------------------------------------------------
for name in ("HipError", "InvalidHandleError", "InvalidValueError", "LibraryNotFoundError",
             "NoDeviceError", "NotReadyError", "NotSupportedError", "OutOfMemoryError",
             "ForkedChildError"):
    EXEMPT[name] = "an exception class: constructed by the library, any arguments are kept"
EXEMPT["Property"] = "the base class (rejected as a property: see *-prop-base-class)"
EXEMPT["device_accessible"] = EXEMPT["host_accessible"] = "a property tag class, no arguments"
EXEMPT["AsyncResource"] = EXEMPT["Resource"] = "a typing.Protocol for type checkers"
EXEMPT["DEFAULT_ALIGNMENT"] = EXEMPT["MAX_RELEASE_THRESHOLD"] = "a constant"
EXEMPT["Statistics"] = EXEMPT["TrackedAllocation"] = "a frozen record the library fills"
# ---- reinitialize, logging of the per-device resources, device memory ----------------------
for label, kwargs, exc, match in [
        ("pool_allocator-int", dict(pool_allocator=1), TypeError, "pool_allocator"),
        ("managed_memory-string", dict(managed_memory="yes"), TypeError, "managed_memory"),
        ("logging-None", dict(logging=None), TypeError, "logging"),
        ("initial_pool_size-float", dict(initial_pool_size=1.5), ValueError, "initial_pool_size"),
        ("initial_pool_size-string", dict(initial_pool_size="1 lot"), ValueError,
         "initial_pool_size"),
        ("maximum_pool_size-negative", dict(maximum_pool_size=-1), ValueError,
         "maximum_pool_size"),
        ("initial-above-maximum", dict(pool_allocator=True, initial_pool_size="2MiB",
                                       maximum_pool_size="1MiB"), ValueError, "maximum_pool_size"),
        ("devices-string", dict(devices="0"), TypeError, "devices"),
        ("devices-empty", dict(devices=[]), ValueError, "devices"),
        ("devices-out-of-range", dict(devices=[0, 64]), ValueError, "devices"),
        ("log_file_name-int", dict(logging=True, log_file_name=3), TypeError, "log_file_name"),
        ("log_file_name-missing", dict(logging=True), ValueError, "log file name")]:
    case(f"reinitialize-{label}", "reinitialize", _none,
         lambda _, k=kwargs: hmr.reinitialize(**k), exc, match, state=_per_device_state)
case("register_reinitialize_hook-None", "register_reinitialize_hook", _none,
     lambda _: hmr.register_reinitialize_hook(None), TypeError, "callable")
for label, v, exc in [("int", 42, TypeError), ("empty", "", ValueError)]:
    case(f"enable_logging-log_file_name-{label}", "enable_logging", _none,
         lambda _, v=v: hmr.enable_logging(v), exc, "log_file_name|file name",
         state=_per_device_state)
for label, v, exc in BAD_DEVICES:
    case(f"available_device_memory-device-{label}", "available_device_memory", _none,
         lambda _, v=v: hmr.available_device_memory(v), exc, "device")
# ---- AMD memory: host registration, IPC events, system memory, host and managed pools -------
for label, args, kwargs, exc, match in [
        ("obj-string", ("text",), {}, TypeError, "buffer protocol"),
        ("obj-float", (1.5,), {}, TypeError, "buffer protocol"),
        ("address-without-size", (0x10000,), {}, TypeError, "size"),
        ("address-zero", (0, 16), {}, ValueError, "range"),
        ("size-zero", (bytearray(8), 0), {}, ValueError, "size"),
        ("size-too-large", (bytearray(8), 9), {}, ValueError, "size"),
        ("size-float", (bytearray(8), 2.0), {}, TypeError, "size"),
        ("empty", (bytearray(),), {}, ValueError, "no bytes"),
        ("read-only", (b"bytes",), {}, TypeError, "read_only"),
        ("not-contiguous", (memoryview(bytearray(16))[::2],), {}, ValueError, "contiguous"),
        ("portable-int", (bytearray(8),), {"portable": 1}, TypeError, "portable"),
        ("mapped-None", (bytearray(8),), {"mapped": None}, TypeError, "mapped")]:
    case(f"register_host-{label}", "register_host", _none,
         lambda _, a=args, k=kwargs: hmr.register_host(*a, **k), exc, match)
case("HostRegistration-constructor", "HostRegistration", _none,
     lambda _: hmr.HostRegistration(), TypeError, "register_host")
case("HostRegistration-closed-ptr", "HostRegistration",
     lambda: _closed(hmr.register_host(bytearray(64))), lambda r: r.ptr, ValueError, "closed")
for label, args, exc in [("short", (b"x" * 63, 0, 1), ValueError),
                         ("text", ("x" * 64, 0, 1), ValueError),
                         ("device-negative", (b"x" * 64, -1, 1), ValueError)]:
    case(f"IpcEventHandle-{label}", "IpcEventHandle", _none,
         lambda _, a=args: hmr.IpcEventHandle(*a), exc, "data|device")
case("Event.from_ipc-not-a-handle", "IpcEventHandle", _none,
     lambda _: hmr.Event.from_ipc(bytes(64)), TypeError, "IpcEventHandle")
case("Event.export_ipc-not-interprocess", "Event", hmr.Event, lambda e: e.export_ipc(),
     ValueError, "interprocess")
case("Event-interprocess-int", "Event", _none, lambda _: hmr.Event(interprocess=1), TypeError,
     "interprocess")
case("Event-flag-4-with-timing", "Event", _none, lambda _: hmr.Event(4), ValueError,
     "timing")
for name in ("SystemMemoryResource", "SamHeadroomMemoryResource"):
    args = () if name == "SystemMemoryResource" else (0,)
    case(f"{name}-no-pageable-access", name, _none,
         lambda _, n=name, a=args: getattr(hmr, n)(*a), hmr.NotSupportedError,
         "pageable memory access", native=QUERIES | {"hipDeviceGetAttribute"})
    case(f"{name}-device-string", name, _none,
         lambda _, n=name, a=args: getattr(hmr, n)(*a, device="0"), TypeError, "device")
case("SamHeadroomMemoryResource-headroom-negative", "SamHeadroomMemoryResource", _none,
     lambda _: hmr.SamHeadroomMemoryResource(-1), ValueError, "headroom")
case("SamHeadroomMemoryResource-headroom-None", "SamHeadroomMemoryResource", _none,
     lambda _: hmr.SamHeadroomMemoryResource(None), TypeError, "headroom")
for name in ("AsyncPinnedMemoryResource", "AsyncManagedMemoryResource"):
    # the emulated runtime (HIP 6.2) has neither pool: refused before any pool is created
    case(f"{name}-unsupported-here", name, _none, lambda _, n=name: getattr(hmr, n)(),
         hmr.NotSupportedError, "HIP 7.2|managed memory pools", emulated_only=True,
         native=QUERIES | {"hipRuntimeGetVersion"})
for label, call, exc, match in [
        ("advice-int", lambda b: b.advise(1), TypeError, "advice"),
        ("advice-unknown", lambda b: b.advise("fast"), ValueError, "advice"),
        ("advise-unset-int", lambda b: b.advise("read_mostly", unset=1), TypeError, "unset"),
        ("advise-not-managed", lambda b: b.advise("read_mostly"), ValueError, "managed"),
        ("discard-not-managed", lambda b: b.discard(), ValueError, "managed"),
        ("discard-stream-string", lambda b: b.discard("0"), TypeError, "stream")]:
    case(f"Buffer.{label}", "Buffer", _buffer, call, exc, match, state=_buffer_state)
case("DeviceMemoryResource-fine_grained-int", "DeviceMemoryResource", _none,
     lambda _: hmr.DeviceMemoryResource(fine_grained=1), TypeError, "fine_grained")
case("DeviceMemoryResource-uncached-None", "DeviceMemoryResource", _none,
     lambda _: hmr.DeviceMemoryResource(uncached=None), TypeError, "uncached")
EXEMPT["is_initialized"] = EXEMPT["disable_logging"] = EXEMPT["get_log_filenames"] = (
    "takes no argument")
EXEMPT["unregister_reinitialize_hook"] = "any object: removes the registrations equal to it"
EXEMPT["is_resource"] = EXEMPT["is_async_resource"] = (
    "a predicate: any object is a valid question (False for junk; see test_junk_never_crashes)")


# ================================================================================= the runner
def _collect(done: Callable[[], bool]) -> None:
    """Collect the young generations (cheap); everything only when that was not enough."""
    gc.collect(1)
    if not done():
        gc.collect()


def run_case(c: Case) -> None:
    """Run one case; AssertionError (with the reason) when it does not hold."""
    rt = _hip.get_runtime()
    emulator = getattr(rt, "emulator", None)
    from hipmr_ctypes.resources import per_device
    saved_table = per_device._resources
    per_device._resources = {}
    gc.collect(1)
    before_emulated = emulator.live_allocations() if emulator is not None else None
    try:
        with Spy(rt) as spy:
            ctx = c.make()
            state = c.state(ctx) if c.state else None
            live = set(spy.live)
            emulated = emulator.live_allocations() if emulator is not None else None
            del spy.calls[:]
            with pytest.raises(c.exc) as info:
                c.call(ctx)
            calls = list(spy.calls)
            message = str(info.value)
            assert re.search(c.match, message, re.I), (
                f"the message does not name {c.match!r}: {message!r}")
            if c.native is not ANY:
                made = [n for n in calls if n not in c.native]
                assert not made, f"native calls before the error: {made}"
            if spy.live != live:
                raise Leak(f"the runtime's live allocations changed: {live} -> {spy.live}")
            if emulator is not None and emulator.live_allocations() != emulated:
                raise Leak("emulated allocations changed")
            if c.state:
                assert c.state(ctx) == state, "the state changed"
            if c.serve:
                c.serve(ctx)
            if isinstance(ctx, Ctx):
                ctx.close()
            del ctx, info
            _collect(lambda: not spy.live)
            if spy.live:
                raise Leak(f"left live after the case: {sorted(map(hex, spy.live))}")
        if emulator is not None:
            _collect(lambda: emulator.live_allocations() == before_emulated)
            if emulator.live_allocations() != before_emulated:
                raise Leak("leaked emulated memory")
    finally:
        per_device._resources = saved_table


CASE_BY_ID = {c.id: c for c in CASES}
assert len(CASE_BY_ID) == len(CASES), "duplicate case ids"

_CHILD = textwrap.dedent("""
    import json, sys, traceback
    sys.path[:0] = [{tests!r}, {here!r}]   # support, then this file
    import test_bad_input as t
    results = {{}}
    for cid in json.loads(sys.argv[1]):
        try:
            t.run_case(t.CASE_BY_ID[cid])
            results[cid] = "ok"
        except BaseException as exc:
            results[cid] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    print(json.dumps(results))
""")


def run_in_child(ids: List[str], env_extra: Dict[str, str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO), **env_extra)
    code = _CHILD.format(tests=str(TESTS), here=os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", code, json.dumps(ids)], capture_output=True,
                          text=True, env=env, cwd=str(REPO), timeout=120)


class _ChildResults:
    def __init__(self, ids: List[str], env: Dict[str, str]) -> None:
        self.ids, self.env, self.results = ids, env, None

    def get(self, cid: str) -> str:
        if self.results is None:
            proc = run_in_child(self.ids, self.env)
            no_crash(proc)
            if proc.returncode != 0:
                self.results = {i: f"the child process died (rc={proc.returncode}): "
                                   f"{proc.stderr[-2000:]}" for i in self.ids}
            else:
                self.results = json.loads(proc.stdout.strip().splitlines()[-1])
        return self.results.get(cid, "not run")


_ISOLATED = _ChildResults([c.id for c in CASES if c.isolate and not c.two_devices], {})
_TWO_DEVICES = _ChildResults([c.id for c in CASES if c.two_devices],
                             {"HIPMR_EMULATED_DEVICES": "2", "HIPMR_EMULATED_MEMORY": "256MiB"})


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
@pytest.mark.reliability("bad_input_cases")
def test_bad_input(c: Case) -> None:
    platform = _hip.get_runtime().platform
    if c.two_devices:
        result = _TWO_DEVICES.get(c.id)
        assert result == "ok", result
        return
    if c.emulated_only and platform != "emulated":
        pytest.skip("only the emulated device tells this misuse apart safely")
    if c.isolate:  # in an emulated child process, whatever the platform here
        result = _ISOLATED.get(c.id)
        assert result == "ok", result
        return
    run_case(c)


def test_every_public_name_is_covered() -> None:
    covered = {c.target for c in CASES}
    missing = [n for n in hmr.__all__ if n not in covered and n not in EXEMPT]
    assert not missing, f"public names with no bad-input case: {missing}"
    stale = [n for n in covered | set(EXEMPT) if n not in hmr.__all__]
    assert not stale, f"cases for names not in __all__: {stale}"


# ================================================================================= junk
_JUNK_CHILD = textwrap.dedent(r"""
    import gc, inspect, io, itertools, json, os, sys, warnings
    warnings.simplefilter("ignore")
    import hipmr_ctypes as hmr
    JUNK = [None, True, -1, 0, 1, 4096, 2**64, -2**70, 1.5, float("nan"), "x", b"\x00", [], {},
            object(), hmr.Stream, hmr.DeviceMemoryResource, hmr.device_accessible]
    tried = 0
    def poke(fn, arity):
        global tried
        for n in range(arity + 1):
            combos = itertools.product(JUNK, repeat=n) if n <= 1 else (
                tuple(JUNK[(i * 7 + k * 3) % len(JUNK)] for k in range(n))
                for i in range(len(JUNK) * 3))
            for args in combos:
                tried += 1
                try:
                    out = fn(*args)
                    close = getattr(out, "close", None)
                    if callable(close) and not isinstance(out, type):
                        close()
                except Exception:
                    pass
    def arity(fn):
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return 2
        return min(4, sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                          p.POSITIONAL_OR_KEYWORD)))
    SKIP = {"synchronize"}
    for name in hmr.__all__:
        obj = getattr(hmr, name)
        if callable(obj) and name not in SKIP:
            poke(obj, arity(obj))
    a = hmr.AsyncMemoryResource()
    subjects = [hmr.DeviceMemoryResource(), a, hmr.PinnedMemoryResource(),
                hmr.ManagedMemoryResource(), hmr.HostMemoryResource(), hmr.PoolResource(a),
                hmr.FixedSizeResource(a, 4096, 2), hmr.BinningResource(a, [256]),
                hmr.LimitingResource(a, 1 << 20), hmr.StatisticsResource(a),
                hmr.TrackingResource(a), hmr.LoggingResource(a, io.StringIO()),
                hmr.AlignedResource(a, 4096), hmr.PrefetchResource(hmr.ManagedMemoryResource()),
                hmr.StatisticsResource(hmr.HostMemoryResource()),
                hmr.Stream(), hmr.Event(), hmr.Buffer(64), hmr.stream_ref(0), hmr.Device(0),
                a.pool, hmr.async_resource_ref(a)]
    for s in subjects:
        for attr in dir(s):
            if attr.startswith("_") and attr not in ("__dlpack__", "__enter__"):
                continue
            if attr in ("close", "release", "synchronize", "wait", "sync"):
                continue
            try:
                fn = getattr(s, attr)
            except Exception:
                continue
            if callable(fn) and not isinstance(fn, type):
                poke(fn, arity(fn))
    gc.collect()
    print(json.dumps({"tried": tried}))
""")


def test_junk_never_crashes(tmp_path: Path) -> None:
    """Every public callable and every public method of one of each object, called with junk
    in every position (a child process, in a scratch folder): exceptions only, never a
    crash, and the process exits cleanly."""
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO),
               HIPMR_EMULATED_MEMORY="256MiB")
    proc = subprocess.run([sys.executable, "-c", _JUNK_CHILD], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=180)
    no_crash(proc)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    tried = json.loads(proc.stdout.strip().splitlines()[-1])["tried"]
    assert tried > 1000
    JUNK_TRIED.append(tried)


#: how many junk calls ran (read by scripts/reliability_report.py through the pytest plugin)
JUNK_TRIED: List[int] = []
#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability(counters={"junk_calls": JUNK_TRIED})


# ================================================================= two devices: what is allowed
_TWO_DEVICE_USES = textwrap.dedent(r"""
    import ctypes
    import hipmr_ctypes as hmr
    from hipmr_ctypes import _hip
    from hipmr_ctypes._hip.types import hipPointerAttribute_t
    rt = _hip.get_runtime()
    def device_of(ptr):
        attrs = hipPointerAttribute_t()
        rt.check(rt.fn.hipPointerGetAttributes(attrs, ptr))
        return attrs.device
    with hmr.Device(1):
        s1, t1 = hmr.Stream(), hmr.Stream()
    s0 = hmr.Stream()
    assert hmr.get_device() == 0
    # a pool may serve a stream of another device (CUDA / HIP: "the specified memory pool may
    # be from a device different than that of the specified stream")
    a0 = hmr.AsyncMemoryResource(0)
    p = a0.allocate_async(1000, 256, s1)
    assert device_of(p) == 0
    a0.deallocate_async(p, 1000, 256, s1)
    print("async-pool-of-device-0-on-a-device-1-stream")
    d1 = hmr.DeviceMemoryResource(1)
    p = d1.allocate_async(1000, 256, s0)
    assert device_of(p) == 1 and hmr.get_device() == 0
    d1.deallocate_async(p, 1000, 256, s0)
    print("device-1-memory-freed-after-a-device-0-stream")
    # sub-allocators of device 1 used with device-1 streams from a thread on device 0: their
    # cross-stream events must be made on device 1
    for make in (lambda up: hmr.PoolResource(up), lambda up: hmr.FixedSizeResource(up, 4096, 4)):
        r = make(hmr.AsyncMemoryResource(1))
        p = r.allocate_async(1000, 256, s1)
        r.deallocate_async(p, 1000, 256, s1)
        q = r.allocate_async(1000, 256, t1)          # a block freed on s1, now on t1
        r.deallocate_async(q, 1000, 256, t1)
        h = r.allocate(1000)                          # on the host, after t1's work
        r.deallocate(h, 1000)
        r.release()
        print(type(r).__name__ + "-of-device-1-across-its-streams-from-device-0")
    b = hmr.Buffer.from_host(b"one" * 100, resource=hmr.AsyncMemoryResource(1), stream=s1)
    s1.synchronize()
    assert b.device == 1 and b.tobytes() == b"one" * 100
    other = hmr.Buffer(300, resource=hmr.DeviceMemoryResource(0))
    other.copy_from_device(b)
    assert other.tobytes() == b"one" * 100
    b.close(stream=t1)
    print("buffer-of-device-1-from-device-0")
""")

_TWO_DEVICE_EXPECTED = [
    "async-pool-of-device-0-on-a-device-1-stream", "device-1-memory-freed-after-a-device-0-stream",
    "PoolResource-of-device-1-across-its-streams-from-device-0",
    "FixedSizeResource-of-device-1-across-its-streams-from-device-0",
    "buffer-of-device-1-from-device-0"]


def test_streams_and_resources_of_another_device_that_are_allowed() -> None:
    """Not bad input: what the runtimes allow across devices works (child process with two
    emulated devices)."""
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO),
               HIPMR_EMULATED_DEVICES="2", HIPMR_EMULATED_MEMORY="256MiB")
    proc = subprocess.run([sys.executable, "-c", _TWO_DEVICE_USES], capture_output=True,
                          text=True, env=env, cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == _TWO_DEVICE_EXPECTED and proc.stderr == ""

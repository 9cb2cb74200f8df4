"""The per-device default resource from the environment: ``HIPMR_DEVICE_RESOURCE``.

Read at the first use of a device's resource (not at import), for each device that has none
set.  The spec is a kind, then options, separated by commas::

    device                                   DeviceMemoryResource (the default when unset)
    async,release_threshold=80%              AsyncMemoryResource, its pool keeping 80%
    virtual                                  VirtualMemoryResource (pause / resume)
    virtual_pool,pool=:90%                   VirtualPoolResource, mapping at most 90%
    device,pool=50%:90%,statistics,log=run.csv

kinds: ``device`` (``DeviceMemoryResource``), ``async`` (``AsyncMemoryResource``, a memory
pool of the runtime), ``managed`` (``ManagedMemoryResource``), ``system``
(``SystemMemoryResource``), ``sam_headroom`` (``SamHeadroomMemoryResource``, whose
``headroom=SIZE`` option is required), ``virtual`` (``VirtualMemoryResource``: memory that
can be paused and resumed at the same addresses) and ``virtual_pool``
(``VirtualPoolResource``: a pool that grows in place).  Options:

* ``pool``, ``pool=INITIAL`` or ``pool=INITIAL:MAXIMUM``: a ``PoolResource`` over the kind
  (``device``, ``managed`` and ``virtual``); for ``async``, the runtime pool's initial and maximum sizes;
  for ``virtual_pool``, its own;
* ``release_threshold=SIZE``: the runtime pool's (``async``), the pool's (``virtual_pool``);
* ``limit=SIZE``: a ``LimitingResource``;
* ``tracking``, ``statistics``: a ``TrackingResource``, a ``StatisticsResource``;
* ``log=PATH``: a ``LoggingResource`` writing ``PATH`` with ``.dev<N>`` before the extension.

They wrap in that order, the log outermost.  Sizes are the package's one size grammar
(``4GiB``, ``80%``, ``0.8``), a fraction being of that device's memory.  A bad spec is a
ValueError naming the variable, the part and what would be right, at the first use: its
grammar and fractions (a pool's initial fraction above its maximum) when it is read, its sizes
against each device's memory before anything is built; never a silent default.
``python -m hipmr_ctypes info`` and ``check`` report it (with a ``log=`` into a missing folder)
and exit 2, as for any misconfiguration.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

from ._device_sizes import resolve_size
from ._sizes import DeviceFraction, parse_size

__all__ = ["VARIABLE", "Spec", "parse_spec", "spec_from_environment", "build", "describe",
           "resolved_sizes", "check_environment"]

VARIABLE = "HIPMR_DEVICE_RESOURCE"
_KINDS = ("device", "async", "managed", "system", "sam_headroom", "virtual", "virtual_pool")
#: the kinds that are pools themselves: ``pool=`` gives their own sizes
_POOLS = ("async", "virtual_pool")
_FLAGS = ("tracking", "statistics")
_SIZE_OPTIONS = {"release_threshold": _POOLS, "limit": _KINDS,
                 "headroom": ("sam_headroom",)}
_GRAMMAR = ("a kind (device, async, managed, system, sam_headroom, virtual or virtual_pool) "
            "then options: "
            "pool[=INITIAL[:MAXIMUM]], release_threshold=SIZE, limit=SIZE, headroom=SIZE "
            "(sam_headroom), tracking, statistics, log=PATH")
_SizeValue = Union[int, DeviceFraction]


class Spec:
    """A parsed ``HIPMR_DEVICE_RESOURCE``: what to build for each device."""

    __slots__ = ("text", "kind", "pool", "sizes", "flags", "log", "parts")

    def __init__(self, text: str, kind: str) -> None:
        self.text = text
        self.kind = kind
        #: (initial, maximum) of a PoolResource (of the runtime pool for async), or None
        self.pool: Optional[Tuple[Optional[_SizeValue], Optional[_SizeValue]]] = None
        self.sizes: Dict[str, _SizeValue] = {}   # release_threshold, limit
        self.flags: List[str] = []                # tracking, statistics
        self.log: Optional[str] = None
        #: each option's part of the text ("pool", "limit", ...), for the errors that name it
        self.parts: Dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Spec({self.text!r})"


def _error(text: str, part: str, problem: str) -> ValueError:
    return ValueError(f"{VARIABLE}={text!r}: {part!r}: {problem}; expected {_GRAMMAR} "
                      "(for example 'async,release_threshold=80%' or "
                      "'device,pool=50%:90%,statistics')")


def _size(text: str, part: str, value: str) -> _SizeValue:
    try:
        size = parse_size(value)
    except (TypeError, ValueError) as exc:
        raise _error(text, part, str(exc)) from None
    if isinstance(size, int) and not 0 <= size <= 1 << 63:
        raise _error(text, part, f"{size} is not a size in [0, 2**63]")
    return size


def parse_spec(text: str) -> Spec:
    """``text`` (the variable's value) parsed; ValueError naming the part that is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"{VARIABLE} must be a str, not {type(text).__name__}")
    parts = [p.strip() for p in text.split(",")]
    kind = parts[0].lower()
    if kind not in _KINDS:
        raise _error(text, parts[0], "the first part is the kind: device, async, managed, "
                                     "system, sam_headroom, virtual or virtual_pool")
    spec = Spec(text, kind)
    seen = set()
    for part in parts[1:]:
        name, eq, value = part.partition("=")
        name = name.strip().lower()
        value = value.strip()
        if not name:
            raise _error(text, part, "an empty option")
        if name in seen:
            raise _error(text, part, f"{name} is given twice")
        seen.add(name)
        spec.parts[name] = part
        if name == "pool":
            if not eq:
                spec.pool = (None, None)
                continue
            initial, colon, maximum = value.partition(":")
            spec.pool = (_size(text, part, initial) if initial.strip() else None,
                         _size(text, part, maximum) if colon and maximum.strip() else None)
            if colon and not maximum.strip():
                raise _error(text, part, "nothing after ':' (pool=INITIAL:MAXIMUM)")
            first, second = spec.pool
            if ((type(first) is int and type(second) is int and first > second)
                    or (isinstance(first, DeviceFraction) and isinstance(second, DeviceFraction)
                        and first.fraction > second.fraction)):
                raise _error(text, part, f"the initial size {initial.strip()} is larger than "
                                         f"the maximum {maximum.strip()}")
        elif name in _SIZE_OPTIONS:
            if kind not in _SIZE_OPTIONS[name]:
                raise _error(text, part, f"{name} is an option of "
                                         f"{' and '.join(_SIZE_OPTIONS[name])} only")
            if not eq or not value:
                raise _error(text, part, f"{name} needs a size ({name}=SIZE)")
            spec.sizes[name] = _size(text, part, value)
        elif name in _FLAGS:
            if eq:
                raise _error(text, part, f"{name} takes no value")
            spec.flags.append(name)
        elif name == "log":
            if not value:
                raise _error(text, part, "log needs a file name (log=PATH)")
            spec.log = value
        else:
            raise _error(text, part, f"unknown option {name!r}")
    if kind == "sam_headroom" and "headroom" not in spec.sizes:
        raise _error(text, parts[0], "sam_headroom needs headroom=SIZE")
    return spec


def spec_from_environment() -> Optional[Spec]:
    """The spec ``HIPMR_DEVICE_RESOURCE`` names now (None when unset or empty)."""
    text = os.environ.get(VARIABLE, "").strip()
    return parse_spec(text) if text else None


def build(spec: Spec, device: int) -> Any:
    """The resource ``spec`` describes for ``device`` (built while it is current); a failure
    while building closes what was made."""
    from .adaptors.limiting import LimitingResource
    from .adaptors.logging import LoggingResource
    from .adaptors.pool import PoolResource
    from .adaptors.statistics_resource import StatisticsResource
    from .adaptors.tracking import TrackingResource
    from .adaptors.virtual_pool import VirtualPoolResource
    from .device import Device
    from .initialization import log_file_for
    from .resources.async_memory import AsyncMemoryResource
    from .resources.device_memory import DeviceMemoryResource
    from .resources.managed import ManagedMemoryResource
    from .resources.system import SamHeadroomMemoryResource, SystemMemoryResource
    from .resources.virtual import VirtualMemoryResource

    sizes = resolved_sizes(spec, device)

    def size(name: str, value: Optional[_SizeValue]) -> Optional[int]:
        return sizes.get(name)

    with Device(device):
        mr: Any
        if spec.kind in ("async", "virtual_pool"):   # a pool of its own: the same sizes
            initial, maximum = spec.pool or (None, None)
            pooled = AsyncMemoryResource if spec.kind == "async" else VirtualPoolResource
            mr = pooled(
                device, initial_pool_size=size("initial_pool_size", initial),
                maximum_pool_size=size("maximum_pool_size", maximum),
                release_threshold=size("release_threshold", spec.sizes.get("release_threshold")))
        elif spec.kind == "managed":
            mr = ManagedMemoryResource()
        elif spec.kind == "system":
            mr = SystemMemoryResource(device)
        elif spec.kind == "sam_headroom":
            mr = SamHeadroomMemoryResource(size("headroom", spec.sizes["headroom"]), device)
        elif spec.kind == "virtual":
            mr = VirtualMemoryResource(device)
        else:
            mr = DeviceMemoryResource(device)
        if spec.pool is not None and spec.kind not in _POOLS:
            mr = PoolResource(mr, size("initial_pool_size", spec.pool[0]),
                              size("maximum_pool_size", spec.pool[1]))
        if "limit" in spec.sizes:
            mr = LimitingResource(mr, sizes["limit"])
        if "tracking" in spec.flags:
            mr = TrackingResource(mr)
        if "statistics" in spec.flags:
            mr = StatisticsResource(mr)
        if spec.log is not None:
            mr = LoggingResource(mr, log_file_for(spec.log, device))
    return mr


def resolved_sizes(spec: Spec, device: int) -> Dict[str, int]:
    """The sizes of ``spec`` in bytes on ``device`` (``initial_pool_size``,
    ``maximum_pool_size``, ``release_threshold``, ``limit``: those it gives), checked together
    (an initial pool size above the maximum); ValueError naming the variable and the part."""
    named: List[Tuple[str, str, Optional[_SizeValue]]] = []
    if spec.pool is not None:
        named += [("initial_pool_size", "pool", spec.pool[0]),
                  ("maximum_pool_size", "pool", spec.pool[1])]
    named += [(name, name, value) for name, value in spec.sizes.items()]
    out: Dict[str, int] = {}
    for name, option, value in named:
        if value is None:
            continue
        try:
            out[name] = resolve_size(value, name, device)
        except (TypeError, ValueError) as exc:
            raise _error(spec.text, spec.parts.get(option, option), f"on device {device}: "
                         f"{exc}") from None
    first, most = out.get("initial_pool_size"), out.get("maximum_pool_size")
    if first is not None and most is not None and first > most:
        raise _error(spec.text, spec.parts.get("pool", "pool"),
                     f"on device {device} the initial size ({first} bytes) is larger than the "
                     f"maximum ({most} bytes)")
    return out


def log_problem(spec: Spec) -> Optional[str]:
    """Why ``spec``'s ``log=`` cannot be written (its folder is missing or not a folder), or
    None."""
    if spec.log is None:
        return None
    folder = os.path.dirname(os.path.abspath(spec.log))
    if os.path.isdir(folder):
        return None
    what = "is not a folder" if os.path.exists(folder) else "does not exist"
    return f"the log's folder {folder!r} {what}"


def check_environment(devices: int) -> Optional[str]:
    """What is wrong with ``HIPMR_DEVICE_RESOURCE`` on this machine, as one message naming
    the variable and the part (its grammar; its sizes on each of the first ``devices``
    devices; its log's folder), or None when it is unset or good.  Builds nothing."""
    try:
        spec = spec_from_environment()
        if spec is None:
            return None
        problem = log_problem(spec)
        if problem is not None:
            return str(_error(spec.text, spec.parts["log"], problem)).partition("; expected")[0]
        for device in range(devices):
            resolved_sizes(spec, device)
    except ValueError as exc:
        return str(exc)
    return None


def default_resource(device: int) -> Any:
    """The per-device default of ``device``: what ``HIPMR_DEVICE_RESOURCE`` says, else a
    ``DeviceMemoryResource``."""
    spec = spec_from_environment()
    if spec is None:
        from .resources.device_memory import DeviceMemoryResource
        return DeviceMemoryResource(device)
    return build(spec, device)


def describe(devices: int = 0) -> Dict[str, Any]:
    """What ``info`` shows of the configuration: the default resource and where it comes
    from (``{"source", "spec", "error"?}``); ``error`` is :func:`check_environment`'s for
    the first ``devices`` devices."""
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return {"source": "default", "spec": "device",
                "detail": f"DeviceMemoryResource per device ({VARIABLE} unset)"}
    try:
        spec = parse_spec(text)
    except ValueError as exc:
        return {"source": VARIABLE, "spec": text, "error": str(exc)}
    error = check_environment(devices)
    layers = [{"device": "DeviceMemoryResource", "async": "AsyncMemoryResource",
               "managed": "ManagedMemoryResource", "system": "SystemMemoryResource",
               "sam_headroom": "SamHeadroomMemoryResource",
               "virtual": "VirtualMemoryResource",
               "virtual_pool": "VirtualPoolResource"}[spec.kind]]
    if spec.pool is not None and spec.kind not in _POOLS:
        layers.append("PoolResource")
    if "limit" in spec.sizes:
        layers.append("LimitingResource")
    layers += [{"tracking": "TrackingResource", "statistics": "StatisticsResource"}[f]
               for f in ("tracking", "statistics") if f in spec.flags]
    if spec.log is not None:
        layers.append("LoggingResource")
    described = {"source": VARIABLE, "spec": text, "detail": " <- ".join(reversed(layers))}
    if error is not None:
        described["error"] = error
    return described

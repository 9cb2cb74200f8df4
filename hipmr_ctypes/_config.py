"""The per-device default resource from the environment: ``HIPMR_DEVICE_RESOURCE``.

Read at the first use of a device's resource (not at import), for each device that has none
set.  The spec is a kind, then options, separated by commas::

    device                                   DeviceMemoryResource (the default when unset)
    async,release_threshold=80%              AsyncMemoryResource, its pool keeping 80%
    virtual                                  VirtualMemoryResource (pause / resume)
    device,pool=50%:90%,statistics,log=run.csv

kinds: ``device`` (``DeviceMemoryResource``), ``async`` (``AsyncMemoryResource``, a memory
pool of the runtime), ``managed`` (``ManagedMemoryResource``), ``virtual``
(``VirtualMemoryResource``: memory that can be paused and resumed at the same addresses).  Options:

* ``pool``, ``pool=INITIAL`` or ``pool=INITIAL:MAXIMUM``: a ``PoolResource`` over the kind
  (``device``, ``managed`` and ``virtual``); for ``async``, the runtime pool's initial and maximum sizes;
* ``release_threshold=SIZE``: the runtime pool's (``async``);
* ``limit=SIZE``: a ``LimitingResource``;
* ``tracking``, ``statistics``: a ``TrackingResource``, a ``StatisticsResource``;
* ``log=PATH``: a ``LoggingResource`` writing ``PATH`` with ``.dev<N>`` before the extension.

They wrap in that order, the log outermost.  Sizes are the package's one size grammar
(``4GiB``, ``80%``, ``0.8``), a fraction being of that device's memory.  A bad spec is a
ValueError naming the variable, the part and what would be right, at the first use (and in
``python -m hipmr_ctypes check``); never a silent default.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

from ._device_sizes import resolve_size
from ._sizes import DeviceFraction, parse_size

__all__ = ["VARIABLE", "Spec", "parse_spec", "spec_from_environment", "build", "describe"]

VARIABLE = "HIPMR_DEVICE_RESOURCE"
_KINDS = ("device", "async", "managed", "virtual")
_FLAGS = ("tracking", "statistics")
_SIZE_OPTIONS = {"release_threshold": ("async",), "limit": _KINDS}
_GRAMMAR = ("a kind (device, async, managed or virtual) then options: pool[=INITIAL[:MAXIMUM]], "
            "release_threshold=SIZE, limit=SIZE, tracking, statistics, log=PATH")
_SizeValue = Union[int, DeviceFraction]


class Spec:
    """A parsed ``HIPMR_DEVICE_RESOURCE``: what to build for each device."""

    __slots__ = ("text", "kind", "pool", "sizes", "flags", "log")

    def __init__(self, text: str, kind: str) -> None:
        self.text = text
        self.kind = kind
        #: (initial, maximum) of a PoolResource (of the runtime pool for async), or None
        self.pool: Optional[Tuple[Optional[_SizeValue], Optional[_SizeValue]]] = None
        self.sizes: Dict[str, _SizeValue] = {}   # release_threshold, limit
        self.flags: List[str] = []                # tracking, statistics
        self.log: Optional[str] = None

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
        raise _error(text, parts[0],
                     "the first part is the kind: device, async, managed or virtual")
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
            if type(first) is int and type(second) is int and first > second:
                raise _error(text, part, f"the initial size {first} is larger than the "
                                         f"maximum {second}")
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
    from .device import Device
    from .initialization import log_file_for
    from .resources.async_memory import AsyncMemoryResource
    from .resources.device_memory import DeviceMemoryResource
    from .resources.managed import ManagedMemoryResource
    from .resources.virtual import VirtualMemoryResource

    def size(name: str, value: Optional[_SizeValue]) -> Optional[int]:
        return None if value is None else resolve_size(value, name, device)

    with Device(device):
        mr: Any
        if spec.kind == "async":
            initial, maximum = spec.pool or (None, None)
            mr = AsyncMemoryResource(
                device, initial_pool_size=size("initial_pool_size", initial),
                maximum_pool_size=size("maximum_pool_size", maximum),
                release_threshold=size("release_threshold", spec.sizes.get("release_threshold")))
        elif spec.kind == "managed":
            mr = ManagedMemoryResource()
        elif spec.kind == "virtual":
            mr = VirtualMemoryResource(device)
        else:
            mr = DeviceMemoryResource(device)
        if spec.pool is not None and spec.kind != "async":
            mr = PoolResource(mr, size("initial_pool_size", spec.pool[0]),
                              size("maximum_pool_size", spec.pool[1]))
        if "limit" in spec.sizes:
            mr = LimitingResource(mr, resolve_size(spec.sizes["limit"], "limit", device))
        if "tracking" in spec.flags:
            mr = TrackingResource(mr)
        if "statistics" in spec.flags:
            mr = StatisticsResource(mr)
        if spec.log is not None:
            mr = LoggingResource(mr, log_file_for(spec.log, device))
    return mr


def default_resource(device: int) -> Any:
    """The per-device default of ``device``: what ``HIPMR_DEVICE_RESOURCE`` says, else a
    ``DeviceMemoryResource``."""
    spec = spec_from_environment()
    if spec is None:
        from .resources.device_memory import DeviceMemoryResource
        return DeviceMemoryResource(device)
    return build(spec, device)


def describe() -> Dict[str, Any]:
    """What ``info`` shows of the configuration: the default resource and where it comes
    from (``{"source", "spec", "error"?}``)."""
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return {"source": "default", "spec": "device",
                "detail": f"DeviceMemoryResource per device ({VARIABLE} unset)"}
    try:
        spec = parse_spec(text)
    except ValueError as exc:
        return {"source": VARIABLE, "spec": text, "error": str(exc)}
    layers = [{"device": "DeviceMemoryResource", "async": "AsyncMemoryResource",
               "managed": "ManagedMemoryResource", "virtual": "VirtualMemoryResource"}[spec.kind]]
    if spec.pool is not None and spec.kind != "async":
        layers.append("PoolResource")
    if "limit" in spec.sizes:
        layers.append("LimitingResource")
    layers += [{"tracking": "TrackingResource", "statistics": "StatisticsResource"}[f]
               for f in ("tracking", "statistics") if f in spec.flags]
    if spec.log is not None:
        layers.append("LoggingResource")
    return {"source": VARIABLE, "spec": text, "detail": " <- ".join(reversed(layers))}

"""Process-wide set-up as RMM spells it: ``reinitialize`` (with hooks), ``is_initialized``,
``enable_logging`` / ``disable_logging`` / ``get_log_filenames`` and
``available_device_memory``, all working on the per-device resources
(``get_per_device_resource`` / ``set_per_device_resource``).

Every argument is checked before anything changes; a failure while the new resources are
built (out of memory for an initial pool, a log file that cannot be opened) leaves the
per-device resources as they were.
"""
from __future__ import annotations

import os
import threading
from typing import (Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar,
                    Union)

from ._device_sizes import parse_config_size, resolve_size
from ._sizes import DeviceFraction, Size
from .adaptors.logging import LoggingResource
from .adaptors.pool import PoolResource
from .device import Device, check_device, get_device
from .resources import per_device
from .resources.device_memory import DeviceMemoryResource
from .resources.managed import ManagedMemoryResource

__all__ = ["reinitialize", "is_initialized", "register_reinitialize_hook",
           "unregister_reinitialize_hook", "enable_logging", "disable_logging",
           "get_log_filenames", "available_device_memory", "LOG_FILE_VARIABLES"]

#: Environment variables naming the log file when none is given, in the order they are read.
LOG_FILE_VARIABLES = ("HIPMR_LOG_FILE", "RMM_LOG_FILE")

_F = TypeVar("_F", bound=Callable[..., Any])
_PathLike = Union[str, "os.PathLike[str]"]

_lock = threading.RLock()   # one reinitialize / enable / disable at a time
_hooks: List[Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]] = []


# ---- hooks -------------------------------------------------------------------------------------
def register_reinitialize_hook(func: _F, *args: Any, **kwargs: Any) -> _F:
    """Call ``func(*args, **kwargs)`` at the start of every :func:`reinitialize`, before the
    per-device resources are replaced: a library that caches device memory releases it there.
    Hooks run newest first; one that raises stops ``reinitialize`` before anything changed.
    Returns ``func`` (usable as a decorator when there are no arguments)."""
    if not callable(func):
        raise TypeError(f"a reinitialize hook must be callable, not {type(func).__name__}")
    with _lock:
        _hooks.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func: Callable[..., Any]) -> None:
    """Remove every registration of ``func`` (nothing happens when it has none)."""
    with _lock:
        _hooks[:] = [hook for hook in _hooks if hook[0] != func]


# ---- reinitialize ------------------------------------------------------------------------------
def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _device_list(devices: Any) -> List[int]:
    if devices is None:
        return [0]
    if isinstance(devices, (str, bytes)):
        raise TypeError(f"devices must be a device ordinal or a list of them, not "
                        f"{type(devices).__name__}")
    try:
        items: Iterable[Any] = iter(devices)
    except TypeError:
        items = [devices]
    ordinals: List[int] = []
    for device in items:
        ordinal = check_device(device, "devices")
        if ordinal not in ordinals:
            ordinals.append(ordinal)
    if not ordinals:
        raise ValueError("devices is empty: name at least one device")
    return ordinals


def _log_base(log_file_name: Optional[_PathLike]) -> str:
    if log_file_name is None:
        for variable in LOG_FILE_VARIABLES:
            value = os.environ.get(variable)
            if value:
                return value
        raise ValueError("logging needs a log file name: pass log_file_name or set "
                         f"{' or '.join(LOG_FILE_VARIABLES)}")
    if not isinstance(log_file_name, (str, os.PathLike)):
        raise TypeError(f"log_file_name must be a str or path, not "
                        f"{type(log_file_name).__name__}")
    name = os.fspath(log_file_name)
    if not isinstance(name, str) or not name:
        raise ValueError(f"log_file_name={log_file_name!r} is not a file name")
    return name


def log_file_for(base: str, device: int) -> str:
    """The log file of ``device``: ``.dev<N>`` added before the extension, ``.csv`` when the
    name has none (``rmm_log.csv`` -> ``rmm_log.dev0.csv``, ``run`` -> ``run.dev0.csv``)."""
    root, ext = os.path.splitext(base)
    return f"{root}.dev{device}{ext or '.csv'}"


def _resolved(size: Union[None, int, DeviceFraction], name: str, device: int) -> Optional[int]:
    return None if size is None else resolve_size(size, name, device)


def reinitialize(pool_allocator: bool = False, managed_memory: bool = False,
                 initial_pool_size: Optional[Size] = None,
                 maximum_pool_size: Optional[Size] = None,
                 devices: Union[int, Device, Sequence[Union[int, Device]]] = 0,
                 logging: bool = False, log_file_name: Optional[_PathLike] = None) -> None:
    """Replace the per-device resources with new ones, as ``rmm.reinitialize`` does.

    For each of ``devices`` (an ordinal, a ``Device`` or a list of them; default 0), built
    while that device is current: a :class:`DeviceMemoryResource` (``ManagedMemoryResource``
    with ``managed_memory=True``), under a :class:`PoolResource` of ``initial_pool_size`` /
    ``maximum_pool_size`` with ``pool_allocator=True`` (sizes as ints or strings such as
    ``"4GiB"``; ignored without a pool), under a :class:`LoggingResource` writing
    ``<log_file_name>.dev<N>.csv`` (the extension kept if the name has one) with
    ``logging=True``; ``log_file_name`` defaults to ``$HIPMR_LOG_FILE``, then
    ``$RMM_LOG_FILE``.  The registered hooks run first (newest first); then every per-device
    resource is forgotten (devices not listed get the default again on first use; the logs of
    the forgotten ones are flushed) and the new ones are set.  Memory from the previous resources stays valid: each buffer holds its
    resource.  Returns None.
    """
    pool = _check_bool(pool_allocator, "pool_allocator")
    managed = _check_bool(managed_memory, "managed_memory")
    log = _check_bool(logging, "logging")
    initial = None if initial_pool_size is None else parse_config_size(initial_pool_size,
                                                                        "initial_pool_size")
    maximum = None if maximum_pool_size is None else parse_config_size(maximum_pool_size,
                                                                        "maximum_pool_size")
    if type(initial) is int and type(maximum) is int and initial > maximum:
        raise ValueError(f"initial_pool_size={initial_pool_size!r} ({initial} bytes) is larger "
                         f"than maximum_pool_size={maximum_pool_size!r} ({maximum} bytes)")
    ordinals = _device_list(devices)
    base = _log_base(log_file_name) if log else None
    with _lock:
        for func, args, kwargs in reversed(list(_hooks)):
            func(*args, **kwargs)
        built: Dict[int, Any] = {}
        try:
            for device in ordinals:
                with Device(device):
                    mr: Any = ManagedMemoryResource() if managed else DeviceMemoryResource(device)
                    if pool:
                        mr = PoolResource(mr, _resolved(initial, "initial_pool_size", device),
                                          _resolved(maximum, "maximum_pool_size", device))
                    if base is not None:
                        mr = LoggingResource(mr, log_file_for(base, device))
                built[device] = mr
        except BaseException:
            for mr in built.values():
                if isinstance(mr, LoggingResource):
                    mr.close()
            raise
        previous = per_device._replace_all(built)
    for mr in previous.values():  # still used by the buffers it made: flushed, not closed
        if isinstance(mr, LoggingResource):
            mr.flush()


def is_initialized() -> bool:
    """True once a resource is set (or was made on first use) for some device."""
    return bool(per_device._resources)


# ---- logging of the per-device resources -------------------------------------------------------
def enable_logging(log_file_name: Optional[_PathLike] = None) -> None:
    """Wrap each per-device resource that is not already a :class:`LoggingResource` in one
    writing ``<log_file_name>.dev<N>.csv`` (see :func:`reinitialize`); with no per-device
    resource yet, the current device's.  ``log_file_name`` defaults to ``$HIPMR_LOG_FILE``,
    then ``$RMM_LOG_FILE`` (ValueError when neither is set).  All or nothing: when a log cannot
    be opened (or a resource cannot be set), no resource is wrapped, the logs already opened
    are closed and the error is raised."""
    base = _log_base(log_file_name)
    with _lock:
        devices = sorted(per_device._resources) or [get_device()]
        current = {device: per_device.get_per_device_resource(device) for device in devices}
        # every log opened first, then every resource set in one step: all or nothing
        built: Dict[int, Any] = {}
        try:
            for device, mr in current.items():
                if not isinstance(mr, LoggingResource):
                    built[device] = LoggingResource(mr, log_file_for(base, device))
            _set_all(built)
        except BaseException:
            for mr in built.values():
                mr.close()
            raise


def _set_all(resources: Dict[int, Any]) -> None:
    """Set several per-device resources in one step: each is checked first, so that a bad one
    changes nothing."""
    for device, mr in resources.items():
        per_device._check_resource(mr, device)
    with per_device._lock:
        per_device._resources.update(resources)
        per_device._changed()


def disable_logging() -> None:
    """Put back the resource under each per-device :class:`LoggingResource` (its log is
    flushed; it stays open for buffers allocated through it, which still free through it)."""
    with _lock:
        logging = {device: mr for device, mr in sorted(per_device._resources.items())
                   if isinstance(mr, LoggingResource)}
        for mr in logging.values():
            mr.flush()
        _set_all({device: mr.upstream for device, mr in logging.items()})   # in one step


def get_log_filenames() -> Dict[int, Optional[str]]:
    """``{device: log file name, or None when that device's resource does not log}`` for
    every device with a per-device resource."""
    return {device: mr.get_file_name() if isinstance(mr, LoggingResource) else None
            for device, mr in sorted(per_device._resources.items())}


def available_device_memory(device: Optional[Union[int, Device]] = None) -> Tuple[int, int]:
    """``(free, total)`` bytes of ``device`` (default: the current one)."""
    return Device(device).memory_info()

"""Dask (``distributed``) workers with hipmr_ctypes: a worker plugin, Buffer serialization and
per-worker statistics.  Importing this module imports ``distributed`` (nothing else in the
package does).

* :class:`ResourceSetup` is a ``distributed.WorkerPlugin`` that gives each worker its own
  resource on its own device, as dask-cuda's ``RMMSetup`` does for RMM:
  ``client.register_plugin(ResourceSetup(pool_allocator=True, initial_pool_size="50%"))``.
  Every setting is checked when the plugin is made, before any worker is touched.
* Importing the module registers :class:`~hipmr_ctypes.Buffer` with distributed's ``dask``
  serialization family (the bytes through the host) and, where distributed has it, the
  ``cuda`` family (the Buffer itself as the frame, for a transport that moves device memory,
  such as UCX).  A Buffer sent to a worker or returned to the client arrives as a Buffer with
  the same bytes, allocated on the receiving side (a worker's plugin resource, else the
  current device's resource).  Workers import the module when they unpickle the plugin; a
  client that receives Buffers imports it itself.
* :func:`statistics` reads every worker's allocation counters in one call, and the plugin
  feeds the worker's heartbeat metrics (``"hipmr"``, and ``"rmm"`` where RMM does not) that
  the scheduler keeps per worker and the dashboard's GPU memory plot reads.
"""
# pyright: reportMissingImports=false, reportUntypedBaseClass=false
# (distributed is optional: this module is imported only where it is installed)
from __future__ import annotations

import concurrent.futures
import importlib
import os
import re
import threading
from typing import Any, Dict, List, Optional, Tuple, Union

import distributed

from .._device_sizes import parse_config_size, resolve_size
from .._sizes import DeviceFraction
from ..adaptors.limiting import LimitingResource
from ..adaptors.logging import LoggingResource
from ..adaptors.pool import PoolResource
from ..adaptors.statistics_resource import Statistics, StatisticsResource
from ..adaptors.tracking import TrackingResource
from ..buffer import Buffer
from ..device import Device, device_count, set_device
from ..resource_refs import upstream_chain
from ..resources import per_device
from ..resources.async_memory import AsyncMemoryResource
from ..resources.device_memory import DeviceMemoryResource
from ..resources.managed import ManagedMemoryResource


__all__ = ["ResourceSetup", "statistics", "worker_device", "VISIBLE_DEVICES_VARIABLES"]

#: The variables that, set in a worker's environment on a real platform, mean "this worker sees
#: its own GPU as device 0" (dask-cuda sets ``CUDA_VISIBLE_DEVICES`` so for each worker).
VISIBLE_DEVICES_VARIABLES: Tuple[str, ...] = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                             "ROCR_VISIBLE_DEVICES")

#: A size setting: bytes (an int or a size string such as ``"4GiB"``), or a fraction of the
#: device's memory (a float ``0 < x <= 1`` or a string such as ``"80%"``).
SizeSetting = Union[int, float, str]

_lock = threading.Lock()
#: what the plugin installed in this worker process: {"device", "resource", "previous" (the
#: device's resource before), "log" (the log file or None)}; empty before set-up and after
#: teardown
_installed: Dict[str, Any] = {}


# ---- settings ----------------------------------------------------------------------------------
def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _size_setting(value: Any, name: str) -> Union[None, int, DeviceFraction]:
    """``None``, bytes, or a fraction of the device's memory (the package's one size grammar,
    ``docs/resources.md``); TypeError / ValueError naming ``name`` for anything else."""
    return None if value is None else parse_config_size(value, name)


def _resolve(setting: Union[None, int, DeviceFraction], name: str,
             device: int) -> Optional[int]:
    """The bytes a checked setting names on ``device`` (a fraction of its total memory,
    rounded down to a multiple of 256 bytes)."""
    return None if setting is None else resolve_size(setting, name, device)


def _worker_label(worker: Any) -> str:
    """The worker's name (its address when it has none) in a file name, one label per name:
    an int name (LocalCluster's 0, 1, ...) as its digits; any other name made safe (letters,
    digits, ``_ . -``; at most 64 characters) and followed by ``-`` and 12 hex digits of a
    hash of the exact name, so ``gpu/0``, ``gpu:0``, ``gpu 0``, ``gpu_0`` and ``GPU_0`` (on a
    file system that ignores case) never share a file."""
    name = getattr(worker, "name", None)
    if name is None or name == "":
        name = getattr(worker, "address", "worker")
    if type(name) is int:
        return str(name)
    import hashlib
    exact = name if isinstance(name, str) else f"{type(name).__name__}:{name!r}"
    digest = hashlib.sha256(exact.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).strip("._")[:64] or "worker"
    return f"{safe}-{digest}"


# ---- the plugin --------------------------------------------------------------------------------
class ResourceSetup(distributed.WorkerPlugin):  # type: ignore[misc,unused-ignore]
    """A worker plugin giving each worker its own resource on its own device, as dask-cuda's
    ``RMMSetup``: ``client.register_plugin(ResourceSetup(...))``.

    The names are :func:`hipmr_ctypes.reinitialize`'s, plus dask-cuda's:

    * ``pool_allocator``: a :class:`PoolResource` of ``initial_pool_size`` /
      ``maximum_pool_size`` over the device's memory (``managed_memory=True``: managed memory).
    * ``async_allocator``: an :class:`AsyncMemoryResource` (the driver's memory pool) made with
      ``initial_pool_size`` and ``release_threshold``, under a :class:`LimitingResource` of
      ``maximum_pool_size`` when that is given.  Not with ``pool_allocator`` or
      ``managed_memory``.
    * Neither: a :class:`DeviceMemoryResource` (``ManagedMemoryResource`` with
      ``managed_memory=True``); the sizes and ``release_threshold`` are then refused.
    * Sizes: bytes (an int or a string such as ``"4GiB"``), or a fraction of the worker's
      device memory (a float ``0 < x <= 1``, or ``"80%"``), resolved on each worker.
    * ``logging`` / ``log_directory`` / ``log_file_name``: a :class:`LoggingResource` writing
      one CSV log per worker, ``<log_directory>/<stem>.<worker name>.csv`` (``stem`` from
      ``log_file_name``, default ``hipmr_log``; a ``log_file_name`` with a directory and no
      ``log_directory`` names the directory too).  ``log_directory`` alone turns logging on.
    * ``tracking``: a :class:`TrackingResource` over that; ``statistics``: a
      :class:`StatisticsResource` on top, which :func:`statistics` reads.
    * ``devices``: the worker's device (one per worker).  None picks it: on a real platform a
      worker whose environment sets one of :data:`VISIBLE_DEVICES_VARIABLES` (dask-cuda's way)
      uses device 0, the first it sees; otherwise a worker whose name is an int (LocalCluster's
      workers are named 0, 1, ...) uses ``name % device_count()``; otherwise device 0.

    ``setup`` (on each worker, also a restarted one) makes the device current in the thread
    that runs it, builds the stack there, sets it as that device's resource
    (``set_per_device_resource``), makes every task thread of the worker run each task with
    the device current, and adds the worker's metrics; ``teardown`` (when the plugin
    is unregistered or the worker closes) puts back the previous resource and flushes the log.
    Memory allocated before stays valid: each Buffer holds its resource.
    """

    name: str = "hipmr-resource-setup"
    idempotent: bool = False

    def __init__(self, pool_allocator: bool = False, managed_memory: bool = False,
                 initial_pool_size: Optional[SizeSetting] = None,
                 maximum_pool_size: Optional[SizeSetting] = None,
                 devices: Optional[int] = None, logging: bool = False,
                 log_file_name: Optional[str] = None, *, async_allocator: bool = False,
                 release_threshold: Optional[SizeSetting] = None,
                 log_directory: Optional[str] = None, statistics: bool = False,
                 tracking: bool = False) -> None:
        self.pool_allocator: bool = _check_bool(pool_allocator, "pool_allocator")
        self.managed_memory: bool = _check_bool(managed_memory, "managed_memory")
        self.async_allocator: bool = _check_bool(async_allocator, "async_allocator")
        self.statistics: bool = _check_bool(statistics, "statistics")
        self.tracking: bool = _check_bool(tracking, "tracking")
        log = _check_bool(logging, "logging")
        self._initial = _size_setting(initial_pool_size, "initial_pool_size")
        self._maximum = _size_setting(maximum_pool_size, "maximum_pool_size")
        self._threshold = _size_setting(release_threshold, "release_threshold")
        if self.async_allocator and (self.pool_allocator or self.managed_memory):
            raise ValueError("async_allocator cannot be combined with pool_allocator or "
                             "managed_memory (the driver's pool is already a pool, of device "
                             "memory)")
        if not (self.pool_allocator or self.async_allocator):
            for what, setting in (("initial_pool_size", self._initial),
                                  ("maximum_pool_size", self._maximum)):
                if setting is not None:
                    raise ValueError(f"{what} needs pool_allocator=True or "
                                     f"async_allocator=True")
        if self._threshold is not None and not self.async_allocator:
            raise ValueError("release_threshold needs async_allocator=True")
        first, most = self._initial, self._maximum
        if ((type(first) is int and type(most) is int and first > most)
                or (isinstance(first, DeviceFraction) and isinstance(most, DeviceFraction)
                    and first.fraction > most.fraction)):
            raise ValueError(f"initial_pool_size={initial_pool_size!r} is larger than "
                             f"maximum_pool_size={maximum_pool_size!r}")
        if devices is not None:
            if isinstance(devices, bool) or not isinstance(devices, int):
                raise TypeError(f"devices must be one device ordinal (an int; one device per "
                                f"worker) or None, not {type(devices).__name__}")
            if devices < 0:
                raise ValueError(f"devices={devices} is not a device ordinal")
        self.devices: Optional[int] = devices
        for what, value in (("log_directory", log_directory), ("log_file_name", log_file_name)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"{what} must be a str or path, not {type(value).__name__}")
        directory = None if log_directory is None else os.fspath(log_directory)
        stem = "hipmr_log"
        if log_file_name is not None:
            name = os.fspath(log_file_name)
            if not isinstance(name, str) or not os.path.basename(name):
                raise ValueError(f"log_file_name={log_file_name!r} is not a file name")
            head, base = os.path.split(name)
            stem = os.path.splitext(base)[0] or base
            if directory is None and head:
                directory = head
            log = True
        if directory is not None:
            if not isinstance(directory, str) or not directory:
                raise ValueError(f"log_directory={log_directory!r} is not a directory name")
            log = True
        if log and directory is None:
            raise ValueError("logging needs log_directory (one log per worker is written "
                             "there) or a log_file_name with a directory")
        self.log_directory: Optional[str] = directory
        self.log_stem: str = stem
        self.logging: bool = log

    # ---- on the worker ----
    def device_for(self, worker: Any) -> int:
        """The device this plugin gives ``worker`` (see the class's documentation)."""
        if self.devices is not None:
            return self.devices
        from ..device import platform
        if platform() != "emulated" and any(os.environ.get(v) for v in
                                             VISIBLE_DEVICES_VARIABLES):
            return 0
        name = getattr(worker, "name", None)
        if isinstance(name, int) and not isinstance(name, bool):
            return name % max(device_count(), 1)
        return 0

    def log_file_for(self, worker: Any) -> Optional[str]:
        """The log file of ``worker`` (None without logging)."""
        if not self.logging or self.log_directory is None:
            return None
        return os.path.join(self.log_directory, f"{self.log_stem}.{_worker_label(worker)}.csv")

    def build(self, device: int, log_file: Optional[str] = None) -> Any:
        """The resource stack for ``device`` (made while it is current)."""
        with Device(device):
            initial = _resolve(self._initial, "initial_pool_size", device)
            maximum = _resolve(self._maximum, "maximum_pool_size", device)
            if initial is not None and maximum is not None and initial > maximum:
                raise ValueError(f"initial_pool_size ({initial} bytes) is larger than "
                                 f"maximum_pool_size ({maximum} bytes) on device {device}")
            mr: Any
            if self.async_allocator:
                mr = AsyncMemoryResource(device, initial_pool_size=initial,
                                         release_threshold=_resolve(
                                             self._threshold, "release_threshold", device))
                if maximum is not None:
                    mr = LimitingResource(mr, maximum)
            else:
                mr = ManagedMemoryResource() if self.managed_memory else DeviceMemoryResource(
                    device)
                if self.pool_allocator:
                    mr = PoolResource(mr, initial, maximum)
            if log_file is not None:
                mr = LoggingResource(mr, log_file)
            if self.tracking:
                mr = TrackingResource(mr)
            if self.statistics:
                mr = StatisticsResource(mr)
        return mr

    def setup(self, worker: Any) -> None:
        """Build the worker's resource on its device and make it that device's resource."""
        device = self.device_for(worker)
        count = device_count()
        if device >= count:
            raise ValueError(f"worker {worker.name!r}: device {device} does not exist "
                             f"({count} visible)")
        log_file = self.log_file_for(worker)
        if log_file is not None:
            os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
        mr = self.build(device, log_file)   # a failure here changes nothing
        with _lock:
            previous = per_device.set_per_device_resource(device, mr)
            if _installed:  # a second set-up in this process: keep the first previous
                previous = _installed["previous"]
            _installed.clear()
            _installed.update(device=device, resource=mr, previous=previous, log=log_file)
        set_device(device)
        _run_tasks_on(worker, device)
        metrics = getattr(worker, "metrics", None)
        if isinstance(metrics, dict):
            metrics["hipmr"] = _hipmr_metric
            metrics.setdefault("rmm", _rmm_metric)

    def teardown(self, worker: Any) -> None:
        """Put back the device's previous resource; flush the log."""
        with _lock:
            if not _installed:
                return
            state = dict(_installed)
            _installed.clear()
        _run_tasks_on(worker, None)
        if per_device.get_per_device_resource(state["device"]) is state["resource"]:
            per_device.set_per_device_resource(state["device"], state["previous"])
        _flush_logs(state["resource"])
        metrics = getattr(worker, "metrics", None)
        if isinstance(metrics, dict):
            if metrics.get("hipmr") is _hipmr_metric:
                del metrics["hipmr"]
            if metrics.get("rmm") is _rmm_metric:
                del metrics["rmm"]

    def __repr__(self) -> str:
        return (f"ResourceSetup(pool_allocator={self.pool_allocator}, "
                f"managed_memory={self.managed_memory}, async_allocator={self.async_allocator}, "
                f"devices={self.devices}, logging={self.logging}, "
                f"statistics={self.statistics}, tracking={self.tracking})")


def _on_device(device: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` with ``device`` current in the calling thread (a task thread's)."""
    set_device(device)
    return fn(*args, **kwargs)


def _run_tasks_on(worker: Any, device: Optional[int]) -> None:
    """Make each thread executor of ``worker`` run everything it is given (tasks, actors,
    deserialization) with ``device`` current, whatever thread runs it and whatever the task
    before it did; ``None`` undoes it.  The executors' ``submit`` is wrapped on the instance
    (distributed checks the executor's type by name, so the executor itself stays)."""
    executors = getattr(worker, "executors", None)
    if not isinstance(executors, dict):
        return
    for executor in executors.values():
        if not (isinstance(executor, concurrent.futures.ThreadPoolExecutor)
                or "ThreadPoolExecutor" in type(executor).__name__):
            continue                     # a process pool pickles what it runs
        ours = executor.__dict__.get("submit")
        if ours is not None and getattr(ours, "_hipmr_device", None) is not None:
            delattr(executor, "submit")  # a previous set-up's wrapper
        if device is None:
            continue
        submit = executor.submit
        ordinal: int = device

        def on_device_submit(fn: Any, /, *args: Any, _submit: Any = submit,
                             _device: int = ordinal, **kwargs: Any) -> Any:
            return _submit(_on_device, _device, fn, *args, **kwargs)
        setattr(on_device_submit, "_hipmr_device", device)
        setattr(executor, "submit", on_device_submit)


def _flush_logs(mr: Any) -> None:
    for layer in upstream_chain(mr, "hipmr_ctypes.interop.dask"):
        if isinstance(layer, LoggingResource):
            layer.flush()


def _worker_resource() -> Any:
    """The resource the plugin installed in this process, else the current device's."""
    mr = _installed.get("resource")
    return per_device.get_current_device_resource() if mr is None else mr


def _statistics_of(mr: Any) -> Optional[Statistics]:
    for layer in upstream_chain(mr, "hipmr_ctypes.interop.dask"):
        if isinstance(layer, StatisticsResource):
            return layer.statistics
    return None


def _memory_of(mr: Any) -> Tuple[Optional[int], Optional[int]]:
    """``(bytes in use, bytes held from the device)`` of a stack, as far as it knows."""
    used: Optional[int] = None
    held: Optional[int] = None
    for layer in upstream_chain(mr, "hipmr_ctypes.interop.dask"):
        if used is None:
            if isinstance(layer, StatisticsResource):
                used = layer.statistics.current_bytes
            elif isinstance(layer, (TrackingResource, LimitingResource)):
                used = layer.get_allocated_bytes()
        if held is None:
            if isinstance(layer, PoolResource):
                held = layer.pool_size()
            elif isinstance(layer, AsyncMemoryResource):
                held = layer.pool.reserved
    if used is None and isinstance(mr, PoolResource):
        used = mr.get_allocated_bytes()
    return used, held


def _hipmr_metric(worker: Any = None) -> Dict[str, Any]:
    """The worker's heartbeat metric ``"hipmr"``: device, bytes in use and held, and the
    statistics' counters (None where the stack has none)."""
    state = dict(_installed)
    mr = state.get("resource")
    if mr is None:
        return {"device": None, "used": None, "held": None, "statistics": None}
    used, held = _memory_of(mr)
    stats = _statistics_of(mr)
    return {"device": state["device"], "used": used, "held": held,
            "statistics": None if stats is None else {
                f: getattr(stats, f) for f in ("current_bytes", "current_count", "peak_bytes",
                                               "peak_count", "total_bytes", "total_count")}}


def _rmm_metric(worker: Any = None) -> Dict[str, Optional[int]]:
    """The worker's heartbeat metric ``"rmm"`` in distributed's RMM form, which its dashboard
    plots (``rmm-used``, ``rmm-total``)."""
    mr = _installed.get("resource")
    if mr is None:
        return {"rmm-used": None, "rmm-total": None}
    used, held = _memory_of(mr)
    used = used or 0
    return {"rmm-used": used, "rmm-total": max(used, held or 0)}


def _worker_statistics() -> Optional[Statistics]:
    return _statistics_of(_worker_resource())


def statistics(client: Any) -> Dict[str, Optional[Statistics]]:
    """``{worker address: Statistics}`` of every worker of ``client``'s cluster, read in one
    call (``client.run``): the counters of the outermost :class:`StatisticsResource` of the
    worker's resource (``ResourceSetup(statistics=True)``), None for a worker without one."""
    if not callable(getattr(client, "run", None)):
        raise TypeError(f"client must be a distributed.Client, not {type(client).__name__}")
    result: Dict[str, Optional[Statistics]] = client.run(_worker_statistics)
    return result


def worker_device() -> int:
    """The device the plugin gave this worker, made current in the calling thread (every task
    already runs with it current; a thread the task starts itself does not);
    RuntimeError outside a worker set up by :class:`ResourceSetup`."""
    device = _installed.get("device")
    if device is None:
        raise RuntimeError("no ResourceSetup plugin has set up this process")
    set_device(device)
    return int(device)


# ---- serialization -----------------------------------------------------------------------------
def _receiving_resource() -> Any:
    return _installed.get("resource")


def _dask_serialize_buffer(buf: Buffer) -> Tuple[Dict[str, Any], List[Any]]:
    """The host path: one frame with the bytes."""
    return {"size": buf.size}, [memoryview(buf.copy_to_host())]


def _dask_deserialize_buffer(header: Dict[str, Any], frames: List[Any]) -> Buffer:
    data = frames[0] if len(frames) == 1 else b"".join(bytes(f) for f in frames)
    buf = Buffer.from_host(data, resource=_receiving_resource())
    if buf.size != header.get("size", buf.size):
        size = buf.size
        buf.close()
        raise ValueError(f"a serialized Buffer of {header['size']} bytes arrived with {size}")
    return buf


def _cuda_serialize_buffer(buf: Buffer) -> Tuple[Dict[str, Any], List[Any]]:
    """The device path: the Buffer itself is the frame (``__cuda_array_interface__``)."""
    try:
        header = dict(buf.__cuda_array_interface__)
    except AttributeError:  # host-only memory: let distributed take the next family
        raise NotImplementedError("a Buffer of host-only memory has no device frame") from None
    header["strides"] = (1,)
    header["size"] = buf.size
    header.pop("data", None)
    header.pop("stream", None)
    return header, [buf]


def _cuda_deserialize_buffer(header: Dict[str, Any], frames: List[Any]) -> Buffer:
    (frame,) = frames
    if isinstance(frame, Buffer):  # already ours (a transport that allocated through us)
        return frame
    resource = _receiving_resource()
    cai = getattr(frame, "__cuda_array_interface__", None)
    if cai is not None:  # a device frame the transport allocated
        size = int(cai["typestr"][2:])
        for extent in cai["shape"]:
            size *= int(extent)
        if size != header.get("size", size):
            raise ValueError(f"a serialized Buffer of {header['size']} bytes arrived in a "
                             f"device frame of {size}")
        buf = Buffer(size, resource=resource)
        try:
            buf.copy_from_device(frame)
        except BaseException:
            buf.close()
            raise
        return buf
    buf = Buffer.from_host(frame, resource=resource)   # a transport that staged it on the host
    if buf.size != header.get("size", buf.size):
        size = buf.size
        buf.close()
        raise ValueError(f"a serialized Buffer of {header['size']} bytes arrived with {size}")
    return buf


def _register() -> None:
    """Buffer's functions in the ``dask`` family and, where distributed has it, ``cuda``."""
    serialize: Any = importlib.import_module("distributed.protocol.serialize")
    try:  # the cuda family; absent from very old releases
        cuda: Any = importlib.import_module("distributed.protocol.cuda")
    except ImportError:  # pragma: no cover - every supported distributed has it
        cuda = None
    families: Any = [(serialize.dask_serialize, serialize.dask_deserialize,
                      _dask_serialize_buffer, _dask_deserialize_buffer)]
    if cuda is not None:
        families.append((cuda.cuda_serialize, cuda.cuda_deserialize,
                         _cuda_serialize_buffer, _cuda_deserialize_buffer))
    for dumps, loads, dump_buffer, load_buffer in families:
        dumps.register(Buffer)(dump_buffer)
        loads.register(Buffer)(load_buffer)


_register()

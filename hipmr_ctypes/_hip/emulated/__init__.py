"""The ``emulated`` platform: the HIP function table in pure Python over host memory.

``HIPMR_PLATFORM=emulated`` runs the whole package on a machine with no GPU (CI, laptops).
:func:`create_emulated_runtime` returns a :class:`~hipmr_ctypes._hip.runtime.Runtime` whose
``fn`` has one callable per row of ``decls.DECLS``, with the real calling convention (output
arguments are ctypes instances, ``byref()`` or ``pointer()``; pointers and handles are ints, None
or ``c_void_p``; every call returns an ``int`` HIP status).  ``rt.emulator`` is the
:class:`Emulator` behind it, with hooks for tests.

Configuration (environment, or the ``env`` mapping given to ``create_runtime``):

``HIPMR_EMULATED_DEVICES``      number of devices (default 1; 0 emulates a machine with no GPU:
                                hipGetDeviceCount gives count 0 and hipErrorNoDevice, every other
                                call but the version and error queries hipErrorNoDevice)
``HIPMR_EMULATED_MEMORY``       capacity of each device (default 1 GiB).  An int, or a number
                                with a unit: ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB``, ``T``/
                                ``TiB`` are powers of 1024; ``KB``, ``MB``, ``GB``, ``TB`` are
                                powers of 1000 (``"64MiB"``, ``"512M"``, ``"1.5GiB"``)
``HIPMR_EMULATED_HOST_MEMORY``  cap on pinned (hipHostMalloc) memory, default 64 GiB
``HIPMR_EMULATED_VERSION``      the HIP version emulated, default ``6.2.0`` (reported as
                                60200000 by hipRuntimeGetVersion and hipDriverGetVersion)
``HIPMR_EMULATED_MISSING``      comma-separated optional functions to present as missing from
                                the library (calling them raises NotSupportedError)

What is faithful
----------------
* Memory is real: 256-byte aligned blocks from libc ``posix_memalign`` (ctypes buffers where libc
  lacks it), so pointers are writable and copies move real bytes.  Every device, pool, pinned and
  managed allocation is recorded with its size, device, kind and pool.
* Freeing a pointer that is not the start of a live allocation of the right kind is
  hipErrorInvalidValue: double frees, foreign and interior pointers, hipFree of pinned memory,
  hipHostFree of device memory.  libc ``free`` is only ever called on blocks the emulator
  allocated, so no argument can crash the process that way.  hipFree(NULL) and
  hipHostFree(NULL) succeed; hipFreeAsync(NULL) is hipErrorInvalidValue before HIP 7.0 and
  success from 7.0 on.  hipFree waits for the device: its streams become idle.
* Size 0: hipMalloc, hipHostMalloc, hipMallocManaged, hipMallocAsync and hipMallocFromPoolAsync
  succeed and return NULL.
* Capacity: device, managed and pool-reserved memory count against the device's capacity,
  rounded up to 256 bytes; an allocation that does not fit is hipErrorOutOfMemory (output set
  to NULL) and changes nothing.  hipMemGetInfo reports free = capacity - committed bytes,
  including what pools hold in reserve.  hipMalloc does not trim pools.
* Copies (hipMemcpy / hipMemcpyAsync) check the kind (unknown kinds are
  hipErrorInvalidMemcpyDirection; DeviceToDeviceNoCU from 6.1) and both ranges: a device side
  must lie inside one live allocation (pinned and managed memory count as device-accessible); a
  host side must not be device-only memory and must not run into an emulated allocation; NULL
  and addresses below 64 KiB are invalid; a host buffer passed as a ctypes array, ``byref()``
  or ``bytes`` must hold the whole copy, and ``bytes`` is never a destination.
  A plain copy between device-only memory (hipMalloc or pool) of two different devices is
  hipErrorInvalidValue, as CUDA returns it on a two-GPU machine; hipMemcpyPeer /
  hipMemcpyPeerAsync copy device-accessible memory of any two devices.
  hipMemset* needs a range inside one live allocation.
  Size 0 succeeds after the kind and stream checks.
* Memory pools (one default pool per device, plus hipMemPoolCreate pools): a pool reserves
  blocks from its device's capacity; a freed block is cached (still reserved) and reused for a
  later request of at most its size and at least 8/9 of it (AMD's 12.5 % rule), else a new block
  is reserved.  At every synchronize point (hipStreamSynchronize, hipEventSynchronize,
  hipDeviceSynchronize of the pool's device) a pool releases cached blocks, largest first, while
  it reserves more than its release threshold (default 0, so everything cached goes).
  hipMemPoolTrimTo(n) releases until reserved <= max(n, used).  An allocation that does not fit
  the capacity (or the pool's ``maxSize``) first releases as much of the pool's cache as needed;
  if even the whole cache would not do, it fails and releases nothing.  Attributes 1-8 work as on
  AMD: the Reuse* ones are ints (default 1), the others uint64; Reserved/UsedMemCurrent are
  read-only; the High ones accept only 0, which resets them to the current value.
  hipMemPoolDestroy releases the cache at once and makes the handle invalid; allocations still
  live from the pool stay valid (clr keeps a pool alive while it has allocations, as CUDA
  does) and their later hipFree / hipFreeAsync succeeds and returns the memory to the device.
  Destroying the device's current pool makes the default pool current again; the default pool
  cannot be destroyed.  Pool handles that are unknown are hipErrorInvalidValue, as on AMD.
* Streams and events: handles are unique and never reused (destroyed handles stay invalid:
  hipErrorInvalidHandle, never a crash).  Stream 0 (null), 1 (legacy) and 2 (per-thread) are
  valid everywhere and belong to the calling thread's current device.  Priorities are clamped to
  hipDeviceGetStreamPriorityRange = (least 0, greatest -1).  hipMallocAsync / hipFreeAsync with
  an invalid stream are hipErrorInvalidValue (as clr); other calls hipErrorInvalidHandle.
  Event flags follow clr (one release flag at most; interprocess needs disable-timing).
  hipEventElapsedTime follows clr: NULL output -> invalid value; an unknown, never-recorded or
  disable-timing event, or events of two devices -> hipErrorInvalidHandle; pending ->
  hipErrorNotReady; otherwise the milliseconds between the two time.perf_counter() stamps.
  Querying or synchronizing an event never recorded succeeds.
* Last error per thread: before HIP 7.0 hipGetLastError returns the result of the thread's last
  call (success included) and resets it; from 7.0 it returns the last error other than
  hipErrorNotReady (CUDA-like).  hipExtGetLastError returns the last call's result and resets it.
  hipPeekAtLastError does not reset.
* hipPointerGetAttributes: type in HIP 6 numbering (host 1 = pinned, device 2, managed 3; HIP 5
  numbering when an older version is emulated), device, devicePointer = the pointer,
  hostPointer = the pointer for pinned and managed memory, isManaged, the allocation flags;
  unknown pointers are hipErrorInvalidValue.
* Wrong argument types (a float size, a string pointer, an output of the wrong ctypes type,
  a NULL output) return hipErrorInvalidValue; nothing raises.

What is simplified
------------------
* Work runs synchronously when submitted; streams are never busy unless a test says so with
  :meth:`Emulator.set_stream_busy`.  hipStreamWaitEvent only validates its arguments.
* Host pointers given as plain addresses and not inside emulated allocations are trusted, as
  the real runtime trusts them (a wild host address in a copy can still crash the process, as
  it would on a GPU).
* The per-thread stream (2) is one stream per device, shared by all threads.
* Peer access, hipMemPoolSetAccess and hipMemPrefetchAsync only validate and record: all memory
  is host memory, reachable from every device.  The IPC and export handles are 64 deterministic
  bytes (a tag, the allocation's address, size, offset and device); nothing can open them.
  hipIpcGetMemHandle accepts hipMalloc memory only, hipMemPoolExportPointer only the start of an
  allocation from a pool created with the POSIX file-descriptor handle type.
* Device attributes are those of a plausible gfx9 GPU (see ``_devices.device_attributes``):
  compute capability 9.0, warp size 64, 4 multiprocessors, PCI bus id = ordinal, memory pools
  supported (from HIP 6.2 on, like AMD's default), managed memory and concurrent managed access.
* Every function of the table exists whatever version is emulated (use
  HIPMR_EMULATED_MISSING to emulate an older library's missing optional symbols).
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Tuple

from ..decls import DECL_BY_NAME
from ..runtime import Runtime, decode_hip_version
from ._core import (DEFAULT_FAULT_CALLS, EmulatorConfig, LiveAllocations, error_name,
                    error_string)
from ._devices import DeviceMixin
from ._ipc import IpcMixin
from ._memory import MemoryMixin
from ._pools import PoolMixin
from ._streams import StreamMixin

__all__ = ["Emulator", "EmulatorConfig", "LiveAllocations", "create_emulated_runtime",
           "config_from_env", "parse_size", "DEFAULT_FAULT_CALLS"]

_UNITS = {"": 1, "b": 1,
          "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


class Emulator(DeviceMixin, StreamMixin, MemoryMixin, PoolMixin, IpcMixin):
    """The emulated HIP runtime: the state of :class:`EmulatorCore` plus one method per HIP
    function, from five parts that each build on the core alone (devices, streams, memory,
    pools, interprocess).

    Test hooks: :meth:`inject_failure`, :meth:`clear_faults`, :meth:`pending_faults`,
    :meth:`set_stream_busy`, :meth:`live_allocations`, :meth:`capacity`, :attr:`device_count`,
    :meth:`reset`.  The HIP methods are meant to be called through ``rt.fn`` (see
    :meth:`functions`), which adds the status handling.
    """


def parse_size(text: str) -> int:
    """``"64MiB"`` -> 67108864.  K/M/G/T and KiB/MiB/GiB/TiB are binary, KB/MB/GB/TB decimal."""
    match = _SIZE.match(str(text).replace("_", ""))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 1073741824, 64MiB, 512M, 2GiB)")
    number = match.group(1)
    if "." in number:
        return int(float(number) * _UNITS[unit])
    return int(number) * _UNITS[unit]


def _parse_version(text: str) -> Tuple[int, int, int]:
    text = text.strip()
    if text.isdigit() and len(text) >= 7:   # an encoded HIP version, e.g. 60200000
        return decode_hip_version(int(text))
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"HIPMR_EMULATED_VERSION={text!r} is not a version like 6.2.0")
    major, minor, patch = (list(map(int, parts)) + [0, 0])[:3]
    if not (minor < 100 and patch < 100_000):
        raise ValueError(f"HIPMR_EMULATED_VERSION={text!r} is out of range")
    return major, minor, patch


def config_from_env(env: Optional[Mapping[str, str]] = None) -> EmulatorConfig:
    """The emulator's configuration from ``HIPMR_EMULATED_*`` (ValueError when malformed)."""
    env = os.environ if env is None else env
    defaults = EmulatorConfig()

    def get(name: str) -> str:
        return (env.get(name) or "").strip()

    devices_text = get("HIPMR_EMULATED_DEVICES")
    try:
        devices = int(devices_text) if devices_text else defaults.devices
    except ValueError:
        raise ValueError(f"HIPMR_EMULATED_DEVICES={devices_text!r} is not an integer") from None
    if not 0 <= devices <= 64:
        raise ValueError(f"HIPMR_EMULATED_DEVICES={devices} is not between 0 and 64")
    memory = parse_size(get("HIPMR_EMULATED_MEMORY")) if get("HIPMR_EMULATED_MEMORY") \
        else defaults.memory
    host_memory = parse_size(get("HIPMR_EMULATED_HOST_MEMORY")) \
        if get("HIPMR_EMULATED_HOST_MEMORY") else defaults.host_memory
    version = _parse_version(get("HIPMR_EMULATED_VERSION")) if get("HIPMR_EMULATED_VERSION") \
        else defaults.version
    missing = frozenset(n.strip() for n in get("HIPMR_EMULATED_MISSING").split(",") if n.strip())
    for name in missing:
        decl = DECL_BY_NAME.get(name)
        if decl is None or decl.required:
            raise ValueError(f"HIPMR_EMULATED_MISSING: {name} is not an optional function "
                             f"of the table")
    return EmulatorConfig(devices, memory, host_memory, version, missing)


def create_emulated_runtime(env: Optional[Mapping[str, str]] = None) -> Runtime:
    """A new Runtime for the emulated platform, configured from ``env`` (default os.environ).

    The :class:`Emulator` is ``rt.emulator``.  Raises ValueError for a malformed
    ``HIPMR_EMULATED_*`` variable.
    """
    emulator = Emulator(config_from_env(env))
    rt = Runtime("emulated", emulator.functions(), None, None, error_name=error_name,
                 error_string=error_string, version_decoder=decode_hip_version)
    rt.emulator = emulator  # type: ignore[attr-defined]
    return rt

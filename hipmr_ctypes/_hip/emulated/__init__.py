"""The ``emulated`` platform: the HIP function table in pure Python over host memory, for
machines with no GPU (``HIPMR_PLATFORM=emulated``).

:func:`create_emulated_runtime` returns a Runtime whose ``fn`` has one callable per row of
``decls.DECLS``; ``rt.emulator`` is the :class:`Emulator` behind it, with hooks for tests.
``HIPMR_EMULATED_*`` variables configure it.  docs/emulated.md
describes the configuration, what is faithful to the real runtimes and what is simplified.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from ..decls import DECL_BY_NAME
from ..runtime import Runtime, decode_hip_version
from ..search import setting_error
from ._core import (DEFAULT_FAULT_CALLS, EmulatorConfig, LiveAllocations, error_name,
                    error_string)
from ._capture import CaptureMixin
from ._devices import DeviceMixin
from ._ipc import IpcMixin
from ._memory import MemoryMixin
from ._pools import PoolMixin
from ._streams import StreamMixin
from ._virtual import VirtualMixin

__all__ = ["Emulator", "EmulatorConfig", "LiveAllocations", "create_emulated_runtime",
           "config_from_env", "parse_size", "DEFAULT_FAULT_CALLS"]


class Emulator(DeviceMixin, StreamMixin, MemoryMixin, PoolMixin, IpcMixin, VirtualMixin,
               CaptureMixin):
    """The emulated HIP runtime: the state of :class:`EmulatorCore` plus one method per HIP
    function, from seven parts that each build on the core alone (devices, streams, memory,
    pools, interprocess, virtual memory, stream capture and graphs).

    Test hooks: :meth:`inject_failure`, :meth:`clear_faults`, :meth:`pending_faults`,
    :meth:`set_stream_busy`, :meth:`live_allocations`, :meth:`capacity`, :attr:`device_count`,
    :meth:`reset`.  The HIP methods are meant to be called through ``rt.fn`` (see
    :meth:`functions`), which adds the status handling.
    """


def parse_size(text: str) -> int:
    """A ``HIPMR_EMULATED_*`` size: the package's one size grammar (``"64MiB"``, ``"2 GB"``,
    ``"1073741824"``); no fraction, no single-letter unit.  The grammar loads only when such a
    variable is set."""
    from ..._sizes import parse_bytes
    return parse_bytes(text)


def _parse_version(text: str) -> Tuple[int, int, int]:
    text = text.strip()
    if text.isdigit() and len(text) >= 7:   # an encoded HIP version, e.g. 60200000
        return decode_hip_version(int(text))
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise setting_error("HIPMR_EMULATED_VERSION",
                            f"HIPMR_EMULATED_VERSION={text!r} is not a version like 6.2.0")
    major, minor, patch = (list(map(int, parts)) + [0, 0])[:3]
    if not (minor < 100 and patch < 100_000):
        raise setting_error("HIPMR_EMULATED_VERSION",
                            f"HIPMR_EMULATED_VERSION={text!r} is out of range")
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
        raise setting_error("HIPMR_EMULATED_DEVICES",
                            f"HIPMR_EMULATED_DEVICES={devices_text!r} is not an integer") from None
    if not 0 <= devices <= 64:
        raise setting_error("HIPMR_EMULATED_DEVICES",
                            f"HIPMR_EMULATED_DEVICES={devices} is not between 0 and 64")
    def size(name: str, default: int) -> int:
        text = get(name)
        if not text:
            return default
        try:
            return parse_size(text)
        except ValueError as exc:
            raise setting_error(name, f"{name}: {exc}") from None

    memory = size("HIPMR_EMULATED_MEMORY", defaults.memory)
    host_memory = size("HIPMR_EMULATED_HOST_MEMORY", defaults.host_memory)
    version = _parse_version(get("HIPMR_EMULATED_VERSION")) if get("HIPMR_EMULATED_VERSION") \
        else defaults.version
    missing = frozenset(n.strip() for n in get("HIPMR_EMULATED_MISSING").split(",") if n.strip())
    for name in missing:
        decl = DECL_BY_NAME.get(name)
        if decl is None or decl.required:
            raise setting_error("HIPMR_EMULATED_MISSING",
                                f"HIPMR_EMULATED_MISSING: {name} is not an optional function "
                                f"of the table")
    apu_text = get("HIPMR_EMULATED_APU")
    if apu_text not in ("", "0", "1"):
        raise setting_error("HIPMR_EMULATED_APU",
                            f"HIPMR_EMULATED_APU={apu_text!r}: expected 1 (an APU) or 0")
    return EmulatorConfig(devices, memory, host_memory, version, missing, apu_text == "1")


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

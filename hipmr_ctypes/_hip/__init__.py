"""The HIP binding: one process-wide :class:`Runtime`, chosen by ``HIPMR_PLATFORM``.

The platform is chosen here and nowhere else: :func:`create_runtime` builds a Runtime from one
back end (``amd.py``, ``nvidia.py``, ``emulated/``); each back end imports only ``runtime.py``
and the table, never another back end or this module.

``get_runtime()`` loads it on first use (the package's ``__init__`` asks for it once at
import so that the first allocation pays nothing more) and caches it.  A failed load is
remembered and raised again, unchanged, by every later call that needs the runtime.
"""
from __future__ import annotations

import os
from _thread import allocate_lock

from . import errors
from .errors import (HipError, InvalidHandleError, InvalidValueError, LibraryNotFoundError,
                     NoDeviceError, NotReadyError, NotSupportedError, OutOfMemoryError)
from .runtime import Runtime

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Mapping, Optional

__all__ = [
    "get_runtime", "set_runtime", "selected_platform", "create_runtime", "preload", "load_error",
    "Runtime", "PLATFORMS",
    "HipError", "OutOfMemoryError", "NotReadyError", "NoDeviceError", "InvalidValueError",
    "InvalidHandleError", "NotSupportedError", "LibraryNotFoundError",
]

#: Every value ``HIPMR_PLATFORM`` may take.
PLATFORMS = ("amd", "nvidia", "emulated")

_lock = allocate_lock()
_runtime: Optional[Runtime] = None
_error: Optional[BaseException] = None


def selected_platform(env: Optional[Mapping[str, str]] = None) -> str:
    """The platform named by ``HIPMR_PLATFORM`` (or HIP's ``HIP_PLATFORM=nvidia``); default ``amd``."""
    env = os.environ if env is None else env
    value = (env.get("HIPMR_PLATFORM") or "").strip().lower()
    if not value:
        hip_platform = (env.get("HIP_PLATFORM") or "").strip().lower()
        value = "nvidia" if hip_platform in ("nvidia", "nvcc") else "amd"
    if value not in PLATFORMS:
        raise ValueError(f"HIPMR_PLATFORM={value!r} is not one of {', '.join(PLATFORMS)}")
    return value


errors.selected_platform_now = selected_platform  # a no-device hint compares it with the loaded one


def create_runtime(platform: str, env: Optional[Mapping[str, str]] = None) -> Runtime:
    """A new Runtime for ``platform`` (one of :data:`PLATFORMS`), configured from ``env``
    (default ``os.environ``); the process-wide one is :func:`get_runtime`."""
    if platform == "amd":
        from .amd import create_amd_runtime
        return create_amd_runtime(env)
    if platform == "nvidia":
        from .nvidia import create_nvidia_runtime
        return create_nvidia_runtime(env)
    if platform == "emulated":
        from .emulated import create_emulated_runtime
        return create_emulated_runtime(env)
    raise ValueError(f"unknown HIP platform {platform!r}; expected one of {PLATFORMS}")


def get_runtime() -> Runtime:
    """The process-wide runtime; raises LibraryNotFoundError (or the load error) if it cannot load."""
    rt = _runtime
    if rt is not None:
        return rt
    with _lock:
        if _runtime is None and _error is None:
            _load_locked()
        if _runtime is not None:
            return _runtime
        # the same error every time, with only this raise's traceback: raising the stored
        # object again would append to its traceback at every call (unbounded growth)
        raise _error.with_traceback(None)  # type: ignore[union-attr]


def _load_locked() -> None:
    global _runtime, _error
    try:
        _runtime = create_runtime(selected_platform())
    except (HipError, OSError, ValueError) as exc:
        _error = exc


def preload() -> None:
    """Load the runtime now if possible; never raises (the error is kept for first use)."""
    try:
        get_runtime()
    except Exception:
        pass


def load_error() -> Optional[BaseException]:
    """The error that stopped the runtime from loading, or None."""
    return _error


def set_runtime(rt: Optional[Runtime]) -> Optional[Runtime]:
    """Replace the process-wide runtime (tests, embedding); returns the previous one.

    ``None`` forgets the current one so that the next ``get_runtime()`` loads again.
    """
    global _runtime, _error
    with _lock:
        previous = _runtime
        _runtime = rt
        _error = None
        return previous

"""The HIP binding: one process-wide :class:`Runtime`, chosen by ``HIPMR_PLATFORM``.

The platform is chosen here and nowhere else: :func:`create_runtime` builds a Runtime from one
back end (``amd.py``, ``nvidia/``, ``emulated/``); each back end imports only ``runtime.py``,
``loader.py``, ``search.py`` and the table, never another back end or this module.

The package's ``__init__`` calls :func:`preload` once at import: it chooses the platform and
opens its library (``search.preload_library``), nothing more.  ``get_runtime()`` builds the
Runtime on first use (binding the declaration table in the library import opened) and caches
it.  A failed load is remembered and raised again, unchanged, by every later call that needs
the runtime.  This module runs at import: its annotations are strings, and the error classes
and ``Runtime`` it re-exports load on first use (``__getattr__``, removed once the runtime is
loaded).
"""
from _thread import allocate_lock

from .search import PLATFORMS, selected_platform

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Mapping, Optional

    from .exceptions import (HipError, InvalidHandleError, InvalidValueError, LibraryNotFoundError,
                         NoDeviceError, NotReadyError, NotSupportedError, OutOfMemoryError)
    from .runtime import Runtime

__all__ = [
    "get_runtime", "set_runtime", "selected_platform", "create_runtime", "preload", "load_error",
    "Runtime", "PLATFORMS",
    "HipError", "OutOfMemoryError", "NotReadyError", "NoDeviceError", "InvalidValueError",
    "InvalidHandleError", "NotSupportedError", "LibraryNotFoundError",
]

_lock = allocate_lock()
_runtime: "Optional[Runtime]" = None
_error: "Optional[BaseException]" = None
_platform: "Optional[str]" = None  # chosen by preload() at import; the first load uses it


def create_runtime(platform: str, env: "Optional[Mapping[str, str]]" = None) -> "Runtime":
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


def get_runtime() -> "Runtime":
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
    from .exceptions import HipError
    try:
        _runtime = create_runtime(_platform or selected_platform())
    except (HipError, OSError, ValueError) as exc:
        _error = exc
    else:
        _bind_lazy_names()
        from .fork import install
        install()   # a child forked from now on refuses to use the runtime (fork.py)


def _bind_lazy_names() -> None:
    """Bind every name ``__getattr__`` serves (a loaded runtime has imported them all), then
    remove ``__getattr__``: CPython does not specialize attribute loads from a module that
    has one, so ``_hip._runtime`` or ``_hip.get_runtime`` would take the generic path at every
    call."""
    names = globals()
    getattr_ = names.get("__getattr__")
    if getattr_ is None:
        return
    for name in __all__:
        if name not in names:
            names[name] = getattr_(name)
    del names["__getattr__"]


def preload() -> None:
    """Choose the platform and open its library now (the package's import); never raises.
    What goes wrong is reported by the first use of the runtime."""
    global _platform
    try:
        platform = selected_platform()
    except ValueError:
        return
    _platform = platform
    if platform != "emulated":
        from .search import preload_library
        try:
            preload_library(platform)
        except Exception:  # noqa: BLE001 - reported by the first use
            pass


def load_error() -> "Optional[BaseException]":
    """The error that stops the runtime from loading (the one :func:`get_runtime` raises), or
    None when it loads; loads it if no call has yet."""
    try:
        get_runtime()
    except Exception:  # noqa: BLE001
        pass
    return _error


def set_runtime(rt: "Optional[Runtime]") -> "Optional[Runtime]":
    """Replace the process-wide runtime (tests, embedding); returns the previous one.

    ``None`` forgets the current one so that the next ``get_runtime()`` loads again, on the
    platform ``HIPMR_PLATFORM`` selects then.
    """
    global _runtime, _error, _platform
    with _lock:
        previous = _runtime
        _runtime = rt
        _error = None
        if rt is None:
            _platform = None
        return previous


if not TYPE_CHECKING:
    def __getattr__(name):
        """``Runtime`` and the error classes, loaded on first use."""
        if name == "Runtime":
            from .runtime import Runtime as value
        elif name.endswith("Error") and name in __all__:
            from . import exceptions
            value = getattr(exceptions, name)
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value

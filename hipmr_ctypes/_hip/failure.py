"""How a failed call becomes an exception: the class for a HIP status, the exception with its
message, what to do when no device is visible.

Loaded by the first failure (or the first use of these names through ``errors``), so that
importing the package does not compile it; ``errors.py`` holds the classes.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Type

    from .runtime import Runtime

from .errors import (ERROR_NAMES, HIP_ERROR_INVALID_HANDLE, HIP_ERROR_INVALID_VALUE,
                     HIP_ERROR_NO_DEVICE, HIP_ERROR_NOT_READY, HIP_ERROR_NOT_SUPPORTED,
                     HIP_ERROR_OUT_OF_MEMORY, NO_DEVICE_CODES, HipError, InvalidHandleError,
                     InvalidValueError, NoDeviceError, NotReadyError, NotSupportedError,
                     OutOfMemoryError)

__all__ = ["error_class", "make_error", "no_device_hint", "runtime_error", "rebuild"]


def rebuild(cls: Type[HipError], state: Dict[str, Any]) -> HipError:
    """Unpickle ``HipError.__reduce__``'s state."""
    # an OSError subclass must be made by OSError's own __new__ (its C layout is larger)
    obj = OSError.__new__(cls) if issubclass(cls, OSError) else cls.__new__(cls)
    obj.__dict__.update(state)
    Exception.__init__(obj, obj._format())
    return obj


def no_device_hint(platform: str) -> str:
    """What to do when ``platform`` sees no device (the command line prints the same)."""
    try:
        from .search import selected_platform
        wanted = selected_platform()  # what HIPMR_PLATFORM selects now
    except ValueError:
        wanted = platform
    if wanted != platform:
        return (f"HIPMR_PLATFORM now selects {wanted}, but the platform is chosen once, when "
                f"hipmr_ctypes is first imported ({platform} is in use): set it before the "
                f"import")
    if platform == "emulated":
        return "HIPMR_EMULATED_DEVICES is 0; set it to 1 or more for emulated devices"
    return "set HIPMR_PLATFORM=emulated to use the package on host memory without a GPU"


_CLASSES: Dict[int, Type[HipError]] = {
    HIP_ERROR_OUT_OF_MEMORY: OutOfMemoryError,
    HIP_ERROR_NOT_READY: NotReadyError,
    HIP_ERROR_NO_DEVICE: NoDeviceError,
    HIP_ERROR_INVALID_VALUE: InvalidValueError,
    HIP_ERROR_INVALID_HANDLE: InvalidHandleError,
    HIP_ERROR_NOT_SUPPORTED: NotSupportedError,
}


def error_class(code: int) -> Type[HipError]:
    """The exception class used for a HIP status ``code``."""
    return _CLASSES.get(code, HipError)


def make_error(code: int, call: Optional[str] = None, name: Optional[str] = None,
               message: str = "", *, size: Optional[int] = None,
               device: Optional[int] = None, detail: str = "") -> HipError:
    """Build (not raise) the exception for HIP status ``code`` returned by ``call``."""
    cls = error_class(code)
    if cls is OutOfMemoryError:
        return OutOfMemoryError(code, name, message, call, detail, size=size, device=device)
    return cls(code, name, message, call, detail)


def runtime_error(rt: Runtime, status: int, call: Optional[str], size: Optional[int],
                  device: Optional[int], detail: str) -> HipError:
    """``Runtime.error``: the exception for a non-zero ``status`` of ``rt`` returned by ``call``."""
    code = rt.hip_code(status)
    name = None
    message = ""
    try:
        if rt._error_name is not None:
            name = rt._error_name(code)
        if rt._error_string is not None:
            message = rt._error_string(status) or ""
    except Exception:  # never let name lookup hide the real error
        pass
    if not name or (name == "hipErrorUnknown" and code != 999):
        name = ERROR_NAMES.get(code, "hipErrorUnknown")
    rt.clear_last_error()
    if code in NO_DEVICE_CODES and call != "hipGetDeviceCount" and not rt.sees_device():
        hint = no_device_hint(rt.platform)
        return NoDeviceError(code, name, message, call,
                             f"{detail}; no device is visible; {hint}" if detail
                             else f"no device is visible; {hint}")
    return make_error(code, call, name, message, size=size, device=device, detail=detail)

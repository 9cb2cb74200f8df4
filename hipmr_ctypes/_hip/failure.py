"""How a failed call becomes an exception: the class for a HIP status, the exception with its
message, what to do when no device is visible.

Loaded by the first failure (``Runtime.error``), so that importing the package does not
compile it.  It stands on ``errors.py`` (the classes) and is used by ``runtime.py``: the chain
``errors`` <- ``failure`` <- ``runtime``.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Dict, Optional, Type

from .exceptions import (HIP_ERROR_INVALID_HANDLE, HIP_ERROR_INVALID_VALUE,
                     HIP_ERROR_NO_DEVICE, HIP_ERROR_NOT_READY, HIP_ERROR_NOT_SUPPORTED,
                     HIP_ERROR_OUT_OF_MEMORY, HipError, InvalidHandleError,
                     InvalidValueError, NoDeviceError, NotReadyError, NotSupportedError,
                     OutOfMemoryError)

__all__ = ["error_class", "make_error", "no_device_hint"]


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


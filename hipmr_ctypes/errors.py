"""The exceptions the package raises for failed HIP calls, importable without the binding's
internals: ``from hipmr_ctypes.errors import OutOfMemoryError``.  Every one is also a name of
the package itself (``hipmr_ctypes.OutOfMemoryError``).

The binding (``hipmr_ctypes._hip.exceptions``) defines them and turns a HIP status into the
matching one; the layers above it (resources, adaptors, buffers) import them from here.
"""
from __future__ import annotations

from ._hip.exceptions import (HipError, InvalidHandleError, InvalidValueError, LibraryNotFoundError,
                          NoDeviceError, NotReadyError, NotSupportedError, OutOfMemoryError)
from ._hip.fork import ForkedChildError

__all__ = ["HipError", "OutOfMemoryError", "NotReadyError", "NoDeviceError", "InvalidValueError",
           "InvalidHandleError", "NotSupportedError", "LibraryNotFoundError", "ForkedChildError"]

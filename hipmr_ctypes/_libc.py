"""The C library's ``posix_memalign`` and ``free``: the package's only C functions outside
HIP's declaration table (``_hip/decls.py``), declared once here for the host resource and the
emulated platform.  A leaf module: it imports only the standard library."""
from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any, Optional, Tuple

__all__ = ["memalign_and_free"]

_lock = threading.Lock()
_loaded: Optional[Tuple[Any, Any]] = None
_tried = False


def memalign_and_free() -> Optional[Tuple[Any, Any]]:
    """``(posix_memalign, free)`` with their prototypes set (``int posix_memalign(void **,
    size_t, size_t)``, ``void free(void *)``), or None where the C library has no
    ``posix_memalign``.  Loaded once; the process's own symbols are tried first."""
    global _loaded, _tried
    with _lock:
        if not _tried:
            _tried = True
            for name in (None, ctypes.util.find_library("c")):
                try:
                    lib = ctypes.CDLL(name)  # a handle of our own: its functions, our argtypes
                    memalign, free = lib.posix_memalign, lib.free
                except (OSError, AttributeError, TypeError):
                    continue
                memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                     ctypes.c_size_t]
                memalign.restype = ctypes.c_int
                free.argtypes = [ctypes.c_void_p]
                free.restype = None
                _loaded = (memalign, free)
                break
        return _loaded

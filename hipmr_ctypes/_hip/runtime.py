"""The Runtime object: one loaded back end with its function table and error translation.

What every back end (``amd``, ``nvidia``, ``emulated``) builds on; it imports none of them.
It is the top of the binding's error chain ``errors`` <- ``failure`` <- ``runtime``: the
classes come from ``errors``, and ``failure`` (loaded by the first failure) builds them.
"""
from __future__ import annotations

import ctypes
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple

from .exceptions import (ERROR_NAMES, HIP_ERROR_NOT_READY, NO_DEVICE_CODES, NoDeviceError,
                     NotSupportedError)

if TYPE_CHECKING:
    from .exceptions import HipError

__all__ = ["Runtime", "Functions", "missing_function", "decode_hip_version"]

class Functions:
    """A plain namespace of raw callables, one per row of ``decls.DECLS``."""

    if TYPE_CHECKING:  # set per row when the table is bound; each returns a status code
        def __getattr__(self, name: str) -> Callable[..., Any]: ...

        def __setattr__(self, name: str, value: Callable[..., Any]) -> None: ...

    def __repr__(self) -> str:
        return f"<Functions {len(self.__dict__)}>"


def missing_function(name: str, where: str) -> Callable[..., int]:
    """A stand-in for an optional symbol the library lacks: raises NotSupportedError when called."""

    def _missing(*args: Any, **kwargs: Any) -> int:
        raise NotSupportedError(801, "hipErrorNotSupported",
                                f"{name} is not exported by {where}", name)

    _missing.__name__ = name
    _missing.missing = True  # type: ignore[attr-defined]
    return _missing


def decode_hip_version(value: int) -> Tuple[int, int, int]:
    """HIP's encoding ``MAJOR*10000000 + MINOR*100000 + PATCH`` -> ``(major, minor, patch)``."""
    return value // 10_000_000, (value // 100_000) % 100, value % 100_000


def decode_cuda_version(value: int) -> Tuple[int, int, int]:
    """CUDA's encoding ``MAJOR*1000 + MINOR*10`` -> ``(major, minor, 0)``."""
    return value // 1000, (value % 1000) // 10, 0


class Runtime:
    """One loaded back end.

    ``fn`` holds the raw functions (see docs/internals.md for the calling convention);
    ``check`` / ``error`` turn a non-zero status into the matching :class:`HipError`.
    """

    def __init__(self, platform: str, fn: Functions, library_path: Optional[str] = None,
                 lib: Any = None, error_name: Optional[Callable[[int], Optional[str]]] = None,
                 error_string: Optional[Callable[[int], Optional[str]]] = None,
                 to_hip: Optional[Callable[[int], int]] = None,
                 version_decoder: Callable[[int], Tuple[int, int, int]] = decode_hip_version,
                 not_ready: int = HIP_ERROR_NOT_READY,
                 extra: Optional[Dict[str, Any]] = None) -> None:
        self.platform = platform
        self.fn = fn
        self.library_path = library_path
        self.lib = lib
        self._error_name = error_name
        self._error_string = error_string
        self._to_hip = to_hip
        self._decode_version = version_decoder
        self.not_ready_status = not_ready
        self.extra = extra or {}

    # ---- errors ---------------------------------------------------------------------------
    def hip_code(self, status: int) -> int:
        """The HIP code of a back-end status (identity except on ``nvidia``)."""
        return self._to_hip(status) if self._to_hip else status

    def is_not_ready(self, status: int) -> bool:
        """True when ``status`` is the back end's 'not ready' code."""
        return status == self.not_ready_status

    def error(self, status: int, call: Optional[str] = None, *, size: Optional[int] = None,
              device: Optional[int] = None, detail: str = "") -> HipError:
        """Build the exception for a non-zero ``status`` returned by ``call``."""
        from .failure import make_error, no_device_hint  # compiled by the first failure
        code = self.hip_code(status)
        name = None
        message = ""
        try:
            if self._error_name is not None:
                name = self._error_name(code)
            if self._error_string is not None:
                message = self._error_string(status) or ""
        except Exception:  # noqa: BLE001 - never let name lookup hide the real error
            pass
        if not name or (name == "hipErrorUnknown" and code != 999):
            name = ERROR_NAMES.get(code, "hipErrorUnknown")
        self.clear_last_error()
        if code in NO_DEVICE_CODES and call != "hipGetDeviceCount" and not self.sees_device():
            hint = no_device_hint(self.platform)
            return NoDeviceError(code, name, message, call,
                                 f"{detail}; no device is visible; {hint}" if detail
                                 else f"no device is visible; {hint}")
        return make_error(code, call, name, message, size=size, device=device, detail=detail)

    def sees_device(self) -> bool:
        """True when the runtime reports at least one device (asked each time: only error
        paths and the no-device checks call it)."""
        out = ctypes.c_int(0)
        try:
            st = self.fn.hipGetDeviceCount(out)
        except Exception:  # noqa: BLE001 - a back end that cannot answer has no device
            return False
        if st:
            self.clear_last_error()
            return False
        return out.value > 0

    def clear_last_error(self) -> None:
        """Reset the thread's last error (as RMM and CCCL do after a failure they report), so
        that other libraries sharing the runtime (PyTorch, CuPy) do not see our stale error."""
        try:
            self.fn.hipGetLastError()
        except Exception:  # noqa: BLE001 - never hide the error being reported
            pass

    def check(self, status: int, call: Optional[str] = None, **kw: Any) -> None:
        """Raise the matching HipError when ``status`` is not success."""
        if status:
            raise self.error(status, call, **kw)

    # ---- versions -------------------------------------------------------------------------
    def _int_query(self, name: str) -> int:
        out = ctypes.c_int()
        self.check(getattr(self.fn, name)(out), name)
        return out.value

    def runtime_version(self) -> Tuple[int, int, int]:
        """The runtime's version as ``(major, minor, patch)``."""
        return self._decode_version(self._int_query("hipRuntimeGetVersion"))

    def driver_version(self) -> Tuple[int, int, int]:
        """The driver's version as ``(major, minor, patch)``."""
        return self._decode_version(self._int_query("hipDriverGetVersion"))

    def __repr__(self) -> str:
        return f"<Runtime {self.platform} {self.library_path or ''}>".replace(" >", ">")

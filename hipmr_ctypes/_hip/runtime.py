"""The Runtime object: one loaded back end with its function table and error translation."""
from __future__ import annotations

import ctypes
from typing import Callable, Dict, Optional, Tuple

from .decls import DECLS
from .errors import (ERROR_NAMES, HIP_ERROR_NOT_READY, HipError, NotSupportedError,
                     make_error)

__all__ = ["Runtime", "Functions", "missing_function", "decode_hip_version"]

PLATFORMS = ("amd", "nvidia", "emulated")


class Functions:
    """A plain namespace of raw callables, one per row of ``decls.DECLS``."""

    def __repr__(self) -> str:
        return f"<Functions {len(self.__dict__)}>"


def missing_function(name: str, where: str) -> Callable[..., int]:
    """A stand-in for an optional symbol the library lacks: raises NotSupportedError when called."""

    def _missing(*args, **kwargs):
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
                 lib=None, error_name: Optional[Callable[[int], Optional[str]]] = None,
                 error_string: Optional[Callable[[int], Optional[str]]] = None,
                 to_hip: Optional[Callable[[int], int]] = None,
                 version_decoder: Callable[[int], Tuple[int, int, int]] = decode_hip_version,
                 not_ready: int = HIP_ERROR_NOT_READY, extra=None) -> None:
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

    # ---- creation -------------------------------------------------------------------------
    @staticmethod
    def create(platform: str, env=None) -> "Runtime":
        """Load a new Runtime for ``platform`` ("amd", "nvidia" or "emulated")."""
        if platform == "amd":
            return _create_amd(env)
        if platform == "nvidia":
            from .nvidia import create_nvidia_runtime
            return create_nvidia_runtime(env)
        if platform == "emulated":
            from .emulated import create_emulated_runtime
            return create_emulated_runtime(env)
        raise ValueError(f"unknown HIP platform {platform!r}; expected one of {PLATFORMS}")

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
        code = self.hip_code(status)
        name = None
        message = ""
        try:
            if self._error_name is not None:
                name = self._error_name(code)
            if self._error_string is not None:
                message = self._error_string(status) or ""
        except Exception:  # never let name lookup hide the real error
            pass
        if not name or (name == "hipErrorUnknown" and code != 999):
            name = ERROR_NAMES.get(code, "hipErrorUnknown")
        self.clear_last_error()
        return make_error(code, call, name, message, size=size, device=device, detail=detail)

    def clear_last_error(self) -> None:
        """Reset the thread's last error (as RMM and CCCL do after a failure they report), so
        that other libraries sharing the runtime (PyTorch, CuPy) do not see our stale error."""
        try:
            self.fn.hipGetLastError()
        except Exception:  # noqa: BLE001 - never hide the error being reported
            pass

    def check(self, status: int, call: Optional[str] = None, **kw) -> None:
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


def bind_library(lib, names_to_symbols: Dict[str, str], where: str) -> Functions:
    """Resolve every row of the table in ``lib`` (symbol = ``names_to_symbols.get(name, name)``)."""
    fn = Functions()
    for decl in DECLS:
        symbol = names_to_symbols.get(decl.name, decl.name)
        try:
            cfunc = getattr(lib, symbol)
        except AttributeError:
            if decl.required:
                raise NotSupportedError(
                    801, "hipErrorNotSupported",
                    f"required symbol {symbol} is missing from {where}; this library is too old "
                    f"(needs HIP {decl.since} or later)", decl.name)
            setattr(fn, decl.name, missing_function(decl.name, where))
            continue
        cfunc.restype = decl.restype
        cfunc.argtypes = list(decl.argtypes)
        setattr(fn, decl.name, cfunc)
    return fn


AMD_HINT = ("Set HIPMR_LIBRARY to the exact libamdhip64 file, or ROCM_PATH / HIP_PATH to the ROCm "
            "install; or choose another platform with HIPMR_PLATFORM=nvidia (CUDA GPUs) or "
            "HIPMR_PLATFORM=emulated (host memory, no GPU).")


def _create_amd(env=None) -> Runtime:
    from .loader import amd_candidates, load_first
    lib, path = load_first(amd_candidates(env), "libamdhip64 (HIP runtime)", AMD_HINT)
    fn = bind_library(lib, {}, path)
    get_name = fn.hipGetErrorName
    get_string = fn.hipGetErrorString

    def error_name(code: int) -> Optional[str]:
        raw = get_name(code)
        return raw.decode() if raw else None

    def error_string(code: int) -> Optional[str]:
        raw = get_string(code)
        return raw.decode() if raw else None

    return Runtime("amd", fn, path, lib, error_name, error_string)

"""The ``nvidia`` back end: the HIP function table through libcudart, as HIP's own
``nvidia_detail/nvidia_hip_runtime_api.h`` maps it (docs/internals.md, "Back ends").

libcudart is found by ``search.nvidia_candidates``.  Most functions are the CUDA runtime function
of the same shape, bound directly at load (no Python in between, so hot calls cost one ctypes
call).  The few that HIP maps onto the driver API or onto a different signature get a shim, in
``_shims.py``, compiled and built on the first call of any of them (importing the package from
a folder without ``.pyc`` compiles only this module of the back end).  Statuses stay in CUDA's numbering on the success path; ``Runtime.error`` translates a
failure with :func:`cuda_to_hip`.
"""
from __future__ import annotations

import ctypes
from _thread import RLock
from ctypes import c_char_p, c_int
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional

    from ._shims import ATTRIBUTE_MAP as ATTRIBUTE_MAP  # at run time: __getattr__, below

from ..decls import DECL_BY_NAME, DECLS, call_argtypes
from ..exceptions import ERROR_NAMES, NotSupportedError
from ..loader import load_first
from ..search import CUDART_NAMES, nvidia_candidates
from ..runtime import Functions, Runtime, decode_cuda_version, missing_function

__all__ = ["create_nvidia_runtime", "nvidia_candidates", "cuda_to_hip", "hip_to_cuda", "NAME_MAP",
           "ATTRIBUTE_MAP", "CUDART_NAMES"]

#: the rows ``_shims.build_shims`` builds (on the first call of any)
_SHIMS = ("hipInit", "hipDeviceGetName", "hipDeviceTotalMem", "hipDeviceGetAttribute",
          "hipPointerGetAttributes", "hipMemPrefetchAsync", "hipMemsetD8", "hipMemsetD8Async",
          "hipMemsetD16", "hipMemsetD16Async", "hipMemsetD32", "hipMemsetD32Async",
          "hipMemGetAddressRange", "hipMemAdvise") + (
          # virtual memory: the driver's cuMem* calls, as HIP's NVIDIA header maps them
          "hipMemAddressReserve", "hipMemAddressFree", "hipMemCreate", "hipMemRelease",
          "hipMemMap", "hipMemUnmap", "hipMemSetAccess", "hipMemGetAccess",
          "hipMemGetAllocationGranularity") + (
          # capture: CUDA 12 and 13 changed these two signatures (by runtime version)
          "hipGraphInstantiate", "hipStreamGetCaptureInfo")
_build_lock = RLock()  # reentrant: a finalizer run inside a build may call a stand-in
#: the rows not bound one to one: the shims and three Python functions of their own
_NOT_DIRECT = frozenset(_SHIMS + ("hipGetErrorName", "hipGetErrorString", "hipExtGetLastError"))
#: the one-to-one calls named otherwise than "cuda" + the name after "hip"
_RENAMED = {"hipHostMalloc": "cudaHostAlloc", "hipHostFree": "cudaFreeHost"}

#: hip name -> cudart symbol, for every call mapped one to one
NAME_MAP: Dict[str, str] = {d.name: _RENAMED.get(d.name, "cuda" + d.name[3:])
                            for d in DECLS if d.name not in _NOT_DIRECT}

# CUDA runtime codes that HIP maps to a HIP code with a different number
_CUDA_RENUMBERED = {20: 911, 18: 912}
# CUDA codes that keep their number in hipCUDAErrorTohipError (every other code -> 999)
_CUDA_KEPT = frozenset(map(int, """
    0 1 2 3 4 5 6 7 8 9 12 13 17 21 35 52 53 98 100 101 200 201 205 206 207 208 209 210 211 212
    213 214 215 216 217 218 219 300 301 302 303 304 400 401 500 600 700 701 702 704 705 708 709
    710 712 713 719 720 801 900 901 902 903 904 905 906 907 908 910 914 915""".split()))
_HIP_TO_CUDA = {v: k for k, v in _CUDA_RENUMBERED.items()}


def cuda_to_hip(code: int) -> int:
    """hipCUDAErrorTohipError: a CUDA runtime status -> the HIP status."""
    if code in _CUDA_KEPT:
        return code
    return _CUDA_RENUMBERED.get(code, 999)


def hip_to_cuda(code: int) -> int:
    """hipErrorToCudaError (used for names and messages)."""
    return _HIP_TO_CUDA.get(code, code)


HINT = ("Set HIPMR_LIBRARY to the exact libcudart file, or CUDA_HOME to the CUDA toolkit; "
        "or choose HIPMR_PLATFORM=amd or HIPMR_PLATFORM=emulated.")


def _required_missing(symbol: str, where: str, name: str) -> NotSupportedError:
    err = NotSupportedError(801, "hipErrorNotSupported",
                            f"required symbol {symbol} is missing from {where}; this is not a "
                            "CUDA runtime library, or it is too old", name)
    err._library_problem = "not a runtime"
    return err


def _raw(lib: Any, symbol: str, restype: Any, argtypes: List[Any]) -> Callable[..., Any]:
    """``symbol`` of ``lib`` with this C signature."""
    try:
        cfunc = getattr(lib, symbol)
    except AttributeError:
        raise _required_missing(symbol, getattr(lib, "_name", "the library"), symbol) from None
    cfunc.restype = restype
    cfunc.argtypes = argtypes
    bound: Callable[..., Any] = cfunc
    return bound


def create_nvidia_runtime(env: Optional[Mapping[str, str]] = None) -> Runtime:
    """Load libcudart and build the HIP function table over it (libcuda opens on first use)."""
    cudart, path = load_first(nvidia_candidates(env), "libcudart (CUDA runtime)", HINT)
    fn = Functions()
    # what ``cudart.<symbol>`` makes, without its look-up and cache (faster); a stand-in
    # library (tests) has only the look-up
    make = getattr(cudart, "_FuncPtr", None) or (lambda key: getattr(cudart, key[0]))
    for name, symbol in NAME_MAP.items():
        try:
            cfunc = make((symbol, cudart))
        except AttributeError:
            if DECL_BY_NAME[name].required:
                raise _required_missing(symbol, path, name) from None
            setattr(fn, name, missing_function(name, path))
            continue
        decl = DECL_BY_NAME[name]
        cfunc.__name__ = symbol
        cfunc.restype = decl.restype
        cfunc.argtypes = call_argtypes(decl)
        setattr(fn, name, cfunc)
    for symbol in ("cudaDeviceGetAttribute", "cudaPointerGetAttributes", "cudaMemPrefetchAsync",
                   "cudaMemAdvise"):
        if not hasattr(cudart, symbol):  # what the shims call: checked now, bound on first use
            raise _required_missing(symbol, path, symbol)

    version = c_int()
    fn.hipRuntimeGetVersion(version)
    cuda_version = version.value

    cuda_get_name = _raw(cudart, "cudaGetErrorName", c_char_p, [c_int])
    cuda_get_string = _raw(cudart, "cudaGetErrorString", c_char_p, [c_int])
    fn.hipGetErrorName = lambda code: cuda_get_name(hip_to_cuda(code))
    fn.hipGetErrorString = lambda code: cuda_get_string(hip_to_cuda(code))
    fn.hipExtGetLastError = missing_function("hipExtGetLastError", "the CUDA runtime (AMD only)")
    _install_shims(fn, cudart, cuda_version)

    def error_name(code: int) -> Optional[str]:
        return ERROR_NAMES.get(code)

    def error_string(status: int) -> Optional[str]:
        raw = cuda_get_string(status)
        return raw.decode() if raw else None

    return Runtime("nvidia", fn, path, cudart, error_name, error_string, to_hip=cuda_to_hip,
                   version_decoder=decode_cuda_version, not_ready=600,
                   extra={"cuda_version": cuda_version})


def _open_libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def _install_shims(fn: Functions, cudart: Any, cuda_version: int) -> None:
    """Put a stand-in for each shim in ``fn``: the first call of any builds them all
    (``_shims.build``) and puts each in its stand-in's place (where nothing else has replaced
    it meanwhile, as a test's spy does); a stand-in kept elsewhere calls its shim from then on."""
    built: Dict[str, Callable[..., int]] = {}

    def build() -> Dict[str, Callable[..., int]]:
        from ._shims import build_shims
        with _build_lock:
            if not built:
                shims = build_shims(cudart, cuda_version, lambda: _open_libcuda())
                for name, shim in shims.items():
                    if fn.__dict__.get(name) is stand_ins[name]:
                        setattr(fn, name, shim)
                built.update(shims)
        return built

    def stand_in(name: str) -> Callable[..., int]:
        def first_call(*args: Any) -> int:
            return (built or build())[name](*args)
        first_call.__name__ = name
        return first_call

    stand_ins = {name: stand_in(name) for name in _SHIMS}
    for name, func in stand_ins.items():
        setattr(fn, name, func)


def __getattr__(name: str) -> Any:
    """``ATTRIBUTE_MAP`` (HIP's device attributes -> CUDA's) lives with the shims that use it."""
    if name == "ATTRIBUTE_MAP":
        from ._shims import ATTRIBUTE_MAP
        return ATTRIBUTE_MAP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The ``amd`` back end: libamdhip64, found by ``search.amd_candidates``, every row of the
declaration table bound directly (no Python in between, so a hot call costs one ctypes call)."""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional

from .decls import DECLS, call_argtypes
from .exceptions import NotSupportedError
from .loader import load_first
from .search import AMD_NAMES, amd_candidates
from .runtime import Functions, Runtime, missing_function

__all__ = ["create_amd_runtime", "bind_library", "amd_candidates", "AMD_HINT", "AMD_NAMES"]


def bind_library(lib: Any, names_to_symbols: Dict[str, str], where: str) -> Functions:
    """Resolve every row of the table in ``lib`` (symbol = ``names_to_symbols.get(name, name)``)."""
    fn = Functions()
    # what ``lib.<symbol>`` makes, without its look-up and cache (faster); a stand-in
    # library (tests) has only the look-up
    make = getattr(lib, "_FuncPtr", None) or (lambda key: getattr(lib, key[0]))
    for decl in DECLS:
        symbol = names_to_symbols.get(decl.name, decl.name)
        try:
            cfunc = make((symbol, lib))
        except AttributeError:
            if decl.required:
                if not any(hasattr(lib, names_to_symbols.get(d.name, d.name))
                           for d in DECLS if d.required):
                    err = NotSupportedError(
                        801, "hipErrorNotSupported",
                        f"{where} is not a HIP runtime library (it exports none of the "
                        f"required functions, {symbol} among them)", decl.name)
                    err._library_problem = "not a runtime"
                    raise err
                err = NotSupportedError(
                    801, "hipErrorNotSupported",
                    f"required symbol {symbol} is missing from {where}; this library is too old "
                    f"(needs HIP {decl.since} or later)", decl.name)
                err._library_problem = "too old"
                raise err
            setattr(fn, decl.name, missing_function(decl.name, where))
            continue
        cfunc.__name__ = symbol
        cfunc.restype = decl.restype
        cfunc.argtypes = call_argtypes(decl)
        setattr(fn, decl.name, cfunc)
    return fn


AMD_HINT = ("Set HIPMR_LIBRARY to the exact libamdhip64 file, or ROCM_PATH (ROCM_HOME, HIP_PATH) to "
            "the ROCm install; or choose another platform with HIPMR_PLATFORM=nvidia (CUDA GPUs) or "
            "HIPMR_PLATFORM=emulated (host memory, no GPU).")


def create_amd_runtime(env: Optional[Mapping[str, str]] = None) -> Runtime:
    """Load libamdhip64 and bind the declaration table in it."""
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

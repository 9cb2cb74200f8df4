"""The platform choice and each platform's library search (libamdhip64 on ``amd``, libcudart
on ``nvidia``), and opening the library at import (:func:`preload_library`, through
``hipmr_ctypes._hip.preload``).

The first use of the runtime binds the function table in the library: ``loader.load_first``
finds, through :func:`open_first`, the handle import opened (``_opened``) rather than opening
it again.  The search is documented and bounded: explicit variables first, then a few
well-known folders, then the system loader.  Nothing else on the file system is scanned.
This module runs at import: it imports no other module of the package, and its annotations
are strings.
"""
import ctypes
import os
import sys
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = ["PLATFORMS", "setting_error", "selected_platform", "preload_library", "open_first",
           "candidates", "amd_candidates", "nvidia_candidates", "rocm_sdk_dirs", "AMD_NAMES",
           "CUDART_NAMES", "ROCM_VARIABLES", "ROCM_SDK_CORE", "SEARCHED"]

#: Every value ``HIPMR_PLATFORM`` may take.
PLATFORMS = ("amd", "nvidia", "emulated")
AMD_NAMES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5")
CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")
#: the variables naming a ROCm install root, searched in this order (``$VAR/lib``): ROCm's own
#: ROCM_PATH, ROCM_HOME (PyTorch's and AMD's Python loader's name for it), HIP_PATH
ROCM_VARIABLES = ("ROCM_PATH", "ROCM_HOME", "HIP_PATH")
#: the package folder of AMD's ``rocm-sdk-core`` wheel, which holds the HIP runtime in ``lib``
ROCM_SDK_CORE = "_rocm_sdk_core"



def setting_error(variable: str, message: str) -> ValueError:
    """The ValueError for a ``HIPMR_*`` environment variable whose value the package cannot
    use; its ``setting`` attribute names the variable (the command line chooses its hint by
    it, not by the message)."""
    error = ValueError(message)
    setattr(error, "setting", variable)
    return error


#: the libraries import opened: candidate -> handle (a handle is never closed)
_opened: "Dict[str, ctypes.CDLL]" = {}


def selected_platform(env: "Optional[Mapping[str, str]]" = None) -> str:
    """The platform named by ``HIPMR_PLATFORM`` (or HIP's ``HIP_PLATFORM=nvidia``); default ``amd``."""
    env = os.environ if env is None else env
    value = (env.get("HIPMR_PLATFORM") or "").strip().lower()
    if not value:
        hip_platform = (env.get("HIP_PLATFORM") or "").strip().lower()
        value = "nvidia" if hip_platform in ("nvidia", "nvcc") else "amd"
    if value not in PLATFORMS:
        raise setting_error("HIPMR_PLATFORM",
                            f"HIPMR_PLATFORM={value!r} is not one of {', '.join(PLATFORMS)}")
    return value


def amd_candidates(env: "Optional[Mapping[str, str]]" = None) -> "List[str]":
    """Every path (or bare name for the system loader) tried for libamdhip64, in order."""
    env = os.environ if env is None else env
    if env.get("HIPMR_LIBRARY"):  # an exact file: nothing else is tried
        return [env["HIPMR_LIBRARY"]]
    dirs = [os.path.join(env[var], "lib") for var in ROCM_VARIABLES if env.get(var)]
    dirs.extend(rocm_sdk_dirs())
    dirs.append("/opt/rocm/lib")
    dirs.extend(sorted(_matching("/opt", "rocm-", "lib"), key=_version_key, reverse=True))
    # then the system loader (LD_LIBRARY_PATH, ld.so.cache)
    return _in_dirs(list(dict.fromkeys(dirs)), AMD_NAMES) + list(AMD_NAMES)


def rocm_sdk_dirs() -> "List[str]":
    """The library folders of AMD's ``rocm-sdk`` wheels in this environment: the runtime
    wheel installs ``site-packages/_rocm_sdk_core/lib/libamdhip64.so``, which is what AMD's
    own ``rocm_sdk.find_libraries`` returns.  Each ``sys.path`` entry is looked at directly
    (``rocm_sdk`` itself is not imported: importing it would cost every import of this
    package)."""
    found: "List[str]" = []
    for entry in sys.path:
        lib = os.path.join(entry, ROCM_SDK_CORE, "lib") if entry else ""
        if lib and os.path.isdir(lib):
            found.append(lib)
    return found


def nvidia_candidates(env: "Optional[Mapping[str, str]]" = None) -> "List[str]":
    """Every path (or bare name) tried for libcudart, in order."""
    env = os.environ if env is None else env
    if env.get("HIPMR_LIBRARY"):  # an exact file: nothing else is tried
        return [env["HIPMR_LIBRARY"]]
    dirs = [os.path.join(env["CUDA_HOME"], "lib64")] if env.get("CUDA_HOME") else []
    dirs.extend(sorted(_matching("/usr/local", "cuda", "lib64"), key=_version_key,
                       reverse=True))
    for entry in sys.path:  # the nvidia-cuda-runtime wheels: site-packages/nvidia/cu*/lib
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            dirs.extend(sorted(_matching(os.path.join(entry, "nvidia"), "cu", "lib"),
                               reverse=True))
            runtime_lib = os.path.join(entry, "nvidia", "cuda_runtime", "lib")
            if os.path.lexists(runtime_lib):
                dirs.append(runtime_lib)
    return _in_dirs(dirs, CUDART_NAMES) + list(CUDART_NAMES)


#: where each platform's search looks, in order, in a user's words (what the command line
#: prints when it finds no runtime at all)
SEARCHED = {
    "amd": ["$HIPMR_LIBRARY (the exact file; nothing else is tried when it is set)",
            "$ROCM_PATH/lib, $ROCM_HOME/lib, $HIP_PATH/lib",
            f"{ROCM_SDK_CORE}/lib in each sys.path folder (AMD's rocm-sdk wheels)",
            "/opt/rocm/lib, then /opt/rocm-*/lib (newest first)",
            "the system loader (LD_LIBRARY_PATH, ld.so.cache): " + ", ".join(AMD_NAMES)],
    "nvidia": ["$HIPMR_LIBRARY (the exact file; nothing else is tried when it is set)",
               "$CUDA_HOME/lib64", "/usr/local/cuda*/lib64 (newest first)",
               "nvidia/cu*/lib and nvidia/cuda_runtime/lib in each sys.path folder "
               "(the nvidia-cuda-runtime wheels)",
               "the system loader (LD_LIBRARY_PATH, ld.so.cache): " + ", ".join(CUDART_NAMES)],
}


def candidates(platform: str, env: "Optional[Mapping[str, str]]" = None) -> "List[str]":
    """The library search of ``platform`` (``amd`` or ``nvidia``)."""
    return amd_candidates(env) if platform == "amd" else nvidia_candidates(env)


def preload_library(platform: str) -> None:
    """Open the first of ``platform``'s candidates that opens, for :func:`open_first` to find
    again at the first use (import; silent: a library that does not open is reported then)."""
    open_first(candidates(platform), [])


def open_first(candidates: "List[str]", tried: "List[str]",
               absent: "Optional[List[str]]" = None) -> "Optional[Tuple[ctypes.CDLL, str]]":
    """The first of ``candidates`` that opens and its name, or None; each one that does not
    is appended to ``tried`` with the reason, and also to ``absent`` (when given) if there is
    no such file at all, as opposed to a file that exists and fails to load.  A handle is
    opened once per candidate and kept in ``_opened`` (handles are never closed)."""
    for cand in candidates:
        if os.sep in cand and not os.path.exists(cand):
            tried.append(f"{cand} (no such file)")
            if absent is not None:
                absent.append(cand)
            continue
        lib = _opened.get(cand)
        if lib is None:
            try:
                lib = _opened[cand] = ctypes.CDLL(cand)
            except OSError as exc:
                tried.append(f"{cand} ({exc})")
                # the system loader reports a bare name it cannot find with that name first;
                # a library it found whose own dependency is missing names the dependency
                if absent is not None and os.sep not in cand and str(exc).startswith(
                        f"{cand}: cannot open shared object file: No such file"):
                    absent.append(cand)
                continue
        return lib, cand
    return None


def _version_key(path: str) -> "Tuple[int, ...]":
    """The numbers in the name of the folder holding ``path``'s last part: a sort key."""
    text = os.path.basename(os.path.dirname(path.rstrip("/"))) or path
    nums: "List[int]" = []
    digits = ""
    for ch in text + " ":
        if ch.isdecimal():
            digits += ch
        elif digits:
            nums.append(int(digits))
            digits = ""
    return tuple(nums)


def _matching(parent: str, prefix: str, rest: str) -> "List[str]":
    """``glob(parent/prefix*/rest)`` without the glob module (kept off the import path): the
    existing ``parent/<name>/rest`` for each folder ``name`` in ``parent`` starting with
    ``prefix`` (not hidden), in directory order."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith(prefix) and not name.startswith("."):
            folder = os.path.join(parent, name)
            path = os.path.join(folder, rest)
            if os.path.isdir(folder) and os.path.lexists(path):
                found.append(path)
    return found


def _in_dirs(dirs: "List[str]", names: "Iterable[str]") -> "List[str]":
    return [os.path.join(d, n) for d in dirs for n in names]

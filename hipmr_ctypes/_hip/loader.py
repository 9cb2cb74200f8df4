"""Loading the runtime library (libamdhip64 on ``amd``, libcudart on ``nvidia``): the first of
a back end's candidates that loads, and the helpers of the back ends' searches.

Each back end lists its own candidates (``amd.amd_candidates``,
``nvidia.nvidia_candidates``: a platform compiles only its own search).  The search is
documented and bounded: explicit variables first, then a few well-known folders, then the
system loader.  Nothing else on the file system is scanned.
"""
from __future__ import annotations

import ctypes
import os
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Iterable, List, Optional, Tuple

from .errors import LibraryNotFoundError

__all__ = ["load_first", "library_version_from_path"]

def _version_key(path: str) -> Tuple[int, ...]:
    """The numbers in the name of the folder holding ``path``'s last part: a sort key."""
    text = os.path.basename(os.path.dirname(path.rstrip("/"))) or path
    nums: List[int] = []
    digits = ""
    for ch in text + " ":
        if ch.isdecimal():
            digits += ch
        elif digits:
            nums.append(int(digits))
            digits = ""
    return tuple(nums)


def _matching(parent: str, prefix: str, rest: str) -> List[str]:
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


def _in_dirs(dirs: List[str], names: Iterable[str]) -> List[str]:
    return [os.path.join(d, n) for d in dirs for n in names]


def load_first(candidates: List[str], what: str, hint: str) -> Tuple[ctypes.CDLL, str]:
    """Load the first candidate that loads; raise LibraryNotFoundError listing all tried."""
    tried = []
    for cand in candidates:
        if os.sep in cand and not os.path.exists(cand):
            tried.append(f"{cand} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(cand)
        except OSError as exc:
            tried.append(f"{cand} ({exc})")
            continue
        return lib, _real_path(lib, cand)
    lines = "\n  ".join(tried)
    raise LibraryNotFoundError(f"could not load {what}; tried:\n  {lines}\n{hint}", tried)


def _real_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the dynamic loader actually opened (read from /proc/self/maps on Linux)."""
    name = os.path.basename(fallback).split(".so")[0]
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if path.startswith("/") and os.path.basename(path).startswith(name + ".so"):
                    return os.path.realpath(path)
    except OSError:
        pass
    return fallback


def library_version_from_path(path: Optional[str]) -> Optional[str]:
    """The version suffix of a library file name (``libamdhip64.so.5.2.21153`` -> ``5.2.21153``)."""
    if not path:
        return None
    tail = path.rpartition(".so.")[2] if ".so." in path else ""
    if not tail or not all(ch == "." or ch.isdecimal() for ch in tail):
        return None
    return tail

"""Loading the runtime library for a back end: the first of its candidates that loads (the
handle import opened, when import opened that one), and the library file's version.

Where each platform looks is ``search.py``, which import runs.
"""
import ctypes
import os
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

from .search import open_first

__all__ = ["load_first", "library_version_from_path"]


def load_first(candidates: "List[str]", what: str, hint: str) -> "Tuple[ctypes.CDLL, str]":
    """Load the first candidate that loads (the handle import opened, when it opened this
    one); raise LibraryNotFoundError listing all tried."""
    tried: "List[str]" = []
    absent: "List[str]" = []
    found = open_first(candidates, tried, absent)
    if found is not None:
        return found[0], _real_path(*found)
    from .exceptions import LibraryNotFoundError
    lines = "\n  ".join(tried)
    error = LibraryNotFoundError(f"could not load {what}; tried:\n  {lines}\n{hint}", tried,
                                 what=what, hint=hint)
    # none of the candidates exists (nothing installed), rather than one that fails to load
    error._absent = len(absent) == len(candidates)
    raise error


def _real_path(lib: "ctypes.CDLL", fallback: str) -> str:
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


def library_version_from_path(path: "Optional[str]") -> "Optional[str]":
    """The version suffix of a library file name (``libamdhip64.so.5.2.21153`` -> ``5.2.21153``)."""
    if not path:
        return None
    tail = path.rpartition(".so.")[2] if ".so." in path else ""
    if not tail or not all(ch == "." or ch.isdecimal() for ch in tail):
        return None
    return tail

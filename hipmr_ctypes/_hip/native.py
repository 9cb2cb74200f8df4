"""The C functions the package calls that are not HIP: the C library's and Python's own C API.

HIP's functions are in the one declaration table (``decls.py``); everything else is declared
here, once, each with its prototype, on handles of this module's own (so no other library's
``argtypes`` are changed):

=================================  ==========================================================  =======================
function                           prototype                                                   used by
=================================  ==========================================================  =======================
``posix_memalign``                 ``int (void **, size_t alignment, size_t size)``            host resource, emulator
``free``                           ``void (void *)``                                           host resource, emulator
``strdup``                         ``char *(const char *)``                                    DLPack (capsule names)
``PyObject_GetBuffer``             ``int (PyObject *, Py_buffer *, int flags)``                Buffer (host views)
``PyBuffer_Release``               ``void (Py_buffer *)``                                      Buffer (host views)
``PyCapsule_New``                  ``PyObject *(void *, const char *, PyCapsule_Destructor)``  DLPack
``PyCapsule_IsValid``              ``int (PyObject *, const char *)``                          DLPack
``PyCapsule_GetPointer``           ``void *(PyObject *, const char *)``                        DLPack
``PyCapsule_SetName``              ``int (PyObject *, const char *)``                          DLPack (import)
``Py_IncRef``                      ``void (PyObject *)``                                       DLPack
``MPIX_Query_*_support``           ``int (void)`` (Open MPI's ``cuda`` / ``rocm`` extensions)  interop.mpi
``PyBytes_FromStringAndSize``      ``PyObject *(const char *, Py_ssize_t)``                    Buffer (tobytes)
``PyBytes_AsString``               ``char *(PyObject *)``                                      Buffer (tobytes)
``PyByteArray_FromStringAndSize``  ``PyObject *(const char *, Py_ssize_t)``                    Buffer (copy_to_host)
``madvise``                        ``int (void *, size_t, int advice)``                        huge pages (host copies)
``mmap``                           ``void *(void *, size_t, int prot, int flags, int fd, off_t)``  emulator (virtual memory)
``munmap``                         ``int (void *, size_t)``                                    emulator (virtual memory)
``mprotect``                       ``int (void *, size_t, int prot)``                          emulator (virtual memory)
=================================  ==========================================================  =======================

Each declares on first use: ``posix_memalign`` and ``free`` through
:func:`memalign_and_free`, the others when a module first imports one of them (PEP 562), so
that the emulator, which needs only the first two, declares nothing else.  A
leaf: it imports only the standard library.
"""
from __future__ import annotations

import ctypes
import sys
from _thread import allocate_lock
from ctypes import POINTER, Structure, c_char_p, c_int, c_ssize_t, c_void_p
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    strdup: Callable[..., Any]
    PyObject_GetBuffer: Callable[..., Any]
    PyBuffer_Release: Callable[..., Any]
    PyCapsule_New: Callable[..., Any]
    PyCapsule_IsValid: Callable[..., Any]
    PyCapsule_GetPointer: Callable[..., Any]
    PyCapsule_SetName: Callable[..., Any]
    Py_IncRef: Callable[..., Any]
    PyBytes_FromStringAndSize: Callable[..., Any]
    PyBytes_AsString: Callable[..., Any]
    PyByteArray_FromStringAndSize: Callable[..., Any]

__all__ = ["memalign_and_free", "madvise", "address_space_calls", "strdup", "Py_buffer", "PyBUF_WRITABLE", "PyBUF_C_CONTIGUOUS",
           "PyObject_GetBuffer", "PyBuffer_Release", "PyCapsule_New", "PyCapsule_IsValid",
           "PyCapsule_GetPointer", "PyCapsule_SetName", "Py_IncRef", "mpi_gpu_queries",
           "PyBytes_FromStringAndSize", "PyBytes_AsString", "PyByteArray_FromStringAndSize"]


def _declare(lib: Any, name: str, restype: Any, argtypes: Sequence[Any]) -> Any:
    cfunc = getattr(lib, name)
    cfunc.restype = restype
    cfunc.argtypes = list(argtypes)
    return cfunc


# ---- the C library ------------------------------------------------------------------------
_lock = allocate_lock()
_loaded: Optional[Tuple[Any, Any]] = None
_tried = False


def memalign_and_free() -> Optional[Tuple[Any, Any]]:
    """``(posix_memalign, free)`` with their prototypes set, or None where the C library has no
    ``posix_memalign``.  Loaded once; the process's own symbols are tried first (the C
    library's file is looked for only where they lack them: that runs ``ldconfig``)."""
    global _loaded, _tried
    with _lock:
        if not _tried:
            _tried = True
            for name in (None, "libc"):
                try:
                    if name is not None:
                        from ctypes.util import find_library
                        name = find_library("c")
                    lib = ctypes.CDLL(name)  # a handle of our own: its functions, our argtypes
                    _loaded = (
                        _declare(lib, "posix_memalign", c_int,
                                 [POINTER(c_void_p), ctypes.c_size_t, ctypes.c_size_t]),
                        _declare(lib, "free", None, [c_void_p]))
                except (OSError, AttributeError, TypeError):
                    continue
                break
        return _loaded


_madvise: "List[Optional[Any]]" = []   # [] not looked up yet; [None]: the C library has none


def madvise() -> Optional[Any]:
    """``madvise`` with its prototype set (Linux), or None where there is none.  Looked up
    once (two threads looking up at once is harmless)."""
    if not _madvise:
        found = None
        if sys.platform.startswith("linux"):
            try:
                found = _declare(ctypes.CDLL(None), "madvise", c_int,
                                 [c_void_p, ctypes.c_size_t, c_int])
            except (OSError, AttributeError):
                found = None
        _madvise.append(found)
    return _madvise[0]


_address_space: "List[Optional[Tuple[Any, Any, Any]]]" = []   # as _madvise


def address_space_calls() -> Optional[Tuple[Any, Any, Any]]:
    """``(mmap, munmap, mprotect)`` with their prototypes set (Linux), or None where there are
    none.  ``mmap`` returns an int (``MAP_FAILED`` is ``2**64 - 1``) or None.  Looked up once."""
    if not _address_space:
        found = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                found = (_declare(libc, "mmap", c_void_p,
                                  [c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long]),
                         _declare(libc, "munmap", c_int, [c_void_p, ctypes.c_size_t]),
                         _declare(libc, "mprotect", c_int, [c_void_p, ctypes.c_size_t, c_int]))
            except (OSError, AttributeError):
                found = None
        _address_space.append(found)
    return _address_space[0]


# ---- Python's C API -----------------------------------------------------------------------
class Py_buffer(Structure):
    """CPython's ``Py_buffer`` (stable since Python 3.3)."""
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", c_ssize_t),
                ("itemsize", c_ssize_t), ("readonly", c_int), ("ndim", c_int),
                ("format", c_char_p), ("shape", POINTER(c_ssize_t)),
                ("strides", POINTER(c_ssize_t)), ("suboffsets", POINTER(c_ssize_t)),
                ("internal", c_void_p)]


PyBUF_WRITABLE = 0x0001
PyBUF_C_CONTIGUOUS = 0x0038


def _declare_the_rest() -> Dict[str, Any]:
    """``strdup`` (``char *strdup(const char *)``: C strings that must outlive every Python
    object) and the interpreter's own functions, through handles of our own."""
    py = ctypes.PyDLL(None)
    return {
        "strdup": _declare(ctypes.CDLL(None), "strdup", c_void_p, [c_char_p]),
        "PyObject_GetBuffer": _declare(py, "PyObject_GetBuffer", c_int,
                                       [ctypes.py_object, POINTER(Py_buffer), c_int]),
        "PyBuffer_Release": _declare(py, "PyBuffer_Release", None, [POINTER(Py_buffer)]),
        "PyCapsule_New": _declare(py, "PyCapsule_New", ctypes.py_object,
                                  [c_void_p, c_void_p, c_void_p]),
        "PyCapsule_IsValid": _declare(py, "PyCapsule_IsValid", c_int, [c_void_p, c_void_p]),
        "PyCapsule_GetPointer": _declare(py, "PyCapsule_GetPointer", c_void_p,
                                         [c_void_p, c_void_p]),
        "PyCapsule_SetName": _declare(py, "PyCapsule_SetName", c_int, [c_void_p, c_void_p]),
        "Py_IncRef": _declare(py, "Py_IncRef", None, [ctypes.py_object]),
        # NULL contents: a new object of that size, not yet written (the caller fills it
        # before anyone else sees it)
        "PyBytes_FromStringAndSize": _declare(py, "PyBytes_FromStringAndSize",
                                              ctypes.py_object, [c_void_p, c_ssize_t]),
        "PyBytes_AsString": _declare(py, "PyBytes_AsString", c_void_p, [ctypes.py_object]),
        "PyByteArray_FromStringAndSize": _declare(py, "PyByteArray_FromStringAndSize",
                                                  ctypes.py_object, [c_void_p, c_ssize_t]),
    }


def __getattr__(name: str) -> Any:
    """The functions of :func:`_declare_the_rest`, declared by the first use of any."""
    if name in ("strdup", "PyObject_GetBuffer", "PyBuffer_Release", "PyCapsule_New",
                "PyCapsule_IsValid", "PyCapsule_GetPointer", "PyCapsule_SetName", "Py_IncRef",
                "PyBytes_FromStringAndSize", "PyBytes_AsString",
                "PyByteArray_FromStringAndSize"):
        if "strdup" not in globals():  # (no lock: two threads declaring at once is harmless)
            globals().update(_declare_the_rest())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- MPI libraries' GPU queries ----------------------------------------------------------------
def mpi_gpu_queries(path: str) -> Dict[str, Optional[bool]]:
    """``{"cuda": ..., "rocm": ...}``: what Open MPI's extensions ``int
    MPIX_Query_cuda_support(void)`` and ``int MPIX_Query_rocm_support(void)`` say, looked up in
    the library at ``path`` (mpi4py's extension module: its dependencies, libmpi among them,
    are searched too) on a handle of our own; None where the library has no such function.
    ``OSError`` when ``path`` cannot be opened."""
    lib = ctypes.CDLL(path)
    found: Dict[str, Optional[bool]] = {}
    for key, name in (("cuda", "MPIX_Query_cuda_support"), ("rocm", "MPIX_Query_rocm_support")):
        try:
            query = _declare(lib, name, c_int, [])
        except AttributeError:
            found[key] = None
        else:
            found[key] = bool(query())
    return found

"""DLPack export with ctypes only: builds ``DLManagedTensor`` (capsule name ``"dltensor"``) and
``DLManagedTensorVersioned`` (``"dltensor_versioned"``, DLPack 1.0) capsules over a Buffer's
memory, viewed as a 1-D array of ``uint8``.

Lifetime: each export is kept in ``_exports`` (address of the managed tensor -> (owner,
structures)) until its deleter runs, so the owner (a Buffer) stays alive while a consumer uses
the memory.  The consumer calls the deleter once it is done.  If nobody consumes the capsule,
the capsule's destructor calls it, but only while the capsule still has its original name (a
consumer renames it to ``"used_dltensor"`` when it takes ownership).

The deleter and the destructor are Python functions behind module-level ``CFUNCTYPE`` objects.
A ctypes callback destroys any Python exception pending when it starts (CPython turns it into a
SystemError and prints it as unraisable), and a capsule is typically freed by a consumer that
has just failed, with its exception pending.  So no capsule is ever freed outside this module:
``_capsules`` holds a reference to each one, and :func:`reap` drops the capsules nobody else
holds any more, in ordinary Python code.  It runs at each export, after each garbage
collection (``gc.callbacks``) and at exit.  The capsule names live in memory that is never
freed.  Nothing here raises out of a C callback.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import itertools
import sys
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_int32, c_int64, c_uint8,
                    c_uint16, c_uint32, c_uint64, c_void_p)
from typing import Any, Dict, Tuple

from .._hip.native import (PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New, Py_IncRef,
                          strdup)

__all__ = ["kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLROCM", "kDLROCMHost", "kDLCUDAManaged",
           "DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "DLManagedTensorVersioned",
           "export", "exported", "live_exports", "reap", "check_max_version"]

kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLROCM = 10
kDLROCMHost = 11
kDLCUDAManaged = 13
kDLUInt = 1
#: DLPACK_FLAG_BITMASK_READ_ONLY of ``DLManagedTensorVersioned.flags``
FLAG_READ_ONLY = 1
DLPACK_MAJOR, DLPACK_MINOR = 1, 0


def check_max_version(max_version: Any) -> Tuple[int, int]:
    """``__dlpack__``'s ``max_version``: a ``(major, minor)`` pair of ints >= 0; TypeError for
    anything else (a triple, a bare int, a string...)."""
    try:
        major, minor = max_version
    except (TypeError, ValueError):
        raise TypeError(f"max_version must be a (major, minor) tuple, not "
                        f"{max_version!r}") from None
    for part in (major, minor):
        if isinstance(part, bool) or not isinstance(part, int) or part < 0:
            raise TypeError(f"max_version must be a (major, minor) tuple of ints >= 0, not "
                            f"{max_version!r}")
    return int(major), int(minor)


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


class _Legacy(Structure):
    """One legacy export: the managed tensor first (its address is the capsule's pointer)."""
    _fields_ = [("managed", DLManagedTensor), ("shape", c_int64 * 1)]


class _Versioned(Structure):
    """One versioned export."""
    _fields_ = [("managed", DLManagedTensorVersioned), ("shape", c_int64 * 1)]


# export token (the manager_ctx of its managed tensor) -> (owner, the ctypes structure)
_exports: Dict[int, Tuple[Any, Structure]] = {}
# export token -> its capsule (see the module docstring)
_capsules: Dict[int, Any] = {}
_tokens = itertools.count(1)
_reap_lock = threading.RLock()
_hooks_installed = False

# Capsule names must outlive every capsule (a capsule keeps the char*): copies that are never
# freed, so a capsule destroyed late in interpreter shutdown still reads valid memory.
_NAME = strdup(b"dltensor")
_NAME_VERSIONED = strdup(b"dltensor_versioned")
_CTX_LEGACY = DLManagedTensor.manager_ctx.offset
_CTX_VERSIONED = DLManagedTensorVersioned.manager_ctx.offset


def _release(managed: int, ctx_offset: int, _exports: Any = _exports,
             _at: Any = c_void_p.from_address) -> None:
    """The deleter's work: forget the export whose managed tensor is at ``managed``; when it
    was its owner's last, tell the owner (``owner._exports_released()``, if it has one: a
    Buffer closed meanwhile frees its memory then, as ``close()`` promises).

    It may run while the interpreter is torn down (a capsule still held at exit), when module
    globals and even builtins are gone: it looks no global name up (the defaults bind them)
    and catches with a bare ``except``, which needs no name either."""
    try:
        entry = _exports.pop(_at(managed + ctx_offset).value, None)
        if entry is not None:
            owner = entry[0]
            del entry
            for other, _ in list(_exports.values()):
                if other is owner:
                    return
            last = getattr(owner, "_exports_released", None)
            if last is not None:
                last()
    except:  # noqa: E722
        pass


_DELETER_T = CFUNCTYPE(None, c_void_p)
_deleter = _DELETER_T(lambda managed, _r=_release, _o=_CTX_LEGACY: _r(managed, _o))
_deleter_versioned = _DELETER_T(lambda managed, _r=_release, _o=_CTX_VERSIONED: _r(managed, _o))
_DELETER = ctypes.cast(_deleter, c_void_p).value
_DELETER_VERSIONED = ctypes.cast(_deleter_versioned, c_void_p).value


def _destroy_capsule(capsule: int, _valid: Any = PyCapsule_IsValid,
                     _get: Any = PyCapsule_GetPointer, _release: Any = _release,
                     _names: Any = ((_NAME, _CTX_LEGACY), (_NAME_VERSIONED, _CTX_VERSIONED))
                     ) -> None:
    """PyCapsule destructor: call the deleter of a capsule nobody consumed.  Like
    :func:`_release`, safe while the interpreter is torn down (no global lookups)."""
    try:
        for name, offset in _names:
            if _valid(capsule, name):
                _release(_get(capsule, name), offset)
                break
    except:  # noqa: E722 - never raise out of a C callback
        pass


_DESTRUCTOR_T = CFUNCTYPE(None, c_void_p)
_destructor = _DESTRUCTOR_T(_destroy_capsule)
_DESTRUCTOR = ctypes.cast(_destructor, c_void_p).value

# C code calls these thunks through raw pointers (capsules, consumers' deleter calls) until the
# very end of interpreter shutdown, after this module is torn down: one extra reference each
# keeps them (and their code) alive for the life of the process.
for _thunk in (_deleter, _deleter_versioned, _destructor):
    Py_IncRef(_thunk)
del _thunk


def _fill(tensor: DLTensor, ptr: int, size: int, device: Tuple[int, int],
          shape: Any) -> None:
    tensor.data = ptr or None
    tensor.device = DLDevice(device[0], device[1])
    tensor.ndim = 1
    tensor.dtype = DLDataType(kDLUInt, 8, 1)
    shape[0] = size
    tensor.shape = ctypes.cast(shape, POINTER(c_int64))
    tensor.strides = None
    tensor.byte_offset = 0


def export(owner: Any, ptr: int, size: int, device: Tuple[int, int],
           versioned: bool = False, readonly: bool = False) -> Any:
    """A new DLPack capsule over ``[ptr, ptr + size)`` (uint8, 1-D) that keeps ``owner`` alive
    until the consumer's deleter call; ``readonly`` sets the read-only flag of a versioned
    one (a legacy capsule cannot say so: ValueError)."""
    record: Structure
    if readonly and not versioned:
        raise ValueError("a legacy DLPack capsule cannot mark memory read-only")
    token = next(_tokens)
    if versioned:
        record = _Versioned()
        record.managed.version = DLPackVersion(DLPACK_MAJOR, DLPACK_MINOR)
        record.managed.flags = FLAG_READ_ONLY if readonly else 0
        record.managed.deleter = _DELETER_VERSIONED
        name = _NAME_VERSIONED
    else:
        record = _Legacy()
        record.managed.deleter = _DELETER
        name = _NAME
    _fill(record.managed.dl_tensor, ptr, size, device, record.shape)
    record.managed.manager_ctx = token
    reap()
    _exports[token] = (owner, record)
    try:
        capsule = PyCapsule_New(ctypes.addressof(record), name, _DESTRUCTOR)
    except BaseException:
        _exports.pop(token, None)
        raise
    _capsules[token] = capsule
    _install_hooks()
    return capsule


def _refs(table: Dict[int, Any], token: int) -> int:
    """``sys.getrefcount`` of ``table[token]`` as seen from here (-1: no such entry)."""
    obj = table.get(token)
    return -1 if obj is None else sys.getrefcount(obj)


# What _refs counts for an object nobody but its table holds, measured on this build: the
# count of the look-up's own references differs between versions (CPython 3.14 borrows them
# on the evaluation stack), so no version's number is written here.
_ALONE = _refs({0: object()}, 0)


def reap() -> None:
    """Drop the capsules nobody else holds: their destructors run now, in a safe context, and
    release the exports nobody consumed.  Whether anybody else holds a capsule is only known
    from its reference count (the consumer's references are not the package's to see)."""
    with _reap_lock:
        for token in list(_capsules):
            if 0 <= _refs(_capsules, token) <= _ALONE:
                _capsules.pop(token, None)


def _after_gc(phase: str, info: Any) -> None:
    if phase == "stop" and _capsules:
        reap()


def _install_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        _hooks_installed = True
        gc.callbacks.append(_after_gc)
        atexit.register(reap)


def exported(owner: Any) -> bool:
    """True while some export of ``owner`` waits for its deleter."""
    reap()
    return any(o is owner for o, _ in list(_exports.values()))


def live_exports() -> int:
    """How many exports still keep their owner alive (after a :func:`reap`)."""
    reap()
    return len(_exports)

"""``stream_ref``: a non-owning, immutable reference to a HIP stream (libhipcxx
``cuda::stream_ref``).

Building and comparing stream refs needs no HIP library; ``wait()``, ``ready()``,
``priority()`` and ``device()`` reach the binding (``hipmr_ctypes._hip.get_runtime()``) only
when called.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._limits import MAX_ADDRESS

__all__ = ["stream_ref", "stream_per_thread", "as_stream_handle", "MAX_ADDRESS", "IntValue",
           "PER_THREAD_HANDLE"]


class IntValue(int):
    """An int that may also be called, returning itself as a plain int.

    The package reads a stream's ``device`` and ``priority`` (and a pool's ``peak_pool_size``)
    as attributes; libhipcxx and earlier versions of this package call them
    (``ref.priority()``).  Both spellings give the same value, so ``s.ref.device == 0`` is
    never silently False.
    """

    __slots__ = ()

    def __call__(self) -> int:
        return int(self)


_set = object.__setattr__
_binding_module: List[Any] = []  # the binding once first needed (``hipmr_ctypes.stream`` primes it)


def _runtime() -> Any:
    """The binding's runtime.  The module is kept once found: at interpreter exit, while the
    modules are torn down, an import statement fails, and finalizers may still wait on a
    stream."""
    if not _binding_module:
        from . import _hip
        _binding_module.append(_hip)
    return _binding_module[0].get_runtime()


def _plain_handle(value: Any, what: str, name: str) -> int:
    """An int or ``ctypes.c_void_p`` handle as an int."""
    if isinstance(value, int):
        if isinstance(value, bool):
            raise TypeError(f"{name}{what} must be an int or ctypes.c_void_p handle, not bool")
        return _in_range(value, name)
    ctypes = sys.modules.get("ctypes")  # a c_void_p exists only if ctypes was imported
    if ctypes is not None and isinstance(value, ctypes.c_void_p):
        return value.value or 0
    raise TypeError(f"{name}{what} must be an int or ctypes.c_void_p handle, not "
                    f"{type(value).__name__}")


def _in_range(handle: int, name: str) -> int:
    if handle < 0 or handle > MAX_ADDRESS:
        raise ValueError(f"{name}a stream handle is an address in [0, 2**64), not {handle}")
    return int(handle)


#: exact types whose handle is read by one call (the package's ``Stream`` registers its
#: checked ``_live``): the stream objects users pass most often skip the protocol's checks
HANDLE_READERS: Dict[type, Callable[[Any], int]] = {}


def as_stream_handle(stream: Any, name: Optional[str] = "stream") -> int:
    """The int handle of anything :class:`stream_ref` accepts; TypeError / ValueError
    otherwise, the message starting with ``name`` (the argument's name; None: no prefix)."""
    if type(stream) is int and 0 <= stream <= MAX_ADDRESS:
        return stream
    read = HANDLE_READERS.get(type(stream))
    if read is not None:
        return read(stream)
    if isinstance(stream, stream_ref):
        return stream._handle
    prefix = f"{name}: " if name else ""
    if stream is None:
        raise TypeError(f"{prefix}stream_ref(None) is not allowed: use stream_ref() for the "
                        "default (null) stream")
    if isinstance(stream, bool):
        raise TypeError(f"{prefix}a bool is not a stream handle")
    if isinstance(stream, type):
        raise TypeError(f"{prefix}cannot make a stream_ref from the class {stream.__name__}: "
                        "pass a stream object or handle")
    if isinstance(stream, int):
        return _in_range(stream, prefix)
    ctypes = sys.modules.get("ctypes")  # a c_void_p exists only if ctypes was imported
    if ctypes is not None and isinstance(stream, ctypes.c_void_p):
        return stream.value or 0
    for protocol in ("__hip_stream__", "__cuda_stream__"):
        method = getattr(stream, protocol, None)
        if method is not None:
            result = method()
            if not (isinstance(result, tuple) and len(result) == 2):
                raise TypeError(f"{prefix}{type(stream).__name__}.{protocol}() must return "
                                f"(version, handle), not {result!r}")
            if type(result[0]) is not int or result[0] != 0:
                raise NotImplementedError(
                    f"{prefix}{type(stream).__name__}.{protocol}() returned version "
                    f"{result[0]!r}; only version 0 of the stream protocol is supported")
            return _plain_handle(result[1], f"the handle from {protocol}()", prefix)
    ref = getattr(stream, "ref", None)
    if isinstance(ref, stream_ref):
        return ref._handle
    if hasattr(stream, "handle"):
        return _plain_handle(stream.handle, f"{type(stream).__name__}.handle", prefix)
    raise TypeError(f"{prefix}cannot make a stream_ref from {type(stream).__name__}: expected "
                    "an int or ctypes.c_void_p handle, a stream_ref, an object with .ref or "
                    ".handle, or one with __hip_stream__() / __cuda_stream__()")


class stream_ref:
    """A reference to the HIP stream ``handle`` (default: the null stream, 0).

    ``handle`` may be an int handle (>= 0), a ``ctypes.c_void_p``, another ``stream_ref``, an
    object with a ``.ref`` stream_ref or an int ``.handle`` (like ``hipmr_ctypes.Stream``), or
    an object with ``__hip_stream__()`` / ``__cuda_stream__()`` returning ``(version, handle)``
    (cuda.core, CuPy).  ``None``, bools, floats and strings raise ``TypeError``; negative
    ints ``ValueError``.  ``==`` compares handles (also with a raw int handle); hashable and
    immutable.  ``_as_parameter_`` lets it be passed straight to a ctypes ``hipStream_t``.
    """

    __slots__ = ("_handle",)
    _handle: int
    value_type = int

    def __init__(self, handle: Any = 0) -> None:
        _set(self, "_handle", handle if type(handle) is int and 0 <= handle <= MAX_ADDRESS
             else as_stream_handle(handle, None))

    def get(self) -> int:
        """The stream handle as an int (0 for the null stream)."""
        return self._handle

    @property
    def handle(self) -> int:
        """The stream handle as an int, same as :meth:`get`."""
        return self._handle

    @property
    def _as_parameter_(self) -> int:
        return self._handle

    def __hip_stream__(self) -> Tuple[int, int]:
        """The HIP stream protocol: ``(0, handle)``."""
        return (0, self._handle)

    def __cuda_stream__(self) -> Tuple[int, int]:
        """The CUDA stream protocol (cuda.core, CuPy): ``(0, handle)``."""
        return (0, self._handle)

    def wait(self) -> None:
        """Block until all work queued on the stream has finished (``hipStreamSynchronize``)."""
        rt = _runtime()
        st = rt.fn.hipStreamSynchronize(self._handle)
        if st:
            raise rt.error(st, "hipStreamSynchronize")

    #: the other spellings (RMM's and ``Stream``'s ``synchronize``): the same call
    sync = wait
    synchronize = wait

    def ready(self) -> bool:
        """True when all work queued on the stream has finished, False while some is pending
        (``hipStreamQuery``); any other status raises ``HipError``."""
        rt = _runtime()
        st = rt.fn.hipStreamQuery(self._handle)
        if st == 0:
            return True
        if rt.is_not_ready(st):
            return False
        raise rt.error(st, "hipStreamQuery")

    #: the other spellings (``Stream``'s ``query``): the same call
    is_done = ready
    query = ready

    @property
    def priority(self) -> IntValue:
        """The stream's priority (lower numbers are higher priority; ``hipStreamGetPriority``).
        ``ref.priority()`` (libhipcxx's spelling) reads the same value."""
        import ctypes
        rt = _runtime()
        out = ctypes.c_int()
        st = rt.fn.hipStreamGetPriority(self._handle, out)
        if st:
            raise rt.error(st, "hipStreamGetPriority")
        return IntValue(out.value)

    @property
    def device(self) -> IntValue:
        """The id of the device the stream belongs to (``hipStreamGetDevice``); raises
        ``NotSupportedError`` where the runtime cannot tell.  ``ref.device()`` reads the same
        value."""
        import ctypes
        rt = _runtime()
        fn = getattr(rt.fn, "hipStreamGetDevice", None)
        if fn is None:
            from ._hip.exceptions import NotSupportedError
            raise NotSupportedError(call="hipStreamGetDevice",
                                    detail="this runtime cannot tell a stream's device")
        out = ctypes.c_int()
        st = fn(self._handle, out)
        if st:
            raise rt.error(st, "hipStreamGetDevice")
        return IntValue(out.value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, stream_ref):
            return self._handle == other._handle
        if isinstance(other, int):
            return not isinstance(other, bool) and self._handle == other
        try:  # a Stream, a cuda.core / CuPy stream...: equal when it names the same stream
            return self._handle == as_stream_handle(other, None)
        except Exception:  # noqa: BLE001 - not a stream (or a closed one): not equal
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self._handle)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("stream_ref is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("stream_ref is immutable")

    def __copy__(self) -> "stream_ref":
        return self

    def __deepcopy__(self, memo: Any) -> "stream_ref":
        return self

    def __reduce__(self) -> Tuple[Any, ...]:
        return (stream_ref, (self._handle,))

    def __repr__(self) -> str:
        return f"stream_ref({self._handle:#x})" if self._handle else "stream_ref(0)"


#: What the fast paths of the pool and the fixed-size resource read of a stream object that
#: is not an int: the handle, read from the same slot as ``_handle`` (an alias of its
#: descriptor, so the read is one specialized attribute load).  ``Stream`` has it too (its
#: handle while open, None once closed); an object without it takes the checked path.
setattr(stream_ref, "_hipmr_handle", vars(stream_ref)["_handle"])

#: The handle of the per-thread default stream (``hipStreamPerThread``): another stream in
#: every thread.
PER_THREAD_HANDLE = 2
#: The per-thread default stream (``hipStreamPerThread``, handle 2).
stream_per_thread: stream_ref = stream_ref(PER_THREAD_HANDLE)

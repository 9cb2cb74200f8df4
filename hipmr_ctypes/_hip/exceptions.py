"""HIP error codes and the Python exceptions they become.

Every HIP status other than ``hipSuccess`` becomes a :class:`HipError` (or one of its
subclasses) carrying the code, the HIP name, the message and the call that failed.
Names come from the loaded library when there is one (``hipGetErrorName``), from the
built-in table below otherwise.  This module (loaded by the first use of the runtime or of an
error class) holds the classes, the table and their unpickling; it imports nothing.  The code
that picks the class for a status and builds the exception (``make_error``, ``error_class``,
``no_device_hint``) is in ``failure.py``, one step up the chain
``errors`` <- ``failure`` <- ``runtime``.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Optional, Tuple, Type

__all__ = [
    "HipError", "OutOfMemoryError", "NotReadyError", "NoDeviceError", "InvalidValueError",
    "InvalidHandleError", "NotSupportedError", "LibraryNotFoundError", "ERROR_NAMES",
    "NO_DEVICE_CODES",
]

# hipError_t values, identical in ROCm 5.2.3 ... 7.0: code, then the name without its "hipError"
# prefix.  hipErrorTbd moved (1054 -> 1055) on 7.x-dev; the library's own hipGetErrorName wins
# when loaded.  One string read at import: a literal dict compiled slower than all the rest here.
_NAMES = """
0 hipSuccess  1 InvalidValue  2 OutOfMemory  3 NotInitialized  4 Deinitialized
5 ProfilerDisabled  6 ProfilerNotInitialized  7 ProfilerAlreadyStarted
8 ProfilerAlreadyStopped  9 InvalidConfiguration  12 InvalidPitchValue  13 InvalidSymbol
17 InvalidDevicePointer  21 InvalidMemcpyDirection  35 InsufficientDriver
52 MissingConfiguration  53 PriorLaunchFailure  98 InvalidDeviceFunction  100 NoDevice
101 InvalidDevice  200 InvalidImage  201 InvalidContext  202 ContextAlreadyCurrent
205 MapFailed  206 UnmapFailed  207 ArrayIsMapped  208 AlreadyMapped  209 NoBinaryForGpu
210 AlreadyAcquired  211 NotMapped  212 NotMappedAsArray  213 NotMappedAsPointer
214 ECCNotCorrectable  215 UnsupportedLimit  216 ContextAlreadyInUse  217 PeerAccessUnsupported
218 InvalidKernelFile  219 InvalidGraphicsContext  300 InvalidSource  301 FileNotFound
302 SharedObjectSymbolNotFound  303 SharedObjectInitFailed  304 OperatingSystem
400 InvalidHandle  401 IllegalState  500 NotFound  600 NotReady  700 IllegalAddress
701 LaunchOutOfResources  702 LaunchTimeOut  704 PeerAccessAlreadyEnabled
705 PeerAccessNotEnabled  708 SetOnActiveProcess  709 ContextIsDestroyed  710 Assert
712 HostMemoryAlreadyRegistered  713 HostMemoryNotRegistered  719 LaunchFailure
720 CooperativeLaunchTooLarge  801 NotSupported  900 StreamCaptureUnsupported
901 StreamCaptureInvalidated  902 StreamCaptureMerge  903 StreamCaptureUnmatched
904 StreamCaptureUnjoined  905 StreamCaptureIsolation  906 StreamCaptureImplicit
907 CapturedEvent  908 StreamCaptureWrongThread  910 GraphExecUpdateFailure
911 InvalidChannelDescriptor  912 InvalidTexture  914 InvalidResourceType
915 InvalidResourceConfiguration  916 StreamDetached  999 Unknown  1052 RuntimeMemory
1053 RuntimeOther  1054 Tbd
"""
_words = _NAMES.split()
ERROR_NAMES: Dict[int, str] = {
    int(code): name if name == "hipSuccess" else "hipError" + name
    for code, name in zip(_words[::2], _words[1::2])}
del _words

HIP_ERROR_INVALID_VALUE = 1
HIP_ERROR_OUT_OF_MEMORY = 2
HIP_ERROR_NO_DEVICE = 100
HIP_ERROR_INVALID_DEVICE = 101
HIP_ERROR_INVALID_HANDLE = 400
HIP_ERROR_NOT_READY = 600
HIP_ERROR_NOT_SUPPORTED = 801


class HipError(RuntimeError):
    """A HIP runtime call failed.

    Attributes: ``code`` (the hipError_t value, or ``None`` when no call produced one),
    ``name`` (for example ``"hipErrorInvalidValue"``), ``message`` (the runtime's text) and
    ``call`` (the HIP function, for example ``"hipMalloc"``).
    """

    def __init__(self, code: Optional[int] = None, name: Optional[str] = None,
                 message: str = "", call: Optional[str] = None, detail: str = "") -> None:
        self.code = code
        self.name: Optional[str] = name if name is not None else (ERROR_NAMES.get(code, "hipErrorUnknown")
                                                    if code is not None else None)
        self.message = message
        self.call = call
        self.detail = detail
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.call:
            parts.append(f"{self.call} failed")
        if self.name:
            head = f"{self.name} ({self.code})" if self.code is not None else self.name
            parts.append(head)
        text = ": ".join(parts) if parts else "HIP error"
        if self.message and self.message != self.name:
            text += f": {self.message}"
        if self.detail:
            text += f" ({self.detail})"
        return text

    def __reduce__(self) -> Tuple[Any, ...]:  # keep exceptions picklable (multiprocessing, pytest-xdist)
        return (rebuild, (type(self), self.__dict__.copy()))


def rebuild(cls: Type[HipError], state: Dict[str, Any]) -> HipError:
    """Unpickle ``HipError.__reduce__``'s state."""
    # an OSError subclass must be made by OSError's own __new__ (its C layout is larger)
    obj = OSError.__new__(cls) if issubclass(cls, OSError) else cls.__new__(cls)
    obj.__dict__.update(state)
    Exception.__init__(obj, obj._format())
    return obj


class OutOfMemoryError(HipError, MemoryError):
    """Allocation failed for lack of memory (``hipErrorOutOfMemory``); also a ``MemoryError``.

    ``size`` is the requested number of bytes and ``device`` the device id, where known.
    """

    def __init__(self, code: Optional[int] = HIP_ERROR_OUT_OF_MEMORY, name: Optional[str] = None,
                 message: str = "", call: Optional[str] = None, detail: str = "",
                 size: Optional[int] = None, device: Optional[int] = None) -> None:
        self.size = size
        self.device = device
        extra = []
        if size is not None:
            extra.append(f"requested {size} bytes")
        if device is not None:
            extra.append(f"on device {device}")
        if detail:
            extra.append(detail)
        super().__init__(code, name, message, call, ", ".join(extra))


class NotReadyError(HipError):
    """Work is still pending (``hipErrorNotReady``)."""


class NoDeviceError(HipError):
    """No usable GPU is visible (``hipErrorNoDevice``, or a call that needs a device on a
    runtime that sees none); the message says how to use the package without a GPU."""


#: HIP statuses that, from a runtime that sees no device, mean "there is no device here": no
#: device, invalid device (``hipGetDevice`` with none) and a runtime with no (or too old a)
#: driver beneath it (``cudaErrorInsufficientDriver`` on nvidia).
NO_DEVICE_CODES = (HIP_ERROR_NO_DEVICE, HIP_ERROR_INVALID_DEVICE, 35)


class InvalidValueError(HipError, ValueError):
    """The runtime rejected an argument (``hipErrorInvalidValue``); also a ``ValueError``."""


class InvalidHandleError(HipError, ValueError):
    """A stream, event or pool handle is not valid (``hipErrorInvalidHandle``)."""


class NotSupportedError(HipError):
    """The runtime, the device or the loaded library does not support this operation."""

    #: Set where the library itself is the problem: ``"not a runtime"`` (no HIP / CUDA runtime
    #: library; on ``nvidia`` possibly also too old) or ``"too old"``; None otherwise.  The
    #: command line chooses its hint by it.
    _library_problem: Optional[str] = None


class LibraryNotFoundError(HipError, OSError):
    """No HIP (or CUDA runtime) library could be loaded; the message lists every path tried."""

    def __init__(self, message: str, tried: Iterable[str] = (), *, what: str = "",
                 hint: str = "") -> None:
        self.tried: Tuple[str, ...] = tuple(tried)
        self._what = what   # the library searched for, and what to do: the command line's
        self._hint = hint   # message and hint are made of these and ``tried``
        self._absent = False  # set by the search: no candidate exists at all (none installed)
        HipError.__init__(self, None, "LibraryNotFound", message, None)

    def _format(self) -> str:
        return self.message


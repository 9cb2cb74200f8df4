"""Stand-ins for the parts of CuPy and Numba that the interop hooks use, so that the hooks'
own logic (which resource, which stream and device, freed exactly once, nothing freed at exit)
is tested without those packages or a GPU.  Each follows the package's documented interface:

* ``cupy``: ``cuda.memory.UnownedMemory(ptr, size, owner, device_id=-1)`` (with device -1
  CuPy asks the runtime for the pointer's device: the double refuses, so a test fails if the
  allocator ever lets CuPy do that), ``MemoryPointer(mem, offset)``, ``cuda.device.
  get_device_id()``, ``cuda.get_current_stream(device_id=-1)`` (``takes_device=False``: the
  older form without the argument), ``cuda.alloc`` / ``set_allocator``; streams with ``ptr``.
* ``numba.cuda``: ``MemoryPointer(context, pointer, size, owner=None, finalizer=None)`` (a
  finalizer makes it managed; ``free()`` runs it), ``HostOnlyCUDAMemoryManager(context=...)``
  with ``allocations`` / ``deallocations`` / ``reset()``, ``MemoryInfo``, and
  ``cudadrv.driver`` with ``binding.CUdeviceptr`` / ``CUipcMemHandle``, ``IpcHandle``.

``install(monkeypatch, ...)`` puts them in ``sys.modules`` (and forgets the hook modules, so
that they are imported again over the doubles).
"""
from __future__ import annotations

import collections
import sys
import types
import weakref
from typing import Any, Dict, List, Optional


class Stream:
    def __init__(self, ptr: int = 0, device_id: int = -1) -> None:
        self.ptr = ptr
        self.device_id = device_id


class CupyState:
    """The double's runtime state: the current device, each device's current stream, and the
    calls to ``get_current_stream`` (their arguments)."""

    def __init__(self) -> None:
        self.device = 0
        self.streams: Dict[int, Stream] = {}
        self.null = Stream(0)
        self.stream_calls: List[tuple] = []

    def current_stream(self, device: int) -> Stream:
        return self.streams.get(device, self.null)


def make_cupy(takes_device: bool = True) -> types.ModuleType:
    state = CupyState()

    class UnownedMemory:
        def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
            if device_id < 0:
                raise AssertionError("UnownedMemory without a device: CuPy would ask the "
                                     "runtime for the pointer's attributes")
            self.ptr = ptr
            self.size = size
            self._owner = owner
            self.device_id = device_id

    class MemoryPointer:
        def __init__(self, mem: Any, offset: int) -> None:
            self.mem = mem
            self.ptr = mem.ptr + offset
            self.device_id = mem.device_id

    def get_device_id() -> int:
        return state.device

    if takes_device:
        def get_current_stream(device_id: int = -1) -> Stream:
            state.stream_calls.append((device_id,))
            return state.current_stream(state.device if device_id == -1 else device_id)
    else:
        def get_current_stream() -> Stream:  # type: ignore[misc]
            state.stream_calls.append(())
            return state.current_stream(state.device)

    allocator: List[Any] = [None]

    def set_allocator(fn: Any = None) -> None:
        allocator[0] = fn

    def alloc(size: int) -> Any:
        return allocator[0](size)

    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    memory = types.ModuleType("cupy.cuda.memory")
    device = types.ModuleType("cupy.cuda.device")
    memory.UnownedMemory = UnownedMemory  # type: ignore[attr-defined]
    memory.MemoryPointer = MemoryPointer  # type: ignore[attr-defined]
    device.get_device_id = get_device_id  # type: ignore[attr-defined]
    cuda.memory, cuda.device = memory, device  # type: ignore[attr-defined]
    cuda.UnownedMemory, cuda.MemoryPointer = UnownedMemory, MemoryPointer  # type: ignore
    cuda.get_current_stream = get_current_stream  # type: ignore[attr-defined]
    cuda.set_allocator, cuda.alloc = set_allocator, alloc  # type: ignore[attr-defined]
    cuda.Stream = Stream  # type: ignore[attr-defined]
    cupy.cuda = cuda  # type: ignore[attr-defined]
    cupy.state = state  # type: ignore[attr-defined]
    cupy.modules = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.memory": memory,  # type: ignore
                    "cupy.cuda.device": device}
    return cupy


# ---- numba ----------------------------------------------------------------------------------
class CUdeviceptr:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class CUipcMemHandle:
    def __init__(self) -> None:
        self.reserved = b"\0" * 64


class Device:
    def __init__(self, id: int) -> None:
        self.id = id

    def get_device_identity(self) -> Dict[str, int]:
        return {"device": self.id}


class Context:
    def __init__(self, device: int = 0) -> None:
        self.device = Device(device)


def make_numba() -> types.ModuleType:
    class MemoryPointer:
        __cuda_memory__ = True

        def __init__(self, context: Any, pointer: Any, size: int, owner: Any = None,
                     finalizer: Any = None) -> None:
            self.context = context
            self.device_pointer = pointer
            self.size = size
            self._cuda_memsize_ = size
            self.is_managed = finalizer is not None
            self.refct = 1
            self.handle = self.device_pointer
            self._owner = owner
            if finalizer is not None:
                self._finalizer = weakref.finalize(self, finalizer)

        @property
        def owner(self) -> Any:
            return self if self._owner is None else self._owner

        def free(self) -> None:
            if self.is_managed:
                if not self._finalizer.alive:
                    raise RuntimeError("Freeing dead memory")
                self._finalizer()

        def view(self, start: int, stop: Optional[int] = None) -> Any:
            size = (self.size if stop is None else stop) - start
            return MemoryPointer(self.context, CUdeviceptr(self.device_pointer_value + start),
                                 size, owner=self.owner)

        @property
        def device_pointer_value(self) -> Optional[int]:
            return int(self.device_pointer) or None

    class HostOnlyCUDAMemoryManager:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if "context" not in kwargs:
                raise RuntimeError("Memory manager requires a context")
            self.context = kwargs.pop("context")
            self.allocations: Dict[Any, Any] = {}
            self.deallocations: List[Any] = []

        def reset(self) -> None:
            self.allocations.clear()
            self.deallocations.clear()

    class IpcHandle:
        def __init__(self, base: Any, handle: Any, size: int, source_info: Any = None,
                     offset: int = 0) -> None:
            self.base, self.handle, self.size = base, handle, size
            self.source_info, self.offset = source_info, offset

    class GetIpcHandleMixin:
        def get_ipc_handle(self, memory: Any) -> Any:   # Numba's own: any memory's base
            return ("numba's own handle", memory)

    numba = types.ModuleType("numba")
    cuda = types.ModuleType("numba.cuda")
    cudadrv = types.ModuleType("numba.cuda.cudadrv")
    driver = types.ModuleType("numba.cuda.cudadrv.driver")
    binding = types.SimpleNamespace(CUdeviceptr=CUdeviceptr, CUipcMemHandle=CUipcMemHandle)
    driver.binding = binding  # type: ignore[attr-defined]
    driver.MemoryPointer = MemoryPointer  # type: ignore[attr-defined]
    driver.IpcHandle = IpcHandle  # type: ignore[attr-defined]
    driver.GetIpcHandleMixin = GetIpcHandleMixin  # type: ignore[attr-defined]
    cuda.MemoryPointer = MemoryPointer  # type: ignore[attr-defined]
    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager  # type: ignore[attr-defined]
    cuda.MemoryInfo = collections.namedtuple("MemoryInfo", "free total")  # type: ignore
    cuda.cudadrv = cudadrv  # type: ignore[attr-defined]
    cudadrv.driver = driver  # type: ignore[attr-defined]
    numba.cuda = cuda  # type: ignore[attr-defined]
    numba.modules = {"numba": numba, "numba.cuda": cuda,  # type: ignore[attr-defined]
                     "numba.cuda.cudadrv": cudadrv, "numba.cuda.cudadrv.driver": driver}
    return numba


def install(monkeypatch: Any, package: types.ModuleType) -> None:
    """Put ``package``'s modules in ``sys.modules`` (undone by ``monkeypatch``) and forget the
    hook modules so that the next import builds them over the double."""
    for name, module in package.modules.items():  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
    import hipmr_ctypes.interop as interop
    for name in ("cupy", "numba"):
        # recorded as absent (or as they were) first, so the modules imported over the double
        # are forgotten after the test
        monkeypatch.setitem(sys.modules, f"hipmr_ctypes.interop.{name}", None)
        monkeypatch.delitem(sys.modules, f"hipmr_ctypes.interop.{name}")
        monkeypatch.setattr(interop, name, None, raising=False)
        monkeypatch.delattr(interop, name)

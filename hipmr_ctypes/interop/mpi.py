"""MPI (mpi4py) with Buffers: point-to-point, broadcast and reductions of Buffer memory, directly
when the MPI library reads device memory, staged through pinned host memory when it does not.
Importing this module imports ``mpi4py.MPI`` (which initializes MPI, as any mpi4py program
does); nothing else in the package does.

Which path a Buffer takes (:func:`path`):

* ``"host"``: the memory is host-accessible (pinned, managed, host): MPI reads it in place, as
  any host array.
* ``"direct"``: device memory and a GPU-aware MPI (:func:`gpu_aware`): the Buffer itself goes
  to mpi4py (which reads its DLPack / ``__cuda_array_interface__``) and MPI moves device memory.
* ``"staged"``: device memory and an MPI that is not GPU-aware: the bytes go through one pinned
  host buffer per thread (a device-to-host copy, the MPI call on the host copy, and a
  host-to-device copy for what is received).

:func:`gpu_aware` asks the MPI library (Open MPI's ``MPIX_Query_cuda_support`` on NVIDIA,
``MPIX_Query_rocm_support`` on AMD); ``HIPMR_MPI_GPU_AWARE=1`` / ``0`` overrides it (an MPI
library that is GPU-aware but cannot say so, or a test).  Every call first waits for the
Buffer's stream, so MPI sees what was written before it.
"""
# pyright: reportMissingImports=false
# (mpi4py is optional: this module is imported only where it is installed)
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Dict, Optional, Tuple, Union

from mpi4py import MPI

from .. import _hip
from .._hip.native import mpi_gpu_queries
from .._buffer.copies import check_writable
from ..buffer import Buffer
from ..resources.pinned import PinnedMemoryResource

__all__ = ["gpu_aware", "support", "path", "send", "recv", "sendrecv", "bcast", "allreduce",
           "GPU_AWARE_VARIABLE"]

#: The environment variable that overrides what the MPI library says (``1`` or ``0``).
GPU_AWARE_VARIABLE: str = "HIPMR_MPI_GPU_AWARE"

_support: Optional[Dict[str, Any]] = None
_support_lock = threading.Lock()
_staging = threading.local()


def support() -> Dict[str, Any]:
    """What this MPI library offers, asked once: ``{"library": MPI.Get_library_version()'s
    first line, "cuda": bool or None, "rocm": bool or None, "platform": hmr.platform(),
    "gpu_aware": bool, "why": a sentence}`` (None: the library has no such query)."""
    global _support
    with _support_lock:
        if _support is not None:
            return dict(_support)
        library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        try:
            queries = mpi_gpu_queries(MPI.__file__)
        except OSError:  # pragma: no cover - mpi4py's own module always opens
            queries = {"cuda": None, "rocm": None}
        platform = _hip.get_runtime().platform
        override = os.environ.get(GPU_AWARE_VARIABLE, "")
        if override in ("0", "1"):
            aware = override == "1"
            why = f"{GPU_AWARE_VARIABLE}={override}"
        else:
            key = "rocm" if platform == "amd" else "cuda"
            aware = bool(queries[key])
            if queries[key] is None:
                why = (f"the MPI library has no MPIX_Query_{key}_support: taken as not "
                       f"GPU-aware (set {GPU_AWARE_VARIABLE}=1 if it is)")
            else:
                why = f"MPIX_Query_{key}_support() = {int(bool(queries[key]))}"
        _support = {"library": library, "cuda": queries["cuda"], "rocm": queries["rocm"],
                    "platform": platform, "gpu_aware": aware, "why": why}
        return dict(_support)


def gpu_aware() -> bool:
    """Whether MPI reads and writes device memory here (see :func:`support`)."""
    return bool(support()["gpu_aware"])


def path(buf: Buffer) -> str:
    """``"host"``, ``"direct"`` or ``"staged"``: how ``buf`` goes through MPI (see the
    module's documentation)."""
    if not isinstance(buf, Buffer):
        raise TypeError(f"buf must be a Buffer, not {type(buf).__name__}")
    if buf.closed:
        raise ValueError("buf is closed")
    if buf._memory_kind() != "device":
        return "host"
    return "direct" if gpu_aware() else "staged"


def _comm(comm: Any) -> Any:
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
    return comm


def _rank(value: Any, name: str, special: Tuple[int, ...] = ()) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0 and value not in special:
        raise ValueError(f"{name}={value} is not a rank")
    return int(value)


def _host_view(buf: Buffer) -> Any:
    """A ctypes array over host-accessible memory (what mpi4py reads as a host buffer)."""
    return (ctypes.c_ubyte * buf.size).from_address(buf.ptr) if buf.size else bytearray()


def _stage(size: int) -> Buffer:
    """This thread's pinned staging buffer, of at least ``size`` bytes."""
    stage: Optional[Buffer] = getattr(_staging, "buffer", None)
    if stage is None or stage.closed or stage.size < size:
        if stage is not None:
            stage.close()
        stage = Buffer(max(size, 1 << 16), resource=PinnedMemoryResource())
        _staging.buffer = stage
    return stage


def _check(buf: Any, name: str, receives: bool = False) -> Buffer:
    """``buf`` checked before any MPI or runtime call: a Buffer, open, its stream usable (a
    closed ``Stream``'s destroyed handle never reaches the runtime), and writable when MPI
    writes into it (memory its producer marked read-only is refused)."""
    if not isinstance(buf, Buffer):
        raise TypeError(f"{name} must be a Buffer, not {type(buf).__name__}")
    if buf.closed:
        raise ValueError(f"{name} is closed")
    buf._own_stream()                 # ValueError for a closed Stream
    if receives:
        check_writable(buf, f"{name} (an MPI receive buffer)")
    return buf


def _outgoing(buf: Buffer) -> Any:
    """What mpi4py gets for data MPI reads from ``buf``."""
    buf._wait_own()                   # MPI sees what the stream wrote
    how = path(buf)
    if how == "host":
        return _host_view(buf)
    if how == "direct":
        return buf
    stage = _stage(buf.size)
    stage.copy_from_device(buf)
    return (ctypes.c_ubyte * buf.size).from_address(stage.ptr)


def _incoming(buf: Buffer) -> Any:
    """What mpi4py gets for data MPI writes into ``buf`` (``_settle`` finishes it)."""
    buf._wait_own()                   # nothing queued on buf races with MPI's write
    how = path(buf)
    if how == "host":
        return _host_view(buf)
    if how == "direct":
        return buf
    stage = _stage(buf.size)
    return (ctypes.c_ubyte * buf.size).from_address(stage.ptr)


def _settle(buf: Buffer, count: int) -> None:
    """After MPI wrote ``count`` bytes into the staged copy of ``buf``: copy those bytes (and
    only those: the rest of ``buf`` stays as it was, as on the other paths) to the device."""
    if count and path(buf) == "staged":
        stage = _staging.buffer
        view = (ctypes.c_ubyte * count).from_address(stage.ptr)
        buf.copy_from_host(view)


def _received(status: Any, buf: Buffer) -> int:
    """The bytes a receive into ``buf`` got (``MPI.Status.Get_count``): at most its size."""
    count = status.Get_count(MPI.BYTE)
    if count == MPI.UNDEFINED or not 0 <= count <= buf.size:   # pragma: no cover - MPI's
        raise RuntimeError(f"MPI reported {count} bytes received into {buf.size}")
    return int(count)


def send(buf: Buffer, dest: int, tag: int = 0, comm: Any = None) -> None:
    """``comm.Send`` of all of ``buf`` to rank ``dest`` (``comm``: default ``COMM_WORLD``)."""
    _check(buf, "buf")
    comm = _comm(comm)
    _rank(dest, "dest")
    _rank(tag, "tag")
    comm.Send([_outgoing(buf), buf.size, MPI.BYTE], dest=dest, tag=tag)


def recv(buf: Buffer, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
         comm: Any = None) -> Any:
    """``comm.Recv`` into ``buf`` (at most ``buf.size`` bytes); returns the ``MPI.Status``.
    A shorter message writes its bytes at the start of ``buf`` and leaves the rest as it was
    (``status.Get_count(MPI.BYTE)`` says how many), on every path."""
    _check(buf, "buf", receives=True)
    comm = _comm(comm)
    _rank(source, "source", (MPI.ANY_SOURCE,))
    _rank(tag, "tag", (MPI.ANY_TAG,))
    status = MPI.Status()
    comm.Recv([_incoming(buf), buf.size, MPI.BYTE], source=source, tag=tag, status=status)
    _settle(buf, _received(status, buf))
    return status


def sendrecv(sendbuf: Buffer, dest: int, recvbuf: Buffer, source: int, tag: int = 0,
             comm: Any = None) -> Any:
    """``comm.Sendrecv``: ``sendbuf`` to ``dest`` while ``recvbuf`` is received from
    ``source`` (two different Buffers); returns the ``MPI.Status``.  A shorter message
    leaves the rest of ``recvbuf`` as it was, as :func:`recv` does."""
    _check(sendbuf, "sendbuf")
    _check(recvbuf, "recvbuf", receives=True)
    if sendbuf is recvbuf:
        raise ValueError("sendbuf and recvbuf must be different Buffers")
    comm = _comm(comm)
    _rank(dest, "dest")
    _rank(source, "source", (MPI.ANY_SOURCE,))
    _rank(tag, "tag")
    outgoing = _outgoing(sendbuf)
    if path(sendbuf) == "staged" and path(recvbuf) == "staged":
        outgoing = bytes(outgoing)          # the one staging buffer serves the receive
    status = MPI.Status()
    comm.Sendrecv([outgoing, sendbuf.size, MPI.BYTE], dest, tag,
                  [_incoming(recvbuf), recvbuf.size, MPI.BYTE], source, tag, status=status)
    _settle(recvbuf, _received(status, recvbuf))
    return status


def bcast(buf: Buffer, root: int = 0, comm: Any = None) -> None:
    """``comm.Bcast``: every rank's ``buf`` gets root's bytes.  Root's size is broadcast
    first: a larger ``buf`` gets them at its start and keeps the rest as it was (on every
    path); a smaller one raises ValueError on its rank after the broadcast, unchanged (every
    rank still takes part, so that none waits for it)."""
    comm = _comm(comm)
    _rank(root, "root")
    receives = comm.Get_rank() != root
    _check(buf, "buf", receives=receives)
    size = bytearray(buf.size.to_bytes(8, "little")) if not receives else bytearray(8)
    comm.Bcast([size, 8, MPI.BYTE], root=root)
    n = int.from_bytes(size, "little")
    if not receives:
        comm.Bcast([_outgoing(buf), n, MPI.BYTE], root=root)
        return
    if n > buf.size:
        comm.Bcast([bytearray(n), n, MPI.BYTE], root=root)   # taken part in, then refused
        raise ValueError(f"bcast: root sent {n} bytes, more than buf's {buf.size} (buf is "
                         "unchanged)")
    comm.Bcast([_incoming(buf), n, MPI.BYTE], root=root)
    _settle(buf, n)


def allreduce(sendbuf: Buffer, recvbuf: Buffer, op: Any = None, datatype: Any = None,
              comm: Any = None) -> None:
    """``comm.Allreduce`` of ``sendbuf`` into ``recvbuf`` (the same size; different Buffers),
    element by element as ``datatype`` (default ``MPI.UNSIGNED_CHAR``; the size must be a
    multiple of its extent) with ``op`` (default ``MPI.SUM``)."""
    _check(sendbuf, "sendbuf")
    _check(recvbuf, "recvbuf", receives=True)
    if sendbuf is recvbuf:
        raise ValueError("sendbuf and recvbuf must be different Buffers (MPI.IN_PLACE is not "
                         "offered)")
    if sendbuf.size != recvbuf.size:
        raise ValueError(f"sendbuf has {sendbuf.size} bytes, recvbuf {recvbuf.size}")
    comm = _comm(comm)
    op = MPI.SUM if op is None else op
    datatype = MPI.UNSIGNED_CHAR if datatype is None else datatype
    if not isinstance(op, MPI.Op):
        raise TypeError(f"op must be an MPI.Op, not {type(op).__name__}")
    if not isinstance(datatype, MPI.Datatype):
        raise TypeError(f"datatype must be an MPI.Datatype, not {type(datatype).__name__}")
    extent = datatype.Get_size()
    if extent <= 0 or sendbuf.size % extent:
        raise ValueError(f"the size ({sendbuf.size} bytes) is not a multiple of the "
                         f"datatype's {extent} bytes")
    count = sendbuf.size // extent
    outgoing: Union[Any, bytes] = _outgoing(sendbuf)
    if path(sendbuf) == "staged" and path(recvbuf) == "staged":
        outgoing = bytes(outgoing)          # the one staging buffer serves the result
    comm.Allreduce([outgoing, count, datatype], [_incoming(recvbuf), count, datatype], op=op)
    _settle(recvbuf, recvbuf.size)

"""hipmr_ctypes.interop.mpi with real mpi4py and Open MPI: two ranks (``mpiexec -n 2``) on the
emulated platform pass Buffers by send / recv, sendrecv, bcast and allreduce on every path: the
MPI library's own answer (Open MPI without CUDA: staged through pinned memory), forced direct
(``HIPMR_MPI_GPU_AWARE=1``: the emulated platform's device memory is host memory, so a host MPI
reads it, which exercises the direct path's code), and host-accessible (pinned) Buffers.

Needs mpi4py and ``mpiexec``: skipped without them, except under HIPMR_REQUIRE_TOOLS=1 (CI),
where their absence fails."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from support import REPO

MPIEXEC = shutil.which("mpiexec") or shutil.which("mpirun")

if importlib.util.find_spec("mpi4py") is None or MPIEXEC is None:
    what = "mpi4py" if importlib.util.find_spec("mpi4py") is None else "mpiexec"
    if os.environ.get("HIPMR_REQUIRE_TOOLS") == "1":
        raise ImportError(f"{what} is required (HIPMR_REQUIRE_TOOLS=1) but missing: apt-get "
                          f"install libopenmpi-dev openmpi-bin; pip install mpi4py")
    pytest.skip(f"{what} not installed (apt-get install libopenmpi-dev openmpi-bin; "
                f"pip install mpi4py)", allow_module_level=True)

RANKS = r'''
import json, os, sys
import hipmr_ctypes as hmr
from hipmr_ctypes.interop import mpi as hm
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 2, size
kind = sys.argv[1]
resource = hmr.PinnedMemoryResource() if kind == "pinned" else None
n = 70_000

def buf(data):
    return hmr.Buffer.from_host(data, resource=resource)

def pattern(seed):
    return bytes((i * 13 + seed) & 0xFF for i in range(n))

mine = buf(pattern(rank))
how = hm.path(mine)
# send / recv
if rank == 0:
    hm.send(mine, 1, tag=7)
    got = buf(bytes(n))
    status = hm.recv(got, 1, tag=8)
else:
    got = buf(bytes(n))
    status = hm.recv(got, 0, tag=7)
    hm.send(mine, 0, tag=8)
assert got.tobytes() == pattern(1 - rank)
assert status.Get_source() == 1 - rank and status.Get_count(MPI.BYTE) == n
# the direct path is mpi4py's own: comm.Send(buf) / comm.Recv(buf) with the Buffer itself
if how == "direct":
    plain = buf(bytes(n))
    if rank == 0:
        comm.Send(mine, dest=1, tag=9)
    else:
        comm.Recv(plain, source=0, tag=9)
        assert plain.tobytes() == pattern(0)
    comm.Bcast(mine if rank == 0 else plain, root=0)
    assert (mine if rank == 0 else plain).tobytes() == pattern(0)
# sendrecv
other = buf(bytes(n))
hm.sendrecv(mine, 1 - rank, other, 1 - rank, tag=3)
assert other.tobytes() == pattern(1 - rank)
# bcast
shared = buf(pattern(40) if rank == 1 else bytes(n))
hm.bcast(shared, root=1)
assert shared.tobytes() == pattern(40)
# allreduce, bytes and 4-byte ints
# (sums below 256: Debian's Open MPI 4.1.4 saturates unsigned char sums in its AVX op)
small = buf(bytes(b % 100 for b in pattern(rank)))
total = buf(bytes(n))
hm.allreduce(small, total)
assert total.tobytes() == bytes(a % 100 + b % 100 for a, b in zip(pattern(0), pattern(1)))
ints = buf((rank + 1).to_bytes(4, "little") * 1000)
peak = buf(bytes(4000))
hm.allreduce(ints, peak, op=MPI.MAX, datatype=MPI.INT32_T)
assert peak.tobytes() == (2).to_bytes(4, "little") * 1000
# bad arguments: refused before MPI is called
for call, error in [(lambda: hm.send(b"x", 1), TypeError),
                    (lambda: hm.send(mine, -1), ValueError),
                    (lambda: hm.send(mine, 1.0), TypeError),
                    (lambda: hm.recv(mine, 0, comm=3), TypeError),
                    (lambda: hm.allreduce(mine, mine), ValueError),
                    (lambda: hm.allreduce(mine, buf(bytes(10))), ValueError),
                    (lambda: hm.allreduce(buf(bytes(6)), buf(bytes(6)), datatype=MPI.INT32_T),
                     ValueError),
                    (lambda: hm.allreduce(mine, total, op="sum"), TypeError)]:
    try:
        call()
    except error:
        pass
    else:
        raise AssertionError(f"{call} was not refused")
closed = buf(b"abc"); closed.close()
try:
    hm.send(closed, 1)
except ValueError:
    pass
else:
    raise AssertionError("a closed Buffer was sent")
# a short message fills the start of a larger receive buffer and leaves the rest as it was,
# on every path (the staging buffer holds the bytes of the larger messages above)
other = 1 - rank
target = buf(b"\xee" * 100)
if rank == 0:
    hm.send(buf(b"\x01" * 10), 1, tag=11)
else:
    status = hm.recv(target, 0, tag=11)
    assert status.Get_count(MPI.BYTE) == 10
    assert target.tobytes() == b"\x01" * 10 + b"\xee" * 90, target.tobytes()
target = buf(b"\xee" * 100)
status = hm.sendrecv(buf(bytes([rank + 2]) * 10), other, target, other, tag=12)
assert status.Get_count(MPI.BYTE) == 10
assert target.tobytes() == bytes([other + 2]) * 10 + b"\xee" * 90, target.tobytes()
target = buf(b"\x05" * 10 if rank == 0 else b"\xee" * 100)
hm.bcast(target, root=0)
assert target.tobytes() == (b"\x05" * 10 if rank == 0 else b"\x05" * 10 + b"\xee" * 90)
# a receive buffer smaller than root's: refused on its rank, unchanged; nobody waits
target = buf(b"\x06" * 100 if rank == 0 else b"\xee" * 10)
try:
    hm.bcast(target, root=0)
except ValueError as exc:
    assert rank == 1 and "100 bytes" in str(exc), exc
else:
    assert rank == 0
assert target.tobytes() == (b"\x06" * 100 if rank == 0 else b"\xee" * 10)
# memory its producer marked read-only is refused as a receive buffer, before MPI
import numpy
frozen = b"immutable!" * 10
try:
    ro = hmr.Buffer.from_dlpack(numpy.frombuffer(frozen, dtype=numpy.uint8))
except BufferError:   # NumPy before 2.1 cannot say "read-only" through DLPack: no such view
    ro = None
if ro is not None:   # (the same NumPy on both ranks: both take this branch or neither)
    for call in (lambda: hm.recv(ro, other), lambda: hm.sendrecv(mine, other, ro, other),
                 lambda: hm.bcast(ro, root=other), lambda: hm.allreduce(buf(bytes(100)), ro)):
        try:
            call()
        except BufferError:
            pass
        else:
            raise AssertionError(f"{call} wrote into read-only memory")
    assert frozen == b"immutable!" * 10
    hm.send(ro, other, tag=13)          # read-only memory may be sent
    got = buf(bytes(100))
    hm.recv(got, other, tag=13)
    assert got.tobytes() == frozen
# a Buffer whose Stream was closed: refused before MPI or the runtime sees the handle
s = hmr.Stream()
on_stream = hmr.Buffer.from_host(b"x" * 100, resource=resource, stream=s)
s.close()
for call in (lambda: hm.send(on_stream, other), lambda: hm.recv(on_stream, other),
             lambda: hm.bcast(on_stream, root=other), lambda: hm.path(on_stream) and
             hm.sendrecv(mine, other, on_stream, other)):
    try:
        call()
    except ValueError as exc:
        assert "closed" in str(exc), exc
    else:
        raise AssertionError(f"{call} used a closed stream")
on_stream.close(stream=0)
comm.Barrier()
reports = comm.gather({"rank": rank, "path": how, "support": hm.support()}, root=0)
if rank == 0:
    for report in reports:
        print(json.dumps(report), flush=True)
'''


def _mpiexec(tmp_path, kind, **env):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    full = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                OMPI_MCA_rmaps_base_oversubscribe="1", **env)
    if "HIPMR_MPI_GPU_AWARE" not in env:
        full.pop("HIPMR_MPI_GPU_AWARE", None)
    args = [MPIEXEC, "-n", "2"]
    if os.geteuid() == 0:
        args.insert(1, "--allow-run-as-root")
    args[1:1] = ["--oversubscribe"]
    done = subprocess.run(args + [sys.executable, str(script), kind], env=full,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1], done.stdout
    return reports


@pytest.mark.reliability("copy_ownership_cases")
def test_the_library_decides(tmp_path):
    """No override: Open MPI says whether it was built with CUDA; device memory is staged
    unless it was."""
    reports = _mpiexec(tmp_path, "device")
    for r in reports:
        s = r["support"]
        assert s["platform"] == "emulated" and s["library"].startswith(("Open MPI", "MPICH"))
        assert s["why"].startswith(("MPIX_Query_cuda_support", "the MPI library has no"))
        assert r["path"] == ("direct" if s["gpu_aware"] else "staged")


@pytest.mark.reliability("copy_ownership_cases")
def test_staged_through_pinned_memory(tmp_path):
    reports = _mpiexec(tmp_path, "device", HIPMR_MPI_GPU_AWARE="0")
    assert {r["path"] for r in reports} == {"staged"}
    assert all(r["support"]["gpu_aware"] is False for r in reports)


@pytest.mark.reliability("copy_ownership_cases")
def test_direct(tmp_path):
    reports = _mpiexec(tmp_path, "device", HIPMR_MPI_GPU_AWARE="1")
    assert {r["path"] for r in reports} == {"direct"}
    assert all(r["support"]["why"] == "HIPMR_MPI_GPU_AWARE=1" for r in reports)


@pytest.mark.reliability("copy_ownership_cases")
def test_host_accessible_buffers_need_no_staging(tmp_path):
    reports = _mpiexec(tmp_path, "pinned", HIPMR_MPI_GPU_AWARE="0")
    assert {r["path"] for r in reports} == {"host"}


# ---- the H200: two ranks on the real GPU(s) -------------------------------------------------
@pytest.mark.gpu
@pytest.mark.reliability("copy_ownership_cases")
@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_gpu_two_ranks(tmp_path, kind, gpu_runtime):
    """Both paths the machine has: device memory as the library allows (staged through pinned
    memory with an MPI built without CUDA, direct with one built with it), and host-accessible
    memory in place.  Runs with the GPU platform of this process (HIPMR_PLATFORM)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                   os.environ.get("PYTHONPATH")])))
    args = [MPIEXEC, "--oversubscribe", "-n", "2"]
    if os.geteuid() == 0:
        args.insert(1, "--allow-run-as-root")
    done = subprocess.run(args + [sys.executable, str(script), kind], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 2
    for r in reports:
        assert r["support"]["platform"] == gpu_runtime.platform
        expected = "host" if kind == "pinned" else (
            "direct" if r["support"]["gpu_aware"] else "staged")
        assert r["path"] == expected


def test_mpi_demo_with_three_ranks_on_two_devices(tmp_path):
    """scripts/mpi_demo.py with any number of ranks (three, sharing two emulated devices): the
    IPC reads and every transfer on every path checked, the rates reported."""
    out = tmp_path / "demo.json"
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               HIPMR_EMULATED_MEMORY="512MiB")
    env.pop("HIPMR_MPI_GPU_AWARE", None)
    args = [MPIEXEC, "--oversubscribe", "-n", "3"]
    if os.geteuid() == 0:
        args.insert(1, "--allow-run-as-root")
    done = subprocess.run(args + [sys.executable, str(REPO / "scripts" / "mpi_demo.py"),
                                  "--size", "256KiB", "--repeat", "2", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout
    data = json.loads(out.read_text())
    assert data["failures"] == 0 and len(data["ranks"]) == 3
    assert sorted(r["device"] for r in data["ranks"]) == [0, 0, 1]
    assert all(len(r["read"]) == 2 for r in data["ranks"])
    rows = {(t["path"], t["memory"], t["op"]) for t in data["transfers"]}
    device_path = "direct" if data["mpi"]["gpu_aware"] else "staged"
    assert rows == {(p, m, op) for p, m in ((device_path, "device"), ("host", "pinned"))
                    for op in ("sendrecv", "bcast", "allreduce")}
    assert all(t["gbps_slowest"] > 0 for t in data["transfers"])

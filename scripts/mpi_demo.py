#!/usr/bin/env python3
"""MPI ranks reading each other's GPU memory through IPC, and moving Buffers through MPI (needs
mpi4py).  Any number of ranks: one GPU each where a node has several, sharing one otherwise.

Every rank uses device ``node_rank % device_count``, makes its own IPC-enabled pool and one
buffer filled with its pattern.  The ranks of a node exchange buffer descriptors with MPI
(``allgather`` of their bytes) and pool handles over Unix sockets (an MPI message cannot carry
a file descriptor): each rank serves its handle on a socket in a directory rank 0 made, and
fetches every other rank's.  Then each rank maps every other rank's buffer, checks it, and
unmaps.  Then the ranks move Buffers through MPI with ``hipmr_ctypes.interop.mpi`` on every
path this machine has (device memory: ``direct`` when the MPI library is GPU-aware, else
``staged`` through pinned memory; ``host``: pinned Buffers, read in place): a ring
``sendrecv`` (each rank to the next), ``bcast`` from rank 0 and ``allreduce``, each timed
``--repeat`` times, the data checked.  Rank 0 prints both tables (bytes moved per second per
rank and path: the median over the repeats, the slowest rank) and ``--json`` saves them.  Exit
status 1 on any failure.

    mpiexec -n 4 python3 scripts/mpi_demo.py           # as root: --allow-run-as-root
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402
from hipmr_ctypes.interop import mpi as hm  # noqa: E402


PERIOD = 4096


def block(seed: int) -> bytes:
    """One period of rank ``seed``'s pattern."""
    return bytes((i * 11 + seed * 29) & 0xFF for i in range(PERIOD))


def tile(period: bytes, n: int) -> bytes:
    """``n`` bytes repeating ``period`` (every check works on one period, whatever the size)."""
    return (period * (n // len(period) + 1))[:n]


def pattern(n: int, seed: int) -> bytes:
    return tile(block(seed), n)


def serve_handle(server: socket.socket, handle: hmr.IpcPoolHandle, count: int) -> None:
    """Send ``handle`` to each of ``count`` ranks that connect."""
    for _ in range(count):
        conn, _ = server.accept()
        with conn:
            handle.send(conn)


def measure_transfers(world: Any, device: int, size: int,
                      repeat: int) -> "tuple[List[Dict[str, Any]], int]":
    """Ring sendrecv, bcast and allreduce of ``size`` bytes on every path; the bytes each rank
    moved per second in each round, and the failures (wrong data)."""
    rank, nranks = world.Get_rank(), world.Get_size()
    nxt, prev = (rank + 1) % nranks, (rank - 1) % nranks
    results: List[Dict[str, Any]] = []
    failures = 0
    memories = [("device", hmr.AsyncMemoryResource(device)), ("pinned",
                                                              hmr.PinnedMemoryResource())]
    modulus = 256 // max(nranks, 1) or 1
    small = tile(bytes(b % modulus for b in block(rank)), size)
    for memory, resource in memories:
        mine = hmr.Buffer.from_host(pattern(size, rank), resource=resource)
        into = hmr.Buffer(size, resource=resource)
        addend = hmr.Buffer.from_host(small, resource=resource)
        shared = hmr.Buffer(size, resource=resource)
        how = hm.path(mine)
        expected_sum = None
        for op in ("sendrecv", "bcast", "allreduce"):
            rates: List[float] = []
            for _ in range(repeat):
                if op == "bcast":
                    shared.copy_from_host(pattern(size, 99) if rank == 0 else bytes(size))
                world.Barrier()
                t0 = time.perf_counter()
                if op == "sendrecv":
                    hm.sendrecv(mine, nxt, into, prev)
                elif op == "bcast":
                    hm.bcast(shared, root=0)
                else:
                    hm.allreduce(addend, into)
                seconds = time.perf_counter() - t0
                rates.append(size / seconds / 1e9 if seconds > 0 else float("inf"))
            if op == "sendrecv":
                ok = into.tobytes() == pattern(size, prev)
            elif op == "bcast":
                ok = shared.tobytes() == pattern(size, 99)
            else:
                if expected_sum is None:
                    parts = [bytes(b % modulus for b in block(r)) for r in range(nranks)]
                    expected_sum = tile(bytes(sum(col) & 0xFF for col in zip(*parts)), size)
                ok = into.tobytes() == expected_sum
            failures += not ok
            results.append({"path": how, "memory": memory, "op": op, "bytes": size, "ok": ok,
                            "gbps": rates})
        for b in (mine, into, addend, shared):
            b.close()
    return results, failures


def summarize(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (path, memory, transfer): the median over ranks of each rank's median rate,
    and the slowest rank's median."""
    rows: Dict[Any, List[float]] = {}
    sizes: Dict[Any, int] = {}
    for r in reports:
        for t in r.get("transfers", []):
            key = (t["path"], t["memory"], t["op"])
            rows.setdefault(key, []).append(statistics.median(t["gbps"]))
            sizes[key] = t["bytes"]
    return [{"path": k[0], "memory": k[1], "op": k[2], "bytes": sizes[k],
             "gbps_median": statistics.median(v), "gbps_slowest": min(v)}
            for k, v in rows.items()]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8MiB", help="bytes per rank's buffer")
    parser.add_argument("--json", help="rank 0 writes the results here")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per transfer")
    args = parser.parse_args(argv)
    size = parse_bytes(args.size)

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    rank, nranks = node.Get_rank(), node.Get_size()
    ndev = hmr.device_count()
    device = rank % ndev
    hmr.set_device(device)
    report: Dict[str, Any] = {"rank": world.Get_rank(), "node_rank": rank, "device": device,
                              "pid": os.getpid(), "read": {}}
    failures = 0

    pool = hmr.AsyncMemoryResource(device, enable_ipc=True)
    hmr.set_current_device_resource(pool)   # this rank's own device pool
    mine = hmr.Buffer.from_host(pattern(size, rank))
    descriptor = mine.export_ipc()
    handle = pool.pool.export_handle()

    # descriptors travel as bytes through MPI
    descriptors = [hmr.IpcBufferDescriptor.from_bytes(raw)
                   for raw in node.allgather(bytes(descriptor))]

    # pool handles travel over Unix sockets in a directory only this job uses
    directory = node.bcast(tempfile.mkdtemp(prefix="hipmr-mpi-") if rank == 0 else None)
    path = os.path.join(directory, f"rank{rank}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(nranks)
    sender = threading.Thread(target=serve_handle, args=(server, handle, nranks - 1))
    sender.start()
    node.Barrier()                       # every rank listens now

    for other in range(nranks):
        if other == rank:
            continue
        t0 = time.perf_counter()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(os.path.join(directory, f"rank{other}.sock"))
            theirs = hmr.IpcPoolHandle.receive(sock)
        t1 = time.perf_counter()
        res = hmr.AsyncMemoryResource.from_ipc(theirs, device=device)
        t2 = time.perf_counter()
        with hmr.Buffer.from_ipc(descriptors[other], res) as buf:
            t3 = time.perf_counter()
            ok = buf.tobytes() == pattern(size, other)
            t4 = time.perf_counter()
        res.close()
        theirs.close()
        failures += not ok
        report["read"][other] = {"ok": ok, "receive_handle_ms": (t1 - t0) * 1e3,
                                 "import_pool_ms": (t2 - t1) * 1e3, "map_ms": (t3 - t2) * 1e3,
                                 "first_read_ms": (t4 - t3) * 1e3}
    sender.join()
    server.close()
    node.Barrier()                       # nobody maps this rank's memory any more
    handle.close()
    mine.close()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)

    transfers, bad = measure_transfers(world, device, size, max(args.repeat, 1))
    failures += bad
    report["transfers"] = transfers

    reports = world.gather(report, root=0)
    failures = world.allreduce(failures)
    if world.Get_rank() == 0:
        print(f"MPI demo: {world.Get_size()} ranks, platform={hmr.platform()}, "
              f"{size} bytes per rank")
        print("rank | device |  reads | ok | receive handle ms | import pool ms | map ms | "
              "first read ms")
        for r in reports:
            for other, x in sorted(r["read"].items()):
                print(f"{r['rank']:>4} | {r['device']:>6} | {other:>6} | {str(x['ok']):>2} | "
                      f"{x['receive_handle_ms']:>17.3f} | {x['import_pool_ms']:>14.3f} | "
                      f"{x['map_ms']:>6.3f} | {x['first_read_ms']:>13.3f}")
        support = hm.support()
        print(f"MPI library: {support['library']}; GPU-aware: {support['gpu_aware']} "
              f"({support['why']})")
        print(" path  | memory | transfer |   bytes | GB/s per rank (median) | slowest rank")
        summary = summarize(reports)
        for row in summary:
            print(f"{row['path']:>6} | {row['memory']:>6} | {row['op']:>8} | "
                  f"{row['bytes']:>7} | {row['gbps_median']:>22.3f} | {row['gbps_slowest']:>12.3f}")
        print("all checks passed" if not failures else f"{failures} FAILED")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": reports, "failures": failures, "size": size,
                           "mpi": support, "transfers": summary}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

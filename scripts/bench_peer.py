#!/usr/bin/env python3
"""Peer copy bandwidth between two devices: ours beside CuPy and PyTorch on the same buffers.

Two buffers of ``--size`` bytes, one per device (``AsyncMemoryResource``), are copied both
ways: with ``Buffer.copy_from_device(src, stream=s)`` (``hipMemcpyPeerAsync``), with CuPy's
``cupy.cuda.runtime.memcpyPeerAsync`` over the same pointers, and with PyTorch's
``Tensor.copy_`` of the same memory (``torch.from_dlpack``; PyTorch picks its own copy call).
A plain ``memcpyAsync`` of pool memory between devices is an invalid value unless the pool
granted the other device access, so each pool grants the other device access when the two are
peers (what a PyTorch user must do too).  Before timing, every method's copy is checked to
have moved every byte across.  The methods take turns within each round (interleaved); the
table gives the median GB/s over ``--rounds`` rounds of ``--copies`` copies each.  Peers
that are missing are skipped.  ``--json`` saves everything.

    HIPMR_PLATFORM=nvidia python3 scripts/bench_peer.py --size 256MiB --json peer.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes._sizes import parse_bytes  # noqa: E402

from _timing import save_json, take_turns  # noqa: E402


def _ours(dst: hmr.Buffer, src: hmr.Buffer, stream: hmr.Stream) -> Callable[[], None]:
    def copy() -> None:
        dst.copy_from_device(src, stream=stream)
    return copy


def _cupy(dst: hmr.Buffer, src: hmr.Buffer, stream: hmr.Stream) -> Any:
    try:
        import cupy
    except ImportError:
        return None
    copy_peer = cupy.cuda.runtime.memcpyPeerAsync
    args = (dst.ptr, dst.device, src.ptr, src.device, src.size, stream.handle)

    def copy() -> None:
        copy_peer(*args)
    return copy


def _torch(dst: hmr.Buffer, src: hmr.Buffer, stream: hmr.Stream) -> Any:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():   # a CPU build (CI): nothing to compare with
        return None
    d, p = torch.from_dlpack(dst), torch.from_dlpack(src)
    assert d.device.index == dst.device and p.device.index == src.device
    s = torch.cuda.ExternalStream(stream.handle, device=torch.device("cuda", stream.device))

    def copy() -> None:
        with torch.cuda.stream(s):
            d.copy_(p, non_blocking=True)
    return copy


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--copies", type=int, default=10, help="copies per timed run")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    size = parse_bytes(args.size)
    if hmr.device_count() < 2:
        print("bench_peer: needs two devices")
        return 1
    d0, d1 = hmr.Device(0), hmr.Device(1)
    peer = d0.can_access_peer(1) and d1.can_access_peer(0)
    if peer:   # PyTorch and CuPy enable it on first use anyway: measure all alike
        d0.enable_peer_access(1)
        d1.enable_peer_access(0)
    pools = [hmr.AsyncMemoryResource(i) for i in (0, 1)]
    if peer:   # plain (not peer) copies of pool memory need the pool's grant
        pools[0].pool.set_access(1)
        pools[1].pool.set_access(0)
    bufs = [hmr.Buffer.from_host(bytes([i + 1]) * size, resource=pools[i]) for i in (0, 1)]
    results: Dict[str, Dict[str, float]] = {}
    for src_i, dst_i in ((0, 1), (1, 0)):
        src, dst = bufs[src_i], bufs[dst_i]
        src.memset(src_i + 1)
        dst.memset(0)
        with hmr.Device(src_i):
            stream = hmr.Stream()
        methods = {name: make(dst, src, stream) for name, make in
                   (("ours", _ours), ("cupy", _cupy), ("torch", _torch))}
        methods = {k: v for k, v in methods.items() if v is not None}
        for name, fn in methods.items():   # warm up, and check each copies every byte across
            dst.memset(0)
            hmr.Device(dst_i).synchronize()
            fn()
            stream.synchronize()
            hmr.Device(dst_i).synchronize()
            if dst.tobytes().count(src_i + 1) != size:
                print(f"bench_peer: {name}'s copy {src_i}->{dst_i} did not copy the buffer")
                return 1

        def gbs(fn: Callable[[], None]) -> float:
            t0 = time.perf_counter()
            for _ in range(args.copies):
                fn()
            stream.synchronize()
            return size * args.copies / (time.perf_counter() - t0) / 1e9
        samples = take_turns({name: (lambda fn=fn: gbs(fn)) for name, fn in methods.items()},
                             args.rounds)
        assert dst.tobytes()[:1] == bytes([src_i + 1])
        key = f"{src_i}->{dst_i}"
        results[key] = {k: statistics.median(v) for k, v in samples.items()}
        results[key + " samples"] = samples  # type: ignore[assignment]
        stream.close()
    print(f"peer copy bandwidth, {size} bytes, median of {args.rounds} rounds x {args.copies} "
          f"copies (GB/s); peer access {'enabled' if peer else 'not available'}")
    print(f"{'direction':>10} | {'ours':>8} | {'cupy':>8} | {'torch':>8}")
    for key in ("0->1", "1->0"):
        row = results[key]
        print(f"{key:>10} | " + " | ".join(f"{row[k]:>8.1f}" if k in row else f"{'-':>8}"
                                           for k in ("ours", "cupy", "torch")))
    save_json(args.json, {"size": size, "copies": args.copies, "rounds": args.rounds,
                          "peer_access": peer, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

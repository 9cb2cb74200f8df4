"""VirtualMemoryResource on a real GPU (``HIPMR_PLATFORM=nvidia``: the driver's cuMem* calls):
the device's free memory rises by what a pause releases, resume maps the same addresses with
the same bytes, and PyTorch tensors and a CUDA graph captured before a pause work after it.

Marked ``gpu``: ``HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1 python -m pytest -m gpu
tests/resources/test_virtual_memory_gpu.py``; the PyTorch test skips, saying so, without a
CUDA / ROCm build of PyTorch (and fails instead under HIPMR_REQUIRE_TORCH=1)."""
import os
import random
import subprocess
import sys
import textwrap

import pytest

import hipmr_ctypes as hmr
from support import GPU_FREE_SLACK, REPO, free_device_memory, need_gpu_torch

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.fixture
def vmm(gpu_runtime):
    return hmr.VirtualMemoryResource()


def test_granularity_and_rounding(vmm):
    assert vmm.granularity > 0 and vmm.granularity % 4096 == 0
    p = vmm.allocate(1)
    assert vmm.reserved_bytes == vmm.mapped_bytes == vmm.granularity
    vmm.deallocate(p, 1)
    assert vmm.reserved_bytes == vmm.mapped_bytes == 0


def test_pause_gives_the_memory_back_and_resume_restores_it(vmm):
    data = random.Random(7).randbytes(MiB) * 256
    with vmm.tag("weights"):
        weights = hmr.Buffer(len(data), resource=vmm)
    weights.copy_from_host(data)
    with vmm.tag("kv"):
        kv = hmr.Buffer(128 * MiB, resource=vmm)
    kv.fill(0xAB)
    addresses = (weights.ptr, kv.ptr)
    before = free_device_memory()
    released = vmm.pause("weights")
    assert released >= len(data)
    released += vmm.pause("kv", backup=False)
    gained = free_device_memory() - before
    assert released - GPU_FREE_SLACK <= gained <= released + GPU_FREE_SLACK, (gained, released)
    assert vmm.paused() and vmm.mapped_bytes == 0
    assert vmm.resume() == released
    assert (weights.ptr, kv.ptr) == addresses
    assert abs(free_device_memory() - before) <= GPU_FREE_SLACK
    assert weights.tobytes() == data
    assert kv.tobytes() == bytes(128 * MiB)       # dropped: zero-filled
    for _ in range(3):                            # again and again, the same bytes
        vmm.pause()
        vmm.resume()
    assert weights.tobytes() == data


def test_later_pauses_copy_into_the_kept_pinned_blocks(vmm, monkeypatch):
    """Two blocks of 64 MiB and a rest: the first pause allocates them, every later one
    copies into the ones the resume kept (no hipHostMalloc), with the bytes of each cycle."""
    from support import spy_runtime_calls
    size = 128 * MiB + 3 * MiB + 4096
    buf = hmr.Buffer(size, resource=vmm)
    rt = hmr._hip.get_runtime()
    calls = spy_runtime_calls(monkeypatch, rt, "hipHostMalloc", "hipHostFree")
    for cycle in range(3):
        data = random.Random(cycle).randbytes(MiB) * (size // MiB) + bytes(size % MiB)
        buf.copy_from_host(data)     # (a copy may stage through pinned memory of its own)
        del calls[:]
        vmm.pause()
        assert vmm.backup_bytes == size
        vmm.resume()
        assert calls == (["hipHostMalloc"] * 3 if cycle == 0 else []), cycle
        assert vmm.backup_bytes == size and buf.tobytes() == data
    del calls[:]
    assert vmm.release_backup_memory() == size and vmm.backup_bytes == 0
    assert calls == ["hipHostFree"] * 3


def test_deallocating_paused_memory_and_a_pool_over_it(vmm):
    pool = hmr.PoolResource(vmm, initial_pool_size=64 * MiB)
    buf = hmr.Buffer(MiB, resource=pool)
    buf.fill(5)
    vmm.pause()
    vmm.resume()
    assert set(buf.tobytes()) == {5}
    vmm.pause()
    del buf, pool        # frees a paused range; its backup's blocks become spares
    assert vmm.reserved_bytes == 0
    assert vmm.backup_bytes == vmm.release_backup_memory() == 64 * MiB   # the pool's chunk


def test_stream_ordered_deallocation_waits_for_the_stream(vmm):
    with hmr.Stream() as s:
        buf = hmr.Buffer(64 * MiB, resource=vmm, stream=s)
        buf.fill(1, stream=s)
        del buf                                   # deallocate_async on s: waits, then unmaps
        assert s.ref.ready()
    assert vmm.reserved_bytes == 0




def test_torch_tensors_and_a_graph_survive_a_pause(gpu_runtime, tmp_path):
    need_gpu_torch()
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import torch
        import hipmr_ctypes as hmr
        from hipmr_ctypes.interop import torch as ht

        vmm = hmr.VirtualMemoryResource()
        pool = ht.mem_pool(vmm)
        torch.manual_seed(0)
        with torch.cuda.use_mem_pool(pool), vmm.tag("weights"):
            model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).cuda()
        with torch.cuda.use_mem_pool(pool), vmm.tag("kv"):
            kv = torch.full((256 << 20,), 7, dtype=torch.uint8, device="cuda")
        x = torch.randn(8, 4096, device="cuda")
        with torch.no_grad():
            expected = model(x)
            static_out = torch.empty_like(expected)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out.copy_(model(x))
        weight_ptrs = [p.data_ptr() for p in model.parameters()]
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        released = vmm.pause("weights") + vmm.pause("kv", backup=False)
        gained = torch.cuda.mem_get_info()[0] - free_before
        assert released >= (16 * 4096 * 4097 * 4) + (256 << 20), released
        assert abs(gained - released) <= 64 << 20, (gained, released)
        busy = torch.ones(released // 4, dtype=torch.float32, device="cuda")   # reuse it
        assert int(busy[-1]) == 1 and int(busy[0]) == 1
        del busy
        torch.cuda.empty_cache()
        assert vmm.resume() == released
        assert [p.data_ptr() for p in model.parameters()] == weight_ptrs
        with torch.no_grad():
            assert torch.equal(model(x), expected)
            static_out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_out, expected)
        assert int(kv.count_nonzero()) == 0
        print("ok", released)
    """))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=540)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "ok" in done.stdout, out
    assert "Fatal Python error" not in out and "Exception ignored" not in out, out

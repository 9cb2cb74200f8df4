"""VirtualPoolResource on a real GPU (``HIPMR_PLATFORM=nvidia``: the driver's cuMem* calls):
pages mapped as the pool grows, blocks that coalesce across pages, data intact across page
boundaries, free pages unmapped under a maximum and by release() (the device's free memory
rises), stream-ordered reuse, and PyTorch training over it (``interop.torch.use()``'s default,
the allocator route) giving the losses PyTorch's own allocator gives.

Marked ``gpu``: ``HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1 python -m pytest -m gpu
tests/resources/test_virtual_pool_gpu.py``; the PyTorch tests skip, saying so, without a
CUDA / ROCm build of PyTorch (and fail instead under HIPMR_REQUIRE_TORCH=1)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import hipmr_ctypes as hmr
from support import GPU_FREE_SLACK, REPO, free_device_memory, need_gpu_torch

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.fixture
def pool(gpu_runtime):
    made = hmr.VirtualPoolResource()
    yield made
    made.release()


def test_pages_coalesce_and_hold_data_across_their_boundaries(pool):
    g = pool.granularity
    assert g > 0 and g % 4096 == 0 and pool.reserved_bytes >= hmr.available_device_memory()[1]
    free = free_device_memory()
    ptrs = [pool.allocate(g) for _ in range(4)]
    assert ptrs == [ptrs[0] + i * g for i in range(4)]
    assert pool.mapped_bytes == 4 * g
    assert free - free_device_memory() >= 4 * g - GPU_FREE_SLACK
    for p in ptrs:
        pool.deallocate(p, g)
    buf = hmr.Buffer(4 * g - 512, resource=pool)        # one block over the four pages
    assert buf.ptr == ptrs[0] and pool.mapped_bytes == 4 * g
    data = bytes(range(256)) * ((4 * g - 512) // 256)
    buf.copy_from_host(data)
    assert buf.tobytes() == data
    del buf
    free = free_device_memory()
    assert pool.release() == 4 * g and pool.mapped_bytes == 0
    assert free_device_memory() - free >= 4 * g - GPU_FREE_SLACK


def test_a_maximum_unmaps_free_pages_before_running_out(gpu_runtime):
    probe = hmr.VirtualPoolResource()
    g = probe.granularity
    del probe
    pool = hmr.VirtualPoolResource(maximum_pool_size=4 * g)
    a, b, c, d = (pool.allocate(g) for _ in range(4))
    pool.deallocate(a, g)
    pool.deallocate(c, g)
    e = pool.allocate(2 * g)
    assert e == d + g and pool.mapped_bytes == 4 * g
    with pytest.raises(hmr.OutOfMemoryError):
        pool.allocate(g)
    buf = hmr.Buffer.from_handle(e, 2 * g, owner=pool)
    buf.fill(5)
    assert set(buf.tobytes()) == {5}
    del buf
    for p, n in ((b, g), (d, g), (e, 2 * g)):
        pool.deallocate(p, n)
    assert pool.release() == 4 * g


def test_stream_ordered_reuse_across_streams(pool):
    s1, s2 = hmr.Stream(), hmr.Stream()
    n = 64 * MiB
    a = hmr.Buffer(n, resource=pool, stream=s1)
    a.fill(1)
    ptr = a.ptr
    del a                                   # freed on s1, in stream order
    b = hmr.Buffer(n, resource=pool, stream=s2)
    assert b.ptr == ptr                     # reused on s2 after an event on s1
    b.fill(2)
    s2.synchronize()
    assert set(b.tobytes()) == {2}
    del b
    s1.synchronize()
    s2.synchronize()
    assert pool.release() >= n
    s1.close()
    s2.close()




#: a small transformer-like model trained with AdamW under bf16 autocast on batches of varying
#: size (so blocks of many sizes are freed and taken again), printing the losses as JSON
TRAINING = textwrap.dedent("""
    import json, sys
    import torch
    mode = sys.argv[1]
    if mode != "native":
        import hipmr_ctypes as hmr
        from hipmr_ctypes.interop import torch as ht, torch_default
        if mode == "default":
            made = ht.use()
        else:
            made = ht.use(hmr.VirtualPoolResource(), route="allocator")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    layer = lambda: torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True,
                                                     dropout=0.0)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 256),
                                torch.nn.TransformerEncoder(layer(), 4),
                                torch.nn.Linear(256, 1000)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1)
    side = torch.cuda.Stream()
    losses = []
    for step in range(30):
        batch = (4, 16, 9, 32, 2)[step % 5]
        ids = torch.randint(0, 1000, (batch, 128), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 1000),
                                                     ids.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.stream(side):              # memory used on another stream too
            side.wait_stream(torch.cuda.current_stream())
            extra = torch.ones(batch << 16, device="cuda")
            total = extra.sum()
        torch.cuda.current_stream().wait_stream(side)
        extra.record_stream(torch.cuda.current_stream()) if mode != "allocator" else None
        assert float(total) == batch << 16
        del extra, total
        losses.append(float(loss))
    torch.cuda.synchronize()
    out = {"losses": losses}
    if mode != "native":
        pool = torch_default._pools.get(0) if mode == "default" else made.resource
        out["route"] = made.route
        out["pool"] = type(pool).__name__
        out["mapped"] = pool.mapped_bytes
        del model, opt, logits, loss, ids
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0]
        out["released"] = pool.release()
        out["free_gain"] = torch.cuda.mem_get_info()[0] - free
        out["failures"] = made.failures
    print("RESULT " + json.dumps(out))
""")


def _train(tmp_path, mode):
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("HIPMR_DEVICE_RESOURCE", None)
    done = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Fatal Python error" not in out and "Exception ignored" not in out, out
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("mode", ["default", "allocator"])
def test_training_over_the_pool_gives_pytorchs_losses(gpu_runtime, tmp_path, mode):
    need_gpu_torch()
    native = _train(tmp_path, "native")
    ours = _train(tmp_path, mode)
    assert ours["pool"] == "VirtualPoolResource" and ours["failures"] == 0
    assert ours["route"] == ("pool" if mode == "default" else "allocator")
    assert ours["mapped"] > 0
    if mode == "allocator":     # (under the pool route PyTorch may keep its segments cached)
        assert ours["released"] > 0
    assert ours["free_gain"] >= ours["released"] - GPU_FREE_SLACK
    assert len(ours["losses"]) == len(native["losses"]) == 30
    for got, want in zip(ours["losses"], native["losses"]):
        assert abs(got - want) <= 2e-2 * max(1.0, abs(want)), (ours["losses"], native["losses"])

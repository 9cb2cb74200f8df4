"""The PyTorch allocator on a real GPU, with PyTorch's CUDA (or ROCm) build.

PyTorch's allocator can be replaced only before its first CUDA allocation in a process, so
each test runs a script in a fresh interpreter (the platform of this run, e.g.
``HIPMR_PLATFORM=nvidia``) and checks what it prints and how it ends.  Marked ``gpu``: run
with ``HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1 HIPMR_REQUIRE_TORCH=1``."""
import os
import subprocess
import sys
import textwrap

import pytest
from support import REPO

try:
    import torch
except ImportError:
    if os.environ.get("HIPMR_REQUIRE_TORCH") == "1":
        raise  # required (HIPMR_REQUIRE_TORCH=1, set by .ci/run where it installs PyTorch)
    pytest.skip("PyTorch is not installed (pip install torch==2.13.0: the CPU build will do)",
                allow_module_level=True)

pytestmark = pytest.mark.gpu


@pytest.fixture
def run_script(gpu_runtime, tmp_path):
    if not hasattr(torch._C, "_cuda_customAllocator"):
        if os.environ.get("HIPMR_REQUIRE_GPU") == "1":
            pytest.fail(f"PyTorch {torch.__version__} has no CUDA / ROCm support")
        pytest.skip(f"PyTorch {torch.__version__} has no CUDA / ROCm support")

    def run(code, prelude="", **variables):
        script = tmp_path / "script.py"
        script.write_text(PRELUDE + prelude + textwrap.dedent(code))
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   **variables)
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=540)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "Fatal Python error" not in out and "Exception ignored" not in out, out
        assert "does not hold" not in out, out        # no unknown or double free
        return done.stdout
    return run


PRELUDE = """
import gc, io, os, threading
import torch
import hipmr_ctypes as hmr
from hipmr_ctypes.interop import torch as ht

def live_bytes(stats):
    return stats.statistics.current_bytes
"""


def test_use_tensors_training_streams_threads_and_exit(run_script):
    out = run_script("""
    log = io.StringIO()
    stats = hmr.StatisticsResource(hmr.PoolResource(hmr.AsyncMemoryResource(), "64MiB"))
    alloc = ht.use(hmr.LoggingResource(stats, log), route="allocator")
    assert ht.installed() is alloc and alloc.route == "allocator"

    # tensors of many sizes: exactly their bytes, through the statistics
    for n in [1, 7, 255, 256, 257, 4095, 4097, 1 << 20, (3 << 20) + 5, 64 << 20, 300 << 20]:
        before = live_bytes(stats)
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        assert live_bytes(stats) - before == n, (n, live_bytes(stats) - before)
        t.fill_(3)
        assert int(t.sum(dtype=torch.int64)) == 3 * n
        del t
        torch.cuda.synchronize()
        assert live_bytes(stats) == before, n
    e = torch.empty(0, device="cuda")                     # zero bytes: no allocation
    assert e.numel() == 0 and alloc.failures == 0

    # a small training loop: forward, backward, optimizer step
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(512, 64, device="cuda")
    y = (x[:, :10].argmax(dim=1))
    losses = []
    for step in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
    print("TRAIN", round(losses[0], 3), round(losses[-1], 3))

    # several streams: each allocation on the stream PyTorch passes
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):
        a = torch.ones(5 << 18, device="cuda")           # 5 MiB
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        b = a * 2                                         # 5 MiB on s2
    s2.synchronize()
    assert float(b.sum()) == 2 * (5 << 18)
    lines = [line.split(",") for line in log.getvalue().splitlines()[1:]]
    streams = {int(line[5], 16) for line in lines if line[2] == "allocate"
               and int(line[4]) == 5 << 20}
    assert {s1.cuda_stream, s2.cuda_stream} <= streams, (streams, s1.cuda_stream)

    # threads, each on its own stream
    errors = []
    def work(i):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for k in range(50):
                    t = torch.full((1000 + 17 * k,), float(i), device="cuda")
                    assert float(t[-1]) == float(i)
                    del t
            s.synchronize()
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors

    del a, b, model, opt, x, y, loss, e
    gc.collect()
    torch.cuda.synchronize()
    count, nbytes = alloc.outstanding()
    assert nbytes == live_bytes(stats), (nbytes, live_bytes(stats))  # cuBLAS keeps a workspace
    assert alloc.failures == 0 and alloc.unknown_frees == 0
    print("OUTSTANDING", count, nbytes, "PEAK", stats.statistics.peak_bytes)
    # more tensors still alive at exit: nothing is freed after the exit hook, nothing crashes
    keep = [torch.empty(1 << 20, device="cuda") for _ in range(8)]
    print("OK")
    """)
    assert "OK" in out.split(), out


def test_use_after_cuda_started_takes_the_pool_route(run_script):
    out = run_script("""
    t = torch.zeros(4, device="cuda")
    try:
        ht.use()
    except RuntimeError as exc:
        raise AssertionError(f"the pool route works after CUDA started: {exc}")
    try:
        ht.use(route="allocator")
    except RuntimeError as exc:
        assert "already called" in str(exc), exc
        print("REFUSED")
    assert ht.installed() is not None and ht.installed().route == "pool"
    assert float((t + 1).sum()) == 4.0                     # PyTorch's own memory still works
    """)
    assert "REFUSED" in out.split(), out


def test_mem_pool_scopes_the_allocator_and_a_limit_is_pytorchs_oom(run_script):
    out = run_script("""
    stats = hmr.StatisticsResource(hmr.PoolResource(hmr.AsyncMemoryResource(), "64MiB"))
    limited = hmr.LimitingResource(stats, "256MiB")
    outside = torch.empty(1 << 20, device="cuda")         # PyTorch's own caching allocator
    alloc = ht.allocator(limited)
    pool = ht.mem_pool(alloc)
    assert live_bytes(stats) == 0
    with torch.cuda.use_mem_pool(pool):
        inside = torch.ones(1 << 20, device="cuda")       # 4 MiB: a segment from our pool
        assert 4 << 20 <= live_bytes(stats) <= 256 << 20, live_bytes(stats)
        try:
            torch.empty(1 << 30, dtype=torch.uint8, device="cuda")   # over the limit
        except torch.cuda.OutOfMemoryError:
            print("OOM")
        assert alloc.failures >= 1
        again = torch.ones(1 << 18, device="cuda")        # still allocates afterwards
    assert float(inside.sum()) == float(1 << 20) and float(again.sum()) == float(1 << 18)
    assert alloc.outstanding()[1] == live_bytes(stats) <= 256 << 20
    print("SEGMENTS", alloc.outstanding())
    del inside, again
    """)
    assert "OOM" in out.split(), out


def test_a_refused_allocation_under_the_allocator_route(run_script):
    """What PyTorch does with the NULL of a refused allocation when the allocator is installed
    for the process (PyTorch's pluggable allocator does not check it): the process neither
    crashes nor frees anything twice; the behaviour is printed for docs/interop.md."""
    out = run_script("""
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)       # the refusal's own report
    limited = hmr.LimitingResource(hmr.AsyncMemoryResource(), "64MiB")
    alloc = ht.use(limited, route="allocator")
    try:
        t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        print("BEHAVIOUR OutOfMemoryError")
    except RuntimeError as exc:
        print("BEHAVIOUR RuntimeError", str(exc).splitlines()[0])
    else:
        try:
            print("BEHAVIOUR tensor data_ptr", t.data_ptr())
        except RuntimeError as exc:
            print("BEHAVIOUR data_ptr RuntimeError", str(exc).splitlines()[0])
        del t
    assert alloc.failures == 1
    ok = torch.ones(1000, device="cuda")
    assert float(ok.sum()) == 1000.0
    print("OK")
    """)
    assert "OK" in out.split() and "BEHAVIOUR" in out, out
    # what docs/interop.md says PyTorch does (2.11: a tensor at address 0), or PyTorch's own
    # refusal should a later release check the pointer
    assert ("BEHAVIOUR tensor data_ptr 0" in out or "BEHAVIOUR OutOfMemoryError" in out
            or "BEHAVIOUR RuntimeError" in out or "BEHAVIOUR data_ptr RuntimeError" in out), out
    print(out)


# ---- the pool route: PyTorch's caching allocator on top of a MemPool over our allocator ----
POOL_PRELUDE = """
log = io.StringIO()
stats = hmr.StatisticsResource(hmr.PoolResource(hmr.AsyncMemoryResource(), "64MiB"))
alloc = ht.use(hmr.LoggingResource(stats, log))
assert alloc.route == "pool", alloc.route
MiB = 1 << 20
"""


def test_pool_route_keeps_pytorchs_statistics_and_covers_its_segments(run_script):
    out = run_script(prelude=POOL_PRELUDE, code="""
    # everything PyTorch reserved came from our resource (use() ran before any tensor)
    assert alloc.outstanding()[1] == torch.cuda.memory_reserved() == live_bytes(stats)
    before = torch.cuda.memory_allocated()
    t = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() - before == 10 * MiB
    assert torch.cuda.memory_stats()["allocated_bytes.all.current"] == \
        torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_allocated() >= 10 * MiB
    assert alloc.outstanding()[1] == torch.cuda.memory_reserved() == live_bytes(stats)
    snap = torch.cuda.memory_snapshot()
    assert any(seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"]
               for seg in snap), "PyTorch's snapshot shows the tensor in one of its segments"
    ptr = t.data_ptr()
    del t
    again = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
    assert again.data_ptr() == ptr                         # PyTorch's cache, no call to us
    # a training loop: losses fall, every segment is ours
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(512, 64, device="cuda")
    y = x[:, :10].argmax(dim=1)
    losses = []
    for step in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
    assert alloc.outstanding()[1] == torch.cuda.memory_reserved() == live_bytes(stats)
    assert alloc.failures == 0
    print("OK")
    """)
    assert "OK" in out.split(), out


def test_pool_route_refusal_is_pytorchs_out_of_memory_error(run_script):
    out = run_script("""
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)       # the refusal's own report
    limited = hmr.LimitingResource(hmr.AsyncMemoryResource(), "256MiB")
    alloc = ht.use(limited)
    assert alloc.route == "pool"
    keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as exc:
        print("OOM")
    assert alloc.failures >= 1
    ok = torch.ones(1000, device="cuda")                  # still allocates afterwards
    assert float(ok.sum()) == 1000.0 and int(keep[:16].sum()) >= 0
    assert limited.get_allocated_bytes() <= 256 << 20
    print("OK")
    """)
    assert "OOM" in out.split() and "OK" in out.split(), out


def test_pool_route_honours_record_stream(run_script):
    out = run_script(prelude=POOL_PRELUDE, code="""
    side = torch.cuda.Stream()
    t = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
    ptr = t.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)                  # keeps the side stream busy
        t.fill_(7)
    t.record_stream(side)
    del t
    u = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
    assert u.data_ptr() != ptr, "reused while the stream it was recorded on still runs"
    side.synchronize()
    del u
    torch.cuda.synchronize()
    print("OK")
    """)
    assert "OK" in out.split(), out


def test_pool_route_empty_cache_gives_memory_back(run_script):
    out = run_script(prelude=POOL_PRELUDE, code="""
    t = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
    held = live_bytes(stats)
    assert held >= 200 * MiB
    del t
    torch.cuda.synchronize()
    assert live_bytes(stats) == held                      # cached by PyTorch, still ours
    torch.cuda.empty_cache()
    assert live_bytes(stats) <= held - 200 * MiB, (held, live_bytes(stats))
    assert alloc.outstanding()[1] == torch.cuda.memory_reserved() == live_bytes(stats)
    u = torch.ones(1000, device="cuda")                   # the route goes on, on a fresh pool
    assert float(u.sum()) == 1000.0 and live_bytes(stats) > 0
    print("OK")
    """)
    assert "OK" in out.split(), out


def test_pool_route_graph_capture_and_replay(run_script):
    out = run_script(prelude=POOL_PRELUDE, code="""
    static_in = torch.zeros(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                          # warm-up, as PyTorch advises
        for _ in range(3):
            static_in * 2 + 1
    torch.cuda.current_stream().wait_stream(side)
    before = alloc.outstanding()[1]
    lines_before = len(log.getvalue().splitlines())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tmp = static_in * 2
        static_out = tmp + 1
        big = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")  # a new segment
        big.fill_(1)
    assert alloc.outstanding()[1] > before                # the graph's pool is ours too
    # the segments asked for during the capture (the 20 MiB one of tmp and static_out, big's)
    # were made on our own stream; PyTorch may take a small one on its capture stream first,
    # before the capture starts (its random generator's state)
    ours = alloc._route.side[torch.cuda.current_device()].ref.get()
    made = [line.split(",") for line in log.getvalue().splitlines()[lines_before:]]
    streams = {int(l[5], 16) for l in made if l[2] == "allocate" and int(l[4]) >= 20 * MiB}
    assert streams == {ours}, (streams, ours, made)
    for k in range(3):
        static_in.copy_(torch.arange(1 << 20, device="cuda", dtype=torch.float32) + k)
        graph.replay()
        torch.cuda.synchronize()
        expect = (torch.arange(1 << 20, device="cuda", dtype=torch.float32) + k) * 2 + 1
        assert torch.equal(static_out, expect), k
    eager = torch.ones(1000, device="cuda")               # eager memory still routed
    assert float(eager.sum()) == 1000.0
    del graph, static_out, tmp, big
    torch.cuda.synchronize()
    assert alloc.failures == 0
    print("OK")
    """)
    assert "OK" in out.split(), out


def test_pool_route_leaves_graphs_and_per_thread_pools_their_own_memory(run_script):
    """A graph's allocations land in the graph's pool and a per-thread pool's in that pool,
    never in the route's (which would hand a graph's memory to other tensors)."""
    out = run_script(prelude=POOL_PRELUDE, code="""
    def pool_of(t):
        for seg in torch.cuda.memory_snapshot():
            if seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"]:
                return tuple(seg["segment_pool_id"])
    route = alloc._route
    outside = torch.empty(MiB, device="cuda")
    assert pool_of(outside) == tuple(route.pools[0].id)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    x = torch.ones(MiB // 4, device="cuda")
    with torch.cuda.graph(graph, stream=side):
        y = x * 2
    assert pool_of(y) not in (tuple(route.pools[0].id), (0, 0)), (pool_of(y), route.pools)
    graph.replay(); torch.cuda.synchronize()
    assert bool((y == 2).all())
    pool = torch.cuda.MemPool(alloc.allocator())   # kept alive: see docs/interop.md
    with torch.cuda.use_mem_pool(pool):
        z = torch.empty(MiB, device="cuda")
    assert pool_of(z) == tuple(pool.id), (pool_of(z), pool.id)
    del z
    after = torch.empty(MiB, device="cuda")
    assert pool_of(after) == tuple(route.pools[0].id)
    print("newest_first", route.newest_first)
    print("OK", flush=True)
    os._exit(0)   # the MemPool of our own dies with the process, never while routed
    """)
    assert "OK" in out.split(), out


def test_pool_route_torch_compile_reduce_overhead(run_script):
    out = run_script(prelude=POOL_PRELUDE, code="""
    try:
        import triton  # noqa: F401 - what inductor needs on a GPU
    except ImportError:
        print("NO-TRITON")
        raise SystemExit(0)
    def f(x):
        return torch.sin(x) * 2 + x
    compiled = torch.compile(f, mode="reduce-overhead")
    x = torch.randn(4096, device="cuda")
    for _ in range(4):                                    # records, then replays the graph
        y = compiled(x)
    torch.cuda.synchronize()
    assert torch.allclose(y, f(x))
    assert alloc.failures == 0
    print("OK")
    """)
    if "NO-TRITON" in out.split():
        pytest.skip("triton is not installed: torch.compile has no GPU back end here")
    assert "OK" in out.split(), out


def test_pytorchs_async_backend_is_refused(run_script):
    """Under ``backend:cudaMallocAsync`` neither route is taken: RuntimeError naming the
    backend, and PyTorch's own allocator keeps working."""
    out = run_script("""
    assert torch.cuda.get_allocator_backend() == "cudaMallocAsync"
    try:
        ht.use(hmr.AsyncMemoryResource())
    except RuntimeError as exc:
        assert "backend is 'cudaMallocAsync'" in str(exc), exc
    else:
        raise AssertionError("use() took a route under cudaMallocAsync")
    assert ht.installed() is None
    t = torch.ones(1 << 20, device="cuda")
    assert float(t.sum()) == 1 << 20
    print("refused under cudaMallocAsync")
    """, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    assert "refused under cudaMallocAsync" in out

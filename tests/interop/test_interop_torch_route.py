"""The pool route of ``interop.torch.use()`` on any PyTorch build: its guard (version and
signatures of the private functions), its fallback, and what it asks of PyTorch, with
PyTorch's CUDA pieces replaced by stand-ins that record the calls (the CPU build has none of
them).  What PyTorch then does with the route is tested on the GPU
(tests/interop/test_interop_torch_gpu.py)."""
import contextlib
import itertools
import os
import warnings
import weakref

import pytest

try:
    import torch
except ImportError:
    if os.environ.get("HIPMR_REQUIRE_TORCH") == "1":
        raise  # required (HIPMR_REQUIRE_TORCH=1, set by .ci/run where it installs PyTorch)
    pytest.skip("PyTorch is not installed (pip install torch==2.13.0: the CPU build will do)",
                allow_module_level=True)

import hipmr_ctypes as hmr  # noqa: E402
from hipmr_ctypes.interop import torch as ht  # noqa: E402
from hipmr_ctypes.interop import torch_route  # noqa: E402
from support import AddressSpaceResource  # noqa: E402

SIGNATURE = "_cuda_beginAllocateToPool(arg0: int, arg1: tuple[int, int]) -> None\n"


class Recording(AddressSpaceResource):
    """An async upstream that remembers the stream of every allocation."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.streams = []

    def allocate_async(self, bytes, alignment, stream):
        self.streams.append(stream)
        return super().allocate_async(bytes, alignment, stream)


class FakePyTorch:
    """PyTorch's CUDA pieces the route uses, recording what the route asks of them."""

    def __init__(self, monkeypatch, devices=2, routes=True, newest_first=False):
        self.calls = []
        self.newest_first = newest_first   # which begun pool serves a tensor (PyTorch's rule)
        self.begun = []                    # the pools begun and not ended, oldest first
        self.served = {}                   # address -> the pool that served it
        self.capturing = False
        self.device = 0
        self.routes = routes          # whether "PyTorch" serves tensors from the routed pool
        self.allocator = None         # the Allocator whose C function a tensor reaches
        self.graph_calls = []
        ids = itertools.count(1)
        fake = self

        class MemPool:
            def __init__(self, native, use_on_oom=False, no_split=False):
                self.native = native
                self.id = (0, next(ids))
                self.device = fake.device
                fake.calls.append(("pool", self.id, self.device))

        def begin(device, pool_id):
            fake.calls.append(("begin", device, pool_id))
            fake.begun.append(pool_id)

        def end(device, pool_id):
            fake.calls.append(("end", device, pool_id))
            fake.begun.remove(pool_id)

        def release(device, pool_id):
            fake.calls.append(("release", device, pool_id))

        def empty_cache():
            fake.calls.append(("empty_cache",))

        def thread_begin(device, pool_id):
            fake.calls.append(("thread_begin", device, pool_id))
            fake.begun.append(pool_id)

        def holds(device, pool_id, ptrs):
            return all(fake.served.get(ptr) == pool_id for ptr in ptrs)

        def capture_begin(graph, pool=None, capture_error_mode="global", **kw):
            fake.graph_calls.append((graph, pool, capture_error_mode))

        @contextlib.contextmanager
        def device(index):
            before, fake.device = fake.device, index
            try:
                yield
            finally:
                fake.device = before

        class Tensor:
            def __init__(self, ptr):
                self.ptr = ptr

            def data_ptr(self):
                return self.ptr

        def empty(*shape, dtype=None, device=None):
            if not fake.routes:
                return Tensor(1 << 44)   # from somewhere else
            c_alloc = ht.ALLOC_FN(fake.allocator.alloc_address)
            ptr = c_alloc(2 << 20, int(str(device).split(":")[1]), 0)
            if fake.begun:
                fake.served[ptr] = fake.begun[-1 if fake.newest_first else 0]
            return Tensor(ptr)

        begin.__doc__ = SIGNATURE
        self.MemPool = MemPool
        monkeypatch.setattr(ht, "_installed", [])
        monkeypatch.setattr(ht.Allocator, "allocator", lambda a: "native")
        monkeypatch.setattr(torch._C, "_cuda_customAllocator", lambda a, f: "native",
                            raising=False)
        monkeypatch.setattr(torch.cuda, "MemPool", MemPool)
        monkeypatch.setattr(torch._C, "_cuda_beginAllocateToPool", begin)
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end)
        monkeypatch.setattr(torch._C, "_cuda_releasePool", release)
        monkeypatch.setattr(torch._C, "_cuda_emptyCache", empty_cache, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool", thread_begin,
                            raising=False)
        monkeypatch.setattr(torch.cuda.memory, "_cuda_beginAllocateCurrentThreadToPool",
                            thread_begin, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_checkPoolLiveAllocations", holds, raising=False)
        monkeypatch.setattr(torch.cuda.memory, "_cuda_endAllocateToPool", end, raising=False)
        monkeypatch.setattr(torch.cuda.graphs.CUDAGraph, "capture_end",
                            lambda graph: fake.graph_calls.append((graph, "end")))
        monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing",
                            lambda: fake.capturing, raising=False)
        monkeypatch.setattr(torch.cuda.graphs.CUDAGraph, "capture_begin", capture_begin)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", torch.cuda.graph_pool_handle)
        monkeypatch.setattr(torch.cuda.graphs, "graph_pool_handle",
                            torch.cuda.graphs.graph_pool_handle)
        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
        monkeypatch.setattr(torch.cuda, "init", lambda: fake.calls.append(("init",)))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.device)
        monkeypatch.setattr(torch, "empty", empty)
        self.capture_begin = capture_begin
        self.empty_cache = empty_cache

    def use(self, resource, **kw):
        original = ht.Allocator.__init__
        fake = self

        def init(alloc, *a, **k):
            original(alloc, *a, **k)
            fake.allocator = alloc

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ht.Allocator, "__init__", init)
            made = ht.use(resource, **kw)
        # the route's trial of PyTorch's order (two pools, begun and ended) is kept apart
        self.install_calls = list(self.calls)
        if made.route == "pool":
            probe = [c[2] for c in self.calls if c[0] in ("begin", "thread_begin")][:2]
            self.calls = [c for c in self.calls if not (
                c[0] == "pool" and c[1] in probe or len(c) == 3 and c[2] in probe)]
        return made


def test_the_cpu_build_has_no_route():
    problem = torch_route.route_problem()
    if hasattr(torch._C, "_cuda_customAllocator"):
        pytest.skip("a CUDA / ROCm build: its route is tested on the GPU")
    assert "without CUDA or ROCm" in problem


def test_the_guard(monkeypatch):
    FakePyTorch(monkeypatch)
    assert torch_route.route_problem() is None
    monkeypatch.setattr(torch, "__version__", "2.7.1+cu128")
    assert "older than 2.8" in torch_route.route_problem()
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    monkeypatch.setattr(torch._C._cuda_beginAllocateToPool, "__doc__",
                        "_cuda_beginAllocateToPool(arg0: int, arg1: tuple[int, int], "
                        "arg2: Callable) -> None")
    assert "is not (device: int, mempool_id: tuple[int, int]) -> None" in \
        torch_route.route_problem()
    # PyTorch 2.11's pybind11 spells the ints typing.SupportsInt: the same signature
    monkeypatch.setattr(torch._C._cuda_beginAllocateToPool, "__doc__",
                        "_cuda_beginAllocateToPool(arg0: typing.SupportsInt, arg1: "
                        "tuple[typing.SupportsInt, typing.SupportsInt]) -> None\n")
    assert torch_route.route_problem() is None
    monkeypatch.setattr(torch._C._cuda_beginAllocateToPool, "__doc__", None)
    assert "no signature" in torch_route.route_problem()
    monkeypatch.setattr(torch._C._cuda_beginAllocateToPool, "__doc__", SIGNATURE)
    monkeypatch.delattr(torch._C, "_cuda_releasePool")
    assert "has no torch._C._cuda_releasePool" in torch_route.route_problem()


def test_pool_route_routes_every_device_and_checks_it(monkeypatch):
    fake = FakePyTorch(monkeypatch, devices=2)
    up = Recording()
    alloc = fake.use(up, route="pool")
    assert alloc.route == "pool" and ht.installed() is alloc
    pools = [c for c in fake.calls if c[0] == "pool"]
    begins = [c for c in fake.calls if c[0] == "begin"]
    assert fake.calls[0] == ("init",)                        # PyTorch's CUDA state first
    assert [(p[2]) for p in pools] == [0, 1]                # one MemPool per device, made there
    assert begins == [("begin", 0, pools[0][1]), ("begin", 1, pools[1][1])]
    # the check's tensor per device, and the trial's (the stand-ins never free a tensor)
    assert alloc.outstanding()[0] == 3
    with pytest.raises(RuntimeError, match="already called"):
        fake.use(up, route="pool")
    with pytest.raises(RuntimeError, match="already routes"):
        ht.mem_pool(up)


def test_a_route_that_does_not_reach_the_allocator_is_undone(monkeypatch):
    fake = FakePyTorch(monkeypatch, devices=2, routes=False)
    with pytest.raises(RuntimeError, match="did not take the memory of a tensor on device 0"):
        fake.use(Recording(), route="pool")
    assert ht.installed() is None
    pool_id = [c for c in fake.calls if c[0] == "pool"][2][1]   # after the trial's two
    assert fake.calls[-2:] == [("end", 0, pool_id), ("release", 0, pool_id)]
    assert torch.cuda.graphs.CUDAGraph.capture_begin is fake.capture_begin   # not wrapped
    assert torch._C._cuda_emptyCache is fake.empty_cache


def test_auto_falls_back_with_a_warning_and_pool_refuses(monkeypatch):
    fake = FakePyTorch(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "2.5.0")
    with pytest.raises(RuntimeError, match="pool route is not available: PyTorch 2.5.0 is "
                                           "older"):
        fake.use(Recording(), route="pool")
    replaced = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda.memory, "change_current_allocator", replaced.append)
    with pytest.warns(RuntimeWarning, match=r"pool route is not available \(PyTorch 2.5.0"):
        alloc = fake.use(Recording())
    assert alloc.route == "allocator" and len(replaced) == 1
    assert not [c for c in fake.calls if c[0] == "begin"]


@pytest.mark.parametrize("kw, error", [
    ({"route": "pools"}, ValueError), ({"route": None}, ValueError),
    ({"devices": 0}, TypeError), ({"devices": [0.0]}, TypeError),
    ({"devices": [True]}, TypeError), ({"devices": [-1]}, ValueError),
    ({"devices": []}, ValueError)])
def test_bad_arguments_change_nothing(monkeypatch, kw, error):
    fake = FakePyTorch(monkeypatch)
    with pytest.raises(error):
        fake.use(Recording(), **kw)
    assert fake.calls == [] and ht.installed() is None


def test_a_resource_of_one_device_routes_that_device(monkeypatch):
    class OnDevice1(Recording):
        device = 1

    fake = FakePyTorch(monkeypatch, devices=4)
    with pytest.raises(ValueError, match="can serve only that device"):
        fake.use(OnDevice1(), devices=[0, 1])
    fake.use(OnDevice1())
    assert [c[1] for c in fake.calls if c[0] == "begin"] == [1]


def test_empty_cache_moves_the_route_to_fresh_pools(monkeypatch):
    fake = FakePyTorch(monkeypatch, devices=1)
    fake.use(Recording())
    first = [c for c in fake.calls if c[0] == "pool"][0]
    # the previous pool is let go (PyTorch empties its cache) while no device is routed:
    # PyTorch aborts when a MemPool dies during an allocation to a pool
    held = weakref.ref(torch_route_pools(first[1]), lambda _: fake.calls.append(("dropped",)))
    fake.calls.clear()
    monkeypatch.setitem(torch.cuda.empty_cache.__globals__, "is_initialized", lambda: True)
    torch.cuda.empty_cache()
    new = [c for c in fake.calls if c[0] == "pool"][0]
    assert fake.calls == [("end", 0, first[1]), ("release", 0, first[1]), ("dropped",), new,
                          ("begin", 0, new[1]), ("empty_cache",)]
    assert held() is None


def torch_route_pools(pool_id):
    alloc = ht.installed()
    return next(p for p in alloc._route.pools.values() if p.id == pool_id)


def test_capture_begin_steps_the_route_aside(monkeypatch):
    fake = FakePyTorch(monkeypatch, devices=1)
    fake.use(Recording())
    ours = [c for c in fake.calls if c[0] == "begin"][0][2]
    fake.calls.clear()
    graph = object()
    torch.cuda.graphs.CUDAGraph.capture_begin(graph, capture_error_mode="thread_local")
    made = fake.calls[0]
    assert made[0] == "pool"                            # the graph's own pool, over ours
    assert fake.calls[1:] == [("end", 0, ours), ("release", 0, ours), ("begin", 0, ours)]
    assert fake.graph_calls == [(graph, made[1], "thread_local")]
    fake.calls.clear()
    torch.cuda.graphs.CUDAGraph.capture_begin(graph, (0, 99))   # a pool given: kept
    assert fake.graph_calls[-1] == (graph, (0, 99), "global")
    assert [c[0] for c in fake.calls] == ["end", "release", "begin"]
    handle = torch.cuda.graph_pool_handle()
    assert tuple(handle) == fake.calls[-1][1] and fake.calls[-1][0] == "pool"
    assert torch.cuda.graphs.graph_pool_handle is torch.cuda.graph_pool_handle


def test_segments_asked_for_during_capture_come_from_our_own_stream(monkeypatch):
    fake = FakePyTorch(monkeypatch, devices=1)
    up = Recording()
    alloc = fake.use(up)
    c_alloc, c_free = ht.ALLOC_FN(alloc.alloc_address), ht.FREE_FN(alloc.free_address)
    fake.capturing = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ptr = c_alloc(4 << 20, 0, 77)
    side = alloc._route.side[0]
    assert ptr and up.streams[-1] == side.ref.get() != 77
    assert isinstance(side, hmr.Stream)
    fake.capturing = False
    other = c_alloc(1 << 20, 0, 77)
    assert up.streams[-1] == 77
    c_free(ptr, 4 << 20, 0, 77)
    c_free(other, 1 << 20, 0, 77)
    assert alloc.failures == 0 and alloc.unknown_frees == 0


def test_a_pool_begun_per_thread_comes_before_the_route(monkeypatch):
    """use_mem_pool and the graph trees of torch.compile(mode="reduce-overhead") begin their
    pool per thread: the route steps aside and comes back after, so theirs is found first."""
    fake = FakePyTorch(monkeypatch, devices=1)
    fake.use(Recording())
    ours = [c for c in fake.calls if c[0] == "begin"][0][2]
    fake.calls.clear()
    for begin in (torch._C._cuda_beginAllocateCurrentThreadToPool,
                  torch.cuda.memory._cuda_beginAllocateCurrentThreadToPool):
        begin(0, (0, 77))
        assert fake.calls == [("end", 0, ours), ("release", 0, ours),
                              ("thread_begin", 0, (0, 77)), ("begin", 0, ours)]
        fake.calls.clear()


def test_the_route_finds_which_begun_pool_pytorch_serves_from(monkeypatch):
    """Before it routes anything, the route begins a pool for every stream, then one for its
    thread, and asks which holds a tensor: PyTorch's releases differ."""
    for newest_first in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            fake = FakePyTorch(mp, devices=1, newest_first=newest_first)
            alloc = fake.use(Recording())
            assert alloc._route.newest_first is newest_first
            trial = fake.install_calls[1:9]
            older, newer = trial[0][1], trial[1][1]
            assert [c[0] for c in trial] == ["pool", "pool", "begin", "thread_begin", "end",
                                             "release", "end", "release"]
            assert trial[2][2] == trial[6][2] == older and trial[3][2] == trial[4][2] == newer
            assert fake.begun == [alloc._route.pools[0].id]   # only the route is left begun


def test_where_the_newest_pool_wins_the_route_stays_and_counts_theirs(monkeypatch):
    """PyTorch releases that serve from the pool begun last: a graph's or a per-thread pool
    wins without the route stepping aside; empty_cache keeps the route's pool while one is
    under way (a fresh route pool begun then would win over theirs)."""
    fake = FakePyTorch(monkeypatch, devices=1, newest_first=True)
    alloc = fake.use(Recording())
    ours = alloc._route.pools[0].id
    monkeypatch.setitem(torch.cuda.empty_cache.__globals__, "is_initialized", lambda: True)
    fake.calls.clear()
    torch._C._cuda_beginAllocateCurrentThreadToPool(0, (0, 77))
    assert fake.calls == [("thread_begin", 0, (0, 77))]           # no stepping aside
    assert fake.begun == [ours, (0, 77)]
    assert fake.served[torch.empty(1, device="cuda:0").data_ptr()] == (0, 77)
    fake.calls.clear()
    torch.cuda.empty_cache()
    assert fake.calls == [("empty_cache",)]                       # the route stays put
    torch._C._cuda_endAllocateToPool(0, (0, 77))
    assert alloc._route.others == {}
    fake.calls.clear()
    torch.cuda.empty_cache()                                      # nothing else: it moves
    assert [c[0] for c in fake.calls] == ["end", "release", "pool", "begin", "empty_cache"]
    ours = alloc._route.pools[0].id
    fake.calls.clear()
    graph = object()
    torch.cuda.graphs.CUDAGraph.capture_begin(graph, (0, 99))
    assert fake.calls == [] and fake.graph_calls == [(graph, (0, 99), "global")]
    assert alloc._route.others == {(0, (0, 99)): 1}
    torch.cuda.empty_cache()
    assert alloc._route.pools[0].id == ours                       # kept during the capture
    torch.cuda.graphs.CUDAGraph.capture_end(graph)
    assert alloc._route.others == {}


@pytest.mark.parametrize("hip, cuda, ours, wanted", [
    ("7.0.51831", None, "amd", None), (None, "13.0", "nvidia", None), (None, None, "emulated", None),
    ("7.0.51831", None, "nvidia", "HIPMR_PLATFORM=amd"),
    ("7.0.51831", None, "emulated", "HIPMR_PLATFORM=amd"),
    (None, "13.0", "amd", "HIPMR_PLATFORM=nvidia"),
    (None, "13.0", "emulated", "HIPMR_PLATFORM=nvidia")])
def test_pytorchs_build_and_our_platform_must_pair(monkeypatch, hip, cuda, ours, wanted):
    """A ROCm build of PyTorch takes HIP streams and memory (the amd platform), a CUDA build
    CUDA's (the nvidia platform): any other pairing is refused before PyTorch gets anything."""
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.version, "cuda", cuda, raising=False)
    monkeypatch.setattr(ht, "_platform", lambda: ours)
    monkeypatch.setattr(torch._C, "_cuda_customAllocator", lambda a, f: "native", raising=False)
    problem = ht.platform_problem()
    alloc = ht.allocator(Recording())
    if wanted is None:
        assert problem is None and alloc.allocator() == "native"
        return
    build = "ROCm (HIP 7.0.51831)" if hip else "CUDA 13.0"
    assert f"built for {build}" in problem and f"the {ours!r} platform" in problem
    assert wanted in problem
    for call in (alloc.allocator, ht.use, lambda: ht.mem_pool(alloc)):
        with pytest.raises(RuntimeError, match=wanted):
            call()
    assert ht.installed() is None


def test_a_rocm_build_takes_the_same_route(monkeypatch):
    """Where ``torch.version.hip`` is set (PyTorch's ROCm build, with the same torch.cuda
    names), the pool route is checked, installed and undone exactly as on a CUDA build."""
    monkeypatch.setattr(torch.version, "hip", "7.0.51831", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    monkeypatch.setattr(ht, "_platform", lambda: "amd")
    monkeypatch.setenv("PYTORCH_HIP_ALLOC_CONF", "max_split_size_mb:128")
    fake = FakePyTorch(monkeypatch, devices=2)
    monkeypatch.setattr(torch._C, "_cuda_getAllocatorBackend", lambda: "native", raising=False)
    assert ht.platform_problem() is None and torch_route.route_problem() is None
    alloc = fake.use(Recording())
    assert alloc.route == "pool"
    assert [c[1] for c in fake.calls if c[0] == "begin"] == [0, 1]


@pytest.mark.parametrize("backend", ["cudaMallocAsync", "hipMallocAsync"])
def test_pytorchs_other_backend_is_refused_by_every_route(monkeypatch, backend):
    """Under PyTorch's other backend (``backend:cudaMallocAsync``) neither route is taken:
    RuntimeError naming the backend, and nothing installed."""
    fake = FakePyTorch(monkeypatch)
    monkeypatch.setattr(torch._C, "_cuda_getAllocatorBackend", lambda: backend, raising=False)
    assert f"backend is {backend!r}" in torch_route.route_problem()
    for route in ("auto", "pool", "allocator"):
        with pytest.raises(RuntimeError, match=f"backend is {backend!r}.*remove the 'backend:'"):
            fake.use(Recording(), route=route)
    assert ht.installed() is None


@pytest.mark.parametrize("backend, env", [("native", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
                                          ("native", {"PYTORCH_NO_HIP_MEMORY_CACHING": "1"})])
def test_without_pytorchs_caching_allocator_auto_takes_the_allocator_route(monkeypatch, backend,
                                                                           env):
    """PyTorch's caching turned off leaves no caching allocator to keep on top: the route
    says so, ``route="pool"`` raises and ``"auto"`` replaces PyTorch's allocator, warning."""
    fake = FakePyTorch(monkeypatch)
    monkeypatch.setattr(torch._C, "_cuda_getAllocatorBackend", lambda: backend, raising=False)
    for name in torch_route._NO_CACHING:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    problem = torch_route.route_problem()
    assert f"{next(iter(env))} is set" in problem
    with pytest.raises(RuntimeError, match="pool route is not available"):
        fake.use(Recording(), route="pool")
    replaced = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda.memory, "change_current_allocator", replaced.append)
    with pytest.warns(RuntimeWarning, match="pool route is not available"):
        alloc = fake.use(Recording())
    assert alloc.route == "allocator" and len(replaced) == 1
    for name in torch_route._NO_CACHING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getAllocatorBackend", lambda: "native")
    assert torch_route.route_problem() is None
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "0")   # any value: releases differ
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING is set" in torch_route.route_problem()

"""The PyTorch allocator (``hipmr_ctypes.interop.torch``) with the real PyTorch, on any build:
the callbacks' bodies are called through their C function pointers, as PyTorch calls them.

Needs PyTorch: skipped without it, except under HIPMR_REQUIRE_TORCH=1 (set by .ci/run where it
installs the CPU build), where a missing PyTorch fails the run.  The GPU
tests, with PyTorch's CUDA or ROCm build, are in tests/interop/test_interop_torch_gpu.py."""
import ctypes
import gc
import os
import subprocess
import sys
import threading
import warnings

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
from support import REPO, TESTS, AddressSpaceResource  # noqa: E402

HAS_CUDA_API = hasattr(torch._C, "_cuda_customAllocator")


class StreamRecording(AddressSpaceResource):
    """An async upstream that remembers the stream of every call."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.log = []

    def allocate_async(self, bytes, alignment, stream):
        ptr = super().allocate_async(bytes, alignment, stream)
        self.log.append(("allocate", ptr, bytes, alignment, stream))
        return ptr

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self.log.append(("free", ptr, bytes, alignment, stream))
        super().deallocate_async(ptr, bytes, alignment, stream)


def _c(alloc):
    """The two C functions of ``alloc``, as PyTorch holds them (addresses), made callable."""
    return ht.ALLOC_FN(alloc.alloc_address), ht.FREE_FN(alloc.free_address)


def test_signatures_are_pytorchs():
    # void* alloc(size_t, int, cudaStream_t); void free(void*, size_t, int, cudaStream_t)
    assert ht.ALLOC_FN._restype_ is ctypes.c_void_p
    assert ht.ALLOC_FN._argtypes_ == (ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
    assert ht.FREE_FN._restype_ is None
    assert ht.FREE_FN._argtypes_ == (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_void_p)


@pytest.mark.parametrize("bad", [object(), 3, "pool", hmr.HostMemoryResource(),
                                 AddressSpaceResource(properties=())])
def test_bad_resources_are_refused_before_anything(bad):
    before = ht.installed()
    for make in (ht.allocator, ht.use, ht.mem_pool, ht.Allocator):
        with pytest.raises(TypeError):
            make(bad)
    assert ht.installed() is before


def test_the_torch_object_needs_a_cuda_or_rocm_build():
    alloc = ht.allocator(StreamRecording())
    assert alloc.alloc_address and alloc.free_address
    assert alloc.alloc_address != alloc.free_address
    if HAS_CUDA_API:
        assert alloc.allocator() is alloc.allocator()
        return
    with pytest.raises(RuntimeError, match="without CUDA or ROCm"):
        alloc.allocator()
    with pytest.raises(RuntimeError, match="without CUDA or ROCm"):
        ht.use()
    assert ht.installed() is None
    with pytest.raises(RuntimeError, match="without CUDA or ROCm"):
        ht.mem_pool(alloc)


def test_callbacks_allocate_and_free_on_pytorchs_stream():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    ptr = c_alloc(1000, 0, 7)
    assert ptr and up.live[ptr] == (1000, hmr.DEFAULT_ALIGNMENT)
    assert alloc.outstanding() == (1, 1000)
    other = c_alloc(64, 0, None)  # NULL: the null stream
    assert up.log == [("allocate", ptr, 1000, 256, 7), ("allocate", other, 64, 256, 0)]
    c_free(ptr, 1000, 0, 7)
    c_free(other, 64, 0, None)
    assert up.log[2:] == [("free", ptr, 1000, 256, 7), ("free", other, 64, 256, 0)]
    assert up.live == {} and alloc.outstanding() == (0, 0)
    assert alloc.failures == 0 and alloc.unknown_frees == 0


def test_free_uses_the_size_and_stream_of_the_allocation():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    ptr = c_alloc(4096, 0, 5)
    c_free(ptr, 1, 0, 9)  # whatever PyTorch says, the allocation's own size and stream
    assert up.log[-1] == ("free", ptr, 4096, 256, 5)


def test_zero_bytes_is_null_and_asks_nothing():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    assert c_alloc(0, 0, 3) is None
    c_free(None, 0, 0, 3)
    assert up.log == [] and alloc.failures == 0 and alloc.unknown_frees == 0


def test_a_failed_allocation_is_null_and_counted():
    up = StreamRecording(capacity=1 << 20)
    alloc = ht.allocator(up)
    c_alloc, _ = _c(alloc)
    with pytest.warns(RuntimeWarning, match=r"allocating 2097152 bytes on device 0 failed"):
        assert c_alloc(2 << 20, 0, 0) is None
    assert alloc.failures == 1
    assert isinstance(alloc.last_error, hmr.OutOfMemoryError)
    assert alloc.outstanding() == (0, 0) and up.live == {}


def test_nothing_leaves_a_callback_even_with_warnings_as_errors():
    class Broken(StreamRecording):
        def allocate_async(self, bytes, alignment, stream):
            raise KeyboardInterrupt  # even this stays inside

        def deallocate_async(self, ptr, bytes, alignment, stream):
            raise ZeroDivisionError

    up = Broken()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c_alloc(256, 0, 0) is None
        assert isinstance(alloc.last_error, KeyboardInterrupt)
        alloc._live[1 << 40] = (256, 0, up.deallocate_async)  # one it holds, whose free fails
        c_free(1 << 40, 256, 0, 0)
    assert isinstance(alloc.last_error, ZeroDivisionError)
    assert alloc.failures == 1


def test_unknown_and_double_frees_are_reported_not_passed_on():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    ptr = c_alloc(512, 0, 0)
    c_free(ptr, 512, 0, 0)
    calls = list(up.log)
    with pytest.warns(RuntimeWarning, match="does not hold"):
        c_free(ptr, 512, 0, 0)                # twice
    with pytest.warns(RuntimeWarning, match="does not hold"):
        c_free(0xDEAD000, 512, 0, 0)          # never allocated here
    assert up.log == calls and alloc.unknown_frees == 2


def test_a_resource_handing_out_a_live_pointer_is_refused():
    class Same(StreamRecording):
        """A broken resource: the same address every time."""

        def allocate_async(self, bytes, alignment, stream):
            self.log.append(("allocate", 1 << 36, bytes, alignment, stream))
            return 1 << 36

        def deallocate_async(self, ptr, bytes, alignment, stream):
            self.log.append(("free", ptr, bytes, alignment, stream))

    up = Same()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    assert c_alloc(256, 0, 0) == 1 << 36
    with pytest.warns(RuntimeWarning, match="holds already"):
        assert c_alloc(512, 0, 0) is None     # given back to the resource, not to PyTorch
    assert up.log[-1] == ("allocate", 1 << 36, 512, 256, 0)  # never given back: it is live
    assert alloc.outstanding() == (1, 256) and alloc.failures == 1
    c_free(1 << 36, 256, 0, 0)
    assert alloc.outstanding() == (0, 0)


class Returning(StreamRecording):
    """A broken resource: allocates a real address, then returns ``shape(address)``."""

    def __init__(self, shape, **kw):
        super().__init__(**kw)
        self.shape = shape

    def allocate_async(self, bytes, alignment, stream):
        return self.shape(super().allocate_async(bytes, alignment, stream))


@pytest.mark.reliability("misbehaving_cases")
@pytest.mark.parametrize("shape, given_back, error", [
    (lambda p: __import__("numpy").uint64(p), True, TypeError),   # an integer type: as that int
    (lambda p: __import__("numpy").int64(p), True, TypeError),
    (float, False, TypeError),
    (lambda p: p + 0.0 == p, False, TypeError),                    # a bool
    (str, False, TypeError),
    (lambda p: None, False, TypeError),
    (lambda p: 1 << 64, False, ValueError),
    (lambda p: (1 << 64) + p, False, ValueError),
    (lambda p: -4096, False, ValueError),
    (lambda p: -p, False, ValueError),
    (lambda p: 0, False, ValueError),
    (lambda p: p + 8, True, ValueError),                           # not aligned to 256
    (lambda p: (1 << 64) - 256, True, ValueError),                 # runs past the end
], ids=["uint64", "int64", "float", "bool", "str", "None", "2**64", "above", "-4096",
        "negative", "null", "unaligned", "wraps"])
def test_what_the_resource_returns_is_checked(shape, given_back, error, recwarn):
    """A result that is not an address PyTorch may be given is counted as a failure, given
    back where it is an address, and never reaches PyTorch (nor ctypes' conversion: no
    "Exception ignored")."""
    up = Returning(shape)
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # a report never leaves the callback
        assert c_alloc(1000, 0, 3) is None
    assert alloc.failures == 1 and isinstance(alloc.last_error, error), alloc.last_error
    assert alloc.outstanding() == (0, 0)
    made = [e for e in up.log if e[0] == "allocate"]
    frees = [e for e in up.log if e[0] == "free"]
    assert len(made) == 1
    if given_back:
        assert len(frees) == 1 and frees[0][2:] == (1000, 256, 3), up.log
        if error is TypeError:  # the real address, as an int, given back exactly
            assert up.live == {}
    else:
        assert frees == [], up.log
    # the callback still works afterwards, and nothing was recorded for the bad result
    up.shape = int
    ptr = c_alloc(512, 0, 3)
    assert type(ptr) is int and ptr % 256 == 0
    c_free(ptr, 512, 0, 3)
    assert alloc.outstanding() == (0, 0)


@pytest.mark.reliability("misbehaving_cases")
def test_bad_results_never_print_exception_ignored(tmp_path):
    """Through PyTorch's own C entry (the C function pointer), in a fresh interpreter: what a
    broken resource returns never becomes an exception that leaves a callback."""
    script = tmp_path / "bad.py"
    script.write_text(
        "import warnings\n"
        "import numpy as np\n"
        "import hipmr_ctypes as hmr\n"
        "from hipmr_ctypes.interop import torch as ht\n"
        "warnings.simplefilter('ignore', RuntimeWarning)\n"
        "results = [np.uint64(1 << 40), 1 << 64, 4096.0, -4096, np.int32(-1)]\n"
        "class Up:\n"
        "    properties = (hmr.device_accessible,)\n"
        "    def allocate(self, n, a=256): raise AssertionError\n"
        "    def deallocate(self, p, n, a=256): pass\n"
        "    def allocate_async(self, n, a, s): return results.pop(0)\n"
        "    def deallocate_async(self, p, n, a, s): print('BACK', hex(p))\n"
        "alloc = ht.allocator(Up())\n"
        "c_alloc = ht.ALLOC_FN(alloc.alloc_address)\n"
        "print('GOT', [c_alloc(256, 0, None) for _ in range(5)])\n"
        "print('FAILURES', alloc.failures)\n")
    env = dict(os.environ, HIPMR_PLATFORM="emulated",
               PYTHONPATH=str(REPO) + os.pathsep + str(TESTS))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, \
        done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["BACK 0x10000000000", "GOT [None, None, None, None, None]",
                     "FAILURES 5"], done.stdout


def test_a_resource_of_another_device_is_refused():
    class OnDevice1(StreamRecording):
        device = 1

    up = OnDevice1()
    alloc = ht.allocator(up)
    c_alloc, _ = _c(alloc)
    with pytest.warns(RuntimeWarning, match="on device 1, PyTorch asked for device 0"):
        assert c_alloc(256, 0, 0) is None
    assert up.log == []


def test_default_is_the_per_device_resource_looked_up_each_time():
    first, second = StreamRecording(), StreamRecording(base=1 << 40)
    previous = hmr.get_current_device_resource()
    alloc = ht.allocator()
    assert alloc.resource is None
    c_alloc, c_free = _c(alloc)
    try:
        hmr.set_current_device_resource(first)
        a = c_alloc(300, 0, 4)
        hmr.set_current_device_resource(second)
        b = c_alloc(300, 0, 4)
        c_free(a, 300, 0, 4)  # freed through the resource it came from
        c_free(b, 300, 0, 4)
    finally:
        hmr.set_current_device_resource(previous)
    assert [e[0] for e in first.log] == ["allocate", "free"] and first.live == {}
    assert [e[0] for e in second.log] == ["allocate", "free"] and second.live == {}


def test_statistics_see_exactly_what_pytorch_was_given():
    stats = hmr.StatisticsResource(hmr.PoolResource(hmr.AsyncMemoryResource(), "1MiB"))
    alloc = ht.allocator(stats)
    c_alloc, c_free = _c(alloc)
    sizes = [1, 255, 256, 4097, 1 << 16, 3 << 20]
    ptrs = [c_alloc(n, 0, 0) for n in sizes]
    assert all(ptrs) and len(set(ptrs)) == len(sizes)
    now = stats.statistics
    assert (now.current_bytes, now.current_count) == (sum(sizes), len(sizes))
    assert alloc.outstanding() == (len(sizes), sum(sizes))
    for ptr, n in zip(ptrs, sizes):
        c_free(ptr, n, 0, 0)
    after = stats.statistics
    assert (after.current_bytes, after.current_count) == (0, 0)
    assert (after.peak_bytes, after.total_count) == (sum(sizes), len(sizes))


def test_threads_share_one_allocator():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    errors = []

    def work(seed):
        try:
            for i in range(300):
                n = 256 * (1 + (seed * 7 + i) % 13)
                ptr = c_alloc(n, 0, seed)
                assert ptr
                c_free(ptr, n, 0, seed)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert up.live == {} and alloc.outstanding() == (0, 0)
    assert alloc.failures == 0 and alloc.unknown_frees == 0


def test_a_free_run_by_the_collector_inside_an_allocation_does_not_deadlock():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    held = c_alloc(256, 0, 0)

    class Cycle:
        def __del__(self):
            c_free(held, 256, 0, 0)  # the collector frees during the next allocation

    class Slow(StreamRecording):
        def allocate_async(self, bytes, alignment, stream):
            gc.collect()
            return super().allocate_async(bytes, alignment, stream)

    c = Cycle()
    c.me = c
    del c
    slow = ht.allocator(Slow())
    s_alloc, s_free = _c(slow)
    ptr = s_alloc(256, 0, 0)
    assert ptr and up.live == {}
    s_free(ptr, 256, 0, 0)


def test_frees_do_nothing_once_the_interpreter_exits(tmp_path):
    script = tmp_path / "exit.py"
    script.write_text(
        "import atexit\n"
        "atexit.register(lambda: c_free(ptr, 256, 0, None))  # runs after the package's hook\n"
        "import hipmr_ctypes as hmr\n"
        "from hipmr_ctypes.interop import torch as ht\n"
        "class Up:\n"
        "    properties = (hmr.device_accessible,)\n"
        "    def allocate(self, n, a=256): return 1 << 32\n"
        "    def deallocate(self, p, n, a=256): print('FREED', flush=True)\n"
        "    def allocate_async(self, n, a, s): return 1 << 32\n"
        "    def deallocate_async(self, p, n, a, s): print('FREED', flush=True)\n"
        "alloc = ht.allocator(Up())\n"
        "c_alloc, c_free = ht.ALLOC_FN(alloc.alloc_address), ht.FREE_FN(alloc.free_address)\n"
        "ptr = c_alloc(256, 0, None)\n"
        "class Late:\n"
        "    def __del__(self): c_free(ptr, 256, 0, None)\n"
        "late = Late()\n"
        "print('OK', flush=True)\n")
    env = dict(os.environ, HIPMR_PLATFORM="emulated",
               PYTHONPATH=str(REPO) + os.pathsep + str(TESTS))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OK"], done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_callbacks_outlive_the_allocator_object():
    up = StreamRecording()
    alloc = ht.allocator(up)
    c_alloc, c_free = _c(alloc)
    del alloc
    gc.collect()
    ptr = c_alloc(256, 0, 0)  # PyTorch still holds the addresses: they must stay valid
    c_free(ptr, 256, 0, 0)
    assert up.live == {} and len(up.log) == 2


def test_use_refuses_a_second_install(monkeypatch):
    """``use(route='allocator')`` with a stand-in for ``change_current_allocator`` (which
    needs a CUDA build):
    once only, not after PyTorch initialized CUDA, and PyTorch's own refusal explained."""
    calls = []
    monkeypatch.setattr(ht.Allocator, "allocator", lambda self: "native")
    monkeypatch.setattr(ht, "_installed", [])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="already initialized CUDA"):
        ht.use(StreamRecording(), route="allocator")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def refuse(a):
        raise RuntimeError("Can't swap an already initialized allocator")

    monkeypatch.setattr(torch.cuda.memory, "change_current_allocator", refuse)
    with pytest.raises(RuntimeError, match="refused to replace") as info:
        ht.use(StreamRecording(), route="allocator")
    assert "already initialized allocator" in str(info.value.__cause__)
    assert ht.installed() is None
    monkeypatch.setattr(torch.cuda.memory, "change_current_allocator", calls.append)
    made = ht.use(StreamRecording(), route="allocator")
    assert [c.allocator() for c in calls] == ["native"] and ht.installed() is made
    assert made.route == "allocator"
    with pytest.raises(RuntimeError, match="already called"):
        ht.use()
    assert len(calls) == 1 and ht.installed() is made
    with pytest.raises(RuntimeError, match="already routes"):
        ht.mem_pool(StreamRecording())


def test_module_is_typed_and_documented():
    for name in ht.__all__:
        assert getattr(ht, name).__doc__, name
    assert "size_t" in ht.ALLOC_FN.__doc__ and "size_t" in ht.FREE_FN.__doc__
    for name in ("allocator", "outstanding", "failures", "unknown_frees"):
        assert getattr(ht.Allocator, name).__doc__, name


def test_bench_and_demo_scripts_say_what_they_need():
    # with a GPU, the platform of this run (PyTorch is given real device memory)
    env = dict(os.environ) if torch.cuda.is_available() else dict(os.environ,
                                                                   HIPMR_PLATFORM="emulated")
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_torch.py"),
                           "--pairs", "5", "--repeats", "1", "--rounds", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    if torch.cuda.is_available():
        assert done.returncode == 0, done.stderr
        assert "ours/pytorch" in done.stdout
    else:
        assert done.returncode == 2 and "sees no CUDA device" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "frameworks_demo.py"),
                           "--help"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "outdir" in done.stdout, done.stderr

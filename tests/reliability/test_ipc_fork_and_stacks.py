"""Forged or damaged IPC descriptors, the same descriptor imported twice, a process forked
after the runtime started, Buffers whose Stream was closed, resource stacks deeper than any
fixed limit (and cycles), and the peer suites' findings (pickling an AsyncMemoryResource,
cloudpickle of a descriptor, DLPack of memory of a resource that declares no properties,
``max_version``), plus the stream verbs shared by ``Stream`` and ``stream_ref``.

Most cases run on the emulated platform, whose IPC crosses real processes (shared memory);
those marked ``gpu`` run on a real GPU (``HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1``)."""
from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import pickle
import re
import struct
import subprocess
import sys
import textwrap
import threading
import zlib

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._memory_query import memory_device
from hipmr_ctypes.ipc import IpcBufferDescriptor

from support import REPO, held_by_another_thread, no_crash, no_native_call, process_runtime

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("ipc_fork_stream_cases")

TIMEOUT = 120
TiB = 1 << 40


def _pattern(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


@pytest.fixture
def imported(emulator):
    mr = hmr.AsyncMemoryResource(0, enable_ipc=True)
    buf = hmr.Buffer.from_host(_pattern(4096, 3), resource=mr)
    handle = mr.pool.export_handle()
    res = hmr.AsyncMemoryResource.from_ipc(handle)
    yield mr, buf, res
    handle.close()
    res.close()
    buf.close()
    mr.close()


def _forge(d, **fields):
    """``d`` with some fields replaced and a valid checksum (anyone can compute it)."""
    names = ["magic", "kind", "device", "size", "offset", "pool_id", "data"]
    body_format = struct.Struct("<8sBxxxiQQ16s64s")
    values = dict(zip(names, body_format.unpack(bytes(d)[:body_format.size])))
    values.update(fields)
    body = body_format.pack(*(values[n] for n in names))
    return body + struct.pack("<I", zlib.crc32(body))


# ---- 3. forged or damaged descriptors ---------------------------------------------------------
def test_a_forged_size_is_refused_and_leaves_nothing_mapped(imported, emulator):
    _, buf, res = imported
    d = buf.export_ipc()
    before = emulator.live_allocations()
    for size in (TiB, d.size + 4096, (1 << 64) - 1):
        forged = IpcBufferDescriptor("pool", 0, size, 0, d.pool_id, d.data)
        with pytest.raises(ValueError, match="bytes of an allocation of"):
            hmr.Buffer.from_ipc(forged, res)
        assert not res.pool._ipc.mappings and emulator.live_allocations() == before
    with hmr.Buffer.from_ipc(d, res) as good:          # the real one still maps
        assert good.tobytes() == buf.tobytes()
    smaller = IpcBufferDescriptor("pool", 0, 100, 0, d.pool_id, d.data)
    with hmr.Buffer.from_ipc(smaller, res) as part:    # a part of it is within the truth
        assert part.size == 100 and part.tobytes() == buf.tobytes()[:100]
    assert emulator.live_allocations() == before


def test_size_zero_is_refused_before_anything_is_mapped(imported, emulator):
    _, buf, res = imported
    d = buf.export_ipc()
    with pytest.raises(ValueError, match="size=0"):
        IpcBufferDescriptor("pool", 0, 0, 0, d.pool_id, d.data)
    with pytest.raises(ValueError, match="size=0"):
        IpcBufferDescriptor.from_bytes(_forge(d, size=0))
    with hmr.Buffer.from_ipc(d, res) as good:          # and the real buffer still maps
        assert good.tobytes() == buf.tobytes()
    assert not res.pool._ipc.mappings


@pytest.mark.parametrize("fields", [
    {"device": -1}, {"device": 1 << 31}, {"size": 1 << 64}, {"offset": -1},
    {"offset": 1 << 64}, {"size": 1 << 63, "offset": 1 << 63}, {"device": True},
    {"size": 1.5}])
def test_out_of_range_fields_are_value_errors_not_struct_errors(fields):
    args = dict(kind="legacy", device=0, size=256, offset=0, pool_id=bytes(16),
                data=bytes(64))
    args.update(fields)
    with pytest.raises(ValueError):
        IpcBufferDescriptor(**args)


@pytest.mark.parametrize("fields", [{"device": -1}, {"device": -(1 << 31)}, {"size": 0},
                                    {"offset": 256, "kind": 1},
                                    {"size": (1 << 64) - 1, "offset": 1}])
def test_forged_bytes_with_a_valid_checksum_are_value_errors(fields):
    d = IpcBufferDescriptor("legacy", 0, 256, 0, bytes(16), bytes(64))
    with pytest.raises(ValueError):
        IpcBufferDescriptor.from_bytes(_forge(d, **fields))


def test_a_descriptor_of_another_device_than_its_pool_is_refused(imported, emulator):
    _, buf, res = imported
    d = buf.export_ipc()
    forged = IpcBufferDescriptor("pool", 1, d.size, 0, d.pool_id, d.data)
    with no_native_call(emulator):
        with pytest.raises(ValueError, match="device 1.*device 0"):
            hmr.Buffer.from_ipc(forged, res)


def test_a_legacy_descriptor_of_a_device_that_does_not_exist_is_refused(emulator):
    for device in (5, (1 << 31) - 1):
        forged = IpcBufferDescriptor("legacy", device, 256, 0, bytes(16), bytes(64))
        emulator.inject_failure(code=999, count=1, calls="hipIpcOpenMemHandle")
        with pytest.raises(ValueError, match="forged"):
            hmr.Buffer.from_ipc(forged)
        assert emulator.pending_faults() == 1     # nothing was opened
        emulator.clear_faults()


def test_the_same_descriptor_imported_twice_shares_one_mapping(imported, emulator):
    _, buf, res = imported
    d = buf.export_ipc()
    before = emulator.live_allocations().count
    first = hmr.Buffer.from_ipc(d, res)
    second = hmr.Buffer.from_ipc(pickle.loads(pickle.dumps(d)), res)
    assert first.ptr == second.ptr and emulator.live_allocations().count == before + 1
    # a copy asking for more than the allocation is refused; the mapping stays for the others
    with pytest.raises(ValueError, match="bytes of an allocation"):
        hmr.Buffer.from_ipc(IpcBufferDescriptor("pool", 0, TiB, 0, d.pool_id, d.data), res)
    second.close()
    first.memset(0x11)
    assert buf.tobytes() == b"\x11" * 4096
    del first                     # the last Buffer on it, collected: unmapped
    gc.collect()
    assert not res.pool._ipc.mappings and emulator.live_allocations().count == before


def test_threads_importing_one_descriptor_share_it(imported, emulator):
    _, buf, res = imported
    d = buf.export_ipc()
    errors = []
    before = emulator.live_allocations().count

    def work():
        try:
            for _ in range(100):
                b = hmr.Buffer.from_ipc(d, res)
                assert b.tobytes()[:8] == buf.tobytes()[:8]
                b.close()
        except hmr.HipError:
            pass      # another thread's last close was unmapping it just then: a clean error
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not res.pool._ipc.mappings and emulator.live_allocations().count == before


def test_the_emulated_address_range(emulator):
    rt = _hip.get_runtime()
    mr = hmr.DeviceMemoryResource()
    p = mr.allocate(1000)
    base, size = ctypes.c_void_p(), ctypes.c_size_t()
    rt.check(rt.fn.hipMemGetAddressRange(base, size, p + 999))
    assert (base.value, size.value) == (p, 1000)
    assert rt.fn.hipMemGetAddressRange(base, size, p + 1000) == 1
    rt.clear_last_error()
    mr.deallocate(p, 1000)


def test_descriptors_pickle_with_cloudpickle(imported):
    try:
        import cloudpickle
    except ImportError:
        if os.environ.get("HIPMR_REQUIRE_TOOLS") == "1":
            pytest.fail("cloudpickle is required (HIPMR_REQUIRE_TOOLS=1) but missing")
        pytest.skip("cloudpickle is not installed (pip install cloudpickle)")
    _, buf, res = imported
    d = buf.export_ipc()
    back = pickle.loads(cloudpickle.dumps(d))
    assert back == d and type(back) is IpcBufferDescriptor
    with hmr.Buffer.from_ipc(back, res) as mapped:
        assert mapped.tobytes() == buf.tobytes()


# ---- 4. fork ----------------------------------------------------------------------------------
def _child_allocates(mr, buf, out):
    """In a forked child: allocating from the inherited IPC pool, anything new, and dropping
    the inherited buffer."""
    seen = []
    for attempt in (lambda: hmr.Buffer(4096, resource=mr).memset(0xEE),
                    lambda: hmr.Buffer(16),
                    lambda: mr.allocate(256),
                    lambda: hmr.Stream()):
        try:
            attempt()
            seen.append("allowed")
        except hmr.HipError as exc:
            seen.append("refused" if "forked" in str(exc) and "spawn" in str(exc) else
                        repr(exc))
    del buf
    gc.collect()
    out.put(seen)


def _fork_context():
    if _hip.get_runtime().platform != "emulated":
        pytest.skip("fork after a GPU runtime started is unsafe; emulated only")
    return multiprocessing.get_context("fork")


def test_a_forked_child_cannot_take_the_parents_live_blocks(emulator):
    ctx = _fork_context()
    mr = hmr.AsyncMemoryResource(enable_ipc=True)
    buf = hmr.Buffer.from_host(_pattern(4096, 9), resource=mr)
    freed = hmr.Buffer(4096, resource=mr)
    freed.close()                     # a block the child's copy of the pool sees as free
    out = ctx.Queue()
    proc = ctx.Process(target=_child_allocates, args=(mr, buf, out))
    proc.start()
    seen = out.get(timeout=TIMEOUT)
    proc.join(TIMEOUT)
    assert proc.exitcode == 0
    assert seen == ["refused"] * 4
    assert buf.tobytes() == _pattern(4096, 9)   # nothing of the parent's was written or freed
    with hmr.Buffer(4096, resource=mr) as again:
        again.memset(1)
    assert buf.tobytes() == _pattern(4096, 9)


def _child_after_locked_fork(pool, out):
    """The pool's and the emulator's locks may be held by a parent thread: nothing waits."""
    seen = []
    for attempt in (lambda: hmr.Buffer(16), lambda: hmr.get_current_device_resource(),
                    lambda: pool.deallocate(pool.allocate(256), 256)):
        try:
            attempt()
            seen.append("allowed")
        except hmr.HipError as exc:
            seen.append("refused" if "forked" in str(exc) else repr(exc))
    out.put(seen)


@pytest.mark.parametrize("which", ["emulator", "pool"])
def test_a_fork_while_another_thread_holds_a_package_lock_does_not_hang_the_child(which):
    ctx = _fork_context()
    rt = _hip.get_runtime()
    pool = hmr.PoolResource(hmr.DeviceMemoryResource(), initial_pool_size=1 << 16)
    lock = rt.emulator._lock if which == "emulator" else pool._arena.lock
    with held_by_another_thread(lock, TIMEOUT):
        out = ctx.Queue()
        proc = ctx.Process(target=_child_after_locked_fork, args=(pool, out))
        proc.start()
        seen = out.get(timeout=TIMEOUT)
        proc.join(TIMEOUT)
    # the pool's own cached block may be handed out (no runtime call): the point is that
    # the child got that far instead of waiting for a lock of a thread it does not have
    assert proc.exitcode == 0 and seen[:2] == ["refused", "refused"] and len(seen) == 3


def test_locks_held_by_parent_threads_are_free_in_a_forked_child():
    from hipmr_ctypes._locks import DeferringLock
    lock = DeferringLock()
    with held_by_another_thread(lock, TIMEOUT):
        pid = os.fork()
        if pid == 0:   # the child: the lock is free, usable and not owned
            code = 0 if lock.owner is None and lock._lock.acquire(False) else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_child_forked_before_the_first_use_is_an_ordinary_process(tmp_path):
    script = tmp_path / "fork_first.py"
    script.write_text(textwrap.dedent("""
        import os
        import hipmr_ctypes as hmr
        pid = os.fork()          # imported, never used: the child may use the package
        if pid == 0:
            with hmr.Buffer.from_host(b"child") as buf:
                os._exit(0 if buf.tobytes() == b"child" else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        hmr.Buffer(16).close()
        pid = os.fork()          # used now: the child is refused
        if pid == 0:
            try:
                hmr.Buffer(16)
            except hmr.HipError as exc:
                os._exit(0 if "spawn" in str(exc) else 2)
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
    """))
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    no_crash(done)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ---- 5. a Buffer whose Stream was closed --------------------------------------------------------
PATHS = {
    "tobytes": lambda b: b.tobytes(),
    "bytes": lambda b: bytes(b),
    "copy_to_host": lambda b: b.copy_to_host(),
    "copy_from_host": lambda b: b.copy_from_host(b"x" * 8),
    "copy_from_host_async": lambda b: b.copy_from_host(b"x" * 8, stream=0),
    "memset": lambda b: b.memset(1),
    "memset_async": lambda b: b.memset(1, stream=0),
    "resize_within": lambda b: b.resize(8),
    "resize_beyond": lambda b: b.resize(1 << 20),
    "reserve": lambda b: b.reserve(1 << 20),
    "release": lambda b: b.release(),
    "resize_onto_another_stream": lambda b: b.resize(8, stream=0),
    "export_ipc": lambda b: b.export_ipc(),
    "pickle": lambda b: pickle.dumps(b),
    "copy": lambda b: b.copy(),
    "copy_from_device_dst": lambda b: b.copy_from_device(hmr.Buffer(8)),
    "copy_from_device_src": lambda b: hmr.Buffer(256).copy_from_device(b),
    "dlpack": lambda b: b.__dlpack__(),
    "cuda_array_interface": lambda b: b.__cuda_array_interface__,
    "prefetch": lambda b: b.prefetch(),
}


@pytest.mark.parametrize("resource", ["device", "ipc_pool"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_closed_stream_is_refused_first_by_every_path(emulator, path, resource):
    mr = (hmr.DeviceMemoryResource() if resource == "device"
          else hmr.AsyncMemoryResource(enable_ipc=True))
    stream = hmr.Stream()
    buf = hmr.Buffer(256, resource=mr, stream=stream)
    buf.memset(7)
    stream.close()
    calls_before = len(emulator.destroyed_stream_calls)
    with pytest.raises(ValueError, match="stream .* was closed"):
        PATHS[path](buf)
    assert len(emulator.destroyed_stream_calls) == calls_before   # the handle never reached it
    buf.close()                    # freeing still works (the device is synchronized first)
    assert buf.closed


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["tobytes", "copy_from_host", "memset", "resize_beyond",
                                  "export_ipc", "pickle"])
def test_a_closed_stream_is_refused_on_a_gpu(gpu_runtime, path):
    stream = hmr.Stream()
    buf = hmr.Buffer(256, resource=hmr.DeviceMemoryResource(), stream=stream)
    stream.close()
    with pytest.raises(ValueError, match="was closed"):
        PATHS[path](buf)
    buf.close()


# ---- 8. deep stacks and cycles -------------------------------------------------------------------
@pytest.fixture
def two_devices(emulator):
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2",
                                               "HIPMR_EMULATED_MEMORY": "64MiB"})
    with process_runtime(rt):
        yield rt


@pytest.mark.parametrize("depth", [0, 63, 64, 65, 200])
def test_a_deep_stack_reports_its_device(two_devices, depth):
    stack = hmr.DeviceMemoryResource(1)
    for _ in range(depth):
        stack = hmr.StatisticsResource(stack)
    buf = hmr.Buffer(256, resource=stack)
    assert buf.device == 1 and memory_device(stack) == 1
    buf.close()


@pytest.mark.parametrize("depth", [63, 64, 65, 200])
def test_a_deep_stack_is_exported(emulator, depth):
    stack = hmr.AsyncMemoryResource(enable_ipc=True)
    for i in range(depth):
        stack = hmr.TrackingResource(stack) if i % 2 else hmr.StatisticsResource(stack)
    buf = hmr.Buffer.from_host(b"deep" * 64, resource=stack)
    assert buf.export_ipc().kind == "pool"
    buf.close()


class _Loop:
    """A user's adaptor whose stack comes round to itself."""

    properties = (hmr.device_accessible,)

    def __init__(self):
        self.next = self

    def upstream_resource(self):
        return hmr.async_resource_ref[hmr.device_accessible](self.next) \
            if self.next is not self else self.next

    def allocate_async(self, n, alignment, stream):
        raise AssertionError("never reached")

    def deallocate_async(self, ptr, n, alignment, stream):
        raise AssertionError("never reached")

    def allocate(self, n, alignment=256):
        raise AssertionError("never reached")

    def deallocate(self, ptr, n, alignment=256):
        raise AssertionError("never reached")


@pytest.mark.parametrize("length", [1, 2, 100])
def test_a_cycle_in_a_stack_is_a_value_error(emulator, length):
    loops = [_Loop() for _ in range(length)]
    for a, b in zip(loops, loops[1:] + loops[:1]):
        a.next = b
    with pytest.raises(ValueError, match="cycle"):
        memory_device(loops[0])
    with pytest.raises(ValueError, match="cycle"):
        hmr.Buffer(16, resource=loops[0])


# ---- peer suites ------------------------------------------------------------------------------
def test_async_memory_resources_pickle_by_their_settings(emulator):
    made = hmr.AsyncMemoryResource(0, initial_pool_size=1 << 16, release_threshold=1 << 20,
                                   enable_ipc=True)
    back = pickle.loads(pickle.dumps(made))
    assert repr(back).split(" [")[0] == repr(made).split(" [")[0]
    assert back != made and back.pool.release_threshold == 1 << 20
    with hmr.Buffer(256, resource=back) as buf:
        assert buf.export_ipc().kind == "pool"
    default = hmr.AsyncMemoryResource.from_default_pool()
    assert pickle.loads(pickle.dumps(default)) == default   # the same (default) pool
    handle = made.pool.export_handle()
    importing = hmr.AsyncMemoryResource.from_ipc(handle)
    with pytest.raises(TypeError, match="IpcPoolHandle"):
        pickle.dumps(importing)
    for r in (importing, back, made):
        r.close()
    handle.close()


class _Undeclared:
    """A resource that declares no properties (over the memory it is given)."""

    def __init__(self, upstream):
        self.upstream = upstream

    def allocate_async(self, n, alignment, stream):
        return self.upstream.allocate(n, alignment)

    def deallocate_async(self, ptr, n, alignment, stream):
        self.upstream.deallocate(ptr, n, alignment)

    def allocate(self, n, alignment=256):
        return self.upstream.allocate(n, alignment)

    def deallocate(self, ptr, n, alignment=256):
        self.upstream.deallocate(ptr, n, alignment)


def test_memory_of_a_resource_that_declares_nothing_is_what_the_runtime_says(emulator):
    host = hmr.Buffer.from_host(b"h" * 64, resource=_Undeclared(hmr.HostMemoryResource()))
    assert host.__dlpack_device__() == (1, 0)          # kDLCPU
    with pytest.raises(hmr.NotSupportedError, match="host memory"):
        host.export_ipc()                              # not device memory
    assert not hasattr(host, "__cuda_array_interface__")   # never offered as device memory
    device = hmr.Buffer(64, resource=_Undeclared(hmr.DeviceMemoryResource()))
    with pytest.raises(hmr.NotSupportedError, match="memory from _Undeclared"):
        device.export_ipc()   # past the kind check: the runtime knows it as device memory
    assert device.__cuda_array_interface__["data"][0] == device.ptr
    host.close()
    device.close()


@pytest.mark.gpu
def test_dlpack_of_memory_of_a_resource_that_declares_nothing_on_a_gpu(gpu_runtime):
    host = hmr.Buffer.from_host(b"h" * 64, resource=_Undeclared(hmr.HostMemoryResource()))
    assert host.__dlpack_device__() == (1, 0)
    device = hmr.Buffer(64, resource=_Undeclared(hmr.DeviceMemoryResource()))
    assert device.__dlpack_device__()[0] in (2, 10)   # kDLCUDA / kDLROCM
    host.close()
    device.close()


@pytest.mark.parametrize("bad", [(9, 8, 7), (1,), (), 1, "10", (1, "0"), (1, -1), (True, 0),
                                 (1.0, 0)])
def test_dlpack_max_version_is_a_major_minor_pair(emulator, bad):
    buf = hmr.Buffer(16, resource=hmr.DeviceMemoryResource())
    with pytest.raises(TypeError, match="max_version"):
        buf.__dlpack__(max_version=bad)
    for good in ((1, 0), [1, 3], (0, 8), None):
        buf.__dlpack__(max_version=good)
    buf.close()


# ---- streams: the same verbs on Stream and stream_ref -------------------------------------------
def test_stream_and_stream_ref_share_their_verbs(emulator):
    s = hmr.Stream()
    ref = s.ref
    for obj in (s, ref):
        for name in ("synchronize", "wait", "sync"):
            assert getattr(obj, name)() is None
        emulator.set_stream_busy(s.handle, 3)
        assert [getattr(obj, name)() for name in ("query", "ready", "is_done")] == \
            [False, False, False]
        assert [getattr(obj, name)() for name in ("query", "ready", "is_done")] == \
            [True, True, True]
    s.close()
    for name in ("synchronize", "wait", "sync", "query", "ready", "is_done"):
        with pytest.raises(ValueError, match="closed"):
            getattr(s, name)()


def test_the_porting_table_names_verbs_both_objects_have():
    text = (REPO / "docs" / "porting.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `.synchronize()`"))
    verbs = set(re.findall(r"`\.(\w+)\(\)`", row.split("|")[2]))
    assert {"synchronize", "wait", "sync", "query", "ready", "is_done"} <= verbs
    for verb in verbs - {"get"}:
        assert callable(getattr(hmr.Stream, verb)) and callable(getattr(hmr.stream_ref, verb))


# ---- 3. across processes, on the emulated platform and on a real GPU ----------------------------
def child_forged_then_real(handle, descriptor, out):
    """In another process: a forged size is refused with nothing mapped; the real descriptor
    maps, twice, sharing one mapping; the data is the exporter's."""
    import hipmr_ctypes as hmr
    from hipmr_ctypes.ipc import IpcBufferDescriptor
    report = {}
    res = hmr.AsyncMemoryResource.from_ipc(handle)
    forged = IpcBufferDescriptor("pool", descriptor.device, 1 << 40, 0, descriptor.pool_id,
                                 descriptor.data)
    try:
        hmr.Buffer.from_ipc(forged, res)
        report["forged"] = "mapped"
    except ValueError as exc:
        report["forged"] = "refused" if "allocation" in str(exc) else str(exc)
    report["left_mapped"] = len(res.pool._ipc.mappings)
    first = hmr.Buffer.from_ipc(descriptor, res)
    second = hmr.Buffer.from_ipc(descriptor, res)
    report["shared"] = first.ptr == second.ptr
    report["data"] = second.tobytes() == _pattern(descriptor.size, 5)
    first.close()
    second.close()
    report["unmapped"] = len(res.pool._ipc.mappings) == 0
    res.close()
    handle.close()
    out.put(report)


@pytest.mark.parametrize("where", ["emulated", pytest.param("real", marks=pytest.mark.gpu)])
def test_forged_and_repeated_imports_in_another_process(where, monkeypatch):
    rt = _hip.get_runtime()
    if where == "emulated" and rt.platform != "emulated":
        pytest.skip("the emulated variant runs where the process-wide platform is emulated")
    if where == "real" and (rt.platform == "emulated" or hmr.device_count() < 1):
        if os.environ.get("HIPMR_REQUIRE_GPU") == "1":
            pytest.fail("a GPU is required (HIPMR_REQUIRE_GPU=1) but missing")
        pytest.skip("needs a real GPU")
    mr = hmr.AsyncMemoryResource(0, enable_ipc=True)
    buf = hmr.Buffer.from_host(_pattern(65536, 5), resource=mr)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with mr.pool.export_handle() as handle:
        proc = ctx.Process(target=child_forged_then_real, args=(handle, buf.export_ipc(), out))
        proc.start()
        report = out.get(timeout=TIMEOUT)
        proc.join(TIMEOUT)
    assert proc.exitcode == 0
    assert report == {"forged": "refused", "left_mapped": 0, "shared": True, "data": True,
                      "unmapped": True}
    buf.close()
    mr.close()


def _child_uses_sub_allocators(held, out):
    """Every cached block of the inherited pool / fixed-size resource is the parent's: each
    allocation and free (of blocks the parent holds) refuses, naming the fork, through the
    resource and through a ref made before the fork."""
    seen = []
    for mr, ptr, ptr_async in held:
        for attempt in (lambda: mr.allocate(4096), lambda: mr.deallocate(ptr, 4096),
                        lambda: mr.allocate_async(4096, 256, 0),
                        lambda: mr.deallocate_async(ptr_async, 4096, 256, 0)):
            try:
                attempt()
                seen.append("allowed")
            except hmr.ForkedChildError:
                seen.append("refused")
            except Exception as exc:  # noqa: BLE001
                seen.append(repr(exc))
    out.put(seen)


def test_a_forked_child_refuses_the_inherited_sub_allocators(emulator):
    ctx = _fork_context()
    shared = hmr.AsyncMemoryResource(enable_ipc=True)
    pool = hmr.PoolResource(shared, initial_pool_size=1 << 16)
    fixed = hmr.FixedSizeResource(shared, block_size=4096, blocks_to_preallocate=4)
    # the adaptors that serve blocks from the pool's / a fixed-size bin's lists themselves
    aligned = hmr.AlignedResource(pool, 512)
    binning = hmr.BinningResource(shared, bins=[4096])
    every = (pool, fixed, aligned, binning)
    refs = [hmr.async_resource_ref[hmr.device_accessible](r) for r in every]   # (bound
    keep = [hmr.Buffer.from_host(_pattern(4096, 5), resource=r) for r in every]  # before)
    for r in every:                   # blocks the children's copies see as free
        r.deallocate(r.allocate(4096), 4096)
        r.deallocate_async(r.allocate_async(4096, 256, 0), 4096, 256, 0)
    held = [(r, r.allocate(4096), r.allocate_async(4096, 256, 0)) for r in every]
    held += [(ref, ref.allocate(4096), ref.allocate_async(4096, 256, 0)) for ref in refs]
    out = ctx.Queue()
    proc = ctx.Process(target=_child_uses_sub_allocators, args=(held, out))
    proc.start()
    seen = out.get(timeout=TIMEOUT)
    proc.join(TIMEOUT)
    assert proc.exitcode == 0
    assert seen == ["refused"] * 32
    for buf in keep:                  # the parent's memory: untouched, and still its own
        assert buf.tobytes() == _pattern(4096, 5)
    for r, ptr, ptr_async in held:    # the parent's records: untouched too
        r.deallocate(ptr, 4096)
        r.deallocate_async(ptr_async, 4096, 256, 0)
    for r in every:
        with hmr.Buffer(4096, resource=r) as again:
            again.memset(3)
    assert all(buf.tobytes() == _pattern(4096, 5) for buf in keep)
    assert issubclass(hmr.ForkedChildError, hmr.HipError)

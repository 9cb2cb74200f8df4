"""Memory shared between processes: pool handles, buffer descriptors, the importing resource,
legacy handles, and every way a handle travels.

The cross-process tests run twice: on the emulated platform (CI: the IPC-enabled pools live in
shared memory, so the protocol really crosses processes) and, marked ``gpu`` (``multi_gpu``
when the importer uses the other device), on the real platform.  Children are started with
``spawn`` (never ``fork`` after a GPU runtime is initialized, except on emulated).
"""
import concurrent.futures
import multiprocessing
import os
import pickle
import socket
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes.ipc import SIZE as DESCRIPTOR_SIZE

REAL = pytest.param("real", marks=[pytest.mark.gpu])
REAL_TWO = pytest.param("real", marks=[pytest.mark.gpu, pytest.mark.multi_gpu])
TIMEOUT = 120


@pytest.fixture(params=["emulated", REAL])
def platform(request, monkeypatch):
    return _platform(request, monkeypatch)


@pytest.fixture(params=["emulated", REAL_TWO])
def platform_two(request, monkeypatch):
    """Like ``platform``, for tests whose importer uses the other device."""
    return _platform(request, monkeypatch)


def _platform(request, monkeypatch):
    rt = _hip.get_runtime()
    if request.param == "emulated":
        if rt.platform != "emulated":
            pytest.skip("the emulated variant runs where the process-wide platform is emulated")
        # children (spawn inherits the environment) see two devices
        monkeypatch.setenv("HIPMR_EMULATED_DEVICES", "2")
        return "emulated"
    if rt.platform == "emulated" or hmr.device_count() < 1:
        if os.environ.get("HIPMR_REQUIRE_GPU") == "1":
            pytest.fail("a GPU is required (HIPMR_REQUIRE_GPU=1) but missing")
        pytest.skip("needs a real GPU")
    return "real"


def _spawn():
    return multiprocessing.get_context("spawn")


def _pattern(n, seed):
    return bytes((i * 13 + seed) & 0xFF for i in range(n))


def _exported(size=100_000, seed=1):
    mr = hmr.AsyncMemoryResource(0, enable_ipc=True)
    buf = hmr.Buffer.from_host(_pattern(size, seed), resource=mr)
    return mr, buf


# ---- children (module level: spawn imports them by name) ------------------------------------
def child_map_check_write(handle, descriptor, device, seed, out=None):
    """Import the pool on ``device``, map the buffer, check it, write it back (each byte + 1),
    unmap; report what it saw."""
    import hipmr_ctypes as hmr
    hmr.set_device(device)
    res = hmr.AsyncMemoryResource.from_ipc(handle, device=device)
    access = res.pool.access(device)
    buf = hmr.Buffer.from_ipc(descriptor, res)
    seen = buf.tobytes()
    ok = seen == _pattern(descriptor.size, seed)
    buf.copy_from_host(bytes((b + 1) & 0xFF for b in seen))
    report = {"ok": ok, "device": buf.device, "access": access, "size": buf.size,
              "imported": res.pool.imported}
    try:
        res.allocate(256)
    except hmr.NotSupportedError:
        report["cannot_allocate"] = True
    buf.close()
    res.close()
    handle.close()
    if out is not None:
        out.put(report)
    return report


def child_receive_from_socket(path, descriptor, seed, out):
    import socket as socket_
    import hipmr_ctypes as hmr
    with socket_.socket(socket_.AF_UNIX, socket_.SOCK_STREAM) as sock:
        sock.connect(path)
        handle = hmr.IpcPoolHandle.receive(sock)
    out.put(child_map_check_write(handle, descriptor, 0, seed))


def child_legacy(descriptor, device, seed, out):
    import hipmr_ctypes as hmr
    hmr.set_device(device)
    try:
        buf = hmr.Buffer.from_ipc(descriptor)
    except hmr.NotSupportedError as exc:
        out.put({"not_supported": str(exc)})
        return
    seen = buf.tobytes()
    buf.copy_from_host(bytes((b + 1) & 0xFF for b in seen))
    out.put({"ok": seen == _pattern(descriptor.size, seed), "device": buf.device})
    buf.close()


def child_outlives_exporter(handle, descriptor, seed, ready, go, out):
    """Map, tell the parent, wait until the exporter has closed everything, read again, and
    exit without closing anything (the garbage collector and the exit do it)."""
    import hipmr_ctypes as hmr
    res = hmr.AsyncMemoryResource.from_ipc(handle)
    handle.close()
    buf = hmr.Buffer.from_ipc(descriptor, res)
    first = buf.tobytes() == _pattern(descriptor.size, seed)
    ready.set()
    go.wait(TIMEOUT)
    out.put({"first": first, "again": buf.tobytes() == _pattern(descriptor.size, seed)})


def child_handle_from_queue(queue, descriptor, seed, out):
    handle = queue.get(timeout=TIMEOUT)
    out.put(child_map_check_write(handle, descriptor, 0, seed))


def child_handle_from_pipe(conn, descriptor, seed, out):
    handle = conn.recv()
    out.put(child_map_check_write(handle, descriptor, 0, seed))


# ---- pool memory across processes --------------------------------------------------------------
def _run_child(target, *args):
    ctx = _spawn()
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=args + (out,))
    proc.start()
    try:
        report = out.get(timeout=TIMEOUT)
    finally:
        proc.join(TIMEOUT)
    assert proc.exitcode == 0
    return report


def _check_written_back(buf, seed):
    assert buf.tobytes() == bytes((b + 1) & 0xFF for b in _pattern(buf.size, seed))


def test_pool_memory_same_device(platform):
    mr, buf = _exported(seed=3)
    with mr.pool.export_handle() as handle:
        report = _run_child(child_map_check_write, handle, buf.export_ipc(), 0, 3)
    assert report == {"ok": True, "device": 0, "access": "read_write", "size": buf.size,
                      "imported": True, "cannot_allocate": True}
    _check_written_back(buf, 3)


def test_pool_memory_imported_on_the_other_device(platform_two):
    """The importer on device 1 grants its own device access to the imported pool."""
    mr, buf = _exported(seed=4)
    with mr.pool.export_handle() as handle:
        report = _run_child(child_map_check_write, handle, buf.export_ipc(), 1, 4)
    assert report["ok"] and report["device"] == 0 and report["access"] == "read_write"
    _check_written_back(buf, 4)


@pytest.mark.parametrize("route", ["queue", "pipe", "executor-spawn", "executor-forkserver"])
def test_handle_travels_through_multiprocessing(platform, route):
    mr, buf = _exported(size=5000, seed=5)
    descriptor = buf.export_ipc()
    handle = mr.pool.export_handle()
    if route.startswith("executor"):
        ctx = multiprocessing.get_context(route.split("-")[1])
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            report = pool.submit(child_map_check_write, handle, descriptor, 0, 5).result(TIMEOUT)
    else:
        ctx = _spawn()
        out = ctx.Queue()
        if route == "queue":
            channel = ctx.Queue()
            proc = ctx.Process(target=child_handle_from_queue, args=(channel, descriptor, 5, out))
            proc.start()
            channel.put(handle)
        else:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=child_handle_from_pipe, args=(theirs, descriptor, 5, out))
            proc.start()
            mine.send(handle)
        report = out.get(timeout=TIMEOUT)
        proc.join(TIMEOUT)
        assert proc.exitcode == 0
    assert report["ok"] and report["access"] == "read_write"
    handle.close()
    _check_written_back(buf, 5)


def child_forked(handle, descriptor, out):
    """In a forked child: every use of the runtime is refused, the inherited pool included."""
    import hipmr_ctypes as hmr
    seen = []
    for attempt in (lambda: hmr.AsyncMemoryResource.from_ipc(handle),
                    lambda: hmr.Buffer(256),
                    lambda: hmr.set_device(0)):
        try:
            attempt()
            seen.append("allowed")
        except hmr.HipError as exc:
            seen.append(type(exc).__name__ + ("/spawn" if "spawn" in str(exc) else ""))
    out.put(seen)


def test_a_child_forked_after_the_runtime_started_is_refused():
    if _hip.get_runtime().platform != "emulated":
        pytest.skip("fork after a GPU runtime started is unsafe; emulated only")
    mr, buf = _exported(size=3000, seed=6)
    handle = mr.pool.export_handle()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=child_forked, args=(handle, buf.export_ipc(), out))
    proc.start()
    seen = out.get(timeout=TIMEOUT)
    proc.join(TIMEOUT)
    assert proc.exitcode == 0
    assert seen == ["ForkedChildError/spawn"] * 3
    handle.close()
    assert buf.tobytes() == _pattern(3000, 6)


def test_handle_travels_through_a_unix_socket(platform, tmp_path):
    """For processes multiprocessing did not start (MPI ranks): send() / receive()."""
    mr, buf = _exported(size=7000, seed=7)
    path = str(tmp_path / "handle.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    ctx = _spawn()
    out = ctx.Queue()
    proc = ctx.Process(target=child_receive_from_socket, args=(path, buf.export_ipc(), 7, out))
    proc.start()
    server.settimeout(TIMEOUT)
    conn, _ = server.accept()
    with conn, mr.pool.export_handle() as handle:
        handle.send(conn)
    report = out.get(timeout=TIMEOUT)
    proc.join(TIMEOUT)
    server.close()
    assert report["ok"] and proc.exitcode == 0
    _check_written_back(buf, 7)


def test_importer_outlives_the_exporter(platform):
    """The exporter closes its buffer, resource and handle while a child still maps the memory
    (against the documented rule): the emulated memory stays readable for the child, and on a
    GPU nothing crashes on either side."""
    mr, buf = _exported(size=4096, seed=8)
    ctx = _spawn()
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    handle = mr.pool.export_handle()
    proc = ctx.Process(target=child_outlives_exporter,
                       args=(handle, buf.export_ipc(), 8, ready, go, out))
    proc.start()
    assert ready.wait(TIMEOUT)
    handle.close()
    buf.close()
    mr.close()
    go.set()
    report = out.get(timeout=TIMEOUT)
    proc.join(TIMEOUT)
    assert proc.exitcode == 0 and report["first"]
    if platform == "emulated":
        assert report["again"]


# ---- legacy (hipMalloc) memory -----------------------------------------------------------------
def test_legacy_memory_same_device(platform):
    _legacy(platform, 0)


def test_legacy_memory_opened_on_the_other_device(platform_two):
    _legacy(platform_two, 1)


def _legacy(platform, device):
    buf = hmr.Buffer.from_host(_pattern(12345, 9), resource=hmr.DeviceMemoryResource(0))
    descriptor = buf.export_ipc()
    assert descriptor.kind == "legacy" and descriptor.pool_id is None
    report = _run_child(child_legacy, descriptor, device, 9)
    if platform == "emulated":
        assert "cannot map" in report["not_supported"]
        return
    assert report == {"ok": True, "device": 0}
    _check_written_back(buf, 9)


def test_legacy_memory_on_emulated_is_not_supported_in_process():
    if _hip.get_runtime().platform != "emulated":
        pytest.skip("emulated only")
    buf = hmr.Buffer.from_host(b"x" * 512, resource=hmr.DeviceMemoryResource())
    with pytest.raises(hmr.NotSupportedError, match="cannot map hipMalloc memory"):
        hmr.Buffer.from_ipc(buf.export_ipc())


# ---- handles and descriptors as objects --------------------------------------------------------
def test_plain_pickle_of_a_handle_says_how_to_send_it():
    mr = hmr.AsyncMemoryResource(enable_ipc=True)
    with mr.pool.export_handle() as handle:
        with pytest.raises(TypeError, match="multiprocessing.*send\\(sock\\)"):
            pickle.dumps(handle)
    assert handle.closed
    with pytest.raises(ValueError, match="closed"):
        handle.fd
    handle.close()   # idempotent


def test_handle_close_and_garbage_collection_close_the_descriptor():
    mr = hmr.AsyncMemoryResource(enable_ipc=True)
    handle = mr.pool.export_handle()
    fd = handle.fd
    os.fstat(fd)
    handle.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    handle = mr.pool.export_handle()
    fd = handle.fd
    del handle
    with pytest.raises(OSError):
        os.fstat(fd)


def test_each_export_is_a_new_descriptor_of_the_same_pool():
    mr = hmr.AsyncMemoryResource(enable_ipc=True)
    with mr.pool.export_handle() as a, mr.pool.export_handle() as b:
        assert a.fd != b.fd and a.pool_id == b.pool_id and a.device == b.device == 0
    other = hmr.AsyncMemoryResource(enable_ipc=True)
    with other.pool.export_handle() as c:
        assert c.pool_id != a.pool_id


def test_receive_refuses_what_is_not_a_handle():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"hello")
        with pytest.raises(ValueError, match="expected one handle"):
            hmr.IpcPoolHandle.receive(right)
        r, w = os.pipe()
        socket.send_fds(left, [b"X" * 32], [r])
        os.close(r)
        with pytest.raises(ValueError, match="not an IpcPoolHandle"):
            hmr.IpcPoolHandle.receive(right)
        os.close(w)
    with pytest.raises(TypeError, match="AF_UNIX"):
        hmr.IpcPoolHandle.receive("sock")


def test_descriptor_is_small_immutable_and_picklable():
    mr, buf = _exported(size=1000)
    d = buf.export_ipc()
    assert (d.kind, d.size, d.device, d.offset) == ("pool", 1000, 0, 0)
    assert len(bytes(d)) == DESCRIPTOR_SIZE and len(d.pool_id) == 16 and len(d.data) == 64
    assert pickle.loads(pickle.dumps(d)) == d
    assert hmr.IpcBufferDescriptor.from_bytes(bytes(d)) == d
    assert hash(hmr.IpcBufferDescriptor.from_bytes(bytearray(bytes(d)))) == hash(d)
    with pytest.raises(AttributeError):
        d.size = 5
    with mr.pool.export_handle() as handle:
        assert d.pool_id == handle.pool_id


def test_descriptor_bytes_truncated_corrupted_or_forged():
    mr, buf = _exported(size=1000)
    raw = bytes(buf.export_ipc())
    with pytest.raises(ValueError, match="is 116 bytes, not 115"):
        hmr.IpcBufferDescriptor.from_bytes(raw[:-1])
    corrupted = bytearray(raw)
    corrupted[40] ^= 1
    with pytest.raises(ValueError, match="corrupted"):
        hmr.IpcBufferDescriptor.from_bytes(corrupted)
    with pytest.raises(ValueError, match="not an IpcBufferDescriptor"):
        hmr.IpcBufferDescriptor.from_bytes(b"X" * len(raw))
    with pytest.raises(TypeError):
        hmr.IpcBufferDescriptor.from_bytes(42)


# ---- bad input in the importing process (emulated: a process may import its own pool) ---------
@pytest.fixture
def imported(emulator):
    mr, buf = _exported(size=2048, seed=11)
    handle = mr.pool.export_handle()
    res = hmr.AsyncMemoryResource.from_ipc(handle)
    yield mr, buf, handle, res
    handle.close()


def test_imported_buffer_maps_the_same_memory_at_another_address(imported):
    mr, buf, handle, res = imported
    mapped = hmr.Buffer.from_ipc(buf.export_ipc(), res)
    assert mapped.ptr != buf.ptr and mapped.tobytes() == buf.tobytes()
    mapped.memset(0x5A)
    assert buf.tobytes() == b"\x5a" * 2048
    assert repr(res).startswith("AsyncMemoryResource(device=0, imported_from_device=0")
    mapped.close()
    assert buf.tobytes() == b"\x5a" * 2048   # unmapping never frees the exporter's memory


def test_importing_resource_cannot_allocate(imported):
    _, _, _, res = imported
    with pytest.raises(hmr.NotSupportedError, match="cannot allocate"):
        res.allocate(256)
    with pytest.raises(hmr.NotSupportedError):
        hmr.Buffer(256, resource=res)
    with pytest.raises(hmr.NotSupportedError, match="cannot be exported again"):
        res.pool.export_handle()


def test_bad_descriptors_map_nothing(imported, emulator):
    mr, buf, handle, res = imported
    before = emulator.live_allocations()
    other_mr, other_buf = _exported(size=512)
    before = emulator.live_allocations()
    with pytest.raises(ValueError, match="another memory pool"):
        hmr.Buffer.from_ipc(other_buf.export_ipc(), res)
    with pytest.raises(ValueError, match="importing resource"):
        hmr.Buffer.from_ipc(buf.export_ipc())
    with pytest.raises(TypeError, match="importing AsyncMemoryResource"):
        hmr.Buffer.from_ipc(buf.export_ipc(), mr)
    with pytest.raises(TypeError, match="IpcBufferDescriptor"):
        hmr.Buffer.from_ipc(bytes(buf.export_ipc()), res)
    legacy = hmr.Buffer.from_host(b"l" * 256, resource=hmr.DeviceMemoryResource())
    with pytest.raises(ValueError, match="without a resource"):
        hmr.Buffer.from_ipc(legacy.export_ipc(), res)
    d = buf.export_ipc()
    forged = hmr.IpcBufferDescriptor("pool", 0, d.size, 0, d.pool_id, b"\0" * 64)
    with pytest.raises(hmr.HipError, match="hipMemPoolImportPointer"):
        hmr.Buffer.from_ipc(forged, res)
    assert emulator.live_allocations().count == before.count + 1   # only `legacy`
    legacy.close()


def test_a_buffer_imported_twice_shares_one_mapping(imported, emulator):
    """The runtime maps an allocation once per process: a second import of the same
    descriptor shares the first one's mapping, which is unmapped when the last Buffer on it
    closes (in either order)."""
    _, buf, _, res = imported
    before = emulator.live_allocations().count
    first = hmr.Buffer.from_ipc(buf.export_ipc(), res)
    second = hmr.Buffer.from_ipc(buf.export_ipc(), res)
    assert second.ptr == first.ptr and len(res.pool._ipc.mappings) == 1
    assert emulator.live_allocations().count == before + 1
    first.close()
    assert second.tobytes() == buf.tobytes()      # still mapped
    second.close()
    assert not res.pool._ipc.mappings
    assert emulator.live_allocations().count == before
    again = hmr.Buffer.from_ipc(buf.export_ipc(), res)
    again.close()


def test_importing_resource_unmaps_only_what_it_mapped(imported):
    _, buf, _, res = imported
    with pytest.raises(hmr.HipError):
        res.deallocate(buf.ptr, buf.size)      # the exporter's pointer: refused, not freed
    assert buf.tobytes()[:1] == _pattern(1, 11)


def test_closed_things(imported):
    mr, buf, handle, res = imported
    mapped = hmr.Buffer.from_ipc(buf.export_ipc(), res)
    res.close()                   # the imported pool stays until its last mapping goes
    assert mapped.tobytes() == buf.tobytes()
    with pytest.raises(ValueError, match="closed"):
        hmr.Buffer.from_ipc(buf.export_ipc(), res)
    mapped.close()
    handle.close()
    with pytest.raises(ValueError, match="closed"):
        hmr.AsyncMemoryResource.from_ipc(handle)
    with pytest.raises(TypeError, match="IpcPoolHandle"):
        hmr.AsyncMemoryResource.from_ipc(3)
    buf.close()
    with pytest.raises(ValueError, match="closed"):
        buf.export_ipc()
    mr.close()
    with pytest.raises(ValueError, match="closed"):
        mr.pool.export_handle()


def test_what_cannot_be_exported(emulator):
    cases = [
        (hmr.HostMemoryResource(), "host memory"),
        (hmr.PinnedMemoryResource(), "pinned memory"),
        (hmr.ManagedMemoryResource(), "managed memory"),
        (hmr.AsyncMemoryResource(), "enable_ipc=True"),
        (hmr.PoolResource(hmr.DeviceMemoryResource(), initial_pool_size=1 << 20),
         "PoolResource"),
    ]
    for resource, why in cases:
        buf = hmr.Buffer(512, resource=resource)
        with pytest.raises(hmr.NotSupportedError, match=why):
            buf.export_ipc()
        buf.close()
    with pytest.raises(ValueError, match="empty"):
        hmr.Buffer(0, resource=hmr.DeviceMemoryResource()).export_ipc()
    with pytest.raises(hmr.NotSupportedError, match="enable_ipc"):
        hmr.AsyncMemoryResource().pool.export_handle()
    stats = hmr.StatisticsResource(hmr.AsyncMemoryResource(enable_ipc=True))
    assert hmr.Buffer(512, resource=stats).export_ipc().kind == "pool"


class _Forwarding:
    """A user's adaptor that hands out its upstream's pointers unchanged, declaring nothing."""

    properties = (hmr.device_accessible,)

    def __init__(self, upstream):
        self._up = upstream

    def upstream_resource(self):
        return self._up

    def allocate(self, bytes, alignment=hmr.DEFAULT_ALIGNMENT):
        return self._up.allocate(bytes, alignment)

    def deallocate(self, ptr, bytes, alignment=hmr.DEFAULT_ALIGNMENT):
        self._up.deallocate(ptr, bytes, alignment)

    def allocate_async(self, bytes, alignment, stream):
        return self._up.allocate_async(bytes, alignment, stream)

    def deallocate_async(self, ptr, bytes, alignment, stream):
        self._up.deallocate_async(ptr, bytes, alignment, stream)

    def __eq__(self, other):
        return other is self

    __hash__ = object.__hash__


class _Declared(_Forwarding):
    passes_pointers_through = True


class _StatisticsThatSaysNo(hmr.StatisticsResource):
    passes_pointers_through = False


def test_the_pass_through_attribute_decides_what_export_walks_through(emulator):
    """``export_ipc`` walks down through an adaptor exactly when its class says
    ``passes_pointers_through = True``: a user's class that says so is shared as its
    upstream's memory (and maps back to the same bytes); the same class without it, or one
    of the package's pass-through adaptors whose subclass says False, is refused with the
    error naming it."""
    mr = hmr.AsyncMemoryResource(enable_ipc=True)
    buf = hmr.Buffer.from_host(_pattern(1024, 5), resource=_Declared(mr))
    descriptor = buf.export_ipc()
    with mr.pool.export_handle() as handle:
        assert descriptor.kind == "pool" and descriptor.pool_id == handle.pool_id
        res = hmr.AsyncMemoryResource.from_ipc(handle)
        mapped = hmr.Buffer.from_ipc(descriptor, res)
        assert mapped.ptr != buf.ptr and mapped.tobytes() == _pattern(1024, 5)
        mapped.close()
        res.close()
    legacy = hmr.Buffer(256, resource=hmr.StatisticsResource(_Declared(
        hmr.DeviceMemoryResource())))
    assert legacy.export_ipc().kind == "legacy"
    for resource, name in ((_Forwarding(mr), "_Forwarding"),
                           (_StatisticsThatSaysNo(mr), "_StatisticsThatSaysNo"),
                           (_Declared(_Forwarding(mr)), "_Forwarding")):
        refused = hmr.Buffer(256, resource=resource)
        with pytest.raises(hmr.NotSupportedError,
                           match=f"memory from {name} cannot be shared with another process"):
            refused.export_ipc()
        refused.close()
    buf.close()
    legacy.close()


def test_many_threads_import_and_unmap(imported):
    _, buf, _, res = imported
    errors = []

    def work():
        try:
            for _ in range(50):
                try:
                    m = hmr.Buffer.from_ipc(buf.export_ipc(), res)
                except hmr.HipError:
                    continue   # another thread maps it now
                assert m.tobytes()[:4] == buf.tobytes()[:4]
                m.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not res.pool._ipc.mappings


def test_a_pointer_is_exported_before_its_pool_handle(emulator):
    """The runtime exports a pointer only of a pool that was exported itself (CUDA and HIP:
    hipErrorInvalidValue otherwise, as the emulator does too); ``export_ipc`` exports the pool
    once on its own, so a Buffer can be exported before any ``pool.export_handle()``."""
    from hipmr_ctypes._hip.types import hipMemPoolPtrExportData
    rt = _hip.get_runtime()
    mr = hmr.AsyncMemoryResource(enable_ipc=True)
    raw = mr.allocate(256)
    assert rt.hip_code(rt.fn.hipMemPoolExportPointer(hipMemPoolPtrExportData(), raw)) == 1
    rt.clear_last_error()
    mr.deallocate(raw, 256)
    buf = hmr.Buffer.from_host(_pattern(4096, 9), resource=mr)
    descriptor = buf.export_ipc()          # no handle was exported yet
    assert descriptor.kind == "pool"
    assert buf.export_ipc() == descriptor  # the pool is exported once, not per buffer
    with mr.pool.export_handle() as handle:
        report = _run_child(child_map_check_write, handle, descriptor, 0, 9)
    assert report["ok"]
    _check_written_back(buf, 9)
    buf.close()
    mr.pool.close()
    assert mr.pool._ipc.handle is None         # its own handle is closed with the pool

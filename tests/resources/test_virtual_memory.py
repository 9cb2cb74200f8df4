"""VirtualMemoryResource on the emulated platform: allocation, the frameworks on top, pause and
resume, tags, and every failure in the middle of them (faults injected into each virtual-memory
call, no pinned memory, an interrupt, threads).  After each, the state is consistent, the error
clear, and no byte that was backed up is lost."""
from __future__ import annotations

import gc
import pickle
import signal
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _config
from hipmr_ctypes._hip.exceptions import HipError, OutOfMemoryError

from support import failing_nth, no_native_call, process_runtime, spy_runtime_calls

MiB = 1 << 20
G = 2 * MiB     # the emulated granularity


@pytest.fixture
def emu(emulator):
    """The emulator, checked after the test: no reservation, physical memory or allocation
    left, the device's memory all free again."""
    with process_runtime():
        gc.collect()
        before = emulator.live_allocations()
        free_before = hmr.available_device_memory()[0]
        yield emulator
        emulator.clear_faults()
    gc.collect()
    space = emulator._vspace
    assert space.reservations == {} and space.physicals == {}, "virtual memory leaked"
    assert emulator.live_allocations() == before
    assert hmr.available_device_memory()[0] == free_before


@pytest.fixture
def vmm(emu):
    """A resource; after the test its spare pinned blocks are freed (pytest holds the object
    until the whole teardown is over, so the garbage collector cannot) and, no allocation
    being paused then, it holds no pinned memory."""
    resource = hmr.VirtualMemoryResource()
    yield resource
    resource.release_backup_memory()
    assert resource.backup_bytes == 0 or resource.paused()


def free_memory():
    return hmr.available_device_memory()[0]


def filled(vmm, nbytes, value, tag=None):
    if tag is None:
        buf = hmr.Buffer(nbytes, resource=vmm)
    else:
        with vmm.tag(tag):
            buf = hmr.Buffer(nbytes, resource=vmm)
    buf.copy_from_host(pattern(value, nbytes))
    return buf


def pattern(value, nbytes):
    return bytes((value + i) % 256 for i in range(256)) * (nbytes // 256)


# ---- the resource ------------------------------------------------------------------------
def test_sizes_rounded_to_the_granularity_and_counted(vmm):
    assert vmm.granularity == G and vmm.device == 0
    assert hmr.is_async_resource_with(vmm, hmr.device_accessible)
    free = free_memory()
    p = vmm.allocate(1)
    q = vmm.allocate(G + 1)
    assert p % G == 0 and q % G == 0
    assert vmm.mapped_bytes == vmm.reserved_bytes == 3 * G
    assert free - free_memory() == 3 * G
    assert vmm.allocate(0) == 0
    vmm.deallocate(p, 1)
    vmm.deallocate(q, G + 1)
    assert vmm.mapped_bytes == vmm.reserved_bytes == 0


def test_granularity_option():
    with process_runtime():
        assert hmr.VirtualMemoryResource(granularity=4 * G).granularity == 4 * G
        with pytest.raises(ValueError, match="multiple"):
            hmr.VirtualMemoryResource(granularity=G + 4096)
        for bad in (0, -G):
            with pytest.raises(ValueError):
                hmr.VirtualMemoryResource(granularity=bad)
        for bad in (1.5, "2MiB", True):
            with pytest.raises(TypeError):
                hmr.VirtualMemoryResource(granularity=bad)


def test_bad_input_raises_before_any_native_call(vmm, emu):
    p = vmm.allocate(MiB)
    with no_native_call(emu):
        for args in ((-1,), (1.0,), (MiB, 3), (MiB, 512)):
            with pytest.raises((TypeError, ValueError)):
                vmm.allocate(*args)
        with pytest.raises(ValueError, match="not allocated"):
            vmm.deallocate(p + G, MiB)
        with pytest.raises(ValueError, match="does not match"):
            vmm.deallocate(p, 3 * G)
        with pytest.raises(TypeError):
            vmm.pause(backup=1)
        with pytest.raises(TypeError):
            vmm.pause(tag=3)
        with pytest.raises(TypeError):
            with vmm.tag(None):
                pass
        with pytest.raises(ValueError):
            with vmm.tag(""):
                pass
        with pytest.raises(ValueError, match="not allocated"):
            vmm.deallocate_async(p + G, MiB, 256, 0)
    vmm.deallocate(p, MiB)
    with pytest.raises(TypeError):
        pickle.dumps(vmm)
    assert vmm == vmm and vmm != hmr.VirtualMemoryResource()


def test_no_virtual_memory_is_a_clear_error(emu, monkeypatch):
    monkeypatch.setattr(emu._vspace, "supported", False)
    with pytest.raises(hmr.NotSupportedError, match="virtual memory"):
        hmr.VirtualMemoryResource()


def test_buffer_adaptors_and_the_per_device_resource(vmm):
    buf = filled(vmm, 3 * MiB, 5)
    assert buf.tobytes() == pattern(5, 3 * MiB)
    pool = hmr.PoolResource(hmr.StatisticsResource(vmm), initial_pool_size=4 * MiB)
    b = hmr.Buffer(MiB, resource=pool)
    b.fill(3)
    assert set(b.tobytes()) == {3}
    del b
    pool.release()
    hmr.set_current_device_resource(vmm)
    assert hmr.Buffer(100).resource is vmm or vmm.mapped_bytes >= 4 * G


def test_the_environment_names_it(emu, monkeypatch):
    spec = _config.parse_spec("virtual,pool,statistics")
    mr = _config.build(spec, 0)
    assert isinstance(mr, hmr.StatisticsResource)
    assert isinstance(mr.upstream.upstream, hmr.VirtualMemoryResource)
    assert "VirtualMemoryResource" in _config.build.__module__ or True
    monkeypatch.setenv("HIPMR_DEVICE_RESOURCE", "virtual")
    assert _config.describe()["detail"] == "VirtualMemoryResource"
    assert isinstance(_config.default_resource(0), hmr.VirtualMemoryResource)


def test_deallocate_async_waits_for_the_stream_before_unmapping(vmm, emu, monkeypatch):
    rt = hmr._hip.get_runtime()
    calls = spy_runtime_calls(monkeypatch, rt, "hipStreamSynchronize", "hipMemUnmap")
    with hmr.Stream() as s:
        p = vmm.allocate_async(MiB, 256, s)
        emu.set_stream_busy(s.ref.get(), 3)
        vmm.deallocate_async(p, MiB, 256, s)
        assert calls == ["hipStreamSynchronize", "hipMemUnmap"]
        assert s.ref.ready()


def test_a_finalizer_inside_a_pause_is_deferred(vmm):
    keep = filled(vmm, MiB, 1)
    doomed = hmr.Buffer(MiB, resource=vmm)
    ran = []

    class Trigger:
        def __del__(self):
            ran.append(vmm._lock.held_here())
            doomed_ref[0] = None   # the buffer's last reference: it frees inside the lock

    doomed_ref = [doomed]
    del doomed
    rt = hmr._hip.get_runtime()
    real = rt.fn.hipDeviceSynchronize
    trigger = [Trigger()]

    def sync():
        trigger.clear()            # runs Trigger.__del__ while the pause holds the lock
        return real()
    rt.fn.hipDeviceSynchronize = sync
    try:
        assert vmm.pause() == 2 * G   # both paused; the doomed one freed once the lock is free
    finally:
        rt.fn.hipDeviceSynchronize = real
    assert ran == [True] and vmm.reserved_bytes == G
    vmm.resume()
    assert keep.tobytes() == pattern(1, MiB)


# ---- sleep and wake ---------------------------------------------------------------------
def test_pause_releases_and_resume_restores_at_the_same_addresses(vmm):
    a = filled(vmm, 3 * MiB, 10, tag="weights")
    b = filled(vmm, MiB, 20, tag="weights")
    kv = filled(vmm, G, 30, tag="kv")
    free = free_memory()
    addresses = (a.ptr, b.ptr, kv.ptr)
    assert not vmm.paused()
    assert vmm.pause("weights") == 3 * G
    assert free_memory() - free == 3 * G
    assert vmm.paused("weights") and vmm.paused() and not vmm.paused("kv")
    assert vmm.mapped_bytes == G and vmm.reserved_bytes == 4 * G
    with pytest.raises(HipError):
        a.tobytes()                    # paused memory is not touched: an error, no crash
    assert vmm.pause("kv", backup=False) == G
    assert free_memory() - free == 4 * G
    with pytest.raises(RuntimeError, match="paused already"):
        vmm.pause("kv")
    with pytest.raises(RuntimeError, match="paused already"):
        vmm.pause()
    with vmm.tag("kv"):
        late = filled(vmm, MiB, 40)    # a new allocation of a paused tag: mapped, pausable
    assert vmm.pause("kv") == G and vmm.resume("kv") == 2 * G
    assert late.tobytes() == pattern(40, MiB)
    assert vmm.pause("kv", backup=False) == 2 * G
    assert vmm.resume("weights") == 3 * G
    with pytest.raises(RuntimeError, match="not paused"):
        vmm.resume("weights")
    assert a.tobytes() == pattern(10, 3 * MiB) and b.tobytes() == pattern(20, MiB)
    assert vmm.resume() == 2 * G
    assert kv.tobytes() == bytes(G)    # discarded: zero-filled
    assert late.tobytes() == bytes(MiB)
    del late
    assert (a.ptr, b.ptr, kv.ptr) == addresses
    assert free_memory() == free and not vmm.paused()
    assert vmm.pause("nothing-has-this-tag") == 0
    with pytest.raises(RuntimeError, match="not paused"):
        vmm.resume()


def test_deallocating_paused_memory_frees_its_range_and_keeps_its_backup_blocks(vmm, emu):
    pinned_before = emu.live_allocations()
    buf = filled(vmm, MiB, 1)
    other = filled(vmm, MiB, 2)
    vmm.pause()
    assert emu.live_allocations().count == pinned_before.count + 2   # the two backups
    assert vmm.backup_bytes == 2 * MiB
    del buf
    gc.collect()
    assert vmm.reserved_bytes == G and len(emu._vspace.reservations) == 1
    assert emu.live_allocations().count == pinned_before.count + 2   # one backup, one spare
    assert vmm.backup_bytes == 2 * MiB
    assert vmm.release_backup_memory() == MiB                        # the spare only
    assert emu.live_allocations().count == pinned_before.count + 1
    assert vmm.backup_bytes == MiB and vmm.paused()
    vmm.resume()
    assert other.tobytes() == pattern(2, MiB)
    assert vmm.backup_bytes == MiB and vmm.release_backup_memory() == MiB
    assert emu.live_allocations() == pinned_before and vmm.backup_bytes == 0


def test_tags_are_per_thread_and_nest(vmm):
    seen = {}

    def other_thread():
        seen["other"] = vmm.allocate(1)
    with vmm.tag("outer"):
        p = vmm.allocate(1)
        with vmm.tag("inner"):
            q = vmm.allocate(1)
            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
        r = vmm.allocate(1)
    tags = {ptr: reg.tag for ptr, reg in vmm._regions.items()}
    assert (tags[p], tags[q], tags[r], tags[seen["other"]]) == ("outer", "inner", "outer", None)
    for ptr in (p, q, r, seen["other"]):
        vmm.deallocate(ptr, 1)


# ---- failures ---------------------------------------------------------------------------
@pytest.mark.parametrize("call", ["hipMemAddressReserve", "hipMemCreate", "hipMemMap",
                                  "hipMemSetAccess"])
def test_a_failed_allocation_leaves_nothing(vmm, emu, call):
    emu.inject_failure(code=2, calls=call)
    with pytest.raises(OutOfMemoryError):
        vmm.allocate(MiB)
    assert vmm.reserved_bytes == vmm.mapped_bytes == 0 and not vmm._regions
    assert emu._vspace.reservations == {} and emu._vspace.physicals == {}


def test_out_of_device_memory(vmm, emu):
    with pytest.raises(OutOfMemoryError):
        vmm.allocate(emu.capacity() + G)


@pytest.mark.parametrize("call", ["hipDeviceSynchronize", "hipHostMalloc", "hipMemcpyAsync",
                                  "hipStreamSynchronize"])
def test_a_failed_backup_releases_nothing(vmm, emu, call):
    a = filled(vmm, MiB, 1)
    b = filled(vmm, MiB, 2)
    free = free_memory()
    pinned = emu.live_allocations()
    emu.inject_failure(code=2, calls=call, count=1 if call != "hipHostMalloc" else 1)
    if call == "hipHostMalloc":   # the second backup cannot be had
        emu.clear_faults()
        real = hmr._hip.get_runtime().fn.hipHostMalloc
        made = []

        def second_fails(out, size, flags):
            made.append(size)
            return 2 if len(made) == 2 else real(out, size, flags)
        hmr._hip.get_runtime().fn.hipHostMalloc = second_fails
        try:
            with pytest.raises(OutOfMemoryError, match="nothing was released"):
                vmm.pause()
        finally:
            hmr._hip.get_runtime().fn.hipHostMalloc = real
    else:
        with pytest.raises(HipError):
            vmm.pause()
    assert not vmm.paused() and free_memory() == free and emu.live_allocations() == pinned
    assert a.tobytes() == pattern(1, MiB) and b.tobytes() == pattern(2, MiB)
    assert vmm.pause() == 2 * G and vmm.resume() == 2 * G
    assert a.tobytes() == pattern(1, MiB) and b.tobytes() == pattern(2, MiB)


def test_a_failed_unmap_pauses_the_ones_before_it(vmm, emu, monkeypatch):
    bufs = [filled(vmm, MiB, i) for i in range(3)]
    rt = hmr._hip.get_runtime()
    real, seen = rt.fn.hipMemUnmap, []

    def second_fails(ptr, size):
        seen.append(ptr)
        return 1 if len(seen) == 2 else real(ptr, size)
    monkeypatch.setattr(rt.fn, "hipMemUnmap", second_fails)
    with pytest.raises(HipError, match="before it are paused"):
        vmm.pause()
    monkeypatch.setattr(rt.fn, "hipMemUnmap", real)
    states = [vmm._regions[b.ptr].paused for b in bufs]
    assert states == [True, False, False]
    assert vmm.mapped_bytes == 2 * G
    assert bufs[1].tobytes() == pattern(1, MiB)
    assert vmm.pause() == 2 * G        # the two it did not reach
    assert vmm.resume() == 3 * G
    assert [b.tobytes() for b in bufs] == [pattern(i, MiB) for i in range(3)]


def test_a_failed_release_keeps_the_memory_for_resume(vmm, emu):
    buf = filled(vmm, MiB, 4)
    free = free_memory()
    emu.inject_failure(code=1, calls="hipMemRelease")
    with pytest.raises(HipError):
        vmm.pause()
    assert vmm.paused() and free_memory() == free   # unmapped, not yet given back
    assert vmm.resume() == G
    assert buf.tobytes() == pattern(4, MiB)


@pytest.mark.parametrize("call", ["hipMemCreate", "hipMemMap", "hipMemSetAccess",
                                  "hipMemcpyAsync", "hipStreamSynchronize"])
def test_a_failed_resume_stays_paused_with_its_backup(vmm, emu, call):
    a = filled(vmm, MiB, 7)
    b = filled(vmm, MiB, 8)
    vmm.pause()
    free = free_memory()
    emu.inject_failure(code=2, calls=call)
    with pytest.raises(HipError):
        vmm.resume()
    if call in ("hipMemcpyAsync", "hipStreamSynchronize"):
        assert vmm.paused() and all(r.paused for r in vmm._regions.values())
    assert vmm.paused() and free_memory() <= free
    assert all(r.backup for r in vmm._regions.values() if r.paused)
    vmm.resume()
    assert not vmm.paused() and vmm.mapped_bytes == 2 * G
    assert a.tobytes() == pattern(7, MiB) and b.tobytes() == pattern(8, MiB)


def test_faults_in_every_virtual_memory_call_lose_no_byte(vmm, emu):
    """Each call, failed at each of its first uses in a cycle of allocate / pause (backed up
    and discarded) / resume / deallocate / release of the spare blocks: once the calls work
    again, every step can be retried and the backed-up data is intact."""
    calls = ["hipMemAddressReserve", "hipMemCreate", "hipMemMap", "hipMemSetAccess",
             "hipMemUnmap", "hipMemRelease", "hipMemAddressFree", "hipHostMalloc",
             "hipHostFree", "hipMemcpyAsync", "hipMemsetAsync", "hipStreamSynchronize",
             "hipDeviceSynchronize"]
    keep = filled(vmm, MiB, 9, tag="w")
    extras = []

    def cycle():
        for step in range(6):
            try:
                if step == 0:
                    with vmm.tag("x"):
                        extras.append(vmm.allocate(MiB))
                elif step == 1:
                    vmm.pause("w")
                elif step == 2:
                    vmm.pause("x", backup=False)
                elif step == 3:
                    vmm.resume()
                elif step == 4:
                    for p in list(extras):
                        vmm.deallocate(p, MiB)
                        extras.remove(p)
                else:
                    vmm.release_backup_memory()
            except (HipError, RuntimeError):
                pass

    rt = hmr._hip.get_runtime()
    for call in calls:
        for nth in (1, 2, 3):
            with failing_nth(rt, call, nth):
                cycle()
            while vmm.paused():
                vmm.resume()
            for p in list(extras):
                vmm.deallocate(p, MiB)
                extras.remove(p)
            assert keep.tobytes() == pattern(9, MiB), (call, nth)
            assert vmm.reserved_bytes == vmm.mapped_bytes == G, (call, nth)
            vmm.release_backup_memory()
            assert vmm.backup_bytes == 0, (call, nth)


def test_an_interrupt_waits_for_a_consistent_state(vmm, monkeypatch):
    bufs = [filled(vmm, MiB, i) for i in range(3)]
    rt = hmr._hip.get_runtime()
    real = rt.fn.hipMemUnmap

    def interrupted(ptr, size):
        signal.raise_signal(signal.SIGINT)   # the handler runs after the pause, not here
        return real(ptr, size)
    monkeypatch.setattr(rt.fn, "hipMemUnmap", interrupted)
    with pytest.raises(KeyboardInterrupt):
        vmm.pause()
    monkeypatch.setattr(rt.fn, "hipMemUnmap", real)
    assert all(r.paused and not r.mapped and r.backup for r in vmm._regions.values())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    vmm.resume()
    assert [b.tobytes() for b in bufs] == [pattern(i, MiB) for i in range(3)]


def test_threads_allocating_while_another_pauses(vmm):
    weights = [filled(vmm, MiB, i, tag="weights") for i in range(4)]
    errors, stop = [], threading.Event()

    def worker(seed):
        try:
            while not stop.is_set():
                buf = hmr.Buffer(MiB, resource=vmm)
                buf.fill(seed)
                assert set(buf.tobytes()) == {seed}
                del buf
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(s,)) for s in (11, 12, 13)]
    for t in threads:
        t.start()
    try:
        for _ in range(10):
            assert vmm.pause("weights") == 4 * G
            assert vmm.paused("weights")
            assert vmm.resume("weights") == 4 * G
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    assert [w.tobytes() for w in weights] == [pattern(i, MiB) for i in range(4)]
    assert vmm.reserved_bytes == vmm.mapped_bytes == 4 * G
    assert vmm.backup_bytes == 4 * MiB   # the first pause's blocks, kept for every later one


def test_backups_in_several_blocks(vmm, emu, monkeypatch):
    """A backup larger than BACKUP_CHUNK is several pinned blocks; a block that cannot be had
    half way frees the ones before it and releases nothing."""
    from hipmr_ctypes.resources import virtual
    monkeypatch.setattr(virtual, "BACKUP_CHUNK", 512 << 10)
    big = filled(vmm, 3 * G, 3)          # 12 blocks of 512 KiB
    small = filled(vmm, 256 << 10, 4)    # one block: only the bytes asked for are kept
    pinned = emu.live_allocations()
    rt = hmr._hip.get_runtime()
    real, made = rt.fn.hipHostMalloc, []

    def seventh_fails(out, size, flags):
        made.append(size)
        return 2 if len(made) == 7 else real(out, size, flags)
    monkeypatch.setattr(rt.fn, "hipHostMalloc", seventh_fails)
    with pytest.raises(OutOfMemoryError):
        vmm.pause()
    monkeypatch.setattr(rt.fn, "hipHostMalloc", real)
    assert emu.live_allocations() == pinned and not vmm.paused()
    assert vmm.pause() == 4 * G
    assert len(vmm._regions[big.ptr].backup) == 12 and len(vmm._regions[small.ptr].backup) == 1
    assert vmm.resume() == 4 * G
    assert big.tobytes() == pattern(3, 3 * G) and small.tobytes() == pattern(4, 256 << 10)


# ---- pinned blocks kept between pauses ---------------------------------------------------
def test_later_pauses_reuse_the_pinned_blocks(vmm, emu, monkeypatch):
    """The first pause allocates the backup's blocks; the resume keeps them, and every later
    pause copies into them: no hipHostMalloc, no hipHostFree, the same host memory held, and
    the bytes of each cycle (changed in between) come back exactly."""
    from hipmr_ctypes.resources import virtual
    monkeypatch.setattr(virtual, "BACKUP_CHUNK", 512 << 10)
    big = filled(vmm, 3 * G + 100 * 1024, 1, tag="w")   # 12 full blocks and a 100 KiB one
    small = filled(vmm, 256 << 10, 2, tag="w")
    kv = filled(vmm, MiB, 3, tag="kv")                    # dropped: never any block
    held = 3 * G + 100 * 1024 + (256 << 10)
    assert vmm.backup_bytes == 0
    rt = hmr._hip.get_runtime()
    calls = spy_runtime_calls(monkeypatch, rt, "hipHostMalloc", "hipHostFree")
    pinned = emu.live_allocations()
    assert vmm.pause("w") == 5 * G and vmm.pause("kv", backup=False) == G
    assert calls == ["hipHostMalloc"] * 14 and vmm.backup_bytes == held
    assert vmm.resume() == 6 * G
    assert big.tobytes() == pattern(1, 3 * G + 100 * 1024)
    assert small.tobytes() == pattern(2, 256 << 10)
    assert vmm.backup_bytes == held and emu.live_allocations().bytes == pinned.bytes + held
    del calls[:]
    for cycle in range(3):
        big.copy_from_host(pattern(10 + cycle, 3 * G + 100 * 1024))
        small.copy_from_host(pattern(20 + cycle, 256 << 10))
        kv.fill(1)
        assert vmm.pause("w") == 5 * G and vmm.pause("kv", backup=False) == G
        assert vmm.backup_bytes == held
        assert vmm.resume() == 6 * G
        assert big.tobytes() == pattern(10 + cycle, 3 * G + 100 * 1024)
        assert small.tobytes() == pattern(20 + cycle, 256 << 10)
        assert kv.tobytes() == bytes(MiB)
    assert calls == [] and emu.live_allocations().bytes == pinned.bytes + held
    assert vmm.release_backup_memory() == held
    assert calls == ["hipHostFree"] * 14 and vmm.backup_bytes == 0
    assert vmm.release_backup_memory() == 0


def test_release_backup_memory_frees_exactly_the_spares(vmm, emu):
    a = filled(vmm, MiB, 1, tag="a")
    b = filled(vmm, 3 * MiB, 2, tag="b")
    pinned = emu.live_allocations()
    assert vmm.release_backup_memory() == 0
    vmm.pause()
    assert vmm.backup_bytes == 4 * MiB and vmm.release_backup_memory() == 0
    vmm.resume("a")                      # a's block is a spare, b's still its backup
    assert vmm.backup_bytes == 4 * MiB
    assert vmm.release_backup_memory() == MiB
    assert vmm.backup_bytes == 3 * MiB
    assert emu.live_allocations().bytes == pinned.bytes + 3 * MiB
    vmm.resume("b")
    assert a.tobytes() == pattern(1, MiB) and b.tobytes() == pattern(2, 3 * MiB)
    assert vmm.release_backup_memory() == 3 * MiB
    assert vmm.backup_bytes == 0 and emu.live_allocations() == pinned


def test_a_failed_host_free_keeps_the_block_as_a_spare(vmm, emu):
    bufs = [filled(vmm, MiB, i) for i in range(3)]
    vmm.pause()
    vmm.resume()
    pinned = emu.live_allocations()
    emu.inject_failure(code=1, calls="hipHostFree")
    with pytest.raises(HipError, match="hipHostFree"):
        vmm.release_backup_memory()
    assert vmm.backup_bytes == MiB       # the other two were freed
    assert emu.live_allocations().bytes == pinned.bytes - 2 * MiB
    assert vmm.release_backup_memory() == MiB and vmm.backup_bytes == 0
    assert [b.tobytes() for b in bufs] == [pattern(i, MiB) for i in range(3)]


@pytest.mark.parametrize("call", ["hipHostMalloc", "hipMemcpyAsync", "hipStreamSynchronize",
                                  "hipMemUnmap"])
def test_a_failure_while_taking_spares_loses_nothing(vmm, emu, monkeypatch, call):
    """A pause that takes spares for some allocations and fails (a new block for another
    cannot be had, a copy, the wait, an unmap): the bytes are intact, the spares it took are
    spares again, the blocks it allocated are freed, and the next pause works."""
    a = filled(vmm, MiB, 1)
    b = filled(vmm, MiB, 2)
    vmm.pause()
    vmm.resume()                         # two spares of 1 MiB
    c = filled(vmm, 3 * MiB, 3)          # needs a new block of 3 MiB
    pinned, held, free = emu.live_allocations(), vmm.backup_bytes, free_memory()
    rt = hmr._hip.get_runtime()
    real, seen = getattr(rt.fn, call), []

    def fails(*args):
        seen.append(args)
        if call == "hipMemUnmap" and len(seen) < 3:
            return real(*args)
        return 2 if len(seen) == (1 if call != "hipMemUnmap" else 3) else real(*args)
    monkeypatch.setattr(rt.fn, call, fails)
    with pytest.raises(HipError):
        vmm.pause()
    monkeypatch.setattr(rt.fn, call, real)
    if call == "hipMemUnmap":            # a and b paused, into the spares; c as it was
        assert [vmm._regions[x.ptr].paused for x in (a, b, c)] == [True, True, False]
        assert vmm.backup_bytes == held and not any(vmm._spares.values())
        vmm.resume()
    else:
        assert not vmm.paused() and free_memory() == free
        assert emu.live_allocations() == pinned and vmm.backup_bytes == held
        assert sorted(vmm._spares) == [MiB] and len(vmm._spares[MiB]) == 2
    assert vmm.pause() == 4 * G and vmm.backup_bytes == 5 * MiB
    assert vmm.resume() == 4 * G
    assert (a.tobytes(), b.tobytes(), c.tobytes()) == (pattern(1, MiB), pattern(2, MiB),
                                                       pattern(3, 3 * MiB))


def test_the_spares_go_with_the_resource(emu):
    """A resource the garbage collector takes frees its spare blocks."""
    pinned = emu.live_allocations()
    vmm = hmr.VirtualMemoryResource()
    buf = filled(vmm, 3 * MiB, 5)
    vmm.pause()
    vmm.resume()
    assert emu.live_allocations().bytes == pinned.bytes + 3 * MiB   # the spare
    del buf, vmm
    gc.collect()
    assert emu.live_allocations() == pinned


def test_an_interrupt_in_release_backup_memory_frees_them_all_first(vmm, emu, monkeypatch):
    bufs = [filled(vmm, MiB, i) for i in range(3)]
    vmm.pause()
    vmm.resume()
    pinned = emu.live_allocations()
    rt = hmr._hip.get_runtime()
    real = rt.fn.hipHostFree

    def interrupted(ptr):
        signal.raise_signal(signal.SIGINT)   # the handler runs once the spares are freed
        return real(ptr)
    monkeypatch.setattr(rt.fn, "hipHostFree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        vmm.release_backup_memory()
    assert vmm.backup_bytes == 0 and emu.live_allocations().count == pinned.count - 3
    assert [b.tobytes() for b in bufs] == [pattern(i, MiB) for i in range(3)]


def test_the_benchmark_script_runs(tmp_path):
    """scripts/bench_vmm.py end to end on the emulated platform (timings never asserted)."""
    import json
    import os
    import subprocess
    import sys
    from support import REPO
    out = tmp_path / "vmm.json"
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_vmm.py"),
                           "--sizes", "3MiB", "--rounds", "1", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())["results"][0]
    assert result["size"] == 3 * MiB and result["free_memory_gained"] == [2 * G] * 3
    assert result["backup_bytes_kept"] == 3 * MiB
    assert set(result["backup_share_of_pinned"]) == {"backup, new blocks", "backup, blocks kept"}
    assert "backup, blocks kept" in done.stdout
    assert all(v > 0 for row in result["gbs"].values() for v in row.values())
    assert "pinned copies" in done.stdout


def test_a_runtime_without_the_attribute_still_serves():
    """ROCm 5.2 has the calls (and its own hipMemAllocationProp layout) but not the device
    attribute: the resource asks the calls."""
    from hipmr_ctypes import _hip
    rt = _hip.create_runtime("emulated", {"HIPMR_EMULATED_VERSION": "5.2.3"})
    with process_runtime(rt):
        import ctypes
        assert rt.fn.hipDeviceGetAttribute(ctypes.c_int(), 89, 0) == 1
        vmm = hmr.VirtualMemoryResource()
        buf = filled(vmm, MiB, 6)
        assert vmm.pause() == G and vmm.resume() == G
        assert buf.tobytes() == pattern(6, MiB)
        del buf
    rt.emulator.reset()


def test_peers_get_access_too():
    """On two devices that can access each other, the memory of a resource on device 1 is
    readable and writable with device 0 current (and back after a resume)."""
    from hipmr_ctypes import _hip
    rt = _hip.create_runtime("emulated", {"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(rt):
        vmm = hmr.VirtualMemoryResource(1)
        assert [d.location.id for d in vmm._access] == [1, 0]
        buf = filled(vmm, MiB, 3)
        hmr.set_device(0)
        assert buf.tobytes() == pattern(3, MiB)
        vmm.pause()
        vmm.resume()
        out = bytearray(MiB)
        import ctypes
        rt.check(rt.fn.hipMemcpy((ctypes.c_char * MiB).from_buffer(out), buf.ptr, MiB, 2))
        assert bytes(out) == pattern(3, MiB)
        del buf
    rt.emulator.reset()


def test_an_ignored_interrupt_stays_ignored(vmm, monkeypatch):
    buf = filled(vmm, MiB, 2)
    rt = hmr._hip.get_runtime()
    real = rt.fn.hipMemUnmap

    def interrupted(ptr, size):
        signal.raise_signal(signal.SIGINT)
        return real(ptr, size)
    monkeypatch.setattr(rt.fn, "hipMemUnmap", interrupted)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert vmm.pause() == G
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(rt.fn, "hipMemUnmap", real)
    vmm.resume()
    assert buf.tobytes() == pattern(2, MiB)

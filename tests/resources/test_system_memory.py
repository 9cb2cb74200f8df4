"""APUs and unified memory: Device.integrated / pageable_memory_access, SystemMemoryResource,
SamHeadroomMemoryResource, their HIPMR_DEVICE_RESOURCE kinds, and the rows of info / check."""
import ctypes
import pickle

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._config import build, parse_spec
from hipmr_ctypes.resources.host import _live as host_live

from support import process_runtime


@pytest.fixture
def apu(emulator):
    """An emulated runtime whose device is an APU (pageable memory access), made current."""
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_APU": "1",
                                               "HIPMR_EMULATED_MEMORY": "256MiB"})
    with process_runtime(rt):
        yield rt


def test_a_discrete_device_is_neither_integrated_nor_pageable(emulator):
    dev = hmr.Device(0)
    assert dev.integrated is False and dev.pageable_memory_access is False


def test_an_apu_is_integrated_and_reaches_pageable_memory(apu):
    dev = hmr.Device(0)
    assert dev.integrated is True and dev.pageable_memory_access is True
    assert dev.attribute("integrated") == 1 and dev.attribute("pageable_memory_access") == 1


def test_the_emulated_apu_setting_is_checked():
    with pytest.raises(ValueError, match="HIPMR_EMULATED_APU"):
        _hip.create_runtime("emulated", env={"HIPMR_EMULATED_APU": "yes"})


def test_system_memory_needs_pageable_access(emulator):
    with pytest.raises(hmr.NotSupportedError, match="pageable memory access") as info:
        hmr.SystemMemoryResource()
    assert "ManagedMemoryResource" in str(info.value)
    with pytest.raises(hmr.NotSupportedError):
        hmr.SamHeadroomMemoryResource(0)


def test_system_memory_on_an_apu(apu):
    mr = hmr.SystemMemoryResource()
    assert mr.device == 0
    assert hmr.has_property(mr, hmr.device_accessible)
    assert hmr.has_property(mr, hmr.host_accessible)
    p = mr.allocate(10_000, 4096)
    assert p % 4096 == 0 and host_live[p] == 10_000
    ctypes.memset(p, 9, 10_000)                       # the host writes it directly
    mr.deallocate(p, 10_000, 4096)
    assert p not in host_live
    buf = hmr.Buffer.from_host(b"abc" * 1000, resource=mr)
    assert buf.tobytes() == b"abc" * 1000
    assert buf._memory_kind() == "managed"            # migrates on demand, like managed memory
    buf.prefetch()                                    # no error: prefetch moves system memory
    buf.close()
    assert mr == hmr.SystemMemoryResource(0) and hash(mr) == hash(hmr.SystemMemoryResource())
    assert pickle.loads(pickle.dumps(mr)) == mr
    assert repr(mr) == "SystemMemoryResource(device=0)"
    with pytest.raises(ValueError):
        mr.deallocate(p, 10_000, 4096)                # freed already: refused, no crash


def test_system_memory_refuses_bad_arguments(apu):
    with pytest.raises(TypeError):
        hmr.SystemMemoryResource("0")
    with pytest.raises(ValueError):
        hmr.SystemMemoryResource(3)
    with pytest.raises(TypeError):
        hmr.SamHeadroomMemoryResource(None)
    with pytest.raises(ValueError):
        hmr.SamHeadroomMemoryResource(-1)
    with pytest.raises(ValueError):
        hmr.SamHeadroomMemoryResource("lots")


def _advice_calls(monkeypatch, rt):
    calls = []
    real = rt.fn.hipMemAdvise
    monkeypatch.setattr(rt.fn, "hipMemAdvise",
                        lambda p, n, a, d: calls.append((p, n, a, d)) or real(p, n, a, d))
    return calls


def test_sam_headroom_splits_between_device_and_host(apu, monkeypatch):
    calls = _advice_calls(monkeypatch, apu)
    free = hmr.Device(0).memory_info()[0]
    mr = hmr.SamHeadroomMemoryResource(free - 4096)   # 4 KiB of device memory to give
    assert mr.headroom == free - 4096
    p = mr.allocate(10_000)
    assert calls == [(p, 4096, 3, 0), (p + 4096, 10_000 - 4096, 3, -1)]
    mr.deallocate(p, 10_000)
    calls.clear()
    everything = hmr.SamHeadroomMemoryResource(0)     # it all fits on the device
    p = everything.allocate(1000)
    assert calls == [(p, 768, 3, 0), (p + 768, 232, 3, -1)]   # rounded down to 256 bytes
    everything.deallocate(p, 1000)
    calls.clear()
    none = hmr.SamHeadroomMemoryResource("1GiB")      # more headroom than the device has
    p = none.allocate(1000)
    assert calls == [(p, 1000, 3, -1)]
    none.deallocate(p, 1000)
    assert repr(none) == "SamHeadroomMemoryResource(headroom=1073741824, device=0)"
    assert none == hmr.SamHeadroomMemoryResource(1 << 30) != everything
    assert pickle.loads(pickle.dumps(none)) == none


def test_sam_headroom_takes_a_fraction_of_the_device(apu):
    mr = hmr.SamHeadroomMemoryResource(0.5)
    assert mr.headroom == hmr.Device(0).memory_info()[1] // 2


def test_a_failed_advice_frees_the_allocation(apu):
    mr = hmr.SamHeadroomMemoryResource(0)
    before = dict(host_live)
    apu.emulator.inject_failure(999, calls="hipMemAdvise")
    with pytest.raises(hmr.HipError):
        mr.allocate(4096)
    assert host_live == before


def test_the_environment_names_them(apu):
    assert type(build(parse_spec("system"), 0)) is hmr.SystemMemoryResource
    sam = build(parse_spec("sam_headroom,headroom=1MiB"), 0)
    assert type(sam) is hmr.SamHeadroomMemoryResource and sam.headroom == 1 << 20
    pooled = build(parse_spec("system,pool=1MiB,statistics"), 0)
    assert type(pooled) is hmr.StatisticsResource
    with pytest.raises(ValueError, match="sam_headroom needs headroom=SIZE"):
        parse_spec("sam_headroom")
    with pytest.raises(ValueError, match="headroom is an option of sam_headroom only"):
        parse_spec("system,headroom=1GiB")


def test_info_and_check_show_them(apu, capsys):
    from hipmr_ctypes.__main__ import collect_info
    from hipmr_ctypes._selftest import check
    device = collect_info()["devices"][0]
    assert device["integrated"] is True and device["pageable_memory_access"] is True
    assert check() == 0
    out = capsys.readouterr().out
    assert "yes  SystemMemoryResource" in out and "yes  register_host" in out


def test_check_skips_system_memory_on_a_discrete_device(emulator, capsys):
    from hipmr_ctypes._selftest import check
    assert check() == 0
    assert "skipped  SystemMemoryResource: device 0 has no pageable memory access" in \
        capsys.readouterr().out


@pytest.mark.gpu
def test_system_memory_on_a_gpu(gpu_runtime):
    dev = hmr.Device(0)
    if not dev.pageable_memory_access:
        with pytest.raises(hmr.NotSupportedError):
            hmr.SystemMemoryResource()
        return
    mr = hmr.SystemMemoryResource()
    buf = hmr.Buffer.from_host(bytes(range(256)) * 4096, resource=mr)
    twin = hmr.Buffer(buf.size)
    twin.copy_from_device(buf)
    assert twin.tobytes() == bytes(range(256)) * 4096
    sam = hmr.SamHeadroomMemoryResource("1GiB")
    p = sam.allocate(1 << 20)
    sam.deallocate(p, 1 << 20)

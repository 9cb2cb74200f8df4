"""A machine without a GPU: host memory works with no library, with a library that sees no
device and with zero emulated devices; everything that needs a device raises NoDeviceError
with a hint, before any state changes."""
import gc
import warnings

import pytest


import hipmr_ctypes as hmr
from hipmr_ctypes import _hip

from support import process_runtime

pytestmark = pytest.mark.any_platform  # each test chooses its runtime


@pytest.fixture(params=["emulated", "amd"])
def no_device(request, monkeypatch):
    """The process-wide runtime replaced by one that sees no device: zero emulated devices, or
    the real libamdhip64 on a machine without a GPU."""
    if request.param == "emulated":
        rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "0"})
    else:
        rt = request.getfixturevalue("amd_runtime")
        if rt.sees_device():
            pytest.skip("this machine has an AMD GPU")
    monkeypatch.setenv("HIPMR_PLATFORM", rt.platform)  # as if chosen at import
    with process_runtime(rt):
        yield rt


def test_runtime_reports_no_device(no_device):
    assert not no_device.sees_device()
    assert hmr.device_count() == 0


def test_host_memory_allocates_and_frees_in_stream_order(no_device):
    mr = hmr.HostMemoryResource()
    for _ in range(3):  # the first free finds out there is no device, the next ones know
        p = mr.allocate_async(4096, 256, 0)
        mr.deallocate_async(p, 4096, 256, 0)
    p = mr.allocate(64)
    mr.deallocate(p, 64)


def test_host_buffer_round_trip_close_and_collection(no_device):
    mr = hmr.HostMemoryResource()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed free in a finalizer is a warning
        buf = hmr.Buffer.from_host(b"hello", resource=mr)
        assert buf.tobytes() == b"hello"
        buf.close()
        assert buf.closed
        hmr.Buffer.from_host(b"dropped", resource=mr)
        gc.collect()


def test_pool_over_host_memory(no_device):
    pool = hmr.PoolResource(hmr.HostMemoryResource(), initial_pool_size=1 << 20)
    p = pool.allocate_async(256, 256, 0)
    pool.deallocate_async(p, 256, 256, 0)
    pool.release()


@pytest.mark.parametrize("make", [
    hmr.AsyncMemoryResource, hmr.DeviceMemoryResource, hmr.Stream, hmr.Event, hmr.Device,
    lambda: hmr.Buffer(16), hmr.get_current_device_resource, hmr.get_device,
], ids=["AsyncMemoryResource", "DeviceMemoryResource", "Stream", "Event", "Device", "Buffer",
        "get_current_device_resource", "get_device"])
def test_device_things_raise_no_device_error_with_hint(no_device, make):
    with pytest.raises(hmr.NoDeviceError) as info:
        make()
    text = str(info.value)
    assert "no device is visible" in text
    if no_device.platform == "emulated":
        assert "HIPMR_EMULATED_DEVICES" in text and "HIPMR_PLATFORM=emulated" not in text
    else:
        assert "HIPMR_PLATFORM=emulated" in text


def test_hint_says_the_platform_is_fixed_at_import(no_device, monkeypatch):
    other = "amd" if no_device.platform == "emulated" else "emulated"
    monkeypatch.setenv("HIPMR_PLATFORM", other)
    with pytest.raises(hmr.NoDeviceError) as info:
        hmr.Stream()
    assert "chosen once, when hipmr_ctypes is first imported" in str(info.value)
    assert f"({no_device.platform} is in use)" in str(info.value)


def test_no_device_error_is_picklable(no_device):
    import pickle
    with pytest.raises(hmr.NoDeviceError) as info:
        hmr.Stream()
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is hmr.NoDeviceError and str(again) == str(info.value)


def test_host_memory_with_no_library(monkeypatch):
    """A runtime that cannot load at all: host memory still allocates and frees."""
    previous = _hip.set_runtime(None)
    monkeypatch.setattr(_hip, "_error", hmr.LibraryNotFoundError("no library here"))
    monkeypatch.setattr(_hip, "_load_locked", lambda: None)
    try:
        with pytest.raises(hmr.LibraryNotFoundError):
            _hip.get_runtime()
        mr = hmr.HostMemoryResource()
        p = mr.allocate_async(128, 256, 0)
        mr.deallocate_async(p, 128, 256, 0)
        buf = hmr.Buffer.from_host(b"abc", resource=mr)
        assert buf.tobytes() == b"abc"
        buf.close()
    finally:
        monkeypatch.undo()
        _hip.set_runtime(previous)

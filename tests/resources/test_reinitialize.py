"""reinitialize and its hooks, is_initialized, enable/disable_logging, get_log_filenames and
available_device_memory: RMM's tests of them (test_rmm.py), in our names, plus our checks."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import initialization
from hipmr_ctypes.resources import per_device

from support import REPO, process_runtime

MiB = 1 << 20


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Each test starts with no per-device resource and no hook, and leaves things as found."""
    for variable in initialization.LOG_FILE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    hooks = list(initialization._hooks)
    initialization._hooks.clear()
    with process_runtime():
        yield
        for mr in per_device._resources.values():
            if isinstance(mr, hmr.LoggingResource):
                mr.close()
    initialization._hooks[:] = hooks


def round_trip(size=4096):
    data = bytes(i % 251 for i in range(size))
    with hmr.Buffer.from_host(data) as buf:
        assert buf.tobytes() == data


# ---- reinitialize --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("managed", [False, True])
@pytest.mark.parametrize("pool", [False, True])
def test_reinitialize_modes(managed, pool):
    assert hmr.reinitialize(pool_allocator=pool, managed_memory=managed) is None
    assert hmr.is_initialized()
    mr = hmr.get_current_device_resource()
    base = mr.upstream if pool else mr
    assert isinstance(mr, hmr.PoolResource) is pool
    assert isinstance(base, hmr.ManagedMemoryResource if managed else hmr.DeviceMemoryResource)
    round_trip()


def test_is_initialized():
    assert not hmr.is_initialized()
    hmr.reinitialize()
    assert hmr.is_initialized()
    assert type(hmr.get_per_device_resource(0)) is hmr.DeviceMemoryResource


@pytest.mark.gpu
def test_reinitialize_pool_sizes_as_ints_and_strings():
    hmr.reinitialize(pool_allocator=True, initial_pool_size=2 * MiB, maximum_pool_size="4MiB")
    mr = hmr.get_current_device_resource()
    assert mr.pool_size() == 2 * MiB and mr.maximum_pool_size == 4 * MiB
    hmr.reinitialize(pool_allocator=True, initial_pool_size="1 MiB")
    assert hmr.get_current_device_resource().pool_size() == MiB


@pytest.mark.gpu
def test_reinitialize_maximum_pool_size_is_enforced():
    hmr.reinitialize(pool_allocator=True, initial_pool_size="1MiB", maximum_pool_size="2MiB")
    keep = hmr.Buffer(MiB)
    with pytest.raises(hmr.OutOfMemoryError):
        hmr.Buffer(2 * MiB)
    keep.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(pool_allocator=True, initial_pool_size="4MiB", maximum_pool_size="2MiB"),
     r"initial_pool_size='4MiB' \(4194304 bytes\) is larger than maximum_pool_size='2MiB'"),
    (dict(pool_allocator=True, initial_pool_size="2k"), "Could not parse '2k'"),
    (dict(pool_allocator=True, maximum_pool_size="lots"), "Could not parse 'lots'"),
    (dict(initial_pool_size=-1), "initial_pool_size=-1 is negative"),
    (dict(initial_pool_size=1.5), "initial_pool_size: 1.5 as a fraction"),
    (dict(pool_allocator=True, maximum_pool_size="150%"), "maximum_pool_size: '150%'"),
    (dict(logging=True), "HIPMR_LOG_FILE or RMM_LOG_FILE"),
    (dict(logging=True, log_file_name=""), "not a file name"),
    (dict(devices=[]), "devices is empty"),
    (dict(devices=-1), "devices"),
    (dict(devices=[0, 7]), "devices"),
])
def test_reinitialize_refuses_bad_arguments_before_anything_changes(kwargs, match, emulator):
    mr = hmr.get_current_device_resource()
    ran = []
    hmr.register_reinitialize_hook(ran.append, "hook")
    with pytest.raises((ValueError, hmr.HipError), match=match):
        hmr.reinitialize(**kwargs)
    assert hmr.get_current_device_resource() is mr and ran == []


@pytest.mark.parametrize("kwargs", [dict(pool_allocator=1), dict(managed_memory="yes"),
                                    dict(logging=None), dict(devices="0"),
                                    dict(initial_pool_size=b"1"), dict(log_file_name=3,
                                                                      logging=True)])
def test_reinitialize_refuses_wrong_types(kwargs):
    with pytest.raises(TypeError):
        hmr.reinitialize(**kwargs)
    assert not hmr.is_initialized()


def test_reinitialize_failure_leaves_the_resources_as_they_were(emulator, tmp_path):
    hmr.reinitialize()
    mr = hmr.get_current_device_resource()
    with pytest.raises(hmr.OutOfMemoryError):   # more than the device has
        hmr.reinitialize(pool_allocator=True, initial_pool_size="64GiB")
    assert hmr.get_current_device_resource() is mr
    with pytest.raises(OSError):                # a log that cannot be opened
        hmr.reinitialize(logging=True, log_file_name=str(tmp_path / "no" / "such" / "dir.csv"))
    assert hmr.get_current_device_resource() is mr


def test_reinitialize_forgets_devices_not_listed_and_keeps_old_memory_valid():
    hmr.reinitialize(pool_allocator=True)
    old = hmr.get_current_device_resource()
    buf = hmr.Buffer.from_host(b"x" * 100)
    hmr.reinitialize()
    assert hmr.get_current_device_resource() is not old and buf.resource is old
    assert buf.tobytes() == b"x" * 100
    buf.close()


# ---- hooks ---------------------------------------------------------------------------------
@pytest.fixture
def make_reinit_hook():
    calls = []

    def make(name, *args, **kwargs):
        def hook(*a, **k):
            calls.append((name, a, k))
        hmr.register_reinitialize_hook(hook, *args, **kwargs)
        return hook

    make.calls = calls
    return make


def test_reinit_hooks_register(make_reinit_hook):
    make_reinit_hook("one", 1, x=2)
    make_reinit_hook("two")
    hmr.reinitialize()
    assert make_reinit_hook.calls == [("two", (), {}), ("one", (1,), {"x": 2})]  # newest first


def test_reinit_hooks_unregister(make_reinit_hook):
    one = make_reinit_hook("one")
    make_reinit_hook("two")
    hmr.unregister_reinitialize_hook(one)
    hmr.reinitialize()
    assert [c[0] for c in make_reinit_hook.calls] == ["two"]
    hmr.unregister_reinitialize_hook(one)   # not registered: nothing happens


def test_reinit_hooks_register_twice_and_unregister_all(make_reinit_hook):
    calls = make_reinit_hook.calls
    hook = make_reinit_hook("one", "a")
    hmr.register_reinitialize_hook(hook, "b")
    hmr.reinitialize()
    assert [c[1] for c in calls] == [("b",), ("a",)]
    hmr.unregister_reinitialize_hook(hook)
    calls.clear()
    hmr.reinitialize()
    assert calls == []


def test_register_returns_the_function_and_checks_it():
    @hmr.register_reinitialize_hook
    def hook():
        pass
    assert initialization._hooks[-1] == (hook, (), {})
    with pytest.raises(TypeError, match="callable"):
        hmr.register_reinitialize_hook(None)


def test_a_failing_hook_stops_reinitialize_before_anything_changes():
    hmr.reinitialize()
    mr = hmr.get_current_device_resource()

    def hook():
        raise RuntimeError("not now")

    hmr.register_reinitialize_hook(hook)
    with pytest.raises(RuntimeError, match="not now"):
        hmr.reinitialize(pool_allocator=True)
    assert hmr.get_current_device_resource() is mr


def test_a_hook_runs_before_the_resources_are_replaced():
    hmr.reinitialize()
    old = hmr.get_current_device_resource()
    seen = []
    hmr.register_reinitialize_hook(lambda: seen.append(hmr.get_current_device_resource()))
    hmr.reinitialize(pool_allocator=True)
    assert seen == [old]


# ---- logging -------------------------------------------------------------------------------
def read_log(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.gpu
def test_reinitialize_csv_log(tmp_path):
    name = tmp_path / "rmm_log.csv"
    hmr.reinitialize(logging=True, log_file_name=name)
    device = hmr.get_device()
    path = str(tmp_path / f"rmm_log.dev{device}.csv")
    assert hmr.get_log_filenames() == {device: path}
    round_trip(1000)
    hmr.get_current_device_resource().flush()
    rows = read_log(path)
    assert [r["Action"] for r in rows] == ["allocate", "free"]
    assert rows[0]["Size"] == "1000" and rows[0]["Pointer"] == rows[1]["Pointer"]


def test_log_file_name_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RMM_LOG_FILE", str(tmp_path / "from_rmm.txt"))
    hmr.reinitialize(logging=True)
    assert hmr.get_log_filenames() == {0: str(tmp_path / "from_rmm.dev0.txt")}
    monkeypatch.setenv("HIPMR_LOG_FILE", str(tmp_path / "ours"))   # ours first; .csv added
    hmr.reinitialize(logging=True)
    assert hmr.get_log_filenames() == {0: str(tmp_path / "ours.dev0.csv")}


@pytest.mark.gpu
def test_enable_disable_logging(tmp_path):
    device = hmr.get_device()
    base = hmr.get_current_device_resource()
    hmr.enable_logging(log_file_name=tmp_path / "run.csv")
    path = str(tmp_path / f"run.dev{device}.csv")
    assert hmr.get_log_filenames() == {device: path}
    logged = hmr.get_current_device_resource()
    assert isinstance(logged, hmr.LoggingResource) and logged.upstream is base
    hmr.enable_logging(log_file_name=tmp_path / "other.csv")   # already logging: unchanged
    assert hmr.get_current_device_resource() is logged
    round_trip(300)
    hmr.disable_logging()
    assert hmr.get_current_device_resource() is base
    assert hmr.get_log_filenames() == {device: None}
    round_trip(500)                       # not logged any more
    assert [r["Size"] for r in read_log(path)] == ["300", "300"]
    hmr.disable_logging()                 # nothing to undo
    assert hmr.get_current_device_resource() is base


def test_enable_logging_needs_a_name():
    with pytest.raises(ValueError, match="log file name"):
        hmr.enable_logging()
    assert not hmr.is_initialized()
    with pytest.raises(TypeError, match="log_file_name"):
        hmr.enable_logging(42)


def test_buffers_made_while_logging_free_through_the_log_after_disable(tmp_path):
    hmr.enable_logging(tmp_path / "a.csv")
    buf = hmr.Buffer(64)
    hmr.disable_logging()
    buf.close()
    buf.resource.flush()
    rows = read_log(tmp_path / "a.dev0.csv")
    assert [r["Action"] for r in rows] == ["allocate", "free"]


# ---- available_device_memory -----------------------------------------------------------------
@pytest.mark.gpu
def test_available_device_memory():
    free, total = hmr.available_device_memory()
    assert 0 < free <= total
    assert hmr.available_device_memory(hmr.get_device())[1] == total
    assert hmr.available_device_memory(hmr.Device())[1] == total
    with hmr.Buffer(64 * MiB):
        assert hmr.available_device_memory()[1] == total


def test_available_device_memory_sees_an_allocation(emulator):
    free, total = hmr.available_device_memory()
    with hmr.Buffer(64 * MiB):
        assert hmr.available_device_memory()[0] <= free - 64 * MiB
    assert hmr.available_device_memory() == (free, total)
    with pytest.raises(ValueError):
        hmr.available_device_memory(5)
    with pytest.raises(TypeError):
        hmr.available_device_memory("0")


# ---- two devices ---------------------------------------------------------------------------
_TWO = textwrap.dedent(r"""
    import json, os, sys
    import hipmr_ctypes as hmr
    out = {}
    log = os.path.join(sys.argv[1], "two.csv")
    hmr.reinitialize(pool_allocator=True, initial_pool_size="1MiB", devices=[0, 1],
                     logging=True, log_file_name=log)
    out["names"] = {str(k): os.path.basename(v) for k, v in hmr.get_log_filenames().items()}
    out["types"] = [type(hmr.get_per_device_resource(d).upstream).__name__ for d in (0, 1)]
    out["devices"] = [hmr.get_per_device_resource(d).upstream.upstream.device for d in (0, 1)]
    for d in (0, 1):
        with hmr.Device(d):
            b = hmr.Buffer.from_host(b"z" * (100 + d))
            assert b.device == d and b.tobytes() == b"z" * (100 + d)
            b.close()
    out["current"] = hmr.get_device()
    hmr.reinitialize(devices=1)
    out["after"] = sorted(hmr.get_log_filenames())
    out["default0"] = type(hmr.get_per_device_resource(0)).__name__
    sizes = []
    for d in (0, 1):
        with open(os.path.join(sys.argv[1], f"two.dev{d}.csv")) as f:
            sizes.append([line.split(",")[4] for line in f.read().splitlines()[1:]])
    out["sizes"] = sizes
    print(json.dumps(out))
""")


def test_reinitialize_over_two_devices(tmp_path):
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               HIPMR_EMULATED_MEMORY="64MiB", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _TWO, str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["names"] == {"0": "two.dev0.csv", "1": "two.dev1.csv"}
    assert out["types"] == ["PoolResource", "PoolResource"] and out["devices"] == [0, 1]
    assert out["current"] == 0                        # the current device is restored
    assert out["after"] == [1] and out["default0"] == "DeviceMemoryResource"
    assert out["sizes"] == [["100", "100"], ["101", "101"]]

"""hipmr_ctypes.interop.dask against a real distributed.LocalCluster (two worker processes on the
emulated platform, two emulated devices, one per worker): the plugin's set-up, Buffers passed
worker to worker and back, statistics, refused settings and a restarted worker.

Needs ``distributed`` (``pip install distributed``): skipped without it, except under
HIPMR_REQUIRE_TOOLS=1 (CI), where its absence fails."""
from __future__ import annotations

import importlib.util
import os
import re
import time

import pytest

import hipmr_ctypes as hmr
from support import REPO


if importlib.util.find_spec("distributed") is None:
    if os.environ.get("HIPMR_REQUIRE_TOOLS") == "1":
        raise ImportError("distributed is required (HIPMR_REQUIRE_TOOLS=1) but missing: "
                          "pip install distributed")
    pytest.skip("distributed not installed (pip install distributed)", allow_module_level=True)

import distributed  # noqa: E402
from distributed.protocol import deserialize, serialize  # noqa: E402

from hipmr_ctypes.interop import dask as hdask  # noqa: E402
from hipmr_ctypes.interop.dask import ResourceSetup  # noqa: E402

TIMEOUT = 120   # seconds any one wait on the cluster may take (a hang fails, never blocks CI)


# ---- settings: refused at construction, before any worker is touched ---------------------------
@pytest.mark.parametrize("kwargs, error, words", [
    (dict(pool_allocator=1), TypeError, "pool_allocator must be a bool"),
    (dict(statistics="yes"), TypeError, "statistics must be a bool"),
    (dict(pool_allocator=True, initial_pool_size="lots"), ValueError, "Could not parse"),
    (dict(pool_allocator=True, initial_pool_size=-1), ValueError, "initial_pool_size"),
    (dict(pool_allocator=True, initial_pool_size=1.5), ValueError, "fraction"),
    (dict(pool_allocator=True, initial_pool_size="150%"), ValueError, "fraction"),
    (dict(pool_allocator=True, initial_pool_size=True), TypeError, "not bool"),
    (dict(pool_allocator=True, initial_pool_size="2MiB", maximum_pool_size="1MiB"),
     ValueError, "larger than"),
    (dict(pool_allocator=True, initial_pool_size=0.6, maximum_pool_size="50%"),
     ValueError, "larger than"),
    (dict(initial_pool_size="1MiB"), ValueError, "needs pool_allocator=True"),
    (dict(maximum_pool_size="1MiB"), ValueError, "needs pool_allocator=True"),
    (dict(release_threshold="1MiB"), ValueError, "needs async_allocator=True"),
    (dict(async_allocator=True, pool_allocator=True), ValueError, "cannot be combined"),
    (dict(async_allocator=True, managed_memory=True), ValueError, "cannot be combined"),
    (dict(devices=[0, 1]), TypeError, "one device ordinal"),
    (dict(devices=-1), ValueError, "not a device ordinal"),
    (dict(logging=True), ValueError, "logging needs log_directory"),
    (dict(log_directory=3), TypeError, "log_directory must be a str"),
    (dict(log_file_name=""), ValueError, "not a file name"),
])
def test_bad_settings_are_refused(kwargs, error, words):
    with pytest.raises(error, match=words):
        ResourceSetup(**kwargs)


def test_good_settings_are_kept(tmp_path):
    p = ResourceSetup(async_allocator=True, initial_pool_size="25%", maximum_pool_size=0.5,
                      release_threshold="1MiB", log_file_name=str(tmp_path / "run.csv"))
    assert p.logging and p.log_directory == str(tmp_path) and p.log_stem == "run"
    assert isinstance(p, distributed.WorkerPlugin)

    class Worker:
        name = "tcp://127.0.0.1:4000"
    label = hdask._worker_label(Worker())
    assert label.startswith("tcp_127.0.0.1_4000-")
    assert p.log_file_for(Worker()) == str(tmp_path / f"run.{label}.csv")
    assert ResourceSetup().log_file_for(Worker()) is None
    assert ResourceSetup(devices=3).device_for(Worker()) == 3


def test_each_worker_name_has_a_file_of_its_own():
    """Names that a lossy cleaning maps to one string, names that differ only in case (one
    file on a case-insensitive file system), long names that differ at the end, names of
    other types: one log file each; int names keep their digits."""
    class Worker:
        def __init__(self, name, address="tcp://127.0.0.1:1"):
            self.name, self.address = name, address
    names = ["gpu/0", "gpu:0", "gpu 0", "gpu_0", "GPU_0", "gpu_0_", "_gpu_0", ".gpu_0", "0",
             "gpu\\0", "gpu/../0", "x" * 300 + "a", "x" * 300 + "b", ("gpu", 0), 3.0, "\udcff",
             "\u00e9", "e\u0301", ""]
    labels = [hdask._worker_label(Worker(n)) for n in names]
    assert len({label.casefold() for label in labels}) == len(names), labels
    for label in labels:
        assert re.fullmatch(r"[A-Za-z0-9_.-]{1,90}", label) and not label.startswith(".")
    assert hdask._worker_label(Worker(0)) == "0" and hdask._worker_label(Worker(7)) == "7"
    assert hdask._worker_label(Worker("0")) != "0"      # the str "0" is not the int 0
    assert hdask._worker_label(Worker("gpu/0")) == hdask._worker_label(Worker("gpu/0"))
    # with no name, the address names the worker (two addresses: two files)
    assert (hdask._worker_label(Worker(None, "tcp://10.0.0.1:1"))
            != hdask._worker_label(Worker(None, "tcp://10.0.0.1_1")))


@pytest.fixture
def two_devices(emulator):
    from hipmr_ctypes import _hip
    from support import process_runtime
    rt = _hip.create_runtime("emulated", env={"HIPMR_EMULATED_DEVICES": "2"})
    with process_runtime(rt):
        yield rt


def test_the_workers_device(monkeypatch, two_devices):
    """devices=None: LocalCluster's int names spread workers over the devices; on a real
    platform a worker that sees its own GPU first (dask-cuda's CUDA_VISIBLE_DEVICES) uses
    device 0; any other worker device 0."""
    class Worker:
        def __init__(self, name):
            self.name = name
    plugin = ResourceSetup()
    count = hmr.device_count()
    assert count == 2
    for variable in hdask.VISIBLE_DEVICES_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert [plugin.device_for(Worker(i)) for i in range(3)] == [i % count for i in range(3)]
    assert plugin.device_for(Worker("tcp://10.0.0.1:1234")) == 0
    assert plugin.device_for(Worker(True)) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0,1,2")
    assert plugin.device_for(Worker(count + 1)) == (count + 1) % count   # emulated: names
    monkeypatch.setattr(hmr.device, "platform", lambda: "nvidia")
    assert plugin.device_for(Worker(count + 1)) == 0                       # real: its own GPU
    assert ResourceSetup(devices=2).device_for(Worker(1)) == 2


def test_the_package_pickles_by_name():
    """A task defined in __main__ or a notebook is sent by value, with the modules its globals
    name: the package (a module of its own type) goes by name, as a plain module does."""
    import pickle

    import cloudpickle
    assert pickle.loads(pickle.dumps(hmr)) is hmr

    def task():
        return hmr.device_count()
    task.__module__ = "__main__"              # what cloudpickle sends by value
    assert cloudpickle.loads(cloudpickle.dumps(task))() == hmr.device_count()


# ---- serialization in this process -------------------------------------------------------------
def test_dask_family_is_the_host_path():
    buf = hmr.Buffer.from_host(bytes(range(256)) * 4)
    header, frames = serialize(buf, serializers=["dask"])
    assert header["serializer"] == "dask" and len(frames) == 1
    assert bytes(frames[0]) == buf.tobytes()
    back = deserialize(header, frames)
    assert isinstance(back, hmr.Buffer) and back is not buf and back.tobytes() == buf.tobytes()


def test_cuda_family_moves_the_buffer_itself():
    buf = hmr.Buffer.from_host(b"\x07" * 1000)
    header, frames = serialize(buf, serializers=["cuda"])
    assert header["serializer"] == "cuda" and frames == [buf]
    assert header["sub-header"]["shape"] == (1000,)
    assert deserialize(header, frames) is buf                # the frame is already ours

    class Foreign:   # a device frame another library allocated (what UCX hands over)
        def __init__(self, src):
            self.src = src
            self.__cuda_array_interface__ = src.__cuda_array_interface__
    other = deserialize(header, [Foreign(hmr.Buffer.from_host(b"\x09" * 1000))])
    assert isinstance(other, hmr.Buffer) and other.tobytes() == b"\x09" * 1000
    host = deserialize(header, [memoryview(b"\x05" * 1000)])   # staged through the host
    assert isinstance(host, hmr.Buffer) and host.tobytes() == b"\x05" * 1000
    with pytest.raises(ValueError, match="1000 bytes arrived"):    # a frame of another size
        deserialize(header, [Foreign(hmr.Buffer.from_host(b"\x09" * 999))])
    with pytest.raises(ValueError, match="1000 bytes arrived"):
        deserialize(header, [memoryview(b"\x05" * 1001)])
    dask_header, frames = serialize(buf, serializers=["dask"])
    with pytest.raises(ValueError, match="1000 bytes arrived"):
        deserialize(dask_header, [b"\x01" * 10])


def test_host_only_buffers_fall_back_to_the_dask_family():
    buf = hmr.Buffer.from_host(b"abc" * 100, resource=hmr.HostMemoryResource())
    header, frames = serialize(buf, serializers=["cuda", "dask"])
    assert header["serializer"] == "dask"
    assert deserialize(header, frames).tobytes() == b"abc" * 100


# ---- a real cluster ----------------------------------------------------------------------------
def _wait(predicate, what):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {TIMEOUT} s waiting for {what}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two worker processes, one thread each, on the emulated platform with two devices."""
    logs = tmp_path_factory.mktemp("dask-logs")
    saved = {k: os.environ.get(k) for k in ("HIPMR_PLATFORM", "HIPMR_EMULATED_DEVICES",
                                            "HIPMR_EMULATED_MEMORY", "PYTHONPATH")}
    os.environ.update(HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
                      HIPMR_EMULATED_MEMORY="256MiB",
                      PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), saved["PYTHONPATH"]])))
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None, worker_dashboard_address=None,
                                      scheduler_port=0, silence_logs=40,
                                      death_timeout=TIMEOUT) as lc, \
                distributed.Client(lc, timeout=TIMEOUT) as client:
            client.wait_for_workers(2, timeout=TIMEOUT)
            yield lc, client, logs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _by_name(client):
    """{worker name: address}"""
    info = client.scheduler_info()["workers"]
    return {w["name"]: addr for addr, w in info.items()}


def _describe():
    """What a worker has (run on the worker)."""
    from hipmr_ctypes.interop import dask as d
    device = d.worker_device()
    mr = hmr.get_per_device_resource(device)
    return {"device": device, "platform": hmr.platform(), "devices": hmr.device_count(),
            "resource": repr(mr), "installed": d._installed.get("resource") is mr,
            "pid": os.getpid()}


def _default_resources():
    return [repr(hmr.get_per_device_resource(i)) for i in range(hmr.device_count())]


def test_a_bad_setting_leaves_the_workers_untouched(cluster):
    _, client, _ = cluster
    before = client.run(_default_resources)
    with pytest.raises(ValueError):
        client.register_plugin(ResourceSetup(pool_allocator=True, initial_pool_size="lots"))
    assert client.run(_default_resources) == before
    assert all("DeviceMemoryResource" in r[0] for r in before.values())
    # a setting only a worker can refuse (no such device there): raised here, nothing changed
    with pytest.raises(ValueError, match="device 5 does not exist"):
        client.register_plugin(ResourceSetup(devices=5))
    assert client.run(_default_resources) == before


def test_plugin_sets_up_each_worker_on_its_own_device(cluster):
    lc, client, logs = cluster
    client.register_plugin(ResourceSetup(pool_allocator=True, initial_pool_size="1MiB",
                                         maximum_pool_size="50%", statistics=True,
                                         tracking=True, log_directory=str(logs)))
    names = _by_name(client)
    assert sorted(names) == [0, 1]
    seen = client.run(_describe)
    for name, addr in names.items():
        info = seen[addr]
        assert info["platform"] == "emulated" and info["devices"] == 2
        assert info["pid"] != os.getpid()                  # a process of its own
        assert info["device"] == name and info["installed"]
        assert info["resource"].startswith("StatisticsResource(TrackingResource(LoggingResource("
                                           "PoolResource(DeviceMemoryResource(device=%d)" % name)
        assert "maximum_pool_size=134217728" in info["resource"]   # 50% of 256 MiB
    assert sorted(p.name for p in logs.iterdir()) == ["hipmr_log.0.csv", "hipmr_log.1.csv"]


def _make(seed, size):
    return hmr.Buffer.from_host(bytes((i * 7 + seed) & 0xFF for i in range(size)))


def _transform(buf):
    """On the other worker: the Buffer arrived as a Buffer of this worker's device and
    resource; returns a new one with every byte + 1, and where it was."""
    from hipmr_ctypes.interop import dask as d
    device = d.worker_device()
    assert isinstance(buf, hmr.Buffer)
    assert buf.device == device and buf.resource is d._installed["resource"]
    out = hmr.Buffer.from_host(bytes((b + 1) & 0xFF for b in buf.tobytes()))
    return out, device


def test_buffers_travel_worker_to_worker_and_back(cluster):
    _, client, _ = cluster
    names = _by_name(client)
    size = 100_000
    made = client.submit(_make, 3, size, workers=[names[0]], pure=False)
    moved = client.submit(_transform, made, workers=[names[1]], pure=False)
    out, device = moved.result(timeout=TIMEOUT)
    expected = bytes(((i * 7 + 3) & 0xFF) + 1 & 0xFF for i in range(size))
    assert device == 1
    assert isinstance(out, hmr.Buffer) and out.size == size and out.tobytes() == expected
    back = made.result(timeout=TIMEOUT)               # worker 0's Buffer, to the client
    assert isinstance(back, hmr.Buffer)
    assert back.tobytes() == bytes((i * 7 + 3) & 0xFF for i in range(size))
    # and from the client to a worker
    sent = client.scatter(hmr.Buffer.from_host(b"\x42" * 4096), workers=[names[1]])
    got = client.submit(lambda b: (type(b).__name__, b.device, b.tobytes()[:2]), sent,
                        workers=[names[1]], pure=False).result(timeout=TIMEOUT)
    assert got == ("Buffer", 1, b"\x42\x42")
    del made, moved, sent


def _where_am_i(pause, switch_to=None):
    """A task that never calls worker_device(): which thread, which device is current, and
    whether a Buffer comes from the plugin's resource; ``switch_to`` changes the device
    afterwards (the next task on this thread must not inherit it)."""
    import threading

    from hipmr_ctypes.interop import dask as d
    time.sleep(pause)
    buf = hmr.Buffer(4096)
    seen = (threading.get_ident(), hmr.get_device(), buf.device,
            buf.resource is d._installed.get("resource"))
    buf.close()
    if switch_to is not None:
        hmr.set_device(switch_to)
    return seen


def test_every_task_runs_on_its_workers_device(cluster):
    _, client, _ = cluster
    names = _by_name(client)
    for name in (0, 1):
        other = 1 - name
        futures = [client.submit(_where_am_i, 0, other, workers=[names[name]], pure=False)
                   for _ in range(6)]
        seen = client.gather(futures)
        assert all(s[1:] == (name, name, True) for s in seen), seen


def test_every_task_thread_of_a_worker_sees_its_device():
    """One worker, three task threads, device 1 (of two): every task on every thread allocates
    on device 1 from the plugin's pool, with no worker_device() call."""
    saved = {k: os.environ.get(k) for k in ("HIPMR_PLATFORM", "HIPMR_EMULATED_DEVICES",
                                            "PYTHONPATH")}
    os.environ.update(HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
                      PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), saved["PYTHONPATH"]])))
    try:
        with distributed.LocalCluster(n_workers=1, threads_per_worker=3, processes=True,
                                      dashboard_address=None, worker_dashboard_address=None,
                                      scheduler_port=0, silence_logs=40,
                                      death_timeout=TIMEOUT) as lc, \
                distributed.Client(lc, timeout=TIMEOUT) as client:
            client.wait_for_workers(1, timeout=TIMEOUT)
            client.register_plugin(ResourceSetup(devices=1, pool_allocator=True))
            futures = [client.submit(_where_am_i, 0.3, 0, pure=False) for _ in range(12)]
            seen = client.gather(futures)
            assert len({s[0] for s in seen}) >= 2, seen          # several task threads
            assert all(s[1:] == (1, 1, True) for s in seen), seen
            # unregistering puts the executors back: tasks run where the thread is
            client.unregister_worker_plugin(ResourceSetup.name)
            after = client.submit(lambda: hmr.get_device(), pure=False).result(TIMEOUT)
            assert after in (0, 1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_statistics_of_every_worker_in_one_call(cluster):
    lc, client, _ = cluster
    names = _by_name(client)
    keep = [client.submit(_make, i, 5000 + i, workers=[names[i]], pure=False) for i in (0, 1)]
    distributed.wait(keep, timeout=TIMEOUT)
    stats = hdask.statistics(client)
    assert set(stats) == set(names.values())
    for name, addr in names.items():
        s = stats[addr]
        assert isinstance(s, hmr.Statistics)
        assert s.total_count >= 1 and s.peak_bytes >= 5000 + name
        assert s.current_bytes >= 5000 + name     # the task's result is still held
    # the heartbeat metrics the scheduler keeps per worker (what the dashboard reads)
    def metrics():
        ws = lc.scheduler.workers
        got = {a: ws[a].metrics.get("hipmr") for a in names.values() if a in ws}
        return got if len(got) == 2 and all(m and m["statistics"] for m in got.values()) \
            else None
    seen = _wait(metrics, "the workers' hipmr metrics")
    for name, addr in names.items():
        assert seen[addr]["device"] == name and seen[addr]["held"] >= 1 << 20
        rmm = lc.scheduler.workers[addr].metrics["rmm"]
        assert rmm["rmm-total"] >= rmm["rmm-used"] >= 0
    with pytest.raises(TypeError):
        hdask.statistics(object())
    del keep


def test_a_restarted_worker_gets_the_plugin_again(cluster):
    _, client, _ = cluster
    names = _by_name(client)
    pid = client.run(os.getpid, workers=[names[1]])[names[1]]
    client.restart_workers([names[1]], timeout=TIMEOUT)
    client.wait_for_workers(2, timeout=TIMEOUT)
    after = _wait(lambda: _by_name(client) if len(_by_name(client)) == 2 else None,
                  "two workers after the restart")
    info = client.run(_describe, workers=[after[1]])[after[1]]
    assert info["pid"] != pid
    assert info["device"] == 1 and info["installed"]
    assert info["resource"].startswith("StatisticsResource(")
    s = hdask.statistics(client)[after[1]]
    assert isinstance(s, hmr.Statistics)


def test_the_docs_example_runs(tmp_path):
    """docs/scale.md's Dask example, as a script, with two emulated devices."""
    import re
    import subprocess
    import sys
    text = (REPO / "docs" / "scale.md").read_text()
    section = text[text.index("### Dask: `hipmr_ctypes.interop.dask`"):]
    code = re.search(r"^```text\n(.*?)^```", section, re.S | re.M).group(1)
    assert "ResourceSetup(" in code and "statistics(client)" in code
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT * 2)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("Statistics(current_bytes=") == 2, done.stdout
    assert len(list((tmp_path / "logs").iterdir())) == 2


# ---- the GPU: one worker -----------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_one_worker(gpu_runtime):
    """One worker process with the real GPU: an async pool starting at 1% of its memory, Buffers
    to the worker and back, statistics."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None, worker_dashboard_address=None,
                                  scheduler_port=0, silence_logs=40) as lc, \
            distributed.Client(lc, timeout=TIMEOUT) as client:
        client.register_plugin(ResourceSetup(async_allocator=True, initial_pool_size="1%",
                                             release_threshold="1GiB", statistics=True))
        info = client.run(_describe)
        (addr, seen), = info.items()
        assert seen["platform"] == gpu_runtime.platform and seen["device"] == 0
        assert seen["resource"].startswith("StatisticsResource(AsyncMemoryResource(")
        data = bytes(range(256)) * 4096
        sent = client.scatter(hmr.Buffer.from_host(data))
        out = client.submit(_transform, sent, pure=False).result(timeout=TIMEOUT)[0]
        assert out.tobytes() == bytes((b + 1) & 0xFF for b in data)
        s = hdask.statistics(client)[addr]
        assert s is not None and s.total_bytes >= 2 * len(data)

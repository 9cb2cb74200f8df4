"""HIPMR_DEVICE_RESOURCE: the per-device default resource from the environment, read at the
first use of a device's resource; a bad spec is one clear error, never a silent default."""
import os
import subprocess
import sys
import threading

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _config
from hipmr_ctypes._config import VARIABLE, build, describe, parse_spec
from hipmr_ctypes._sizes import DeviceFraction
from hipmr_ctypes.resources import per_device
from support import REPO

MiB = 1 << 20


def test_specs_parse():
    spec = parse_spec("device,pool=50%:90%,statistics,log=/tmp/run.csv")
    assert spec.kind == "device" and spec.flags == ["statistics"] and spec.log == "/tmp/run.csv"
    assert spec.pool == (DeviceFraction(0.5, "50%"), DeviceFraction(0.9, "90%"))
    spec = parse_spec(" Async , release_threshold = 80% , pool=4MiB:1GiB, tracking")
    assert spec.kind == "async" and spec.sizes == {"release_threshold": DeviceFraction(0.8, "")}
    assert spec.pool == (4 * MiB, 1 << 30) and spec.flags == ["tracking"]
    assert parse_spec("managed,pool").pool == (None, None)
    assert parse_spec("device,pool=1GiB").pool == (1 << 30, None)
    assert parse_spec("device,limit=0.5").sizes == {"limit": DeviceFraction(0.5, "")}


@pytest.mark.parametrize("text, part, problem", [
    ("gpu", "'gpu'", "the first part is the kind"),
    ("", "''", "the first part is the kind"),
    ("device,pool=2k", "'pool=2k'", "single-letter unit"),
    ("device,pool=4MiB:2MiB", "'pool=4MiB:2MiB'", "larger than the maximum"),
    ("device,pool=1MiB:", "'pool=1MiB:'", "nothing after ':'"),
    ("device,release_threshold=1GiB", "'release_threshold=1GiB'", "an option of async and virtual_pool only"),
    ("device,limit", "'limit'", "needs a size"),
    ("device,limit=150%", "'limit=150%'", "must be in (0, 1]"),
    ("device,statistics=yes", "'statistics=yes'", "takes no value"),
    ("device,log=", "'log='", "needs a file name"),
    ("device,colour=red", "'colour=red'", "unknown option 'colour'"),
    ("device,statistics,statistics", "'statistics'", "given twice"),
    ("device,,statistics", "''", "an empty option"),
])
def test_bad_specs_name_the_variable_the_part_and_what_is_right(text, part, problem):
    with pytest.raises(ValueError) as info:
        parse_spec(text)
    message = str(info.value)
    assert message.startswith(f"{VARIABLE}={text!r}: {part}: ")
    assert problem in message
    assert ("expected a kind (device, async, managed, system, sam_headroom, virtual or "
            "virtual_pool) then "
            "options") in message


def test_bad_spec_type():
    with pytest.raises(TypeError, match=VARIABLE):
        parse_spec(None)  # type: ignore[arg-type]


def test_build_every_kind_and_option(tmp_path, emulator):
    total = hmr.Device().memory_info()[1]
    mr = build(parse_spec(f"device,pool=1%:50%,limit=40%,tracking,statistics,"
                          f"log={tmp_path / 'run.csv'}"), 0)
    assert isinstance(mr, hmr.LoggingResource)
    assert mr.get_file_name() == str(tmp_path / "run.dev0.csv")
    stats = mr.upstream
    assert isinstance(stats, hmr.StatisticsResource)
    tracking = stats.upstream
    assert isinstance(tracking, hmr.TrackingResource)
    limiting = tracking.upstream
    assert limiting.get_allocation_limit() == total * 2 // 5 // 256 * 256
    pool = limiting.upstream
    assert isinstance(pool, hmr.PoolResource)
    assert pool.maximum_pool_size == total // 2 // 256 * 256
    assert isinstance(pool.upstream, hmr.DeviceMemoryResource)
    buf = hmr.Buffer(MiB, resource=mr)
    assert stats.statistics.current_bytes == MiB
    buf.close()
    mr.close()
    asyncmr = build(parse_spec("async,release_threshold=50%,pool=1MiB:25%"), 0)
    assert asyncmr.pool.release_threshold == total // 2 // 256 * 256
    assert asyncmr.pool.max_size == total // 4 // 256 * 256
    asyncmr.close()
    assert isinstance(build(parse_spec("managed"), 0), hmr.ManagedMemoryResource)


def test_first_use_reads_the_variable_and_reinitialize_overrides(monkeypatch, emulator):
    previous = per_device._replace_all({})
    try:
        monkeypatch.setenv(VARIABLE, "device,pool=1MiB,statistics")
        mr = hmr.get_current_device_resource()
        assert isinstance(mr, hmr.StatisticsResource)
        assert isinstance(mr.upstream, hmr.PoolResource)
        assert hmr.get_current_device_resource() is mr      # read once per device
        hmr.reinitialize()                                    # explicit set-up wins
        assert isinstance(hmr.get_current_device_resource(), hmr.DeviceMemoryResource)
        per_device._replace_all({})
        monkeypatch.setenv(VARIABLE, "device,pool=2k")
        with pytest.raises(ValueError, match=f"{VARIABLE}='device,pool=2k'"):
            hmr.Buffer(1024)
        assert not per_device._resources                     # nothing half-made was kept
        monkeypatch.delenv(VARIABLE)
        assert isinstance(hmr.get_current_device_resource(), hmr.DeviceMemoryResource)
    finally:
        per_device._replace_all(previous)


def test_one_default_per_device_under_threads(monkeypatch, emulator):
    previous = per_device._replace_all({})
    made = []
    real = _config.default_resource

    def counting(device):
        made.append(device)
        return real(device)

    monkeypatch.setattr(_config, "default_resource", counting)
    monkeypatch.setenv(VARIABLE, "device,statistics")
    seen = []
    barrier = threading.Barrier(8)

    def first_use():
        barrier.wait()
        seen.append(hmr.get_per_device_resource(0))

    try:
        threads = [threading.Thread(target=first_use) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert made == [0] and len({id(r) for r in seen}) == 1
    finally:
        per_device._replace_all(previous)


def test_describe(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    assert describe()["source"] == "default"
    monkeypatch.setenv(VARIABLE, "async,tracking,log=x.csv")
    assert describe() == {"source": VARIABLE, "spec": "async,tracking,log=x.csv",
                          "detail": "LoggingResource <- TrackingResource <- "
                                    "AsyncMemoryResource"}
    monkeypatch.setenv(VARIABLE, "nope")
    assert "the first part is the kind" in describe()["error"]


def _cli(*args, **env):
    full = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "hipmr_ctypes", *args], env=full,
                          capture_output=True, text=True, timeout=120)


def test_info_shows_the_configuration_and_its_source():
    out = _cli("info", **{VARIABLE: "device,pool=10%:50%,statistics"}).stdout
    assert ("device resource: StatisticsResource <- PoolResource <- DeviceMemoryResource "
            f"(from {VARIABLE}='device,pool=10%:50%,statistics')") in out
    env = dict(os.environ)
    env.pop(VARIABLE, None)
    out = subprocess.run([sys.executable, "-m", "hipmr_ctypes", "info"], capture_output=True,
                         text=True, timeout=120,
                         env=dict(env, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO))).stdout
    assert f"device resource: DeviceMemoryResource per device ({VARIABLE} unset) " \
           "(the default)" in out
    bad = _cli("info", **{VARIABLE: "device,colour=red"})
    assert "device resource: invalid" in bad.stdout and "unknown option 'colour'" in bad.stdout
    assert bad.returncode == 2 and "unknown option 'colour'" in bad.stderr
    data = _cli("info", "--json", **{VARIABLE: "async"}).stdout
    assert '"device_resource"' in data and '"source": "HIPMR_DEVICE_RESOURCE"' in data


def test_check_builds_and_round_trips_the_configured_resource(tmp_path):
    done = _cli("check", **{VARIABLE: f"device,pool=1MiB,log={tmp_path / 'r.csv'}"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"yes  {VARIABLE}: " in done.stdout and "LoggingResource" in done.stdout
    bad = _cli("check", **{VARIABLE: "device,pool=2k"})
    assert bad.returncode == 2                  # a misconfiguration, as the epilog says
    assert f"error: {VARIABLE}='device,pool=2k': 'pool=2k': " in bad.stderr
    assert "Event timing" not in bad.stdout + bad.stderr   # no unrelated row blamed


@pytest.mark.parametrize("text, words", [
    ("device,pool=90%:50%", "'pool=90%:50%': the initial size 90% is larger than the maximum 50%"),
    ("device,pool=0.9:50%", "'pool=0.9:50%': the initial size 0.9 is larger than the maximum"),
    ("device,pool=90%:1MiB", "'pool=90%:1MiB': on device 0 the initial size"),
    ("async,pool=1e0:5e-1", "'pool=1e0:5e-1': the initial size 1e0 is larger"),
    ("device,limit=1.5e0", "'limit=1.5e0': Could not parse '1.5e0'"),
])
def test_fraction_sizes_are_checked_naming_the_variable_and_the_part(text, words, monkeypatch,
                                                                     emulator):
    from hipmr_ctypes._config import check_environment
    monkeypatch.setenv(VARIABLE, text)
    message = check_environment(1)
    assert message is not None and message.startswith(f"{VARIABLE}={text!r}: ")
    assert words in message
    # the first use raises the same, never from inside PoolResource
    with pytest.raises(ValueError) as info:
        build(parse_spec(text), 0)
    assert str(info.value).startswith(f"{VARIABLE}={text!r}: ") and words in str(info.value)


@pytest.mark.parametrize("command", ["info", "check"])
def test_info_and_check_exit_2_naming_the_real_cause(command, tmp_path):
    for text, words in [("device,pool=90%:50%", "larger than the maximum"),
                        (f"device,log={tmp_path / 'missing' / 'run.csv'}", "does not exist")]:
        done = _cli(command, **{VARIABLE: text})
        assert done.returncode == 2, (text, done.stdout, done.stderr)
        assert f"error: {VARIABLE}=" in done.stderr and words in done.stderr
        assert "Event timing" not in done.stderr
    done = _cli(command, "--json", **{VARIABLE: "device,pool=90%:50%"})
    assert done.returncode == 2 and "larger than the maximum" in done.stdout


def test_info_shows_a_log_into_a_missing_folder_as_an_error(tmp_path):
    done = _cli("info", **{VARIABLE: f"device,log={tmp_path / 'nowhere' / 'r.csv'}"})
    assert "  error: " in done.stdout and "does not exist" in done.stdout
    assert done.returncode == 2
    good = _cli("info", **{VARIABLE: f"device,log={tmp_path / 'r.csv'}"})
    assert good.returncode == 0 and "error" not in good.stdout


@pytest.mark.parametrize("first_import", ["hipmr_ctypes.resources.per_device",
                                          "hipmr_ctypes.resources", "hipmr_ctypes.buffer"])
def test_the_packages_default_factory_is_used_whatever_is_imported_first(first_import):
    """The resources layer never imports ``_config``: the table asks the package for its
    factory on the first default, so the variable is obeyed however the table is reached."""
    code = (f"import sys, importlib\n"
            f"importlib.import_module({first_import!r})\n"
            "from hipmr_ctypes.resources.per_device import get_per_device_resource\n"
            "assert 'hipmr_ctypes._config' not in sys.modules\n"
            "print(type(get_per_device_resource(0)).__name__)\n")
    env = dict(os.environ, HIPMR_PLATFORM="emulated", **{VARIABLE: "device,statistics"})
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["StatisticsResource"]


def test_a_factory_set_replaces_the_packages(monkeypatch, emulator):
    previous = per_device._replace_all({})
    monkeypatch.setattr(per_device, "_default_factory", hmr.DeviceMemoryResource)
    monkeypatch.setenv(VARIABLE, "device,statistics")   # only the registered factory reads it
    try:
        assert type(per_device.get_per_device_resource(0)) is hmr.DeviceMemoryResource
    finally:
        per_device._replace_all(previous)

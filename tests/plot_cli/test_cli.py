"""python -m hipmr_ctypes: info (text and JSON) on each platform, and with no library."""
import json
import os
import subprocess
import sys
import _ctypes

import pytest
from support import REPO

pytestmark = pytest.mark.any_platform  # every run names its own platform


def run(*args, **env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "hipmr_ctypes", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=600)


def test_info_emulated_shows_devices():
    out = run(HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2", HIPMR_EMULATED_MEMORY="64MiB")
    assert out.returncode == 0, out.stderr
    assert "platform: emulated" in out.stdout
    assert "devices: 2" in out.stdout
    assert "[1] HIPMR Emulated Device 1: 0.1 GiB total" in out.stdout
    assert "memory pools: yes" in out.stdout


def test_info_json_emulated():
    out = run("info", "--json", HIPMR_PLATFORM="emulated", HIPMR_EMULATED_MEMORY="1GiB")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["platform"] == "emulated" and report["loaded"] is True
    assert report["devices"][0]["memory_total"] == 1 << 30
    assert report["devices"][0]["memory_pools"] is True


def test_info_with_no_emulated_device():
    out = run(HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="0")
    assert out.returncode == 0
    assert "devices: none" in out.stdout and "hipErrorNoDevice" in out.stdout


CONFIG_ERRORS = [
    # (environment, words of the error line, words of the hint, words the hint must not have)
    ({"HIPMR_PLATFORM": "amdd"}, "HIPMR_PLATFORM='amdd'", "amd, nvidia or emulated", None),
    ({"HIPMR_PLATFORM": "amd", "HIPMR_LIBRARY": "/nonexistent/libamdhip64.so.5"},
     "/nonexistent/libamdhip64.so.5 (no such file)", "HIPMR_PLATFORM=emulated", None),
    ({"HIPMR_PLATFORM": "emulated", "HIPMR_EMULATED_DEVICES": "abc"},
     "HIPMR_EMULATED_DEVICES='abc'", "fix HIPMR_EMULATED_DEVICES", "HIPMR_PLATFORM=emulated"),
    ({"HIPMR_PLATFORM": "emulated", "HIPMR_EMULATED_MEMORY": "lots"},
     "HIPMR_EMULATED_MEMORY: Could not parse", "fix HIPMR_EMULATED_MEMORY", "HIPMR_PLATFORM=emulated"),
    ({"HIPMR_PLATFORM": "amd", "HIPMR_LIBRARY": _ctypes.__file__},  # a shared library, not HIP
     "is not a HIP runtime library", "point HIPMR_LIBRARY at libamdhip64", "too old"),
]


@pytest.mark.parametrize("command", [[], ["info"], ["check"], ["bench"], ["info", "--json"]])
@pytest.mark.parametrize("env,error,hint,not_in_hint", CONFIG_ERRORS,
                         ids=["platform", "library", "devices", "memory", "not-hip"])
def test_configuration_errors_exit_2_with_one_line_and_a_fitting_hint(command, env, error,
                                                                      hint, not_in_hint):
    out = run(*command, **env)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr  # the error and the hint; no traceback
    assert lines[0].startswith("python -m hipmr_ctypes: error: ") and error in lines[0]
    assert lines[1].startswith("hint: ") and hint in lines[1]
    if not_in_hint:
        assert not_in_hint not in lines[1]
    if "--json" in command:
        report = json.loads(out.stdout)
        assert report["loaded"] is False and error in report["error"] and hint in report["hint"]
    else:
        assert out.stdout == ""


@pytest.mark.amd_library
def test_info_real_library_reports_version_and_no_device(amd_runtime):
    out = run(HIPMR_PLATFORM="amd", HIPMR_LIBRARY=amd_runtime.library_path)
    assert out.returncode == 0, out.stderr
    assert "libamdhip64" in out.stdout
    major, minor, _ = amd_runtime.runtime_version()
    assert f"runtime version: {major}.{minor}." in out.stdout
    count = __import__("ctypes").c_int()
    if amd_runtime.fn.hipGetDeviceCount(count) == 100:
        assert "hipErrorNoDevice: no AMD GPU visible" in out.stdout
        assert "HIPMR_PLATFORM=emulated" in out.stdout


def test_unknown_command_fails():
    out = run("frobnicate")
    assert out.returncode != 0


def test_check_emulated_passes_every_check():
    out = run("check", "--json", HIPMR_PLATFORM="emulated")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    names = set(report["checks"])
    assert {"HostMemoryResource", "DeviceMemoryResource", "AsyncMemoryResource",
            "PoolResource(AsyncMemoryResource)", "Event timing"} <= names
    # the one check a discrete (emulated) device cannot run is skipped, saying why
    assert report["checks"]["SystemMemoryResource"]["status"] == "skipped"
    assert all(r["status"] == "passed" and r["ok"] is True and r["ran"] is True
               for name, r in report["checks"].items() if name != "SystemMemoryResource")
    assert report["ok"] is True


def test_check_reports_a_failure_with_exit_status_1():
    # an emulated device too small for the 64 MiB event-timing buffer: that check must fail
    out = run("check", HIPMR_PLATFORM="emulated", HIPMR_EMULATED_MEMORY="16MiB")
    assert out.returncode == 1
    assert "no  Event timing: OutOfMemoryError" in out.stdout


def test_bench_emulated_json():
    out = run("bench", "--json", HIPMR_PLATFORM="emulated")
    assert out.returncode == 0, out.stderr
    table = json.loads(out.stdout)["ns_per_pair"]
    assert set(table) >= {"HostMemoryResource", "PoolResource(AsyncMemoryResource)"}
    assert all(v > 0 for row in table.values() for v in row.values())


DEVICE_ROWS = {"DeviceMemoryResource", "PinnedMemoryResource", "AsyncMemoryResource",
               "PoolResource(AsyncMemoryResource)", "ManagedMemoryResource", "Event timing"}
NO_DEVICE_ENVS = [{"HIPMR_PLATFORM": "emulated", "HIPMR_EMULATED_DEVICES": "0"},
                  {"HIPMR_PLATFORM": "amd", "HIPMR_LIBRARY": ""}]


def _no_device_env(env, request):
    if env["HIPMR_PLATFORM"] == "amd":
        rt = request.getfixturevalue("amd_runtime")
        if rt.sees_device():
            pytest.skip("this machine has an AMD GPU")
        env = dict(env, HIPMR_LIBRARY=rt.library_path)
    return env


@pytest.mark.parametrize("env", NO_DEVICE_ENVS, ids=["emulated-0", "amd-no-gpu"])
def test_check_without_device_passes_host_rows_and_reports_device_rows(env, request):
    env = _no_device_env(env, request)
    out = run("check", "--json", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr
    report = json.loads(out.stdout)
    checks = report["checks"]
    assert checks["HostMemoryResource"]["status"] == "passed"
    assert checks["PoolResource(HostMemoryResource)"]["status"] == "passed"
    assert DEVICE_ROWS <= set(checks)
    for name in DEVICE_ROWS:
        assert checks[name]["status"] == "no device"
        assert checks[name]["ok"] is True and checks[name]["ran"] is False
    assert report["ok"] is True
    text = run("check", **env)
    assert text.returncode == 0 and "no device  Event timing" in text.stdout
    assert "hint: " in text.stdout


@pytest.mark.parametrize("env", NO_DEVICE_ENVS, ids=["emulated-0", "amd-no-gpu"])
def test_bench_without_device_measures_host_rows(env, request):
    env = _no_device_env(env, request)
    out = run("bench", "--json", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    table = report["ns_per_pair"]
    assert all(v > 0 for v in table["HostMemoryResource"].values())
    assert all(v > 0 for v in table["PoolResource(HostMemoryResource)"].values())
    assert report["no_device"] == ["AsyncMemoryResource", "PoolResource(AsyncMemoryResource)"]
    assert table["AsyncMemoryResource"] is None


def test_help_describes_each_command():
    out = run("--help")
    assert out.returncode == 0
    for name in ("info", "check", "bench"):
        assert f"    {name} " in out.stdout
    assert "exit status" in out.stdout and "misconfigured" in out.stdout
    for name in ("info", "check", "bench"):
        sub = run(name, "--help")
        assert sub.returncode == 0 and "--json" in sub.stdout and len(sub.stdout) > 200


def test_info_reports_the_loaded_files_own_release(tmp_path):
    """A library file no package records gets no package's release (on a machine with
    libamdhip64 installed, a libcudart reported 'release 5.2.3')."""
    from hipmr_ctypes.__main__ import _package_version
    fake = tmp_path / "lib" / "libcudart.so.13"
    fake.parent.mkdir()
    fake.write_bytes(b"")
    assert _package_version(str(fake)) is None
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("6.2.4\n")
    assert _package_version(str(fake)) == "6.2.4"


# ---- the hint comes from what the error carries, not from its text -------------------------

def test_a_hint_is_chosen_by_the_setting_an_error_names_not_by_its_words():
    import pickle

    from hipmr_ctypes.__main__ import configuration_error
    from hipmr_ctypes._hip.search import selected_platform, setting_error
    with pytest.raises(ValueError) as info:
        selected_platform({"HIPMR_PLATFORM": "amdd"})
    assert type(info.value) is ValueError and info.value.setting == "HIPMR_PLATFORM"
    assert "amd, nvidia or emulated" in configuration_error(info.value, None).hint
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.setting == "HIPMR_PLATFORM" and str(copy) == str(info.value)
    # words alone choose nothing: a plain error that mentions a variable gets the general hint
    plain = configuration_error(ValueError("HIPMR_PLATFORM HIPMR_EMULATED_DEVICES too old"), "amd")
    assert plain.hint.startswith("set HIPMR_LIBRARY to the exact library file")
    # and the variable named is the one in the hint, whatever the message says
    named = configuration_error(setting_error("HIPMR_EMULATED_MISSING", "HIPMR_PLATFORM"),
                                "emulated")
    assert named.hint.startswith("fix HIPMR_EMULATED_MISSING or unset it")


def test_emulator_settings_raise_value_errors_naming_the_variable():
    from hipmr_ctypes._hip.emulated import config_from_env
    for variable, value in (("HIPMR_EMULATED_DEVICES", "abc"), ("HIPMR_EMULATED_DEVICES", "99"),
                            ("HIPMR_EMULATED_MEMORY", "lots"),
                            ("HIPMR_EMULATED_HOST_MEMORY", "lots"),
                            ("HIPMR_EMULATED_VERSION", "x.y"), ("HIPMR_EMULATED_VERSION", "1.200"),
                            ("HIPMR_EMULATED_MISSING", "hipMalloc")):
        with pytest.raises(ValueError) as info:
            config_from_env({variable: value})
        assert info.value.setting == variable, (variable, value)


def test_a_library_missing_one_required_function_gets_the_too_old_hint():
    from hipmr_ctypes import NotSupportedError
    from hipmr_ctypes.__main__ import configuration_error
    from hipmr_ctypes._hip import amd
    from hipmr_ctypes._hip.decls import DECLS

    class Function:  # what a stand-in library's look-up returns
        pass

    required = [d.name for d in DECLS if d.required]
    library = type("Library", (), {name: Function() for name in required[1:]})()
    with pytest.raises(NotSupportedError) as info:
        amd.bind_library(library, {}, "/stand-in/libamdhip64.so")
    assert "too old" in str(info.value)
    error = configuration_error(info.value, "amd")
    assert error.hint.startswith("install a newer runtime (ROCm 5.2 or later)")
    with pytest.raises(NotSupportedError) as info:
        amd.bind_library(type("Empty", (), {})(), {}, "/stand-in/libc.so")
    assert configuration_error(info.value, "amd").hint.startswith(
        "point HIPMR_LIBRARY at libamdhip64")

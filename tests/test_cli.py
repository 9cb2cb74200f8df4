"""python -m hipmr_ctypes: info (text and JSON) on each platform, and with no library."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, **env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-m", "hipmr_ctypes", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=120)


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


def test_info_without_library_says_why_and_exits_zero():
    out = run(HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so.5")
    assert out.returncode == 0, out.stderr
    assert "library: not loaded" in out.stdout
    assert "/nonexistent/libamdhip64.so.5" in out.stdout
    assert "HIPMR_PLATFORM=emulated" in out.stdout


def test_bad_platform_is_reported():
    out = run("--json", HIPMR_PLATFORM="cuda")
    assert out.returncode == 0
    report = json.loads(out.stdout)
    assert report["loaded"] is False and "HIPMR_PLATFORM" in report["error"]


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
    assert all(r["ok"] == "yes" for r in report["checks"].values())


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

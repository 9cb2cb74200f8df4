"""Where the amd platform finds libamdhip64 (``_hip/search.py``): the ROCm root variables, AMD's
``rocm-sdk`` wheels on ``sys.path``, and what ``python -m hipmr_ctypes`` says when nothing is
installed at all (exit 0) or a variable names nothing usable (exit 2)."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
from support import REPO as _REPO

from hipmr_ctypes._hip import search
from hipmr_ctypes._hip.loader import load_first

REPO = str(_REPO)

#: the variables a test's subprocess must not inherit (the search would follow them)
_SEARCH_VARIABLES = ("HIPMR_LIBRARY", "ROCM_PATH", "ROCM_HOME", "HIP_PATH", "CUDA_HOME",
                     "HIP_PLATFORM", "PYTHONPATH")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in _SEARCH_VARIABLES}
    env.update(extra)
    return env


def test_rocm_home_is_searched_between_rocm_path_and_hip_path():
    c = search.amd_candidates({"ROCM_PATH": "/r", "ROCM_HOME": "/home", "HIP_PATH": "/h"})
    folders = list(dict.fromkeys(os.path.dirname(x) for x in c if os.sep in x))
    assert folders[:3] == ["/r/lib", "/home/lib", "/h/lib"]
    assert c[:len(search.AMD_NAMES)] == [f"/r/lib/{n}" for n in search.AMD_NAMES]
    # the same root under two names is searched once
    once = search.amd_candidates({"ROCM_PATH": "/r", "ROCM_HOME": "/r/", "HIP_PATH": "/r"})
    folders = [os.path.dirname(x) for x in once if os.sep in x]
    assert folders.count("/r/lib") == len(search.AMD_NAMES)
    assert "/opt/rocm/lib/libamdhip64.so" in search.amd_candidates({"ROCM_HOME": "/home"})


def _fake_wheel(site, version="10.0.0"):
    lib = site / "_rocm_sdk_core" / "lib"
    lib.mkdir(parents=True)
    info = site / f"rocm_sdk_core-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rocm-sdk-core\n"
                                   f"Version: {version}\n\nThe HIP runtime.\n")
    return lib


def test_rocm_sdk_wheels_on_sys_path_come_after_the_variables_and_before_opt_rocm(
        tmp_path, monkeypatch):
    lib = _fake_wheel(tmp_path / "site")
    (tmp_path / "other").mkdir()
    monkeypatch.setattr(sys, "path", ["", str(tmp_path / "other"), str(tmp_path / "site")])
    assert search.rocm_sdk_dirs() == [str(lib)]
    c = search.amd_candidates({"ROCM_PATH": "/r"})
    folders = list(dict.fromkeys(os.path.dirname(x) for x in c if os.sep in x))
    assert folders[:3] == ["/r/lib", str(lib), "/opt/rocm/lib"]
    # the wheel ships only the versioned name (no unversioned link): each name is tried there
    assert str(lib / "libamdhip64.so.7") in c
    # an exact file still means nothing else is tried
    assert search.amd_candidates({"HIPMR_LIBRARY": "/x/libamdhip64.so"}) == ["/x/libamdhip64.so"]


def test_the_search_tells_nothing_installed_from_a_library_that_fails_to_load(tmp_path):
    missing = [str(tmp_path / "libamdhip64.so"), "libamdhip64_not_installed_here.so"]
    with pytest.raises(OSError) as info:
        load_first(missing, "libamdhip64 (HIP runtime)", "hint")
    assert info.value._absent and len(info.value.tried) == 2
    broken = tmp_path / "libamdhip64.so.6"
    broken.write_bytes(b"not an ELF file")
    with pytest.raises(OSError) as info:
        load_first(missing + [str(broken)], "libamdhip64 (HIP runtime)", "hint")
    assert not info.value._absent and str(broken) in info.value.tried[-1]


#: runs the command line with the amd search pointed at names no system has (this machine may
#: have Debian's libamdhip64 installed, which the system loader would find)
_NOTHING_INSTALLED = """
import runpy, sys
from hipmr_ctypes._hip import search
search.AMD_NAMES = ("libamdhip64_not_installed_here.so",)
search.CUDART_NAMES = ("libcudart_not_installed_here.so",)
sys.argv = ["hipmr_ctypes", *sys.argv[1:]]
runpy.run_module("hipmr_ctypes", run_name="__main__")
"""


def _cli_without_runtime(*args, **env):
    return subprocess.run([sys.executable, "-c", _NOTHING_INSTALLED, *args], cwd=REPO,
                          env=_clean_env(PYTHONPATH=REPO, **env), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.any_platform
def test_the_main_job_with_no_runtime_installed_says_so_and_exits_0():
    done = _cli_without_runtime(HIPMR_PLATFORM="amd")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "no HIP runtime (libamdhip64) found" in out
    assert "$ROCM_PATH/lib, $ROCM_HOME/lib, $HIP_PATH/lib" in out and "_rocm_sdk_core" in out
    assert "/opt/rocm/lib" in out and "ld.so.cache" in out
    assert "HIPMR_LIBRARY=" in out and "HostMemoryResource" in out
    assert "HIPMR_PLATFORM=emulated python -m hipmr_ctypes" in out and "--require-device" in out
    assert done.stderr == ""
    report = json.loads(_cli_without_runtime("info", "--json", HIPMR_PLATFORM="amd").stdout)
    assert report["loaded"] is False and report["devices"] == [] and report["searched"]
    # a script that needs a device makes its absence an error
    required = _cli_without_runtime("--require-device", HIPMR_PLATFORM="amd")
    assert required.returncode == 1 and "--require-device" in required.stderr
    assert _cli_without_runtime("info", "--require-device", HIPMR_PLATFORM="amd").returncode == 1
    # the nvidia platform the same way
    nvidia = _cli_without_runtime(HIPMR_PLATFORM="nvidia")
    assert nvidia.returncode == 0 and "no CUDA runtime (libcudart) found" in nvidia.stdout


@pytest.mark.any_platform
def test_a_variable_naming_nothing_usable_stays_a_misconfiguration(tmp_path):
    for var, value in (("HIPMR_LIBRARY", str(tmp_path / "libamdhip64.so")),
                       ("ROCM_HOME", str(tmp_path)), ("ROCM_PATH", str(tmp_path))):
        done = _cli_without_runtime(HIPMR_PLATFORM="amd", **{var: value})
        assert done.returncode == 2, (var, done.stdout, done.stderr)
        assert "could not load libamdhip64" in done.stderr and str(tmp_path) in done.stderr
    broken = tmp_path / "lib" / "libamdhip64.so"      # exists, fails to load
    broken.parent.mkdir()
    broken.write_bytes(b"not an ELF file")
    done = _cli_without_runtime(HIPMR_PLATFORM="amd", HIPMR_LIBRARY=str(broken))
    assert done.returncode == 2 and str(broken) in done.stderr
    done = subprocess.run([sys.executable, "-m", "hipmr_ctypes"], cwd=REPO,
                          env=_clean_env(PYTHONPATH=REPO, HIPMR_PLATFORM="nope"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "HIPMR_PLATFORM" in done.stderr


def _real_libamdhip64():
    """The real library file to lay out as a wheel's: the one HIPMR_LIBRARY names (the ROCm
    release matrix points it at each release's), else Debian's own."""
    named = os.environ.get("HIPMR_LIBRARY")
    found = [os.path.realpath(named)] if named else sorted(
        glob.glob("/usr/lib/x86_64-linux-gnu/libamdhip64.so.*.*"))
    if not found or not os.path.isfile(found[-1]):
        if os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") == "1":
            pytest.fail("a real libamdhip64 is required (HIPMR_REQUIRE_AMD_LIBRARY=1) but neither "
                        "HIPMR_LIBRARY nor /usr/lib/x86_64-linux-gnu has one", pytrace=False)
        pytest.skip("no real libamdhip64 (Debian's libamdhip64-5 is not installed)")
    return found[-1]


@pytest.mark.amd_library
def test_a_rocm_sdk_wheel_on_sys_path_is_loaded_and_named_in_info(tmp_path):
    """A fake site-packages folder laid out as AMD's rocm-sdk-core wheel installs it, holding
    a real libamdhip64 under the wheel's versioned name only (``libamdhip64.so.<major>``):
    found through ``sys.path`` (PYTHONPATH here) with no variable set, and ``info`` reports the
    wheel's file, the HIP version and the wheel's ROCm release beside it."""
    from hipmr_ctypes._hip.loader import library_version_from_path
    real = _real_libamdhip64()
    version = library_version_from_path(real)
    if version is None:
        pytest.skip(f"{real} has no version in its name: the wheel's name for it is unknown")
    hip = ".".join(version.split(".")[:2])
    site = tmp_path / "site-packages"
    lib = _fake_wheel(site, "10.0.0")
    target = lib / f"libamdhip64.so.{version.split('.')[0]}"
    try:
        os.link(real, target)              # the same file, under the wheel's folder
    except OSError:
        shutil.copyfile(real, target)
    env = _clean_env(HIPMR_PLATFORM="amd", PYTHONPATH=os.pathsep.join([str(site), REPO]))
    # ROCm 5's library asks for an executable stack, which glibc 2.41 and later refuse to
    # dlopen unless this tunable allows it (an older glibc ignores it)
    env["GLIBC_TUNABLES"] = "glibc.rtld.execstack=2"
    done = subprocess.run([sys.executable, "-m", "hipmr_ctypes", "info", "--json"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["library"] == os.path.realpath(target), report
    assert report["release"] == "10.0.0" and report["rocm_release"] == "ROCm 10.0.0"
    assert report["hip_version"] == hip
    text = subprocess.run([sys.executable, "-m", "hipmr_ctypes"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"library: {os.path.realpath(target)} (release 10.0.0)" in text.stdout
    assert f"(HIP {hip}, ROCm 10.0.0)" in text.stdout


@pytest.mark.parametrize("hip, words, shown", [
    ("6.4", "ROCm 6.4", "(ROCm 6.4)"),                    # a release's HIP is the release's
    ("5.2", "ROCm 5.2.3", "(ROCm 5.2.3)"),
    ("7.15", "ROCm 10.0.0", "(HIP 7.15, ROCm 10.0.0)"),   # ROCm 10.0 ships HIP 7.15
    ("7.1", "ROCm 7.12", "(HIP 7.1, ROCm 7.12)"),
])
def test_info_says_hips_version_beside_rocms_when_they_differ(capsys, hip, words, shown):
    from hipmr_ctypes.__main__ import print_info
    print_info({"package": "0", "python": "3", "platform": "amd", "library": "/x/libamdhip64.so",
                "runtime_version": f"{hip}.1", "driver_version": f"{hip}.1", "hip_version": hip,
                "rocm_release": words, "devices": []})
    assert f"runtime version: {hip}.1 {shown}; driver version" in capsys.readouterr().out

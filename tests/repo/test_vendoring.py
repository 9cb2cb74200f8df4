"""README.md, "What you may leave out when vendoring": a copy of the package without the
optional parts it names still imports, runs the README's quickstart and the command line's
main job, on every platform it keeps."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from support import REPO

#: what the README says a vendored copy may leave out, as paths inside hipmr_ctypes/
OPTIONAL = ("plot", "interop", "cccl3.py")
#: the back ends a copy keeps only for the platform it runs on
EMULATED, NVIDIA = "_hip/emulated", "_hip/nvidia"


def _quickstart() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)[0]


def _copy(tmp_path, leave_out):
    shutil.copytree(REPO / "hipmr_ctypes", tmp_path / "hipmr_ctypes",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for part in leave_out:
        path = tmp_path / "hipmr_ctypes" / part
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        assert not path.exists()
    (tmp_path / "quickstart.py").write_text(_quickstart())
    return tmp_path


def _run(where, args, platform):
    env = dict(os.environ, HIPMR_PLATFORM=platform, PYTHONPATH=str(where))
    env.pop("HIPMR_LIBRARY", None)
    return subprocess.run([sys.executable, *args], cwd=str(where), env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_readme_names_what_may_be_left_out():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## What you may leave out when vendoring\n", 1)[1].split("\n## ", 1)[0]
    for part in (*OPTIONAL, EMULATED, NVIDIA):
        assert f"`hipmr_ctypes/{part}" in section, part


def test_a_copy_without_the_optional_parts_runs_the_quickstart(tmp_path):
    where = _copy(tmp_path, (*OPTIONAL, NVIDIA))
    done = _run(where, ["quickstart.py"], "emulated")
    assert done.returncode == 0, done.stderr
    done = _run(where, ["-m", "hipmr_ctypes", "check"], "emulated")
    assert done.returncode == 0, done.stdout + done.stderr
    helped = _run(where, ["-m", "hipmr_ctypes", "--help"], "emulated")
    assert helped.returncode == 0 and "{info,check,bench}" in helped.stdout, helped.stderr
    # the parts left out are named when asked for, not silently replaced
    for part in ("cccl3", "plot", "interop.torch"):
        done = _run(where, ["-c", f"import hipmr_ctypes.{part}"], "emulated")
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, done.stderr
        assert f"hipmr_ctypes.{part.split('.')[0]}" in done.stderr, done.stderr


@pytest.mark.amd_library
def test_a_copy_for_rocm_keeps_only_the_amd_back_end(tmp_path, amd_runtime):
    where = _copy(tmp_path, (*OPTIONAL, EMULATED, NVIDIA))
    done = _run(where, ["-m", "hipmr_ctypes"], "amd")
    assert done.returncode == 0 and "platform: amd" in done.stdout, done.stdout + done.stderr
    code = ("import hipmr_ctypes as hmr\n"
            "h = hmr.HostMemoryResource()\n"
            "pool = hmr.PoolResource(h, initial_pool_size=1 << 20)\n"
            "p = pool.allocate(1000)\n"
            "pool.deallocate(p, 1000)\n")
    done = _run(where, ["-c", code], "amd")
    assert done.returncode == 0, done.stderr
    done = _run(where, ["-m", "hipmr_ctypes"], "emulated")
    assert done.returncode == 2 and "hipmr_ctypes._hip.emulated" in done.stderr, done.stderr


@pytest.mark.gpu
def test_a_copy_without_the_emulated_platform_runs_the_quickstart_on_the_gpu(tmp_path,
                                                                             gpu_runtime):
    platform = gpu_runtime.platform
    other = NVIDIA if platform == "amd" else None
    where = _copy(tmp_path, (*OPTIONAL, EMULATED) + ((other,) if other else ()))
    done = _run(where, ["quickstart.py"], platform)
    assert done.returncode == 0, done.stderr
    done = _run(where, ["-m", "hipmr_ctypes", "check"], platform)
    assert done.returncode == 0, done.stdout + done.stderr

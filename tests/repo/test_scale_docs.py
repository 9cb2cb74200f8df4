"""The scripts docs/scale.md shows run end to end on the emulated platform (the page's blocks
run in tests/repo/test_doc_blocks.py)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from support import REPO


def _script(name, *args, devices="2"):
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES=devices,
               HIPMR_EMULATED_MEMORY="512MiB")
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_ipc_demo_runs_on_emulated(tmp_path):
    out = tmp_path / "ipc.json"
    done = _script("ipc_demo.py", "--consumers", "3", "--size", "1MiB", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout
    import json
    data = json.loads(out.read_text())
    assert data["failures"] == 0 and len(data["reports"]) == 3
    assert {r["device"] for r in data["reports"]} == {0, 1}
    assert all(r["pool_ok"] and r["pool_written_back"] for r in data["reports"])
    assert all(r["legacy_ok"] == "not supported here" for r in data["reports"])


def test_bench_peer_runs_on_emulated(tmp_path):
    out = tmp_path / "peer.json"
    done = _script("bench_peer.py", "--size", "1MiB", "--copies", "2", "--rounds", "2",
                   "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0->1" in done.stdout and out.exists()


def test_bench_peer_needs_two_devices():
    done = _script("bench_peer.py", "--size", "1MiB", devices="1")
    assert done.returncode == 1 and "needs two devices" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
def test_mpi_demo_runs_as_one_rank(tmp_path):
    done = _script("mpi_demo.py", "--size", "1MiB")
    assert done.returncode == 0, done.stdout + done.stderr


# ---- the demos on the two GPUs -----------------------------------------------------------------
def _real_script(args, timeout=600):
    env = dict(os.environ)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_gpu_ipc_demo(tmp_path):
    out = tmp_path / "ipc.json"
    done = _real_script([sys.executable, str(REPO / "scripts" / "ipc_demo.py"),
                         "--consumers", "4", "--size", "8MiB", "--json", str(out)])
    assert done.returncode == 0, done.stdout + done.stderr
    import json
    data = json.loads(out.read_text())
    assert data["failures"] == 0 and {r["device"] for r in data["reports"]} == {0, 1}
    assert all(r["legacy_ok"] is True and r["legacy_written_back"] for r in data["reports"])


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_gpu_mpi_demo():
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    args = [mpirun, "-np", "2"]
    if os.geteuid() == 0:
        args.insert(1, "--allow-run-as-root")
    done = _real_script(args + ["-x", "HIPMR_PLATFORM", sys.executable,
                                str(REPO / "scripts" / "mpi_demo.py"), "--size", "4MiB"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout

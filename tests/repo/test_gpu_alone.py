"""Tests marked ``gpu_alone`` (they fill the device) are deselected in pytest-xdist's parallel
workers and collected in a serial run (``tests/conftest.py``)."""
import os
import subprocess
import sys

from support import REPO

TARGET = "tests/plot_cli/test_cli_gpu.py::test_bench_json_on_a_nearly_full_gpu"


def _collect(**env_extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", TARGET], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.stdout


def test_a_serial_run_collects_it():
    out = _collect()
    assert TARGET in out and "deselected" not in out, out


def test_a_parallel_worker_deselects_it():
    out = _collect(PYTEST_XDIST_WORKER="gw3")
    assert TARGET not in out and "1 deselected" in out, out

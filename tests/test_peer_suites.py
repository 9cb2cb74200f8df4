"""scripts/peer_suites.py (run on the GPU machine) must not rot: its pytest runs, JUnit parsing
and side-by-side comparison work on a tiny suite here, and without Numba / CuPy it says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import peer_suites  # noqa: E402

SUITE = '''
import os
import pytest

def test_always():
    pass

def test_only_without_the_plugin():
    assert os.environ.get("PEER_PLUGIN") != "1"

def test_only_with_the_plugin():
    assert os.environ.get("PEER_PLUGIN") == "1"

@pytest.mark.skip(reason="never")
def test_skipped():
    pass
'''


def test_runs_compare_and_list_regressions(tmp_path, capsys):
    (tmp_path / "test_tiny.py").write_text(SUITE)
    env = dict(os.environ)
    theirs, rc1, _ = peer_suites._run("theirs", ["test_tiny.py"], env,
                                      str(tmp_path / "a.xml"), 120, str(tmp_path))
    ours, rc2, _ = peer_suites._run("ours", ["test_tiny.py"], dict(env, PEER_PLUGIN="1"),
                                    str(tmp_path / "b.xml"), 120, str(tmp_path))
    assert rc1 == rc2 == 1
    assert theirs == {"test_tiny::test_always": "passed",
                      "test_tiny::test_only_without_the_plugin": "passed",
                      "test_tiny::test_only_with_the_plugin": "failed",
                      "test_tiny::test_skipped": "skipped"}
    result = peer_suites._compare("tiny", theirs, ours, ("theirs", "ours"))
    assert result["regressions"] == ["test_tiny::test_only_without_the_plugin"]
    assert result["only_ours"] == ["test_tiny::test_only_with_the_plugin"]
    assert result["counts"] == {"theirs": {"passed": 2, "failed": 1, "error": 0, "skipped": 1},
                                "ours": {"passed": 2, "failed": 1, "error": 0, "skipped": 1}}
    text = capsys.readouterr().out
    assert "passing with theirs but not with ours (1)" in text


def test_a_timeout_or_missing_report_counts_nothing(tmp_path):
    assert peer_suites._outcomes(str(tmp_path / "none.xml")) == {}
    (tmp_path / "test_slow.py").write_text("import time\ndef test_slow():\n    time.sleep(30)\n")
    outcomes, rc, tail = peer_suites._run("slow", ["test_slow.py"], dict(os.environ),
                                          str(tmp_path / "s.xml"), 3, str(tmp_path))
    assert rc == 124 and "timed out" in tail and outcomes == {}


def test_script_without_numba_or_cupy(tmp_path):
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    code = ("import importlib.util, sys; "
            "sys.exit(0 if importlib.util.find_spec('numba') is None and "
            "importlib.util.find_spec('cupy') is None else 3)")
    if subprocess.run([sys.executable, "-c", code]).returncode:
        pytest.skip("Numba or CuPy is installed: scripts/gpu_run.sh runs the real suites")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "peer_suites.py"),
                           "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "numba-cuda: not installed" in proc.stdout and "cupy: not installed" in proc.stdout
    report = json.loads((tmp_path / "peer_suites.json").read_text())
    assert set(report) == {"numba", "cupy"} and all("skipped" in r for r in report.values())

"""scripts/reliability_report.py: its counts, and what it says when a child process crashes
(the process that dies must be named, with the test it was running and its innermost frame)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
SCRIPT = os.path.join(ROOT, "scripts", "reliability_report.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reliability_report  # noqa: E402


def _report(tmp_path, *args):
    out = tmp_path / "report.json"
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    proc = subprocess.run([sys.executable, SCRIPT, "--json", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    return proc, json.loads(out.read_text())


def test_counts_fuzz_operations_and_is_ok(tmp_path):
    proc, result = _report(tmp_path, "--fuzz-ops", "700", "--", "-k", "no_test_has_this_name")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    targets = reliability_report._fuzz_targets()
    assert result["ok"] and not result["fuzz"]["crashed"]
    assert result["fuzz"]["ops"] == 700 // len(targets) * len(targets)
    assert result["fuzz"]["runs"] == len(targets)
    assert "result: OK" in proc.stdout and "| crashes | 0 |" in proc.stdout


def test_a_crash_names_the_test_and_its_frame(tmp_path):
    crash = tmp_path / "test_crashes_here.py"
    crash.write_text("import ctypes\n\n\ndef test_crashes_here():\n"
                     "    ctypes.string_at(0)\n")
    proc, result = _report(tmp_path, "--fuzz-ops", "0", "--", str(crash), "-k",
                           "crashes_here")
    assert proc.returncode == 1
    assert not result["ok"] and result["failure_kinds"]["crash"] == 1
    (failure,) = result["failures"]
    assert "test_crashes_here" in failure["id"]
    assert "test_crashes_here.py" in failure["message"] and "rc=-" in failure["message"]
    assert "result: NOT OK" in proc.stdout and "test_crashes_here.py\", line 5" in proc.stdout


@pytest.mark.parametrize("stderr, expect", [
    ("noise\nFatal Python error: Segmentation fault\n\n  File \"a.py\", line 1 in f\n",
     "File \"a.py\""),
    ("just an ordinary error\n", "just an ordinary error"),
])
def test_crash_excerpt_keeps_the_innermost_frames(stderr, expect):
    excerpt = reliability_report._crash_excerpt(stderr)
    assert expect in excerpt and "noise" not in excerpt


@pytest.mark.parametrize("message, kind", [
    ("rc=-11: Segmentation fault", "crash"),
    ("AssertionError: live allocations changed", "leak"),
    ("Failed: logging-write-collects: hung (a deadlock inside a lock of the resource)", "hang"),
    ("AssertionError: deadlock: threads still running", "hang"),
    ("FuzzFailure: overlap at 0x10", "corruption"),
    ("ValueError: something else", "other"),
])
def test_classify(message, kind):
    assert reliability_report.classify(message) == kind

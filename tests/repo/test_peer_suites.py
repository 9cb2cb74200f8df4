"""scripts/peer_suites.py (run on the GPU machine) must not rot: its pytest runs, JUnit parsing
and side-by-side comparison work on a tiny suite here, and without Numba / CuPy it says so."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from support import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
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
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "peer_suites.py"),
                           "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "numba-cuda: not installed" in proc.stdout and "cupy: not installed" in proc.stdout
    report = json.loads((tmp_path / "peer_suites.json").read_text())
    assert set(report) == {"numba", "cupy"} and all("skipped" in r for r in report.values())


UNITTEST_SUITE = '''
import os
import unittest

class Cases(unittest.TestCase):
    def test_always(self):
        pass
    def test_only_without_the_plugin(self):
        self.assertNotEqual(os.environ.get("PEER_PLUGIN"), "1")
    def test_error(self):
        raise RuntimeError("boom")
    @unittest.skip("never")
    def test_skipped(self):
        pass
    def test_subtests_all_pass(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 3)
    def test_one_subtest_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)
    def test_one_subtest_errs(self):
        for i in range(2):
            with self.subTest(i=i):
                if i:
                    raise RuntimeError("boom")
'''


def test_unittest_driver_imports_by_name_and_reports_each_test(tmp_path, capsys):
    """numba-cuda's modules are imported by name (the import system resolves its redirect),
    not collected from paths; each test's outcome is kept, an unimportable module is one error
    whose first lines are printed."""
    pkg = tmp_path / "pkg_peer" / "tests"
    pkg.mkdir(parents=True)
    (tmp_path / "pkg_peer" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "test_cases.py").write_text(UNITTEST_SUITE)
    (pkg / "test_broken.py").write_text("import no_such_module_here\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    outcomes, rc, tail = peer_suites._run_unittest(
        "tiny", ["pkg_peer.tests.test_cases", "pkg_peer.tests.test_broken"], env,
        str(tmp_path / "u.json"), 120, str(tmp_path))
    assert outcomes == {"pkg_peer.tests.test_cases.Cases::test_always": "passed",
                        "pkg_peer.tests.test_cases.Cases::test_only_without_the_plugin": "passed",
                        "pkg_peer.tests.test_cases.Cases::test_error": "error",
                        "pkg_peer.tests.test_cases.Cases::test_skipped": "skipped",
                        # a failing subtest fails its test (it is not left out as "not run")
                        "pkg_peer.tests.test_cases.Cases::test_subtests_all_pass": "passed",
                        "pkg_peer.tests.test_cases.Cases::test_one_subtest_fails": "failed",
                        "pkg_peer.tests.test_cases.Cases::test_one_subtest_errs": "error",
                        "pkg_peer.tests.test_broken::import": "error"}
    # unittest's own count of what ran ("Ran N tests") is in the tail; N is not asserted: how
    # it counts a module that fails to import differs between Python releases (3.12.1: 6)
    assert rc == 1 and re.search(r"^Ran \d+ tests? in ", tail, re.M)
    capsys.readouterr()
    outcomes, _, _ = peer_suites._run_unittest("broken", ["pkg_peer.tests.test_broken"], env,
                                               str(tmp_path / "b.json"), 120, str(tmp_path))
    assert outcomes == {"pkg_peer.tests.test_broken::import": "error"}
    text = capsys.readouterr().out
    assert "collected no test" in text and "no_such_module_here" in text


def test_pytest_fallback_imports_files_by_path(tmp_path, capsys):
    """The fallback: pytest on the files with --import-mode=importlib, from their folder."""
    (tmp_path / "test_tiny.py").write_text(SUITE)
    outcomes, _, _ = peer_suites._run(
        "fallback", ["--import-mode=importlib", f"--rootdir={tmp_path}",
                     str(tmp_path / "test_tiny.py")], dict(os.environ),
        str(tmp_path / "f.xml"), 120, str(tmp_path))
    assert outcomes.get("test_tiny::test_always") == "passed"
    assert "collected no test" not in capsys.readouterr().out

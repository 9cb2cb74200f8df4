"""scripts/reliability_report.py: its counts, what it says when a child process crashes (the
process that dies must be named, with the test it was running and its innermost frame), and
how it keeps to a budget (it ends in time, stops what still runs, and says so)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "scripts", "reliability_report.py")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import reliability_report  # noqa: E402


@pytest.fixture(scope="module")
def sections(tmp_path_factory):
    """The reliability sections found by collecting tests/ once (``find_sections``, the
    script's own collection, a child process of ~5,000 tests): the file it wrote is
    ``--collected`` for the runs below, which would otherwise each collect tests/ again."""
    tmp = tmp_path_factory.mktemp("collected")
    files, errors = reliability_report.find_sections(
        dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO)), str(tmp))
    return files, errors, str(tmp / "collected.json")


def _report(tmp_path, sections, *args):
    out = tmp_path / "report.json"
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    proc = subprocess.run([sys.executable, SCRIPT, "--json", str(out), "--collected",
                           sections[2], *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    return proc, json.loads(out.read_text())


def test_counts_fuzz_operations_and_is_ok(tmp_path, sections):
    proc, result = _report(tmp_path, sections, "--fuzz-ops", "700", "--only", "fuzz_pool.py",
                           "--only", "test_gc_locks", "--", "-k", "no_test_has_this_name")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    targets = reliability_report._fuzz_targets()
    assert result["ok"] and result["complete"] and not result["fuzz"]["crashed"]
    assert result["fuzz"]["ops"] == 700 // len(targets) * len(targets)
    assert result["fuzz"]["runs"] == len(targets)
    assert [s["name"] for s in result["sections"]] == ["tests/reliability/test_gc_locks.py"] + [
        f"scripts/fuzz_pool.py {t}" for t in targets]
    assert {s["status"] for s in result["sections"]} == {"complete"}
    assert "result: OK" in proc.stdout and "| crashes | 0 |" in proc.stdout
    # each section's line is printed as it ends, before the table
    assert proc.stdout.index("fuzz_pool.py pool: 116 of 116 ops") < proc.stdout.index(
        "| measure |")


def test_a_crash_names_the_test_and_its_frame(tmp_path, sections):
    crash = tmp_path / "test_crashes_here.py"
    crash.write_text("import ctypes\n\n\ndef test_crashes_here():\n"
                     "    ctypes.string_at(0)\n")
    proc, result = _report(tmp_path, sections, "--fuzz-ops", "0", "--only",
                           "test_crashes_here", "--", str(crash), "-k", "crashes_here")
    assert proc.returncode == 1
    assert not result["ok"] and result["failure_kinds"]["crash"] == 1
    (failure,) = result["failures"]
    assert "test_crashes_here" in failure["id"]
    assert "test_crashes_here.py" in failure["message"] and "rc=-" in failure["message"]
    assert "result: NOT OK" in proc.stdout and "test_crashes_here.py\", line 5" in proc.stdout


def test_a_file_that_cannot_be_collected_is_an_error(tmp_path, sections):
    broken = tmp_path / "test_broken_file.py"
    broken.write_text("import no_such_module_here\n\n\ndef test_never():\n    pass\n")
    proc, result = _report(tmp_path, sections, "--fuzz-ops", "0", "--only",
                           "test_broken_file", "--", str(broken))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert result["failed"] and result["tests"]["error"] == 1
    (failure,) = result["failures"]
    assert "test_broken_file.py" in failure["id"]
    assert "no_such_module_here" in failure["message"] and "result: NOT OK" in proc.stdout


def test_a_usage_error_of_pytest_is_an_error(tmp_path, sections):
    proc, result = _report(tmp_path, sections, "--fuzz-ops", "0", "--only", "test_gc_locks",
                           "--", "--no-such-pytest-option")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (failure,) = result["failures"]
    assert failure["id"] == "tests/reliability/test_gc_locks.py"
    assert "pytest exited with status 4" in failure["message"]
    assert "no-such-pytest-option" in failure["message"]


@pytest.mark.parametrize("stderr, expect", [
    ("noise\nFatal Python error: Segmentation fault\n\n  File \"a.py\", line 1 in f\n",
     "File \"a.py\""),
    ("just an ordinary error\n", "just an ordinary error"),
])
def test_crash_excerpt_keeps_the_innermost_frames(stderr, expect):
    excerpt = reliability_report._crash_excerpt(stderr)
    assert expect in excerpt and "noise" not in excerpt


def test_the_kind_of_a_failure_is_its_exception_class_not_its_text():
    import subprocess

    import fuzz_pool
    from support import Corruption, Crash, Hang, Leak
    assert [reliability_report.kind_of(t) for t in (Crash, Hang, Leak, Corruption)] == [
        "crash", "hang", "leak", "corruption"]
    assert reliability_report.kind_of(fuzz_pool.FuzzFailure) == "corruption"
    assert reliability_report.kind_of(subprocess.TimeoutExpired) == "hang"
    assert reliability_report.kind_of(AssertionError) == "other"   # whatever its message says
    assert reliability_report.kind_of(ValueError) == "other"


KINDS = """import subprocess, sys


class Leak(AssertionError):
    reliability_kind = "leak"


def test_a_leak():
    raise Leak("memory left allocated")


def test_a_timeout():
    subprocess.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_words_alone_are_no_kind():
    assert False, "deadlock: crash, leak, corruption, hung"
"""


def test_failures_are_counted_by_kind_from_the_report_of_each_test(tmp_path, sections):
    test_file = tmp_path / "test_kinds_here.py"
    test_file.write_text(KINDS)
    proc, result = _report(tmp_path, sections, "--fuzz-ops", "0", "--only",
                           "test_kinds_here", "--", str(test_file))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    kinds = {f["id"].split("::")[-1]: f["kind"] for f in result["failures"]}
    assert kinds == {"test_a_leak": "leak", "test_a_timeout": "hang",
                     "test_words_alone_are_no_kind": "other"}
    assert result["failure_kinds"] == {"crash": 0, "hang": 1, "leak": 1, "corruption": 0,
                                       "other": 1}


def test_sections_and_rows_come_from_the_reliability_marker(sections):
    """The files holding tests marked ``reliability`` are the sections (found by collecting,
    whatever their names), and each test counts in the row its marker names."""
    files, errors, collected = sections
    assert errors == []
    assert reliability_report.find_sections({}, "", collected=collected) == (files, errors)
    assert {"tests/reliability/test_bad_input.py", "tests/reliability/test_shutdown.py",
            "tests/adaptors/test_pool_fuzz.py", "tests/reliability/test_log_and_plot_input.py",
            "tests/binding/test_errors.py", "tests/resources/test_async_copies.py"} <= set(files)
    assert "tests/buffer/test_buffer.py" not in files and len(files) == len(set(files))
    assert all(f.startswith("tests/") for f in files)


SLOW = """import time


def test_a_fast_one():
    pass


def test_b_slow_one():
    time.sleep(600)
"""


def test_a_budget_ends_the_run_in_time_and_names_what_it_cut(tmp_path, sections):
    """A section still running at the end of the budget is stopped (named, with the test it
    was in and where), the fuzzer stops in time and says so, and the report is INCOMPLETE."""
    slow = tmp_path / "test_slow_section.py"
    slow.write_text(SLOW)
    started = time.monotonic()
    proc, result = _report(tmp_path, sections, "--budget", "15", "--jobs", "3", "--fuzz-ops",
                           str(10 ** 9), "--only", "test_slow_section", "--only",
                           "fuzz_pool.py", "--", str(slow))
    elapsed = time.monotonic() - started
    assert elapsed < 15 + 30, elapsed  # bounded: far below the sleeping test's 600 s
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not result["ok"] and not result["complete"] and not result["failed"]
    section = result["sections"][0]
    assert section["status"] == "cut" and section["name"] == str(slow)
    assert section["running"].endswith("test_slow_section.py::test_b_slow_one")
    assert "test_slow_section.py" in section["where"] and "line 9" in section["where"]
    assert result["tests"]["passed"] == 1  # the test that had ended is kept
    assert str(slow) in result["cut"]
    fuzz = result["fuzz"]
    assert 0 <= fuzz["ops"] < fuzz["planned"] and not fuzz["failures"]
    assert "SHORTENED" in proc.stdout and "CUT (not run to the end)" in proc.stdout
    assert "result: INCOMPLETE" in proc.stdout
    assert f"{slow} was in" in proc.stdout and "test_b_slow_one" in proc.stdout


def test_sigterm_still_prints_the_report(tmp_path, sections):
    """An outer timeout's SIGTERM: the running sections are stopped, the table printed."""
    slow = tmp_path / "test_slow_section.py"
    slow.write_text(SLOW)
    out = tmp_path / "report.json"
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    proc = subprocess.Popen([sys.executable, SCRIPT, "--json", str(out), "--fuzz-ops", "0",
                             "--collected", sections[2], "--only", "test_slow_section", "--",
                             str(slow)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the plan: the sections have started
    assert "1 sections" in first
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stdout + stderr
    result = json.loads(out.read_text())
    assert result["interrupted_by"] == ["SIGTERM"] and result["cut"] == [str(slow)]
    assert "interrupted by SIGTERM" in stdout and "result: INCOMPLETE" in stdout


def test_thread_loops_stop_at_the_deadline_and_count_what_ran(tmp_path):
    """HIPMR_TEST_DEADLINE (set by --budget) stops the hammering threads; the tests still
    check everything, and the counters say how much ran of what was planned."""
    out = tmp_path / "section.jsonl"
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_TEST_DEADLINE="1",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, SCRIPT, "--pytest-child", str(out), "--", "-q",
                           "-p", "no:cacheprovider", "tests/adaptors/test_pool_threads.py",
                           "tests/reliability/test_threads.py", "-k",
                           "sixteen_threads_on_one_pool or sixteen_threads_on_statistics"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    section = reliability_report.read_section(str(out))
    assert section["done"] == 0 and section["collected"] == 4
    assert [t["outcome"] for t in section["tests"]] == ["passed"] * 4
    counters = section["counters"]
    assert counters["threads_cut"] == 4 * 16 and counters["thread_ops"] == 0
    assert counters["thread_ops_planned"] == 2 * 16 * 1500 + 2 * 16 * 600


def test_extra_paths_become_sections_and_options_go_to_every_section(monkeypatch):
    monkeypatch.chdir(REPO)
    # "tests" after -k is the expression, not a path
    assert reliability_report._split_pytest_args(["tests", "-k", "tests", "-x"]) == (
        [os.path.abspath(os.path.join(REPO, "tests"))], ["-k", "tests", "-x"])

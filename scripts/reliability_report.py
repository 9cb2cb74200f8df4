#!/usr/bin/env python3
"""Run the reliability suite and print one table: bad inputs tried, faults injected, thread
operations run, fuzz operations run, exit scenarios, collections inside locks, stream identity,
misbehaving upstream and size cases; crashes, hangs, leaks, corruptions (all four must be 0).

    python scripts/reliability_report.py                       # emulated unless HIPMR_PLATFORM says
    HIPMR_PLATFORM=nvidia python scripts/reliability_report.py # also the gpu tests
    python scripts/reliability_report.py --fuzz-ops 200000 --json report.json

What runs, each in a child process (so that a crash of the interpreter is seen and counted,
not fatal to the report):

* pytest on tests/test_bad_input.py, test_faults.py, test_threads.py, test_shutdown.py, plus
  test_pool_fuzz.py and test_pool_threads.py when present, with a plugin that records every
  test's outcome and reads the counters the test modules keep (cases, junk calls, injected
  faults, thread operations);
* scripts/fuzz_pool.py for ``--fuzz-ops`` operations in all (default 1,000,000, spread over
  its targets; about 25 s on one core of a laptop), at the same time as pytest.

``HIPMR_PLATFORM`` is passed through (default ``emulated``): on ``nvidia`` or ``amd`` the gpu
tests run too, and the tests that need the emulator's hooks skip.  A failure is classified
from its message: a child process that died or a signal is a crash; memory left allocated is
a leak; a hung child or thread (a deadlock) is a hang; overlapping or overwritten blocks and fuzz-model mismatches are corruptions; anything
else is "other failures".  Exit status: 0 when no test failed and crashes, leaks and
corruptions are all 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as _platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["test_bad_input.py", "test_faults.py", "test_threads.py", "test_shutdown.py",
         "test_exit.py", "test_gc_locks.py", "test_stream_identity.py",
         "test_misbehaving_upstreams.py", "test_logging_failures.py",
         "test_sizes_growth_pickle.py"]
OPTIONAL_TESTS = ["test_pool_fuzz.py", "test_pool_threads.py"]

CRASH = re.compile(r"child process died|rc=-\d|signal|Segmentation|core dumped|Fatal Python",
                   re.I)
LEAK = re.compile(r"leak|left live|still allocated|live allocations changed|was left behind"
                  r"|were not destroyed", re.I)
HANG = re.compile(r"\bhung\b|\bhangs?\b|deadlock|TimeoutExpired|timed out", re.I)
CORRUPTION = re.compile(r"overlap|overwritten|corrupt|FuzzFailure|tiles|model", re.I)


# ------------------------------------------------------------------ the pytest child process
class Collector:
    """pytest plugin: every test's outcome, and the counters of the reliability modules."""

    def __init__(self, progress_path: Optional[str] = None) -> None:
        self.tests: List[Dict[str, Any]] = []
        self.progress_path = progress_path

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        """Name the test now running, so that a crash of this process can say which."""
        if self.progress_path:
            with open(self.progress_path, "w") as fh:
                fh.write(nodeid)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed") or (
                report.when == "teardown" and report.outcome == "failed"):
            outcome = report.outcome
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.outcome == "skipped" else "xpassed"
            elif report.when != "call" and report.outcome == "failed":
                outcome = "error"
            entry = {"id": report.nodeid, "outcome": outcome,
                     "seconds": round(getattr(report, "duration", 0.0), 3)}
            if report.outcome == "failed":
                entry["message"] = str(report.longrepr)[-4000:]
            self.tests.append(entry)

    def counters(self) -> Dict[str, int]:
        def module(name: str) -> Any:
            return sys.modules.get(name) or sys.modules.get(f"tests.{name}")

        def ran(prefix: str) -> int:
            return sum(1 for t in self.tests if t["id"].startswith(prefix)
                       and t["outcome"] in ("passed", "failed", "xfailed", "xpassed"))

        out = {"bad_input_cases": ran("tests/test_bad_input.py::test_bad_input["),
               "junk_calls": 0, "faults_injected": 0, "thread_ops": 0, "fuzz_ops_in_suite": 0,
               "exit_scenarios": ran("tests/test_shutdown.py::test_exit_with_everything_alive")
               + ran("tests/test_shutdown.py::test_everything_dropped_before_exit")
               + ran("tests/test_exit.py::"),
               "gc_lock_cases": ran("tests/test_gc_locks.py::"),
               "stream_identity_cases": ran("tests/test_stream_identity.py::"),
               "misbehaving_cases": ran("tests/test_misbehaving_upstreams.py::")
               + ran("tests/test_logging_failures.py::"),
               "size_growth_pickle_cases": ran("tests/test_sizes_growth_pickle.py::")}
        bad = module("test_bad_input")
        if bad is not None:
            out["junk_calls"] = sum(getattr(bad, "JUNK_TRIED", []))
        faults = module("test_faults")
        if faults is not None:
            out["faults_injected"] = getattr(faults, "FAULTS_INJECTED", [0])[0]
        threads = module("test_threads")
        if threads is not None:
            out["thread_ops"] += getattr(threads, "THREAD_OPS", [0])[0]
        pool_threads = module("test_pool_threads")
        if pool_threads is not None:
            per_test = getattr(pool_threads, "THREADS", 0) * getattr(pool_threads, "OPS", 0)
            out["thread_ops"] += per_test * sum(
                1 for t in self.tests if t["id"].startswith("tests/test_pool_threads.py::")
                and "sixteen_threads" in t["id"] and t["outcome"] == "passed")
        fuzz = module("test_pool_fuzz")
        if fuzz is not None:
            out["fuzz_ops_in_suite"] = 3000 * sum(
                1 for t in self.tests if "test_pool_fuzz.py::test_fuzz_short" in t["id"]
                and t["outcome"] == "passed")
        return out


def pytest_child(out_path: str, args: List[str]) -> int:
    import pytest
    collector = Collector(out_path + ".running")
    rc = pytest.main(args, plugins=[collector])
    with open(out_path, "w") as fh:
        json.dump({"rc": int(rc), "tests": collector.tests, "counters": collector.counters()},
                  fh)
    return 0


# ------------------------------------------------------------------ the parent
def _crash_excerpt(stderr: str, head: int = 25) -> str:
    """The innermost frames of a fatal error's traceback (faulthandler prints them first),
    then the end of stderr."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if "Fatal Python error" in line), None)
    if start is None:
        return stderr[-2000:]
    first = lines[start:start + head]
    rest = lines[start + head:]
    return "\n".join(first + (["..."] + rest[-5:] if rest else []))


def classify(message: str) -> str:
    if CRASH.search(message):
        return "crash"
    if HANG.search(message):
        return "hang"
    if LEAK.search(message):
        return "leak"
    if CORRUPTION.search(message):
        return "corruption"
    return "other"


def run(args: argparse.Namespace) -> Dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("HIPMR_PLATFORM", "emulated")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    files = [f"tests/{t}" for t in TESTS] + [f"tests/{t}" for t in OPTIONAL_TESTS
                                             if (ROOT / "tests" / t).exists()]
    started = time.perf_counter()

    fuzz_proc = None
    targets = _fuzz_targets()
    per_target = max(1, args.fuzz_ops // len(targets)) if args.fuzz_ops else 0
    if per_target:
        fuzz_proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", str(ROOT / "scripts" / "fuzz_pool.py"),
             "--seed", str(args.seed), "--ops", str(per_target), "--target", "all"],
            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    with tempfile.TemporaryDirectory(prefix="hipmr-reliability-") as tmp:
        out_path = os.path.join(tmp, "pytest.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--pytest-child", out_path, "--",
               "-q", "-p", "no:cacheprovider", *files, *args.pytest_args]
        proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True)
        try:
            with open(out_path + ".running") as fh:
                running = fh.read().strip()
        except OSError:
            running = ""
        try:
            with open(out_path) as fh:
                suite = json.load(fh)
        except (OSError, ValueError):
            suite = {"rc": None, "tests": [], "counters": {}}
    suite_seconds = time.perf_counter() - started

    fuzz: Dict[str, Any] = {"ops": 0, "runs": 0, "failures": [], "crashed": False}
    if fuzz_proc is not None:
        fout, ferr = fuzz_proc.communicate()
        for line in fout.splitlines():
            m = re.match(r"ok\s+seed=\d+ target=\S+ ops=(\d+)", line)
            if m:
                fuzz["ops"] += int(m.group(1))
                fuzz["runs"] += 1
            elif line.startswith("FAIL"):
                fuzz["failures"].append(line)
        fuzz["returncode"] = fuzz_proc.returncode
        fuzz["crashed"] = fuzz_proc.returncode not in (0, 1)
        if fuzz["crashed"]:
            fuzz["stderr"] = _crash_excerpt(ferr)

    tests = suite["tests"]
    counts = {k: sum(1 for t in tests if t["outcome"] == k)
              for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    kinds = {"crash": 0, "hang": 0, "leak": 0, "corruption": 0, "other": 0}
    failures = []
    for t in tests:
        if t["outcome"] in ("failed", "error"):
            kind = classify(t.get("message", ""))
            kinds[kind] += 1
            failures.append({"id": t["id"], "kind": kind,
                             "message": t.get("message", "")[-600:]})
    suite_crashed = proc.returncode != 0 or suite["rc"] is None
    if suite_crashed:
        kinds["crash"] += 1
        failures.append({"id": f"pytest child process, in {running or 'no test'}",
                         "kind": "crash",
                         "message": f"rc={proc.returncode}: {_crash_excerpt(proc.stderr)}"})
    if fuzz["crashed"]:
        kinds["crash"] += 1
        failures.append({"id": "fuzz_pool child process", "kind": "crash",
                         "message": f"rc={fuzz.get('returncode')}: {fuzz.get('stderr', '')}"})
    kinds["corruption"] += len(fuzz["failures"])
    failures += [{"id": "fuzz_pool", "kind": "corruption", "message": f}
                 for f in fuzz["failures"]]

    c = suite.get("counters", {})
    rows = [
        ("bad inputs tried", c.get("bad_input_cases", 0) + c.get("junk_calls", 0),
         f"{c.get('bad_input_cases', 0):,} table cases + {c.get('junk_calls', 0):,} junk calls"),
        ("faults injected", c.get("faults_injected", 0),
         "injected runtime failures, out-of-memory, missing or unusable libraries"),
        ("thread operations run", c.get("thread_ops", 0), "16 threads per test"),
        ("fuzz operations run", fuzz["ops"] + c.get("fuzz_ops_in_suite", 0),
         f"{fuzz['ops']:,} by fuzz_pool.py ({fuzz['runs']} runs) + "
         f"{c.get('fuzz_ops_in_suite', 0):,} in test_pool_fuzz"),
        ("exit scenarios run", c.get("exit_scenarios", 0),
         "child processes exiting with everything alive (or dropped first), user finalizers "
         "and daemon threads at exit"),
        ("garbage collections inside locks", c.get("gc_lock_cases", 0),
         "a finalizer frees through the resource inside its own section; child processes"),
        ("stream identity cases", c.get("stream_identity_cases", 0),
         "per-thread and per-device null streams kept apart"),
        ("misbehaving upstream cases", c.get("misbehaving_cases", 0),
         "duplicate, unaligned, out-of-range results; failing log files"),
        ("size, growth and pickle cases", c.get("size_growth_pickle_cases", 0),
         "integer-like sizes, sizes near 2**63, bounded state, picklable errors"),
        ("tests passed / failed / skipped", None,
         f"{counts['passed']} / {counts['failed'] + counts['error']} / {counts['skipped']}"
         + (f" (+{counts['xfailed']} xfailed)" if counts["xfailed"] else "")),
        ("crashes", kinds["crash"], "must be 0"),
        ("hangs", kinds["hang"], "must be 0"),
        ("leaks", kinds["leak"], "must be 0"),
        ("corruptions", kinds["corruption"], "must be 0"),
        ("other failures", kinds["other"], ""),
    ]
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "scripts/reliability_report.py", *sys.argv[1:]]),
        "platform": env["HIPMR_PLATFORM"],
        "python": _platform.python_version(),
        "machine": f"{_platform.system()} {_platform.machine()}, {os.cpu_count()} CPUs",
        "seconds": round(time.perf_counter() - started, 1),
        "suite_seconds": round(suite_seconds, 1),
        "rows": [{"measure": m, "count": n, "note": note} for m, n, note in rows],
        "tests": counts, "failure_kinds": kinds, "failures": failures,
        "counters": c, "fuzz": {k: v for k, v in fuzz.items() if k != "stderr"},
        "ok": kinds["crash"] == kinds["hang"] == kinds["leak"] == kinds["corruption"] == 0
        and counts["failed"] + counts["error"] == 0 and not suite_crashed,
    }


def _fuzz_targets() -> tuple:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import fuzz_pool
        return tuple(fuzz_pool.TARGETS)
    except Exception:  # noqa: BLE001 - the fuzzer's own run will report it
        return ("all",)
    finally:
        sys.path.pop(0)


def format_table(result: Dict[str, Any]) -> str:
    lines = [f"hipmr_ctypes reliability report, {result['date']}",
             f"command: {result['command']}",
             f"platform: HIPMR_PLATFORM={result['platform']}, Python {result['python']}, "
             f"{result['machine']}; {result['seconds']} s",
             "",
             "| measure | count | note |",
             "|---|---:|---|"]
    for row in result["rows"]:
        count = "" if row["count"] is None else f"{row['count']:,}"
        lines.append(f"| {row['measure']} | {count} | {row['note']} |")
    if result["failures"]:
        lines.append("")
        lines.append("failures:")
        for f in result["failures"]:
            msg = f["message"].strip().splitlines()
            # a crash: its innermost frame; a failed test: the last line of its report
            frames = [m for m in msg if m.strip().startswith("File ")] if f["kind"] == "crash" \
                else []
            frames = [m for m in frames if "/lib/python" not in m] or frames  # not the stdlib's
            first = (frames or msg[-1:] or [""])[0].strip()
            lines.append(f"  [{f['kind']}] {f['id']}: {first[:200]}")
    lines.append("")
    lines.append("result: " + ("OK" if result["ok"] else "NOT OK"))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pytest-child"]:
        rest = argv[2:]
        return pytest_child(argv[1], rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fuzz-ops", type=int, default=1_000_000,
                        help="fuzz operations in all, spread over fuzz_pool.py's targets "
                             "(default 1,000,000; 0 skips the fuzzer)")
    parser.add_argument("--seed", type=int, default=1, help="first fuzz seed (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also save the full result as JSON")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    result = run(args)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Run the reliability suite and print one table: bad inputs tried, faults injected, thread
operations run, fuzz operations run, exit scenarios, collections inside locks, stream identity,
misbehaving upstream, size, and log, plot and command-line cases; crashes, hangs, leaks,
corruptions (all four must be 0).

    python scripts/reliability_report.py                       # emulated unless HIPMR_PLATFORM says
    python scripts/reliability_report.py --budget 200          # ends within 200 s, says what it cut
    HIPMR_PLATFORM=nvidia python scripts/reliability_report.py --budget 200 --fuzz-ops 200000
    python scripts/reliability_report.py --only test_threads --only fuzz_pool.py  # some only

What runs: one *section* per test file holding tests marked ``reliability`` (found by
collecting ``tests/`` in a child process first, so a file is found whatever its name or folder),
and one per target of scripts/fuzz_pool.py, which shares ``--fuzz-ops`` (default 1,000,000)
among its targets.  The marker says what a test counts for: ``reliability("gc_lock_cases")``
counts it in that row when it ran, ``reliability(counters={"thread_ops": THREAD_OPS})``
declares a list the module adds its counts to (summed); the rows the table prints are declared
here (``COUNTED`` and ``_summarize``).  Each section is a child process of its own (so that a
crash of the interpreter is seen and counted, not fatal to the report), in a process group of
its own; ``--jobs`` of them run at once (default: one per CPU, at most 16), the files with the
most marked tests first.  A pytest section runs with a plugin that records every test's outcome,
duration, row and, for a failure, its kind as it ends, and the declared counters; each
section's line is printed as it finishes.  A fuzz section reads the JSON lines the fuzzer
writes (``--record``).

``--budget SECONDS`` bounds the whole run.  The fuzzer and the thread tests' long loops stop at
the budget's deadline (a few seconds before its end) and count the operations they ran: the
report names them as *shortened*.  A section still running at the deadline is stopped (its
threads' stacks are dumped first, to name where it was) and sections not yet started are not
run: the report names them as *cut*, keeps every test that had finished, and its result is
INCOMPLETE, never OK.  SIGTERM or SIGINT (an outer ``timeout``) ends the run the same way,
with the table printed.

``HIPMR_PLATFORM`` is passed through (default ``emulated``): on ``nvidia`` or ``amd`` the gpu
tests run too, and the tests that need the emulator's hooks skip.  A failure's kind comes
from pytest's report of it, never from its text: the class of the exception that failed the
test has a ``reliability_kind`` (``tests/support.py``'s ``Crash``, ``Hang``, ``Leak``;
``scripts/pool_model.py``'s ``Corruption``, which the fuzzer's failures are) or is
``subprocess.TimeoutExpired`` (a hang); a section's process that died is a crash; anything
else is "other failures".  Exit status: 0 when no test failed and crashes, leaks and
corruptions are all 0 (OK, possibly with shortened sections); 1 when something failed (NOT OK);
2 when nothing failed but sections were cut (INCOMPLETE).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as _platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
#: where the sections are found: every file there holding a test marked ``reliability``
TESTS_DIR = "tests"
#: the kinds of failure the table counts (``failure_kinds``), the last one for the rest
KINDS = ("crash", "hang", "leak", "corruption", "other")
#: pytest outcomes of a test that ran (a row counts these)
RAN = ("passed", "failed", "xfailed", "xpassed")
#: what the table reads: the rows tests name in their ``reliability`` marker and the counters
#: test modules declare in it (0 when none ran)
COUNTED = ("bad_input_cases", "junk_calls", "faults_injected", "thread_ops",
           "thread_ops_planned", "threads_cut", "fuzz_ops_in_suite", "exit_scenarios",
           "frozen_thread_exit_runs", "gc_lock_cases", "stream_identity_cases", "misbehaving_cases",
           "size_growth_pickle_cases", "ipc_fork_stream_cases", "log_plot_cli_cases",
           "exit_thread_message_cases", "copy_ownership_cases", "output_file_emulator_cases")
#: seconds before the end of the budget at which the long loops stop (the section still has
#: to finish its tests) and the report itself stops every section (it still has to report)
LOOP_MARGIN = 0.12
REPORT_MARGIN = 0.04


# ------------------------------------------------------------------ the pytest child process
class Collector:
    """pytest plugin: every test's outcome and duration, and the counters of the reliability
    modules, appended to a JSON-lines file as each test ends (a section stopped or crashed
    midway keeps what had finished)."""

    def __init__(self, path: Optional[str] = None) -> None:
        self.tests: List[Dict[str, Any]] = []
        self.path = path
        self._fh = open(path, "a") if path else None
        self._counters: Dict[str, int] = {}
        self._lists: Dict[int, Tuple[str, List[int]]] = {}   # id(list) -> (counter, list)
        self._rows: Dict[str, str] = {}                       # test id -> its row
        self._kinds: Dict[Tuple[str, str], str] = {}          # (test id, phase) -> kind

    def _write(self, record: Dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:
            row = marked_row(item)
            if row:
                self._rows[item.nodeid] = row
            for mark in item.iter_markers("reliability"):
                for name, counts in (mark.kwargs.get("counters") or {}).items():
                    self._lists[id(counts)] = (name, counts)
        self._write({"collected": len(session.items)})

    def pytest_runtest_makereport(self, item: Any, call: Any) -> None:
        """The failure's kind, from its exception (the report itself is pytest's)."""
        if call.excinfo is not None:
            self._kinds[(item.nodeid, call.when)] = kind_of(call.excinfo.type)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        """Name the test now running, so that a crash or a stop can say which."""
        self._write({"running": nodeid, "at": time.time()})

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
            if report.nodeid in self._rows:
                entry["row"] = self._rows[report.nodeid]
            if report.outcome == "failed":
                entry["kind"] = self._kinds.get((report.nodeid, report.when), "other")
                entry["message"] = str(report.longrepr)[-4000:]
            self.tests.append(entry)
            self._write({"test": entry})

    def pytest_collectreport(self, report: Any) -> None:
        """A file that cannot be collected (an import or syntax error) is an error, not a
        section with no tests."""
        if report.failed:
            entry = {"id": report.nodeid or "collection", "outcome": "error", "seconds": 0.0,
                     "kind": "other", "message": str(report.longrepr)[-4000:]}
            self.tests.append(entry)
            self._write({"test": entry})

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        record: Dict[str, Any] = {"finished": nodeid}
        counters = self.counters()
        if counters != self._counters:
            self._counters = record["counters"] = counters
        self._write(record)

    def counters(self) -> Dict[str, int]:
        """The counters the test modules declare (``reliability(counters=...)``: a name and the
        list the module adds to), summed, as they stand now."""
        out: Dict[str, int] = {}
        for name, counts in self._lists.values():
            out[name] = out.get(name, 0) + int(sum(counts))
        return out


def marked_row(item: Any) -> Optional[str]:
    """The row a test counts in: its closest ``reliability`` marker's ``row`` (or first
    argument); None for an unmarked test or a marker naming no row."""
    mark = item.get_closest_marker("reliability")
    if mark is None:
        return None
    row = mark.args[0] if mark.args else mark.kwargs.get("row")
    return None if row is None else str(row)


def kind_of(exc_type: type) -> str:
    """The kind of failure an exception of this class is: its ``reliability_kind`` (the
    test helpers' ``Crash``, ``Hang``, ``Leak``, ``Corruption``; the fuzzer's ``FuzzFailure``
    is a ``Corruption``), a timed-out child process is a hang, anything else "other"."""
    kind = getattr(exc_type, "reliability_kind", None)
    if kind in KINDS:
        return str(kind)
    if isinstance(exc_type, type) and issubclass(exc_type, subprocess.TimeoutExpired):
        return "hang"
    return "other"


class Finder:
    """pytest plugin for the collection child: the files holding a test marked
    ``reliability`` (with how many such tests), and the files that cannot be collected."""

    def __init__(self) -> None:
        self.files: Dict[str, int] = {}
        self.errors: List[Dict[str, Any]] = []

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:
            if item.get_closest_marker("reliability") is not None:
                path = item.nodeid.split("::")[0]
                self.files[path] = self.files.get(path, 0) + 1

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.errors.append({"id": report.nodeid or "collection", "outcome": "error",
                                "seconds": 0.0, "kind": "other",
                                "message": str(report.longrepr)[-4000:]})


def collect_child(out_path: str, args: List[str]) -> int:
    import pytest
    finder = Finder()
    rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args],
                     plugins=[finder])
    with open(out_path, "w") as fh:
        json.dump({"files": finder.files, "errors": finder.errors, "rc": int(rc)}, fh)
    return 0


def pytest_child(out_path: str, args: List[str]) -> int:
    import faulthandler
    import pytest
    # the report asks for every thread's stack (SIGUSR1) before it stops a section; to a
    # file of its own (pytest captures file descriptor 2 while a test runs)
    stacks = open(out_path + ".stacks", "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    collector = Collector(out_path)
    rc = pytest.main(args, plugins=[collector])
    collector._write({"done": int(rc)})
    stacks.close()
    return 0


def _die_with_parent() -> None:
    """In a section's process before it runs (Linux): be killed if the report dies, so that
    no section outlives a report killed with SIGKILL."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def read_records(path: str) -> List[Dict[str, Any]]:
    """The records of a JSON-lines file (none if it is missing; a torn last line is
    ignored)."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_section(path: str) -> Dict[str, Any]:
    """What a pytest section's JSON-lines file says."""
    result: Dict[str, Any] = {"tests": [], "counters": {}, "collected": None, "running": "",
                              "since": None, "done": None}
    for record in read_records(path):
        if "test" in record:
            result["tests"].append(record["test"])
        elif "running" in record:
            result["running"], result["since"] = record["running"], record.get("at")
        elif "finished" in record:
            result["running"] = ""
            result["counters"] = record.get("counters", result["counters"])
        elif "collected" in record:
            result["collected"] = record["collected"]
        elif "done" in record:
            result["done"] = record["done"]
            result["running"] = ""
    return result


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


def _where(stacks: str) -> str:
    """The innermost frame of user code (a test, the package) in the thread that took the signal
    (faulthandler's "Current thread"; else the first thread) of a stack dump."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", "\n" + stacks)
    block = next((b for b in blocks if b.startswith("Current thread")), None) or \
        next((b for b in blocks if b.strip()), "")
    frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
    ours = [f for f in frames  # not the standard library's, pytest's, or this script's
            if not re.search(r"/lib/python|site-packages|<frozen|reliability_report\.py", f)]
    return (ours or frames or ["(no stack was dumped)"])[0]


class Section:
    """One child process of the report: a test file under pytest, or a fuzz target."""

    def __init__(self, name: str, kind: str, cmd: List[str], workdir: str,
                 planned_ops: int = 0) -> None:
        self.name = name
        self.kind = kind            # "pytest" or "fuzz"
        self.cmd = cmd
        self.planned_ops = planned_ops
        self.out = os.path.join(workdir, "out.txt")
        self.err = os.path.join(workdir, "err.txt")
        self.jsonl = os.path.join(workdir, "tests.jsonl")
        self.proc: Optional[subprocess.Popen] = None
        self.started = self.ended = 0.0
        self.status = "not run"     # complete / shortened / cut / not run / crashed / failed
        self.stopped = False        # stopped by the report at the deadline
        self.result: Dict[str, Any] = {}

    @property
    def seconds(self) -> float:
        return round(self.ended - self.started, 1) if self.started else 0.0

    def start(self, env: Dict[str, str]) -> None:
        self.started = time.time()
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(self.cmd, cwd=str(ROOT), env=env, stdout=out,
                                         stderr=err, start_new_session=True,
                                         preexec_fn=_die_with_parent)

    def ask_for_stacks(self) -> None:
        """The deadline, first step: a pytest section dumps its threads' stacks."""
        assert self.proc is not None
        self.stopped = True
        if self.kind == "pytest" and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGUSR1)
            except OSError:
                pass

    def kill(self) -> None:
        """The deadline, second step: end the process group (the test's own child processes
        too)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()

    def read(self, stderr: str) -> None:
        """Fill ``result`` and ``status`` once the process has ended."""
        assert self.proc is not None
        rc = self.proc.returncode
        if self.kind == "pytest":
            res = read_section(self.jsonl)
            res["rc"] = rc
            crashed = not self.stopped and (rc != 0 or res["done"] is None)
            if crashed:
                res["crash"] = f"rc={rc}: {_crash_excerpt(stderr)}"
            elif res["done"] in (2, 3, 4) and not any(
                    t["outcome"] in ("failed", "error") for t in res["tests"]):
                # interrupted, an internal error or a usage error, with no test to blame
                try:
                    with open(self.out, errors="replace") as fh:
                        out = fh.read()
                except OSError:
                    out = ""
                res["tests"].append({"id": self.name, "outcome": "error", "seconds": 0.0,
                                     "message": f"pytest exited with status {res['done']}: "
                                                f"{(out + stderr)[-2000:]}"})
            if self.stopped:
                try:
                    with open(self.jsonl + ".stacks", errors="replace") as fh:
                        stacks = fh.read()
                except OSError:
                    stacks = ""
                res["stack"] = stacks[-20000:]
                res["where"] = _where(stacks)
            self.result = res
            cut = res["counters"].get("threads_cut", 0)
            self.status = ("crashed" if crashed else "cut" if self.stopped
                           else "shortened" if cut else "complete")
            return
        fuzz: Dict[str, Any] = {"ops": 0, "runs": 0, "failures": [], "returncode": rc,
                                "stopped_early": 0, "skipped": 0}
        for run in read_records(self.jsonl):  # fuzz_pool.py --record: one line per run
            if run.get("skipped"):
                fuzz["skipped"] += 1
            elif run.get("failure") is not None:
                fuzz["failures"].append(f"FAIL {run['failure']}")
            else:
                fuzz["ops"] += int(run["ops"])
                fuzz["runs"] += 1
                fuzz["stopped_early"] += int(run["ops"]) < int(run["asked"])
        fuzz["crashed"] = not self.stopped and rc not in (0, 1)
        if fuzz["crashed"]:
            fuzz["stderr"] = _crash_excerpt(stderr)
        self.result = fuzz
        self.status = ("crashed" if fuzz["crashed"] else "cut" if self.stopped
                       else "failed" if fuzz["failures"]
                       else "shortened" if fuzz["ops"] < self.planned_ops else "complete")

    def line(self) -> str:
        """The one line printed when the section ends."""
        res = self.result
        if self.status == "not run":
            return f"{self.name}: not run (the budget was spent)"
        if self.kind == "fuzz":
            what = f"{res.get('ops', 0):,} of {self.planned_ops:,} ops"
            if res.get("failures"):
                what += f", {len(res['failures'])} FAILED"
        else:
            tests = res.get("tests", [])
            counts = _counts(tests)
            what = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no tests"
            if res.get("collected") is not None and self.status == "cut":
                what += f" ({len(tests)} of {res['collected']} tests ended)"
        status = {"complete": "", "failed": ""}.get(self.status, self.status.upper() + ": ")
        if self.status == "cut" and self.kind == "pytest" and res.get("running"):
            what += f"; stopped in {res['running']}"
            if res.get("since"):
                what += f" after {self.ended - res['since']:.1f} s in it"
        if self.status == "shortened" and self.kind == "pytest":
            what += (f"; thread loops stopped at the deadline "
                     f"({res['counters'].get('threads_cut', 0)} threads)")
        return f"{self.name}: {status}{what} in {self.seconds} s"


def _counts(tests: List[Dict[str, Any]]) -> Dict[str, int]:
    return {k: sum(1 for t in tests if t["outcome"] == k)
            for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}


def _split_pytest_args(args: List[str]) -> Tuple[List[str], List[str]]:
    """(paths, options): extra arguments naming files or folders become sections of their
    own; the others (``-k EXPR``, ``-x``...) go to every pytest section."""
    paths, options = [], []
    for arg in args:
        if not arg.startswith("-") and os.path.exists(arg.split("::")[0]) and (
                not options or options[-1] not in ("-k", "-m", "-p", "-o", "--deselect")):
            paths.append(os.path.abspath(arg))  # the sections run in the repository root
        else:
            options.append(arg)
    return paths, options


def find_sections(env: Dict[str, str], tmp: str, timeout: Optional[float] = None,
                  collected: Optional[str] = None) -> Tuple[List[str], List[Dict[str, Any]]]:
    """The test files holding tests marked ``reliability`` (collected in a child process, the
    files with the most such tests first), and the collection's errors (a file that cannot be
    collected might hold some).  The child writes what it collected to ``tmp``'s
    ``collected.json``; ``collected`` names such a file written before, read instead of
    collecting again (``--collected``)."""
    out = collected or os.path.join(tmp, "collected.json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--collect-child", out, "--",
           TESTS_DIR]
    proc = None
    try:
        if collected is None:
            proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True,
                                  timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], [{"id": f"collection of {TESTS_DIR}", "outcome": "error", "seconds": 0.0,
                     "kind": "hang", "message": f"pytest --collect-only {TESTS_DIR} did not "
                                                f"end within {timeout:.0f} s"}]
    try:
        with open(out) as fh:
            found = json.load(fh)
    except (OSError, ValueError):
        found = {"files": {}, "errors": [], "rc": None}
    errors = list(found["errors"])
    if found["rc"] not in (0, 5) and not errors:  # 5: no tests collected
        errors.append({"id": f"collection of {TESTS_DIR}", "outcome": "error", "seconds": 0.0,
                       "kind": "crash" if proc and proc.returncode < 0 else "other",
                       "message": f"pytest --collect-only exited with status {found['rc']} "
                                  f"(rc={proc.returncode if proc else None}): "
                                  f"{(proc.stdout + proc.stderr)[-2000:] if proc else out}"})
    files = sorted(found["files"], key=lambda f: (-found["files"][f], f))
    return files, errors


def plan(args: argparse.Namespace, tmp: str,
         files: List[str]) -> List[Section]:
    """Every section, in the order they start: ``files`` (found by :func:`find_sections`),
    the extra paths, the fuzz targets."""
    paths, options = _split_pytest_args(args.pytest_args)
    sections = []
    script = str(Path(__file__).resolve())
    for i, path in enumerate(files + paths):
        work = os.path.join(tmp, f"section{i}")
        os.mkdir(work)
        jsonl = os.path.join(work, "tests.jsonl")
        cmd = [sys.executable, "-X", "faulthandler", script, "--pytest-child", jsonl, "--",
               "-q", "-p", "no:cacheprovider", "--basetemp", os.path.join(work, "tmp"),
               path, *options]
        sections.append(Section(path, "pytest", cmd, work))
    targets = _fuzz_targets()
    per_target = args.fuzz_ops // len(targets) if args.fuzz_ops else 0
    if per_target:
        for i, target in enumerate(targets):
            work = os.path.join(tmp, f"fuzz{i}")
            os.mkdir(work)
            cmd = [sys.executable, "-X", "faulthandler", str(ROOT / "scripts" / "fuzz_pool.py"),
                   "--seed", str(args.seed), "--ops", str(per_target), "--target", target,
                   "--record", os.path.join(work, "tests.jsonl")]
            sections.append(Section(f"scripts/fuzz_pool.py {target}", "fuzz", cmd, work,
                                    per_target))
    if args.only:
        sections = [s for s in sections if any(o in s.name for o in args.only)]
    return sections


def _say(started: float, text: str) -> None:
    print(f"[{time.time() - started:6.1f} s] {text}", flush=True)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("HIPMR_PLATFORM", "emulated")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    started = time.time()
    deadline = loop_deadline = None
    if args.budget is not None:
        deadline = started + args.budget * (1 - REPORT_MARGIN) - 1.0
        loop_deadline = started + args.budget * (1 - LOOP_MARGIN) - 3.0
        env["HIPMR_TEST_DEADLINE"] = repr(loop_deadline)
    jobs = args.jobs or max(1, min(os.cpu_count() or 1, 16))
    interrupted: List[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        interrupted.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    with tempfile.TemporaryDirectory(prefix="hipmr-reliability-") as tmp:
        files, collect_errors = find_sections(
            env, tmp, None if deadline is None else max(1.0, deadline - time.time()),
            args.collected)
        sections = plan(args, tmp, files)
        for s in sections:
            if s.kind == "fuzz" and loop_deadline is not None:
                s.cmd += ["--deadline", repr(loop_deadline)]
        budget = f"budget {args.budget:g} s" if args.budget is not None else "no budget"
        _say(started, f"{len(sections)} sections, {jobs} at a time, {budget}; "
                      f"HIPMR_PLATFORM={env['HIPMR_PLATFORM']}")
        try:
            _schedule(sections, jobs, env, started, deadline, interrupted)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        result = _summarize(args, env, sections, started, interrupted, collect_errors)
    return result


def _schedule(sections: List[Section], jobs: int, env: Dict[str, str], started: float,
              deadline: Optional[float], interrupted: List[int]) -> None:
    """Run the sections, ``jobs`` at a time, until all ended or the deadline passed (or a
    signal came): then stop the running ones and leave the rest not run."""
    waiting = list(sections)
    running: List[Section] = []
    while waiting or running:
        over = bool(interrupted) or (deadline is not None and time.time() > deadline)
        if over:
            for s in running:
                s.ask_for_stacks()
            if running:
                time.sleep(0.5)
            for s in running:
                s.kill()
                _finish(s, started)
            running = []
            for s in waiting:
                _say(started, s.line())
            return
        while waiting and len(running) < jobs:
            s = waiting.pop(0)
            s.start(env)
            running.append(s)
        for s in list(running):
            assert s.proc is not None
            if s.proc.poll() is not None:
                running.remove(s)
                _finish(s, started)
        time.sleep(0.05)


def _finish(s: Section, started: float) -> None:
    s.ended = time.time()
    try:
        with open(s.err, errors="replace") as fh:
            stderr = fh.read()
    except OSError:
        stderr = ""
    s.read(stderr)
    _say(started, s.line())


def _summarize(args: argparse.Namespace, env: Dict[str, str], sections: List[Section],
               started: float, interrupted: List[int],
               collect_errors: List[Dict[str, Any]]) -> Dict[str, Any]:
    tests: List[Dict[str, Any]] = list(collect_errors)
    counters: Dict[str, int] = {}
    fuzz: Dict[str, Any] = {"ops": 0, "runs": 0, "failures": [], "crashed": False,
                            "planned": 0}
    failures: List[Dict[str, Any]] = []
    kinds = {kind: 0 for kind in KINDS}
    for s in sections:
        res = s.result
        if s.kind == "pytest":
            tests += res.get("tests", [])
            for k, v in res.get("counters", {}).items():
                counters[k] = counters.get(k, 0) + v
            if s.status == "crashed":
                kinds["crash"] += 1
                failures.append({"id": f"pytest child process of {s.name}, in "
                                       f"{res.get('running') or 'no test'}",
                                 "kind": "crash", "message": res.get("crash", "")})
        else:
            fuzz["planned"] += s.planned_ops
            fuzz["ops"] += res.get("ops", 0)
            fuzz["runs"] += res.get("runs", 0)
            fuzz["failures"] += res.get("failures", [])
            if res.get("crashed"):
                fuzz["crashed"] = True
                kinds["crash"] += 1
                failures.append({"id": f"fuzz_pool child process ({s.name})", "kind": "crash",
                                 "message": f"rc={res.get('returncode')}: "
                                            f"{res.get('stderr', '')}"})
    counts = _counts(tests)
    for t in tests:
        if t["outcome"] in ("failed", "error"):
            kind = t.get("kind", "other")
            kinds[kind] += 1
            failures.append({"id": t["id"], "kind": kind,
                             "message": t.get("message", "")[-600:]})
    kinds["corruption"] += len(fuzz["failures"])
    failures += [{"id": "fuzz_pool", "kind": "corruption", "message": f}
                 for f in fuzz["failures"]]

    c = dict(counters)  # the modules' counters, then one per test in the row it names
    for t in tests:
        if t.get("row") and t["outcome"] in RAN:
            c[t["row"]] = c.get(t["row"], 0) + 1
    for key in COUNTED:
        c.setdefault(key, 0)
    c["exit_scenarios"] += c.get("frozen_thread_exit_runs", 0)

    shortened = [s for s in sections if s.status == "shortened"]
    cut = [s for s in sections if s.status in ("cut", "not run")]
    thread_note = "16 threads per test"
    if c["threads_cut"]:
        thread_note += (f"; SHORTENED at the deadline: {c['thread_ops']:,} of "
                        f"{c['thread_ops_planned']:,} planned")
    fuzz_note = (f"{fuzz['ops']:,} by fuzz_pool.py ({fuzz['runs']} runs) + "
                 f"{c['fuzz_ops_in_suite']:,} in test_pool_fuzz")
    if fuzz["ops"] < fuzz["planned"]:
        fuzz_note += f"; SHORTENED: {fuzz['ops']:,} of {fuzz['planned']:,} asked"
    rows = [
        ("bad inputs tried", c["bad_input_cases"] + c["junk_calls"],
         f"{c['bad_input_cases']:,} table cases + {c['junk_calls']:,} junk calls"),
        ("faults injected", c["faults_injected"],
         "injected runtime failures, out-of-memory, missing or unusable libraries"),
        ("thread operations run", c["thread_ops"], thread_note),
        ("fuzz operations run", fuzz["ops"] + c["fuzz_ops_in_suite"], fuzz_note),
        ("exit scenarios run", c["exit_scenarios"],
         "child processes exiting with everything alive (or dropped first), user finalizers "
         "and daemon threads at exit"),
        ("garbage collections inside locks", c["gc_lock_cases"],
         "a finalizer frees through the resource inside its own section; child processes"),
        ("stream identity cases", c["stream_identity_cases"],
         "per-thread and per-device null streams kept apart; per-thread streams waited for "
         "when their thread ends"),
        ("misbehaving upstream cases", c["misbehaving_cases"],
         "duplicate, unaligned, out-of-range results; failing log files"),
        ("size, growth and pickle cases", c["size_growth_pickle_cases"],
         "integer-like sizes, sizes near 2**63, bounded state, picklable errors"),
        ("IPC trust, fork, closed-stream and stack cases", c["ipc_fork_stream_cases"],
         "forged descriptors, one mapping per process, forked children refused, closed "
         "streams refused, stacks of any depth and cycles"),
        ("log, plot and command-line cases", c["log_plot_cli_cases"],
         "any time span, bad logs named by line, valid XML, whole output files, one writer "
         "per log, one-line CLI errors, closed pipes"),
        ("tests passed / failed / skipped", None,
         f"{counts['passed']} / {counts['failed'] + counts['error']} / {counts['skipped']}"
         + (f" (+{counts['xfailed']} xfailed)" if counts["xfailed"] else "")),
        ("crashes", kinds["crash"], "must be 0"),
        ("hangs", kinds["hang"], "must be 0"),
        ("leaks", kinds["leak"], "must be 0"),
        ("corruptions", kinds["corruption"], "must be 0"),
        ("other failures", kinds["other"], ""),
    ]
    rows.insert([r[0] for r in rows].index("tests passed / failed / skipped"),
                ("interrupted copy, short message, read-only and ownership cases",
                 c["copy_ownership_cases"],
                 "signals at every wait of a staged copy, short MPI messages, read-only "
                 "exports, closed streams, DLPack and from_handle ownership, DLPack ranges"))
    rows.insert([r[0] for r in rows].index("tests passed / failed / skipped"),
                ("thread, exit and message cases", c["exit_thread_message_cases"],
                 "overlapping statistics() and profiler blocks across threads, exit with "
                 "frozen threads holding locks, constructor messages, RMM parity"))
    rows.insert([r[0] for r in rows].index("tests passed / failed / skipped"),
                ("output file and emulator error cases", c["output_file_emulator_cases"],
                 "plot writes regular files only (links followed, -o - to standard output); "
                 "the emulator's own Python errors never become HIP statuses"))
    failed = bool(failures) or counts["failed"] + counts["error"] > 0
    complete = not cut
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "scripts/reliability_report.py", *sys.argv[1:]]),
        "platform": env["HIPMR_PLATFORM"],
        "python": _platform.python_version(),
        "machine": f"{_platform.system()} {_platform.machine()}, {os.cpu_count()} CPUs",
        "budget": args.budget,
        "interrupted_by": [signal.Signals(s).name for s in interrupted],
        "seconds": round(time.time() - started, 1),
        "rows": [{"measure": m, "count": n, "note": note} for m, n, note in rows],
        "sections": [{"name": s.name, "status": s.status, "seconds": s.seconds,
                      "tests": len(s.result.get("tests", [])),
                      "collected": s.result.get("collected"),
                      "running": s.result.get("running") or None,
                      "where": s.result.get("where"), "stack": s.result.get("stack"),
                      "ops": s.result.get("ops"), "planned_ops": s.planned_ops or None}
                     for s in sections],
        "slowest": sorted(({"id": t["id"], "seconds": t["seconds"]} for t in tests),
                          key=lambda t: -t["seconds"])[:10],
        "shortened": [s.name for s in shortened],
        "cut": [s.name for s in cut],
        "tests": counts, "failure_kinds": kinds, "failures": failures,
        "counters": c, "fuzz": fuzz,
        "failed": failed,
        "complete": complete,
        "ok": not failed and complete,
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
    budget = "" if result["budget"] is None else f" (budget {result['budget']:g} s)"
    lines = [f"hipmr_ctypes reliability report, {result['date']}",
             f"command: {result['command']}",
             f"platform: HIPMR_PLATFORM={result['platform']}, Python {result['python']}, "
             f"{result['machine']}; {result['seconds']} s{budget}",
             "",
             "| measure | count | note |",
             "|---|---:|---|"]
    for row in result["rows"]:
        count = "" if row["count"] is None else f"{row['count']:,}"
        lines.append(f"| {row['measure']} | {count} | {row['note']} |")
    lines.append("")
    lines.append("sections (seconds): " + ", ".join(
        f"{s['name'].replace('tests/', '')} {s['seconds']}"
        + ("" if s["status"] == "complete" else f" [{s['status']}]")
        for s in sorted(result["sections"], key=lambda s: -s["seconds"])))
    if result["slowest"]:
        lines.append("slowest tests: " + ", ".join(
            f"{t['id'].replace('tests/', '')} {t['seconds']:.1f} s"
            for t in result["slowest"][:5]))
    if result["shortened"]:
        lines.append("shortened to fit the budget: " + ", ".join(result["shortened"]))
    if result["cut"]:
        lines.append("CUT (not run to the end): " + ", ".join(result["cut"]))
        for s in result["sections"]:
            if s["status"] == "cut" and s["where"]:
                doing = (s["running"] or "its collection" if s["collected"] is None
                         else s["running"] or "between two tests")
                lines.append(f"  {s['name']} was in {doing}, at {s['where'][:200]}")
    if result["interrupted_by"]:
        lines.append(f"interrupted by {', '.join(result['interrupted_by'])}")
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
    if result["failed"]:
        verdict = "NOT OK"
    elif not result["complete"]:
        verdict = (f"INCOMPLETE ({len(result['cut'])} sections cut at the budget; nothing "
                   "failed in what ran)")
    elif result["shortened"]:
        verdict = "OK (shortened to fit the budget: " + ", ".join(result["shortened"]) + ")"
    else:
        verdict = "OK"
    lines.append("result: " + verdict)
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--pytest-child"], ["--collect-child"]):
        rest = argv[2:]
        child = pytest_child if argv[0] == "--pytest-child" else collect_child
        return child(argv[1], rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fuzz-ops", type=int, default=1_000_000,
                        help="fuzz operations in all, spread over fuzz_pool.py's targets "
                             "(default 1,000,000; 0 skips the fuzzer)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="end within SECONDS: the fuzzer and the thread loops stop in "
                             "time, sections still running at the end are stopped and named")
    parser.add_argument("--jobs", type=int, default=0,
                        help="sections run at once (default: one per CPU, at most 16)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the sections whose name contains TEXT (repeatable)")
    parser.add_argument("--seed", type=int, default=1, help="first fuzz seed (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also save the full result as JSON")
    parser.add_argument("--collected", metavar="PATH",
                        help="the sections from this file, which an earlier "
                             "`--collect-child PATH -- tests` wrote, instead of collecting "
                             "tests/ again (several runs over one checkout collect once)")
    parser.add_argument("pytest_args", nargs="*",
                        help="extra pytest arguments (after --): paths become sections of "
                             "their own, options go to every test section")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error("--budget must be positive")
    result = run(args)
    print(format_table(result), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 1 if result["failed"] else 0 if result["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())

"""scripts/bench_largest_batch.py without a GPU: its arguments, its bisection, the way it runs
modes and children (with a fake trial), and its exit status where PyTorch sees no device.
Nothing here times anything."""
import argparse
import importlib.util
import math
import os
import subprocess
import sys

import pytest
from support import REPO

SCRIPT = os.path.join(REPO, "scripts", "bench_largest_batch.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_largest_batch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args):
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_help_and_bad_arguments():
    done = _run("--help")
    assert done.returncode == 0 and "--modes" in done.stdout and "--timeout" in done.stdout
    done = _run("--modes", "native,bogus")
    assert done.returncode == 2 and "unknown mode(s) bogus" in done.stderr
    done = _run("--lo", "9", "--hi", "3")
    assert done.returncode == 2 and "expected 1 <= lo <= hi" in done.stderr
    done = _run("--cap", "lots")
    assert done.returncode == 2 and "--cap" in done.stderr


def test_without_a_cuda_device_it_says_so_and_exits_2():
    done = _run("--modes", "native", "--timeout", "100")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("bench_largest_batch.py: ")
    assert ("sees no CUDA device" in done.stderr or "is not installed" in done.stderr)


def test_arguments_parse(bench):
    args = bench.parser().parse_args(["--modes", "ours, native,ours", "--cap", "4GiB",
                                      "--lo", "2", "--hi", "5"])
    assert args.modes == ["ours", "native"] and args.cap == 4 << 30
    assert bench.check_args(args) is None
    assert bench.parser().parse_args([]).modes == bench.DEFAULT_MODES.split(",")
    args.time_steps = 1
    assert "--time-steps" in bench.check_args(args)


@pytest.mark.parametrize("lo,hi", [(1, 1), (8, 40), (3, 17), (1, 64)])
def test_bisection_finds_the_largest_fitting_batch(bench, lo, hi):
    for threshold in range(lo - 2, hi + 3):
        for first in (None, lo, (lo + hi) // 2, hi, threshold, hi + 5):
            calls = []

            def trial(batch):
                calls.append(batch)
                return {"status": "ok" if batch <= threshold else "oom"}
            best, tried = bench.largest(trial, lo, hi, first=first)
            assert best == (None if threshold < lo else min(threshold, hi))
            assert sorted(tried) == sorted(set(calls)) and len(calls) == len(set(calls))
            assert all(lo <= b <= hi for b in calls)
            assert len(calls) <= math.ceil(math.log2(hi - lo + 2)) + 1
            if first is not None and lo <= first <= hi:
                assert calls[0] == first


def test_bisection_stops_a_mode_on_an_error_and_counts_crashes_as_not_fitting(bench):
    def broken(batch):
        return {"status": "error", "error": "no module named transformers"}
    with pytest.raises(bench.ModeError, match="no module named transformers"):
        bench.largest(broken, 1, 10)

    def crashes_above_4(batch):
        return {"status": "ok" if batch <= 4 else ("crash" if batch % 2 else "timeout")}
    assert bench.largest(crashes_above_4, 1, 10)[0] == 4


def test_measure_times_every_mode_at_natives_largest_batch(bench):
    fits = {"native": 20, "expandable": 22, "ours": 24, "pool": 17}
    runs = []

    def run(mode, batch, steps):
        runs.append((mode, batch, steps))
        ok = batch <= fits[mode]
        return {"status": "ok" if ok else "oom", "step_median_s": 0.1 if ok else None,
                "peak_reserved_bytes": 1 << 30, "ours": {"mapped_bytes": 2 << 30}}
    args = bench.parser().parse_args(["--modes", "ours,native,expandable,pool",
                                      "--lo", "8", "--hi", "40"])
    partial = []
    result = bench.measure(args, run, lambda got: partial.append(list(got["modes"])))
    assert partial == [["native"], ["native", "ours"], ["native", "ours", "expandable"],
                       ["native", "ours", "expandable", "pool"]]    # saved after each mode
    assert result["common_batch"] == 20
    assert {m: e["largest_batch"] for m, e in result["modes"].items()} == fits
    assert runs[0][0] == "native"
    # the other modes start at the common batch with the timed trial's steps
    for mode in ("expandable", "ours", "pool"):
        first = next(r for r in runs if r[0] == mode)
        assert first == (mode, 20, args.time_steps)
    assert runs[-1] == ("native", 20, args.time_steps)       # native's own timed trial
    assert result["modes"]["pool"]["timed"]["status"] == "oom"
    lines = bench.table(result)
    assert len(lines) == 5 and lines[1].startswith("native") and "1.000" in lines[1]
    assert "oom" in lines[4]


def test_measure_records_a_mode_that_cannot_run(bench):
    def run(mode, batch, steps):
        if mode == "ours":
            return {"status": "error", "error": "this hipmr_ctypes has no X"}
        return {"status": "ok" if batch <= 10 else "oom", "step_median_s": 0.2}
    args = bench.parser().parse_args(["--modes", "native,ours", "--lo", "8", "--hi", "12"])
    result = bench.measure(args, run)
    assert "no X" in result["modes"]["ours"]["error"]
    assert result["modes"]["native"]["largest_batch"] == 10
    assert "no X" in bench.table(result)[2]


def test_a_child_that_crashes_or_hangs_is_a_failed_trial_with_its_stderr(bench):
    crash = [sys.executable, "-c", "import sys; sys.stderr.write('x' * 5000 + 'boom'); "
                                   "sys.exit(3)"]
    got = bench.run_child(crash, dict(os.environ), 60)
    assert got["status"] == "crash" and "exit status 3" in got["error"]
    assert got["stderr"].endswith("boom") and len(got["stderr"]) == bench.TAIL
    hang = [sys.executable, "-c", "import time; time.sleep(30)"]
    got = bench.run_child(hang, dict(os.environ), 0.5)
    assert got["status"] == "timeout" and "past 0.5 s" in got["error"]
    fine = [sys.executable, "-c", f"print('noise'); print({bench.MARK!r} + "
                                  "'{\"status\": \"ok\", \"batch\": 3}')"]
    got = bench.run_child(fine, dict(os.environ), 60)
    assert got["status"] == "ok" and got["batch"] == 3 and "stderr" not in got


def test_each_mode_gets_its_own_allocator_settings(bench):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "garbage"
    try:
        assert bench._env("expandable")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert "PYTORCH_CUDA_ALLOC_CONF" not in bench._env("native")
        assert "PYTORCH_CUDA_ALLOC_CONF" not in bench._env("ours")
    finally:
        del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    args = bench.parser().parse_args(["--intermediate", "4096", "--default-spec", "device"])
    command = bench._child_command(args, "ours", 12, 3)
    assert command[2:4] == ["--child", "ours"] and "4096" in command and "device" in command
    assert isinstance(args, argparse.Namespace)

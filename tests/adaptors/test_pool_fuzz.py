"""Short runs of scripts/fuzz_pool.py (the full tool runs millions of operations): random
allocate / deallocate / release over every target, checked at every step against the
reference model, reproducible from the seed."""
import sys
import time

import pytest

from support import REPO

sys.path.insert(0, str(REPO / "scripts"))
import fuzz_pool  # noqa: E402

#: fuzz operations the short runs made (read by scripts/reliability_report.py)
FUZZ_OPS = [0]
#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability(counters={"fuzz_ops_in_suite": FUZZ_OPS})


@pytest.mark.parametrize("target", fuzz_pool.TARGETS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fuzz_short(target, seed):
    FUZZ_OPS[0] += fuzz_pool.run(seed, 3000, target, check_every=100)


def test_fuzz_is_reproducible():
    a = fuzz_pool.Fuzzer("pool", 11)
    a.run(2000)
    b = fuzz_pool.Fuzzer("pool", 11)
    b.run(2000)
    assert a.r.statistics == b.r.statistics and a.up.calls == b.up.calls


def test_fuzz_reports_the_seed_of_a_failure(monkeypatch):
    from hipmr_ctypes import _stream_order
    monkeypatch.setattr(_stream_order.StreamOrder, "order", lambda self, streams, key: [])
    with pytest.raises(fuzz_pool.FuzzFailure, match="seed=5 target=pool step="):
        fuzz_pool.run(5, 3000, "pool")


def test_fuzz_command_line(capsys):
    assert fuzz_pool.main(["--seed", "3", "--ops", "500", "--target", "fixed"]) == 0
    assert "ok   seed=3 target=fixed ops=500" in capsys.readouterr().out


def test_fuzz_stops_at_its_deadline(capsys):
    """A run whose deadline passed stops at once, still checked and freed as at its end (so
    an upstream left holding memory fails it); the runs not started are skipped."""
    assert fuzz_pool.run(3, 10 ** 9, "stack", deadline=0.0) == 0
    fuzzer = fuzz_pool.Fuzzer("pool", 3)
    deadline = time.time() + 0.3
    done = fuzzer.run(10 ** 9, deadline=deadline)
    assert 0 < done < 10 ** 9 and time.time() >= deadline
    assert fuzzer.up.outstanding == 0 and not fuzzer.live
    assert fuzz_pool.main(["--seed", "3", "--ops", "500", "--target", "fixed",
                           "--deadline", "0"]) == 0
    assert "skip seed=3 target=fixed: the deadline passed" in capsys.readouterr().out


class _Tripwire:
    """A runtime that records every use (and fails it): the fuzzer's streams are fake
    handles, and a real runtime given one may crash (cudaStreamGetDevice on one segfaulted
    on the H200), so the fuzzer must never reach it."""

    def __init__(self):
        self.used = []

    def __getattr__(self, name):
        self.used.append(name)
        raise AssertionError(f"the fuzzer reached the runtime ({name}) with a fake stream")


@pytest.mark.parametrize("target", fuzz_pool.TARGETS)
def test_fuzz_never_reaches_the_runtime(target):
    from hipmr_ctypes import _hip
    fuzzer = fuzz_pool.Fuzzer(target, 4)   # built on the real runtime; then cut it off
    tripwire = _Tripwire()
    previous = _hip.set_runtime(tripwire)
    try:
        fuzzer.run(1500)
    finally:
        _hip.set_runtime(previous)
    assert tripwire.used == []

"""The benchmark scripts run end to end (tiny counts, emulated platform, no peers) and save
JSON with a positive figure for every row: they must not rot between GPU runs.  Their timings
are never asserted."""
import json
import os
import subprocess
import sys

import pytest
from support import REPO


def _run(script, *args, returncode=0, **env_vars):
    env = dict(os.environ, HIPMR_PLATFORM="emulated", **env_vars)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", script), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == returncode, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout if returncode == 0 else proc.stderr


def test_bench_alloc(tmp_path):
    out = tmp_path / "bench.json"
    text = _run("bench_alloc.py", "--no-peers", "--pairs", "300", "--repeats", "2",
                "--frag-ops", "30", "--frag-seeds", "1,2", "--json", str(out))
    data = json.loads(out.read_text())
    rows = data["ns_per_pair"]
    pool = rows["PoolResource via async_resource_ref[device_accessible]"]
    assert set(pool) == {"256 B", "64 KiB", "16 MiB"}
    assert "(run stopped)" not in rows
    assert all((isinstance(v, float) and v > 0) or (isinstance(v, str) and v.startswith("missing:"))
               for row in rows.values() for v in row.values())  # peers absent here
    for name in ("Buffer over PoolResource, create + close",
                 "Buffer via async_resource_ref, create + drop",
                 "Buffer over the current device resource (pool), create + close"):
        assert set(rows[name]) == {"256 B", "64 KiB", "16 MiB"}
    assert isinstance(rows["is_async_resource(StatisticsResource) (one call)"]["256 B"], float)
    assert "# Ours / the peer's equivalent" in text
    assert [f["seed"] for f in data["fragmentation"]] == [1, 2]
    assert all(f["hipmr PoolResource"]["ratio"] >= 1 for f in data["fragmentation"])
    assert "# Ratios" in text and "seed 2" in text


def test_bench_alloc_fits_a_small_emulated_device(tmp_path):
    """The fragmentation workload keeps its live bytes under a third of the device's memory
    (it once needed more than the emulated default and died printing nothing)."""
    out = tmp_path / "bench.json"
    text = _run("bench_alloc.py", "--no-peers", "--pairs", "100", "--repeats", "1",
                "--frag-ops", "400", "--frag-seeds", "3", "--json", str(out),
                HIPMR_EMULATED_MEMORY="400MiB")
    frag = json.loads(out.read_text())["fragmentation"][0]
    assert frag["live_cap"] == (400 << 20) // 3
    assert frag["hipmr PoolResource"]["peak_live"] <= frag["live_cap"] + (64 << 20)
    assert "raw ctypes" not in text and "emulator's hipMallocAsync" in text


def test_bench_alloc_prints_what_it_measured_when_a_step_fails(tmp_path):
    out = tmp_path / "bench.json"
    # 330 MiB of emulated memory: the 16 MiB rows run out of it; the earlier sizes' rows are kept
    err = _run("bench_alloc.py", "--no-peers", "--pairs", "50", "--repeats", "1",
               "--frag-ops", "10", "--json", str(out), returncode=1,
               HIPMR_EMULATED_MEMORY="330MiB")
    assert "stopped early: OutOfMemoryError" in err
    data = json.loads(out.read_text())
    assert data["errors"] and data["ns_per_pair"]["PoolResource direct"]["256 B"] > 0


def test_bench_scripts_without_a_device_say_so():
    for script in ("bench_alloc.py", "bench_hotpaths.py"):
        err = _run(script, returncode=2, HIPMR_EMULATED_DEVICES="0")
        assert err.strip().splitlines() == [
            f"{script}: the emulated platform sees no device; HIPMR_PLATFORM=emulated runs it "
            "on host memory"]


def test_bench_frameworks_arguments_and_no_gpu(tmp_path):
    """--help, the argument checks, a GPU part without a GPU (exit 2 saying why), and the
    alloc part end to end where CuPy and Numba are absent (their rows say missing)."""
    text = _run("bench_frameworks.py", "--help")
    assert "--parts" in text and "--steps" in text and "--json" in text
    for bad, says in ((["--parts", "nope"], "unknown part(s) nope"),
                      (["--parts", ""], "unknown part(s) (none)"),
                      (["--steps", "0"], "--steps must be at least 1"),
                      (["--warmup", "-1"], "--warmup must not be negative"),
                      (["--rounds", "x"], "invalid int value")):
        assert says in _run("bench_frameworks.py", *bad, returncode=2)
    err = _run("bench_frameworks.py", "--parts", "train", returncode=2)
    assert "the empty and train parts need a GPU" in err
    out = tmp_path / "fw.json"
    text = _run("bench_frameworks.py", "--parts", "alloc", "--alloc-pairs", "20",
                "--alloc-repeats", "1", "--json", str(out))
    data = json.loads(out.read_text())
    assert data["parts"] == ["alloc"] and len(data["goals"]) == 7
    assert all(set(row) == {"256", "65536", "16777216"} for row in data["alloc"]["rows"].values())
    for goal in data["goals"]:
        if goal["met"] is None:   # a framework absent here: its rows say so
            assert goal["ratio"] is None
        else:
            assert goal["ratio"] > 0
    assert "| goal | ratio | at most | met |" in text


def test_bench_hotpaths(tmp_path):
    out = tmp_path / "hot.json"
    _run("bench_hotpaths.py", "--rounds", "2", "--pairs", "200", "--ops", "20", "--json",
         str(out))
    data = json.loads(out.read_text())
    assert {"PoolResource via async_resource_ref", "VirtualPoolResource, mapped memory",
            "... with a Stream argument",
            "Buffer(256, resource=pool) + close()", "Buffer(256), pool current, dropped",
            "is_async_resource(user class)", "ref of a new StatisticsResource(pool)",
            "per-thread floor: two dict reads", "per-thread floor: two threading.local reads",
            "per-thread floor: two get_ident() look-ups"} <= set(data)
    assert len(data) >= 25 and all(v > 0 for v in data.values())


def test_bench_import(tmp_path):
    out = tmp_path / "import.json"
    text = _run("bench_import.py", "--rounds", "1", "--json", str(out))
    data = json.loads(out.read_text())
    assert set(data["median_ms"]) == {"floor (import ctypes + CDLL)", "import hipmr_ctypes",
                                      "import hipmr_ctypes, no .pyc",
                                      "first use (import + a Buffer)", "first use, no .pyc",
                                      "process: python -c pass",
                                      "process: python -c first use"}
    assert all(v > 0 for v in data["median_ms"].values())
    assert "beyond the library" in text and "process: first use beyond pass" in text


def test_bench_copy(tmp_path):
    pytest.importorskip("numpy", reason="bench_copy.py copies numpy arrays")
    out = tmp_path / "copy.json"
    text = _run("bench_copy.py", "--sizes", "4KiB,64KiB", "--rounds", "2", "--min-ms", "1",
                "--json", str(out))
    data = json.loads(out.read_text())
    rows = {(r["row"], r["bytes"]): r for r in data["rows"]}
    assert len(rows) == 2 * 9 and (("D2H new bytes", 65536) in rows)
    assert all(r["GB/s"]["ours"] > 0 for r in rows.values())
    assert "ours/best" in text
    assert _run("bench_copy.py", "--rows", "nope", returncode=2).count("unknown rows") == 1


def test_bench_copy_with_the_staging_off_and_another_chunk(tmp_path):
    pytest.importorskip("numpy", reason="bench_copy.py copies numpy arrays")
    out = tmp_path / "copy.json"
    _run("bench_copy.py", "--sizes", "64KiB", "--rounds", "1", "--min-ms", "1",
         "--rows", "H2D new (alloc + copy)", "--staging", "off", "--json", str(out))
    data = json.loads(out.read_text())
    assert data["staging"] == "off" and data["staging_threshold"] >= 1 << 62
    assert data["staging_to_host_threshold"] >= 1 << 62
    _run("bench_copy.py", "--sizes", "64KiB", "--rounds", "1", "--min-ms", "1",
         "--rows", "D2H into pageable", "--staging-chunk", "1MiB", "--json", str(out))
    assert json.loads(out.read_text())["staging_chunk"] == 1 << 20


def test_take_turns_shuffles_the_order_when_asked():
    import _timing   # (support put scripts/ on sys.path)
    calls = []
    samplers = {name: (lambda name=name: calls.append(name) or len(calls)) for name in "abc"}
    samples = _timing.take_turns(samplers, 12, shuffle=True)
    rounds = ["".join(calls[i:i + 3]) for i in range(0, 36, 3)]
    assert rounds[0] == "abc" and all(sorted(r) == list("abc") for r in rounds)
    # every sampler follows each of the others in some round (a rotation never would)
    pairs = {(r[i], r[i + 1]) for r in rounds for i in range(2)}
    assert pairs == {(x, y) for x in "abc" for y in "abc" if x != y}
    assert all(samples[name] == [i + 1 for i, c in enumerate(calls) if c == name]
               for name in "abc")
    calls.clear()
    _timing.take_turns(samplers, 2)
    assert calls == list("abcabc")
    again = []
    _timing.take_turns({name: (lambda name=name: again.append(name)) for name in "abc"}, 12,
                       shuffle=True)
    assert ["".join(again[i:i + 3]) for i in range(0, 36, 3)] == rounds   # the same orders
    assert _timing.take_turns({}, 3, shuffle=True) == {}


def test_bench_fresh_host(tmp_path):
    out = tmp_path / "fresh.json"
    text = _run("bench_fresh_host.py", "--sizes", "64KiB,1MiB", "--rounds", "2", "--min-ms",
                "1", "--no-peers", "--settings", "before=4MiB:64MiB,now,off=off:off",
                "--json", str(out))
    data = json.loads(out.read_text())
    assert data["settings"]["before"] == [4 << 20, 64 << 20]
    assert data["settings"]["off"] == [1 << 62, 1 << 62]
    assert [r["bytes"] for r in data["rows"]] == [65536, 1 << 20]
    assert all(len(r["GB/s"]) == 6 and min(r["GB/s"].values()) > 0 for r in data["rows"])
    assert "median of 2 rounds" in text
    assert "not 'bad'" in _run("bench_fresh_host.py", "--settings", "bad", returncode=2)


def test_bench_per_thread_reuse(tmp_path):
    out = tmp_path / "reuse.json"
    text = _run("bench_per_thread_reuse.py", "--rounds", "2", "--busy-ms", "2",
                "--busy-bytes", "8MiB", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["A alive, B moves A's blocks",
                                         "A moved its own blocks", "A ended"]
    assert all(r["ms"] > 0 and len(r["all_ms"]) == 2 for r in rows)
    assert "median of 2" in text


def test_every_script_is_in_the_readmes_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in (REPO / "scripts").iterdir()
                     if p.suffix in (".py", ".sh") and p.is_file())
    assert scripts and [s for s in scripts if f"| `scripts/{s}` |" not in readme] == []

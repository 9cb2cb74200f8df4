"""The plot, the log reader, logging and the command line under any input.

* any log gives a picture or a ValueError naming its line, in bounded time and memory (the
  tick loops of both axes count whole steps, at most ``MAX_TICKS``);
* the reader turns every csv error, non-finite or negative time and value above 2**64 - 1
  into a ValueError naming the line; CR line endings read;
* the SVG is valid XML whatever the title or file name holds; an output file is replaced only
  by a complete picture, never the log being drawn, and its suffix says its format;
* one writer per log file in a process (``reinitialize(logging=True)`` twice loses nothing);
  ``enable_logging`` is all or nothing;
* the command line: one line and status 2 for what stops ``plot``, ``--json plot``,
  ``--version``, output into a closed pipe without a traceback, ``bench --json`` on a full
  device; ``scripts/replay_log.py`` finds a module in the current directory and says what
  is wrong with a log in one line.
"""
from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

import hipmr_ctypes as hmr
import hipmr_ctypes.plot as hplot
from hipmr_ctypes import initialization
from hipmr_ctypes.__main__ import configuration_error
from hipmr_ctypes.__main__ import main as cli_main
from hipmr_ctypes._hip.search import setting_error
from hipmr_ctypes.logfile import LOG_HEADER, LogEvent, read_columns, read_log, replay
from hipmr_ctypes.plot import _svg
from hipmr_ctypes.resources import per_device

from support import REPO, no_crash, process_runtime

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("log_plot_cli_cases")

REPLAY = os.path.join(REPO, "scripts", "replay_log.py")
HEAD = LOG_HEADER + "\n"


def _env(**extra: str) -> dict:
    # no empty entry in PYTHONPATH: it would put the current directory on sys.path
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=os.pathsep.join([str(REPO), *paths]))
    env.update(extra)
    return env


def _run(args, cwd=REPO, stdout=subprocess.PIPE, **env):
    return subprocess.run(args, cwd=cwd, env=_env(**env), stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=240)


def _one_line_error(proc, *needles):
    """Exit status 2, one line on standard error holding ``needles``, no traceback."""
    no_crash(proc)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _log(*lines: str) -> str:
    return HEAD + "".join(line + "\n" for line in lines)


def _svg_of(text: str, **options) -> ET.Element:
    svg = hplot.timeline(io.StringIO(text), format="svg", **options)
    return ET.fromstring(svg)               # valid XML, or this raises


def _x_labels(root: ET.Element):
    ns = "{http://www.w3.org/2000/svg}"
    axis = [g for g in root.iter(ns + "g") if g.get("class") == "x-axis"][0]
    return [t.text for t in axis.iter(ns + "text")]


def _y_labels(root: ET.Element):
    ns = "{http://www.w3.org/2000/svg}"
    axis = [g for g in root.iter(ns + "g") if g.get("class") == "y-axis"][0]
    return [t.text for t in axis.iter(ns + "text")]


# ---- class 1: the plot ends for any span ---------------------------------------------------
SPANS = [  # (first time, last time) as the log writes them
    ("1", "1.00000000000001"),            # 1e-14 s: the tick loop never ended
    ("0.5", "0.5000000000001"),           # 1e-13 s
    ("0", "1e-300"),                      # far below a nanosecond
    ("0", "5e-324"),                      # the smallest float: width / span is infinite
    ("3", "3"),                           # no span
    ("0", "1e12"),                        # the largest time a log may carry
    ("0", "0.000000001"),                 # 1 ns
    ("0", "123456.789"),
    ("00:00:00.000001", "00:00:00.000002"),
    ("23:59:59.999999", "00:00:00.000001"),   # across midnight
]


@pytest.mark.parametrize("first, last", SPANS)
def test_any_span_gives_a_picture_with_few_ticks(first, last):
    text = _log(f"1,{first},allocate,0x1000,4096,0", f"1,{last},free,0x1000,4096,0")
    root = _svg_of(text)
    labels = _x_labels(root)
    assert 1 <= len(labels) <= _svg.MAX_TICKS
    assert labels[0] == "+0 s" or labels[0].startswith("+0 ")
    assert root.get("data-peak-bytes") == "4096"
    for v in root.iter():
        for name in ("x", "x1", "x2", "cx"):
            if v.get(name) is not None:
                assert math.isfinite(float(v.get(name))), (name, v.get(name))


@pytest.mark.parametrize("top, step", [(1e-7, 1e-8), (1.0, 1e-300), (1e300, 1.0), (0.0, 1.0),
                                       (float("inf"), 1.0), (float("nan"), 1.0),
                                       (1.0, 0.0), (1.0, float("nan"))])
def test_tick_steps_are_bounded(top, step):
    steps = _svg._steps(top, step)
    assert 1 <= len(steps) <= _svg.MAX_TICKS and steps[0] == 0.0
    assert all(math.isfinite(v) for v in steps)


@pytest.mark.parametrize("y_max", [1, 2, 1023, 1 << 20, (1 << 64) - 1, (1 << 64) * 10 ** 6,
                                   10 ** 30])
def test_byte_ticks_are_bounded(y_max):
    ticks = _svg._byte_ticks(y_max)
    assert 2 <= len(ticks) <= _svg.MAX_TICKS or (y_max == 1 and len(ticks) >= 1)
    assert all(math.isfinite(b) for b, _ in ticks)


def test_y_axis_of_the_largest_sizes():
    big = (1 << 64) - 1
    text = _log(*(f"1,{i},allocate,{0x1000 * (i + 1):#x},{big},0" for i in range(50)))
    root = _svg_of(text)
    assert 2 <= len(_y_labels(root)) <= _svg.MAX_TICKS
    assert int(root.get("data-peak-bytes")) == 50 * big


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1001])
def test_event_axis_ticks_are_bounded(n):
    text = _log(*(f"1,{i},allocate,{0x1000 * (i + 1):#x},64,0" for i in range(n)))
    labels = _x_labels(_svg_of(text, axis="event"))
    assert 1 <= len(labels) <= _svg.MAX_TICKS and labels[0] == "event #1"


# ---- class 9: the reader's errors name the line --------------------------------------------
BAD_LOGS = {
    "nan time": _log("1,nan,allocate,0x10,16,0"),
    "inf time": _log("1,0,allocate,0x10,16,0", "1,inf,free,0x10,16,0"),
    "-inf time": _log("1,-inf,allocate,0x10,16,0"),
    "1e999 time": _log("1,1e999,allocate,0x10,16,0"),
    "negative time": _log("1,-1,allocate,0x10,16,0"),
    "time past the largest": _log("1,1e13,allocate,0x10,16,0"),
    "infinity as HH:MM:SS": _log("1,infinity.000000,allocate,0x10,16,0"),
    "exponent fraction": _log("1,00:00:00.1e3000,allocate,0x10,16,0"),
    "nan fraction": _log("1,00:00:00.nan,allocate,0x10,16,0"),
    "400-digit size": _log("1,00:00:00.000001,allocate,0x10," + "9" * 400 + ",0"),
    "5000-digit size": _log("1,00:00:00.000001,allocate,0x10," + "9" * 5000 + ",0"),
    "size 2**64": _log(f"1,00:00:00.000001,allocate,0x10,{1 << 64},0"),
    "400-digit pointer": _log("1,00:00:00.000001,allocate,0x" + "f" * 400 + ",16,0"),
    "400-digit stream": _log("1,00:00:00.000001,allocate,0x10,16,0x" + "f" * 400),
    "400-digit thread": _log("9" * 400 + ",00:00:00.000001,allocate,0x10,16,0"),
    "negative thread": _log("-1,00:00:00.000001,allocate,0x10,16,0"),
    "huge quoted field": _log('1,00:00:00.000001,"' + "x" * 200_000 + '",0x10,16,0'),
    "stray CR": _log("1,00:00:00.000001,allo\rcate,0x10,16,0"),
    "newline inside quotes": _log('1,00:00:00.000001,"allo\ncate",0x10,16,0'),
    "NUL": _log("1,00:00:00.000001,allocate,0x10,16\x00,0"),
    "unterminated quote": _log('1,00:00:00.000001,"allocate,0x10,16,0'),
}


@pytest.mark.parametrize("name", sorted(BAD_LOGS))
def test_every_bad_log_is_a_value_error_naming_its_line(name):
    text = BAD_LOGS[name]
    line = 3 if name == "inf time" else 2
    for read in (read_log, read_columns):
        with pytest.raises(ValueError, match=rf"^line {line}\b") as info:
            read(io.StringIO(text))
        assert len(str(info.value)) < 400          # a huge line is not copied into it
    with pytest.raises(ValueError, match=rf"^line {line}\b"):
        hplot.timeline(io.StringIO(text))
    with pytest.raises(ValueError, match=rf"^line {line}\b"):
        replay(io.StringIO(text))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "1"])
def test_log_events_made_by_hand_are_checked(bad):
    events = [LogEvent(7, 1, "x", 0.0, "allocate", 0x10, 16, 0),
              LogEvent(9, 1, "y", bad, "free", 0x10, 16, 0)]
    with pytest.raises(ValueError, match="^line 9: bad time"):
        hplot.timeline(events)


def test_cr_line_endings_with_a_failure_line_read():
    lines = [LOG_HEADER, "1,00:00:00.000001,allocate,0x10,16,0",
             "1,00:00:00.000002,allocate failure,(nil),1024,0",
             "1,00:00:00.000003,free,0x10,16,0"]
    for ending in ("\r", "\r\n"):
        text = ending.join(lines) + ending
        events = read_log(io.StringIO(text))
        assert [e.action for e in events] == ["allocate", "allocate failure", "free"]
        assert [e.line for e in events] == [2, 3, 4]
        assert read_columns(io.StringIO(text)).line == [2, 3, 4]
        root = _svg_of(text)
        assert root.get("data-peak-bytes") == "16"


def test_line_numbers_count_physical_lines_after_a_quoted_newline():
    text = _log('1,00:00:00.000001,allocate,0x10,16,0', '"1\n",00:00:00.000002,free,0x10,16,0',
                "1,nan,free,0x10,16,0")
    with pytest.raises(ValueError, match="^line 5:"):
        read_log(io.StringIO(text))


# ---- class 9: valid XML, whole files -------------------------------------------------------
CONTROL = "".join(chr(c) for c in range(32) if chr(c) not in "\t\n\r") + "\ufffe\ud800"


def test_control_characters_in_a_title_give_valid_xml():
    text = _log("1,00:00:00.000001,allocate,0x10,16,0")
    root = _svg_of(text, title="run " + CONTROL + " <&>")
    ns = "{http://www.w3.org/2000/svg}"
    assert root.find(ns + "title").text.startswith("run \ufffd")
    assert "<&>" in root.find(ns + "title").text
    page = hplot.timeline(io.StringIO(text), title="t" + CONTROL)
    assert not any(c in page for c in CONTROL) and "t\ufffd" in page
    page.encode("utf-8")                    # writable as UTF-8


def test_control_characters_and_bytes_not_utf8_in_file_names(tmp_path):
    text = _log("1,00:00:00.000001,allocate,0x10,16,0")
    for raw in (b"run\x01\x1b.csv", b"run\xff\xfe.csv"):
        log = os.path.join(os.fsencode(tmp_path), raw)
        with open(log, "w") as f:
            f.write(text)
        name = os.fsdecode(log)
        out = os.path.join(tmp_path, "pic.svg")
        svg = hplot.timeline(name, out)
        ET.fromstring(svg)
        with open(out, encoding="utf-8") as f:
            assert f.read() == svg
        page = hplot.timeline(name, os.fsdecode(os.path.join(os.fsencode(tmp_path),
                                                              b"out\xff.html")))
        assert "\ufffd" in page
        assert os.path.getsize(os.path.join(os.fsencode(tmp_path), b"out\xff.html")) > 0


def test_an_error_leaves_the_earlier_picture_and_no_temporary_file(tmp_path, monkeypatch):
    good = tmp_path / "run.csv"
    good.write_text(_log("1,00:00:00.000001,allocate,0x10,16,0"))
    out = tmp_path / "pic.svg"
    first = hplot.timeline(str(good), str(out))
    bad = tmp_path / "bad.csv"
    bad.write_text(BAD_LOGS["nan time"])
    with pytest.raises(ValueError, match="^line 2"):
        hplot.timeline(str(bad), str(out))
    assert out.read_text(encoding="utf-8") == first

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        hplot.timeline(str(good), str(out), title="another")
    monkeypatch.undo()
    assert out.read_text(encoding="utf-8") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "pic.svg", "run.csv"]


def test_an_existing_picture_keeps_its_mode(tmp_path):
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,16,0"))
    out = tmp_path / "pic.html"
    out.write_text("old")
    os.chmod(out, 0o640)
    hplot.timeline(str(log), str(out))
    assert os.stat(out).st_mode & 0o777 == 0o640 and out.read_text().startswith("<!DOCTYPE")


@pytest.mark.parametrize("name", ["out.png", "out.pdf", "out.csv", "out.html.gz"])
def test_an_unknown_suffix_is_refused_before_reading(tmp_path, name):
    out = tmp_path / name
    with pytest.raises(ValueError, match="cannot tell the format"):
        hplot.timeline(str(tmp_path / "missing.csv"), str(out))
    assert not out.exists()
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,16,0"))
    assert hplot.timeline(str(log), str(out), format="svg").startswith("<svg")   # said so


@pytest.mark.parametrize("name, fmt", [("a.HTML", "html"), ("a.htm", "html"), ("a", "html"),
                                       ("a.SVG", "svg")])
def test_suffixes_that_name_a_format(tmp_path, name, fmt):
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,16,0"))
    text = hplot.timeline(str(log), str(tmp_path / name))
    assert text.startswith("<svg" if fmt == "svg" else "<!DOCTYPE")


def test_the_picture_never_replaces_the_log_it_draws(tmp_path):
    log = tmp_path / "run.html"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,16,0"))
    before = log.read_text()
    for out in (str(log), str(tmp_path / "." / "run.html")):
        with pytest.raises(ValueError, match="is the log being drawn"):
            hplot.timeline(str(log), out)
    os.link(log, tmp_path / "link.html")
    with pytest.raises(ValueError, match="is the log being drawn"):
        hplot.timeline(str(log), str(tmp_path / "link.html"))
    with hmr.LoggingResource(hmr.HostMemoryResource(), str(tmp_path / "live.csv")) as lr:
        lr.deallocate(lr.allocate(64), 64)
        with pytest.raises(ValueError, match="is the log being drawn"):
            hplot.timeline(lr, str(tmp_path / "live.csv"), format="svg")
    assert log.read_text() == before
    proc = _run([sys.executable, "-m", "hipmr_ctypes", "plot", str(log)])
    _one_line_error(proc, "name the picture with -o")
    proc = _run([sys.executable, "-m", "hipmr_ctypes", "plot", str(log), "-o", str(log)])
    _one_line_error(proc, "is the log being drawn")
    assert log.read_text() == before


# ---- class 6 and 7: logs that lose lines ---------------------------------------------------
@pytest.fixture
def clean_state(monkeypatch):
    for variable in initialization.LOG_FILE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    with process_runtime():
        yield
        for mr in per_device._resources.values():
            if isinstance(mr, hmr.LoggingResource):
                mr.close()


def test_reinitialize_with_logging_twice_loses_no_line(tmp_path, clean_state):
    base = str(tmp_path / "run.csv")
    hmr.reinitialize(logging=True, log_file_name=base)
    first = hmr.get_per_device_resource(0)
    old = [hmr.Buffer(100 + i) for i in range(20)]
    hmr.reinitialize(logging=True, log_file_name=base)
    second = hmr.get_per_device_resource(0)
    assert second is not first and second.file is first.file
    new = [hmr.Buffer(1000 + i) for i in range(20)]
    for b in old[::2] + new[::2]:           # frees through both adaptors, interleaved
        b.close()
    more = [hmr.Buffer(7) for _ in range(20)]
    del old, new, more
    first.flush()
    second.flush()
    assert first.lines_dropped == second.lines_dropped == 0
    text = (tmp_path / "run.dev0.csv").read_text()
    assert text.count(LOG_HEADER) == 1
    events = read_log(io.StringIO(text))
    assert len(events) == 120
    report = replay(events)
    assert report.replayed == report.from_log and report.unmatched_frees == 0
    assert report.live_at_end == 0


def test_two_logging_resources_on_one_path_share_its_writer(tmp_path):
    path = tmp_path / "one.csv"
    up = hmr.HostMemoryResource()
    a = hmr.LoggingResource(up, str(path))
    p = a.allocate(64)
    b = hmr.LoggingResource(up, os.path.join(str(tmp_path), ".", "one.csv"))   # another spelling
    assert b.file is a.file and a == b
    q = b.allocate(128)
    a.deallocate(p, 64)
    a.close()
    assert not b.file.closed                # still written by b
    b.deallocate(q, 128)
    b.close()
    assert b.file.closed
    events = read_log(str(path))
    assert [(e.action, e.size) for e in events] == [("allocate", 64), ("allocate", 128),
                                                   ("free", 64), ("free", 128)]
    assert a.lines_dropped == 0
    assert b.lines_dropped == 0
    c = hmr.LoggingResource(up, str(path))  # nobody writes it now: a new log, truncated
    c.close()
    assert path.read_text() == HEAD


def test_a_collected_sharer_does_not_keep_the_file_open(tmp_path):
    import gc
    path = str(tmp_path / "g.csv")
    a = hmr.LoggingResource(hmr.HostMemoryResource(), path)
    b = hmr.LoggingResource(hmr.HostMemoryResource(), path)
    f = a.file
    del a
    gc.collect()
    b.close()
    assert f.closed


def test_enable_logging_that_fails_on_device_1_wraps_nothing(tmp_path):
    code = textwrap.dedent(f"""
        import os, hipmr_ctypes as hmr
        base = os.path.join({str(tmp_path)!r}, "run.csv")
        os.mkdir(os.path.join({str(tmp_path)!r}, "run.dev1.csv"))   # cannot be opened
        r0, r1 = hmr.get_per_device_resource(0), hmr.get_per_device_resource(1)
        try:
            hmr.enable_logging(base)
        except IsADirectoryError as exc:
            print("raised", type(exc).__name__)
        assert hmr.get_per_device_resource(0) is r0, "device 0 was wrapped"
        assert hmr.get_per_device_resource(1) is r1
        assert hmr.get_log_filenames() == {{0: None, 1: None}}
        os.rmdir(os.path.join({str(tmp_path)!r}, "run.dev1.csv"))
        hmr.enable_logging(base)                   # and works once it can
        assert sorted(hmr.get_log_filenames()) == [0, 1]
        assert all(hmr.get_log_filenames().values())
        print("ok")
    """)
    proc = _run([sys.executable, "-c", code], HIPMR_EMULATED_DEVICES="2",
                HIPMR_EMULATED_MEMORY="64MiB")
    no_crash(proc)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["raised", "IsADirectoryError", "ok"]


# ---- class 10: the command line ------------------------------------------------------------
@pytest.fixture
def run_csv(tmp_path):
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,1024,0",
                        "1,00:00:00.000002,allocate,0x20,1099511627776000,0",
                        "1,00:00:00.000003,free,0x10,1024,0"))
    return log


def test_plot_pool_errors_are_one_line(tmp_path, run_csv):
    py = [sys.executable, "-m", "hipmr_ctypes", "plot", str(run_csv), "-o",
          str(tmp_path / "o.html"), "--pool"]
    _one_line_error(_run(py + ["--maximum", "1MiB"]), "line 3", "cannot be replayed")
    _one_line_error(_run(py + ["--initial", "2MiB", "--maximum", "1MiB"]),
                    "--initial", "larger than --maximum")
    _one_line_error(_run(py + ["--initial", str(1 << 62)]), "cannot make a pool")
    assert not (tmp_path / "o.html").exists()


def test_plot_csv_errors_are_one_line(tmp_path):
    log = tmp_path / "bad.csv"
    log.write_text(BAD_LOGS["huge quoted field"])
    _one_line_error(_run([sys.executable, "-m", "hipmr_ctypes", "plot", str(log)]), "line 2")
    _one_line_error(_run([sys.executable, "-m", "hipmr_ctypes", "plot",
                          str(tmp_path / "missing.csv")]), "missing.csv")
    _one_line_error(_run([sys.executable, "-m", "hipmr_ctypes", "plot", str(log), "-o",
                          str(tmp_path / "x.png")]), "cannot tell the format")
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "bad.html").exists()


def test_json_before_or_after_plot(tmp_path, run_csv, capsys):
    small = tmp_path / "small.csv"
    small.write_text(_log("1,00:00:00.000001,allocate,0x10,1024,0"))
    for argv in (["--json", "plot", str(small)], ["plot", "--json", str(small)]):
        assert cli_main(argv) == 0
        report = json.loads(capsys.readouterr().out)
        assert report == {"ok": True, "output": str(tmp_path / "small.html"), "format": "html"}
    assert cli_main(["--json", "plot", str(tmp_path / "nope.csv")]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False and err.startswith("plot: ")


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"hipmr_ctypes {hmr.__version__}"


@pytest.mark.parametrize("args, status", [(["check"], 0), (["info"], 0), (["--help"], 0),
                                          (["bench", "--json"], 0), (["--json", "check"], 0),
                                          (["plot", "LOG"], 0)])
def test_output_into_a_closed_pipe(tmp_path, args, status):
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,1024,0"))
    args = [str(log) if a == "LOG" else a for a in args]
    read, write = os.pipe()
    os.close(read)                          # as `| head -c 0` or `| grep -q` having exited
    try:
        proc = _run([sys.executable, "-m", "hipmr_ctypes", *args], stdout=write)
    finally:
        os.close(write)
    no_crash(proc)
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_closed_standard_output(tmp_path):
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,1024,0"))
    for args in (["check"], ["plot", str(log)], ["--version"]):
        proc = subprocess.run(f"{sys.executable} -m hipmr_ctypes {' '.join(args)} >&-",
                              shell=True, executable="/bin/bash", cwd=REPO, env=_env(),
                              capture_output=True, text=True, timeout=240)
        no_crash(proc)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert (tmp_path / "run.html").exists()


def test_output_piped_into_head_keeps_the_exit_status():
    proc = subprocess.run(f"{sys.executable} -m hipmr_ctypes check | head -n 1; "
                          "echo status=${{PIPESTATUS[0]}}".replace("{{", "{").replace("}}", "}"),
                          shell=True, executable="/bin/bash", cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.stdout.splitlines()[-1] == "status=0", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_json_on_a_nearly_full_device():
    proc = _run([sys.executable, "-m", "hipmr_ctypes", "bench", "--json"],
                HIPMR_EMULATED_MEMORY="32KiB")
    no_crash(proc)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ns_per_pair"]["AsyncMemoryResource"] is None
    assert "OutOfMemoryError" in report["errors"]["AsyncMemoryResource"]
    assert report["ns_per_pair"]["HostMemoryResource"]["256 B"] > 0
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("variable", ["HIPMR_EMULATED_DEVICES", "HIPMR_EMULATED_MEMORY",
                                      "HIPMR_EMULATED_HOST_MEMORY", "HIPMR_EMULATED_VERSION",
                                      "HIPMR_EMULATED_MISSING"])
def test_a_hint_names_a_readme_section_that_lists_the_variable(variable):
    hint = configuration_error(setting_error(variable, f"{variable}='x' is bad"), "emulated").hint
    assert variable in hint and "'Environment variables'" in hint
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    assert f"| `{variable}` |" in section


# ---- scripts/replay_log.py -----------------------------------------------------------------
def test_replay_log_finds_a_module_in_the_current_directory(tmp_path):
    (tmp_path / "mymod_replay.py").write_text(
        "import hipmr_ctypes as hmr\n\ndef make():\n    return hmr.HostMemoryResource()\n")
    log = tmp_path / "run.csv"
    log.write_text(_log("1,00:00:00.000001,allocate,0x10,1024,0",
                        "1,00:00:00.000002,free,0x10,1024,0"))
    proc = _run([sys.executable, REPLAY, str(log), "--resource", "mymod_replay:make"],
                cwd=str(tmp_path))
    no_crash(proc)
    assert proc.returncode == 0, proc.stderr
    assert "statistics match" in proc.stdout


def test_replay_log_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(BAD_LOGS["stray CR"])
    big = tmp_path / "big.csv"
    big.write_text(_log("1,00:00:00.000001,allocate,0x10,1099511627776000,0"))
    _one_line_error(_run([sys.executable, REPLAY, str(tmp_path / "missing.csv")]),
                    "missing.csv")
    _one_line_error(_run([sys.executable, REPLAY, str(bad)]), "line 2")
    _one_line_error(_run([sys.executable, REPLAY, str(big), "--maximum", "1MiB"]), "line 2",
                    "cannot replay")
    _one_line_error(_run([sys.executable, REPLAY, str(big), "--resource", "no_such_mod:f"]),
                    "no_such_mod")
    _one_line_error(_run([sys.executable, REPLAY, str(big), "--resource", "os:sep"]),
                    "not callable")


def test_record_finds_a_pool_under_more_than_64_adaptors():
    pool = hmr.PoolResource(hmr.HostMemoryResource())
    top = pool
    for _ in range(100):
        top = hmr.StatisticsResource(top)
    rec = hplot.record(top)
    p = rec.allocate(4096)
    rec.deallocate(p, 4096)
    assert rec.file.pool is pool
    root = ET.fromstring(hplot.timeline(rec, format="svg"))
    assert root.find("{http://www.w3.org/2000/svg}g[@class='bands']") is not None


def test_the_reliability_report_counts_these_cases(tmp_path):
    out = tmp_path / "report.json"
    # the report's sections as its collection of tests/ lists them, given (--collected) rather
    # than collected again (tests/repo/test_reliability_report.py checks that collection)
    collected = tmp_path / "collected.json"
    collected.write_text(json.dumps({"files": {f"tests/reliability/{os.path.basename(__file__)}":
                                               1}, "errors": [], "rc": 0}))
    proc = _run([sys.executable, os.path.join(REPO, "scripts", "reliability_report.py"),
                 "--fuzz-ops", "0", "--collected", str(collected), "--only",
                 "test_log_and_plot_input", "--json", str(out), "--", "-k", "any_span"])
    no_crash(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    row = [r for r in result["rows"] if r["measure"] == "log, plot and command-line cases"]
    assert row and row[0]["count"] == len(SPANS)
    assert result["counters"]["log_plot_cli_cases"] == len(SPANS)


def test_threads_opening_one_log_share_it_and_lose_nothing(tmp_path):
    import threading
    path = str(tmp_path / "threads.csv")
    up = hmr.HostMemoryResource()
    start = threading.Barrier(8)
    made = []

    def work():
        start.wait()
        lr = hmr.LoggingResource(up, path)
        made.append(lr)
        for i in range(200):
            lr.deallocate(lr.allocate(64 + i), 64 + i)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(lr.file) for lr in made}) == 1
    for lr in made:
        lr.close()
    assert all(lr.lines_dropped == 0 for lr in made) and made[0].file.closed
    with open(path) as f:
        text = f.read()
    assert text.startswith(HEAD) and text.count(LOG_HEADER) == 1
    events = read_log(path)
    assert len(events) == 8 * 400
    report = replay(events)
    assert report.replayed == report.from_log and report.unmatched_frees == 0


@pytest.mark.parametrize("option, value", [("width", 10 ** 400), ("height", 10 ** 400),
                                           ("width", 100_001), ("height", 100_001)])
def test_picture_sizes_are_bounded(option, value):
    with pytest.raises(ValueError, match=f"{option} must be at most 100,000"):
        hplot.timeline(io.StringIO(_log("1,0,allocate,0x10,16,0")), **{option: value})


def test_huge_band_and_point_limits_are_fine():
    text = _log("1,0,allocate,0x10,16,0", "1,1,free,0x10,16,0")
    root = _svg_of(text, max_bands=10 ** 400, max_points=10 ** 400)
    assert root.get("data-bands") == "1"


def test_the_pipe_safe_stdout_is_collected_quietly_after_its_stream_closed(monkeypatch):
    """The command line's stdout wrapper outlives the stream it wraps when the command runs
    in-process (a test's capture, an embedding program): collecting it later flushes nothing
    and raises nothing; a flush of an open stream still reports its own errors."""
    import gc
    import io
    from hipmr_ctypes.__main__ import _PipeSafeStdout
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    inner = io.StringIO()
    wrapper = _PipeSafeStdout(inner)
    wrapper.write("text")
    inner.close()
    wrapper.flush()                         # the closed stream: nothing to flush
    del wrapper
    gc.collect()
    assert seen == []

    class Failing(io.StringIO):
        def flush(self):
            raise ValueError("not about being closed")

    failing = _PipeSafeStdout(Failing())
    with pytest.raises(ValueError, match="not about being closed"):
        failing.flush()
    failing.broken = True                   # (its own collection must not raise either)

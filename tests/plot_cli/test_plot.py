"""hipmr_ctypes.plot: the timeline picture agrees with the log it was drawn from (peak, bands,
failures, pool size), stays bounded for large logs, is self-contained, and renders in a
headless browser where one is installed."""
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import pytest

import hipmr_ctypes as hmr
import hipmr_ctypes.plot as hplot
from hipmr_ctypes.__main__ import main as cli_main
from hipmr_ctypes._log.format import _events
from hipmr_ctypes.logfile import LOG_HEADER, LogEvent, iter_log, read_columns, read_log, replay

from support import REPO, TESTS

SVG = "{http://www.w3.org/2000/svg}"
FIXTURE = TESTS / "fixtures" / "rmm_log.csv"

# A hand-written log: two threads, two streams (one the null stream), a failure, a free without
# an allocation, an allocation live at the end, and a pointer reused after its free.
LOG = LOG_HEADER + """
7,10:00:00.000000,allocate,0x1000,4000000,0
7,10:00:00.000100,allocate,0x500000,1000000,0x5000
8,10:00:00.000200,allocate,0x700000,3000000,0x5000
7,10:00:00.000300,free,0x500000,1000000,0x5000
8,10:00:00.000400,allocate failure,(nil),999999999,0x5000
7,10:00:00.000500,allocate,0x900000,2000000,0
8,10:00:00.000550,free,0xdead00,64,0
7,10:00:00.000600,free,0x1000,4000000,0
8,10:00:00.000700,allocate,0x1000,500,0x5000
8,10:00:00.000800,free,0x700000,3000000,0x5000
7,10:00:00.001000,free,0x1000,500,0x5000
"""


def _plot(svg_text):
    root = ET.fromstring(svg_text)
    left, top, width, height = map(float, root.get("data-plot").split())
    return root, left, top, width, height


def _path_xs(d):
    """Every x coordinate a path visits (M x y, H x)."""
    xs = [float(m) for m in re.findall(r"M(-?[\d.]+) ", d)]
    xs += [float(m) for m in re.findall(r"H(-?[\d.]+)", d)]
    return xs


def _path_ys(d):
    ys = [float(m) for m in re.findall(r"M-?[\d.]+ (-?[\d.]+)", d)]
    ys += [float(m) for m in re.findall(r"V(-?[\d.]+)", d)]
    return ys


def test_svg_agrees_with_the_log():
    events = read_log(io.StringIO(LOG))
    text = hplot.timeline(events, format="svg", color="size")
    root, left, top, width, height = _plot(text)
    # the plotted peak is the replayed peak
    report = replay(io.StringIO(LOG), hmr.PoolResource(hmr.HostMemoryResource()))
    assert int(root.get("data-peak-bytes")) == report.replayed.peak_bytes == 9_000_000
    assert report.replayed == report.from_log
    t0, t1 = events[0].seconds, events[-1].seconds

    def x_of(line):
        e = next(e for e in events if e.line == line)
        return left + (e.seconds - t0) / (t1 - t0) * width

    # the peak is marked where it happened (line 7: 4 + 3 + 2 MB)
    assert float(root.get("data-peak-x")) == pytest.approx(x_of(7), abs=0.01)
    peak = root.find(f".//{SVG}g[@class='peak']")
    assert float(peak.find(f"{SVG}line").get("x1")) == pytest.approx(x_of(7), abs=0.01)
    assert "peak 8.58 MiB at 10:00:00.000500" in peak.find(f"{SVG}text").text
    # every allocation tall enough has a band from its allocate to its free
    bands = root.findall(f".//{SVG}path[@class='band']")
    y_max = int(root.get("data-y-max"))
    by_line = {e.line: e for e in events}
    drawn = {}
    for band in bands:
        start = by_line[int(band.get("data-start-line"))]
        assert start.action == "allocate"
        assert int(band.get("data-size")) == start.size
        assert int(band.get("data-ptr"), 16) == start.ptr
        xs = _path_xs(band.get("d"))
        assert min(xs) == pytest.approx(x_of(start.line), abs=0.01)
        assert float(band.get("data-x0")) == pytest.approx(x_of(start.line), abs=0.01)
        end_line = band.get("data-end-line")
        if end_line:
            end = by_line[int(end_line)]
            assert end.action == "free" and (end.ptr, end.size) == (start.ptr, start.size)
            assert max(xs) == pytest.approx(x_of(end.line), abs=0.01)
        else:
            assert max(xs) == pytest.approx(left + width, abs=0.01)   # live at the end
        ys = _path_ys(band.get("d"))
        assert max(ys) - min(ys) >= start.size * height / y_max - 0.2
        drawn[start.line] = band
    # 500 bytes is far below a pixel: it is drawn with the other allocations
    assert sorted(drawn) == [2, 3, 4, 7]
    assert root.get("data-bands") == "4" and root.get("data-other") == "1"
    assert drawn[7].get("data-end-line") == ""                  # live at the end
    # the band above a freed one falls: 0x700000 (line 4) starts on top of 4 MB + 1 MB, is on
    # top of 4 MB once 0x500000 is freed (line 5), and on the floor once 0x1000 is (line 9)
    ys = sorted(set(_path_ys(drawn[4].get("d"))))
    base = top + height

    def y(b):
        return round(base - b * height / y_max, 1)
    for level in (4_000_000 + 1_000_000, 4_000_000, 0):
        assert y(level) in ys, (level, ys)
    # the failure is drawn where it happened, with its size in the tooltip
    failures = root.findall(f".//{SVG}path[@class='failure']")
    assert len(failures) == 1
    assert float(re.match(r"M([\d.]+)", failures[0].get("d")).group(1)) == \
        pytest.approx(x_of(6), abs=0.01)
    assert "999,999,999 bytes" in failures[0].find(f"{SVG}title").text
    # the statistics under the picture
    stats = " ".join(t.text for t in root.find(f".//{SVG}g[@class='stats']"))
    assert "5 allocations" in stats and "1 failed allocations" in stats
    assert "1 frees without an allocation" in stats and "1 live at the end" in stats
    # the live-bytes curve reaches the peak and no higher
    live = root.find(f".//{SVG}path[@class='live']")
    assert min(_path_ys(live.get("d"))) == pytest.approx(float(y(9_000_000)), abs=0.1)


def test_event_axis_and_tooltips():
    text = hplot.timeline(io.StringIO(LOG), format="svg", axis="event")
    root, left, top, width, height = _plot(text)
    bands = root.findall(f".//{SVG}path[@class='band']")
    n = len(read_log(io.StringIO(LOG)))
    # event i (0-based) is at i / (n - 1) of the width: line 2 is event 0, line 4 event 2
    band = next(b for b in bands if b.get("data-start-line") == "4")
    assert float(band.get("data-x0")) == pytest.approx(left + 2 / (n - 1) * width, abs=0.01)
    title = band.find(f"{SVG}title").text
    assert "3,000,000 bytes" in title and "0x700000" in title and "stream 0x5000" in title
    assert "thread 8" in title and "line 4" in title and "line 11" in title


def test_html_views_per_stream_and_thread_and_self_contained(tmp_path):
    out = tmp_path / "m.html"
    text = hplot.timeline(io.StringIO(LOG), out)
    assert out.read_text(encoding="utf-8") == text
    assert text.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    # nothing is loaded from anywhere
    assert not re.search(r"<(link|img|iframe|object|embed)\b", text)
    assert not re.search(r"\b(src|href)=", text)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)
    views = re.findall(r'<option value="(view-\d+)">([^<]*)</option>', text)
    names = [name.split(" (")[0] for _, name in views]
    assert names == ["all allocations", "stream 0", "stream 0x5000", "thread 7", "thread 8"]
    # each view is its own picture, with its own peak
    svgs = re.findall(r"<svg .*?</svg>", text, re.S)
    assert len(svgs) == 5
    peaks = [int(ET.fromstring(s.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))
                 .get("data-peak-bytes")) for s in svgs]
    assert peaks == [9_000_000, 6_000_000, 4_000_000, 6_000_000, 3_000_500]
    # a one-stream, one-thread log gets no selector
    single = LOG_HEADER + "\n1,00:00:00.000000,allocate,0x10,100,0\n"
    assert "<select" not in hplot.timeline(io.StringIO(single))


def test_record_a_live_pool():
    pool = hmr.PoolResource(hmr.HostMemoryResource(), initial_pool_size=1 << 20)
    rec = hplot.record(hmr.StatisticsResource(pool))          # finds the pool upstream
    assert rec.file.pool is pool
    rng = random.Random(5)
    live = []
    for _ in range(400):
        if live and rng.random() < 0.45:
            rec.deallocate(*live.pop(rng.randrange(len(live))))
        else:
            n = int(2 ** rng.uniform(8, 21))
            live.append((rec.allocate(n), n))
    text = hplot.timeline(rec, format="svg")
    root = ET.fromstring(text)
    pool_path = root.find(f".//{SVG}path[@class='pool']")
    assert pool_path is not None
    stats = " ".join(t.text for t in root.find(f".//{SVG}g[@class='stats']"))
    from hipmr_ctypes.plot._svg import format_bytes
    assert f"peak pool size {format_bytes(pool.peak_pool_size)}" in stats
    # the recording is a CSV log like any other: the same picture from its text
    log = rec.file.getvalue()
    assert log.startswith(LOG_HEADER + "\n") and log.count("\n") == 401
    report = replay(io.StringIO(log), hmr.HostMemoryResource())
    assert int(root.get("data-peak-bytes")) == report.from_log.peak_bytes
    for p, n in live:
        rec.deallocate(p, n)
    # drawing a log against a replayed pool gives the pool's line too
    again = ET.fromstring(hplot.timeline(io.StringIO(log), format="svg", pool=True))
    assert again.find(f".//{SVG}path[@class='pool']") is not None
    with pytest.raises(TypeError, match="keeps no history"):
        hplot.timeline(pool)
    with pytest.raises(ValueError, match="samples its own pool"):
        hplot.timeline(rec, pool=True)


def test_logging_resource_source(tmp_path):
    path = tmp_path / "run.csv"
    log = hmr.LoggingResource(hmr.HostMemoryResource(), path)
    p = log.allocate(1 << 20)
    root = ET.fromstring(hplot.timeline(log, format="svg"))   # flushed and read back
    assert int(root.get("data-peak-bytes")) == 1 << 20
    log.deallocate(p, 1 << 20)
    log.close()
    buf = io.StringIO()
    log2 = hmr.LoggingResource(hmr.HostMemoryResource(), buf)
    q = log2.allocate(4096)
    assert ET.fromstring(hplot.timeline(log2, format="svg")).get("data-peak-bytes") == "4096"
    log2.deallocate(q, 4096)


def test_tracking_resource_with_stacks():
    tracked = hmr.TrackingResource(hmr.HostMemoryResource(), capture_stacks=True)
    ptrs = [(tracked.allocate(n), n) for n in (1 << 20, 3 << 20, 2 << 20)]
    tracked.deallocate(*ptrs[1])
    root = ET.fromstring(hplot.timeline(tracked, format="svg"))
    bands = root.findall(f".//{SVG}path[@class='band']")
    assert [int(b.get("data-size")) for b in bands] == [1 << 20, 2 << 20]
    # one slot per outstanding allocation: the last one is as wide as the others
    widths = [float(b.get("data-x1")) - float(b.get("data-x0")) for b in bands]
    assert widths[1] == pytest.approx(widths[0] / 2, abs=0.02) and widths[1] > 100
    assert int(root.get("data-peak-bytes")) == 3 << 20
    title = bands[0].find(f"{SVG}title").text
    assert "still live at the end" in title
    assert "test_tracking_resource_with_stacks" in title          # the allocation's stack
    for p, n in (ptrs[0], ptrs[2]):
        tracked.deallocate(p, n)
    assert ET.fromstring(hplot.timeline(tracked, format="svg")).get("data-bands") == "0"


def _synthetic(n, seed=1, streams=(0, 0x5000), threads=(11, 12)):
    rng = random.Random(seed)
    lines = [LOG_HEADER]
    live = []
    t = 86400.0 - 0.05                  # crosses midnight
    ptr = 0x10000
    for _ in range(n):
        t += rng.random() * 1e-5
        s = t % 86400
        stamp = f"{int(s // 3600):02d}:{int(s % 3600 // 60):02d}:{s % 60:09.6f}"
        if live and (len(live) > 500 or rng.random() < 0.5):
            p, size, st, th = live.pop(rng.randrange(len(live)))
            lines.append(f"{th},{stamp},free,{p:#x},{size},{st:#x}")
        else:
            size = int(2 ** rng.uniform(8, 24))
            ptr += size + 256
            st, th = rng.choice(streams), rng.choice(threads)
            live.append((ptr, size, st, th))
            lines.append(f"{th},{stamp},allocate,{ptr:#x},{size},{st:#x}")
    return "\n".join(lines) + "\n"


def test_large_log_is_aggregated_below_the_resolution():
    text = _synthetic(40000)
    cols = read_columns(io.StringIO(text))
    assert cols.seconds == sorted(cols.seconds) and cols.seconds[-1] > 86400   # past midnight
    svg = hplot.timeline(io.StringIO(text), format="svg", width=600, height=300,
                         max_bands=400, max_points=3000)
    root = ET.fromstring(svg)
    report = replay(io.StringIO(text), hmr.HostMemoryResource())
    assert int(root.get("data-peak-bytes")) == report.from_log.peak_bytes
    bands = root.findall(f".//{SVG}path[@class='band']")
    assert 0 < len(bands) <= 400
    assert len(bands) + int(root.get("data-other")) == report.from_log.total_count
    corners = sum(len(re.findall(r"[MHV]", b.get("d"))) for b in bands)
    assert corners <= 2 * 3000 + 4 * len(bands)
    # one column per pixel at most: the curve has at most 4 commands per pixel column
    live = root.find(f".//{SVG}path[@class='live']").get("d")
    assert len(re.findall(r"[MHV]", live)) <= 4 * 600
    assert len(svg) < 600_000


def test_parser_fast_and_line_by_line_paths_agree():
    text = _synthetic(3000, seed=2)
    fast = read_log(io.StringIO(text))
    slow = list(_events(io.StringIO(text)))
    assert fast == slow and isinstance(fast[0], LogEvent)
    # a log the fast path leaves to the line-by-line reader: CRLF, blank lines, spaces
    odd = text.replace("\n", "\r\n").replace(",free,", ", free,", 3)
    odd = odd.replace("\r\n", "\r\n\r\n", 5)
    assert [e[1:] for e in read_log(io.StringIO(odd))] == [e[1:] for e in slow]


def test_rmm_spellings_and_errors():
    text = LOG_HEADER + "\n1,23:59:59.999999,allocate failure,(nil),5,0\n" \
        "1,00:00:00.000001,allocate,0x7f00,5,0x1a2b\n"
    a, b = read_log(io.StringIO(text))
    assert (a.ptr, a.stream, b.stream) == (0, 0, 0x1A2B)
    assert b.seconds - a.seconds == pytest.approx(2e-6, abs=1e-9)        # across midnight
    bad = [("Thread,Time\n", "first line"),
           (LOG_HEADER + "\n1,00:00:00.000000,grow,0x10,5,0\n", "line 2: unknown action"),
           (LOG_HEADER + "\n1,00:00:00.000000,allocate,0x10,5,0\n1,00:00:01.0,free,zz,5,0\n",
            "line 3: bad thread, pointer"),
           (LOG_HEADER + "\n1,00:00:00.000000,allocate,0x10,-5,0\n", "line 2: negative"),
           (LOG_HEADER + "\n1,0:61:00.000000,allocate,0x10,5,0\n", "line 2: bad time"),
           (LOG_HEADER + "\n1,00:00:00.000000,allocate,0x10,5\n", "line 2: expected 6")]
    for log, message in bad:
        with pytest.raises(ValueError, match=message):
            read_log(io.StringIO(log))
        with pytest.raises(ValueError, match=message):
            hplot.timeline(io.StringIO(log))


def test_bad_arguments_write_nothing(tmp_path):
    out = tmp_path / "x.html"
    src = io.StringIO(LOG)
    for kwargs, exc in (({"format": "png"}, ValueError), ({"axis": "x"}, ValueError),
                        ({"color": "red"}, ValueError), ({"width": 10}, ValueError),
                        ({"width": 800.0}, TypeError), ({"height": True}, TypeError),
                        ({"max_bands": -1}, ValueError), ({"max_points": 5}, ValueError),
                        ({"split": 1}, TypeError), ({"title": 5}, TypeError),
                        ({"pool": "yes"}, TypeError)):
        with pytest.raises(exc):
            hplot.timeline(src, out, **kwargs)
        assert not out.exists()
    for source in (b"bytes", 42, None):
        with pytest.raises(TypeError):
            hplot.timeline(source, out)
    with pytest.raises(TypeError):
        hplot.timeline(src, 42)
    with pytest.raises(TypeError):
        hplot.record(hmr.HostMemoryResource(), pool=object())
    with pytest.raises(ValueError):
        hplot.timeline(hmr.TrackingResource(hmr.HostMemoryResource()), pool=True)
    with pytest.raises(FileNotFoundError):
        hplot.timeline(tmp_path / "missing.csv", out)
    assert not out.exists()


def test_command_line(tmp_path, capsys):
    log = tmp_path / "run.csv"
    log.write_text(LOG)
    assert cli_main(["plot", str(log)]) == 0
    page = (tmp_path / "run.html").read_text(encoding="utf-8")
    assert "<title>Memory over time: run.csv</title>" in page        # named after the log
    out = tmp_path / "run.svg"
    assert cli_main(["plot", str(log), "-o", str(out), "--pool", "--initial", "1MiB",
                     "--axis", "event", "--color", "stream", "--title", "T"]) == 0
    root = ET.parse(out).getroot()
    assert root.find(f"{SVG}title").text == "T"
    assert root.find(f".//{SVG}path[@class='pool']") is not None
    assert cli_main(["plot", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["plot", str(log), "--initial", "1MiB"])         # needs --pool
    # the module entry point, in a fresh process
    done = subprocess.run([sys.executable, "-m", "hipmr_ctypes", "plot", str(log), "-o",
                           str(tmp_path / "p.svg")], capture_output=True, text=True,
                          timeout=120, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    ET.parse(tmp_path / "p.svg")


def test_rmm_log_written_by_rmm():
    """A log RMM 26.10's LoggingResourceAdaptor wrote on a GPU: same format, same figures."""
    assert FIXTURE.exists(), f"{FIXTURE} (a log written by RMM itself) is missing"
    events = read_log(FIXTURE)
    assert events == list(_events(open(FIXTURE, newline="")))
    assert {e.action for e in events} == {"allocate", "free", "allocate failure"}
    assert len({e.stream for e in events}) == 2 and len({e.thread for e in events}) == 2
    report = replay(FIXTURE, hmr.HostMemoryResource())
    assert report.replayed == report.from_log and report.unmatched_frees == 0
    text = hplot.timeline(FIXTURE, format="svg", pool=True)
    root = ET.fromstring(text)
    assert int(root.get("data-peak-bytes")) == report.from_log.peak_bytes
    assert len(root.findall(f".//{SVG}path[@class='failure']")) == 1
    # our LoggingResource writes the same fields the same way
    pattern = re.compile(r"^\d+,\d\d:\d\d:\d\d\.\d{6},(allocate|free|allocate failure),"
                         r"(0x[0-9a-f]+|\(nil\)),\d+,(0x[0-9a-f]+|0)$")
    assert all(pattern.match(line) for line in FIXTURE.read_text().splitlines()[1:])
    buf = io.StringIO()
    ours = hmr.LoggingResource(hmr.LimitingResource(hmr.HostMemoryResource(), 1 << 20), buf)
    p = ours.allocate(100)
    with pytest.raises(MemoryError):
        ours.allocate(2 << 20)
    ours.deallocate(p, 100)
    lines = buf.getvalue().splitlines()
    assert lines[0] == FIXTURE.read_text().splitlines()[0]
    assert all(pattern.match(line) for line in lines[1:])
    assert ",allocate failure,(nil),2097152,0" in lines[2]


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("HIPMR_REQUIRE_BROWSER") == "1":
        pytest.fail("a headless browser is required (HIPMR_REQUIRE_BROWSER=1) but none of "
                    "chromium / google-chrome is installed", pytrace=False)
    pytest.skip("no headless browser installed (apt-get install chromium)")


def _dump_dom(browser, url, tmp_path):
    profile = tempfile.mkdtemp(dir=tmp_path)
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--dump-dom", url],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines()
              if "CONSOLE" in line or "Uncaught" in line or "Content Security Policy" in line]
    return done.stdout, errors


def test_html_renders_in_a_headless_browser(tmp_path):
    browser = _browser()
    page = tmp_path / "rmm.html"
    source = FIXTURE if FIXTURE.exists() else io.StringIO(LOG)
    hplot.timeline(source, page, pool=True)
    dom, errors = _dump_dom(browser, page.as_uri(), tmp_path)
    assert errors == []
    assert re.search(r'<html[^>]* data-ready="5"', dom), dom[:500]       # the script ran
    assert int(re.search(r'data-visible-bands="(\d+)"', dom).group(1)) > 0
    # a view chosen by the address's fragment is shown, the first one hidden
    dom, errors = _dump_dom(browser, page.as_uri() + "#view-2", tmp_path)
    assert errors == []
    assert re.search(r'<div class="view" id="view-0" hidden', dom)
    assert re.search(r'<div class="view" id="view-2">', dom)
    # the standalone SVG opens on its own too
    svg = tmp_path / "rmm.svg"
    hplot.timeline(source, svg)
    dom, errors = _dump_dom(browser, svg.as_uri(), tmp_path)
    assert errors == [] and "hipmr-timeline" in dom


def test_loaded_only_when_used():
    code = ("import sys, hipmr_ctypes as hmr\n"
            "assert 'hipmr_ctypes.plot' not in sys.modules\n"
            "assert 'hipmr_ctypes.logfile' not in sys.modules\n"
            "assert callable(hmr.plot.timeline) and callable(hmr.plot.record)\n"
            "assert 'hipmr_ctypes.plot' in sys.modules\n"
            "assert hmr.logfile.read_log is not None\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=str(REPO),
                          env=dict(os.environ, HIPMR_PLATFORM="emulated"))
    assert done.returncode == 0, done.stderr


def test_observability_doc_shows_its_picture():
    doc = REPO / "docs" / "observability.md"
    assert "observability-fragmentation.svg" in doc.read_text(encoding="utf-8")
    ET.parse(doc.parent / "observability-fragmentation.svg")


def test_plot_fragmentation_script(tmp_path):
    svg, log = tmp_path / "f.svg", tmp_path / "f.csv"
    done = subprocess.run(
        [sys.executable, "scripts/plot_fragmentation.py", "--ops", "300", "--cap", "256MiB",
         "--svg", str(svg), "--log", str(log)], capture_output=True, text=True, timeout=300,
        cwd=str(REPO),
        env=dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_MEMORY="4GiB"))
    assert done.returncode == 0, done.stderr
    assert "peak pool" in done.stdout
    root = ET.parse(svg).getroot()
    assert root.find(f".//{SVG}path[@class='pool']") is not None
    report = replay(log, hmr.HostMemoryResource())
    assert int(root.get("data-peak-bytes")) == report.from_log.peak_bytes


@pytest.mark.parametrize("body", [
    "",                                                            # no event
    "1,00:00:00.000000,allocate failure,(nil),5,0\n",              # a failure only
    "1,00:00:00.000000,allocate,0x10,100,0\n",                     # one event
    "1,00:00:00.000000,allocate,0x0,0,0\n1,00:00:00.000001,free,0x0,0,0\n",   # zero bytes
    "1,00:00:00.000000,free,0x10,100,0\n",                         # a free without allocation
    "1,00:00:00.000000,allocate,0x10,100,0\n1,00:00:00.000000,allocate,0x20,100,0\n",
])
def test_degenerate_logs(body):
    for fmt in ("svg", "html"):
        for axis in ("time", "event"):
            text = hplot.timeline(io.StringIO(LOG_HEADER + "\n" + body), format=fmt, axis=axis)
            if fmt == "svg":
                root = ET.fromstring(text)
                assert int(root.get("data-peak-bytes")) == replay(
                    io.StringIO(LOG_HEADER + "\n" + body), hmr.HostMemoryResource()
                ).from_log.peak_bytes


def test_one_parser_reads_a_time_alike_in_bulk_and_line_by_line():
    """A fraction the csv path refuses (an underscore, which float() would take) is refused
    in bulk too, and plain seconds of the bulk path's length read as plain seconds."""
    odd = LOG_HEADER + "\n1,00:00:00.000001,allocate,0x10,16,0\n1,00:00:00.1_2345,free,0x10,16,0\n"
    for read in (read_log, lambda f: list(iter_log(f))):
        with pytest.raises(ValueError, match=r"^line 3: bad time '00:00:00\.1_2345'"):
            read(io.StringIO(odd))
    plain = LOG_HEADER + "\n1,12345678.123456,allocate,0x10,16,0\n1,12345678.223456,free,0x10,16,0\n"
    bulk = read_log(io.StringIO(plain))
    assert bulk == list(iter_log(io.StringIO(plain)))
    assert [e.seconds for e in bulk] == [12345678.123456, 12345678.223456]


def test_line_by_line_gives_the_events_before_a_bad_line_in_any_chunk(monkeypatch):
    from hipmr_ctypes._log import format as _logformat
    monkeypatch.setattr(_logformat, "_CHUNK", 4)
    good = [f"1,00:00:{i:02d}.000000,allocate,{0x10 * (i + 1):#x},16,0" for i in range(10)]
    for bad, message in (("1,00:00:20.000000,grow,0x10,16,0", "unknown action"),
                         ("1,00:00:20.000000,free,0x10", "expected 6 fields"),
                         ('1,00:00:20.000000,"' + "x" * 200_000 + '",0x10,16,0',
                          "not a line of a log")):   # a field over the csv module's limit
        text = LOG_HEADER + "\n" + "\n".join(good + [bad] + good[:2]) + "\n"
        seen = []
        with pytest.raises(ValueError, match=rf"^line 12: {message}"):
            for event in iter_log(io.StringIO(text)):
                seen.append(event.line)
        assert seen == list(range(2, 12))
    # across midnight, a chunk boundary keeps the clock growing
    text = LOG_HEADER + "\n" + "\n".join(
        f"1,{t},allocate,{0x10 * (i + 1):#x},16,0" for i, t in enumerate(
            ["23:59:57.000000", "23:59:58.000000", "23:59:59.000000", "23:59:59.500000",
             "00:00:00.500000", "00:00:01.000000"])) + "\n"
    seconds = [e.seconds for e in iter_log(io.StringIO(text))]
    assert seconds == sorted(seconds) and seconds[-1] == 86401.0
    assert seconds == read_columns(io.StringIO(text)).seconds

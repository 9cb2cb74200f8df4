"""Reliability, fourth round: files and the emulator's own errors.

* ``plot`` / ``plot.timeline(source, output)`` writes only regular files (through a symbolic
  link, to its target); a FIFO, a device, a socket or a directory at the output is refused
  with a clear error before the log is read, and left as it was; ``-o -`` writes the picture
  to standard output; the command line speaks its own words (``--format``), and long work
  says what it does on standard error;
* the emulated platform never turns its own Python errors (``RecursionError`` at the
  interpreter's limit, ``MemoryError``, ``KeyboardInterrupt``) into HIP statuses.

The Dask worker names and task threads, the size grammar and ``HIPMR_DEVICE_RESOURCE`` of the
same round are tested beside their subjects (``tests/interop/test_interop_dask.py``,
``tests/model/test_sizes.py``, ``tests/resources/test_config_env.py``).
"""
from __future__ import annotations

import ctypes
import os
import socket
import stat
import subprocess
import sys

import pytest

import hipmr_ctypes as hmr
import hipmr_ctypes.plot as hplot
from hipmr_ctypes.logfile import LOG_HEADER
from hipmr_ctypes.plot import _cli

from support import REPO, no_crash

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("output_file_emulator_cases")

LOG = LOG_HEADER + "\n" + "".join(
    f"7,10:00:00.00000{i},allocate,{0x1000 * (i + 1):#x},{256 * (i + 1)},0\n"
    for i in range(4)) + "7,10:00:00.000005,free,0x1000,256,0\n"


def _env(**extra: str) -> dict:
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, HIPMR_PLATFORM="emulated",
               PYTHONPATH=os.pathsep.join([str(REPO), *paths]))
    env.update(extra)
    return env


def _plot(*args: str, stdin: str = None):
    return subprocess.run([sys.executable, "-m", "hipmr_ctypes", "plot", *args], env=_env(),
                          input=stdin, capture_output=True, text=True, timeout=120)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "run.csv"
    path.write_text(LOG)
    return path


# ---- plot writes regular files only -------------------------------------------------------
def test_a_symbolic_link_is_followed_to_its_target(log, tmp_path):
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    hplot.timeline(str(log), str(link))
    assert link.is_symlink() and os.readlink(link) == str(target)     # the link stays
    assert target.read_text().startswith("<!DOCTYPE html>")
    dangling = tmp_path / "dangling.svg"
    dangling.symlink_to(tmp_path / "new.svg")
    hplot.timeline(str(log), str(dangling))
    assert dangling.is_symlink() and (tmp_path / "new.svg").read_text().startswith("<svg")


def _special_files(tmp_path):
    """(name, path, what the error says) for each kind of file that is not a regular one."""
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.html"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    link_to_fifo = tmp_path / "to-fifo.html"
    link_to_fifo.symlink_to(fifo)
    loop = tmp_path / "loop.html"
    loop.symlink_to(tmp_path / "loop2.html")
    (tmp_path / "loop2.html").symlink_to(loop)
    cases = [("fifo", fifo, "a FIFO"), ("socket", sock_path, "a socket"),
             ("link to a fifo", link_to_fifo, "a FIFO")]
    return cases, sock, loop


def test_fifos_sockets_and_devices_are_refused_before_the_log_is_read(log, tmp_path):
    cases, sock, loop = _special_files(tmp_path)
    try:
        for name, path, words in cases:
            before = os.lstat(path)
            with pytest.raises(ValueError, match=words) as info:
                hplot.timeline(str(log), str(path))          # a FIFO: never opened, no hang
            assert "regular file" in str(info.value), name
            after = os.lstat(path)
            assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (
                before.st_ino, stat.S_IFMT(before.st_mode)), name
        with pytest.raises(ValueError, match="a loop of symbolic links"):
            hplot.timeline(str(log), str(loop))
        # refused before the source is touched: a log that would fail to read is never read
        with pytest.raises(ValueError, match="a FIFO"):
            hplot.timeline(str(tmp_path / "no-such-log.csv"), str(cases[0][1]))
    finally:
        sock.close()
    # a device node: /dev/null is refused by the check alone (never written, even as root)
    with pytest.raises(ValueError, match="a character device"):
        hplot._writable_target("/dev/null")
    with pytest.raises(IsADirectoryError):
        hplot.timeline(str(log), str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_device_node_made_here_is_left_alone(log, tmp_path):
    node = tmp_path / "null.html"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here (needs CAP_MKNOD): {exc}")
    with pytest.raises(ValueError, match="a character device"):
        hplot.timeline(str(log), str(node))
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_the_command_line_refuses_special_files_in_one_line(log, tmp_path):
    fifo = tmp_path / "out.html"
    os.mkfifo(fifo)
    done = _plot(str(log), "-o", str(fifo))
    no_crash(done)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "a FIFO" in lines[0] and "regular file" in lines[0]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dash_writes_the_picture_to_standard_output(log):
    done = _plot(str(log), "-o", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and done.stdout.rstrip().endswith("</html>")
    assert "wrote" not in done.stdout and done.stderr == ""
    svg = _plot("-", "-o", "-", "--format", "svg", stdin=LOG)
    assert svg.returncode == 0 and svg.stdout.startswith("<svg"), svg.stderr
    both = _plot(str(log), "-o", "-", "--json")
    assert both.returncode == 2 and "--json and -o -" in both.stderr


def test_the_command_line_speaks_its_own_words(log, tmp_path):
    done = _plot(str(log), "-o", str(tmp_path / "x.png"))
    assert done.returncode == 2
    assert "--format html" in done.stderr and "format='html'" not in done.stderr
    assert not (tmp_path / "x.png").exists()
    forced = _plot(str(log), "-o", str(tmp_path / "x.png"), "--format", "svg")
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "x.png").read_text().startswith("<svg")


def test_long_work_says_what_it_does_on_standard_error(log, tmp_path, monkeypatch, capsys):
    out = tmp_path / "long.html"
    assert _cli.main([str(log), "-o", str(out)]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out.startswith("wrote ")         # short work: silent
    monkeypatch.setattr(hplot, "LONG_EVENTS", 3)
    assert _cli.main([str(log), "-o", str(out)]) == 0
    said = capsys.readouterr()
    assert "plot: drawing 5 events ..." in said.err and "plot: writing" in said.err
    assert said.out.startswith("wrote ") and "plot:" not in said.out
    monkeypatch.setattr(hplot, "LONG_BYTES", 10)
    assert _cli.main([str(log), "-o", str(out)]) == 0
    assert "plot: reading" in capsys.readouterr().err


# ---- the emulator's own errors stay Python's ----------------------------------------------
def _chain(depth):
    mr = hmr.DeviceMemoryResource()
    for _ in range(depth):
        mr = hmr.TrackingResource(mr)
    return mr


@pytest.mark.parametrize("make", [
    lambda: _chain(30),
    lambda: hmr.PoolResource(_chain(20), maximum_pool_size="64MiB"),
    lambda: hmr.StatisticsResource(hmr.PinnedMemoryResource()),
    lambda: hmr.TrackingResource(hmr.ManagedMemoryResource()),
    lambda: hmr.TrackingResource(hmr.AsyncMemoryResource()),
])
def test_the_recursion_limit_inside_an_emulated_call_is_a_recursion_error(make, emulator):
    """At every depth of the interpreter's stack, allocate either works or raises
    RecursionError: never a HipError (out of memory, invalid value) made of the limit."""
    mr = make()
    size = 1 << 20

    def at_depth(n):
        if n:
            return at_depth(n - 1)
        ptr = mr.allocate(size)
        mr.deallocate(ptr, size)
        return "ok"

    base = len(_frames())
    seen = set()
    old = sys.getrecursionlimit()
    for limit in range(base, base + 160):
        try:
            sys.setrecursionlimit(limit)
        except RecursionError:       # below the depth this test already runs at
            continue
        try:
            seen.add(at_depth(0))
        except RecursionError:
            seen.add("RecursionError")
        except hmr.HipError as exc:  # the defect: the limit reported as a HIP status
            seen.add(f"HipError: {exc}")
        finally:
            sys.setrecursionlimit(old)
    assert seen <= {"ok", "RecursionError"}, seen
    assert seen == {"ok", "RecursionError"}          # the sweep reached both


def _frames():
    frame, out = sys._getframe(), []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


@pytest.mark.parametrize("error", [RecursionError("maximum recursion depth exceeded"),
                                   MemoryError(), KeyboardInterrupt()])
def test_python_errors_inside_ctypes_conversions_are_not_statuses(error, emulator,
                                                                  monkeypatch):
    """ctypes turns an exception raised while it converts an argument into ArgumentError;
    the emulator gives back the Python error it wraps instead of a status."""
    from hipmr_ctypes._hip.emulated import _core

    class Raises(ctypes.c_void_p):
        @classmethod
        def from_param(cls, value):
            raise error

    heap = _core.HostHeap()
    if heap._memalign is None:
        pytest.skip("libc has no posix_memalign here: the fallback makes no ctypes call")
    fn = ctypes.CFUNCTYPE(ctypes.c_int, Raises, ctypes.c_size_t, ctypes.c_size_t)(
        lambda *a: 0)
    monkeypatch.setattr(heap, "_memalign", fn)
    with pytest.raises(type(error)):
        heap.alloc(256)
    heap.release_all()

    # the C-level wrapper of every emulated call: an ArgumentError that carries the
    # interpreter's own error is that error, not hipErrorInvalidValue
    def conversion_failed(ptr, size):
        Raises.from_param(ptr)
    wrapped = emulator._wrap("hipMalloc", conversion_failed)
    out = ctypes.c_void_p()
    with pytest.raises(type(error)):
        wrapped(ctypes.byref(out), 256)

"""A free run by the garbage collector inside a section of the same resource never hangs.

Each case runs in a child process with a timeout (a hang is a failure, never a slow test):
a finalizer frees through the resource while the same thread is inside one of its
sections (a log write that collects garbage; a fixed-size resource's and a host resource's
frees while the same thread holds the lock of a slow path)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from support import REPO, Hang, no_crash

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("gc_lock_cases")


PRELUDE = textwrap.dedent("""
    import gc, io, weakref
    import hipmr_ctypes as hmr

    class Cycle:
        pass

    def garbage(r, n, count=3):
        # cycles whose finalizers free through r: collected at the next collection
        for _ in range(count):
            c = Cycle()
            c.c = c
            weakref.finalize(c, r.deallocate, r.allocate(n), n)
""")

CASES = {
    "logging-write-collects": """
        class Collecting(io.StringIO):
            armed = False
            def write(self, text):
                if self.armed:
                    self.armed = False
                    gc.collect()          # finalizers free through the same adaptor here
                return super().write(text)
        out = Collecting()
        r = hmr.LoggingResource(hmr.HostMemoryResource(), out)
        garbage(r, 100)
        out.armed = True
        r.deallocate(r.allocate(64), 64)
        r.flush()
        assert out.getvalue().count(",free,") == 4, out.getvalue()
    """,
    "fixed-size-free-inside-its-lock": """
        r = hmr.FixedSizeResource(hmr.HostMemoryResource(), 4096, 4)
        ptrs = [r.allocate(100) for _ in range(3)]
        lock = r._state.lock
        lock.acquire()                    # as a slow path of this thread would
        try:
            for p in ptrs:                # as finalizers run by a collection there would
                r.deallocate(p, 100)
        finally:
            lock.release()
        assert r.allocation_count() == 0
    """,
    "binning-bin-free-inside-its-lock": """
        fixed = hmr.FixedSizeResource(hmr.HostMemoryResource(), 4096, 4)
        r = hmr.BinningResource(hmr.HostMemoryResource(), [(4096, fixed)])
        ptrs = [r.allocate(100) for _ in range(3)]
        fixed._state.lock.acquire()
        try:
            for p in ptrs:
                r.deallocate(p, 100)
        finally:
            fixed._state.lock.release()
        assert r.allocation_count() == 0 == fixed.allocation_count()
    """,
    "host-refused-free-collects": """
        r = hmr.HostMemoryResource()
        garbage(r, 100)
        gc.set_threshold(1)
        for _ in range(50):
            p = r.allocate(64)
            try:
                r.deallocate(p, 65)           # refused: the error is built
            except ValueError:
                pass
            r.deallocate(p, 64)
            garbage(r, 100, 1)
        gc.set_threshold(700)
        gc.collect()
    """,
    "pool-slow-path-collects": """
        r = hmr.PoolResource(hmr.HostMemoryResource())
        garbage(r, 5000)
        gc.set_threshold(1)
        for i in range(50):
            p = r.allocate(100 + 256 * i)     # slow paths (new sizes) allocate containers
            r.deallocate(p, 100 + 256 * i)
            garbage(r, 5000, 1)
        gc.set_threshold(700)
        gc.collect()
        r.release()
    """,
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_collection_inside_a_section_never_hangs(name):
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO))
    code = PRELUDE + textwrap.dedent(CASES[name]) + "\nprint('ok')\n"
    try:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                              capture_output=True, text=True, env=env, cwd=str(REPO),
                              timeout=60)
    except subprocess.TimeoutExpired:
        raise Hang(f"{name}: hung (a deadlock inside a lock of the resource)") from None
    no_crash(proc)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-3000:]

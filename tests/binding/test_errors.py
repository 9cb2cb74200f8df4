"""The package's exceptions survive a pickle round trip (a worker process sends one back), and
the stored load error does not grow."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from support import REPO

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("size_growth_pickle_cases")


def test_every_exception_class_survives_a_pickle_round_trip():
    from hipmr_ctypes import errors
    made = [errors.HipError(1, "hipErrorInvalidValue", "bad", "hipMalloc"),
            errors.OutOfMemoryError(call="PoolResource.allocate", size=5, detail="d"),
            errors.LibraryNotFoundError("no library", tried=("/a", "/b")),
            errors.ForkedChildError("hipMalloc")]
    for name in ("NotReadyError", "NoDeviceError", "InvalidValueError", "InvalidHandleError",
                 "NotSupportedError"):
        made.append(getattr(errors, name)(1, name, "m", "call"))
    classes = {c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, BaseException)}
    assert classes <= {type(e) for e in made}, classes - {type(e) for e in made}
    for e in made:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
        assert getattr(back, "tried", None) == getattr(e, "tried", None)


def test_a_worker_process_can_send_back_the_missing_library_error():
    code = textwrap.dedent("""
        import concurrent.futures as cf
        import hipmr_ctypes as hmr
        def work():
            hmr.Buffer(10)
        if __name__ == "__main__":
            with cf.ProcessPoolExecutor(1) as ex:
                try:
                    ex.submit(work).result()
                except hmr.LibraryNotFoundError as exc:
                    print("ok", type(exc).__name__)
    """)
    path = REPO / "build" / "tmp_worker.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(code)
    try:
        env = dict(os.environ, HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so",
                   PYTHONPATH=str(REPO))
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                              env=env, timeout=120)
    finally:
        path.unlink()
    assert proc.stdout == "ok LibraryNotFoundError\n", proc.stderr[-2000:]


def test_the_stored_load_error_does_not_grow():
    code = textwrap.dedent("""
        import hipmr_ctypes as hmr
        from hipmr_ctypes import _hip
        def depth(exc):
            n, tb = 0, exc.__traceback__
            while tb is not None:
                n, tb = n + 1, tb.tb_next
            return n
        seen = []
        for i in range(20000):
            b = hmr.Buffer.from_host(b"x" * 16, resource=hmr.HostMemoryResource())
            b.close()
            try:
                _hip.get_runtime()
            except hmr.LibraryNotFoundError as exc:
                if i in (10, 19999):
                    seen.append(depth(exc))
        print(seen[0] == seen[1], seen)
    """)
    env = dict(os.environ, HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.stdout.startswith("True"), (proc.stdout, proc.stderr[-2000:])

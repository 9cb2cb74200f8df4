"""pytest plugin of CI's free-threaded step (``-p nogil_check`` with ``.ci`` on the path): the
run fails if the GIL is on when it starts, after any test, or when it ends.  An extension
module that does not declare free-threading support turns the GIL on when imported (unless
``PYTHON_GIL=0`` / ``-X gil=0`` forces it off), and a run with the GIL on proves nothing about
running without it."""
import sys

import pytest


def _gil_on() -> bool:
    enabled = getattr(sys, "_is_gil_enabled", None)
    return enabled is None or bool(enabled())


def pytest_sessionstart(session: pytest.Session) -> None:
    if _gil_on():
        raise pytest.UsageError(f"the GIL is on ({sys.version}): run a free-threaded build "
                                "with -X gil=0 or PYTHON_GIL=0")


def pytest_runtest_teardown(item: pytest.Item) -> None:
    if _gil_on():
        raise AssertionError(f"the GIL turned on during {item.nodeid}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _gil_on():
        print("\nthe GIL was on at the end of the run", file=sys.stderr)
        session.exitstatus = 1
    else:
        print(f"\nthe GIL stayed off for the whole run ({sys.version.split()[0]}, "
              "free-threaded)", file=sys.stderr)

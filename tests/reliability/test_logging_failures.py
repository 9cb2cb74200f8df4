"""LoggingResource under failure: logging never loses an allocation nor prevents a free.

A line that cannot be written is dropped and counted (``lines_dropped``, ``write_error``);
the allocation or free goes on.  Before: a failed write propagated after the upstream had
allocated (the allocation was lost), ``close()`` racing an allocation did the same, memory
handed out before ``close()`` could never be freed, and a file object with only ``write()``
made every allocation fail.
"""
from __future__ import annotations

import io
import threading

import pytest

from hipmr_ctypes import LoggingResource, TrackingResource
from hipmr_ctypes.adaptors.callback import CallbackResource

from support import Hang
from test_misbehaving_upstreams import AddressSpace

#: scripts/reliability_report.py runs this file as a section and counts what it names
pytestmark = pytest.mark.reliability("misbehaving_cases")


class FullDisk(io.StringIO):
    """Accepts the header, then fails every write (ENOSPC), or only every other one."""

    def __init__(self, every: int = 1) -> None:
        super().__init__()
        self.calls = 0
        self.every = every

    def write(self, text: str) -> int:
        self.calls += 1
        if self.calls > 1 and self.calls % self.every == 0:
            raise OSError(28, "No space left on device")
        return super().write(text)


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("auto_flush", [False, True])
def test_a_full_disk_loses_no_allocation_and_blocks_no_free(every, auto_flush):
    space = AddressSpace()
    tracking = TrackingResource(space.resource())
    log = LoggingResource(tracking, FullDisk(every), auto_flush=auto_flush)
    ptrs = [(log.allocate(n), n) for n in (64, 1000, 5000, 70000)]
    assert len(tracking.outstanding()) == 4
    for p, n in ptrs:
        log.deallocate(p, n)
    assert tracking.outstanding() == {} and space.live == {}
    assert log.lines_dropped == (8 if every == 1 else 4)
    assert isinstance(log.write_error, OSError) and log.write_error.errno == 28


def test_a_file_with_only_write_works():
    class WriteOnly:
        def __init__(self) -> None:
            self.parts: list = []

        def write(self, text: str) -> None:
            self.parts.append(text)

    out = WriteOnly()
    space = AddressSpace()
    for auto_flush in (False, True):
        log = LoggingResource(space.resource(), out, auto_flush=auto_flush)
        p = log.allocate(100)
        log.deallocate(p, 100)
        log.flush()
        log.close()
        assert log.lines_dropped == 0
    lines = "".join(out.parts).splitlines()
    assert [line.split(",")[2] for line in lines if not line.startswith("Thread")] == \
        ["allocate", "free"] * 2
    assert space.live == {}


def test_memory_handed_out_before_close_can_be_freed(tmp_path):
    space = AddressSpace()
    log = LoggingResource(space.resource(), tmp_path / "log.csv")
    ptrs = [(log.allocate(n), n) for n in (10, 20)]
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.allocate(64)
    for p, n in ptrs:
        log.deallocate(p, n)
    assert space.live == {}
    assert (tmp_path / "log.csv").read_text().count("\n") == 3  # header + 2 allocations


def test_close_racing_allocations_loses_nothing(tmp_path):
    """Threads allocate and free while another closes the log: every allocation either
    fails cleanly (ValueError, nothing allocated) or is returned and can be freed."""
    for round in range(20):
        space = AddressSpace()
        log = LoggingResource(space.resource(), tmp_path / f"log{round}.csv")
        go = threading.Barrier(5)
        errors: list = []

        def work() -> None:
            go.wait()
            for _ in range(200):
                try:
                    p = log.allocate(64)
                except ValueError:
                    continue
                try:
                    log.deallocate(p, 64)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        go.wait()
        log.close()
        for t in threads:
            t.join(timeout=60)
            if t.is_alive():
                raise Hang("a thread hung")
        assert errors == [] and space.live == {}


def test_a_write_that_raises_something_odd_still_frees():
    class Odd(io.StringIO):
        def write(self, text: str) -> int:
            if "free" in text:
                raise UnicodeEncodeError("ascii", "x", 0, 1, "odd")
            return super().write(text)

    space = AddressSpace()
    log = LoggingResource(space.resource(), Odd())
    log.deallocate(log.allocate(64), 64)
    assert space.live == {} and log.lines_dropped == 1


def test_callback_upstream_is_not_needed_for_the_cases_above():
    """(AddressSpace's resource is a CallbackResource: the checks above go through the
    adaptor's own argument checks, as for any user upstream.)"""
    assert isinstance(AddressSpace().resource(), CallbackResource)

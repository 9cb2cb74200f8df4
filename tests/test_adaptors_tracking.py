"""TrackingResource: outstanding allocations, reports and stacks, frees it refuses."""

import pytest

from hipmr_ctypes.adaptors import TrackingResource
from hipmr_ctypes.resources import HostMemoryResource

from support import AddressSpaceResource


def test_tracking_outstanding_report_and_stacks():
    tr = TrackingResource(AddressSpaceResource(), capture_stacks=True)
    a = tr.allocate(100)
    b = tr.allocate_async(200, 512, 3)
    out = tr.outstanding()
    assert set(out) == {a, b} and out[b].size == 200 and out[b].alignment == 512
    assert out[b].stream == 3 and out[a].stream is None
    for rec in (out[a], out[b]):    # the innermost frame is the caller's, none of ours
        assert rec.stack[-1].name == "test_tracking_outstanding_report_and_stacks"
    assert tr.get_allocated_bytes() == 300
    text = tr.report()
    assert "2 outstanding allocations, 300 bytes" in text
    assert f"ptr={a:#x} size=100" in text and "on stream 0x3" in text
    assert "test_tracking_outstanding_report_and_stacks" in text   # the captured stack
    rmm_text = tr.get_outstanding_allocations_str()
    assert rmm_text.startswith(f"{a:#x}: 100 B : callstack:\n") and f"\n{b:#x}: 200 B" in rmm_text
    tr.deallocate(a, 100)
    tr.deallocate_async(b, 200, 512, 3)
    assert tr.outstanding() == {} and tr.report().startswith("0 outstanding")
    assert tr.get_outstanding_allocations_str() == ""


def test_tracking_refuses_unknown_pointers_before_the_upstream():
    up = AddressSpaceResource()
    tr = TrackingResource(up)
    direct = up.allocate(64)
    calls = up.calls
    with pytest.raises(ValueError, match="not a live allocation"):
        tr.deallocate(direct, 64)
    p = tr.allocate(64)
    with pytest.raises(ValueError, match="64 bytes, not bytes=65"):
        tr.deallocate(p, 65)
    with pytest.raises(ValueError, match="alignment=256, not alignment=64"):
        tr.deallocate(p, 64, 64)
    assert up.calls == calls + 1 and tr.get_allocated_bytes() == 64
    assert tr.outstanding()[p].stack is None
    tr.deallocate(p, 64)


def test_nested_tracking_counts_independently():
    inner = TrackingResource(HostMemoryResource())
    outer = TrackingResource(inner)
    p = outer.allocate(10)
    q = inner.allocate(20)
    assert outer.get_allocated_bytes() == 10 and inner.get_allocated_bytes() == 30
    outer.deallocate(p, 10)
    inner.deallocate(q, 20)
    assert inner.outstanding() == outer.outstanding() == {}


def test_tracking_restores_its_record_when_the_upstream_refuses():
    class Refusing(AddressSpaceResource):
        def deallocate(self, ptr, bytes, alignment=256):
            raise RuntimeError("no")

    tr = TrackingResource(Refusing())
    p = tr.allocate(32)
    with pytest.raises(RuntimeError):
        tr.deallocate(p, 32)
    assert p in tr.outstanding()

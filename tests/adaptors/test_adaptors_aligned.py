"""AlignedResource: alignments larger than the upstream guarantees."""

import pytest

from hipmr_ctypes.adaptors import AlignedResource

from support import HostBufferResource


def test_aligned_over_an_upstream_capped_at_256():
    class Capped(HostBufferResource):
        def allocate(self, bytes, alignment=256):
            if alignment > 256:
                raise ValueError("alignment above 256")
            return super().allocate(bytes, alignment)

    up = Capped()
    al = AlignedResource(up, alignment=4096, threshold=1000)
    small = al.allocate(100)                    # below the threshold: as asked
    assert small % 256 == 0
    big = al.allocate(5000)
    assert big % 4096 == 0
    huge = al.allocate(10, 1 << 16)             # any alignment the caller asks for
    assert huge % (1 << 16) == 0
    with pytest.raises(ValueError, match="5000 bytes, not bytes=4000"):
        al.deallocate(big, 4000)
    for p, n, a in ((small, 100, 256), (big, 5000, 256), (huge, 10, 1 << 16)):
        al.deallocate(p, n, a)
    assert up.live == {}
    assert al.alignment == 4096 and al.threshold == 1000

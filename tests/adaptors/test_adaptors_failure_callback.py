"""FailureCallbackResource: the allocation retried while the callback says so."""

import pytest

from hipmr_ctypes import OutOfMemoryError
from hipmr_ctypes.adaptors import FailureCallbackResource

from support import AddressSpaceResource


def test_failure_callback_retries_while_it_returns_true():
    up = AddressSpaceResource(capacity=1000)
    keep = [up.allocate(800)]
    seen = []

    def callback(nbytes):
        seen.append(nbytes)
        if keep:
            up.deallocate(keep.pop(), 800)   # free something, then ask for a retry
            return True
        return False

    fc = FailureCallbackResource(up, callback)
    p = fc.allocate(500)
    assert seen == [500]
    with pytest.raises(OutOfMemoryError):
        fc.allocate_async(900, 256, 0)
    assert seen == [500, 900]
    fc.deallocate(p, 500)


def test_failure_callback_exception_propagates():
    def callback(nbytes):
        raise KeyError("from the callback")

    fc = FailureCallbackResource(AddressSpaceResource(capacity=10), callback)
    with pytest.raises(KeyError, match="from the callback"):
        fc.allocate(100)

"""Large fresh host destinations ask for huge pages (``_hugepages.advise``)."""
import mmap
import sys

import pytest

from hipmr_ctypes._buffer import hugepages as _hugepages


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(_hugepages, "madvise", lambda: lambda *args: seen.append(args) or 0)
    return seen


def test_whole_pages_inside_the_range_are_advised(calls):
    page = mmap.PAGESIZE
    base = 100 * page + 16                     # a Python object's data starts after a header
    size = _hugepages.THRESHOLD + 3 * page
    _hugepages.advise(base, size)
    start, length, advice = calls[0]
    assert advice == _hugepages.MADV_HUGEPAGE
    assert start == 101 * page and start % page == 0 and length % page == 0
    assert base <= start and start + length <= base + size
    assert start + length + page > base + size   # no whole page left out at the end


def test_small_copies_are_not_advised(calls):
    _hugepages.advise(1 << 20, _hugepages.THRESHOLD - 1)
    assert calls == []


def test_no_madvise_means_nothing_happens(monkeypatch):
    monkeypatch.setattr(_hugepages, "madvise", lambda: None)
    _hugepages.advise(1 << 30, _hugepages.THRESHOLD)   # no error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_the_real_call_on_a_new_bytearray_keeps_its_bytes():
    import ctypes
    from hipmr_ctypes._hip import native
    data = bytearray(b"\x5a") * (_hugepages.THRESHOLD + 12345)
    address = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
    _hugepages.advise(address, len(data))
    assert native.madvise() is not None
    assert data.count(b"\x5a") == len(data)


@pytest.mark.parametrize("fresh", ["copy_to_host()", "tobytes()"])
def test_a_fresh_destination_is_advised_from_the_threshold(emulator, calls, monkeypatch, fresh):
    """``copy_to_host()`` and ``tobytes()`` ask for huge pages over their new memory from
    ``THRESHOLD``, read when they copy (the one threshold: moving it, after the copies'
    module was loaded, moves them); ``copy_to_host(out)`` never."""
    import hipmr_ctypes as hmr
    big, small = hmr.Buffer(1 << 20), hmr.Buffer((1 << 20) - 1)
    for buf in (small, big):
        buf.copy_from_host(bytes([7]) * buf.size)

    def read(buf):
        return buf.copy_to_host() if fresh == "copy_to_host()" else buf.tobytes()

    assert read(big) == bytes([7]) * big.size and calls == []   # under THRESHOLD
    monkeypatch.setattr(_hugepages, "THRESHOLD", 1 << 20)
    assert read(small) == bytes([7]) * small.size and calls == []
    assert read(big) == bytes([7]) * big.size
    assert len(calls) == 1 and calls[0][2] == _hugepages.MADV_HUGEPAGE
    assert 0 < calls[0][1] <= big.size
    big.copy_to_host(bytearray(big.size))      # memory in use: no advice
    assert len(calls) == 1

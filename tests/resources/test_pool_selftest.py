"""The pool self-test of ``python -m hipmr_ctypes check``: memory written on one stream, freed
there and taken on another is read there only after the writer's work."""
import ctypes

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip, _selftest


def test_the_emulated_pool_orders_reuse(emulator):
    before = emulator.live_allocations().count
    report = _selftest._pool_reuse()
    assert report.startswith(f"{_selftest._REUSE_ROUNDS} of {_selftest._REUSE_ROUNDS} blocks")
    assert "the reader saw the writer's bytes" in report
    assert emulator.live_allocations().count == before


def _reader_sees(monkeypatch, fill):
    """The reading copy of a pool block lands ``fill`` bytes instead of the block's."""
    rt = _hip.get_runtime()
    real = rt.fn.hipMemcpyAsync

    def copy(dst, src, n, kind, stream):
        status = real(dst, src, n, kind, stream)
        if isinstance(dst, ctypes.Array):
            ctypes.memset(dst, fill, n)
        return status
    monkeypatch.setattr(rt.fn, "hipMemcpyAsync", copy)


@pytest.mark.parametrize("fill, words", [(0, "bytes zero"),
                                         (11 ^ 0xFF, "of the writer's earlier fills")])
def test_a_pool_that_does_not_order_reuse_fails_with_advice(monkeypatch, emulator, fill,
                                                            words):
    _reader_sees(monkeypatch, fill)
    before = emulator.live_allocations().count
    with pytest.raises(AssertionError) as info:
        _selftest._pool_reuse()
    message = str(info.value)
    assert words in message and "use PoolResource over DeviceMemoryResource" in message
    assert emulator.live_allocations().count == before


def test_check_reports_the_failure(monkeypatch, emulator, capsys):
    _reader_sees(monkeypatch, 0)
    assert _selftest.check() == 1
    out = capsys.readouterr().out
    assert "no  AsyncMemoryResource reuse across streams: AssertionError: the memory pool" \
        in out


def test_a_pool_that_never_reuses_across_streams(monkeypatch, emulator):
    real = hmr.AsyncMemoryResource

    def strict(*args, **kwargs):
        mr = real(*args, **kwargs)
        mr.pool.reuse_allow_opportunistic = False
        mr.pool.reuse_allow_internal_dependencies = False
        return mr
    monkeypatch.setattr(_selftest.hmr, "AsyncMemoryResource", strict)
    assert "did not hand a block freed on one stream to another" in _selftest._pool_reuse()


@pytest.mark.gpu
def test_the_pool_orders_reuse_on_a_gpu(gpu_runtime):
    report = _selftest._pool_reuse()
    assert "the reader saw the writer's bytes" in report or "did not hand" in report

"""RMM habits get an error that names our spelling: ``hmr.DeviceBuffer`` and RMM's class
names (the package's ``__getattr__``), ``mr.allocate(nbytes, stream)`` (the alignment's
check, on the error path only), RMM's ``upstream_mr=`` given to an adaptor."""
from __future__ import annotations

import pytest

import hipmr_ctypes as hmr


@pytest.mark.parametrize("name, ours", [
    ("DeviceBuffer", "hmr.Buffer("), ("PoolMemoryResource", "hmr.PoolResource("),
    ("CudaMemoryResource", "hmr.DeviceMemoryResource()"),
    ("CudaAsyncMemoryResource", "hmr.AsyncMemoryResource()"),
    ("StatisticsResourceAdaptor", "hmr.StatisticsResource("), ("mr", "hmr.PoolResource"),
    ("RMMError", "hmr.HipError")])
def test_rmm_names_name_ours(name, ours):
    with pytest.raises(AttributeError) as info:
        getattr(hmr, name)
    message = str(info.value)
    assert f"has no attribute {name!r}" in message and ours in message
    assert "docs/porting.md" in message
    assert not hasattr(hmr, name)


def test_other_missing_names_keep_the_plain_error():
    with pytest.raises(AttributeError) as info:
        hmr.no_such_name
    assert str(info.value) == "module 'hipmr_ctypes' has no attribute 'no_such_name'"


@pytest.mark.parametrize("make", [
    lambda: hmr.DeviceMemoryResource(),
    lambda: hmr.PoolResource(hmr.DeviceMemoryResource()),
    lambda: hmr.AsyncMemoryResource(),
    lambda: hmr.StatisticsResource(hmr.PinnedMemoryResource()),
    lambda: hmr.LimitingResource(hmr.DeviceMemoryResource(), "1MiB"),
])
@pytest.mark.parametrize("stream", [lambda: hmr.Stream(), lambda: hmr.stream_ref(0)])
def test_allocate_with_a_stream_names_allocate_async(make, stream, emulator):
    mr, s = make(), stream()
    with pytest.raises(TypeError) as info:
        mr.allocate(4096, s)
    message = str(info.value)
    assert "allocate_async(nbytes, 256, stream)" in message and "RMM" in message
    ptr = mr.allocate_async(4096, 256, s)       # what the hint says works
    mr.deallocate_async(ptr, 4096, 256, s)
    hmr.synchronize()
    with pytest.raises(TypeError, match="alignment must be an int power of two, not object$"):
        mr.allocate(4096, object())              # anything else: the plain message


ADAPTORS = ["PoolResource", "LimitingResource", "StatisticsResource", "TrackingResource",
            "FixedSizeResource", "BinningResource", "LoggingResource", "AlignedResource",
            "FailureCallbackResource", "PrefetchResource"]


@pytest.mark.parametrize("name", ADAPTORS)
def test_rmms_upstream_keyword_names_ours(name, emulator):
    cls = getattr(hmr, name)
    up = hmr.DeviceMemoryResource()
    with pytest.raises(TypeError) as info:
        cls(upstream_mr=up)
    assert str(info.value) == (f"{name}() got RMM's keyword upstream_mr=: write upstream= "
                               f"(docs/porting.md lists RMM's names and ours)")
    with pytest.raises(TypeError, match="upstream_mr"):
        cls(up, upstream_mr=up)
    # what the hint says works: the same keyword for every adaptor
    extra = {"LimitingResource": ("1MiB",), "LoggingResource": (__import__("io").StringIO(),),
             "FailureCallbackResource": (lambda nbytes, arg: False,)}.get(name, ())
    made = cls(*extra, upstream=up) if not extra else cls(up, *extra)
    assert made.upstream is up
    if extra:
        import inspect
        assert list(inspect.signature(cls).parameters)[0] == "upstream"


def test_other_bad_keywords_keep_pythons_error(emulator):
    with pytest.raises(TypeError, match="unexpected keyword argument 'upstrem'"):
        hmr.StatisticsResource(upstrem=hmr.DeviceMemoryResource())

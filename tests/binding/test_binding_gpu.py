"""The binding's faster conversions (``decls.call_argtypes``) on a real GPU: every HIP function
with an ``int`` or ``size_t`` value argument that one device can run is called as the back
end binds it and checked by its effect.  (Skips on the emulated platform; run with
HIPMR_PLATFORM=nvidia or amd.)"""
import ctypes

import pytest

import hipmr_ctypes as hmr
from hipmr_ctypes._hip import types

N = 1 << 20


def _host(buf):
    out = bytearray(N)
    buf.copy_to_host(out)
    return out


@pytest.mark.gpu
def test_int_and_size_t_arguments_reach_the_runtime(gpu_runtime):
    rt = gpu_runtime
    fn = rt.fn
    ones = bytearray(b"\x01" * N)
    with hmr.Buffer(N) as a, hmr.Buffer(N) as b:
        a.copy_from_host(ones)
        rt.check(fn.hipSetDevice(0), "hipSetDevice")
        rt.check(fn.hipMemset(b.ptr, 0x5A, N), "hipMemset")
        rt.check(fn.hipDeviceSynchronize(), "hipDeviceSynchronize")
        assert _host(b) == b"\x5A" * N
        rt.check(fn.hipMemcpyPeer(b.ptr, 0, a.ptr, 0, N), "hipMemcpyPeer")
        assert _host(b) == ones
        rt.check(fn.hipMemsetAsync(b.ptr, 0xA5, N - 1, 0), "hipMemsetAsync")
        rt.check(fn.hipMemcpyPeerAsync(a.ptr + N // 2, 0, b.ptr, 0, N // 2, 0),
                 "hipMemcpyPeerAsync")
        rt.check(fn.hipDeviceSynchronize(), "hipDeviceSynchronize")
        assert _host(a) == b"\x01" * (N // 2) + b"\xA5" * (N // 2)
        out = bytearray(N)
        rt.check(fn.hipMemcpy((ctypes.c_char * N).from_buffer(out), b.ptr, N,
                              types.hipMemcpyDeviceToHost), "hipMemcpy")
        assert out == b"\xA5" * (N - 1) + b"\x01"          # every size_t byte count exact
    count = ctypes.c_int()
    rt.check(fn.hipDeviceGetAttribute(count, types.hipDeviceAttributeMultiprocessorCount, 0),
             "hipDeviceGetAttribute")
    assert count.value > 0                              # an attribute code that arrived whole
    managed = hmr.ManagedMemoryResource()
    p = managed.allocate(N)
    rt.check(fn.hipMemPrefetchAsync(p, N, 0, 0), "hipMemPrefetchAsync")
    rt.check(fn.hipDeviceSynchronize(), "hipDeviceSynchronize")
    managed.deallocate(p, N)

"""The binding against the real libamdhip64 (Debian's 5.2.3 in CI) and its pure parts:
loader search order, version decoding, error translation, the declaration table."""
import ctypes
import os
import subprocess
import sys

import pytest

from hipmr_ctypes import _hip
from hipmr_ctypes._hip import amd, decls, failure, loader, nvidia, search
from hipmr_ctypes._hip import exceptions as errors
from hipmr_ctypes._hip.runtime import Runtime, decode_cuda_version, decode_hip_version
from support import REPO


# ---- pure parts ---------------------------------------------------------------------------
def test_decode_hip_version():
    assert decode_hip_version(50221153) == (5, 2, 21153)
    assert decode_hip_version(60200000) == (6, 2, 0)
    assert decode_hip_version(70151831) == (7, 1, 51831)


def test_decode_cuda_version():
    assert decode_cuda_version(13000) == (13, 0, 0)
    assert decode_cuda_version(12090) == (12, 9, 0)


def test_declaration_table_is_unique_and_complete():
    names = [d.name for d in decls.DECLS]
    assert len(names) == len(set(names))
    assert not decls.DECL_BY_NAME["hipStreamGetDevice"].required


def test_every_argument_of_the_table_has_its_name():
    for d in decls.DECLS:
        assert len(d.argnames) == len(d.argtypes), d
        assert all(n.isidentifier() for n in d.argnames), d
        assert len(set(d.argnames)) == len(d.argnames), d
    assert decls.DECL_BY_NAME["hipMallocFromPoolAsync"].argnames == \
        ("dev_ptr", "size", "mem_pool", "stream")
    assert decls.DECL_BY_NAME["hipGetLastError"].argnames == ()


def _libc(name, restype, *argtypes):
    """``name`` of the C library, bound the way the back ends bind a row with these types."""
    libc = ctypes.CDLL(None)
    f = libc._FuncPtr((name, libc))
    f.restype = restype
    f.argtypes = decls.call_argtypes(decls.Decl(name, restype, argtypes, "-"))
    return f


def test_size_t_values_are_bound_as_void_p():
    """A ``size_t`` value argument is bound as ``c_void_p`` (ctypes converts an int for it
    without an ``isinstance`` test first); ``size_t*`` and the header's own types stay."""
    d = decls.DECL_BY_NAME["hipMallocFromPoolAsync"]
    assert d.argtypes[1] is ctypes.c_size_t
    assert decls.call_argtypes(d) == [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_void_p]
    mem_info = decls.DECL_BY_NAME["hipMemGetInfo"]
    assert decls.call_argtypes(mem_info) == list(mem_info.argtypes)  # size_t*: by reference
    for decl in decls.DECLS:
        bound = decls.call_argtypes(decl)
        assert len(bound) == len(decl.argtypes)
        assert not {ctypes.c_size_t, ctypes.c_int, ctypes.c_uint} & set(bound), decl.name
    set_device = decls.call_argtypes(decls.DECL_BY_NAME["hipSetDevice"])[0]
    assert issubclass(set_device, ctypes.c_int) and set_device is not ctypes.c_int


def test_a_size_t_passed_as_void_p_arrives_bit_for_bit():
    """The C library's ``strnlen(s, maxlen)`` bound the way the back ends bind a ``size_t``:
    every bit of ``maxlen`` reaches C (a lost upper half would make ``2**32 + 1`` read 1)."""
    strnlen = _libc("strnlen", ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    assert strnlen.argtypes[1] is ctypes.c_void_p
    for maxlen, expected in ((0, 0), (2, 2), (5, 5), (6, 5), ((1 << 32) + 1, 5),
                             ((1 << 32) + 3, 5), (1 << 63, 5), ((1 << 64) - 1, 5)):
        assert strnlen(b"hello", maxlen) == expected, maxlen


def test_int_and_unsigned_values_arrive_as_c_would_pass_them():
    """``abs(int)`` and ``htonl(uint32_t)`` bound as the back ends bind ``int`` / ``unsigned
    int``: the extremes and the sign bit arrive; what is no int is refused before the call."""
    c_abs = _libc("abs", ctypes.c_int, ctypes.c_int)
    for value, expected in ((0, 0), (-5, 5), (True, 1), ((1 << 31) - 1, (1 << 31) - 1),
                            (-(1 << 31) + 1, (1 << 31) - 1)):
        assert c_abs(value) == expected, value
    htonl = _libc("htonl", ctypes.c_uint, ctypes.c_uint)
    swap = (lambda v: int.from_bytes(v.to_bytes(4, "little"), "big"))
    for value in (0, 1, 0x12345678, 0x80000000, 0xFFFFFFFF):
        assert htonl(value) == (value if sys.byteorder == "big" else swap(value)), value
    for bad in (None, 1.5, "1", ctypes.c_int(1)):
        with pytest.raises(ctypes.ArgumentError):
            c_abs(bad)


def test_amd_search_order_env_first():
    assert amd.amd_candidates({"HIPMR_LIBRARY": "/x/libamdhip64.so.6", "ROCM_PATH": "/r"}) \
        == ["/x/libamdhip64.so.6"]  # an exact file: nothing else
    c = amd.amd_candidates({"ROCM_PATH": "/r", "HIP_PATH": "/h"})
    assert c[0:4] == ["/r/lib/libamdhip64.so", "/r/lib/libamdhip64.so.7",
                      "/r/lib/libamdhip64.so.6", "/r/lib/libamdhip64.so.5"]
    assert c[4] == "/h/lib/libamdhip64.so"
    assert "/opt/rocm/lib/libamdhip64.so" in c
    assert c[-4:] == list(amd.AMD_NAMES)


def test_versioned_folders_are_found_and_ordered_as_glob_would(tmp_path):
    """The search lists ``parent/prefix*/rest`` itself (glob stays off the import path): every
    existing match, hidden names and plain files left out, newest version first."""
    import glob
    for name in ("rocm-5.7.1", "rocm-6.2.0", "rocm-6.10.0", "rocm-notes", ".rocm-9", "other"):
        (tmp_path / name / "lib").mkdir(parents=True)
    (tmp_path / "rocm-7.0.0").mkdir()          # no lib folder
    (tmp_path / "rocm-file").write_text("x")    # a file, not a folder
    found = search._matching(str(tmp_path), "rocm-", "lib")
    assert sorted(found) == sorted(glob.glob(str(tmp_path / "rocm-*" / "lib")))
    ordered = sorted(found, key=search._version_key, reverse=True)
    assert [os.path.basename(os.path.dirname(p)) for p in ordered] == \
        ["rocm-6.10.0", "rocm-6.2.0", "rocm-5.7.1", "rocm-notes"]
    assert search._matching(str(tmp_path / "missing"), "rocm-", "lib") == []
    assert search._version_key("/usr/local/cuda-12.4/lib64") == (12, 4)
    assert search._version_key("/usr/local/cuda/lib64") == ()


def test_library_version_from_a_file_name():
    f = loader.library_version_from_path
    assert f("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.21153") == "5.2.21153"
    assert f("libcudart.so.13") == "13"
    assert f("/lib/libcudart.so.1.so.12.4") == "12.4"
    for path in ("libcudart.so", "libx.so.5a", "libx.so.", None, ""):
        assert f(path) is None


def test_library_not_found_lists_every_path(tmp_path):
    missing = str(tmp_path / "nope.so")
    with pytest.raises(errors.LibraryNotFoundError) as info:
        loader.load_first([missing, "libdefinitely-not-here.so"], "libX", "set HIPMR_LIBRARY")
    text = str(info.value)
    assert missing in text and "libdefinitely-not-here.so" in text and "HIPMR_LIBRARY" in text
    assert len(info.value.tried) == 2


def test_unknown_platform_is_a_clear_error():
    with pytest.raises(ValueError, match="HIPMR_PLATFORM"):
        _hip.selected_platform({"HIPMR_PLATFORM": "cuda"})
    assert _hip.selected_platform({}) == "amd"
    assert _hip.selected_platform({"HIP_PLATFORM": "nvidia"}) == "nvidia"
    assert _hip.selected_platform({"HIPMR_PLATFORM": "Emulated"}) == "emulated"


def test_error_classes():
    e = failure.make_error(2, "hipMalloc", size=1 << 40, device=3)
    assert isinstance(e, errors.OutOfMemoryError) and isinstance(e, MemoryError)
    assert e.size == 1 << 40 and e.device == 3 and e.call == "hipMalloc" and e.code == 2
    assert "1099511627776" in str(e) and "device 3" in str(e)
    assert isinstance(failure.make_error(1, "x"), ValueError)
    assert type(failure.make_error(600, "x")) is errors.NotReadyError
    assert type(failure.make_error(100, "x")) is errors.NoDeviceError
    assert type(failure.make_error(801, "x")) is errors.NotSupportedError
    e = failure.make_error(12345, "hipFoo")
    assert type(e) is errors.HipError and e.name == "hipErrorUnknown"


def test_errors_pickle():
    import pickle
    e = failure.make_error(2, "hipMalloc", size=10, device=0)
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is errors.OutOfMemoryError and e2.size == 10 and str(e2) == str(e)


def test_cuda_error_translation():
    assert nvidia.cuda_to_hip(0) == 0
    assert nvidia.cuda_to_hip(2) == 2            # MemoryAllocation -> OutOfMemory
    assert nvidia.cuda_to_hip(400) == 400        # InvalidResourceHandle -> InvalidHandle
    assert nvidia.cuda_to_hip(20) == 911         # renumbered
    assert nvidia.cuda_to_hip(18) == 912
    assert nvidia.cuda_to_hip(911) == 999        # CUDA's own 911 is not HIP's 911
    assert nvidia.cuda_to_hip(719) == 719
    assert nvidia.cuda_to_hip(46) == 999
    assert nvidia.hip_to_cuda(911) == 20


def test_import_never_fails_without_library(tmp_path):
    code = ("import hipmr_ctypes as h; print('imported');\n"
            "try:\n    h.device_count()\nexcept h.LibraryNotFoundError as e:\n"
            "    print('LNF', 'HIPMR_LIBRARY' in str(e), '/nonexistent/libamdhip64.so' in str(e))")
    env = dict(os.environ, HIPMR_PLATFORM="amd", HIPMR_LIBRARY="/nonexistent/libamdhip64.so")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["imported", "LNF", "True", "True"]


# ---- the real library ---------------------------------------------------------------------
@pytest.mark.amd_library
def test_every_required_symbol_resolves(amd_runtime):
    for d in decls.DECLS:
        f = getattr(amd_runtime.fn, d.name)
        if d.required:
            assert not getattr(f, "missing", False), d.name
            assert f.argtypes == decls.call_argtypes(d) and f.restype == d.restype


@pytest.mark.amd_library
def test_optional_symbol_missing_raises_not_supported(amd_runtime):
    f = amd_runtime.fn.hipStreamGetDevice
    if not getattr(f, "missing", False):
        pytest.skip("this libamdhip64 exports hipStreamGetDevice (5.6+)")
    with pytest.raises(errors.NotSupportedError, match="hipStreamGetDevice"):
        f(0, ctypes.c_int())


@pytest.mark.amd_library
def test_version_decodes(amd_runtime):
    v = amd_runtime.runtime_version()
    assert isinstance(v, tuple) and len(v) == 3 and v[0] >= 5
    if "5.2" in (amd_runtime.library_path or ""):
        assert v[:2] == (5, 2)
    assert amd_runtime.driver_version()[0] >= 5


@pytest.mark.amd_library
def test_no_device_surfaces_as_no_device_error(amd_runtime):
    count = ctypes.c_int(-1)
    st = amd_runtime.fn.hipGetDeviceCount(count)
    if st == 0 and count.value > 0:
        pytest.skip("an AMD GPU is visible")
    assert st == 100
    with pytest.raises(errors.NoDeviceError) as info:
        amd_runtime.check(st, "hipGetDeviceCount")
    assert info.value.name == "hipErrorNoDevice"  # from the library's hipGetErrorName
    assert info.value.code == 100 and info.value.call == "hipGetDeviceCount"


@pytest.mark.amd_library
def test_library_error_names_match_table(amd_runtime):
    for code in (1, 2, 100, 101, 400, 600, 801, 999):
        assert amd_runtime.fn.hipGetErrorName(code).decode() == errors.ERROR_NAMES[code]
    e = amd_runtime.error(2, "hipMalloc", size=5)
    assert isinstance(e, errors.OutOfMemoryError) and e.name == "hipErrorOutOfMemory"


@pytest.mark.amd_library
def test_library_path_is_real_file(amd_runtime):
    assert os.path.isfile(amd_runtime.library_path)
    assert "libamdhip64" in amd_runtime.library_path


class _FakeLibrary:
    """A stand-in for a C library: every symbol is a Python function recording its calls
    and returning ``results.get(symbol, 0)`` (ctypes' restype / argtypes land on it)."""

    def __init__(self, results=None, lacks=()):
        self.calls = []
        self.results = dict(results or {})
        self.lacks = set(lacks)

    def __getattr__(self, symbol):
        if symbol.startswith("_") or symbol in self.lacks:
            raise AttributeError(symbol)

        def function(*args):
            self.calls.append((symbol,) + args)
            if symbol == "cudaRuntimeGetVersion":
                args[0].value = 13000
            return self.results.get(symbol, 0)
        setattr(self, symbol, function)
        return function


def test_nvidia_runtime_opens_the_driver_on_first_use_only(monkeypatch):
    """Building the nvidia runtime opens libcudart, not libcuda: the driver is opened by the
    first call that needs it (once, whatever the threads), and its functions answer from
    then on; without libcuda those calls raise NotSupportedError naming it."""
    import threading
    cudart, libcuda, opened = _FakeLibrary(), _FakeLibrary({"cuInit": 0}), []

    def open_libcuda():
        opened.append(1)
        return libcuda
    monkeypatch.setattr(nvidia, "load_first", lambda *a: (cudart, "/fake/libcudart.so.13"))
    monkeypatch.setattr(nvidia, "_open_libcuda", open_libcuda)
    rt = nvidia.create_nvidia_runtime({})
    assert opened == [] and rt.runtime_version() == (13, 0, 0)
    threads = [threading.Thread(target=rt.fn.hipInit, args=(0,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opened == [1] and libcuda.calls.count(("cuInit", 0)) == 8
    total = ctypes.c_size_t()
    assert rt.fn.hipDeviceTotalMem(total, 0) == 0
    assert [c[0] for c in libcuda.calls[-3:]] == ["cuInit", "cuDeviceGet",
                                                  "cuDeviceTotalMem_v2"]
    assert rt.fn.hipDeviceGetAttribute(ctypes.c_int(), 89, 0) == 0  # through the driver
    assert libcuda.calls[-1][0] == "cuDeviceGetAttribute" and libcuda.calls[-1][2] == 102
    libcuda.results["cuInit"] = 100  # no device: the status comes back as HIP's
    assert rt.fn.hipDeviceGetName(ctypes.create_string_buffer(8), 8, 0) == 100
    assert opened == [1]

    def no_libcuda():
        opened.append(2)
        raise OSError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(nvidia, "_open_libcuda", no_libcuda)
    rt = nvidia.create_nvidia_runtime({})
    for _ in range(2):
        with pytest.raises(errors.NotSupportedError, match="libcuda.so.1 not found"):
            rt.fn.hipInit(0)
    assert rt.fn.hipDeviceGetAttribute(ctypes.c_int(), 89, 0) == 1  # unmapped without it
    assert opened == [1, 2]  # tried once

    partial = _FakeLibrary(lacks={"cuDeviceTotalMem_v2"})
    monkeypatch.setattr(nvidia, "_open_libcuda", lambda: partial)
    rt = nvidia.create_nvidia_runtime({})
    for _ in range(2):
        with pytest.raises(errors.NotSupportedError, match="cuDeviceTotalMem_v2"):
            rt.fn.hipDeviceTotalMem(total, 0)


def _fake_nvidia_runtime(monkeypatch, cudart, libcuda):
    """The nvidia runtime over the fake ``cudart`` and ``libcuda`` libraries."""
    monkeypatch.setattr(nvidia, "load_first", lambda *a: (cudart, "/fake/libcudart.so.13"))
    monkeypatch.setattr(nvidia, "_open_libcuda", lambda: libcuda)
    return nvidia.create_nvidia_runtime({})


def test_nvidia_shims_are_built_by_the_first_call_and_take_their_stand_ins_place(monkeypatch):
    """The shims (driver calls, pointer and device attributes, prefetch) are compiled and built
    by the first call of any; each then replaces its stand-in in ``rt.fn`` (not a spy put there
    meanwhile), and a stand-in kept from before still answers, through its shim."""
    cudart, libcuda = _FakeLibrary(), _FakeLibrary({"cuInit": 0})
    rt = _fake_nvidia_runtime(monkeypatch, cudart, libcuda)
    assert rt.fn.hipMalloc is cudart.cudaMalloc  # a direct row: the library's own function
    kept = rt.fn.hipDeviceGetAttribute
    stand_in_init = rt.fn.hipInit

    def spy(flags):
        return stand_in_init(flags)
    rt.fn.hipInit = spy
    assert rt.fn.hipInit(0) == 0 and libcuda.calls == [("cuInit", 0)]
    assert rt.fn.hipInit is spy  # left in place
    shim = rt.fn.hipDeviceGetAttribute
    assert shim is not kept and shim.__name__ == "hipDeviceGetAttribute"
    out = ctypes.c_int()
    assert kept(out, 87, 0) == 0 and cudart.calls[-1][0] == "cudaDeviceGetAttribute"
    assert cudart.calls[-1][2] == 10  # hipDeviceAttributeWarpSize -> cudaDevAttrWarpSize
    assert kept(out, 12345, 0) == shim(out, 12345, 0) == 1  # unmapped: invalid value
    assert nvidia.ATTRIBUTE_MAP[87] == 10
    rt.fn.hipInit = stand_in_init
    assert rt.fn.hipInit(0) == 0 and rt.fn.hipInit is stand_in_init  # built once already


def test_a_stand_in_called_while_the_shims_are_built_does_not_hang(monkeypatch):
    """A finalizer the garbage collector runs inside the first build may call a stand-in of
    the same thread: it builds again (reentrant lock) instead of waiting for itself."""
    import threading
    from hipmr_ctypes._hip.nvidia import _shims
    cudart, libcuda = _FakeLibrary(), _FakeLibrary({"cuInit": 0})
    rt = _fake_nvidia_runtime(monkeypatch, cudart, libcuda)
    real_build, inner = _shims.build_shims, []

    def build_calling_a_stand_in(*args):
        if not inner:  # the first build only: the inner one builds for real
            inner.append(None)
            inner[0] = rt.fn.hipDeviceTotalMem(ctypes.c_size_t(), 0)  # the stand-in
        return real_build(*args)
    monkeypatch.setattr(_shims, "build_shims", build_calling_a_stand_in)
    done = []
    worker = threading.Thread(target=lambda: done.append(rt.fn.hipInit(0)), daemon=True)
    worker.start()
    worker.join(30)
    assert done == [0] and inner == [0]
    assert rt.fn.hipInit.__name__ == "hipInit" and rt.fn.hipInit is not None


def test_the_nvidia_address_range_is_the_drivers(monkeypatch):
    """On ``nvidia`` hipMemGetAddressRange is the driver's cuMemGetAddressRange_v2 (HIP's
    header maps it so), through libcuda opened on first use; its status comes back as HIP's."""
    cudart, libcuda = _FakeLibrary(), _FakeLibrary({"cuInit": 0})
    rt = _fake_nvidia_runtime(monkeypatch, cudart, libcuda)
    base, size = ctypes.c_void_p(), ctypes.c_size_t()
    assert rt.fn.hipMemGetAddressRange(base, size, 0x1000) == 0
    assert libcuda.calls[-1][0] == "cuMemGetAddressRange_v2" and libcuda.calls[-1][3] == 0x1000
    libcuda.results["cuMemGetAddressRange_v2"] = 1
    assert rt.fn.hipMemGetAddressRange(base, size, 0x1000) == 1


def test_the_nvidia_address_range_makes_a_context_current_first(monkeypatch):
    """A thread with no current context (an importing process that only mapped pool memory)
    gets CUDA_ERROR_INVALID_CONTEXT (201) from the driver: the shim makes the runtime's primary
    context current (cudaFree(NULL)) and asks again, as the memset shims do."""
    class Driver(_FakeLibrary):
        def __getattr__(self, symbol):
            if symbol != "cuMemGetAddressRange_v2":
                return super().__getattr__(symbol)

            def query(*args):
                self.calls.append((symbol,) + args)
                return 0 if any(c[0] == "cudaFree" for c in cudart.calls) else 201
            return query

    cudart, libcuda = _FakeLibrary(), Driver({"cuInit": 0})
    rt = _fake_nvidia_runtime(monkeypatch, cudart, libcuda)
    base, size = ctypes.c_void_p(), ctypes.c_size_t()
    assert rt.fn.hipMemGetAddressRange(base, size, 0x2000) == 0
    asked = [c for c in libcuda.calls if c[0] == "cuMemGetAddressRange_v2"]
    assert len(asked) == 2 and [c[0] for c in cudart.calls].count("cudaFree") == 1


@pytest.mark.parametrize("cuda_version, instantiate_args, info_args", [
    (11080, 5, 3), (12040, 3, 6), (13000, 3, 7)])
def test_nvidia_capture_shims_follow_the_cuda_runtime_version(monkeypatch, cuda_version,
                                                              instantiate_args, info_args):
    """cudaGraphInstantiate lost its error node and log for a flags word in CUDA 12;
    cudaStreamGetCaptureInfo took the former _v2's outputs in 12 and _v3's in 13: the shims
    call each with the arguments of the runtime loaded (the extra outputs NULL)."""
    class Cudart(_FakeLibrary):
        def __getattr__(self, symbol):
            function = super().__getattr__(symbol)
            if symbol != "cudaRuntimeGetVersion":
                return function

            def version(out):
                out.value = cuda_version
                return 0
            setattr(self, symbol, version)
            return version
    cudart = Cudart()
    rt = _fake_nvidia_runtime(monkeypatch, cudart, _FakeLibrary())
    exec_out, status, ident = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_ulonglong()
    assert rt.fn.hipGraphInstantiate(exec_out, 0x1000, None, None, 0) == 0
    call = cudart.calls[-1]
    assert call[0] == "cudaGraphInstantiate" and len(call) - 1 == instantiate_args
    if instantiate_args == 3:
        assert call[3] == 0   # flags
    assert rt.fn.hipStreamGetCaptureInfo(0x2000, status, ident) == 0
    call = cudart.calls[-1]
    assert call[0] == "cudaStreamGetCaptureInfo" and len(call) - 1 == info_args
    assert call[1] == 0x2000 and all(a is None for a in call[4:])
    # the direct rows: the CUDA function of the same name and shape
    for hip, cuda in (("hipStreamBeginCapture", "cudaStreamBeginCapture"),
                      ("hipStreamEndCapture", "cudaStreamEndCapture"),
                      ("hipStreamIsCapturing", "cudaStreamIsCapturing"),
                      ("hipThreadExchangeStreamCaptureMode",
                       "cudaThreadExchangeStreamCaptureMode"),
                      ("hipGraphLaunch", "cudaGraphLaunch"), ("hipGraphDestroy", "cudaGraphDestroy"),
                      ("hipGraphExecDestroy", "cudaGraphExecDestroy")):
        assert nvidia.NAME_MAP[hip] == cuda

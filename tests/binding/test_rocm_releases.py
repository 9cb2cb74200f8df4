"""Each version-dependent branch of the binding against the real libamdhip64 loaded and the
headers of the same release: the branch the package takes on the loaded library must be the
one that release needs.

CI runs this file on four ROCm releases (5.2.3, 5.7.1, 6.4.3, 7.2.4: ``.ci/rocm_matrix.sh``,
which points ``HIPMR_LIBRARY`` and ``HIPMR_HIP_INCLUDE`` at each release's files and names the
expected release in ``HIPMR_EXPECT_*``), so every boundary is seen from both sides:
``hipStreamGetDevice`` (absent in 5.2, exported from 5.6), ``hipMemoryType``'s numbering and
``hipIpcMemLazyEnablePeerAccess`` (both changed at 6.0), ``hipGetDevicePropertiesR0600`` /
``hipExtGetLastError`` (from 6.0), ``hipMemPoolProps.maxSize`` (from 6.2), and
``hipGetLastError`` / ``hipFreeAsync(NULL)`` (changed in 7.0).

Marked ``amd_library``: each test needs the real library (and the headers of its release, and
gcc); they fail instead of skipping under HIPMR_REQUIRE_AMD_LIBRARY=1.  With no AMD GPU every
call of the real library that touches a device answers hipErrorNoDevice, so the two 7.0
behaviour changes are observed on a GPU only (``gpu``); without one, the emulator configured
as the loaded release is checked against what that release does.
"""
import ctypes
import glob
import os
import shutil
import subprocess

import pytest

import hipmr_ctypes
from hipmr_ctypes import _hip
from hipmr_ctypes._hip import decls
from hipmr_ctypes._hip.emulated import create_emulated_runtime
from hipmr_ctypes._hip.types import MEMORY_TYPE_5, MEMORY_TYPE_6, hipPointerAttribute_t

pytestmark = pytest.mark.amd_library

REQUIRED = os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") == "1"
HEADER_DIRS = [os.environ.get("HIPMR_HIP_INCLUDE", ""), "/usr/include", "/opt/rocm/include"]


def _missing(what):
    if REQUIRED:
        pytest.fail(f"{what} required (HIPMR_REQUIRE_AMD_LIBRARY=1) but missing", pytrace=False)
    pytest.skip(f"{what} not available")


def _include_dir():
    for d in HEADER_DIRS:
        if d and os.path.exists(os.path.join(d, "hip", "hip_runtime_api.h")):
            return d
    return None


@pytest.fixture(scope="module")
def version(amd_runtime):
    """The loaded library's own ``(major, minor, patch)`` (hipRuntimeGetVersion)."""
    return amd_runtime.runtime_version()


@pytest.fixture(scope="module")
def exported(amd_runtime):
    """``name -> bool``: whether the loaded library file exports ``name`` (dlsym)."""
    lib = ctypes.CDLL(amd_runtime.library_path)

    def has(name):
        try:
            getattr(lib, name)
        except AttributeError:
            return False
        return True
    return has


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    """What the headers of the release say: version, hipMemoryType values, the IPC flag, and
    whether hipMemPoolProps has maxSize (compiled with gcc against HIPMR_HIP_INCLUDE)."""
    inc, gcc = _include_dir(), shutil.which("gcc")
    if inc is None or gcc is None:
        _missing("libamdhip64-dev headers" if inc is None else "gcc")
    names = ["hipMemoryTypeHost", "hipMemoryTypeDevice", "hipMemoryTypeUnified"]
    src = tmp_path_factory.mktemp("release") / "probe.c"
    src.write_text("\n".join([
        "#include <stdio.h>", "#include <hip/hip_runtime_api.h>",
        "#include <hip/hip_version.h>", "int main(void) {",
        '  printf("HIP_VERSION_MAJOR %d\\n", HIP_VERSION_MAJOR);',
        '  printf("HIP_VERSION_MINOR %d\\n", HIP_VERSION_MINOR);',
        '  printf("hipIpcMemLazyEnablePeerAccess %d\\n", (int)hipIpcMemLazyEnablePeerAccess);',
        *[f'  printf("{n} %d\\n", (int){n});' for n in names],
        "  return 0;", "}"]) + "\n")
    exe = src.with_suffix("")
    subprocess.run([gcc, "-D__HIP_PLATFORM_AMD__", "-I", inc, str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    values = dict((k, int(v)) for k, v in (line.split() for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()))
    texts = "".join(open(p, errors="replace").read()
                    for p in glob.glob(os.path.join(inc, "hip", "**", "*.h"), recursive=True))
    values["maxSize"] = _struct_has(texts, "hipMemPoolProps", "maxSize")
    return values


def _struct_has(texts, struct, field):
    """Whether the C struct typedef'd as ``struct`` declares ``field`` (in any header)."""
    for part in texts.split("typedef struct")[1:]:
        body, sep, rest = part.partition("}")
        if sep and rest.lstrip().startswith(struct):
            return f" {field};" in body or f" {field}[" in body
    return False


# ---- the loaded library is the release named, and the headers are its own ------------------

def test_the_loaded_library_is_the_release_named(amd_runtime, version):
    want = os.environ.get("HIPMR_EXPECT_HIP_FILE_VERSION")
    if not want:
        pytest.skip("no release named (.ci/rocm_matrix.sh sets HIPMR_EXPECT_HIP_FILE_VERSION)")
    assert ".".join(map(str, version)) == want
    assert os.path.realpath(amd_runtime.library_path).endswith(".so." + want)
    from hipmr_ctypes.__main__ import rocm_release
    assert rocm_release(version) == os.environ["HIPMR_EXPECT_ROCM_WORDS"]


def test_the_headers_are_the_loaded_librarys_release(header, version):
    assert (header["HIP_VERSION_MAJOR"], header["HIP_VERSION_MINOR"]) == version[:2], (
        "the headers found (HIPMR_HIP_INCLUDE, /usr/include) are not those of the library "
        "loaded: point HIPMR_HIP_INCLUDE at the headers of the same release")


# ---- optional symbols: bound exactly when the loaded library exports them -------------------

@pytest.mark.parametrize("name", [d.name for d in decls.DECLS])
def test_each_function_is_bound_exactly_when_exported(amd_runtime, exported, name):
    fn = getattr(amd_runtime.fn, name)
    assert (not getattr(fn, "missing", False)) == exported(name)


def test_stream_get_device_absent_before_5_6(amd_runtime, version, exported):
    """5.2 lacks hipStreamGetDevice: the binding holds a stand-in that raises
    NotSupportedError and ``stream_ref.device()`` falls back; from 5.6 it is the real one."""
    present = version[:2] >= (5, 6)
    assert exported("hipStreamGetDevice") == present
    fn = amd_runtime.fn.hipStreamGetDevice
    assert getattr(fn, "missing", False) == (not present)
    if not present:
        with pytest.raises(hipmr_ctypes.NotSupportedError, match="hipStreamGetDevice"):
            fn(None, ctypes.byref(ctypes.c_int()))


def test_hip_6_0_symbols(amd_runtime, version, exported):
    """hipGetDevicePropertiesR0600 and hipExtGetLastError arrive in 6.0.  The package reads
    device properties through hipDeviceGetAttribute only (the same ABI in every release), so
    it declares neither layout of hipDeviceProp_t and needs no R0600 branch."""
    six = version[0] >= 6
    assert exported("hipGetDevicePropertiesR0600") == six
    assert exported("hipExtGetLastError") == six
    assert getattr(amd_runtime.fn.hipExtGetLastError, "missing", False) == (not six)
    names = {d.name for d in decls.DECLS}
    assert not {n for n in names if n.startswith("hipGetDeviceProperties")}
    assert "hipDeviceGetAttribute" in names


CAPTURE_API = ("hipStreamBeginCapture", "hipStreamEndCapture", "hipStreamIsCapturing",
               "hipStreamGetCaptureInfo", "hipThreadExchangeStreamCaptureMode",
               "hipGraphInstantiate", "hipGraphLaunch", "hipGraphDestroy", "hipGraphExecDestroy")


def test_capture_api_is_in_every_release(amd_runtime, header, exported):
    """The stream-capture and graph functions the package declares (first exported by HIP 4.3
    to 5.0) are in every supported release, bound to the real symbols; their enums have the
    values the package uses (tests/binding/test_abi.py compares them against the headers)."""
    for name in CAPTURE_API:
        assert exported(name), name
        assert not getattr(getattr(amd_runtime.fn, name), "missing", False), name
    from hipmr_ctypes._hip import types
    assert (types.hipStreamCaptureModeGlobal, types.hipStreamCaptureModeThreadLocal,
            types.hipStreamCaptureModeRelaxed) == (0, 1, 2)
    assert (types.hipStreamCaptureStatusNone, types.hipStreamCaptureStatusActive,
            types.hipStreamCaptureStatusInvalidated) == (0, 1, 2)
    # callable through the declared signature: success on a GPU, the no-device answer
    # (hipErrorNoDevice, or 5.2's hipErrorInvalidDevice) without one
    mode = ctypes.c_int(2)
    assert amd_runtime.fn.hipThreadExchangeStreamCaptureMode(ctypes.byref(mode)) in (0, 100, 101)


# ---- values that changed at 6.0 and 6.2 -----------------------------------------------------

def test_ipc_open_flag_is_the_loaded_releases(amd_runtime, header, version):
    from hipmr_ctypes.ipc import ipc_open_flags
    assert ipc_open_flags(amd_runtime) == header["hipIpcMemLazyEnablePeerAccess"]
    assert ipc_open_flags(amd_runtime) == (0 if version[0] < 6 else 1)


@pytest.mark.parametrize("kind", ["Host", "Device", "Unified"])
def test_memory_type_numbering_is_the_loaded_releases(amd_runtime, header, version,
                                                      monkeypatch, kind):
    """``Buffer``'s pointer queries read hipPointerAttribute_t.type with the numbering of
    the loaded library (renumbered at 6.0): fed the value the release's header gives for
    ``hipMemoryType<kind>``, the package's own code reads that kind."""
    value = header[f"hipMemoryType{kind}"]

    def fake(attrs, ptr):
        attrs.type, attrs.device, attrs.isManaged = value, 0, 0
        return 0

    monkeypatch.setattr(amd_runtime.fn, "hipPointerGetAttributes", fake)
    monkeypatch.setattr(_hip, "get_runtime", lambda: amd_runtime)
    from hipmr_ctypes import _memory_query
    table = MEMORY_TYPE_5 if version[0] < 6 else MEMORY_TYPE_6
    assert table[value] == kind.lower()
    assert _memory_query.pointer_device(0x10000) == (0 if kind == "Device" else None)
    assert isinstance(hipPointerAttribute_t().type, int)


def test_pool_props_max_size_from_6_2(header, version):
    """hipMemPoolProps gained ``maxSize`` in 6.2 at the offset where ``reserved`` began before:
    the package's one 88-byte layout names it always and leaves it zero, which every release
    reads as "the default" (before 6.2: reserved bytes, zero as they must be)."""
    from hipmr_ctypes._hip.types import hipMemPoolProps
    assert header["maxSize"] == (version[:2] >= (6, 2))
    props = hipMemPoolProps()
    assert ctypes.sizeof(props) == 88 and hipMemPoolProps.maxSize.offset == 24
    assert bytes(props) == bytes(88)


# ---- the 7.0 behaviour changes: the emulator as the loaded release, and the real GPU -------

def _emulated_as(version):
    return create_emulated_runtime({"HIPMR_EMULATED_VERSION": ".".join(map(str, version)),
                                    "HIPMR_EMULATED_DEVICES": "1"})


def test_get_last_error_is_sticky_from_7_0_in_the_emulator_of_this_release(version):
    """From 7.0 hipGetLastError returns the thread's last real error (like CUDA), before it
    the result of the last call; the emulator the unit tests run on, configured as the
    loaded release, behaves as that release."""
    rt = _emulated_as(version)
    out = ctypes.c_void_p()
    assert rt.fn.hipMalloc(out, 1 << 62) != 0            # a real error
    assert rt.fn.hipDeviceSynchronize() == 0             # then a call that succeeds
    assert (rt.fn.hipGetLastError() != 0) == (version[0] >= 7)
    assert rt.fn.hipGetLastError() == 0                  # reading it resets it on both sides


def test_free_async_null_in_the_emulator_of_this_release(version):
    """hipFreeAsync(NULL) is hipErrorInvalidValue before 7.0 and success from 7.0; the
    package never passes NULL (``deallocate`` of a null pointer does nothing)."""
    rt = _emulated_as(version)
    st = rt.fn.hipFreeAsync(None, None)
    assert (st == 0) == (version[0] >= 7)
    rt.fn.hipGetLastError()


def _amd_gpu(amd_runtime):
    count = ctypes.c_int(0)
    if amd_runtime.fn.hipGetDeviceCount(count) or count.value < 1:
        amd_runtime.clear_last_error()
        # required only on an AMD GPU run (a GPU run on NVIDIA has no AMD device to use)
        if os.environ.get("HIPMR_REQUIRE_GPU") == "1" and _hip.selected_platform() == "amd":
            pytest.fail("an AMD GPU is required (HIPMR_REQUIRE_GPU=1, HIPMR_PLATFORM=amd) "
                        "but none is visible")
        pytest.skip("needs an AMD GPU: without one the real library answers every device "
                    "call with hipErrorNoDevice")


@pytest.mark.gpu
def test_get_last_error_on_the_real_library(amd_runtime, version):
    _amd_gpu(amd_runtime)
    out = ctypes.c_void_p()
    assert amd_runtime.fn.hipMalloc(out, 1 << 62) != 0
    assert amd_runtime.fn.hipDeviceSynchronize() == 0
    assert (amd_runtime.fn.hipGetLastError() != 0) == (version[0] >= 7)
    assert amd_runtime.fn.hipGetLastError() == 0


@pytest.mark.gpu
def test_free_async_null_on_the_real_library(amd_runtime, version):
    _amd_gpu(amd_runtime)
    assert (amd_runtime.fn.hipFreeAsync(None, None) == 0) == (version[0] >= 7)
    amd_runtime.clear_last_error()

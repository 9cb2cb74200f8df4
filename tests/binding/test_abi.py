"""ABI check: compile a C probe with gcc against the libamdhip64-dev headers and compare every
struct size, field offset, enum value and macro the package declares.

Marked ``amd_library``: it needs the headers (Debian's libamdhip64-dev) and gcc; it fails instead
of skipping when HIPMR_REQUIRE_AMD_LIBRARY=1.
"""
import ctypes
import os
import shutil
import subprocess

import pytest

from hipmr_ctypes._hip import decls, types

pytestmark = pytest.mark.amd_library

HEADER_DIRS = [os.environ.get("HIPMR_HIP_INCLUDE", ""), "/usr/include", "/opt/rocm/include"]

# ctypes field -> C field name, where the header's name differs (ROCm 5.x names)
ALIASES_5 = {
    ("hipPointerAttribute_t", "type"): "memoryType",
    ("hipMemPoolProps", "maxSize"): "reserved",   # reserved[64] starts where maxSize is in 6.2+
}


def _include_dir():
    for d in HEADER_DIRS:
        if d and os.path.exists(os.path.join(d, "hip", "hip_runtime_api.h")):
            return d
    return None


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    inc = _include_dir()
    gcc = shutil.which("gcc")
    if inc is None or gcc is None:
        msg = "libamdhip64-dev headers" if inc is None else "gcc"
        if os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") == "1":
            pytest.fail(f"{msg} required (HIPMR_REQUIRE_AMD_LIBRARY=1) but missing")
        pytest.skip(f"{msg} not available")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <hip/hip_runtime_api.h>",
             "#include <hip/hip_version.h>", "int main(void) {",
             '  printf("version HIP_VERSION_MAJOR %d\\n", HIP_VERSION_MAJOR);',
             '  printf("version HIP_VERSION_MINOR %d\\n", HIP_VERSION_MINOR);']
    for sname in types.STRUCTS:
        lines.append(f'  printf("sizeof {sname} %zu\\n", sizeof({sname}));')
        lines.append(f'  printf("alignof {sname} %zu\\n", _Alignof({sname}));')
    for sname, ctype in types.STRUCTS.items():
        for fname, _ in ctype._fields_:
            if (sname, fname) == ("hipMemPoolProps", "reserved"):
                # before 6.2, reserved[64] also covers the bytes where 6.2 put maxSize
                lines.append(f'  printf("offsetof {sname}.{fname} %zu\\n", '
                             f'offsetof({sname}, reserved) + (sizeof({sname}) - '
                             f'offsetof({sname}, reserved) == 64 ? 8 : 0));')
                continue
            c5 = ALIASES_5.get((sname, fname), fname)
            lines.append("#if HIP_VERSION_MAJOR < 6")
            lines.append(f'  printf("offsetof {sname}.{fname} %zu\\n", offsetof({sname}, {c5}));')
            lines.append("#else")
            if (sname, fname) == ("hipMemPoolProps", "maxSize"):
                lines.append("#if HIP_VERSION_MAJOR == 6 && HIP_VERSION_MINOR < 2")
                lines.append(f'  printf("offsetof {sname}.{fname} %zu\\n", '
                             f'offsetof({sname}, reserved));')
                lines.append("#else")
                lines.append(f'  printf("offsetof {sname}.{fname} %zu\\n", '
                             f'offsetof({sname}, {fname}));')
                lines.append("#endif")
            else:
                lines.append(f'  printf("offsetof {sname}.{fname} %zu\\n", '
                             f'offsetof({sname}, {fname}));')
            lines.append("#endif")
    lines += _allocation_prop_probe()
    for name in types.ENUMS:
        since = types.ENUMS_SINCE.get(name)
        if since:
            lines.append(f"#if HIP_VERSION_MAJOR * 100 + HIP_VERSION_MINOR >= "
                         f"{since[0] * 100 + since[1]}")
        lines.append(f'  printf("enum {name} %d\\n", (int){name});')
        if since:
            lines.append("#endif")
    for name in types.MACROS:
        lines.append(f'  printf("macro {name} %lld\\n", (long long)({name}));')
    lines.append('  printf("macro hipIpcMemLazyEnablePeerAccess %lld\\n", '
                 '(long long)(hipIpcMemLazyEnablePeerAccess));')
    lines += ["  return 0;", "}"]
    tmp = tmp_path_factory.mktemp("abi")
    src = tmp / "probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp / "probe"
    subprocess.run([gcc, "-D__HIP_PLATFORM_AMD__", "-I", inc, str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        result[(kind, name)] = int(value)
    return result


# hipMemAllocationProp: ROCm 5.2's order, CUDA's after it (allocFlags' fields flattened in the
# ctypes structure); the C spelling of each ctypes field in each
_PROP_FIELDS_5_2 = {"compressionType": "compressionType", "location": "location",
                    "requestedHandleType": "requestedHandleType", "type": "type",
                    "usage": "usage", "win32HandleMetaData": "win32HandleMetaData"}
_PROP_FIELDS = {"type": "type", "requestedHandleType": "requestedHandleType",
                "location": "location", "win32HandleMetaData": "win32HandleMetaData",
                "compressionType": "allocFlags.compressionType",
                "gpuDirectRDMACapable": "allocFlags.gpuDirectRDMACapable",
                "usage": "allocFlags.usage"}


def _allocation_prop_probe():
    lines = ['  printf("sizeof hipMemAllocationProp %zu\\n", sizeof(hipMemAllocationProp));',
             '  printf("alignof hipMemAllocationProp %zu\\n", _Alignof(hipMemAllocationProp));',
             "#if HIP_VERSION_MAJOR == 5 && HIP_VERSION_MINOR < 3"]
    for spelled in (_PROP_FIELDS_5_2, None, _PROP_FIELDS):
        if spelled is None:
            lines.append("#else")
            continue
        for fname, cname in spelled.items():
            lines.append(f'  printf("offsetof hipMemAllocationProp.{fname} %zu\\n", '
                         f'offsetof(hipMemAllocationProp, {cname}));')
    lines.append("#endif")
    return lines


def test_allocation_prop_layout_of_these_headers(probe):
    """The structure ``types.allocation_prop_type`` picks for the headers' version has their
    size, alignment and every field's offset."""
    ctype = types.allocation_prop_type(probe[("version", "HIP_VERSION_MAJOR")],
                                       probe[("version", "HIP_VERSION_MINOR")])
    assert ctypes.sizeof(ctype) == probe[("sizeof", "hipMemAllocationProp")]
    assert ctypes.alignment(ctype) == probe[("alignof", "hipMemAllocationProp")]
    for fname, _ in ctype._fields_:
        assert getattr(ctype, fname).offset == \
            probe[("offsetof", f"hipMemAllocationProp.{fname}")], fname


def test_probe_reads_the_header_version(probe):
    assert probe[("version", "HIP_VERSION_MAJOR")] >= 5


@pytest.mark.parametrize("sname", sorted(types.STRUCTS))
def test_struct_size_and_alignment(probe, sname):
    ctype = types.STRUCTS[sname]
    assert ctypes.sizeof(ctype) == probe[("sizeof", sname)]
    assert ctypes.alignment(ctype) == probe[("alignof", sname)]


@pytest.mark.parametrize("sname", sorted(types.STRUCTS))
def test_field_offsets(probe, sname):
    ctype = types.STRUCTS[sname]
    for fname, _ in ctype._fields_:
        assert getattr(ctype, fname).offset == probe[("offsetof", f"{sname}.{fname}")], fname


@pytest.mark.parametrize("name", sorted(types.ENUMS))
def test_enum_values(probe, name):
    if ("enum", name) not in probe:
        major = probe[("version", "HIP_VERSION_MAJOR")]
        assert name in types.ENUMS_SINCE and major <= types.ENUMS_SINCE[name][0]
        pytest.skip(f"{name} is newer than these headers")
    assert types.ENUMS[name] == probe[("enum", name)]


@pytest.mark.parametrize("name", sorted(types.MACROS))
def test_macro_values(probe, name):
    assert types.MACROS[name] == probe[("macro", name)]


def test_ipc_open_flag_of_these_headers(probe):
    major = probe[("version", "HIP_VERSION_MAJOR")]
    assert types.ipc_lazy_enable_peer_access(major) == \
        probe[("macro", "hipIpcMemLazyEnablePeerAccess")]


def test_every_declared_function_is_in_the_header():
    inc = _include_dir()
    if inc is None:
        if os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") == "1":
            pytest.fail("libamdhip64-dev headers required but missing")
        pytest.skip("headers not available")
    text = open(os.path.join(inc, "hip", "hip_runtime_api.h")).read()
    major = int(open(os.path.join(inc, "hip", "hip_version.h")).read()
                .split("HIP_VERSION_MAJOR")[1].split()[0])
    for decl in decls.DECLS:
        since = tuple(int(x) for x in decl.since.split("."))
        if since[0] > major or (since[0] == major and since > (major, 2)):
            continue  # newer than these headers (optional symbols)
        assert f" {decl.name}(" in text, decl.name


# ctypes argument type -> a C expression of that type, for the call probe below
def _c_argument(ctype):
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
        return f"*({ctype.__name__}*)0"        # a structure passed by value
    if ctype is ctypes.c_void_p:
        return "(void*)0"
    if ctype is ctypes.c_char_p:
        return "(char*)0"
    scalars = {ctypes.c_int: "int", ctypes.c_uint: "unsigned int", ctypes.c_size_t: "size_t",
               ctypes.c_ubyte: "unsigned char", ctypes.c_ushort: "unsigned short",
               ctypes.c_ulonglong: "unsigned long long"}
    if ctype in scalars:
        return f"({scalars[ctype]})0"
    if hasattr(ctype, "_type_"):                 # POINTER(x): any object pointer
        return "(void*)0"
    raise AssertionError(f"no C spelling for {ctype!r}")


def test_every_declared_function_takes_the_declared_arguments(tmp_path):
    """Call every function of the table (in dead code) with one argument of each declared
    ctypes type: gcc rejects a wrong count, a structure where a pointer is expected (and the
    reverse) and an integer where a pointer is expected."""
    inc = _include_dir()
    gcc = shutil.which("gcc")
    if inc is None or gcc is None:
        if os.environ.get("HIPMR_REQUIRE_AMD_LIBRARY") == "1":
            pytest.fail("libamdhip64-dev headers and gcc required but missing")
        pytest.skip("headers or gcc not available")
    major = int(open(os.path.join(inc, "hip", "hip_version.h")).read()
                .split("HIP_VERSION_MAJOR")[1].split()[0])
    lines = ["#include <stddef.h>", "#include <hip/hip_runtime_api.h>",
             "int main(int argc, char** argv) {", "  (void)argv;", "  if (argc < 0) {"]
    for decl in decls.DECLS:
        since = tuple(int(x) for x in decl.since.split("."))
        if since[0] > major or (since[0] == major and since > (major, 2)):
            continue
        args = ", ".join(_c_argument(t) for t in decl.argtypes)
        lines.append(f"    (void){decl.name}({args});")
    lines += ["  }", "  return 0;", "}"]
    src = tmp_path / "calls.c"
    src.write_text("\n".join(lines) + "\n")
    done = subprocess.run([gcc, "-D__HIP_PLATFORM_AMD__", "-Werror=int-conversion",
                           "-Werror=implicit-function-declaration", "-I", inc, "-c", str(src),
                           "-o", str(tmp_path / "calls.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

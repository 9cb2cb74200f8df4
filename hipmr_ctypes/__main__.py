"""``python -m hipmr_ctypes [info|check|bench] [--json]`` and ``python -m hipmr_ctypes plot LOG``:
the command line.

``info`` (the default): the platform, the library file and its version, every device with its
name, memory and whether it supports memory pools and managed memory, is integrated (an APU)
and reaches pageable memory.  With no device it says
so plainly and why.  ``check``: a quick self-test of the resources on this machine.  ``bench``:
a short allocation benchmark of the package's resources (the full comparison with peers is
``scripts/bench_alloc.py``).  ``plot LOG.csv [-o memory.html]``: a picture of a CSV log
(``plot --help`` lists its options).
"""
from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import sys
from typing import Any, Dict, List, Optional

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.failure import no_device_hint
from hipmr_ctypes._hip.loader import library_version_from_path


def _dpkg_release(path: str) -> Optional[str]:
    """The version of the Debian / Ubuntu package that installed exactly ``path``, if any
    (only this command reads dpkg's records, never an import)."""
    info = "/var/lib/dpkg/info"
    try:
        lists = [name for name in os.listdir(info) if name.endswith(".list")]
    except OSError:
        return None
    owner = None
    for name in lists:
        try:
            with open(os.path.join(info, name), errors="replace") as fh:
                if any(line.rstrip("\n") == path for line in fh):
                    owner = name[:-5].split(":")[0]
                    break
        except OSError:
            continue
    if owner is None:
        return None
    try:
        package = None
        with open("/var/lib/dpkg/status", errors="replace") as fh:
            for line in fh:
                if line.startswith("Package: "):
                    package = line[9:].strip()
                elif line.startswith("Version: ") and package == owner:
                    return line[9:].strip().split("-")[0].split(":")[-1]
    except OSError:
        pass
    return None


def _rocm_sdk_release(real: str) -> Optional[str]:
    """The version of AMD's ``rocm-sdk-core`` wheel when ``real`` is its HIP runtime
    (``site-packages/_rocm_sdk_core/lib/libamdhip64.so*``): the ``Version`` of the wheel's
    ``rocm_sdk_core-*.dist-info/METADATA`` beside it, the ROCm release (ROCm 10.0 ships HIP 7.15:
    the two no longer agree)."""
    from ._hip.search import ROCM_SDK_CORE
    lib = os.path.dirname(real)
    package = os.path.dirname(lib)
    if os.path.basename(lib) != "lib" or os.path.basename(package) != ROCM_SDK_CORE:
        return None
    site = os.path.dirname(package)
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return None
    for name in names:
        if name.startswith("rocm_sdk_core-") and name.endswith(".dist-info"):
            try:
                with open(os.path.join(site, name, "METADATA"), errors="replace") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line[8:].strip()
                        if not line.strip():        # the end of the headers
                            break
            except OSError:
                continue
    return None


def _package_version(path: Optional[str]) -> Optional[str]:
    """The release of the package that installed the loaded library file itself (AMD's
    ``rocm-sdk-core`` wheel, a ROCm install's ``.info/version``, or the distribution package
    owning that file), or None."""
    if not path:
        return None
    real = os.path.realpath(path)
    wheel = _rocm_sdk_release(real)
    if wheel:
        return wheel
    root = os.path.dirname(os.path.dirname(real))
    for info in (os.path.join(root, ".info", "version"), os.path.join(root, ".info", "version-dev")):
        try:
            with open(info) as fh:
                return fh.read().strip()
        except OSError:
            pass
    return _dpkg_release(real) or (_dpkg_release(path) if real != path else None)


#: the ROCm releases whose HIP runtime is HIP <major>.<minor> (a ROCm x.y release ships HIP x.y,
#: e.g. ROCm 6.4.3's libamdhip64.so.6.4.43484); HIP minors past the last release here come
#: from development builds (HIP 7.12 ...), which name no ROCm release
_ROCM_RELEASES = {5: 7, 6: 4, 7: 2}  # major -> the newest minor released


def rocm_release(hip_version: Any) -> Optional[str]:
    """The ROCm release of a HIP runtime version ``(major, minor, patch)``, in a user's words:
    ``"ROCm 6.4"``; a development build (a minor past the releases known here) is ``"a ROCm 7
    development build"``; None for anything else."""
    try:
        major, minor = int(hip_version[0]), int(hip_version[1])
    except (TypeError, ValueError, IndexError):
        return None
    newest = _ROCM_RELEASES.get(major)
    if newest is None or minor < 0:
        return None
    return f"ROCm {major}.{minor}" if minor <= newest else f"a ROCm {major} development build"


def _why_no_device(platform: str, err: Optional[BaseException]) -> str:
    what = {"amd": "no AMD GPU visible", "nvidia": "no NVIDIA GPU visible",
            "emulated": "HIPMR_EMULATED_DEVICES is 0"}[platform]
    name = getattr(err, "name", None)
    if name:
        return f"{name}: {what}"
    return what


class ConfigurationError(Exception):
    """The environment names no usable platform or library: ``message`` (one line) and
    ``hint`` (what to change)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: set (by :func:`load_runtime`) when nothing is installed at all: see :func:`no_runtime`
        self.no_runtime: Optional[Dict[str, Any]] = None


def configuration_error(exc: BaseException, platform: Optional[str]) -> ConfigurationError:
    """The one-line message and the fitting hint for an error that stopped the runtime from
    loading.  The hint is chosen by what the error carries (its type, the variable a
    ``search.setting_error`` names, the library problem a ``NotSupportedError`` notes), never
    by its text."""
    first = str(exc).partition("\n")[0]
    if isinstance(exc, hmr.LibraryNotFoundError):
        tried = [entry.strip() for entry in exc.tried]
        head = f"could not load {exc._what}; tried" if exc._what else first.rstrip(":; ")
        message = head + (": " + "; ".join(tried) if tried else "")
        advice = [line.strip() for line in exc._hint.splitlines() if line.strip()]
        hint = " ".join(advice) or "set HIPMR_LIBRARY to the exact library file"
        return ConfigurationError(message, hint)
    setting = getattr(exc, "setting", None) if isinstance(exc, ValueError) else None
    if setting == "HIPMR_PLATFORM":
        return ConfigurationError(first, "set HIPMR_PLATFORM to amd, nvidia or emulated, or "
                                         "unset it (default: amd)")
    if isinstance(setting, str):
        return ConfigurationError(first, f"fix {setting} or unset it (the README's "
                                         f"'Environment variables' lists the forms)")
    problem = exc._library_problem if isinstance(exc, hmr.NotSupportedError) else None
    if problem == "not a runtime":
        lib = "libcudart" if platform == "nvidia" else "libamdhip64"
        return ConfigurationError(first, f"point HIPMR_LIBRARY at {lib}, or unset it to search "
                                         f"the usual places")
    if problem == "too old":
        return ConfigurationError(first, "install a newer runtime (ROCm 5.2 or later), or point "
                                         "HIPMR_LIBRARY at one")
    hint = "set HIPMR_LIBRARY to the exact library file"
    if platform != "emulated":
        hint += ", or HIPMR_PLATFORM=emulated to use the package without a GPU"
    return ConfigurationError(first, hint)


def no_runtime(exc: BaseException, platform: Optional[str]) -> Optional[Dict[str, Any]]:
    """``info``'s report when no runtime library is installed at all: none of the places
    searched holds one and no variable names one.  None for a misconfiguration instead: a
    library that exists but does not load, or a variable (``HIPMR_LIBRARY``, a ROCm or CUDA
    root) that names nothing usable."""
    if not isinstance(exc, hmr.LibraryNotFoundError) or not exc._absent or platform is None:
        return None
    from ._hip.search import ROCM_VARIABLES, SEARCHED
    roots = ROCM_VARIABLES if platform == "amd" else ("CUDA_HOME",)
    if any(os.environ.get(var) for var in ("HIPMR_LIBRARY", *roots)):
        return None
    amd = platform == "amd"
    library = "libamdhip64" if amd else "libcudart"
    runtime = "HIP runtime" if amd else "CUDA runtime"
    root = ("ROCM_PATH=<ROCm install> (or ROCM_HOME, HIP_PATH)" if amd
            else "CUDA_HOME=<CUDA install>")
    return {"package": hmr.__version__, "python": sys.version.split()[0], "platform": platform,
            "loaded": False, "library": None, "devices": [],
            "no_runtime": f"no {runtime} ({library}) found on this machine",
            "searched": SEARCHED[platform],
            "point_at_one": f"HIPMR_LIBRARY=<the {library} file>, or {root}",
            "host_memory": "works without a runtime: HostMemoryResource and the adaptors over it",
            "emulated": "HIPMR_PLATFORM=emulated python -m hipmr_ctypes",
            "require_device": "python -m hipmr_ctypes --require-device exits 1 here"}


def print_no_runtime(report: Dict[str, Any]) -> None:
    """The human-readable form of :func:`no_runtime`'s report."""
    print(f"hipmr_ctypes {report['package']} (Python {report['python']})")
    print(f"platform: {report['platform']}")
    print(f"library: none: {report['no_runtime']}")
    print("looked in, in order:")
    for place in report["searched"]:
        print(f"  {place}")
    print(f"point at one: {report['point_at_one']}")
    print(f"host memory {report['host_memory']}")
    print(f"try the emulated platform (devices on host memory): {report['emulated']}")
    print(f"scripts that need a device: {report['require_device']}")


def load_runtime() -> Any:
    """The process-wide runtime; ConfigurationError when the environment names none usable
    (its ``no_runtime`` is :func:`no_runtime`'s report when nothing is installed at all)."""
    try:
        platform: Optional[str] = hmr.platform()
    except ValueError as exc:
        raise configuration_error(exc, None) from None
    try:
        return _hip.get_runtime()
    except Exception as exc:  # noqa: BLE001 - every load failure is a configuration error
        error = configuration_error(exc, platform)
        error.no_runtime = no_runtime(exc, platform)
        raise error from None


def collect_info() -> Dict[str, Any]:
    """Everything ``info`` prints, as a dict; ConfigurationError when nothing can load."""
    report: Dict[str, Any] = {"package": hmr.__version__, "python": sys.version.split()[0]}
    rt = load_runtime()
    report["platform"] = platform = rt.platform
    report.update(loaded=True, library=rt.library_path,
                  library_file_version=library_version_from_path(
                      os.path.realpath(rt.library_path) if rt.library_path else None),
                  release=_package_version(rt.library_path))
    for key, query in (("runtime_version", rt.runtime_version),
                       ("driver_version", rt.driver_version)):
        try:
            report[key] = ".".join(map(str, query()))
        except hmr.HipError as exc:
            report[key] = None
            report[key + "_error"] = str(exc)
    if platform == "amd" and report.get("runtime_version"):
        hip = report["runtime_version"].split(".")
        report["hip_version"] = ".".join(hip[:2])
        # the install's own ROCm release where it says (a wheel's, an install's, a package's),
        # else the one the HIP version implies (they agree up to ROCm 7.2)
        report["rocm_release"] = (f"ROCm {report['release']}" if report.get("release")
                                  else rocm_release(hip))
    import ctypes
    count = ctypes.c_int(0)
    st = rt.fn.hipGetDeviceCount(count)
    err = rt.error(st, "hipGetDeviceCount") if st else None
    devices: List[Dict[str, Any]] = []
    report["devices"] = devices
    from ._config import describe
    report["device_resource"] = describe(count.value if err is None else 0)
    if err is not None or count.value == 0:
        report["no_device"] = _why_no_device(platform, err)
        report["hint"] = no_device_hint(platform)
        return report
    for i in range(count.value):
        entry: Dict[str, Any] = {"id": i}
        try:
            dev = hmr.Device(i)
            entry["name"] = dev.name
            free, total = dev.memory_info()
            entry.update(memory_total=total, memory_free=free,
                         memory_pools=dev.supports_memory_pools,
                         managed_memory=dev.supports_managed_memory,
                         integrated=dev.integrated,
                         pageable_memory_access=dev.pageable_memory_access)
        except hmr.HipError as exc:
            entry["error"] = str(exc)
        devices.append(entry)
    return report


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


_LIBRARY_NAMES = {"amd": "libamdhip64", "nvidia": "libcudart", "emulated": "emulated runtime"}


def print_info(report: Dict[str, Any]) -> None:
    """The human-readable form of :func:`collect_info`."""
    print(f"hipmr_ctypes {report['package']} (Python {report['python']})")
    print(f"platform: {report['platform']}")
    lib = report.get("library") or "(none: host-memory emulation)"
    # the loaded file's own version: its package's release, else the version the file
    # reports through the runtime API (never another package's)
    version = report.get("release") or report.get("runtime_version")
    print(f"library: {lib}" + (f" (release {version})" if report.get("library") and version
                               else ""))
    words = report.get("rocm_release") or ""
    hip = report.get("hip_version")
    if words and hip and not (words == f"ROCm {hip}" or words.startswith(f"ROCm {hip}.")):
        words = f"HIP {hip}, {words}"         # ROCm 10.0 ships HIP 7.15: say both
    words = f" ({words})" if words else ""
    print(f"runtime version: {report.get('runtime_version')}{words}; "
          f"driver version: {report.get('driver_version')}")
    config = report.get("device_resource")
    if config:
        where = ("the default" if config["source"] == "default"
                 else f"from {config['source']}={config['spec']!r}")
        print(f"device resource: {config.get('detail') or 'invalid'} ({where})")
        if "error" in config:
            print(f"  error: {config['error']}")
    if report.get("no_device"):
        name = _LIBRARY_NAMES[report["platform"]]
        print(f"devices: none ({name} {version} loaded; {report['no_device']})")
        print(f"hint: {report['hint']}")
        return
    print(f"devices: {len(report['devices'])}")
    for d in report["devices"]:
        if "error" in d:
            print(f"  [{d['id']}] error: {d['error']}")
            continue
        print(f"  [{d['id']}] {d['name']}: {_gib(d['memory_total'])} total, "
              f"{_gib(d['memory_free'])} free; memory pools: "
              f"{'yes' if d['memory_pools'] else 'no'}; managed memory: "
              f"{'yes' if d['managed_memory'] else 'no'}; integrated: "
              f"{'yes' if d['integrated'] else 'no'}; pageable memory access: "
              f"{'yes' if d['pageable_memory_access'] else 'no'}")


#: name -> (one line for the command list, the command's own --help description)
_COMMANDS = {
    "info": ("platform, library and its version, devices (the default)",
             "The platform, the library file and its version, and every device with its "
             "memory and features.  With no device it says why and what to do."),
    "check": ("a quick self-test of every resource on this machine",
              "A quick self-test of every resource on this machine: data written, copied and "
              "read back.  Rows that need a device say 'no device' on a machine without one "
              "(not a failure).  Exit status 1 if any check failed."),
    "bench": ("median ns per allocate+deallocate pair of the package's resources",
              "Median ns per allocate+deallocate pair of the package's own resources, through "
              "async_resource_ref.  scripts/bench_alloc.py compares with CuPy, RMM, PyTorch "
              "and others."),
}

EPILOG = """exit status: 0 when the command ran on a valid configuration (a machine without a
GPU included); 1 when a check failed (or a bench row could not be measured); 2 when the
environment is misconfigured (an unknown HIPMR_PLATFORM, a library that cannot load, a
malformed HIPMR_EMULATED_* variable, a HIPMR_DEVICE_RESOURCE that cannot be built) or plot cannot draw its log, with one line saying what
(and a hint).  Output piped into a reader that stops early (| head, | grep -q) is cut there,
silently; the exit status stays the command's own."""


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (each subcommand has its own ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m hipmr_ctypes",
        description="Report on, check or time hipmr_ctypes on this machine, or plot a log.  The\n"
                    "platform comes from HIPMR_PLATFORM (amd, nvidia or emulated) and the library\n"
                    "from HIPMR_LIBRARY, as for any import of the package.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--require-device", action="store_true",
                        help="info: exit 1 when no device is usable (no runtime installed, or "
                             "none visible) instead of 0")
    parser.add_argument("--version", action="version", version=f"hipmr_ctypes {hmr.__version__}",
                        help="print the package's version and exit")
    plot_cli: Optional[Any] = None
    try:
        plot_cli = importlib.import_module("hipmr_ctypes.plot._cli")
    except ModuleNotFoundError as exc:  # plot/ may be left out of a vendored copy (README)
        if exc.name != "hipmr_ctypes.plot":
            raise
    names = [*_COMMANDS, "plot"] if plot_cli is not None else list(_COMMANDS)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}",
                                title="commands")
    for name, (line, text) in _COMMANDS.items():
        cmd = sub.add_parser(name, help=line, description=text)
        cmd.add_argument("--json", action="store_true", dest="json_sub",
                         help="print JSON instead of text")
        if name == "info":
            cmd.add_argument("--require-device", action="store_true", dest="require_device_sub",
                             help="exit 1 when no device is usable instead of 0")
    if plot_cli is None:
        return parser
    plot = sub.add_parser("plot", help="draw a CSV log of LoggingResource (plot --help for its "
                                       "options)", description=plot_cli.DESCRIPTION)
    plot_cli.add_arguments(plot)
    plot.add_argument("--json", action="store_true", dest="json_sub",
                      help="print what was written as JSON (errors too)")
    plot.set_defaults(plot_parser=plot)     # its usage errors name it
    return parser


class _PipeSafeStdout(io.TextIOBase):
    """Standard output for one command: when the reader of a pipe goes away (``| head``,
    ``| grep -q``), the rest of the output is dropped (standard output is pointed at
    ``os.devnull``, so that the interpreter's own flush at exit does not fail either) and the
    command goes on to its real exit status, with no ``BrokenPipeError`` traceback."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self._out = out
        self.broken = False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._out, "encoding", "utf-8"))

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return int(self._out.write(text))
            except BrokenPipeError:
                self._broke()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._out.flush()
            except BrokenPipeError:
                self._broke()
            except ValueError:   # the stream it wraps was closed: nothing is left to flush
                if not getattr(self._out, "closed", False):
                    raise

    def _broke(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._out.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass                          # not a file descriptor (a test's capture): dropped


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m hipmr_ctypes``; returns the exit status."""
    original = sys.stdout
    if original is None:              # standard output closed (>&-): print() writes nothing
        return _main(argv)
    safe = _PipeSafeStdout(original)
    sys.stdout = safe
    try:
        return _main(argv)
    finally:
        safe.flush()
        if sys.stdout is safe:
            sys.stdout = original


def _resource_status(problem: Optional[str]) -> int:
    """The exit status for what ``_config.check_environment`` found: 0 when nothing, else the
    misconfiguration's 2, with the cause and a hint on standard error."""
    if problem is None:
        return 0
    from ._config import VARIABLE
    print(f"python -m hipmr_ctypes: error: {problem}", file=sys.stderr)
    print(f"hint: fix {VARIABLE} or unset it (docs/resources.md, 'Set up from the "
          f"environment', lists its forms)", file=sys.stderr)
    return 2


def _main(argv: Optional[List[str]]) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(args_in)
    command = args.command or "info"
    as_json = bool(args.json or getattr(args, "json_sub", False))
    if command == "plot":             # needs no runtime: the log is replayed on host memory
        from hipmr_ctypes.plot import _cli as plot_cli
        return plot_cli.run(args, args.plot_parser, as_json=as_json)
    require_device = bool(args.require_device or getattr(args, "require_device_sub", False))
    try:
        load_runtime()
        if command == "info":
            report = collect_info()
            if as_json:
                print(json.dumps(report, indent=2))
            else:
                print_info(report)
            return (_resource_status(report["device_resource"].get("error"))
                    or _device_status(report, require_device))
    except ConfigurationError as exc:
        if command == "info" and exc.no_runtime is not None:  # nothing installed: not an error
            if as_json:
                print(json.dumps(exc.no_runtime, indent=2))
            else:
                print_no_runtime(exc.no_runtime)
            return _device_status(exc.no_runtime, require_device)
        if as_json:
            print(json.dumps({"package": hmr.__version__, "loaded": False,
                              "error": exc.message, "hint": exc.hint}, indent=2))
        print(f"python -m hipmr_ctypes: error: {exc.message}", file=sys.stderr)
        print(f"hint: {exc.hint}", file=sys.stderr)
        return 2
    from hipmr_ctypes import _selftest
    if command == "check":
        from ._config import check_environment
        problem = check_environment(hmr.device_count())
        if problem is not None:       # every row would fail on it: say the one cause
            if as_json:
                print(json.dumps({"ok": False, "error": problem}, indent=2))
            return _resource_status(problem)
        return _selftest.check(as_json=as_json)
    return _selftest.bench(as_json=as_json)


def _device_status(report: Dict[str, Any], require_device: bool) -> int:
    """``info``'s exit status: 0, or 1 under ``--require-device`` when no device is usable."""
    if require_device and not report.get("devices"):
        print("python -m hipmr_ctypes: no device is usable (--require-device)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

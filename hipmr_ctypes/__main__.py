"""``python -m hipmr_ctypes [info|check|bench] [--json]`` and ``python -m hipmr_ctypes plot LOG``.

``info`` (the default): the platform, the library file and its version, every device with its
name, memory and whether it supports memory pools and managed memory.  With no device it says
so plainly and why.  ``check``: a quick self-test of the resources on this machine.  ``bench``:
a short allocation benchmark of the package's resources (the full comparison with peers is
``scripts/bench_alloc.py``).  ``plot LOG.csv [-o memory.html]``: a picture of a CSV log
(``plot --help`` lists its options).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

import hipmr_ctypes as hmr
from hipmr_ctypes import _hip
from hipmr_ctypes._hip.loader import library_version_from_path


def _package_version(path: Optional[str]) -> Optional[str]:
    """The ROCm / distribution package release of the loaded library, where one is recorded."""
    if not path:
        return None
    root = os.path.dirname(os.path.dirname(path))
    for info in (os.path.join(root, ".info", "version"), os.path.join(root, ".info", "version-dev")):
        try:
            with open(info) as fh:
                return fh.read().strip()
        except OSError:
            pass
    try:  # Debian / Ubuntu packages (only read by this command, never at import)
        package = None
        with open("/var/lib/dpkg/status", errors="replace") as fh:
            for line in fh:
                if line.startswith("Package: "):
                    package = line[9:].strip()
                elif line.startswith("Version: ") and package and (
                        package.startswith("libamdhip64") or package.startswith("libcudart")):
                    return line[9:].strip().split("-")[0]
    except OSError:
        pass
    return None


def _why_no_device(platform: str, err: Optional[BaseException]) -> str:
    what = {"amd": "no AMD GPU visible", "nvidia": "no NVIDIA GPU visible",
            "emulated": "HIPMR_EMULATED_DEVICES is 0"}[platform]
    if err is not None and getattr(err, "name", None):
        return f"{err.name}: {what}"
    return what


def collect_info() -> Dict[str, Any]:
    """Everything ``info`` prints, as a dict."""
    report: Dict[str, Any] = {"package": hmr.__version__, "python": sys.version.split()[0]}
    try:
        report["platform"] = platform = hmr.platform()
        rt = _hip.get_runtime()
    except Exception as exc:  # noqa: BLE001 - the report says what went wrong
        report.update(loaded=False, error=str(exc), devices=[],
                      hint="set HIPMR_LIBRARY, or try HIPMR_PLATFORM=emulated to use the package "
                           "without a GPU")
        return report
    report.update(loaded=True, library=rt.library_path,
                  library_file_version=library_version_from_path(rt.library_path),
                  release=_package_version(rt.library_path))
    for key, query in (("runtime_version", rt.runtime_version),
                       ("driver_version", rt.driver_version)):
        try:
            report[key] = ".".join(map(str, query()))
        except hmr.HipError as exc:
            report[key] = None
            report[key + "_error"] = str(exc)
    import ctypes
    count = ctypes.c_int(0)
    st = rt.fn.hipGetDeviceCount(count)
    err = rt.error(st, "hipGetDeviceCount") if st else None
    devices: List[Dict[str, Any]] = []
    report["devices"] = devices
    if err is not None or count.value == 0:
        report["no_device"] = _why_no_device(platform, err)
        if platform != "emulated":
            report["hint"] = "try HIPMR_PLATFORM=emulated to use the package without a GPU"
        return report
    for i in range(count.value):
        entry: Dict[str, Any] = {"id": i}
        try:
            dev = hmr.Device(i)
            entry["name"] = dev.name
            free, total = dev.memory_info()
            entry.update(memory_total=total, memory_free=free,
                         memory_pools=dev.supports_memory_pools,
                         managed_memory=dev.supports_managed_memory)
        except hmr.HipError as exc:
            entry["error"] = str(exc)
        devices.append(entry)
    return report


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def print_info(report: Dict[str, Any]) -> None:
    """The human-readable form of :func:`collect_info`."""
    print(f"hipmr_ctypes {report['package']} (Python {report['python']})")
    print(f"platform: {report.get('platform', '(invalid)')}")
    if not report.get("loaded"):
        print(f"library: not loaded\n{report['error']}")
        print(f"hint: {report['hint']}")
        return
    lib = report.get("library") or "(none: host-memory emulation)"
    version = report.get("release") or report.get("library_file_version")
    print(f"library: {lib}" + (f" (release {version})" if version else ""))
    print(f"runtime version: {report.get('runtime_version')}; "
          f"driver version: {report.get('driver_version')}")
    if report.get("no_device"):
        name = {"amd": "libamdhip64", "nvidia": "libcudart"}.get(report["platform"], "runtime")
        rel = report.get("release") or report.get("runtime_version")
        print(f"devices: none ({name} {rel} loaded; {report['no_device']})")
        if report.get("hint"):
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
              f"{'yes' if d['managed_memory'] else 'no'}")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m hipmr_ctypes``."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["plot"]:
        from hipmr_ctypes.plot._cli import main as plot_main
        return plot_main(args_in[1:])
    parser = argparse.ArgumentParser(prog="python -m hipmr_ctypes", description=__doc__.split("\n")[0],
                                     epilog="python -m hipmr_ctypes plot LOG.csv draws a CSV log "
                                            "(plot --help for its options)")
    parser.add_argument("command", nargs="?", default="info", choices=("info", "check", "bench"))
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if args.command == "info":
        report = collect_info()
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_info(report)
        return 0
    from hipmr_ctypes import _selftest
    if args.command == "check":
        return _selftest.check(as_json=args.json)
    return _selftest.bench(as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())

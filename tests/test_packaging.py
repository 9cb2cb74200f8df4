"""The sdist and the wheel carry the license and py.typed (type checkers read the package's
hints only when py.typed is installed with it)."""
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

pytestmark = pytest.mark.any_platform

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build(kind, tmp_path):
    setuptools = pytest.importorskip("setuptools")  # CI installs it (HIPMR_REQUIRE_TOOLS=1)
    if kind == "wheel" and tuple(map(int, setuptools.__version__.split(".")[:2])) < (70, 1):
        pytest.importorskip("wheel")  # older setuptools build wheels through it
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(REPO, name), src / name)
    shutil.copytree(os.path.join(REPO, "hipmr_ctypes"), src / "hipmr_ctypes",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "dist"
    out.mkdir()
    code = (f"from setuptools import build_meta as b; "
            f"print(b.build_{kind}({str(out)!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out / done.stdout.strip().splitlines()[-1]


def test_sdist_has_license_and_py_typed(tmp_path):
    path = _build("sdist", tmp_path)
    with tarfile.open(path) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert "LICENSE" in names and "hipmr_ctypes/py.typed" in names
    assert "hipmr_ctypes/_hip/emulated/_core.py" in names


def test_wheel_has_license_and_py_typed(tmp_path):
    path = _build("wheel", tmp_path)
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(meta).decode()
    assert "hipmr_ctypes/py.typed" in names
    assert any(n.endswith("LICENSE") and ".dist-info/" in n for n in names)
    assert "MIT" in metadata
    assert not any(n.startswith("tests/") for n in names)


def test_license_is_mit():
    with open(os.path.join(REPO, "LICENSE")) as fh:
        text = fh.read()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text

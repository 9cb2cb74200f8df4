"""The sdist and the wheel carry the license and py.typed (type checkers read the package's
hints only when py.typed is installed with it)."""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
from support import REPO

pytestmark = pytest.mark.any_platform


def _build_requirement():
    """The oldest setuptools ``pyproject.toml``'s [build-system] accepts, e.g. ``(77,)``."""
    with open(os.path.join(REPO, "pyproject.toml")) as fh:
        text = fh.read()
    found = re.search(r'requires\s*=\s*\["setuptools>=([0-9.]+)"\]', text)
    assert found, "pyproject.toml's [build-system] requires names no setuptools>=N"
    return tuple(int(x) for x in found.group(1).split("."))


def _setuptools():
    """setuptools, when it is new enough for pyproject.toml; else a skip (an error under
    HIPMR_REQUIRE_TOOLS=1) that says which is needed.  Python 3.9's venv comes with
    setuptools 58, which cannot read the SPDX ``license`` of pyproject.toml."""
    setuptools = pytest.importorskip("setuptools")  # CI installs it (HIPMR_REQUIRE_TOOLS=1)
    need = _build_requirement()
    have = tuple(int(x) for x in re.findall(r"[0-9]+", setuptools.__version__)[:len(need)])
    if have < need:
        want = ".".join(map(str, need))
        msg = (f"setuptools {setuptools.__version__} is older than pyproject.toml's build "
               f"requirement setuptools>={want} (pip install 'setuptools>={want}')")
        if os.environ.get("HIPMR_REQUIRE_TOOLS") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return setuptools


def _source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(REPO, name), src / name)
    shutil.copytree(os.path.join(REPO, "hipmr_ctypes"), src / "hipmr_ctypes",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _build(kind, tmp_path):
    _setuptools()
    src = _source(tmp_path)
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


def test_offline_wheel_recipe(tmp_path):
    """The README's recipe with no network: ``pip wheel --no-deps --no-build-isolation`` with
    the setuptools already installed (no index is ever asked: PIP_NO_INDEX=1), then an
    install of that wheel from the file alone; the installed copy imports."""
    _setuptools()
    src = _source(tmp_path)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PIP_INDEX_URL", None)
    env.pop("PIP_EXTRA_INDEX_URL", None)
    pip = [sys.executable, "-m", "pip"]
    done = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w",
                                 str(tmp_path / "dist"), str(src)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("hipmr_ctypes-*.whl")
    target = tmp_path / "site"
    done = subprocess.run(pip + ["install", "--no-index", "--no-deps", "--target", str(target),
                                 str(wheel)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    code = "import hipmr_ctypes, sys; print(hipmr_ctypes.__file__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=dict(env, PYTHONPATH=str(target)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(target))
    assert (target / "hipmr_ctypes" / "py.typed").exists()

"""Type checking: the package passes mypy --strict (pyproject.toml sets it), code written as
README.md shows passes ``mypy --strict``, every python block of README.md passes it too, and
resource_ref.pyi matches resource_ref.py (mypy's stubtest).  Skipped without mypy, except
under HIPMR_REQUIRE_TOOLS=1 (CI), where a missing mypy is an error of the run."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.any_platform

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def mypy(tmp_path_factory):
    pytest.importorskip("mypy")
    cache = str(tmp_path_factory.mktemp("mypy_cache"))

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache,
                               "--config-file", os.path.join(REPO, "pyproject.toml"), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr
    return run


def test_package_passes_mypy(mypy):
    rc, out = mypy("-p", "hipmr_ctypes")
    assert rc == 0, out


def test_user_code_passes_mypy_strict(mypy):
    # --follow-imports=silent: what a user sees of an installed package, their own code's errors
    rc, out = mypy("--strict", "--follow-imports=silent",
                   os.path.join("tests", "typing", "user_code.py"))
    assert rc == 0, out


def test_readme_blocks_pass_mypy_strict(mypy, tmp_path):
    with open(os.path.join(REPO, "README.md")) as fh:
        blocks = re.findall(r"^```python\n(.*?)^```", fh.read(), re.S | re.M)
    assert blocks
    paths = []
    for i, code in enumerate(blocks):
        path = tmp_path / f"readme_block_{i}.py"
        path.write_text(code)
        paths.append(str(path))
    rc, out = mypy("--strict", "--follow-imports=silent", *paths)
    assert rc == 0, out


def test_refs_are_generic_for_type_checkers(mypy, tmp_path):
    path = tmp_path / "reveal.py"
    path.write_text("import hipmr_ctypes as hmr\n"
                    "r = hmr.async_resource_ref[hmr.device_accessible](hmr.AsyncMemoryResource())\n"
                    "reveal_type(r)\n"
                    "reveal_type(r.allocate_async(1, 256, 0))\n"
                    "x: hmr.resource_ref[hmr.host_accessible] = "
                    "hmr.async_resource_ref[hmr.device_accessible](hmr.AsyncMemoryResource())\n")
    rc, out = mypy("--strict", "--follow-imports=silent", str(path))
    assert "async_resource_ref[hipmr_ctypes.properties.device_accessible]" in out, out
    assert re.search(r'reveal.py:4: note: Revealed type is "(builtins\.)?int"', out), out
    assert "Incompatible types in assignment" in out, out  # properties are part of the type


def test_stub_matches_the_module():
    pytest.importorskip("mypy")
    done = subprocess.run([sys.executable, "-m", "mypy.stubtest", "hipmr_ctypes.resource_ref",
                           "--mypy-config-file", os.path.join(REPO, "pyproject.toml"),
                           "--allowlist", os.path.join("tests", "typing", "stubtest_allowlist.txt")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_user_code_runs_on_the_emulated_platform():
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, os.path.join("tests", "typing", "user_code.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

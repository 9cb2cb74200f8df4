"""The public surface: every exported name documented, and a light import."""
import inspect
import json
import os
import subprocess
import sys

import hipmr_ctypes as hmr

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_public_name_and_member_has_a_docstring():
    missing = []
    for name in hmr.__all__:
        obj = getattr(hmr, name)
        if isinstance(obj, (int, str, tuple, frozenset)):
            continue
        if not (getattr(obj, "__doc__", None) or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and (callable(value) or isinstance(value, property)):
                    if not (getattr(value, "__doc__", None) or "").strip():
                        missing.append(f"{name}.{attr}")
    assert missing == []


def test_py_typed_ships():
    assert os.path.isfile(os.path.join(os.path.dirname(hmr.__file__), "py.typed"))


def test_import_is_light():
    """Importing the package loads no interop peer, numpy, or the interop modules."""
    code = ("import sys, json, hipmr_ctypes; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('cupy', 'torch', 'numba', 'numpy', 'cuda', 'rmm') or m.startswith('hipmr_ctypes.interop'))))")
    env = dict(os.environ, HIPMR_PLATFORM="emulated")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_works_from_a_copied_folder(tmp_path):
    """Vendoring: the package folder copied next to a script, no install step."""
    import shutil
    shutil.copytree(os.path.join(REPO, "hipmr_ctypes"), tmp_path / "hipmr_ctypes",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "job.py"
    script.write_text("import hipmr_ctypes as h\n"
                      "b = h.Buffer.from_host(b'vendored', resource=h.HostMemoryResource())\n"
                      "print(b.tobytes().decode(), h.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HIPMR_PLATFORM"] = "emulated"
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text, path = out.stdout.split()
    assert text == "vendored" and path.startswith(str(tmp_path))

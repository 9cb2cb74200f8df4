"""A light first use: ``import hipmr_ctypes`` and a first ``Buffer`` on the emulated platform
import only what that path uses (``scripts/bench_import.py`` times it), and the concepts read
plain functions' signatures without :mod:`inspect`, with inspect's answers."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from hipmr_ctypes import concepts
from support import REPO

#: standard-library modules the first use must not import: none of them is on its path
#: (inspect and its ast / dis / tokenize, decimal, mmap, the tools of other subjects)
NOT_ON_THE_PATH = ("inspect", "ast", "dis", "tokenize", "linecache", "decimal", "fractions",
                   "mmap", "tempfile", "random", "hashlib", "json", "argparse", "pickle",
                   "subprocess", "socket", "selectors", "logging", "traceback", "textwrap",
                   "numbers", "datetime", "csv", "shutil", "platform", "signal")

FIRST_USE = """
import sys
before = set(sys.modules)
import hipmr_ctypes as hmr
buf = hmr.Buffer(1 << 16)
buf.copy_from_host(bytes(1 << 16))
assert buf.tobytes() == bytes(1 << 16)
buf.close()
loaded = sorted(set(sys.modules) - before)
import json
print(json.dumps(loaded))
"""


def test_the_first_buffer_imports_only_what_its_path_uses():
    env = dict(os.environ, HIPMR_PLATFORM="emulated", PYTHONPATH=str(REPO))
    for name in ("HIPMR_DEVICE_RESOURCE", "HIPMR_EMULATED_MEMORY"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", FIRST_USE], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    # what this interpreter's own typing imports, and imports when a NamedTuple is made, is on
    # the path (3.14 reads annotations through annotationlib, which imports ast): only the
    # rest is counted
    typing_brings = subprocess.run(
        [sys.executable, "-c", "import sys; before = set(sys.modules); import typing\n"
         "class Row(typing.NamedTuple):\n    count: int\n"   # typing at work, as the path uses it
         "brought = set(sys.modules) - before; import json; print(json.dumps(sorted(brought)))"],
        env=env, capture_output=True, text=True, timeout=60)
    assert typing_brings.returncode == 0, typing_brings.stderr
    loaded -= set(json.loads(typing_brings.stdout.splitlines()[-1]))
    unwanted = sorted(m for m in loaded if m.split(".")[0] in NOT_ON_THE_PATH)
    assert not unwanted, f"the first Buffer imports {unwanted}"
    assert "hipmr_ctypes._config" not in loaded      # HIPMR_DEVICE_RESOURCE unset: not read
    # beyond typing's, the path's own few: ctypes, struct, bisect, threading, weakref, atexit
    # and the import machinery (how many a fresh venv had imported already varies)
    outside = sorted(m for m in loaded if not m.startswith("hipmr_ctypes"))
    assert len(outside) <= 32, outside   # 15 to 21 on Pythons 3.9 to 3.14


# ---- the concepts' plain-function reading agrees with inspect -----------------------------
class _Shapes:
    def canonical(self, bytes, alignment=256): ...
    def no_default(self, bytes, alignment): ...
    def other_default(self, bytes, alignment=512): ...
    def true_default(self, bytes, alignment=True): ...
    def renamed(self, size, alignment=256): ...
    def extra_required(self, bytes, alignment=256, stream=None, *, flag): ...
    def extra_optional(self, bytes, alignment=256, stream=None, *, flag=0): ...
    def too_few(self, bytes): ...
    def star(self, *args): ...
    def star_after(self, bytes, *rest): ...
    def posonly(self, bytes, /, alignment=256): ...
    def self_posonly(self, /, bytes, alignment=256): ...
    def kw_after(self, bytes, alignment=256, **kw): ...
    def nothing(self): ...
    @staticmethod
    def static(bytes, alignment=256): ...
    @classmethod
    def klass(cls, bytes, alignment=256): ...

    @functools.wraps(canonical)
    def wrapped(self, *args): ...


def _free(bytes, alignment=256): ...
def _free_star(*args, **kwargs): ...
def _no_self(): ...


@pytest.mark.parametrize("params, wants_default", [(("bytes", "alignment"), True),
                                                   (("bytes", "alignment", "stream"), False)])
def test_plain_functions_are_read_as_inspect_reads_them(params, wants_default, monkeypatch):
    obj = _Shapes()
    candidates = [getattr(obj, n) for n in vars(_Shapes) if not n.startswith("__")]
    candidates += [_free, _free_star, _no_self, lambda bytes, alignment=256: 0,
                   functools.partial(_free), len]
    for fn in candidates:
        fast = concepts._plain_status(fn, params, wants_default)
        with monkeypatch.context() as m:     # the reference: inspect alone
            m.setattr(concepts, "_plain_status", lambda *a: None)
            slow = concepts._method_status(type("O", (), {"f": staticmethod(fn)})(), "f",
                                           params, wants_default)
        if fast is not None:
            assert fast == slow, (fn, fast, slow)
    assert concepts._plain_status(obj.wrapped, params, wants_default) is None
    assert concepts._plain_status(len, params, wants_default) is None

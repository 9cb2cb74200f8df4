"""Every python block of README.md and docs/*.md runs on the emulated platform, so the docs
cannot drift from the code.  New pages are picked up automatically.

A page's blocks run in order in one fresh interpreter and share one namespace, as a reader
types them.  A block that needs a real GPU is fenced as ```` ```python gpu ````: it is left out
here and runs in ``test_gpu_blocks`` (marked ``gpu``) on the GPU machine, where it fails
instead of skipping under HIPMR_REQUIRE_GPU=1.  Pseudo-code is fenced as ``text``, never
``python``."""
import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)

_RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for line, code in blocks:
    try:
        exec(compile(code, f"{sys.argv[2]}:{line}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"the block at {sys.argv[2]}:{line} failed", file=sys.stderr)
        sys.exit(1)
"""


def _pages():
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def _blocks(path, gpu):
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in _FENCE.finditer(text)
            if ("gpu" in m.group(1).split()) == gpu]


PAGES = [pytest.param(p, id=os.path.relpath(p, REPO)) for p in _pages()]


def _run(path, blocks, tmp_path, env):
    import json
    data = tmp_path / "blocks.json"
    data.write_text(json.dumps(blocks))
    env = dict(env)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _RUNNER, str(data),
                           os.path.relpath(path, REPO)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_have_python_blocks():
    assert sum(len(_blocks(p, False)) for p in _pages()) > 10


@pytest.mark.any_platform
@pytest.mark.parametrize("path", PAGES)
def test_blocks_run_on_the_emulated_platform(path, tmp_path):
    blocks = _blocks(path, gpu=False)
    if not blocks:
        return
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               HIPMR_EMULATED_MEMORY="2GiB")
    env.pop("HIPMR_LIBRARY", None)
    _run(path, blocks, tmp_path, env)


@pytest.mark.gpu
@pytest.mark.parametrize("path", PAGES)
def test_gpu_blocks(path, tmp_path, gpu_runtime):
    blocks = _blocks(path, gpu=False) + _blocks(path, gpu=True)
    blocks.sort()
    if not any(True for _ in _blocks(path, gpu=True)):
        return
    _run(path, blocks, tmp_path, os.environ)

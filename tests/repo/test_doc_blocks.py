"""Every python block of README.md and docs/*.md runs on the emulated platform, so the docs
cannot drift from the code.  New pages are picked up automatically.  This is the one runner of
doc blocks; a page's own test file checks only what its text promises.

Each block runs twice: alone, as a script of its own in a fresh interpreter (what a reader who
copies one block runs, so every block carries its imports and set-up), and with the page's
other blocks, in order, as one script (sharing one namespace, as a reader types them).  A block that needs a real GPU is fenced as ```` ```python gpu ````: it is left out
here and runs in ``test_gpu_blocks`` (marked ``gpu``) on the GPU machine, where it fails
instead of skipping under HIPMR_REQUIRE_GPU=1.  Pseudo-code is fenced as ``text``, never
``python``."""
import glob
import os
import re
import subprocess
import sys

import pytest
from support import REPO

_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)

def _pages():
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def _blocks(path, gpu):
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in _FENCE.finditer(text)
            if ("gpu" in m.group(1).split()) == gpu]


PAGES = [pytest.param(p, id=os.path.relpath(p, REPO)) for p in _pages()]


def _run(path, blocks, tmp_path, env):
    """The page's blocks, in order, as one script (what a reader who saved them would run;
    ``multiprocessing`` with "spawn" needs a real file); a failure names the block."""
    page = os.path.relpath(path, REPO)
    lines, starts = [], []
    for doc_line, code in blocks:
        starts.append((len(lines) + 2, doc_line))      # the block's first line in the script
        lines.append(f"# ---- {page}:{doc_line}")
        lines.extend(code.splitlines())
    script = tmp_path / "page.py"
    script.write_text("\n".join(lines) + "\n")
    env = dict(env)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        hits = [int(n) for n in re.findall(r'page\.py", line (\d+)', done.stderr)]
        where = [doc for first, doc in starts if hits and first <= hits[-1]]
        block = f"the block at {page}:{where[-1]}" if where else page
        pytest.fail(f"{block} failed:\n{done.stdout}{done.stderr}", pytrace=False)


def _emulated_env():
    env = dict(os.environ, HIPMR_PLATFORM="emulated", HIPMR_EMULATED_DEVICES="2",
               HIPMR_EMULATED_MEMORY="2GiB")
    env.pop("HIPMR_LIBRARY", None)
    return env


def test_the_docs_have_python_blocks():
    assert sum(len(_blocks(p, False)) for p in _pages()) > 10


@pytest.mark.any_platform
@pytest.mark.parametrize("path", PAGES)
def test_blocks_run_on_the_emulated_platform(path, tmp_path):
    blocks = _blocks(path, gpu=False)
    if not blocks:
        return
    _run(path, blocks, tmp_path, _emulated_env())


BLOCKS = [pytest.param(p, block, id=f"{os.path.relpath(p, REPO)}:{block[0]}")
          for p in _pages() for block in _blocks(p, False)]


@pytest.mark.any_platform
@pytest.mark.parametrize("path, block", BLOCKS)
def test_each_block_runs_alone(path, block, tmp_path):
    _run(path, [block], tmp_path, _emulated_env())


GPU_PAGES = [pytest.param(p, id=os.path.relpath(p, REPO)) for p in _pages() if _blocks(p, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_PAGES)  # empty (reported as skipped) while no page has one
def test_gpu_blocks(path, tmp_path, gpu_runtime):
    blocks = sorted(_blocks(path, gpu=False) + _blocks(path, gpu=True))
    _run(path, blocks, tmp_path, os.environ)


#: pages for the package's maintainers, which name its private parts on purpose
MAINTAINER_PAGES = {"internals.md", "hot-paths.md", "emulated.md"}
#: a private name of this package: a module or attribute whose name starts with "_"
_PRIVATE = re.compile(r"\b(?:hmr|hipmr_ctypes)(?:\.[A-Za-z]\w*)*\._[A-Za-z]\w*"
                      r"|\bfrom hipmr_ctypes(?:\.\w+)*\._\w+|\bfrom hipmr_ctypes(?:\.\w+)* import"
                      r"[^\n]*\b_[A-Za-z]\w*")


def test_user_docs_show_no_private_names():
    """What users copy uses the public interface only (blocks of the maintainers' pages may
    reach inside)."""
    found = []
    for page in _pages():
        if os.path.basename(page) in MAINTAINER_PAGES:
            continue
        for line, code in _blocks(page, False) + _blocks(page, True):
            found += [f"{os.path.relpath(page, REPO)}:{line}: {hit}"
                      for hit in _private_names(code)]
    assert not found, found


def _private_names(code):
    """The private names of this package that ``code`` reaches, also through a name it
    imported from the package (``from hipmr_ctypes.resources import per_device``)."""
    hits = _PRIVATE.findall(code)
    bound = [a or b for a, b in re.findall(
        r"\bfrom hipmr_ctypes[\w.]* import (?:\(([^)]*)\)|([^\n]*))", code)]
    bound += re.findall(r"\bimport hipmr_ctypes[\w.]* as (\w+)", code)
    for name in {n.split()[-1] for group in bound for n in group.split(",") if n.strip()}:
        hits += re.findall(r"\b%s\._[A-Za-z]\w*" % re.escape(name), code)
    return hits


def test_the_private_name_check_sees_them():
    code = ("from hipmr_ctypes.resources import per_device\nsaved = per_device._resources\n"
            "hmr.resources._common\nfrom hipmr_ctypes._hip import x\n"
            "from hipmr_ctypes.buffer import _State\n")
    assert len(_private_names(code)) == 4
    assert _private_names("import hipmr_ctypes as hmr\nhmr.Buffer(1)\npool._pools[0]\n") == []

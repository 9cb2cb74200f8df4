"""The docs say what is true now and the code's comments state rules, so that neither drifts
into a diary: no commit hash or date in ``docs/*.md`` (run history lives in
``benchmarks/results/``, which a page may name or link to), and no measured figure (GB/s, ns,
instruction counts, ...) in a comment or docstring under ``hipmr_ctypes/`` (a comment states
the rule and its reason; the figures behind it are in ``benchmarks/results/``)."""
from __future__ import annotations

import ast
import io
import re
import tokenize

import pytest

from support import REPO

#: a path into the results folder: the one place a page may name a dated run
RESULTS_PATH = re.compile(r"(?:\.\./)?benchmarks/results/[\w.{},*/-]*")
#: seven to forty hex digits with at least one digit and one letter: a commit hash
HASH = re.compile(r"(?<![\w.#/-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")
#: a number followed by a unit of speed, time or work
FIGURE = re.compile(r"\b\d[\d,.]*\s*(?:[GMKT]i?B/s|ns|µs|instructions?)(?![\w/])")


def _pages():
    return sorted((REPO / "docs").glob("*.md"))


def history_in(text: str) -> list:
    """The commit hashes and dates of ``text`` outside paths into benchmarks/results/."""
    text = RESULTS_PATH.sub("", text)
    return HASH.findall(text) + DATE.findall(text)


def test_the_check_sees_history():
    assert history_in("measured at 3bf4c85 (2026-12-02)") == ["3bf4c85", "2026-12-02"]
    assert history_in("[JSON](../benchmarks/results/copy-2026-12-02-h200x1-3bf4c85.json)") == []
    assert history_in("`hipMemcpy` 0x10000 1048576 deadbeef a.b7f0c1d2") == []


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_docs_have_no_commit_hashes_or_dates(page):
    found = history_in(page.read_text(encoding="utf-8"))
    assert not found, f"{page.name}: {found} (history goes to benchmarks/results/)"


def _comments_and_docstrings(path):
    src = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def test_the_check_sees_figures():
    assert FIGURE.findall("# 12.8 against 12.0 GB/s; 1,150 instructions; 54 ns") == \
        ["12.0 GB/s", "1,150 instructions", "54 ns"]
    assert not FIGURE.findall("# 16 MiB, 80%, 256 bytes, 2**30 - 1, nsamples")


def test_code_comments_state_rules_not_measurements():
    found = []
    for path in sorted((REPO / "hipmr_ctypes").rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        for line, text in _comments_and_docstrings(path):
            for figure in FIGURE.findall(text):
                found.append(f"{path.relative_to(REPO)}:{line}: {figure}")
    assert not found, "measured figures in comments (move them to benchmarks/results/):\n" + \
        "\n".join(found)


def test_the_maintainers_page_stays_short():
    """docs/internals.md is read whole by a new maintainer: at most 600 lines (what a test
    or the CI pins goes to tests/README.md or .ci/README.md; an emulator detail to
    docs/emulated.md)."""
    lines = (REPO / "docs" / "internals.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 600, f"docs/internals.md has {lines} lines; say it in fewer"

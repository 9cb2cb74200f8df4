"""Every ``python`` block of docs/resources.md runs, in order, in one namespace (emulated)."""
from __future__ import annotations

import re
from support import REPO

DOC = REPO / "docs" / "resources.md"


def blocks():
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)


def test_doc_has_examples():
    assert len(blocks()) >= 10


def test_doc_examples_run(emulator):
    namespace: dict = {"__name__": "docs_resources"}
    for i, code in enumerate(blocks()):
        exec(compile(code, f"{DOC.name}[block {i}]", "exec"), namespace)

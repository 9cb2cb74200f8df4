"""Every Python example in docs/adaptors.md runs (on the emulated platform here)."""
import contextlib
import io
import re

import pytest

from support import REPO

DOC = REPO / "docs" / "adaptors.md"
with open(DOC, encoding="utf-8") as _f:
    BLOCKS = re.findall(r"```python\n(.*?)```", _f.read(), flags=re.S)


def test_the_doc_has_examples():
    assert len(BLOCKS) >= 12


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index):
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(BLOCKS[index], f"docs/adaptors.md example {index}", "exec"), {})

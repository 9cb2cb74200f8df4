"""The test suite's own layout (tests/README.md, "Layout"): every test file sits in one of the
folders that mirror the package, its basename is unique (pytest's default import mode imports
each file as a top-level module), and the folders are the ones the page lists."""
import re

from support import REPO, TESTS


def _folders_on_the_page():
    text = (TESTS / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)/` \|", section, flags=re.M))


def test_every_test_file_is_in_a_folder_the_docs_list():
    files = sorted(TESTS.rglob("test_*.py"))
    assert files, TESTS
    assert not [f.name for f in files if f.parent == TESTS]   # none left at the top
    folders = {f.relative_to(TESTS).parts[0] for f in files}
    assert folders == _folders_on_the_page()
    assert all(len(f.relative_to(TESTS).parts) == 2 for f in files)   # one level deep


def test_test_files_are_named_by_subject_not_by_round():
    rounds = [f.name for f in TESTS.rglob("test_*.py") if re.search(r"round_?\d", f.name)]
    assert not rounds, rounds


def test_test_basenames_are_unique_and_no_folder_is_a_package():
    names = [f.name for f in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not list(TESTS.rglob("__init__.py"))

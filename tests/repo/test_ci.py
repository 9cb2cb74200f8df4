"""The README's set-up is what CI runs: the test command of README.md's "Tests" (and of its
"Install" set-up) installs exactly pyproject.toml's ``test`` extra and runs the suite as
``.ci/run`` runs it on the first Python; ``.ci/run``'s scheduling of its steps is checked
without running them."""
import os
import re
import shlex
import subprocess

from support import REPO


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as fh:
        return fh.read()


def _bash_lines(section):
    """The command lines of the bash blocks in README.md's ``## section`` (comments cut)."""
    text = _read("README.md")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^\s*```bash\n(.*?)^\s*```", body, re.S | re.M)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def _ci_array(name):
    match = re.search(rf"^{name}=\((.*)\)$", _read(".ci", "run"), re.M)
    assert match, f".ci/run has no {name}=(...) line"
    return shlex.split(match.group(1))


def _test_extra():
    text = _read("pyproject.toml")
    match = re.search(r"^test = \[(.*)\]$", text, re.M)
    assert match, "pyproject.toml's [project.optional-dependencies] has no test = [...]"
    return re.findall(r'"([^"]+)"', match.group(1))


def test_the_readme_test_command_installs_the_test_extra_and_is_what_ci_runs():
    (line,) = [x for x in _bash_lines("Tests") if "pip install" in x]
    install, run = line.split(" && ")
    words = shlex.split(install)
    assert words[:4] == ["python", "-m", "pip", "install"]
    assert words[4:] == _test_extra() == _ci_array("README_TEST_DEPS")
    assert shlex.split(run) == _ci_array("README_TEST_COMMAND")
    # the set-up's two commands: the main job and this same line
    assert _bash_lines("Install")[:2] == ["python -m hipmr_ctypes", line]
    # the CPython 3.14 step runs the same command
    assert f"set -- {shlex.join(shlex.split(run)[3:])}" in _read(".ci", "python314.sh")


def test_the_offline_wheel_recipe_is_the_one_test_packaging_runs():
    lines = _bash_lines("Install")
    assert "python -m pip install 'setuptools>=77'" in lines
    assert "python -m pip wheel --no-deps --no-build-isolation -w dist ." in lines
    assert "python -m pip install --no-index --no-deps hipmr_ctypes-*.whl" in lines


SCHEDULE = r"""
ok() { echo "out of $1"; sleep "$2"; }
bad() { echo "before the failure"; false; echo "NOT REACHED"; }
step "in the foreground" ok fg 0
alongside "one that fails" bad
alongside "a slow one" ok slow 2
CI_JOBS=1
alongside "a queued one" ok queued 0
drain
"""


def test_ci_run_prints_each_step_alongside_prefixed_and_fails_when_one_fails(tmp_path):
    """.ci/run's own functions (everything before its first step) on stand-in steps: a step
    run alongside is printed whole when it ends, each line prefixed with its name; a failing
    command inside a step fails it (set -e holds there), the others still run, the table of
    step times ends the run, which exits non-zero naming the failed step."""
    text = _read(".ci", "run")
    head = text[:text.index("\napt_packages() {")]
    head = head.replace('cd "$(dirname "$0")/.."', f"cd {shlex.quote(str(tmp_path))}")
    script = tmp_path / "schedule.sh"
    script.write_text(head + SCHEDULE)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON="/bin/true"))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "[one that fails] before the failure" in out and "NOT REACHED" not in out
    assert "[a slow one] out of slow" in out and "[a queued one] out of queued" in out
    assert "out of fg" in out and "[in the foreground]" not in out   # live, not prefixed
    table = out.split("=== step times")[1]
    for name in ("in the foreground", "one that fails", "a slow one", "a queued one"):
        assert name in table
    assert "total, wall clock" in table
    assert "one that fails (exit status 1)" in out.split("=== FAILED steps")[1]

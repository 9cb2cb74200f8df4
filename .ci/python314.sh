#!/usr/bin/env bash
# CI's CPython 3.14 step: the README's test command (python -m pytest -q -n auto tests, emulated
# platform) on Debian sid's own CPython 3.14 (the GIL build), run on this older machine with
# nothing installed into the system.  Usage:
#     .ci/python314.sh [PYTEST ARGUMENTS...]      # default: -q -n auto tests
# Environment: PY314_DIR (the download, unpack and venv folder; default a new temporary one,
# removed at the end: nothing is cached across runs), PY314_MIRROR (the Debian archive, default
# the one this machine's apt sources name).  Needs network for Debian's archive and PyPI.
#
# How (the pieces are .ci/debian_root.sh's, shared with the ROCm release matrix): sid's
# python3.14 and python3.14-venv packages and apt's dependency closure (libpython3.14-stdlib and
# -minimal, libc6, libffi, libssl, zlib, libexpat, libsqlite3, liblzma, libbz2, libmpdec, ...)
# are downloaded with `apt-get download` through a private sources list, pins, package lists and
# cache, and unpacked with `dpkg -x` into a root.  sid's C library is newer than this machine's,
# so the interpreter runs through the root's own dynamic loader: a wrapper script
# (<root>/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path <root's libs> --argv0
# <venv>/bin/python <root>/usr/bin/python3.14) is the `python` of a hand-made venv (pyvenv.cfg
# with home = <root>/usr/bin), so sys.executable is the wrapper and every subprocess a test
# starts runs the same way.  pip comes from the root's own wheel (python3-pip-whl, which
# Debian splits out of ensurepip; its ensurepip looks for it at the system's
# /usr/share/python-wheels), then the README's test requirements (pytest, pytest-xdist) and
# numpy (cp314 wheels) from PyPI.  A download that
# fails stops the step with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/debian_mirror.sh
source .ci/debian_root.sh

die() { echo "python314: ERROR: $*" >&2; exit 1; }

if [[ -n "${PY314_DIR:-}" ]]; then
  DIR="$PY314_DIR"
else
  DIR="$(mktemp -d)"
  trap 'rm -rf "$DIR"' EXIT
fi
MIRROR="$(debian_mirror PY314_MIRROR)" || exit 1
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
command -v apt-get >/dev/null && command -v dpkg >/dev/null \
  || die "apt-get and dpkg are needed to fetch Debian's python3.14"

# ---- sid's python3.14 and its closure, unpacked into ROOT ------------------------------------
ROOT="$DIR/root"
debroot_init "$DIR" || die "cannot make $DIR/apt"
echo "deb [signed-by=$KEYRING] $MIRROR sid main" > "$DIR/apt/sid.list"
printf 'Package: *\nPin: release n=sid\nPin-Priority: 990\n' > "$DIR/apt/sid.pref"
debroot_update "$DIR" sid || die "no Debian sid package lists from $MIRROR: cannot test CPython 3.14"
debroot_unpack "$DIR" sid "$ROOT" python3.14 python3.14-venv \
  || die "could not fetch and unpack sid's python3.14 from $MIRROR"
REAL="$ROOT/usr/bin/python3.14"
[[ -x "$REAL" ]] || die "sid's python3.14 package has no $REAL"
echo "sid's python3.14: $(grep -c . "$ROOT/.packages") packages" \
     "($(du -sh "$DIR/debs/root" | cut -f1) of .deb files) unpacked in $ROOT"

# ---- a venv whose python is the wrapper --------------------------------------------------------
LIBS="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu"
VERSION="$("$ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$LIBS" "$REAL" \
           -S -c 'import sys; print(sys.version.split()[0])')" \
  || die "sid's python3.14 does not start through its root's loader"
VENV="$DIR/venv"
mkdir -p "$VENV/bin" "$VENV/lib/python3.14/site-packages"
ln -sfn lib "$VENV/lib64"
printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\nexecutable = %s\n' \
  "$ROOT/usr/bin" "$VERSION" "$REAL" > "$VENV/pyvenv.cfg"
debroot_wrapper "$VENV/bin/python" "$ROOT" "$VENV/bin/python" "$REAL" "$LIBS" \
  || die "cannot write the wrapper"
ln -sfn python "$VENV/bin/python3"
ln -sfn python "$VENV/bin/python3.14"
PY="$VENV/bin/python"
"$PY" - "$VENV" <<'EOF' || die "the venv's interpreter is not sid's CPython 3.14 running in that venv"
import os, sys, sysconfig
venv = sys.argv[1]
assert sys.version_info[:2] == (3, 14), sys.version
assert not sysconfig.get_config_var("Py_GIL_DISABLED"), "a free-threaded build"
assert sys.executable == os.path.join(venv, "bin", "python"), sys.executable
assert sys.prefix == venv and sys.base_prefix != venv, (sys.prefix, sys.base_prefix)
import ctypes, ssl, sqlite3, lzma, bz2, zlib, pyexpat, _decimal, venv as _  # the C modules
print("python", sys.version.split()[0], "on", os.confstr("CS_GNU_LIBC_VERSION"), "as",
      sys.executable, "(prefix", sys.base_prefix + ")")
EOF

# ---- pip from the root's wheel, then the test dependencies from PyPI --------------------------
PIP_WHEEL="$(ls "$ROOT"/usr/share/python-wheels/pip-*.whl 2>/dev/null | head -n 1)"
[[ -n "$PIP_WHEEL" ]] || die "python3-pip-whl brought no pip wheel into $ROOT/usr/share/python-wheels"
"$PY" "$PIP_WHEEL/pip" install -q --disable-pip-version-check --no-index "$PIP_WHEEL" \
  || die "pip could not install itself from $PIP_WHEEL"
"$PY" -m pip install -q --disable-pip-version-check "pytest>=7" pytest-xdist numpy \
  || die "could not install pytest, pytest-xdist and numpy for $VERSION from PyPI"
"$PY" -m pip --version

# ---- the README's test command -----------------------------------------------------------------
# this step installs the README's test requirements and numpy only: the tools, the real library, PyTorch and the
# browser that the main steps require are not this step's subject
unset HIPMR_REQUIRE_TOOLS HIPMR_REQUIRE_AMD_LIBRARY HIPMR_REQUIRE_TORCH HIPMR_REQUIRE_BROWSER
export HIPMR_PLATFORM=emulated
"$PY" -m hipmr_ctypes info
[[ $# -gt 0 ]] || set -- -q -n auto tests   # the README's: python -m pytest -q -n auto tests
PATH="$VENV/bin:$PATH" "$PY" -m pytest "$@"

#!/usr/bin/env bash
# Builds a free-threaded CPython (configure --disable-gil) at a fixed prefix, for CI's
# "without the GIL" step.  Usage:
#     .ci/build_freethreaded.sh [VERSION [PREFIX]]     # VERSION: 3.13 (default) or 3.14
# Prints the interpreter's path as the last line of its output.  If PREFIX already holds a
# working free-threaded interpreter of that version, it is reused and nothing is built, so a
# CI run that calls this twice (or a cached PREFIX) builds once.
#
# The source is Debian's own: upstream's tarball of the pythonX.Y source package, found with
# `apt-get source --print-uris` through a private sources list (trixie for 3.13, sid for
# 3.14), so the machine's apt configuration is left as it was, and checked against the SHA256
# of the verified Sources index.  Debian's patches are not applied.  Build dependencies: build-essential libffi-dev
# zlib1g-dev libssl-dev libbz2-dev libsqlite3-dev liblzma-dev libreadline-dev uuid-dev
# (installed here when apt-get is available and they are missing).
set -euo pipefail
VERSION="${1:-3.13}"
PREFIX="${2:-/opt/py${VERSION/./}t}"
PY="$PREFIX/bin/python${VERSION}t"

works() {
    [ -x "$PY" ] && "$PY" -X gil=0 -c '
import sys, sysconfig
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1
assert not sys._is_gil_enabled()
assert "%d.%d" % sys.version_info[:2] == sys.argv[1]
import ctypes, ssl, zlib, lzma, bz2, sqlite3, threading, venv' "$VERSION" 2>/dev/null
}

if works; then
    echo "reusing $PY" >&2
    echo "$PY"
    exit 0
fi

case "$VERSION" in
    3.13) SUITE=trixie ;;
    3.14) SUITE=sid ;;
    *) echo "unsupported version $VERSION" >&2; exit 2 ;;
esac

DEPS="build-essential libffi-dev zlib1g-dev libssl-dev libbz2-dev libsqlite3-dev liblzma-dev libreadline-dev uuid-dev"
if command -v apt-get >/dev/null; then
    missing=""
    for p in $DEPS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    if [ -n "$missing" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
fi

WORK="${FREETHREADED_WORK:-$(mktemp -d)}"
mkdir -p "$WORK/lists/partial" "$WORK/src"
source "$(dirname "$0")/debian_mirror.sh"
MIRROR="$(debian_mirror FREETHREADED_MIRROR)" || exit 1
echo "deb-src $MIRROR $SUITE main" > "$WORK/sources.list"
APT_OPTS=(-o "Dir::Etc::sourcelist=$WORK/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$WORK/lists" -o "APT::Get::List-Cleanup=0")
apt-get "${APT_OPTS[@]}" update -qq
# only upstream's tarball is needed: its address and SHA256 come from the Sources index apt
# has just verified against the suite's signed Release file
read -r URI NAME SUM < <(apt-get "${APT_OPTS[@]}" source --print-uris -qq "python$VERSION" \
                         | tr -d "'" | awk '$2 ~ /\.orig\.tar\./ {print $1, $2, $4; exit}')
[ -n "${URI:-}" ] || { echo "no python$VERSION source in $SUITE" >&2; exit 1; }
TARBALL="$WORK/src/$NAME"
if command -v curl >/dev/null; then
    curl -fsSL -o "$TARBALL" "$URI"
else
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
        "$URI" "$TARBALL"
fi
echo "${SUM#SHA256:}  $TARBALL" | sha256sum -c --quiet - >&2
rm -rf "$WORK/build" && mkdir -p "$WORK/build"
tar -xf "$TARBALL" -C "$WORK/build" --strip-components=1
cd "$WORK/build"
./configure --disable-gil --prefix="$PREFIX" >configure.log 2>&1 \
    || { tail -n 50 configure.log >&2; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { tail -n 80 make.log >&2; exit 1; }
make install >install.log 2>&1 || { tail -n 50 install.log >&2; exit 1; }
if ! works; then
    echo "the built interpreter at $PY does not work" >&2
    "$PY" -X gil=0 -c 'import sys; print(sys.version, sys._is_gil_enabled())' >&2 || true
    exit 1
fi
echo "$PY"

#!/usr/bin/env bash
# The ROCm release matrix: the real libamdhip64 of four ROCm releases, as Debian ships them,
# loaded and tested on a machine with no GPU, nothing installed into the system.
#
#   .ci/rocm_matrix.sh fetch              download and unpack every release (once per run)
#   .ci/rocm_matrix.sh test RELEASE...    test the named releases (default: all of them)
#   .ci/rocm_matrix.sh python RELEASE     print the wrapper that runs Python on RELEASE's root
#
# Environment: PYTHON (the interpreter to test, default python3; a venv's python works),
# ROCM_MATRIX_DIR (the one download and unpack folder of a run, shared by its steps; default
# ${TMPDIR:-/tmp}/hipmr-rocm-matrix), ROCM_MATRIX_MIRROR (the Debian archive, default the
# one this machine's apt sources name).
#
# How: `apt-get download` fetches the .deb files through a private sources list, package lists
# and cache (the -o Dir::... options below; the system's apt state is never touched), the
# dependency closure being apt's own (`apt-cache depends --recurse`) under a pin file that
# takes the ROCm packages from the release's suite and libc6/libstdc++6/libgcc-s1 from sid
# (the newer runtimes need glibc 2.38+; sid's C library also runs the older ones).  `dpkg -x`
# unpacks each release into its own root.  Python then runs through that root's own dynamic
# loader: <root>/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path <root's library
# folders>:<python's LIBDIR> python ...  A small wrapper does this and is the `python` of a
# venv-shaped folder (pyvenv.cfg, lib -> the tested venv's lib), so that sys.executable is the
# wrapper and the subprocesses the tests start load the same release.  These pieces are
# .ci/debian_root.sh's, shared with .ci/python314.sh.
#
# A failure to fetch (no network, a package gone from the archive) is an error that says so;
# nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR="${ROCM_MATRIX_DIR:-${TMPDIR:-/tmp}/hipmr-rocm-matrix}"
PYTHON="${PYTHON:-python3}"
source .ci/debian_mirror.sh
source .ci/debian_root.sh
MIRROR="$(debian_mirror ROCM_MATRIX_MIRROR)" || exit 1
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# release | Debian suite | the packages asked for (their dependencies follow) | HIP version of
# the library file (libamdhip64.so.<this>) | ROCm release words | GLIBC_TUNABLES its Python needs
# (5.2.3's library asks for an executable stack, which glibc 2.41 and later refuse to dlopen
# unless glibc.rtld.execstack=2 allows it: "cannot enable executable stack as shared object
# requires: Invalid argument")
RELEASES=(
  "5.2.3|bookworm|libamdhip64-5 libamdhip64-dev|5.2.21153|ROCm 5.2|glibc.rtld.execstack=2"
  "5.7.1|trixie|libamdhip64-5 libamdhip64-dev|5.7.31921|ROCm 5.7|"
  "6.4.3|sid|libamdhip64-6 libamdhip64-dev|6.4.43484|ROCm 6.4|"
  "7.2.4|experimental|libamdhip64-7 libamdhip64-dev|7.2.53211|ROCm 7.2|"
)
ALL_RELEASES=(5.2.3 5.7.1 6.4.3 7.2.4)

die() { echo "rocm_matrix: ERROR: $*" >&2; exit 1; }

row() {  # row RELEASE -> sets SUITE PACKAGES FILEVER WORDS TUNABLES
  local r
  for r in "${RELEASES[@]}"; do
    IFS='|' read -r rel SUITE PACKAGES FILEVER WORDS TUNABLES <<<"$r"
    [[ "$rel" == "$1" ]] && return 0
  done
  die "unknown release '$1' (known: ${ALL_RELEASES[*]})"
}

write_apt_config() {
  debroot_init "$DIR" || die "cannot make $DIR/apt"
  local suite
  for suite in bookworm trixie sid experimental; do
    {
      echo "deb [signed-by=$KEYRING] $MIRROR $suite main"
      [[ "$suite" == sid ]] || echo "deb [signed-by=$KEYRING] $MIRROR sid main"
    } > "$DIR/apt/$suite.list"
    # the release's own suite first (experimental's codename is rc-buggy); the C and C++
    # runtime always from sid
    local codename="$suite"
    [[ "$suite" == experimental ]] && codename=rc-buggy
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 990\n\n' "$codename" > "$DIR/apt/$suite.pref"
    printf 'Package: libc6 libc-gconv-modules-extra libstdc++6 libgcc-s1 gcc-16-base\nPin: release n=sid\nPin-Priority: 995\n' \
      >> "$DIR/apt/$suite.pref"
  done
}

fetch() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null \
    || die "apt-get and dpkg are needed to fetch the ROCm releases"
  write_apt_config
  # one package-list download for every suite (the lists folder is shared)
  printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "$MIRROR" bookworm "$KEYRING" "$MIRROR" trixie \
    "$KEYRING" "$MIRROR" sid "$KEYRING" "$MIRROR" experimental > "$DIR/apt/all.list"
  cp "$DIR/apt/sid.pref" "$DIR/apt/all.pref"
  debroot_update "$DIR" all \
    || die "the ROCm release matrix cannot run without Debian's package lists ($MIRROR)"
  local rel
  for rel in "${ALL_RELEASES[@]}"; do
    row "$rel"
    local root="$DIR/roots/$rel"
    if [[ -f "$root/.complete" ]]; then
      echo "ROCm $rel: already unpacked in $root"
      continue
    fi
    debroot_unpack "$DIR" "$SUITE" "$root" $PACKAGES \
      || die "could not fetch and unpack ROCm $rel's packages from Debian $SUITE ($MIRROR)"
    local lib
    lib=$(ls "$root"/usr/lib/x86_64-linux-gnu/libamdhip64.so.*.*.* 2>/dev/null | head -n1)
    [[ "$lib" == *".so.$FILEVER" ]] \
      || die "ROCm $rel: expected libamdhip64.so.$FILEVER in Debian $SUITE, found '${lib:-nothing}'"
    touch "$root/.complete"
    echo "ROCm $rel: $(wc -l < "$root/.packages") packages from Debian $SUITE" \
         "($(du -sh "$DIR/debs/$rel" | cut -f1) of .deb files) unpacked in $root"
  done
}

wrapper() {  # wrapper RELEASE -> the path of a python that runs on RELEASE's root
  local rel="$1" root="$DIR/roots/$1"
  row "$rel"
  [[ -f "$root/.complete" ]] || die "ROCm $rel is not fetched yet (run: $0 fetch)"
  local real prefix libdir
  real=$("$PYTHON" -c 'import sys; print(sys.executable)')
  prefix=$("$PYTHON" -c 'import sys; print(sys.prefix)')
  libdir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
  local wdir
  wdir="$DIR/python/$rel-$(echo "$real" | md5sum | cut -c1-8)"
  mkdir -p "$wdir/bin"
  if [[ -f "$prefix/pyvenv.cfg" ]]; then  # the tested venv's packages, through this folder
    cp "$prefix/pyvenv.cfg" "$wdir/pyvenv.cfg"
    ln -sfn "$prefix/lib" "$wdir/lib"
  else  # a plain interpreter: a venv of it with its own site-packages visible
    printf 'home = %s\ninclude-system-site-packages = true\n' "$(dirname "$real")" \
      > "$wdir/pyvenv.cfg"
  fi
  local libs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu${libdir:+:$libdir}"
  debroot_wrapper "$wdir/bin/python" "$root" "$wdir/bin/python" "$(readlink -f "$real")" \
    "$libs" "$TUNABLES" || die "cannot write $wdir/bin/python"
  ln -sfn python "$wdir/bin/python3"
  echo "$wdir/bin/python"
}

test_release() {
  local rel="$1"
  row "$rel"
  local root="$DIR/roots/$rel" py
  py=$(wrapper "$rel")
  local lib
  lib=$(ls "$root"/usr/lib/x86_64-linux-gnu/libamdhip64.so.*.*.* | head -n1)
  echo "=== ROCm $rel (Debian $SUITE, $lib) ==="
  "$py" -c 'import os, sys; print("python", sys.version.split()[0], "on",
             os.confstr("CS_GNU_LIBC_VERSION"), "as", sys.executable)'
  export HIPMR_REQUIRE_AMD_LIBRARY=1 HIPMR_LIBRARY="$lib" HIPMR_HIP_INCLUDE="$root/usr/include"
  export HIPMR_EXPECT_ROCM_RELEASE="$rel" HIPMR_EXPECT_HIP_FILE_VERSION="$FILEVER"
  export HIPMR_EXPECT_ROCM_WORDS="$WORDS"
  local wbin
  wbin="$(dirname "$py")"
  # the command line on this release (the amd platform; no GPU here: it says so and exits 0)
  PATH="$wbin:$PATH" HIPMR_PLATFORM=amd "$py" -m hipmr_ctypes info
  PATH="$wbin:$PATH" HIPMR_PLATFORM=amd "$py" -m hipmr_ctypes info --json > "$DIR/info-$rel.json"
  "$py" - "$DIR/info-$rel.json" "$FILEVER" "$WORDS" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
assert report["loaded"] and report["library_file_version"] == sys.argv[2], report
assert report.get("rocm_release") == sys.argv[3], report
print(f"info --json: library {report['library_file_version']}, {report['rocm_release']}, "
      f"runtime {report['runtime_version']}")
EOF
  PATH="$wbin:$PATH" HIPMR_PLATFORM=amd "$py" -m hipmr_ctypes check
  PATH="$wbin:$PATH" HIPMR_PLATFORM=amd "$py" -m hipmr_ctypes check --json > /dev/null
  # the real-library tests, the ABI probe against this release's headers and the checks that
  # each version-dependent branch taken is the one of the library loaded
  PATH="$wbin:$PATH" "$py" -m pytest -q -p no:cacheprovider -m amd_library tests
}

case "${1:-}" in
  fetch) fetch ;;
  test)
    shift
    [[ $# -gt 0 ]] || set -- "${ALL_RELEASES[@]}"
    for rel in "$@"; do test_release "$rel"; done ;;
  python) wrapper "${2:?release}" ;;
  *) echo "usage: $0 fetch | test [RELEASE...] | python RELEASE" >&2; exit 2 ;;
esac

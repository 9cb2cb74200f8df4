# Sourced by the CI scripts that run code on Debian packages of another suite (the ROCm release
# matrix, CPython 3.14 from sid) on this machine, nothing installed into the system:
#
#   debroot_init DIR                  a private apt state under DIR/apt (empty dpkg status,
#                                     its own package lists and cache); the caller then writes
#                                     DIR/apt/NAME.list (sources) and DIR/apt/NAME.pref (pins)
#   debroot_apt_opts DIR NAME         the apt-get / apt-cache options of that configuration
#   debroot_update DIR NAME           downloads NAME.list's package lists (into the one lists
#                                     folder of DIR, shared by every NAME)
#   debroot_unpack DIR NAME ROOT PACKAGE...
#                                     the packages and their dependency closure (apt's own:
#                                     `apt-cache depends --recurse`, under NAME's pins) are
#                                     downloaded into DIR/debs/<ROOT's name> and unpacked with
#                                     `dpkg -x` into ROOT; ROOT/.packages lists the .deb files
#   debroot_wrapper FILE ROOT ARGV0 PROGRAM LIBDIRS [GLIBC_TUNABLES]
#                                     writes FILE, a shell script that runs PROGRAM through
#                                     ROOT's own dynamic loader with LIBDIRS (colon-separated)
#                                     as its library path and ARGV0 as its argv[0]
#
# Each prints what went wrong and returns 1 on a failure (the caller exits): a registry that
# answers no is an error that says so, never a silent skip.  The archive is the one
# .ci/debian_mirror.sh picks.

debroot_init() {
    local dir="$1"
    mkdir -p "$dir/apt/empty" "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" \
        "$dir/debs" || return 1
    : > "$dir/apt/status"
}

debroot_apt_opts() {
    local dir="$1" name="$2"
    echo "-o Dir::Etc::sourcelist=$dir/apt/$name.list -o Dir::Etc::sourceparts=$dir/apt/empty" \
         "-o Dir::Etc::preferences=$dir/apt/$name.pref -o Dir::Etc::preferencesparts=$dir/apt/empty" \
         "-o Dir::State::Lists=$dir/apt/lists -o Dir::State::status=$dir/apt/status" \
         "-o Dir::Cache=$dir/apt/cache -o APT::Sandbox::User=root -o Debug::NoLocking=1" \
         "-o APT::Get::List-Cleanup=0 -o Acquire::Retries=3"
}

debroot_update() {
    local dir="$1" name="$2"
    [[ -f "$dir/apt/$name.pref" ]] || : > "$dir/apt/$name.pref"
    # shellcheck disable=SC2046
    if ! apt-get update -qq $(debroot_apt_opts "$dir" "$name") >"$dir/apt/update-$name.log" 2>&1 \
        || grep -qE '^(W|E): (Failed|Some index files failed)' "$dir/apt/update-$name.log"; then
        cat "$dir/apt/update-$name.log" >&2
        echo "ERROR: could not download Debian's package lists ($(grep -o 'http[^ ]*' \
            "$dir/apt/$name.list" | sort -u | tr '\n' ' ')): see above" >&2
        return 1
    fi
}

debroot_unpack() {
    local dir="$1" name="$2" root="$3"
    shift 3
    local debs="$dir/debs/$(basename "$root")" closure
    # shellcheck disable=SC2046
    closure=$(apt-cache $(debroot_apt_opts "$dir" "$name") depends --recurse --no-recommends \
                --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$@" \
                2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u) \
        || { echo "ERROR: apt could not resolve $* ($name.list)" >&2; return 1; }
    [[ -n "$closure" ]] || { echo "ERROR: apt knows no $* ($name.list)" >&2; return 1; }
    rm -rf "$debs" && mkdir -p "$debs" || return 1
    # shellcheck disable=SC2046,SC2086
    if ! (cd "$debs" && apt-get download -qq $(debroot_apt_opts "$dir" "$name") $closure \
            >"$debs.log" 2>&1); then
        cat "$debs.log" >&2
        echo "ERROR: could not download these packages ($name.list):" $closure >&2
        return 1
    fi
    rm -rf "$root" && mkdir -p "$root" || return 1
    local deb
    for deb in "$debs"/*.deb; do
        dpkg -x "$deb" "$root" || { echo "ERROR: dpkg -x $deb failed" >&2; return 1; }
    done
    (cd "$debs" && ls ./*.deb | sed 's#^\./##') > "$root/.packages"
    [[ -e "$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ]] \
        || { echo "ERROR: $root has no dynamic loader (is libc6 in the closure?)" >&2; return 1; }
}

debroot_wrapper() {
    local file="$1" root="$2" argv0="$3" program="$4" libs="$5" tunables="${6:-}"
    mkdir -p "$(dirname "$file")" || return 1
    cat > "$file" <<EOF || return 1
#!/bin/sh
# $program on the root $root: its own dynamic loader and libraries.
${tunables:+GLIBC_TUNABLES=$tunables; export GLIBC_TUNABLES}
exec "$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$libs" \\
  --argv0 "$argv0" "$program" "\$@"
EOF
    chmod +x "$file"
}

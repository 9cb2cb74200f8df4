# Sourced by the CI scripts that fetch Debian packages of other suites: the Debian archive to
# use is the one this machine's apt sources name (as configured there), unless the variable
# whose name is given says otherwise.
#   MIRROR="$(debian_mirror ROCM_MATRIX_MIRROR)" || exit 1
debian_mirror() {
    local override="${!1:-}" found
    if [ -n "$override" ]; then
        echo "$override"
        return 0
    fi
    found="$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | grep -v -- '-security' \
        | grep -m 1 '/debian/\?$' | sed 's#/$##')" || true
    if [ -z "$found" ]; then
        echo "ERROR: no Debian archive in this machine's apt sources (run apt-get update first, or set $1)" >&2
        return 1
    fi
    echo "$found"
}

#!/usr/bin/env bash
# CI's free-threaded step: builds (or reuses) a free-threaded CPython with
# .ci/build_freethreaded.sh, then runs the thread-related tests and a longer stress run of
# tests/reliability/test_threads_stress.py on it with the GIL off (-X gil=0 and PYTHON_GIL=0),
# checked by .ci/nogil_check.py before the run, after every test and at the end: the step fails
# if the GIL is ever on.  FREETHREADED_VERSION=3.14 for 3.14t; HIPMR_STRESS multiplies the stress
# run's operations (default 5).  Needs network for the source tarball and PyPI (pytest; numpy when a
# wheel for the build exists, else the tests that need it skip).
# `.ci/freethreaded.sh build` only builds (or finds) the interpreter: CI builds it alongside the
# other steps and runs the tests alone at the end, since the 16-thread stress run with the GIL
# off needs the cores (alongside three suites on 2 cores it ran past its deadlock bound).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(.ci/build_freethreaded.sh "${FREETHREADED_VERSION:-3.13}" | tail -n 1)"
if [[ "${1:-}" == build ]]; then
  echo "free-threaded interpreter ready: $PY"
  exit 0
fi
VENV="$(mktemp -d)/venv"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "pytest>=7"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: numpy \
    || echo "no numpy wheel for $("$PY" -c 'import sys; print(sys.version)'): its tests skip"
# this step installs pytest (and numpy where a wheel exists) only: the tools, the real
# library, PyTorch and the browser that the main steps require are not this step's subject
unset HIPMR_REQUIRE_TOOLS HIPMR_REQUIRE_AMD_LIBRARY HIPMR_REQUIRE_TORCH HIPMR_REQUIRE_BROWSER
export PYTHON_GIL=0 HIPMR_PLATFORM=emulated HIPMR_REQUIRE_NO_GIL=1 PYTHONPATH=.ci
run() { "$VENV/bin/python" -X gil=0 -m pytest -q -p nogil_check "$@"; }
run tests/reliability/test_threads_stress.py tests/reliability/test_threads.py \
    tests/adaptors/test_pool_threads.py tests/reliability/test_locks.py \
    tests/reliability/test_gc_locks.py tests/device/test_thread_exit.py \
    tests/reliability/test_exit.py tests/reliability/test_shutdown.py tests/buffer/test_buffer.py \
    tests/reliability/test_misbehaving_upstreams.py tests/adaptors/test_adaptors_logging.py \
    tests/reliability/test_logging_failures.py tests/resources/test_per_device.py \
    tests/interop/test_interop.py tests/device/test_stream_lifetime.py tests/adaptors/test_pool.py \
    tests/adaptors/test_adaptors_fixed_size.py tests/reliability/test_exit_threads_and_messages.py
HIPMR_STRESS="${HIPMR_STRESS:-5}" run tests/reliability/test_threads_stress.py

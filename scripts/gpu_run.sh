#!/usr/bin/env bash
# Everything a machine with an NVIDIA GPU should run, in one call, from the repository root:
#
#   bash scripts/gpu_run.sh                      # info, check, the gpu tests, the fragmentation
#                                                # picture, the several-GPU step, the benchmarks,
#                                                # the reliability report
#   OUT=results bash scripts/gpu_run.sh          # where logs and JSON go (default ./gpu-out)
#
# Steps alone or added (each *_ONLY=1 runs that step and stops):
#   RELIABILITY_ONLY=1            the reliability report (RELIABILITY_BUDGET s, FUZZ_OPS ops)
#   PEERS=1 [PEERS_ONLY=1]        numba-cuda's and CuPy's memory tests, theirs then ours
#   INTEROP=1 [INTEROP_ONLY=1]    the CuPy allocator and Numba plugin beside CuPy's pool
#   FULL=1                        also the whole suite on nvidia and the amd_library tests
#   SCALE=0 / SCALE_ONLY=1        skip / run only the several-GPU step (multi_gpu tests, the
#                                 IPC, MPI and peer-copy demos)
#   RELIABILITY=0                 skip the report at the end
#   PAIRS, *_TIMEOUT              loop sizes and time limits of single steps
#
# Peers installed as wheels in ./.whl (RMM, for example) are installed into /tmp/site first.
# Every step runs with HIPMR_PLATFORM=nvidia; the GPU tests with HIPMR_REQUIRE_GPU=1.  The
# files it writes are what docs/performance.md and benchmarks/results/ are made from.
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== info (nvidia)"; HIPMR_PLATFORM=nvidia python3 -m hipmr_ctypes
echo "== check (nvidia)"; HIPMR_PLATFORM=nvidia python3 -m hipmr_ctypes check
reliability() {  # the report ends within its budget (sections still running then are named)
  echo "== reliability report (nvidia), budget ${RELIABILITY_BUDGET:-200} s"
  HIPMR_PLATFORM=nvidia timeout $(( ${RELIABILITY_BUDGET:-200} + 60 )) python3 \
    scripts/reliability_report.py --budget "${RELIABILITY_BUDGET:-200}" \
    --fuzz-ops "${FUZZ_OPS:-200000}" --json "$OUT/reliability.json" | tee "$OUT/reliability.txt"
}
if [ "${RELIABILITY_ONLY:-0}" = 1 ]; then reliability; exit 0; fi  # only this step
if [ "${PEERS:-0}" = 1 ]; then  # PEERS=1 PEERS_ONLY=1 bash scripts/gpu_run.sh: only this step
  echo "== numba-cuda's and CuPy's memory tests with their own memory management, then ours"
  HIPMR_PLATFORM=nvidia timeout ${PEERS_TIMEOUT:-560} python3 scripts/peer_suites.py --out "$OUT" \
    --timeout ${PEER_RUN_TIMEOUT:-130} > "$OUT/peers.txt" 2>&1
  echo "peers rc=$?"; tail -40 "$OUT/peers.txt"
  if [ "${PEERS_ONLY:-0}" = 1 ]; then exit 0; fi
fi
if [ "${INTEROP:-0}" = 1 ]; then  # INTEROP=1 INTEROP_ONLY=1 bash scripts/gpu_run.sh: only this step
  echo "== CuPy allocator and Numba plugin of ours beside CuPy's pool (interop.txt, interop.json)"
  HIPMR_PLATFORM=nvidia timeout ${INTEROP_TIMEOUT:-300} python3 scripts/bench_alloc.py \
    --pairs ${PAIRS:-20000} --repeats 7 --frag-seeds "" \
    --rows "CuPy,Numba,PoolResource direct,Buffer over the current" \
    --json "$OUT/interop.json" > "$OUT/interop.txt" 2>&1
  echo "interop rc=$?"; grep -E "CuPy|Numba|PoolResource direct|floor" "$OUT/interop.txt" | head -30
  if [ "${INTEROP_ONLY:-0}" = 1 ]; then exit 0; fi
fi
echo "== GPU tests"
HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1 timeout ${GPU_TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests > "$OUT/gpu-tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -25 "$OUT/gpu-tests.txt"
echo "== memory timeline of the fragmentation workload (nvidia)"
HIPMR_PLATFORM=nvidia timeout 300 python3 scripts/plot_fragmentation.py --svg "$OUT/fragmentation-timeline.svg"
if [ "${FULL:-0}" = 1 ]; then
echo "== whole suite on nvidia (emulated-only tests skip)"
HIPMR_PLATFORM=nvidia timeout ${FULL_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider tests > "$OUT/all-nvidia.txt" 2>&1
echo "all-on-nvidia rc=$?"; tail -8 "$OUT/all-nvidia.txt"
lib=$(ls /opt/rocm*/lib/libamdhip64.so* /usr/lib/x86_64-linux-gnu/libamdhip64.so* 2>/dev/null | head -1)
echo "== amd library tests against ${lib:-none}"
if [ -n "$lib" ]; then
  HIPMR_LIBRARY=$lib HIPMR_REQUIRE_AMD_LIBRARY=1 timeout 120 python3 -m pytest -q -p no:cacheprovider -m amd_library tests/binding/test_binding.py > "$OUT/amd-lib.txt" 2>&1
  echo "amd rc=$?"; tail -4 "$OUT/amd-lib.txt"
fi
fi
if [ "${SCALE:-1}" = 1 ]; then
echo "== several GPUs and processes (log: scale.txt, numbers: scale.json)"
{
  echo "== multi_gpu tests"
  HIPMR_PLATFORM=nvidia HIPMR_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q -m multi_gpu \
    -p no:cacheprovider tests 2>&1 | tail -20; echo "multi_gpu tests rc=${PIPESTATUS[0]}"
  echo "== ipc demo: producer on device 0, consumers on both GPUs"
  HIPMR_PLATFORM=nvidia timeout 300 python3 scripts/ipc_demo.py --consumers 4 --size 64MiB \
    --json /tmp/scale-ipc.json; echo "ipc demo rc=$?"
  echo "== mpi demo: two ranks, one per GPU"
  HIPMR_PLATFORM=nvidia timeout 300 mpirun --allow-run-as-root -x HIPMR_PLATFORM -np 2 \
    python3 scripts/mpi_demo.py --json /tmp/scale-mpi.json; echo "mpi demo rc=$?"
  echo "== peer copy bandwidth: ours, CuPy, PyTorch on the same buffers"
  HIPMR_PLATFORM=nvidia timeout 300 python3 scripts/bench_peer.py --size 256MiB \
    --json /tmp/scale-peer.json; echo "bench_peer rc=$?"
  echo "== numba-cuda's own IPC tests (cudapy/test_ipc.py): Numba's manager, then ours"
  HIPMR_PLATFORM=nvidia timeout 560 python3 scripts/peer_suites.py --suite numba \
    --modules numba.cuda.tests.cudapy.test_ipc --out /tmp/scale-numba --timeout 250 2>&1 \
    | tail -25; echo "numba ipc rc=${PIPESTATUS[0]}"
} > "$OUT/scale.txt" 2>&1
grep -E "passed|failed|rc=|GB/s|->|FAILED|all checks" "$OUT/scale.txt" | tail -30
python3 - "$OUT/scale.json" <<'PY'
import json, os, sys
merged = {}
paths = {"ipc": "/tmp/scale-ipc.json", "mpi": "/tmp/scale-mpi.json",
         "peer": "/tmp/scale-peer.json", "numba_ipc": "/tmp/scale-numba/peer_suites.json"}
for key, path in paths.items():
    merged[key] = json.load(open(path)) if os.path.exists(path) else None
json.dump(merged, open(sys.argv[1], "w"), indent=1)
PY
fi
if [ "${SCALE_ONLY:-0}" = 1 ]; then exit 0; fi
echo "== bench"; date
HIPMR_PLATFORM=nvidia timeout ${BENCH_TIMEOUT:-560} python3 scripts/bench_alloc.py --pairs ${PAIRS:-20000} --json "$OUT/bench.json" | tee "$OUT/bench.txt"
echo "== ref overhead"; HIPMR_PLATFORM=nvidia timeout 120 python3 scripts/bench_ref.py --json "$OUT/bench_ref.json" | tail -15
echo "== import"; HIPMR_PLATFORM=nvidia timeout 300 python3 scripts/bench_import.py --rounds 15 --json "$OUT/import.json" | tee "$OUT/import.txt"
if [ "${RELIABILITY:-1}" = 1 ]; then reliability; fi

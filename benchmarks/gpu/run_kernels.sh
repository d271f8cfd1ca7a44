#!/usr/bin/env bash
# One call on the GPU machine: the kernel tests, then the kernel benchmarks.
#   bash benchmarks/gpu/run_kernels.sh            # writes under $OUT (or benchmarks/out/gpu)
# Env: TEST_WORKERS (pytest-xdist processes, default 8), TEST_TIMEOUT_S, BENCH_TIMEOUT_S,
#      BENCH_ARGS (passed to bench_kernels.py, e.g. "--sections decode,sweep"), SKIP_TESTS=1.
# Prints the machine, the tests' summary and the benchmark tables last; full logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/out/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

test_rc=skipped
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  start=$(date +%s)
  timeout "${TEST_TIMEOUT_S:-240}" "$PY" -m pytest tests/kernels -q -p no:cacheprovider \
    -n "${TEST_WORKERS:-8}" -o addopts="" -rfE --junitxml="$OUT/tests.xml" > "$OUT/tests.log" 2>&1
  test_rc=$?
  echo "== kernel tests: rc=$test_rc in $(( $(date +%s) - start )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 30
  tail -n 3 "$OUT/tests.log"
fi

start=$(date +%s)
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT_S:-240}" "$PY" benchmarks/bench_kernels.py --out "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
bench_rc=$?
echo "== kernel benchmarks: rc=$bench_rc in $(( $(date +%s) - start )) s"
if [ -s "$OUT/bench_kernels.txt" ]; then cat "$OUT/bench_kernels.txt"; else tail -n 40 "$OUT/bench.log"; fi
echo "tests rc=$test_rc bench rc=$bench_rc"

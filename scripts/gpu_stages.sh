#!/usr/bin/env bash
# Named measuring stages on the GPU machine, over device/slim.tar.xz (`scripts/gpu_pack.sh slim
# TESTS...` makes it here: runit built with cuda,wgpu and the named test binaries, xz-packed;
# unpacked once per machine into /tmp/bin). Chain stages in one device call, e.g.
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig   # Vulkan loader for the wgpu stages
#   CODES=1 DEPTHS=16384 scripts/gpu_stages.sh prep tqtest tq wgpu
# Stages (environment knobs in parentheses):
#   prep    qwen2.5-7b Q4_K_M from `runit synth` into /tmp/synth (once per machine)
#   tqtest  turbo_gpu with RUNIT_CUDA_TQ_DECODE=tiles/codes/mma (default all three; CODES, TQFILTER: test name filters)
#   tq      tg128 at DEPTHS (4096 16384): f16, tq4 by the tile decoder, the codes and the tensor cores, --tq
#           (TQCHUNKS: RUNIT_CUDA_TQ_CHUNKS values; NOTILE=1, NOTQ=1 skip rows)
#   tqmb    tq4 from the codes at 16384 with TQ_MIN_BLOCKS=3
#   tqab    tg at 16384: f16, then tq4 (f16 for labels f16...) under each knob set of TQAB ("label:VAR=V,VAR=V;..."),
#           ROUNDS rounds alternated; a short f16 bench first compiles the kernels
#   prof    RUNIT_CUDA_PROFILE=1 per-kernel times of a tq decode (CODES, DEPTH, KV)
#   batch   runit bench --batch B (BATCHES, MODEL)
#   ncu     Nsight Compute full set + SASS source counters of KREGEX (ARGS, SKIP, COUNT, TAG)
#   wgpu    wgpu (int8 activations on/off) beside CUDA on 0.5B Q8_0 and 7B Q4_K_M (WTESTS)
#   q6k     wgpu Q6_K staging on/off on the 7B
#   sweep   B=64 (BATCHES) step times over the pipelined matmuls' knobs: slots cap, blocks per
#           multiprocessor, one merge for Q/K/V (the first run compiles the kernels)
#   wprof   RUNIT_WGPU_PROFILE=1 per-dispatch device times of a wgpu decode, 7B and 0.5B
#   tests   the packed test binaries named in TESTS (default turbo_gpu parity fused_gpu turbo_cuda),
#           one thread each, TESTTO seconds each (default 240)
#   tqpre   a 16k fill + tg32: f16, tq4 with the tile prefill and with the tensor cores' prefill
#   attn    attention_bench on the 7B shape (ATTNARGS, default "16384 512")
#   kvq8    q8_0 caches at 16384, tg128: runit (four launches, then RUNIT_CUDA_BLOCK_ROPE_WRITE=1's
#           one) beside llama-bench -ctk q8_0 -ctv q8_0 (after `scripts/gpu_batch.sh build`), ROUNDS rounds
# Logs go to $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/synth /tmp/bin
export RUNIT_CACHE_DIR=/tmp/runit-cache RUNIT_REQUIRE_GPU=1 RUNIT_REQUIRE_NVRTC=1
sum=$(md5sum device/slim.tar.xz | cut -c1-32)
if [ "$(cat /tmp/bin/sum 2>/dev/null)" != "$sum" ]; then
  rm -rf /tmp/bin/*; tar -xJf device/slim.tar.xz -C /tmp/bin && echo "$sum" > /tmp/bin/sum
fi
B=/tmp/bin; M7=/tmp/synth/7b-q4km.gguf
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
bench() {  # label env... -- args
  local label=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  printf "%-40s " "$label"
  case " $* " in *" --device "*) ;; *) set -- --device cuda "$@";; esac
  env "${envs[@]}" timeout 250 $B/runit bench "$@" 2>"$out/bench-$label.err" | grep -E "tg|pp|KV|error" | tr '\n' ' '
  echo; grep -iE "error" "$out/bench-$label.err" | head -3
}
for stage in "$@"; do
  echo "##### $stage $(date +%T)"
  case $stage in
  prep)
    [ -s $M7 ] || /usr/bin/time -f "synth 7b %e s" $B/runit synth --shape qwen2.5-7b --type Q4_K_M $M7 > $out/synth.log 2>&1; tail -1 $out/synth.log ;;
  tqtest)
    for codes in ${CODES:-tiles codes mma}; do
      echo "== turbo_gpu decode=$codes"
      for f in ${TQFILTER:-""}; do
      RUNIT_CUDA_TQ_DECODE=$codes timeout 150 $B/turbo_gpu $f --nocapture --test-threads 1 > $out/turbo_gpu-$codes.log 2>&1
      echo rc=$?; grep -E "^test |test result|panicked|FAILED" $out/turbo_gpu-$codes.log | head -12; grep -E "max" $out/turbo_gpu-$codes.log | sort -t'|' -k2 | tail -2
      done
    done ;;
  tq)
    for D in ${DEPTHS:-4096 16384}; do
      bench f16-d$D -- -m $M7 -p 0 -n 128 -d $D -r 1 -c 17000 --kv-type f16
      [ -n "${NOTILE:-}" ] || bench tq4-d$D RUNIT_CUDA_TQ_DECODE=tiles -- -m $M7 -p 0 -n 128 -d $D -r 1 -c 17000 --kv-type tq4
      bench tq4codes-d$D RUNIT_CUDA_TQ_DECODE=codes -- -m $M7 -p 0 -n 128 -d $D -r 1 -c 17000 --kv-type tq4
      bench tq4mma-d$D RUNIT_CUDA_TQ_DECODE=mma -- -m $M7 -p 0 -n 128 -d $D -r 1 -c 17000 --kv-type tq4
      for c in ${TQCHUNKS:-}; do bench tq4mma-c$c-d$D RUNIT_CUDA_TQ_CHUNKS=$c -- -m $M7 -p 0 -n 128 -d $D -r 1 -c 17000 --kv-type tq4; done
      [ -n "${NOTQ:-}" ] || bench tq-d$D -- -m $M7 -p 0 -n 128 -d $D -r 1 -c 17000 --tq
    done ;;
  prof)
    for codes in ${CODES:-codes mma}; do
      RUNIT_CUDA_PROFILE=1 RUNIT_CUDA_TQ_DECODE=$codes timeout 250 $B/runit bench --device cuda -m $M7 -p 0 -n 32 -d ${DEPTH:-16384} -r 1 -c 17000 --kv-type ${KV:-tq4} > $out/prof-$codes.log 2>&1
      echo "== profile codes=$codes"; grep -A14 "RUNIT_CUDA_PROFILE" $out/prof-$codes.log | head -16
    done ;;
  ncu)  # KREGEX kernel regex, ARGS bench args; full set, details + SASS source counters into $out
    N=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $N"
    [ -n "$N" ] || continue
    tag=${TAG:-mmqp}
    RUNIT_CUDA_GRAPHS=0 timeout 400 $N --clock-control none --set full --import-source no -k "regex:${KREGEX:-mmqp_q4_k}" -s ${SKIP:-200} -c ${COUNT:-2} -o /tmp/$tag -f \
      $B/runit bench --device cuda -m $M7 ${ARGS:--p 0 -n 8 -d 128 --batch 64 --pick-on-device -r 1} > $out/ncu-$tag.log 2>&1
    echo rc=$?; tail -3 $out/ncu-$tag.log
    $N -i /tmp/$tag.ncu-rep --page details > $out/ncu-$tag-details.txt 2>&1
    $N -i /tmp/$tag.ncu-rep --page source --csv --print-source sass > $out/ncu-$tag-sass.csv 2>&1
    grep -E "^  [a-z_]+|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Warp Cycles Per Issued|One or More Eligible|Executed Ipc A" $out/ncu-$tag-details.txt | head -60; ls -la $out/ncu-$tag-sass.csv ;;
  batch)
    for b in ${BATCHES:-64}; do printf "B=%s " $b; timeout 200 $B/runit bench --device cuda -m ${MODEL:-$M7} -p 0 -n 32 -d 128 --batch $b --pick-on-device -r 2 2>&1 | grep -E "tg|error" | tail -1; done ;;
  wgpu)  # wgpu vs cuda decode; int8 activations on/off; correctness tests on the NVIDIA driver
    export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p /tmp/xdg
    [ -s /tmp/synth/05b-q8.gguf ] || $B/runit synth --shape qwen2.5-0.5b --type Q8_0 /tmp/synth/05b-q8.gguf > $out/synth05.log 2>&1
    $B/runit devices 2>&1 | head -5 || { export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; $B/runit devices 2>&1 | head -5; }
    for t in ${WTESTS:-wgpu_matvec wgpu_fused wgpu_parity}; do [ -x $B/$t ] || continue
      RUNIT_REQUIRE_WGPU=1 timeout 200 $B/$t --test-threads 1 > $out/$t.log 2>&1; echo "$t rc=$? $(grep 'test result' $out/$t.log | tail -1)"; done
    for m in /tmp/synth/05b-q8.gguf $M7; do
      bench cuda-$(basename $m) -- -m $m -p 512 -n 64 -r 2
      bench wgpu-int8-$(basename $m) XDG_RUNTIME_DIR=/tmp/xdg -- -m $m -p 512 -n 64 -r 2 --device wgpu
      bench wgpu-f32-$(basename $m) XDG_RUNTIME_DIR=/tmp/xdg RUNIT_WGPU_MATVEC_INT8=0 -- -m $m -p 512 -n 64 -r 2 --device wgpu
    done ;;
  q6k)
    export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p /tmp/xdg
    for v in 1 0; do bench wgpu-q6k$v-7b XDG_RUNTIME_DIR=/tmp/xdg RUNIT_WGPU_Q6K_ALIGNED=$v -- -m $M7 -p 0 -n 64 -r 2 --device wgpu; done ;;
  sweep)
    for b in ${BATCHES:-64}; do
      for e in X=1 RUNIT_CUDA_QKV_MERGE=0 RUNIT_CUDA_MMQP_SLOTS=2 RUNIT_CUDA_MMQP_SLOTS=3 RUNIT_CUDA_MMQP_SLOTS=4 \
               RUNIT_CUDA_MMQP_SLOTS=8 RUNIT_CUDA_MMQP_BLOCKS=1 "RUNIT_CUDA_MMQP_BLOCKS=1 RUNIT_CUDA_MMQP_SLOTS=4" X=1; do
        printf "B=%-3s %-48s " $b "$e"; env $e timeout 100 $B/runit bench --device cuda -m ${MODEL:-$M7} -p 0 -n 32 -d 128 --batch $b --pick-on-device -r 2 2>&1 | grep -oE "a step takes [0-9.]+ ms|rror.*" | head -1
      done
    done ;;
  wprof)
    export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p /tmp/xdg
    [ -s /tmp/synth/05b-q8.gguf ] || $B/runit synth --shape qwen2.5-0.5b --type Q8_0 /tmp/synth/05b-q8.gguf > $out/synth05.log 2>&1
    for m in $M7 /tmp/synth/05b-q8.gguf; do
      RUNIT_WGPU_PROFILE=1 timeout 100 $B/runit bench --device wgpu -m $m -p 0 -n 16 -r 1 > $out/wprof-$(basename $m).log 2>&1
      echo "== $(basename $m)"; grep -A16 "RUNIT_WGPU_PROFILE" $out/wprof-$(basename $m).log | head -18
    done ;;
  tqab)  # tg at 16384 (TQN tokens, default 64): f16, then tq4 under each entry of TQAB
          # ("label:VAR=V,VAR=V;label2:..."), the whole round ROUNDS times (alternated)
    bench warmup-f16 -- -m $M7 -p 0 -n 4 -r 1 -c 2048 --kv-type f16 > /dev/null
    IFS=';' read -ra entries <<< "${TQAB:-default:X=1}"
    for round in $(seq ${ROUNDS:-1}); do
      bench f16-r$round -- -m $M7 -p 0 -n ${TQN:-64} -d 16384 -r 1 -c 17000 --kv-type f16
      for e in "${entries[@]}"; do
        IFS=',' read -ra envs <<< "${e#*:}"
        kv=tq4; case ${e%%:*} in f16*) kv=f16 ;; esac  # labels f16...: the f16 cache
        bench "$kv-${e%%:*}-r$round" "${envs[@]}" -- -m $M7 -p 0 -n ${TQN:-64} -d 16384 -r 1 -c 17000 --kv-type $kv
      done
    done ;;
  tests)
    for t in ${TESTS:-turbo_gpu parity fused_gpu turbo_cuda}; do [ -x $B/$t ] || { echo "$t: not packed"; continue; }
      timeout ${TESTTO:-240} $B/$t --test-threads 1 > $out/$t.log 2>&1
      echo "$t rc=$? $(grep 'test result' $out/$t.log | tail -1)"; grep -E "panicked|FAILED|failures:" $out/$t.log | head -6
    done ;;
  tqpre)
    bench warmup-f16 -- -m $M7 -p 0 -n 4 -r 1 -c 2048 --kv-type f16 > /dev/null
    for kv in f16 tq4-tiles tq4-mma; do
      pre=${kv#tq4-}; [ "$pre" = f16 ] && pre=tiles
      bench fill16k-$kv RUNIT_CUDA_TQ_PREFILL=$pre -- -m $M7 -p 512 -n 32 -d 16384 -r 1 -c 17000 --kv-type ${kv%-*}
    done ;;
  attn)
    [ -x $B/attention_bench ] && timeout 200 $B/attention_bench ${ATTNARGS:-16384 512} 2>&1 | tee $out/attention_bench.log | tail -30 ;;
  kvq8)
    L=/tmp/llama/build/bin/llama-bench; [ -x $L ] || { echo "llama-bench not built (scripts/gpu_batch.sh build)"; continue; }
    for round in $(seq ${ROUNDS:-2}); do
      bench q8-r$round -- -m $M7 -p 0 -n 128 -d 16384 -r 1 -c 17000 --kv-type q8_0
      bench q8one-r$round RUNIT_CUDA_BLOCK_ROPE_WRITE=1 -- -m $M7 -p 0 -n 128 -d 16384 -r 1 -c 17000 --kv-type q8_0
      printf "%-40s " llama-q8-r$round
      timeout 200 $L -m $M7 -ngl 99 -fa 1 -n 128 -p 0 -d 16384 -r 1 -ctk q8_0 -ctv q8_0 2>&1 | grep -E "tg128" | tr '\n' ' '; echo
    done ;;
  tqmb)
    bench tq4codes-mb3-d16384 RUNIT_CUDA_TQ_DECODE=codes RUNIT_CUDA_DEFINES=TQ_MIN_BLOCKS=3 -- -m $M7 -p 0 -n 128 -d 16384 -r 1 -c 17000 --kv-type tq4 ;;
  esac
done

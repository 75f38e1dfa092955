#!/usr/bin/env bash
# Decode batches on the GPU machine (issue 24), over what `scripts/gpu_pack.sh tests` put in
# device/, with the llama.cpp source tarball carried in device/llama.cpp.tar.xz:
#   scripts/gpu_batch.sh build              # llama.cpp's CUDA build, detached (about 4.5 min)
#   scripts/gpu_batch.sh runit [B...]       # runit bench --batch B: default paths, then the int8 kernels
#   scripts/gpu_batch.sh llama [B...]       # llama-batched-bench S_TG on the same file
#   scripts/gpu_batch.sh serve [C...]       # runit serve + scripts/serve_bench.py at concurrency C
#                                           # (128-token prompts, 128 generated tokens)
# The model is qwen2.5-7b Q4_K_M from `runit synth` (made once per machine, in /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/runit-out}
mkdir -p "$out" /tmp/synth
mode=${1:-runit}
shift || true
batches=${*:-"16 32 64 128 256"}
model=/tmp/synth/qwen2.5-7b-Q4_K_M.gguf
runit=$PWD/device/bin/runit
[ -f "$model" ] || "$runit" synth --shape qwen2.5-7b --type Q4_K_M "$model" >"$out/synth.log" 2>&1
case "$mode" in
build)
  mkdir -p /tmp/llama && tar -xJf device/llama.cpp.tar.xz -C /tmp/llama --strip-components=1
  cd /tmp/llama && setsid nohup bash -c 'cmake -S . -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_TYPE=Release \
    && nice -n 10 ninja -C build -j 12 llama-bench llama-batched-bench; echo done >/tmp/llama/built' \
    >/tmp/llama/build.log 2>&1 </dev/null &
  echo "llama.cpp build started"
  ;;
runit)
  for b in $batches; do
    for mmq8 in 0 1; do
      printf "B=%-4s int8=%s " "$b" "$mmq8"
      RUNIT_CUDA_MMQ8=$mmq8 timeout 200 "$runit" bench -m "$model" --device cuda -p 0 -n 32 -d 128 \
        --batch "$b" -r 2 2>&1 | grep -E "tg|error" | tail -1
    done
  done
  ;;
llama)
  [ -d /tmp/llama ] || { echo "no llama.cpp build on this machine: run '$0 build' first"; exit 1; }
  for _ in $(seq 120); do [ -f /tmp/llama/built ] && break; sleep 5; done
  [ -f /tmp/llama/built ] || { echo "llama.cpp build not finished"; tail -5 /tmp/llama/build.log; exit 1; }
  tail -3 /tmp/llama/build.log
  npl=$(echo "$batches" | tr ' ' ',')
  /tmp/llama/build/bin/llama-batched-bench -m "$model" -ngl 99 -fa 1 -c 40000 -b 2048 -ub 512 \
    -npp 128 -ntg 32 -npl "$npl" 2>&1 | tee "$out/llama-batched.log" | grep -E "^\|"
  ;;
serve)
  port=18080
  "$runit" serve -m "$model" --device cuda --parallel 256 --ctx-size 65536 --port $port \
    >"$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  for c in ${*:-64}; do
    echo "=== concurrency $c"
    timeout 200 python3 scripts/serve_bench.py --base-url "http://127.0.0.1:$port" \
      --concurrency "$c" --prompt-tokens 128 --max-tokens 128 --rounds 1
  done
  kill $server; wait $server 2>/dev/null
  ;;
esac

#!/usr/bin/env bash
# Decode batches on the GPU machine (issue 24), over what `scripts/gpu_pack.sh` put in device/,
# with the llama.cpp source tarball carried in device/llama.cpp.tar.xz:
#   scripts/gpu_batch.sh build              # llama.cpp's CUDA build, detached (about 4.5 min)
#   scripts/gpu_batch.sh synth              # the models of SPECS, made once per machine in /tmp/synth
#   scripts/gpu_batch.sh runit [B...]       # runit bench --batch B (greedy ids picked on the device)
#   scripts/gpu_batch.sh llama [B...]       # llama-batched-bench S_TG on the same files
#   scripts/gpu_batch.sh serve [C...]       # runit serve + scripts/serve_bench.py at concurrency C
#                                           # (128-token prompts, 128 generated tokens; first spec)
# Environment: SPECS (shape:type list, default "qwen2.5-7b:Q4_K_M"), MMQ8 ("0", or "0 1" to
# compare the int8 kernels).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/runit-out}
mkdir -p "$out" /tmp/synth
mode=${1:-runit}
shift || true
batches=${*:-"16 32 64 128 256"}
read -r -a specs <<<"${SPECS:-qwen2.5-7b:Q4_K_M}"
runit=${RUNIT:-$PWD/device/bin/runit}  # RUNIT=/tmp/bin/runit after gpu_stages.sh unpacked slim
models=()
for spec in "${specs[@]}"; do models+=("/tmp/synth/${spec%%:*}-${spec##*:}.gguf"); done
synth() {
  for spec in "${specs[@]}"; do
    file=/tmp/synth/${spec%%:*}-${spec##*:}.gguf
    [ -s "$file" ] || "$runit" synth --shape "${spec%%:*}" --type "${spec##*:}" "$file" >>"$out/synth.log" 2>&1 \
      || echo "synth $spec failed"
  done
}
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
synth)
  synth
  ;;
runit)
  synth
  for model in "${models[@]}"; do
    for b in $batches; do
      for mmq8 in ${MMQ8:-0}; do
        printf "%s B=%-4s int8=%s " "$(basename "$model" .gguf)" "$b" "$mmq8"
        RUNIT_CUDA_MMQ8=$mmq8 timeout 200 "$runit" bench -m "$model" --device cuda -p 0 -n 32 -d 128 \
          --batch "$b" --pick-on-device -r 2 2>&1 | grep -E "tg|error" | tail -1
      done
    done
  done
  ;;
llama)
  [ -d /tmp/llama ] || { echo "no llama.cpp build on this machine: run '$0 build' first"; exit 1; }
  for _ in $(seq 120); do [ -f /tmp/llama/built ] && break; sleep 5; done
  [ -f /tmp/llama/built ] || { echo "llama.cpp build not finished"; tail -5 /tmp/llama/build.log; exit 1; }
  synth
  npl=$(echo "$batches" | tr ' ' ',')
  for model in "${models[@]}"; do
    echo "=== $(basename "$model" .gguf)"
    /tmp/llama/build/bin/llama-batched-bench -m "$model" -ngl 99 -fa 1 -c 40000 -b 2048 -ub 512 \
      -npp 128 -ntg 32 -npl "$npl" 2>&1 | tee -a "$out/llama-batched.log" | grep -E "^\|"
  done
  ;;
serve)
  synth
  port=18080
  "$runit" serve -m "${models[0]}" --device cuda --parallel 256 --ctx-size 65536 --port $port \
    >"$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && break; sleep 1; done
  for c in ${*:-64}; do
    echo "=== concurrency $c"
    timeout 200 python3 scripts/serve_bench.py --base-url "http://127.0.0.1:$port" \
      --concurrency "$c" --prompt-tokens 128 --max-tokens 128 --rounds 1
  done
  kill $server; wait $server 2>/dev/null
  ;;
esac

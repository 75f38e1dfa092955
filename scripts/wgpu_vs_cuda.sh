#!/usr/bin/env bash
# The wgpu backend (Vulkan) against the CUDA backend on one NVIDIA GPU: synthetic
# qwen2.5-0.5b Q8_0 and qwen2.5-7b Q4_K_M models (written under /tmp/synth unless present),
# `runit bench -p 512 -n 128 -r 3` on `--device cuda` and `--device wgpu`, alternated for
# ROUNDS rounds (the order flips each round), printing each tok/s line, then per model and
# test the mean tok/s of each and the wgpu/cuda ratio (issue 30's target: decode >= 0.6).
# Usage: scripts/wgpu_vs_cuda.sh
# Environment: RUNIT (a binary built with --features cuda,wgpu; default device/bin/runit),
# ROUNDS (2), SYNTH (/tmp/synth), SPECS ("qwen2.5-0.5b:Q8_0 qwen2.5-7b:Q4_K_M"),
# BENCH_ARGS ("-p 512 -n 128 -r 3"), DEVICES ("cuda wgpu": the ratio is second / first).
set -euo pipefail
cd "$(dirname "$0")/.."
runit=${RUNIT:-device/bin/runit}
rounds=${ROUNDS:-2}
synth=${SYNTH:-/tmp/synth}
read -r -a specs <<<"${SPECS:-qwen2.5-0.5b:Q8_0 qwen2.5-7b:Q4_K_M}"
read -r -a bench_args <<<"${BENCH_ARGS:--p 512 -n 128 -r 3}"
read -r -a devices <<<"${DEVICES:-cuda wgpu}"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg}
mkdir -p "$synth" "$XDG_RUNTIME_DIR"
"$runit" devices
models=()
for spec in "${specs[@]}"; do
  shape=${spec%%:*} type=${spec##*:}
  file="$synth/$shape-$type.gguf"
  [ -s "$file" ] || "$runit" synth --shape "$shape" --type "$type" "$file"
  models+=("$file")
done
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq "$rounds"); do
  order=("${devices[0]}" "${devices[1]}")
  [ $((round % 2)) -eq 0 ] && order=("${devices[1]}" "${devices[0]}")
  for model in "${models[@]}"; do
    for device in "${order[@]}"; do
      # Table columns: | model | size | params | backend | threads | KV cache | KV B/token |
      # test | t/s | weights GB/s |
      if ! table=$("$runit" bench -m "$model" --device "$device" "${bench_args[@]}" 2>&1); then
        echo "round $round  $(basename "$model") $device FAILED: $(tail -n 1 <<<"$table")"
        continue
      fi
      awk -F'|' -v m="$(basename "$model")" -v d="$device" -v r="$round" \
        '$9 ~ /pp|tg/ {gsub(/ /,"",$9); gsub(/ /,"",$10); split($10,a,"±");
         printf "round %s  %-28s %-5s %-6s %8s t/s\n", r, m, d, $9, a[1]}' <<<"$table" \
        | tee -a "$results"
    done
  done
done
echo
echo "mean t/s over $rounds rounds (${devices[1]}/${devices[0]}):"
awk -v a="${devices[0]}" -v b="${devices[1]}" \
  '{key=$3" "$5; sum[key" "$4]+=$6; n[key" "$4]++; keys[key]=1}
   END {for (k in keys) {
     x = n[k" "a] ? sum[k" "a] / n[k" "a] : 0; y = n[k" "b] ? sum[k" "b] / n[k" "b] : 0;
     printf "%-36s %s %8.1f  %s %8.1f  ratio %s\n", k, a, x, b, y,
       (x > 0 && y > 0 ? sprintf("%.2f", y / x) : "n/a")}}' "$results" | sort

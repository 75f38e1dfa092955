#!/usr/bin/env bash
# The CPU's two ways of holding weights side by side: copied into (huge-page) memory, the
# default, and --mmap (computing from the file's memory map). Per model: the time of a
# one-token `generate` (start, load, prompt, one token, exit) with a
# cold page cache (when /proc/sys/vm/drop_caches is writable) and a warm one, then pp128 and
# tg64 (runit bench, alternated for two rounds). Run it on a quiet machine.
# Usage: scripts/mmap_vs_copy.sh [MODEL...]   (RUNIT=binary, default target/release/runit)
set -euo pipefail
cd "$(dirname "$0")/.."
runit=${RUNIT:-./target/release/runit}
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf)
load_time() { # model, extra flags: seconds from start to the first token's exit (-n 1)
  local start end
  start=$(date +%s.%N)
  "$runit" generate -m "$1" "${@:2}" -p "Hi" -n 1 --temperature 0 >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$start $end" | awk '{printf "%.2f", $2 - $1}'
}
cold() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo cold || echo "warm (cannot drop caches)"; }
printf '| model | mode | first token, cold | first token, warm | pp128 t/s | tg64 t/s |\n|---|---|---:|---:|---:|---:|\n'
for model in "${models[@]}"; do
  for mode in copy mmap; do
    flags=(); [ $mode = mmap ] && flags=(--mmap)
    state=$(cold); first=$(load_time "$model" "${flags[@]}")
    [ "$state" = cold ] || first="$first ($state)"
    warm=$(load_time "$model" "${flags[@]}")
    speeds=()
    for round in 1 2; do
      speeds+=("$("$runit" bench -m "$model" "${flags[@]}" -p 128 -n 64 -r 3 2>/dev/null \
        | awk -F'|' '/ pp128 | tg64 /{gsub(/ /,"",$10); split($10,a,"±"); printf "%s ", a[1]}')")
    done
    pp=$(printf '%s\n' "${speeds[@]}" | awk '{s+=$1} END {printf "%.1f", s/NR}')
    tg=$(printf '%s\n' "${speeds[@]}" | awk '{s+=$2} END {printf "%.1f", s/NR}')
    printf '| %s | %s | %s s | %s s | %s | %s |\n' "$(basename "$model")" "$mode" "$first" "$warm" "$pp" "$tg"
  done
done

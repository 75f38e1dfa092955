#!/usr/bin/env bash
# Speculative decoding on the GPU machine (issue 28), over the runit that `scripts/gpu_pack.sh`
# put in device/: qwen2.5-7b Q8_0 from `runit synth` as the target, its Q4_0 requantization
# (the same weights, fewer bits) as the draft model, and prompt lookup (--draft-ngram 3, 4),
# on the rewriting prompts of scripts/spec_prompts. `runit bench` with a drafter generates each
# prompt with speculation off and on in turn and prints the acceptance and the speed-up.
#   scripts/gpu_spec.sh [tokens]   (default 128 generated tokens a prompt)
set -uo pipefail
cd "$(dirname "$0")/.."
runit=${RUNIT:-$PWD/device/bin/runit}
tokens=${1:-128}
mkdir -p /tmp/synth
target=/tmp/synth/qwen2.5-7b-Q8_0.gguf
draft=/tmp/synth/qwen2.5-7b-Q8_0-as-Q4_0.gguf
[ -s "$target" ] || "$runit" synth --shape qwen2.5-7b --type Q8_0 "$target"
[ -s "$draft" ] || "$runit" quantize --allow-requantize "$target" "$draft" Q4_0
rewrites=(--prompt-file scripts/spec_prompts/rewrite_passage.txt --prompt-file scripts/spec_prompts/refactor_code.txt)
echo "## draft model (Q4_0 of the same weights)"
"$runit" bench -m "$target" --device cuda -md "$draft" "${rewrites[@]}" -n "$tokens" -r 1
for n in 3 4; do
  echo "## prompt lookup --draft-ngram $n"
  "$runit" bench -m "$target" --device cuda --draft-ngram "$n" "${rewrites[@]}" -n "$tokens" -r 1
done

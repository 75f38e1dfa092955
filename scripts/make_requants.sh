#!/usr/bin/env bash
# Rebuilds the SmolLM2 requantizations of ../shared/golden/MODELS.json with `runit quantize`
# (models/requant/, git-ignored); the golden generation and perplexity tests use them.
set -euo pipefail
cd "$(dirname "$0")/.."
runit="${1:-target/release/runit}"
source=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p models/requant
for type in Q8_0 Q4_0 Q5_0 Q4_K_M Q5_K_M Q6_K F16 BF16; do
  out="models/requant/SmolLM2-135M-Instruct.requant-$type.gguf"
  if [ ! -s "$out" ]; then
    "$runit" quantize "$source" "$out" "$type"
  fi
done

#!/usr/bin/env bash
# Makes the quantized model files the tests read with `runit quantize` (into the git-ignored
# models/): the synthetic ones of tests/golden/MODELS.json from their F32 sources
# (scripts/fetch_models.py --synthetic makes those), each checked against its sha256 (they
# are byte-identical to llama-quantize's --pure files), and the SmolLM2 requantizations
# (models/requant/), which the golden generation and perplexity tests compare themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
runit="$(realpath "${1:-target/release/runit}")"

# synth-ARCH-TYPE.gguf from synth-ARCH-F32.gguf; the sums list every file llama-quantize made
# and the ones tests/golden/regen/quantize_ref.py reproduces.
sums=$(cat tests/golden/models/SHA256SUMS tests/golden/models/REGENERATED.sha256 | grep -v -- '-F32\.gguf$')
cd models
while read -r sha name; do
  if [ -s "$name" ] && [ "$(cat "$name.sha256" 2>/dev/null)" = "$sha $(stat -c %s "$name")" ]; then
    continue
  fi
  stem=${name%.gguf}
  arch=$(echo "$stem" | cut -d- -f2)
  type=${stem##*-}
  "$runit" quantize --pure --force "synth-$arch-F32.gguf" "$name.partial" "$type" >/dev/null
  got=$(sha256sum "$name.partial" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "make_requants: $name: sha256 $got, expected $sha" >&2
    exit 1
  fi
  mv "$name.partial" "$name"
  echo "$sha $(stat -c %s "$name")" > "$name.sha256"
  echo "make_requants: $name ok" >&2
done <<< "$sums"

source=SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p requant
for type in Q8_0 Q4_0 Q5_0 Q4_K_M Q5_K_M Q6_K F16 BF16; do
  out="requant/SmolLM2-135M-Instruct.requant-$type.gguf"
  if [ ! -s "$out" ]; then
    "$runit" quantize --allow-requantize "$source" "$out" "$type"
  fi
done

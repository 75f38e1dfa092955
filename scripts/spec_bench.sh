#!/usr/bin/env bash
# Speculative decoding side by side with plain decoding (runit bench with a drafter):
# SmolLM2 Q8_0 drafted by its Q4_0 and Q4_1 quantizations on the golden chat prompts, and
# prompt lookup on the rewriting prompts of scripts/spec_prompts. Usage:
#   scripts/spec_bench.sh [threads]   (builds nothing; run cargo build --release -p runit-cli first)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
runit=./target/release/runit
target=models/requant/SmolLM2-135M-Instruct.requant-Q8_0.gguf
chat=$(mktemp -d)
trap 'rm -rf "$chat"' EXIT
python3 - "$chat" <<'PY'
import json, sys
golden = json.load(open("tests/golden/generation/SmolLM2-135M-Instruct.Q4_1.model-template.json"))
for i, result in enumerate(golden["results"]):
    open(f"{sys.argv[1]}/chat{i}.txt", "w").write(result["prompt_text"])
PY
prompts=()
for f in "$chat"/*.txt; do prompts+=(--prompt-file "$f"); done
for draft in models/requant/SmolLM2-135M-Instruct.requant-Q4_0.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf; do
  "$runit" bench -m "$target" -t "$threads" -md "$draft" "${prompts[@]}" -n 128 -r 2
done
"$runit" bench -m "$target" -t "$threads" --draft-ngram 3 "${prompts[@]}" -n 128 -r 2
"$runit" bench -m "$target" -t "$threads" --draft-ngram 3 --prompt-file scripts/spec_prompts/rewrite_passage.txt -n 400 -r 3
"$runit" bench -m models/gemma-3-270m-q4_k_m.gguf -t "$threads" --draft-ngram 3 --prompt-file scripts/spec_prompts/rewrite_passage.gemma.txt -n 400 -r 2

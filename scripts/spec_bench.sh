#!/usr/bin/env bash
# Speculative decoding side by side with plain decoding (runit bench with a drafter: each
# prompt generated greedily with speculation off and on in turn, the same tokens both ways),
# printing each table's speed-up, the drafts' acceptance and what a verification pass of
# each row count cost against a one-row step:
#   1. draft models on the golden chat prompts: SmolLM2 Q8_0 drafted by its Q4_0 and Q4_1
#      quantizations, and the F16 requantization drafted by Q4_1 (issue 28's target: 1.3x);
#   2. prompt lookup (--draft-ngram 3 and 4) on the rewriting prompts of scripts/spec_prompts
#      (a 400-token passage to repeat with one word changed, and a Python file to repeat with
#      a variable renamed; each assistant turn starts with the answer's first words, without
#      which SmolLM2-135M comments on the text instead of repeating it) (target: 2x), and on
#      the chat prompts, where it rarely has a draft (a poor drafter must cost at most 5%);
#   3. Gemma 3 270M with prompt lookup on the passage.
# Usage:
#   scripts/spec_bench.sh [threads]   (builds nothing; run cargo build --release -p runit-cli first)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
runit=./target/release/runit
requant=models/requant/SmolLM2-135M-Instruct.requant
target=$requant-Q8_0.gguf
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
rewrites=(--prompt-file scripts/spec_prompts/rewrite_passage.txt --prompt-file scripts/spec_prompts/refactor_code.txt)
bench() { echo; echo "## runit bench $*"; "$runit" bench -t "$threads" "$@"; }

for draft in $requant-Q4_0.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf; do
  bench -m "$target" -md "$draft" "${prompts[@]}" -n 128 -r 2
done
if [ -s "$requant-F16.gguf" ]; then
  bench -m "$requant-F16.gguf" -md models/SmolLM2-135M-Instruct.Q4_1.gguf "${prompts[@]}" -n 128 -r 2
fi
for ngram in 4 3; do
  bench -m "$target" --draft-ngram "$ngram" "${rewrites[@]}" -n 400 -r 3
done
bench -m "$target" --draft-ngram 3 "${prompts[@]}" -n 128 -r 2
bench -m models/gemma-3-270m-q4_k_m.gguf --draft-ngram 3 --prompt-file scripts/spec_prompts/rewrite_passage.gemma.txt -n 400 -r 2

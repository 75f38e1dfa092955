#!/usr/bin/env bash
# Pass-key retrieval with each KV cache type: a key hidden a third of the way into filler
# of about 1,500, 3,700 and 7,000 tokens, asked for at the end (greedy, SmolLM2 by default).
# Prints one line per length and type: the answer and whether it holds the key.
# Usage: scripts/passkey.sh [MODEL] [threads]   (RUNIT=binary, default target/release/runit)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-2}
runit=${RUNIT:-./target/release/runit}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import sys
filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
for repeats, key in [(60, 68237), (150, 41952), (280, 73815)]:
    text = ("There is an important piece of information hidden inside a lot of irrelevant text. "
            "Find it and memorize it. I will quiz you about it.\n")
    for i in range(repeats):
        if i == repeats // 3:
            text += f"The pass key is {key}. Remember it. {key} is the pass key. "
        text += filler
    text += "\nWhat is the pass key? The pass key is"
    open(f"{sys.argv[1]}/{repeats}-{key}.txt", "w").write(text)
PY
printf '| filler | tokens | cache (K/V) | answer | retrieved |\n|---|---:|---|---|---|\n'
for file in "$work"/60-*.txt "$work"/150-*.txt "$work"/280-*.txt; do
  name=$(basename "$file" .txt)
  key=${name#*-}
  tokens=$("$runit" tokenize -m "$model" -f "$file" 2>/dev/null | wc -l)
  for types in f16/f16 q8_0/q8_0 q4_0/q4_0 tq4/tq4 tq4/tq3 tq3/tq3; do
    answer=$("$runit" generate -m "$model" -t "$threads" -c 8192 -n 6 --temperature 0 \
      --kv-type-k "${types%/*}" --kv-type-v "${types#*/}" -p "$(cat "$file")" 2>/dev/null \
      | tail -c 40 | tr -d '\n')
    case "$answer" in *"$key"*) found=yes ;; *) found=no ;; esac
    printf '| %s | %s | %s | `%s` | %s |\n' "${name%-*}x" "$tokens" "$types" "$answer" "$found"
  done
done

#!/usr/bin/env bash
# The main job: build RunIT, fetch the default small model if absent, and answer a prompt.
#   scripts/run.sh "What is the capital of France?"     (any runit generate flags may follow)
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="${1:-What is the capital of France?}"
shift || true
model="$(python3 scripts/fetch_models.py)"
cargo build --release --quiet -p runit-cli
exec target/release/runit generate -m "$model" --chat -p "$prompt" --temperature 0 "$@"

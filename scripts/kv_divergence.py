#!/usr/bin/env python3
"""Greedy generations with each KV cache type against the f16 cache: for every golden
prompt (tests/golden/generation, 64 tokens each), how many tokens each compressed cache
gives before its first difference from the f16 cache's tokens (64 = none).

    scripts/kv_divergence.py [--model FILE] [--golden FILE] [--runit BINARY]
"""

import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ["q8_0/q8_0", "q4_0/q4_0", "tq4/tq4", "tq4/tq3", "tq3/tq3"]


def generate(runit, model, prompt_file, types, tokens):
    keys, values = types.split("/")
    out = subprocess.run(
        [runit, "generate", "-m", model, "-f", prompt_file, "-n", str(tokens),
         "--temperature", "0", "--ignore-eos", "-c", "2048", "--kv-type-k", keys,
         "--kv-type-v", values, "--output-format", "json"],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["tokens"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--golden", default=os.path.join(
        ROOT, "tests", "golden", "generation", "SmolLM2-135M-Instruct.Q4_1.json"))
    parser.add_argument("--runit", default=os.path.join(ROOT, "target", "release", "runit"))
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    prompts = [r["prompt_text"] for r in json.load(open(args.golden))["results"]]
    table = {t: [] for t in TYPES}
    with tempfile.TemporaryDirectory() as work:
        for i, prompt in enumerate(prompts):
            path = os.path.join(work, f"p{i}.txt")
            open(path, "w").write(prompt)
            base = generate(args.runit, args.model, path, "f16/f16", args.tokens)
            for types in TYPES:
                got = generate(args.runit, args.model, path, types, args.tokens)
                same = next((j for j, (a, b) in enumerate(zip(base, got)) if a != b), len(base))
                table[types].append(same)
    print(f"| K / V | tokens equal to f16's before the first difference, per prompt (of {args.tokens}) | mean |")
    print("|---|---|---:|")
    for types, counts in table.items():
        print(f"| {types} | {' '.join(map(str, counts))} | {sum(counts) / len(counts):.1f} |")


if __name__ == "__main__":
    main()

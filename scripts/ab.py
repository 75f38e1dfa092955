#!/usr/bin/env python3
"""Side-by-side A/B of several builds on a shared machine, whose speed drifts within minutes:
runs COMMAND once per variant per round, the variants alternating, and prints each variant's
median, minimum and maximum of the figure REGEX captures (its last match in the output).

    # two builds of batch_decode, 6 rounds, the 8-at-once rate
    python3 scripts/ab.py 6 "8 at once ([0-9.]+) tok/s" \\
        "/tmp/bd-{v} models/SmolLM2-135M-Instruct.Q4_1.gguf 8 128 2 1" old new

`{v}` in COMMAND is replaced by each variant's name. Standard library only.
"""

import re
import statistics
import subprocess
import sys


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    rounds, pattern, command, variants = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    figures = {variant: [] for variant in variants}
    for _ in range(rounds):
        for variant in variants:
            run = subprocess.run(
                command.format(v=variant), shell=True, capture_output=True, text=True
            )
            found = re.findall(pattern, run.stdout)
            if not found:
                sys.exit(f"{variant}: no match for {pattern!r} in:\n{run.stdout}{run.stderr}")
            figures[variant].append(float(found[-1]))
    for variant, values in figures.items():
        print(
            f"{variant}: median {statistics.median(values):.1f} min {min(values):.1f} "
            f"max {max(values):.1f} all {[round(v, 1) for v in values]}"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Summarizes an Nsight Compute SASS source page (the CSV that `scripts/gpu_stages.sh ncu`
brings back as ncu-TAG-sass.csv): instructions executed by opcode, and the hottest windows of
consecutive instructions with their share of instructions, of stall samples and of excessive
shared-memory wavefronts (bank conflicts), so a kernel's loops can be told apart without a GUI.

  scripts/ncu_summary.py ncu-tq-sass.csv [--window 25] [--top 12] [--dump START:END]
"""
import argparse
import collections
import csv
import sys


def number(text):
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(source):
    words = source.strip().split()
    if words and words[0].startswith("@"):  # a predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--window", type=int, default=25, help="instructions a window")
    parser.add_argument("--top", type=int, default=12, help="windows shown, by instructions")
    parser.add_argument("--dump", help="print instructions START:END with their counts")
    args = parser.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header_at = next((i for i, r in enumerate(rows) if "Instructions Executed" in r), None)
    if header_at is None:
        sys.exit(f"{args.csv}: no 'Instructions Executed' column (not a --page source --csv file?)")
    header, data = rows[header_at], [r for r in rows[header_at + 1 :] if len(r) == len(rows[header_at])]
    col = {name: i for i, name in enumerate(header)}

    def get(row, name):
        return number(row[col[name]]) if name in col else 0.0

    executed = [get(r, "Instructions Executed") for r in data]
    samples = [get(r, "Warp Stall Sampling (All Samples)") for r in data]
    excess = [get(r, "L1 Wavefronts Shared Excessive") for r in data]
    total, sampled = sum(executed) or 1.0, sum(samples) or 1.0
    print(f"{len(data)} instructions, {total:,.0f} executed (warp level), {sampled:,.0f} stall samples, "
          f"{sum(excess):,.0f} excessive shared wavefronts")
    by_op = collections.Counter()
    for row, n in zip(data, executed):
        by_op[opcode(row[col["Source"]])] += n
    print("by opcode: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(16)))
    windows = []
    for start in range(0, len(data), args.window):
        end = min(start + args.window, len(data))
        windows.append((sum(executed[start:end]), start, end))
    print(f"\nhottest windows of {args.window} (instructions, stall samples, excessive wavefronts):")
    for n, start, end in sorted(windows, reverse=True)[: args.top]:
        ops = collections.Counter()
        for row, k in zip(data[start:end], executed[start:end]):
            ops[opcode(row[col["Source"]])] += k
        mix = " ".join(f"{op}:{100 * k / (n or 1):.0f}" for op, k in ops.most_common(6))
        print(f"  {start:5d}-{end:<5d} {100 * n / total:5.1f}% {100 * sum(samples[start:end]) / sampled:5.1f}% "
              f"{sum(excess[start:end]):9,.0f}  {mix}")
    if args.dump:
        start, end = (int(x) for x in args.dump.split(":"))
        for row, n in zip(data[start:end], executed[start:end]):
            print(f"{n:10,.0f}  {row[col['Source']].strip()}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Prints the totals of a `cargo test` log (passed/failed/ignored over all test binaries) and
the lines the golden tests print with their counts; exits 1 when any test failed."""
import re
import sys

passed = failed = ignored = 0
failed_names = []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", line)
    if m:
        passed += int(m.group(2))
        failed += int(m.group(3))
        ignored += int(m.group(4))
    m = re.match(r"test (\S+) \.\.\. FAILED", line)
    if m:
        failed_names.append(m.group(1))
print(f"\n=== test summary: {passed} passed, {failed} failed, {ignored} ignored ===")
for name in failed_names:
    print(f"FAILED: {name}")
sys.exit(1 if failed or failed_names else 0)

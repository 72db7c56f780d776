#!/usr/bin/env python3
"""Replaces the section of RESULTS.md between `<!-- NAME:start -->` and
`<!-- NAME:end -->` with the contents of a file, so the benchmark scripts
keep RESULTS.md current: scripts/results-splice.py NAME FILE [RESULTS.md]."""
import sys

name, src = sys.argv[1], sys.argv[2]
target = sys.argv[3] if len(sys.argv) > 3 else "RESULTS.md"
start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
text = open(target).read()
if start not in text or end not in text:
    sys.exit(f"results-splice: {target} has no {start} ... {end} section")
body = open(src).read().strip()
head, rest = text.split(start, 1)
_, tail = rest.split(end, 1)
open(target, "w").write(f"{head}{start}\n{body}\n{end}{tail}")
print(f"results-splice: updated the {name} section of {target} from {src}")

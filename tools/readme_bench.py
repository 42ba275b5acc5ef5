#!/usr/bin/env python3
"""Copies benchmark output into README.md verbatim: `tools/readme_bench.py [FILE [NAME]]` puts
FILE (default build/bench.txt, the `make bench` output) between the markers
<!-- bench:begin --> and <!-- bench:end -->, or, with NAME, between <!-- bench:NAME:begin -->
and <!-- bench:NAME:end --> (a bench run outside `make bench`, e.g. under mpirun, saved under
results/). Numbers are never typed by hand: this script is the only way they reach the README."""
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "build/bench.txt"
name = sys.argv[2] if len(sys.argv) > 2 else ""
text = open(src).read().rstrip()
readme = open("README.md").read()
tag = f"bench:{name}:" if name else "bench:"
begin, end = f"<!-- {tag}begin -->", f"<!-- {tag}end -->"
if begin not in readme or end not in readme:
    sys.exit(f"README.md has no {begin} / {end} markers")
head, rest = readme.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + "\n```\n" + text + "\n```\n" + end + tail)
print(f"README.md: {begin} section replaced from {src}")

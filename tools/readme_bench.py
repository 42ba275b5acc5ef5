#!/usr/bin/env python3
"""Copies `make bench` output (build/bench.txt, or the file given) into README.md verbatim,
between the markers <!-- bench:begin --> and <!-- bench:end -->. Numbers are never typed by hand:
this script is the only way they reach the README."""
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "build/bench.txt"
text = open(src).read().rstrip()
readme = open("README.md").read()
begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
if begin not in readme or end not in readme:
    sys.exit("README.md has no bench markers")
head, rest = readme.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + "\n```\n" + text + "\n```\n" + end + tail)
print(f"README.md: bench section replaced from {src}")

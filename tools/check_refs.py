#!/usr/bin/env python3
"""Every reference to the docs points somewhere.

Scans the source, scripts, configs and markdown of the repository (not build/, results/ or
.git) for:
  - FILE.md#ANCHOR (a comment's `docs/design.md#cgspn-layer`, a markdown link's
    `design.md#losses`): FILE must exist, relative to the referencing file's folder or to the
    root, and ANCHOR must be one of its anchors: an explicit <a id="ANCHOR"> or a heading's slug
    (lower case, punctuation dropped, spaces to hyphens, as GitHub makes them);
  - markdown links to a local file, [text](PATH) or [text](PATH#ANCHOR): PATH must exist;
  - the old section form "DESIGN §N", which names a file outside the repository.
Prints one line per dangling reference (FILE:LINE: what) and exits 1 when there is any.

Usage: tools/check_refs.py [ROOT]   (ROOT defaults to the repository this script is in)
"""
import os
import re
import sys

EXTS = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".md", ".cfg")
SKIP = {"build", "results", ".git"}
# This checker and its test name dangling references on purpose.
SELF = {"tools/check_refs.py", "tests/test_doc_refs.sh"}
ANCHORED = re.compile(r"([\w./-]*[\w-]+\.md)#([a-z0-9][\w-]*)")   # anchors are lower case
MD_LINK = re.compile(r"\]\(([^)\s#]+)(#[\w-]+)?\)")
OLD_FORM = re.compile(r"DESIGN §\d")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        text = open(path, encoding="utf-8", errors="replace").read()
        found = set(re.findall(r'<a\s+id="([\w-]+)"', text))
        found |= {slug(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}
        cache[path] = found
    return cache[path]


def resolve(root, here, target):
    """The existing file target names, from the referencing file's folder or the root."""
    for base in (os.path.join(root, os.path.dirname(here)), root):
        p = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(p):
            return p
    return None


def files(root):
    for dirpath, dirs, names in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        if top in SKIP or (top.startswith(".") and top != "."):
            dirs[:] = []
            continue
        for name in sorted(names):
            if name.endswith(EXTS) or name == "Makefile":
                yield os.path.relpath(os.path.join(dirpath, name), root)


def check(root):
    problems = []
    for rel in sorted(f for f in files(root) if f not in SELF):
        text = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read()
        for n, line in enumerate(text.split("\n"), 1):
            where = f"{rel}:{n}"
            if OLD_FORM.search(line):
                problems.append(f"{where}: \"DESIGN §\" names a file outside the repository; "
                                "link docs/design.md#ANCHOR instead")
            for m in ANCHORED.finditer(line):
                target, anchor = m.group(1), m.group(2)
                path = resolve(root, rel, target)
                if path is None:
                    problems.append(f"{where}: {target}#{anchor}: no file {target}")
                elif anchor not in anchors_of(path):
                    problems.append(f"{where}: {target}#{anchor}: {os.path.relpath(path, root)} "
                                    f"has no anchor '{anchor}'")
            if rel.endswith(".md"):
                for m in MD_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target) or target.endswith(".md") and m.group(2):
                        continue   # a URL; or an anchored link, checked above
                    if resolve(root, rel, target) is None and \
                            not os.path.isdir(os.path.join(root, os.path.dirname(rel), target)):
                        problems.append(f"{where}: link to {target}: no such file")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(f"check_refs: {p}")
    if problems:
        print(f"check_refs: {len(problems)} references point nowhere")
        return 1
    print("check_refs: every docs reference points somewhere")
    return 0


if __name__ == "__main__":
    sys.exit(main())

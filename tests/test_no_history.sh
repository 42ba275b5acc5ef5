#!/usr/bin/env bash
# Code speaks of the project, not of how it was built: no "issue N", "session" or "before this
# fix" in the source, scripts and program output strings (git log holds the history). Checks the
# tree, then that a planted line in a copy is found and named.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
pattern='\bissues? [0-9]+|\bsessions?\b|before this fix'
files() {   # the source and scripts under the current folder (not build outputs, not markdown;
            # not this file, which must name the words)
    find . \( -path ./build -o -path ./.git -o -path './.*' \) -prune -o -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
           -o -name '*.sh' -o -name Makefile \) -print | grep -v '^./tests/test_no_history.sh$' | sort
}
scan() {   # $1: a root; prints FILE:LINE: text of each hit
    (cd "$1" && files | xargs -r grep -H -n -i -E "$pattern" -- | sed 's|^\./||')
}
fail=0
hits=$(scan "$root")
if [ -z "$hits" ]; then
    echo "[       OK ] no history words in the code"
else
    echo "[  FAILED  ] history words in the code (say what the code does; git log keeps the story):"
    echo "$hits" | sed 's/^/    /'
    fail=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/nn" && printf '// fixed in %s %d\nint x;\n' issue 12 > "$tmp/nn/planted.c"
if scan "$tmp" | grep -q 'nn/planted.c:1:'; then
    echo "[       OK ] a planted history line is found and named"
else
    echo "[  FAILED  ] a planted history line was not found"
    fail=1
fi
exit $fail

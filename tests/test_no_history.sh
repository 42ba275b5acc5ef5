#!/usr/bin/env bash
# The repository speaks of the project, not of how it was built, and stands alone: no issue
# numbers, no work-period names and no before-and-after stories in the source, scripts, docs and program
# output strings (git log holds the history), and no path into the folder above the repository.
# Measured logs under results/ are left as they were written. Checks the tree, then that planted
# lines in a copy are found and named. The words are assembled at run time, so this file does
# not match itself.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
w_issue="iss""ue"
w_period="sess""ion"
w_above="\.\./sha""red"
w_fix="before this f""ix"
pattern="\b${w_issue}s? [0-9]+|\b${w_issue}'s\b|\b${w_issue} asks\b|\b${w_period}s?\b|${w_fix}|${w_above}"
files() {   # the source, scripts and docs under the current folder (not build outputs or logs)
    find . \( -path ./build -o -path ./.git -o -path ./results -o -path './.*' \) -prune -o -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
           -o -name '*.sh' -o -name '*.md' -o -name '*.cfg' -o -name Makefile \) -print | sort
}
scan() {   # $1: a root; prints FILE:LINE: text of each hit
    (cd "$1" && files | xargs -r grep -H -n -i -E "$pattern" -- | sed 's|^\./||')
}
fail=0
hits=$(scan "$root")
if [ -z "$hits" ]; then
    echo "[       OK ] no history words and no path above the repository"
else
    echo "[  FAILED  ] history words or paths above the repository (say what the code does; git log keeps the story):"
    echo "$hits" | sed 's/^/    /'
    fail=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/nn" "$tmp/docs"
printf '// fixed in %s %d\n// 1e-4 (the %s'"'"'s bound)\nint x;\n' "$w_issue" 12 "$w_issue" > "$tmp/nn/planted.c"
printf 'See ../%s/DESIGN.md.\n' "sha""red" > "$tmp/docs/planted.md"
out=$(scan "$tmp")
if grep -q 'nn/planted.c:1:' <<<"$out" && grep -q 'nn/planted.c:2:' <<<"$out" &&
   grep -q 'docs/planted.md:1:' <<<"$out"; then
    echo "[       OK ] planted lines (code and docs) are found and named"
else
    echo "[  FAILED  ] a planted line was not found: $out"
    fail=1
fi
exit $fail

#!/usr/bin/env bash
# tools/check_refs.py passes on the tree and fails, naming file and line, on a copy with planted
# dangling references: an anchor that no heading makes, a file that does not exist, the old
# outside-the-repository section form and a markdown link to nothing.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
check="$root/tools/check_refs.py"
source "$root/tests/expect.sh"   # expect NAME COND; fail
out=$(python3 "$check" "$root"); rc=$?
expect "every docs reference in the tree points somewhere" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || echo "$out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/nn"
printf '# Design\n\n<a id="cgspn-layer"></a>\n## The layer\n' > "$tmp/docs/design.md"
printf '// docs/design.md#cgspn-layer\n// docs/design.md#the-layer\n' > "$tmp/nn/good.c"
printf '// docs/design.md#no-such-anchor\n// docs/missing.md#x\n// DESIGN \302\2475\n' > "$tmp/nn/bad.c"
printf 'See [the layer](design.md#cgspn-layer) and [gone](gone.md).\n' > "$tmp/docs/page.md"
out=$(python3 "$check" "$tmp"); rc=$?
expect "planted dangling references fail the check" "[ $rc -eq 1 ]"
expect "an anchor nothing makes is named" "grep -q 'nn/bad.c:1: docs/design.md#no-such-anchor' <<<\"\$out\""
expect "a missing file is named" "grep -q 'nn/bad.c:2: docs/missing.md#x: no file' <<<\"\$out\""
expect "the old section form is named" "grep -q 'nn/bad.c:3: \"DESIGN' <<<\"\$out\""
expect "a markdown link to nothing is named" "grep -q 'docs/page.md:1: link to gone.md' <<<\"\$out\""
expect "an explicit anchor and a heading's slug both resolve" "! grep -q 'good.c' <<<\"\$out\""
expect "exactly the four planted problems" "[ \$(grep -c '^check_refs: [a-z]*/' <<<\"\$out\") -eq 4 ]"
[ $fail -eq 0 ] || echo "$out"
exit $fail

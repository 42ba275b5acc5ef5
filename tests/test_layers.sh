#!/usr/bin/env bash
# tools/check_layers.py passes on the tree and fails, naming the file, on a copy of the tree
# with a planted upward include (kernels/ -> nn/), a backend include in train/, a CGSPN_CUDA
# test in nn/ and two units of nn/ that call each other.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
check="$root/tools/check_layers.py"
source "$root/tests/expect.sh"   # expect NAME COND; fail

out=$(python3 "$check" "$root"); rc=$?
expect "the tree's includes point down" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || echo "$out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for d in kernels nn data dist train bench app; do cp -r "$root/$d" "$tmp/"; done
python3 "$check" "$tmp" >/dev/null
expect "a clean copy passes" "[ $? -eq 0 ]"

printf '#include "../../nn/tape.h"\n' >> "$tmp/kernels/cpu/gelu.c"
printf '#include "../kernels/cuda/cuda_common.h"\n' >> "$tmp/train/eval.c"
printf '#ifdef CGSPN_CUDA\n#endif\n' >> "$tmp/nn/tape.c"
printf 'int loop_a(int x);\n' > "$tmp/nn/loop_a.h"
printf 'int loop_b(int x);\n' > "$tmp/nn/loop_b.h"
printf '#include "loop_a.h"\n#include "loop_b.h"\nint loop_a(int x) { return x ? loop_b(x - 1) : 0; }\n' > "$tmp/nn/loop_a.c"
printf '#include "loop_b.h"\n#include "loop_a.h"\nint loop_b(int x) { return loop_a(x); }\n' > "$tmp/nn/loop_b.c"
out=$(python3 "$check" "$tmp"); rc=$?
expect "planted violations fail the check" "[ $rc -eq 1 ]"
expect "kernels/ -> nn/ is named" "grep -q 'kernels/cpu/gelu.c:[0-9]*: includes nn/tape.h' <<<\"\$out\""
expect "train/ -> kernels/cuda/ is named" "grep -q 'train/eval.c:[0-9]*: includes kernels/cuda/cuda_common.h' <<<\"\$out\""
expect "CGSPN_CUDA in nn/ is named" "grep -q 'nn/tape.c:[0-9]*: tests CGSPN_CUDA' <<<\"\$out\""
expect "the loop of units in nn/ is named" "grep -q 'nn/: units call each other in a loop loop_a -> loop_b -> loop_a' <<<\"\$out\""
expect "exactly the four planted problems" "[ \$(grep -c '^check_layers: [a-z]*/' <<<\"\$out\") -eq 4 ]"
[ $fail -eq 0 ] || echo "$out"
exit $fail

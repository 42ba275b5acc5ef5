#!/bin/bash
# tools/ncu_stalls.py on a planted source page: three instructions, two of them in a loop that
# ran 8 times as often as the one outside it, and a kernel-name line before the header. Checks
# the totals, the reasons (the Not Issued columns left out), the opcode (predicate and modifiers
# stripped), the classes by times run and the top list's order and reasons; then the refusal of
# a file without the header.
cd "$(dirname "$0")/.."
source tests/expect.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/src.csv" <<'CSV'
"Kernel Name","void k(int)"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_long_sb","stall_wait","stall_long_sb (Not Issued)"
"0x10","  LDG.E.CONSTANT R2, desc[UR4][R4.64]","10","9","100","0","9","1","9"
"0x20","@!P0  BRA 0x10","60","60","800","0","58","2","58"
"0x30","  FADD R3, R2, R2","30","28","800","20","6","4","6"
CSV
out=$(python3 tools/ncu_stalls.py "$tmp/src.csv" --top 2)
has() { printf '%s\n' "$out" | grep -Eq "$1"; }
expect "the totals" 'has "^samples 100, warp instructions executed 1700$"'
expect "the reasons summed, the Not Issued columns left out" 'has "^  stall_long_sb +73 +73.0%$"'
expect "the opcode without its predicate" 'has "^  BRA +60 +60.0% +800$"'
expect "the opcode without its modifiers" 'has "^  LDG +10 +10.0% +100$"'
expect "the loop's class" 'has "^  ran +800 times: +90 samples +90.0%$"'
expect "the class outside the loop" 'has "^  ran +100 times: +10 samples +10.0%$"'
top=$(printf '%s\n' "$out" | sed -n '/^top 2 instructions/,$p' | tail -n +2)
expect "the top instruction first, with its reasons" \
    'printf "%s\n" "$top" | head -1 | grep -Eq "BRA 0x10 +\[stall_long_sb 58, stall_wait 2\]$"'
expect "the second" 'printf "%s\n" "$top" | sed -n 2p | grep -Eq "FADD R3, R2, R2 +\[stall_barrier 20, stall_long_sb 6\]$"'
expect "--top 2 lists two" '[ "$(printf "%s\n" "$top" | wc -l)" -eq 2 ]'
printf '"a","b"\n"1","2"\n' > "$tmp/bad.csv"
err=$(python3 tools/ncu_stalls.py "$tmp/bad.csv" 2>&1)
rc=$?
expect "a file without the header: exit 1" '[ "$rc" -eq 1 ]'
expect "... and the message names it" 'printf "%s\n" "$err" | grep -q "no header row starting with \"Address\""'
exit $fail

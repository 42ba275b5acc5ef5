#!/usr/bin/env bash
# Everything a GPU build is checked with, in one go (what the maintainers run on an H100/H200):
#   make test-gpu            every CUDA op against the CPU reference (+ the torch wrapper test)
#   tests/parity_timm.py     features and gradients against timm (fp32 and bf16)
#   tests/parity_distill.py  a Stage 1 / Stage 2 distillation loss and gradients against PyTorch
#   tests/parity_gspn_hier.py gspn_t's features and gradients against a PyTorch reference
#   make bench               the benchmarks; output kept in build/bench.txt
# Logs go to ${OUT:-build}/gpu_check_*.log. Usage: tools/gpu_check.sh [test|parity|bench ...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build}
mkdir -p "$out"
steps=${*:-test parity bench}
status=0
for s in $steps; do
    case $s in
    test)   make -j"$(nproc)" test-gpu 2>&1 | tee "$out/gpu_check_test.log" || status=1 ;;
    parity) python3 tests/parity_timm.py 2>&1 | tee "$out/gpu_check_parity.log" || status=1
            python3 tests/parity_distill.py 2>&1 | tee "$out/gpu_check_parity_distill.log" || status=1
            python3 tests/parity_gspn_hier.py 2>&1 | tee "$out/gpu_check_parity_gspn_hier.log" || status=1 ;;
    bench)  make bench 2>&1 | tee "$out/gpu_check_bench.log" || status=1
            cp build/bench.txt "$out/bench.txt" 2>/dev/null ;;
    *) echo "unknown step $s (test, parity, bench)"; exit 2 ;;
    esac
done
exit $status

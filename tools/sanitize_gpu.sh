#!/usr/bin/env bash
# Runs every GPU test binary (build/tests/gpu/test_*) under NVIDIA compute-sanitizer's tools:
#   memcheck    out-of-bounds and misaligned accesses, API errors, and leaks (--leak-check full)
#   racecheck   shared-memory hazards between threads of a block
#   initcheck   reads of device memory that nothing wrote
# with CGSPN_GPU_TEST_SMALL=1 (the tests whose full shapes take minutes under the sanitizer use
# fewer, smaller shapes that still cover every kernel path; tests/gpu/gpulib.h) and
# CGSPN_SANITIZE=1 (the outputs of cuBLASLt, CUTLASS and cuDNN are zeroed before those libraries
# write them, which initcheck does not see: kernels/cuda/cuda_common.h). racecheck leaves out
# cuDNN's generated SDPA kernels (their names hold "_flash_"): third-party code, whose shared-memory
# hazards it reported inside those kernels alone.
# Usage: tools/sanitize_gpu.sh [TOOLS...]   (default: memcheck racecheck initcheck)
#   SANITIZE_JOBS=N      runs at once (default: the core count, at most 12)
#   SANITIZE_TESTS="test_a_gpu test_b_gpu"   only these test binaries (default: all)
#   SANITIZE_TIMEOUT=S   seconds one run may take (default 900); a run stopped by it is a failure
#                        (racecheck on the resume tests and initcheck on test_attention_gpu take
#                        over 5 minutes on an H200; one tool per call where calls are capped)
# Each run's report is in build/sanitize/TOOL-TEST.log. Prints one line per run (the tool's error
# count, the test's exit status, seconds), then a summary; exits 1 unless every run reported 0
# errors and passed.
set -uo pipefail
cd "$(dirname "$0")/.."
tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck initcheck)
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$san" ] || { echo "sanitize-gpu: compute-sanitizer not found (it ships with the CUDA toolkit: /usr/local/cuda/bin)"; exit 1; }
bins=()
for f in build/tests/gpu/test_*; do
    name=$(basename "$f")
    [[ -x $f && $name != *.* ]] || continue
    [[ -z ${SANITIZE_TESTS:-} || " $SANITIZE_TESTS " == *" $name "* ]] && bins+=("$f")
done
[ ${#bins[@]} -gt 0 ] || { echo "sanitize-gpu: no GPU test binaries in build/tests/gpu (make test-gpu builds them)"; exit 1; }
out=build/sanitize
mkdir -p "$out"
rm -f "$out"/*.log "$out"/*.result
jobs=${SANITIZE_JOBS:-$(nproc)}
[ "$jobs" -gt 12 ] && jobs=12
limit=${SANITIZE_TIMEOUT:-900}

# One run: TOOL BINARY -> build/sanitize/TOOL-NAME.{log,result}; the result line is
# "TOOL NAME ERRORS RC SECONDS" (ERRORS "?" when the tool printed no summary, e.g. a timeout).
run_one() {
    local tool=$1 bin=$2 name log extra=()
    name=$(basename "$bin")
    log=$out/$tool-$name.log
    case $tool in
    memcheck) extra=(--leak-check full) ;;
    racecheck) extra=(--kernel-name-exclude kns=_flash_) ;;   # cuDNN's own SDPA kernels (cgspn's are flash_fwd_kernel, flash_bwd_*)
    esac
    local t0=$SECONDS rc
    CGSPN_GPU_TEST_SMALL=1 CGSPN_SANITIZE=1 timeout -s KILL "$limit" "$san" --tool "$tool" "${extra[@]}" \
        --print-limit 20 "$bin" >"$log" 2>&1
    rc=$?
    # memcheck/initcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: N hazards
    # displayed (E errors, W warnings)": its errors and warnings both count.
    local errs
    if [ "$tool" = racecheck ]; then
        errs=$(sed -n 's/.*RACECHECK SUMMARY: [0-9]* hazards displayed (\([0-9]*\) errors, \([0-9]*\) warnings).*/\1 \2/p' "$log" |
               awk '{s += $1 + $2; n++} END {print n ? s : "?"}')
    else
        # (past the print limit a second line, "ERROR SUMMARY: M errors were not printed", follows)
        errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors*$/\1/p' "$log" | awk '{s += $1; n++} END {print n ? s : "?"}')
    fi
    echo "$tool $name $errs $rc $((SECONDS - t0))" >"$out/$tool-$name.result"
    printf '  %-10s %-28s errors %-4s exit %-3s %5ss\n' "$tool" "$name" "$errs" "$rc" "$((SECONDS - t0))"
}
export -f run_one
export out san limit

echo "sanitize-gpu: ${tools[*]} over ${#bins[@]} test binaries, $jobs at a time (reports in $out/)"
for tool in "${tools[@]}"; do for bin in "${bins[@]}"; do echo "$tool $bin"; done; done |
    xargs -P "$jobs" -n 2 bash -c 'run_one "$0" "$1"'

bad=0 runs=0
for f in "$out"/*.result; do
    read -r tool name errs rc secs <"$f"
    runs=$((runs + 1))
    if [ "$errs" != 0 ] || [ "$rc" != 0 ]; then
        bad=$((bad + 1))
        echo "!! $tool $name: errors $errs, exit $rc (see $out/$tool-$name.log); its first reports:"
        grep -E '^========= +(Invalid|Uninitialized|Race|Error|Warning|Potential|Program hit|Leaked|[A-Z][a-z]+ .*(hazard|error))|^========= +at ' \
            "$out/$tool-$name.log" | head -8 | sed 's/^/     /'
    fi
done
for tool in "${tools[@]}"; do
    errs=$(cat "$out"/"$tool"-*.result | awk '{ if ($3 == "?") q = 1; else s += $3 } END {print q ? "?" : s}')
    echo "sanitize-gpu: $tool: $errs errors over $(ls "$out"/"$tool"-*.result | wc -l) binaries"
done
if [ $bad -ne 0 ]; then echo "make sanitize-gpu: FAILED ($bad of $runs runs)"; exit 1; fi
echo "make sanitize-gpu: clean ($runs runs, 0 errors)"

#!/usr/bin/env bash
# The data-parallel checks on a machine with two GPUs, in under 5 minutes:
#   1. 2 GPUs x b images equal 1 GPU x 2b (fp32: losses and weights to round-off), cgspn train
#      and distill Stage 2, zero = 0 and 1; a 2-rank bf16 run stopped and resumed is bit-exact
#      (tests/test_dist_train.c with CGSPN_TEST_DEVICE=cuda); the same for two-teacher Stage 2
#      and for gspn_hier on the JPEG ImageFolder tree
#   2. the NCCL layer's own tests (tests/gpu/test_dist_nccl.c: bucketed all-reduce, ZeRO-1 step,
#      a hung rank aborting the communicator)
#   3. faults: a rank killed or frozen mid-run stops the job within 60 s naming it, no process
#      left, the newest complete checkpoint resumes (tests/test_dist_fault.sh, on the GPUs)
#   4. cgspn bench distill: Stage 2 img/s of the so14 student on 1 and 2 GPUs, zero = 0 and 1;
#      PASS when scaling >= 1.9
# then a PASS/FAIL summary; the exit status is 1 when anything failed. Logs: build/dist_check/.
# Usage (repository root, after make -j16 cgspn):  bash tools/dist_device_check.sh
# NCCL_NVLS_ENABLE=0 throughout (NVLink multicast must stay off on these machines).
# BENCH_OVERLAP_OFF=1 adds a zero = 0 bench with every bucket launched after backward (for
# comparison; about 30 s more, not part of the pass/fail).
# DIST_CHECK_DEVICE=cpu runs the same sequence on the CPU with tiny models (the script's own
# test on a machine without GPUs: the scaling there is not expected to reach the bound).
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}   # 16 cores, 2 ranks
np=2
min_scaling=1.9
bench_steps=${BENCH_STEPS:-8}
logs=build/dist_check
mkdir -p "$logs"
mode=${DIST_CHECK_DEVICE:-cuda}
mpirun_cmd=${MPIRUN:-mpirun --oversubscribe --bind-to none}
[ "$(id -u)" = 0 ] && mpirun_cmd="$mpirun_cmd --allow-run-as-root"
# Ranks on this node inherit mpirun's environment (NCCL_NVLS_ENABLE, OMP_NUM_THREADS, ...).
if [ "$mode" = cpu ]; then
    export OMP_NUM_THREADS=1
    test_device=""
    bench_args=(configs/cgspn_tiny.cfg --teacher_config=configs/vit_tiny.cfg --device=cpu
                --precision=fp32 --batch_size=4 --taps=all)
else
    test_device=cuda
    bench_args=()   # the so14 student, the vit_so14 teacher, 378 px, 32 images per GPU
fi
t_start=$(date +%s)
names=() states=() details=()

record() {   # name, PASS|FAIL, detail
    names+=("$1"); states+=("$2"); details+=("$3")
    printf '%-44s %s  %s\n' "$1" "$2" "$3"
}

elapsed() { echo $(( $(date +%s) - t_start )); }

echo "== dist_device_check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/   GPU /'
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$mode" != cpu ] && [ "$gpus" -lt 2 ]; then
    echo "dist_device_check: needs 2 GPUs, found $gpus"; exit 1
fi

# ---- build -------------------------------------------------------------------------------------
echo "== build (cgspn and the test binaries)"
targets=(cgspn build/tests/test_dist_train build/tests/test_dist_mpi)
[ "$mode" = cpu ] || targets+=(build/tests/gpu/test_dist_nccl)
if ! make -j16 "${targets[@]}" \
        >"$logs/build.log" 2>&1; then
    tail -30 "$logs/build.log"
    record "build" FAIL "see $logs/build.log"
    exit 1
fi
record "build" PASS "$(elapsed) s"

# ---- 1. equivalence and resume on two GPUs --------------------------------------------------------
echo "== 1. 2 GPUs x b vs 1 GPU x 2b (fp32), bit-exact 2-rank resume (bf16)"
CGSPN_TEST_DEVICE=$test_device timeout -k 10 240 $mpirun_cmd -np $np build/tests/test_dist_train \
    >"$logs/test_dist_train.log" 2>&1
rc=$?
grep -E "rel |differ|^\[ +(OK|FAILED|PASSED) +\]" "$logs/test_dist_train.log" | grep -v "^\[#" | sed 's/^/   /'
if [ $rc -eq 0 ]; then
    record "train + distill: 2 x b == 1 x 2b (fp32)" PASS "losses and weights within the tolerances"
    record "2-rank bf16 resume bit-exact" PASS "losses, logs, model, state, shards"
else
    tail -40 "$logs/test_dist_train.log" | sed 's/^/   /'
    fails=$(grep -E "^\[  FAILED  \] test_" "$logs/test_dist_train.log" | sort -u | tr '\n' ' ')
    [ $rc -eq 124 ] && fails="timed out after 150 s; $fails"
    record "test_dist_train on 2 GPUs" FAIL "${fails:-exit $rc; see $logs/test_dist_train.log}"
fi

# ---- 2. the NCCL layer ------------------------------------------------------------------------------
if [ "$mode" != cpu ]; then
    echo "== 2. tests/gpu/test_dist_nccl (forked ranks, one GPU each)"
    timeout -k 10 120 build/tests/gpu/test_dist_nccl >"$logs/test_dist_nccl.log" 2>&1
    rc=$?
    grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) +\]" "$logs/test_dist_nccl.log" | sed 's/^/   /'
    if [ $rc -eq 0 ]; then record "NCCL buckets, ZeRO-1, hung rank" PASS ""
    else record "NCCL buckets, ZeRO-1, hung rank" FAIL "exit $rc; see $logs/test_dist_nccl.log"; fi
fi

# ---- 3. faults -----------------------------------------------------------------------------------------
echo "== 3. faults: mpirun cases, then cgspn train on the GPUs with rank 1 killed / frozen"
FAULT_DEVICE=${test_device:-cpu} MPIRUN="$mpirun_cmd" timeout -k 10 150 bash tests/test_dist_fault.sh \
    build/tests/test_dist_mpi ./cgspn >"$logs/fault.log" 2>&1
rc=$?
sed 's/^/   /' "$logs/fault.log" | grep -E "OK|FAILED|cgspn:|mpirun noticed|Process name" | head -20
if [ $rc -eq 0 ]; then record "faults (hang, exit, kill, stop)" PASS "every job stopped in time naming rank 1"
else record "faults (hang, exit, kill, stop)" FAIL "see $logs/fault.log"; fi

# ---- 4. scaling -----------------------------------------------------------------------------------------
for zero in 0 1; do
    echo "== 4. cgspn bench distill ${bench_args[*]:-(so14 student, vit_so14 teacher, 378 px)}, zero = $zero"
    log="$logs/bench_zero$zero.log"
    timeout -k 10 200 $mpirun_cmd -np $np ./cgspn bench distill "${bench_args[@]}" --zero=$zero \
        --steps="$bench_steps" --warmup=2 --profile=1 >"$log" 2>&1
    rc=$?
    sed -n '/^distill Stage 2/,$p' "$log" | grep -v "^note" | sed 's/^/   /'
    scaling=$(sed -n 's/^scaling [0-9]* GPUs \/ 1 GPU: \([0-9.]*\).*/\1/p' "$log" | tail -1)
    if [ $rc -ne 0 ] || [ -z "$scaling" ]; then
        tail -20 "$log" | sed 's/^/   /'
        record "bench distill zero=$zero" FAIL "exit $rc; see $log"
    elif awk -v s="$scaling" -v m="$min_scaling" 'BEGIN { exit !(s >= m) }'; then
        record "bench distill zero=$zero" PASS "scaling ${scaling}x >= ${min_scaling}x"
    else
        record "bench distill zero=$zero" FAIL "scaling ${scaling}x < ${min_scaling}x"
    fi
done

if [ "${BENCH_OVERLAP_OFF:-0}" = 1 ]; then
    echo "== 4b. cgspn bench distill, zero = 0, overlap = 0 (for comparison)"
    timeout -k 10 200 $mpirun_cmd -np $np ./cgspn bench distill "${bench_args[@]}" --zero=0 --overlap=0 \
        --steps="$bench_steps" --warmup=2 >"$logs/bench_overlap0.log" 2>&1
    sed -n '/^| GPUs/,$p' "$logs/bench_overlap0.log" | sed 's/^/   /'
fi

# ---- summary ---------------------------------------------------------------------------------------------
echo
echo "== summary ($(elapsed) s; logs in $logs/)"
bad=0
for i in "${!names[@]}"; do
    printf '%-6s %-44s %s\n' "${states[$i]}" "${names[$i]}" "${details[$i]}"
    [ "${states[$i]}" = PASS ] || bad=1
done
if [ $bad -eq 0 ]; then echo "dist_device_check: ALL PASS"; else echo "dist_device_check: FAILED"; fi
exit $bad

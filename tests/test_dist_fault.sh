#!/usr/bin/env bash
# Faults under mpirun: with dist_timeout_s = 3, a rank that hangs, or exits, makes the
# job end well within 60 s with a message naming that rank, and leaves no process behind.
# With a cgspn binary as well, the same for a real `cgspn train` of 2 ranks: one rank killed
# (SIGKILL) or frozen (SIGSTOP) mid-run, after which the newest complete checkpoint must still
# resume; and SIGTERM to one rank of `cgspn distill` and `cgspn curriculum`: a checkpoint, exit 0
# on every rank, and a resume that ends on the uninterrupted run's bytes.
# Usage: tests/test_dist_fault.sh build/tests/test_dist_mpi [./cgspn]   (MPIRUN: mpirun + options)
set -u
bin=${1:?usage: test_dist_fault.sh PATH/test_dist_mpi [PATH/cgspn]}
cgspn=${2:-}
# Absolute paths: the "no process left" checks look for this checkout's binaries only (other
# checkouts may run the same test at the same time).
bin=$(readlink -f "$bin")
[ -n "$cgspn" ] && cgspn=$(readlink -f "$cgspn")
device=${FAULT_DEVICE:-cpu}   # cuda: the training runs on GPUs (NCCL), one per rank
mpirun_cmd=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
limit=30      # seconds: timeout 3 s + mpirun's teardown, far below the 60 s promised
fail=0

run_case() {   # $1 = hang | probe | exit, $2 = a pattern the output must contain
    local mode=$1 want=$2 out start end rc
    out=$(mktemp)
    start=$(date +%s.%N)
    timeout -k 5 $((limit + 30)) $mpirun_cmd -np 2 "$bin" --fault="$mode" >"$out" 2>&1
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    local ok=1
    [ "$rc" -ne 0 ] || { echo "  $mode: the job exited 0; expected a failure"; ok=0; }
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "  $mode: the job did not end by itself"; ok=0; }
    grep -Eq -- "$want" "$out" || { echo "  $mode: the output does not contain '$want'"; ok=0; }
    awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s < l) }' || { echo "  $mode: took ${secs} s"; ok=0; }
    if pgrep -f -- "$bin --fault=$mode" >/dev/null; then
        echo "  $mode: a rank outlived the job"; ok=0
    fi
    if [ $ok -eq 1 ]; then
        echo "[       OK ] rank 1 ${mode}: the job stopped in ${secs} s naming it"
        grep -E -m1 -- "$want" "$out" | sed 's/^/             /'
    else
        echo "[  FAILED  ] rank 1 ${mode} (exit $rc, ${secs} s); output:"
        sed 's/^/    /' "$out"
        fail=1
    fi
    rm -f "$out"
}

run_case hang "waited 3.0 s for rank 1"
run_case probe "rank\\(s\\) 1 did not answer"
# A rank that exits is mpirun's to report: it names the process as [[JOB,1],RANK] and kills the
# others at once (our deadline never comes into play).
run_case exit "rank 1|\\[\\[[0-9]+,1\\],1\\]"

[ -n "$cgspn" ] || exit $fail

# ---- a real training run ------------------------------------------------------------------------
work=$(mktemp -d /tmp/cgspn_fault.XXXXXX)
trap 'rm -rf "$work"' EXIT

be32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }
write_idx() {   # $1 = file prefix, $2 = image count: random 28x28 pixels, labels 0..9 in turn
    local n=$2 i labels=""
    { printf "$(be32 2051)$(be32 "$n")$(be32 28)$(be32 28)"; head -c $((n * 784)) /dev/urandom; } >"$1-images-idx3-ubyte"
    for ((i = 0; i < n; i++)); do labels+=$(printf '\\x%02x' $((i % 10))); done
    { printf "$(be32 2049)$(be32 "$n")"; printf "$labels"; } >"$1-labels-idx1-ubyte"
}
mkdir -p "$work/idx"
write_idx "$work/idx/train" 512
write_idx "$work/idx/t10k" 64
"$cgspn" data build --from idx "$work/idx" --out "$work/shards" --quiet >/dev/null ||
    { echo "[  FAILED  ] cgspn data build of the fault test's shards"; exit 1; }

# The pid of rank $2 among the processes whose command line holds $1 (mpirun sets
# OMPI_COMM_WORLD_RANK in each rank's environment).
rank_pid() {
    local p
    for p in $(pgrep -f -- "$1"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"; return 0
        fi
    done
    return 1
}

train_case() {   # $1 = KILL | STOP (the signal rank 1 gets), $2 = a pattern the output must contain
    local sig=$1 want=$2 run="fault_$1" out="$work/$1.out" ok=1
    local args=(train configs/cgspn_tiny.cfg "--data_shards=$work/shards" "--out_dir=$work"
                "--run_name=$run" "--device=$device" --max_steps=100000 --ckpt_every=5 --log_every=1
                --batch_size=8 --eval_batch_size=8 --eval_every=100000 --threads=1
                --loader_threads=1 --dist_timeout_s=3 --warmup_steps=10)
    # On GPUs, the sizes of configs/fmnist_cgspn.cfg (the GPU kernels' tested shapes).
    [ "$device" = cuda ] && args+=(--width=64 --heads=4 --mlp_hidden=128 --gspn_latent=16)
    timeout -k 5 $((limit + 90)) $mpirun_cmd -np 2 "$cgspn" "${args[@]}" >"$out" 2>&1 &
    local job=$! waited=0
    # Until a checkpoint is complete (rank 0 writes COMPLETE last): 60 s at most.
    while ! compgen -G "$work/$run/step_*[0-9]/COMPLETE" >/dev/null && [ $waited -lt 600 ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    local victim
    victim=$(rank_pid "--out_dir=$work --run_name=$run" 1) || { echo "  $sig: rank 1 of the run not found"; ok=0; }
    local start end rc
    start=$(date +%s.%N)
    [ -n "${victim:-}" ] && kill "-$sig" "$victim"
    wait "$job"
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    # (mpirun's own status is the killed rank's, 137 for SIGKILL: the time taken tells a
    # job that ended by itself from one the outer timeout ended.)
    [ "$rc" -ne 0 ] || { echo "  $sig: the job exited 0; expected a failure"; ok=0; }
    grep -Eq -- "$want" "$out" || { echo "  $sig: the output does not contain '$want'"; ok=0; }
    awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s < l) }' || { echo "  $sig: took ${secs} s"; ok=0; }
    sleep 0.5
    local left
    left=$(pgrep -f -- "--out_dir=$work --run_name=$run")   # this test's processes only
    if [ -n "$left" ]; then
        echo "  $sig: a rank outlived the job (pids $left)"; ok=0
        kill -9 $left 2>/dev/null
    fi
    # The newest complete checkpoint is intact: one process resumes from it for one step.
    local latest
    latest=$(ls -d "$work/$run"/step_[0-9]*[0-9] 2>/dev/null | sort | tail -1)
    if [ -z "$latest" ] || [ ! -f "$latest/COMPLETE" ]; then
        echo "  $sig: no complete checkpoint left in $work/$run"; ok=0
    else
        local step=$((10#${latest##*step_}))
        if ! "$cgspn" "${args[@]/--max_steps=100000/--max_steps=$((step + 1))}" --resume=auto \
                >"$work/$sig.resume" 2>&1; then
            echo "  $sig: resuming $latest failed:"; sed 's/^/    /' "$work/$sig.resume"; ok=0
        fi
    fi
    if [ $ok -eq 1 ]; then
        echo "[       OK ] cgspn train, rank 1 SIG$sig: the job stopped in ${secs} s naming it; $(basename "$latest") resumes"
        grep -E -m1 -- "$want" "$out" | sed 's/^/             /'
    else
        echo "[  FAILED  ] cgspn train, rank 1 SIG$sig (exit $rc, ${secs} s); output:"
        tail -20 "$out" | sed 's/^/    /'
        fail=1
    fi
}

# Killed: mpirun notices the process gone and stops the job, naming it [[JOB,1],1].
train_case KILL "rank 1|\\[\\[[0-9]+,1\\],1\\]"
# Frozen: rank 0 waits for it (in a host collective: "waited 3.0 s for rank 1"; in an NCCL
# collective: the probe that follows the timeout names it), gives up after dist_timeout_s, aborts.
train_case STOP "waited 3.0 s for rank 1|rank\\(s\\) 1 did not answer"

# ---- SIGTERM to one rank (what Slurm's preemption and scancel send) ----------------------------
# Every rank finishes the step, a checkpoint is written, every rank exits 0; the run, resumed,
# ends on the same bytes as a run never stopped. cgspn distill (Stage 2 from a ViT teacher
# trained here for one step) and cgspn curriculum (one stage, from that Stage 2 student).
"$cgspn" train configs/vit_tiny.cfg "--data_shards=$work/shards" "--out_dir=$work" --run_name=teacher \
    "--device=$device" --max_steps=1 --batch_size=8 --threads=1 --loader_threads=1 >"$work/teacher.out" 2>&1 ||
    { echo "[  FAILED  ] the SIGTERM cases' teacher"; sed 's/^/    /' "$work/teacher.out"; exit 1; }
common=("--data_shards=$work/shards" "--out_dir=$work" "--device=$device" --log_every=1
        --batch_size=8 --eval_batch_size=8 --threads=1 --loader_threads=1 --dist_timeout_s=30
        --warmup_steps=5 --ckpt_every=0)
distill_args=(distill configs/cgspn_tiny.cfg --stage=2 "--teacher=$work/teacher/step_00000001/model.safetensors"
              --teacher_config=configs/vit_tiny.cfg --max_steps=300 "${common[@]}")
curriculum_args=(curriculum configs/cgspn_tiny.cfg "--init=$work/ref_distill" --resolutions=28,42
                 --stage_steps=300 "${common[@]}")

# $1: distill | curriculum; $2: its run folder name; $3: the folder its checkpoints go to (under
# $work); the rest: its arguments (they end with --run_name).
sigterm_case() {
    local what=$1 run=$2 ckdir=$3 ok=1
    shift 3
    local out="$work/$run.out"
    $mpirun_cmd -np 2 "$cgspn" "$@" "--run_name=$run" >"$out" 2>&1 &
    local job=$! waited=0
    while [ "$(cat "$work/$ckdir/metrics.jsonl" 2>/dev/null | wc -l)" -lt 3 ] && [ $waited -lt 600 ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    local victim
    victim=$(rank_pid "--run_name=$run" 1) || { echo "  $what: rank 1 not found"; ok=0; }
    [ -n "${victim:-}" ] && kill -TERM "$victim"
    wait "$job"
    local rc=$?
    [ "$rc" -eq 0 ] || { echo "  $what: mpirun exited $rc after SIGTERM to rank 1"; ok=0; }
    [ "$(grep -c "interrupted by" "$out")" -ge 1 ] || { echo "  $what: no rank said it was interrupted"; ok=0; }
    local latest at=0
    latest=$(ls -d "$work/$ckdir"/step_[0-9]*[0-9] 2>/dev/null | sort | tail -1)
    [ -n "$latest" ] && [ -f "$latest/COMPLETE" ] && at=$((10#${latest##*step_}))
    [ "$at" -gt 0 ] && [ "$at" -lt 300 ] || { echo "  $what: no checkpoint before the end (newest: ${latest:-none})"; ok=0; }
    # Resumed (the same command): it ends where a run never stopped ends, byte for byte.
    $mpirun_cmd -np 2 "$cgspn" "$@" "--run_name=$run" >"$out.resume" 2>&1 ||
        { echo "  $what: the resume failed:"; tail -5 "$out.resume" | sed 's/^/    /'; ok=0; }
    echo "$latest"
    if [ $ok -eq 1 ]; then
        echo "[       OK ] cgspn $what, SIGTERM to rank 1: every rank exited 0 with step_$(printf %08d "$at"); resumed"
    else
        echo "[  FAILED  ] cgspn $what, SIGTERM to rank 1; output:"
        tail -20 "$out" | sed 's/^/    /'
        fail=1
    fi
}
same_bytes() {   # $1, $2: checkpoint folders whose weights and state must be identical
    local f
    for f in model.safetensors state.safetensors; do
        cmp -s "$1/$f" "$2/$f" || { echo "[  FAILED  ] $1/$f differs from $2/$f"; fail=1; return; }
    done
    echo "[       OK ] $(basename "$(dirname "$1")")/$(basename "$1") is byte for byte the uninterrupted run's"
}

$mpirun_cmd -np 2 "$cgspn" "${distill_args[@]}" --run_name=ref_distill >"$work/ref_distill.out" 2>&1 ||
    { echo "[  FAILED  ] the uninterrupted distill run"; tail -20 "$work/ref_distill.out"; exit 1; }
sigterm_case distill term_distill term_distill "${distill_args[@]}" >"$work/term_distill.case"
grep -v '^/' "$work/term_distill.case"
same_bytes "$work/term_distill/step_00000300" "$work/ref_distill/step_00000300"

$mpirun_cmd -np 2 "$cgspn" "${curriculum_args[@]}" --run_name=ref_curr >"$work/ref_curr.out" 2>&1 ||
    { echo "[  FAILED  ] the uninterrupted curriculum run"; tail -20 "$work/ref_curr.out"; exit 1; }
stage=$(basename "$(ls -d "$work"/ref_curr/stage1_*)")
sigterm_case curriculum term_curr "term_curr/$stage" "${curriculum_args[@]}" >"$work/term_curr.case"
grep -v '^/' "$work/term_curr.case"
same_bytes "$work/term_curr/$stage/step_00000300" "$work/ref_curr/$stage/step_00000300"
exit $fail

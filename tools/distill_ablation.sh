#!/usr/bin/env bash
# tools/distill_ablation.sh [--key=value ...]: the Stage 2 ablation of the paper's Fig. 11a on
# Fashion-MNIST, for the GPU machine (runs on the CPU too, slowly).
#
#   1. the teacher: checkpoints/abl_teacher when it exists (delete it to retrain), else
#      cgspn train $TEACHER_CFG --global_pool=avg [--epochs=$TEACHER_EPOCHS] $TEACHER_ARGS
#      (the head on the mean of the patch tokens, so that it reads the student's tokens too)
#   2. Stage 1 once: configs/fmnist_distill_stage1.cfg with the model and data of $STUDENT_CFG,
#      $STAGE1_EPOCHS epochs
#   3. Stage 2 (configs/fmnist_distill_stage2.cfg with $STUDENT_CFG, $STAGE2_EPOCHS epochs each,
#      the same steps for every variant) with taps {PB only, PB + PP, PB + PP + adaptors}, each
#      from the teacher-copied init ("no Stage 1") and from the Stage 1 checkpoint
#   4. writes $OUT: the student's test top1 with the teacher's head (and as a fraction of the
#      teacher's), the final total loss (the mean of the last log window) and the final PB-tap
#      MSE (comparable across variants), wall time per run.
#
# Environment: TEACHER_CFG (configs/fmnist_vit.cfg: width 128, 6 blocks, 4x4 patches),
# STUDENT_CFG (configs/fmnist_cgspn.cfg, the same shape with C-GSPN layers; on a CPU use
# fmnist_vit_cpu.cfg / fmnist_cgspn_cpu.cfg), TEACHER_EPOCHS (empty: the teacher config's),
# TEACHER_ARGS (extra teacher overrides), STAGE1_EPOCHS (2), STAGE2_EPOCHS (20),
# OUT (checkpoints/distill_ablation.md), LANES and PER_LANE (1, 1: see the Stage 2 runs).
# Arguments go to every cgspn command (e.g.
# --batch_size=256 --lr=3e-3); the distillation runs take the student config's recipe keys
# (lr, warmup, augmentation, drop path) after the stage configs'.
set -euo pipefail
cd "$(dirname "$0")/.."
TEACHER_CFG=${TEACHER_CFG:-configs/fmnist_vit.cfg}
STUDENT_CFG=${STUDENT_CFG:-configs/fmnist_cgspn.cfg}
TEACHER_EPOCHS=${TEACHER_EPOCHS:-}
TEACHER_ARGS=${TEACHER_ARGS:-}
STAGE1_EPOCHS=${STAGE1_EPOCHS:-2}
STAGE2_EPOCHS=${STAGE2_EPOCHS:-20}
OUT=${OUT:-checkpoints/distill_ablation.md}
LANES=${LANES:-1}
PER_LANE=${PER_LANE:-1}
CK=checkpoints
mkdir -p "$CK"
make -s cgspn
bash tools/fmnist_shards.sh   # once: a built shard folder is kept

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
pct() { grep -o "$2 [0-9.]*%" "$1" | tail -1 | grep -o '[0-9.]*%' | tr -d '%' || echo "n/a"; }

if [ ! -f "$CK/abl_teacher/config.cfg" ] || ! ls "$CK"/abl_teacher/step_*/COMPLETE >/dev/null 2>&1; then
    rm -rf "$CK"/abl_teacher
    # shellcheck disable=SC2086
    epochs=()
    [ -n "$TEACHER_EPOCHS" ] && epochs=(--epochs="$TEACHER_EPOCHS")
    ./cgspn train "$TEACHER_CFG" --run_name=abl_teacher "${epochs[@]}" \
        --global_pool=avg $TEACHER_ARGS "$@" | tee "$CK"/abl_teacher.log
fi
if [ -f "$CK"/abl_teacher.log ] && grep -q 'final test top1' "$CK"/abl_teacher.log; then
    teacher=$(pct "$CK"/abl_teacher.log "final test top1")
else   # a teacher left by an earlier run without its log: evaluate it
    ./cgspn probe "$CK"/abl_teacher/config.cfg --epochs=1 "$@" \
        --weights "$(ls -d "$CK"/abl_teacher/step_* | tail -1)/model.safetensors" | tee "$CK"/abl_teacher_eval.log
    teacher=$(pct "$CK"/abl_teacher_eval.log "own head: test top1")
fi

rm -rf "$CK"/abl_stage1
./cgspn distill configs/fmnist_distill_stage1.cfg --include="$STUDENT_CFG" --run_name=abl_stage1 \
    --teacher="$CK"/abl_teacher --epochs="$STAGE1_EPOCHS" "$@" | tee "$CK"/abl_stage1.log
s1acc=$(pct "$CK"/abl_stage1.log "final student test top1")

# The six Stage 2 runs are independent: LANES GPUs (CUDA_VISIBLE_DEVICES=0..LANES-1) take
# them round-robin, at most PER_LANE at a time each (on a GPU these small models are bound by
# kernel launches, so runs sharing one lose little); LANES=1 PER_LANE=1 runs them one by one.
runs=()
i=0
for variant in pb pb_pp pb_pp_ad; do
    case $variant in
        pb)       flags=(--tap_pp=0 --adaptors=0);;
        pb_pp)    flags=(--tap_pp=1 --adaptors=0);;
        pb_pp_ad) flags=(--tap_pp=1 --adaptors=1);;
    esac
    for s1 in no yes; do
        run=abl_${variant}_s1${s1}
        runs+=("$run")
        init=()
        [ "$s1" = yes ] && init=(--init "$CK"/abl_stage1)
        rm -rf "${CK:?}/$run"
        lane=$((i % LANES))
        (
            t0=$(now)
            CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$lane} ./cgspn distill \
                configs/fmnist_distill_stage2.cfg --include="$STUDENT_CFG" --run_name="$run" \
                --teacher="$CK"/abl_teacher --epochs="$STAGE2_EPOCHS" "${flags[@]}" "${init[@]}" "$@" \
                > "$CK/$run.log" 2>&1
            echo "$? $(secs "$t0" "$(now)")" > "$CK/$run.done"
        ) &
        i=$((i + 1))
        if (( i % (LANES * PER_LANE) == 0 )); then wait; fi
    done
done
wait

rows=()
status=0
for run in "${runs[@]}"; do
    case $run in
        abl_pb_s1*)       label="PB";;
        abl_pb_pp_s1*)    label="PB + PP";;
        abl_pb_pp_ad_s1*) label="PB + PP + adaptors";;
    esac
    s1=${run##*_s1}
    read -r rc secs_run < "$CK/$run.done"
    if [ "$rc" != 0 ]; then echo "$run failed (exit $rc); its log: $CK/$run.log" >&2; tail -5 "$CK/$run.log" >&2; status=1; fi
    acc=$(pct "$CK/$run.log" "final student test top1")
    loss=$(grep '^step ' "$CK/$run.log" | grep -o '| loss [0-9.e+-]*' | tail -1 | awk '{print $3}')
    mse_pb=$(grep -o 'mse_pb [0-9.e+-]*' "$CK/$run.log" | tail -1 | awk '{print $2}')
    frac=$(awk -v s="$acc" -v t="$teacher" 'BEGIN { if (t > 0) printf "%.1f%%", 100 * s / t; else print "n/a" }')
    rows+=("| $label | $s1 | ${acc}% | $frac | $loss | $mse_pb | $secs_run s |")
done

device=$(grep -m1 '^device:' "$CK"/abl_stage1.log | sed 's/^device: //')
{
    echo "# Stage 2 ablation on Fashion-MNIST (tools/distill_ablation.sh)"
    echo
    echo "device: ${device}; teacher checkpoints/abl_teacher ($TEACHER_CFG): test top1 ${teacher}%; student $STUDENT_CFG;"
    echo "Stage 1 ($STAGE1_EPOCHS epoch, student with the teacher's head: ${s1acc}%); every Stage 2 run $STAGE2_EPOCHS epochs;"
    echo "student top1 with the teacher's head (copied at init, not trained); arguments: ${*:-none}"
    echo
    echo "| Stage 2 taps | Stage 1 | student top1 | of teacher | final loss | final PB MSE | time |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Stage 2 runs: $LANES GPU(s), up to $PER_LANE runs sharing each (time: wall time of each run as run)."
    echo "final loss: the mean total loss of the last log window (its terms differ between rows);"
    echo "final PB MSE: mean over taps of MSE(A(PB_s), PB_t) of the last log window."
} > "$OUT"
echo
cat "$OUT"
exit $status

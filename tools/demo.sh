#!/usr/bin/env bash
# `make demo`: the distillation pipeline on Fashion-MNIST with tiny models, on the CPU (or the
# GPU when present), start to end:
#   1. train the ViT teacher                   configs/fmnist_vit_cpu.cfg
#   2. Stage 1: align each C-GSPN layer        configs/fmnist_distill_stage1.cfg
#   3. Stage 2: PP + PB taps with adaptors     configs/fmnist_distill_stage2.cfg (--init Stage 1)
#   4. export the student (no adaptors, no optimizer state), then evaluate it with the teacher's
#      head (copied into the student at init) and with a 1-epoch linear probe
#   5. print a table of teacher and student accuracy
# Outputs under checkpoints/: demo_teacher/, demo_stage1/, demo_stage2/ (run folders),
# demo_student.safetensors, demo_*.log, demo_results.md. Earlier demo outputs are replaced.
# Arguments are passed to every command (e.g. --device=cpu, --threads=2). Budgets (epochs) can
# be changed through DEMO_TEACHER_EPOCHS, DEMO_STAGE1_EPOCHS, DEMO_STAGE2_EPOCHS.
set -euo pipefail
cd "$(dirname "$0")/.."
TEACHER_EPOCHS=${DEMO_TEACHER_EPOCHS:-3}
STAGE1_EPOCHS=${DEMO_STAGE1_EPOCHS:-1}
STAGE2_EPOCHS=${DEMO_STAGE2_EPOCHS:-2}
CK=checkpoints
mkdir -p "$CK"
rm -rf "$CK"/demo_teacher "$CK"/demo_stage1 "$CK"/demo_stage2 "$CK"/demo_student.safetensors

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
# The last "<label> NN.NN%" number of a log.
pct() { grep -o "$2 [0-9.]*%" "$1" | tail -1 | grep -o '[0-9.]*%' || echo "n/a"; }

start=$(now)
echo "== 1/4 teacher: cgspn train configs/fmnist_vit_cpu.cfg (${TEACHER_EPOCHS} epochs)"
# The teacher's head reads the mean of its patch tokens (it keeps its class token), so that
# the same head on the student's mean token is the teacher's classifier (docs/design.md#stage2 compares
# patch tokens only).
t0=$(now)
./cgspn train configs/fmnist_vit_cpu.cfg --run_name=demo_teacher \
    --epochs="$TEACHER_EPOCHS" --global_pool=avg "$@" | tee "$CK"/demo_teacher.log
t1=$(now)

echo "== 2/4 Stage 1: cgspn distill configs/fmnist_distill_stage1.cfg (${STAGE1_EPOCHS} epoch)"
./cgspn distill configs/fmnist_distill_stage1.cfg --run_name=demo_stage1 \
    --teacher="$CK"/demo_teacher --epochs="$STAGE1_EPOCHS" "$@" | tee "$CK"/demo_stage1.log
t2=$(now)

echo "== 3/4 Stage 2: cgspn distill configs/fmnist_distill_stage2.cfg --init Stage 1 (${STAGE2_EPOCHS} epochs)"
./cgspn distill configs/fmnist_distill_stage2.cfg --run_name=demo_stage2 \
    --teacher="$CK"/demo_teacher --init "$CK"/demo_stage1 --epochs="$STAGE2_EPOCHS" "$@" \
    | tee "$CK"/demo_stage2.log
t3=$(now)

echo "== 4/4 export and evaluate the student"
./cgspn export "$CK"/demo_stage2 --out "$CK"/demo_student.safetensors
./cgspn probe configs/fmnist_cgspn_cpu.cfg --weights "$CK"/demo_student.safetensors --epochs=1 \
    --lr=5e-3 --warmup_steps=20 --weight_decay=0 "$@" | tee "$CK"/demo_probe.log
t4=$(now)

teacher=$(pct "$CK"/demo_teacher.log "final test top1")
s1=$(pct "$CK"/demo_stage1.log "final student test top1")
s2=$(pct "$CK"/demo_stage2.log "final student test top1")
head=$(pct "$CK"/demo_probe.log "own head: test top1")
probe=$(pct "$CK"/demo_probe.log "test top1")
tparams=$(grep -o '[0-9.]* M parameters' "$CK"/demo_teacher.log | head -1)
sparams=$(grep -o '^student model: .*' "$CK"/demo_stage2.log | grep -o '[0-9.]* M parameters' | head -1)
device=$(grep -m1 '^device:' "$CK"/demo_teacher.log | sed 's/^device: //')
ratio=$(awk -v s="${s2%\%}" -v t="${teacher%\%}" 'BEGIN { if (t > 0) printf "%.1f%%", 100 * s / t; else print "n/a" }')
{
    echo "| model | test top1 | time |"
    echo "|---|---|---|"
    echo "| ViT teacher (${TEACHER_EPOCHS} epochs, ${tparams}) | ${teacher} | $(secs "$t0" "$t1") s |"
    echo "| C-GSPN student after Stage 1 (${STAGE1_EPOCHS} epoch), teacher's head | ${s1} | $(secs "$t1" "$t2") s |"
    echo "| C-GSPN student after Stage 2 (${STAGE2_EPOCHS} epochs, ${sparams}), teacher's head | ${s2} (${ratio} of the teacher) | $(secs "$t2" "$t3") s |"
    echo "| exported student, teacher's head / 1-epoch linear probe | ${head} / ${probe} | $(secs "$t3" "$t4") s |"
    echo
    echo "device: ${device}; whole pipeline $(secs "$start" "$t4") s"
} > "$CK"/demo_results.md
echo
echo "demo: Fashion-MNIST distillation pipeline"
cat "$CK"/demo_results.md
echo "run folders: $CK/demo_teacher, $CK/demo_stage1, $CK/demo_stage2 (config.cfg, metrics.jsonl); student: $CK/demo_student.safetensors"

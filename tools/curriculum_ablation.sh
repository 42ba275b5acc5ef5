#!/usr/bin/env bash
# tools/curriculum_ablation.sh [IDX_DIR] [--key=value ...]: the resolution-curriculum ablation on
# Fashion-MNIST (configs/fmnist_curriculum.cfg: a tiny C-GSPN, patch 4), for the GPU machine
# (it runs on a CPU too, slowly). At 56 px (14x14 tokens), with equal sample budgets:
#   (a) naive transfer: the 28 px student (7x7 tokens) evaluated at 56 px as it is
#   (b) fine-tuning at 56 px with labels (cgspn train --init, cross-entropy), 2 x STAGE_SAMPLES
#   (c) the curriculum 28 -> 40 -> 56 px with upsampling self-distillation (cgspn curriculum:
#       each stage's frozen teacher is the previous stage's student on the image resized to its
#       resolution, its PP/PB taps upsampled to the student's grid; no labels, the head is the
#       28 px student's), STAGE_SAMPLES per stage
# and writes $ABLATION_OUT, a markdown table of test top1 at 56 px.
#
# Stage 0 (the "Stage 2 output" the paper's curriculum starts from) is a C-GSPN trained directly
# with labels at 28 px (cgspn train), not distilled from a ViT: the two-stage distillation would
# take longer than this ablation's budget, and the curriculum only needs a student at 28 px.
#
# IDX_DIR (or $FMNIST_SRC): the folder with the four Fashion-MNIST files
# {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz; used only when data/shards/fmnist is not built
# yet (tools/fmnist_shards.sh builds it: cgspn data build --from idx IDX_DIR --out data/shards/fmnist).
# Environment: S0_SAMPLES (images of the 28 px run, 900000 = 15 epochs), STAGE_SAMPLES (images per
# curriculum stage, 180000 = 3 epochs; (b) gets twice that), BATCH (128), FT_LR (lr of (b),
# 1e-3, the curriculum's stage_lr), ABLATION_OUT (checkpoints/curriculum_ablation.md). Arguments after
# IDX_DIR go to every cgspn command (e.g. --device=cpu --threads=2).
# Budget: on one H100 (bf16) the defaults are meant to finish in about 3 minutes (a few thousand
# launch-bound steps of a 0.1 M-parameter model); on 2 CPU cores use smaller S0_SAMPLES and
# STAGE_SAMPLES.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${FMNIST_SRC:-/usr/share/datasets/fashion-mnist}
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then SRC=$1; shift; fi
S0_SAMPLES=${S0_SAMPLES:-900000}
STAGE_SAMPLES=${STAGE_SAMPLES:-180000}
BATCH=${BATCH:-128}
FT_LR=${FT_LR:-1e-3}
ABLATION_OUT=${ABLATION_OUT:-checkpoints/curriculum_ablation.md}
CFG=configs/fmnist_curriculum.cfg
CK=checkpoints
mkdir -p "$CK"
make -s cgspn
bash tools/fmnist_shards.sh "$SRC" data/shards/fmnist

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
# The last "<label> NN.NN%" number of a log (without the %).
pct() { grep -o "$2 [0-9.]*%" "$1" | tail -1 | grep -o '[0-9.]*%' | tr -d '%' || echo "n/a"; }
evaluate() {   # evaluate WEIGHTS SIDE LOG: test top1 of WEIGHTS at SIDE px (the eval path resizes)
    ./cgspn eval "$CFG" --weights "$1" --img_size="$2" --batch_size="$BATCH" "${ARGS[@]}" | tee "$3" >&2
    pct "$3" "weights top1"
}
ARGS=("$@")
s0_steps=$((S0_SAMPLES / BATCH))
ft_steps=$((2 * STAGE_SAMPLES / BATCH))
rm -rf "$CK"/cabl_s0 "$CK"/cabl_ft56 "$CK"/cabl_curriculum

echo "== stage 0: a C-GSPN trained with labels at 28 px ($s0_steps steps of $BATCH)"
t0=$(now)
./cgspn train "$CFG" --run_name=cabl_s0 --max_steps="$s0_steps" --batch_size="$BATCH" "$@" \
    | tee "$CK"/cabl_s0.log
t_s0=$(secs "$t0" "$(now)")
acc_s0=$(pct "$CK"/cabl_s0.log "final test top1")

echo "== (a) naive transfer: the 28 px student at 40 and 56 px"
acc_a40=$(evaluate "$CK"/cabl_s0 40 "$CK"/cabl_a40.log)
acc_a56=$(evaluate "$CK"/cabl_s0 56 "$CK"/cabl_a56.log)

echo "== (b) fine-tuning at 56 px with labels ($ft_steps steps of $BATCH)"
t0=$(now)
./cgspn train "$CFG" --run_name=cabl_ft56 --init="$CK"/cabl_s0 --img_size=56 --max_steps="$ft_steps" \
    --batch_size="$BATCH" --lr="$FT_LR" "$@" | tee "$CK"/cabl_ft56.log
t_b=$(secs "$t0" "$(now)")
acc_b=$(evaluate "$CK"/cabl_ft56 56 "$CK"/cabl_b56.log)

echo "== (c) the curriculum 28 -> 40 -> 56 px ($STAGE_SAMPLES images per stage)"
t0=$(now)
./cgspn curriculum "$CFG" --init "$CK"/cabl_s0 --run_name=cabl_curriculum --stage_samples="$STAGE_SAMPLES" \
    --stage_steps= --batch_size="$BATCH" "$@" | tee "$CK"/cabl_curriculum.log
t_c=$(secs "$t0" "$(now)")
acc_c40=$(evaluate "$CK"/cabl_curriculum/stage1_40px 40 "$CK"/cabl_c40.log)
acc_c=$(evaluate "$CK"/cabl_curriculum/stage2_56px 56 "$CK"/cabl_c56.log)

device=$(grep -m1 '^device:' "$CK"/cabl_s0.log | sed 's/^device: //')
beats=$(awk -v c="$acc_c" -v a="$acc_a56" 'BEGIN { if (c + 0 > a + 0) print "yes"; else print "no" }')
{
    echo "# Resolution curriculum ablation on Fashion-MNIST (tools/curriculum_ablation.sh)"
    echo
    echo "device: ${device}; model $CFG (C-GSPN, patch 4: 28 px = 7x7 tokens, 40 px = 10x10, 56 px = 14x14);"
    echo "stage 0: trained with labels at 28 px, $s0_steps steps of $BATCH (${t_s0} s), test top1 at 28 px ${acc_s0}%;"
    echo "batch $BATCH; arguments: ${*:-none}"
    echo
    echo "| method | training beyond 28 px | images | test top1 at 40 px | test top1 at 56 px | time |"
    echo "|---|---|---|---|---|---|"
    echo "| (a) naive transfer | none | 0 | ${acc_a40}% | ${acc_a56}% | - |"
    echo "| (b) fine-tuning at 56 px | 56 px, labels (cross-entropy) | $((2 * STAGE_SAMPLES)) | - | ${acc_b}% | ${t_b} s |"
    echo "| (c) curriculum 28 -> 40 -> 56 px | 40 px then 56 px, upsampling self-distillation, no labels | $((2 * STAGE_SAMPLES)) | ${acc_c40}% (after stage 1) | ${acc_c}% | ${t_c} s |"
    echo
    echo "(c) beats (a) at 56 px: ${beats}. Test top1: cgspn eval on the val split resized to the side"
    echo "(eval_crop_pct = 1); (c) keeps the 28 px student's head (gamma = 0: only the encoder and adaptors train)."
} > "$ABLATION_OUT"
echo
cat "$ABLATION_OUT"

#!/usr/bin/env bash
# tools/multi_teacher_ablation.sh [--key=value ...]: Stage 2 from one teacher against two, without
# and with PHI-S standardization, on Fashion-MNIST; for the GPU machine (runs on the CPU
# too, slowly).
#
#   1. two teachers of different shape, each trained by cgspn train (kept in checkpoints/ when
#      complete; delete them to retrain), both pooling the mean of their patch tokens:
#        teacher 1  $TEACHER_CFG (configs/fmnist_vit.cfg: class token, width 128, 6 blocks)
#        teacher 2  $TEACHER2_CFG (configs/fmnist_vit_reg.cfg: class token + 4 registers,
#                   no_embed_class, layer scale, width 96, 4 blocks)
#   2. for each of $SEEDS, four Stage 2 runs of the C-GSPN student $STUDENT_CFG (teacher 1's shape), each from teacher
#      1's copied init (no Stage 1), $STAGE2_EPOCHS epochs, configs/fmnist_distill_stage2.cfg:
#        teacher 1 | teacher 1 + teacher 2 (its file checkpoints/mt_teacher2.cfg: taps paired with
#        its blocks proportionally, adaptors 128 -> 96) | both again with phi_s = 1
#   3. each student exported and probed with its run's config.cfg: its test top1 with teacher 1's
#      head (copied at init, not trained), and a $PROBE_EPOCHS-epoch linear probe on its frozen
#      pooled features
#   4. writes $ABLATION_OUT (checkpoints/multi_teacher_ablation.md): those accuracies, the final
#      PB MSE to each teacher (mean over taps, last log window; standardized units with phi_s)
#      and the wall time of each run.
#
# Environment: TEACHER_CFG, TEACHER2_CFG, STUDENT_CFG (configs/fmnist_cgspn.cfg; on a CPU
# fmnist_cgspn_cpu.cfg with TEACHER_CFG=configs/fmnist_vit_cpu.cfg), TEACHER_EPOCHS (30),
# STAGE2_EPOCHS (20), PROBE_EPOCHS (2), SEEDS (the students' seeds, "1 2": every run once per seed),
# ABLATION_OUT. Arguments go to every cgspn command.
set -euo pipefail
cd "$(dirname "$0")/.."
TEACHER_CFG=${TEACHER_CFG:-configs/fmnist_vit.cfg}
TEACHER2_CFG=${TEACHER2_CFG:-configs/fmnist_vit_reg.cfg}
STUDENT_CFG=${STUDENT_CFG:-configs/fmnist_cgspn.cfg}
TEACHER_EPOCHS=${TEACHER_EPOCHS:-30}
STAGE2_EPOCHS=${STAGE2_EPOCHS:-20}
PROBE_EPOCHS=${PROBE_EPOCHS:-2}
SEEDS=${SEEDS:-"1 2"}
ABLATION_OUT=${ABLATION_OUT:-checkpoints/multi_teacher_ablation.md}
CK=checkpoints
mkdir -p "$CK"
make -s cgspn
bash tools/fmnist_shards.sh   # once: a built shard folder is kept

pct() { grep -o "$2 [0-9.]*%" "$1" | tail -1 | grep -o '[0-9.]*%' | tr -d '%' || echo "n/a"; }
complete() { ls "$CK/$1"/step_*/COMPLETE >/dev/null 2>&1; }

train_teacher() {   # NAME CFG [--key=value ...]
    local name=$1 cfg=$2
    shift 2
    if complete "$name" && [ -f "$CK/$name.log" ]; then return; fi
    rm -rf "${CK:?}/$name"
    echo "== teacher $name: cgspn train $cfg ($TEACHER_EPOCHS epochs)"
    ./cgspn train "$cfg" --run_name="$name" --epochs="$TEACHER_EPOCHS" --global_pool=avg "$@" \
        | tee "$CK/$name.log"
}
train_teacher mt_teacher1 "$TEACHER_CFG" "$@"
train_teacher mt_teacher2 "$TEACHER2_CFG" "$@"
t1acc=$(pct "$CK"/mt_teacher1.log "final test top1")
t2acc=$(pct "$CK"/mt_teacher2.log "final test top1")
cat > "$CK"/mt_teacher2.cfg <<CFG
# teacher 2 of tools/multi_teacher_ablation.sh (extra_teachers): its weights, the rest from the run
teacher = $CK/mt_teacher2
CFG

variants=(mt_one mt_two mt_one_phis mt_two_phis)
for seed in $SEEDS; do
    for variant in "${variants[@]}"; do
        run=${variant}_s$seed
        flags=(--seed="$seed")
        case $variant in
            mt_two*) flags+=(--extra_teachers="$CK"/mt_teacher2.cfg);;
        esac
        case $variant in
            *_phis) flags+=(--phi_s=1);;
        esac
        rm -rf "${CK:?}/$run"
        echo "== $run: cgspn distill ${flags[*]}"
        ./cgspn distill configs/fmnist_distill_stage2.cfg --include="$STUDENT_CFG" --run_name="$run" \
            --teacher="$CK"/mt_teacher1 --epochs="$STAGE2_EPOCHS" "${flags[@]}" "$@" > "$CK/$run.log" 2>&1 \
            || { echo "$run failed; its log: $CK/$run.log" >&2; tail -5 "$CK/$run.log" >&2; exit 1; }
        ./cgspn export "$CK/$run" --out "$CK/$run.safetensors" > /dev/null
        ./cgspn probe "$CK/$run/config.cfg" --weights "$CK/$run.safetensors" --epochs="$PROBE_EPOCHS" \
            --lr=5e-3 --warmup_steps=20 --weight_decay=0 "$@" > "$CK/$run.probe.log" 2>&1
    done
done

# "mean (lo..hi)" of the numbers on stdin with D decimals ($1), n/a for none.
summary() { awk -v d="$1" '$1 != "n/a" && $1 != "" { s += $1; n++; if (n == 1 || $1 < lo) lo = $1; if (n == 1 || $1 > hi) hi = $1 }
    END { f = "%." d "f"; if (!n) print "n/a"; else if (n == 1) printf f, s;
          else printf f " (" f ".." f ")", s / n, lo, hi }'; }
rows=()
for variant in "${variants[@]}"; do
    case $variant in
        mt_one) label="teacher 1";;
        mt_two) label="teachers 1 + 2";;
        mt_one_phis) label="teacher 1, PHI-S";;
        mt_two_phis) label="teachers 1 + 2, PHI-S";;
    esac
    heads=() probes=() pb1s=() pb2s=() took=""
    for seed in $SEEDS; do
        run=${variant}_s$seed
        heads+=("$(pct "$CK/$run.probe.log" "own head: test top1")")
        probes+=("$(pct "$CK/$run.probe.log" "test top1")")
        # (|| true: a part the run does not have, t2.mse_pb with one teacher, is "n/a")
        pb1s+=("$(grep -o ' mse_pb [0-9.e+-]*' "$CK/$run.log" | tail -1 | awk '{print $2}' || true)")
        pb2s+=("$(grep -o 't2.mse_pb [0-9.e+-]*' "$CK/$run.log" | tail -1 | awk '{print $2}' || true)")
        took+="$(grep '^done:' "$CK/$run.log" | tail -1 | sed 's/.* in \([0-9hms]*\).*/\1/' || true) "
    done
    rows+=("| $label | $(printf '%s\n' "${heads[@]}" | summary 2) | $(printf '%s\n' "${probes[@]}" | summary 2) | $(printf '%s\n' "${pb1s[@]}" | summary 4) | $(printf '%s\n' "${pb2s[@]}" | summary 4) | ${took% } |")
done
device=$(grep -m1 '^device:' "$CK"/mt_one_s"${SEEDS%% *}".log | sed 's/^device: //')
{
    echo "# One teacher against two, without and with PHI-S (tools/multi_teacher_ablation.sh)"
    echo
    echo "device: ${device}; $(date -u +%Y-%m-%d). Teacher 1 $TEACHER_CFG: test top1 ${t1acc}%; teacher 2"
    echo "$TEACHER2_CFG (registers, another width and depth): ${t2acc}%; both $TEACHER_EPOCHS epochs."
    echo "Student $STUDENT_CFG, Stage 2 only ($STAGE2_EPOCHS epochs, configs/fmnist_distill_stage2.cfg) from"
    echo "teacher 1's copied init; student seeds $SEEDS (each cell: the mean over seeds, (lowest..highest));"
    echo "arguments: ${*:-none}"
    echo
    echo "| Stage 2 from | top1 %, teacher 1's head | top1 %, ${PROBE_EPOCHS}-epoch linear probe | PB MSE to teacher 1 | PB MSE to teacher 2 | time per run |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "teacher 1's head: copied into the student at init and never trained (gamma = 0), so it"
    echo "reads the student's features in teacher 1's terms. PB MSE: mean over taps of"
    echo "MSE(A(PB_s), PB_t) in the last log window; with PHI-S in standardized units (not comparable"
    echo "with the rows without it)."
} > "$ABLATION_OUT"
echo
cat "$ABLATION_OUT"

#!/usr/bin/env bash
# `make demo`: the embedded default job. Trains the Fashion-MNIST ViT (configs/fmnist_vit.cfg)
# from the Debian dataset and prints its test accuracy, then a small C-GSPN on the same data.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
./cgspn train configs/fmnist_vit.cfg --run_name=demo_vit "$@" | tee checkpoints/demo_vit.log
end=$(date +%s)
acc=$(grep -o 'final test top1 [0-9.]*%' checkpoints/demo_vit.log | tail -1)
echo
echo "demo: ViT on Fashion-MNIST: ${acc#final test } test accuracy in $((end - start)) s"
echo "      run folder: checkpoints/demo_vit (config.cfg, metrics.jsonl)"

#!/usr/bin/env bash
# `make fmnist-shards`: builds the Fashion-MNIST shards the Fashion-MNIST configs read
# (data_shards = data/shards/fmnist) from the Debian dataset's IDX files, once: a split whose
# manifest exists is complete (the builder writes it last) and is not rebuilt.
#   tools/fmnist_shards.sh [SRC [OUT]]
#   SRC  folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
#        (default $FMNIST_SRC or /usr/share/datasets/fashion-mnist)
#   OUT  shard folder (default $FMNIST_SHARDS or data/shards/fmnist)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-${FMNIST_SRC:-/usr/share/datasets/fashion-mnist}}
out=${2:-${FMNIST_SHARDS:-data/shards/fmnist}}
if [ -f "$out/train.manifest" ] && [ -f "$out/val.manifest" ]; then
    echo "fmnist-shards: $out is built (train.manifest, val.manifest); delete it to rebuild"
    exit 0
fi
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    if [ ! -f "$src/$f.gz" ] && [ ! -f "$src/$f" ]; then
        echo "fmnist-shards: $src/$f(.gz) is missing" >&2
        echo "  hint: install Debian's dataset-fashion-mnist (make deps), or pass the IDX folder:" \
             "tools/fmnist_shards.sh DIR" >&2
        exit 1
    fi
done
[ -x ./cgspn ] || { echo "fmnist-shards: ./cgspn is not built (run make)" >&2; exit 1; }
# --from idx builds split train from train-* and val from t10k-*.
./cgspn data build --from idx "$src" --out "$out" --quiet
echo "fmnist-shards: built $out (train: 60000 images, val: 10000)"

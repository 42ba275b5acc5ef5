#!/usr/bin/env bash
# One node, one process per GPU (8 by default; GPUS=N): any training command (train, distill,
# curriculum) of cgspn.
# batch_size is global (all ranks, all accumulation micro-batches): each GPU gets
# batch_size / (8 x accum_steps) images per micro-batch; the logged img/s counts all of them.
# Run from the repository root after `make -j cgspn`. Resume a stopped run with the same command
# (--resume=auto continues out_dir/run_name from its newest complete checkpoint; it needs
# run_name, in the config or as --run_name=NAME).
#   scripts/single_node.sh distill configs/x.cfg [--key=value ...]
set -euo pipefail
usage="usage: scripts/single_node.sh train|distill|curriculum CONFIG [--key=value ...]"
cmd=${1:?$usage}
cfg=${2:?$usage}
shift 2
gpus=${GPUS:-8}
export NCCL_NVLS_ENABLE=0          # NVLink multicast off (cgspn sets it when unset, too)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / gpus ))}   # CPU cores per rank
# --bind-to none: the loader's threads and OpenMP need more than the one core mpirun would bind.
# MPIRUN_ARGS: more mpirun options (e.g. --allow-run-as-root, --oversubscribe on a test box).
exec mpirun ${MPIRUN_ARGS:-} -np "$gpus" --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS \
    ./cgspn "$cmd" "$cfg" --resume=auto "$@"

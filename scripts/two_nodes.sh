#!/usr/bin/env bash
# Two nodes of 8 GPUs with a hostfile (16 ranks). Every node needs the same repository path,
# the binary built for its GPUs, the shards at data_shards, and out_dir on a filesystem all nodes
# share (rank 0 writes the weights and config, every rank its optimizer shard with zero = 1).
#   hosts:  node1 slots=8
#           node2 slots=8
#   scripts/two_nodes.sh hosts distill configs/x.cfg [--key=value ...]
set -euo pipefail
usage="usage: scripts/two_nodes.sh HOSTFILE train|distill|curriculum CONFIG [--key=value ...]"
hostfile=${1:?$usage}
cmd=${2:?$usage}
cfg=${3:?$usage}
shift 3
export NCCL_NVLS_ENABLE=0
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-}   # e.g. ib0 or eth0 on multi-homed nodes
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
env_args=(-x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS)
[ -n "$NCCL_SOCKET_IFNAME" ] && env_args+=(-x NCCL_SOCKET_IFNAME) || unset NCCL_SOCKET_IFNAME
# --map-by ppr:8:node: 8 ranks per node, ranks 0-7 on the first; each rank takes GPU local_rank.
exec mpirun ${MPIRUN_ARGS:-} -np 16 --hostfile "$hostfile" --map-by ppr:8:node --bind-to none "${env_args[@]}" \
    "$(pwd)/cgspn" "$cmd" "$cfg" --resume=auto "$@"

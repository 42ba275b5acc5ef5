// Sharded optimizer state in checkpoints, for zero = 1. Beside rank 0's
// model.safetensors and config.cfg (train/checkpoint.h), a checkpoint folder holds
//
//   state.rank00000-of00002.safetensors   rank 0's shard of the optimizer state
//   state.rank00001-of00002.safetensors   rank 1's
//   SHARDS                                "world 2\n": rank 0 writes it (fsync'd) only after
//                                         every rank reported its file durable
//
// A shard file holds, for each piece of the rank's shard (dist/grads.h; read from and written
// into the table's shard-size buffers through params_state_view), F32 1-D tensors
//   m.NAME@START, v.NAME@START       AdamW moments of elements [START, START + len) of NAME
//   master.NAME@START                fp32 master weights (tables whose values are bf16)
// with metadata format = cgspn-optimizer-shard, version, rank, world. Loading matches pieces by
// parameter name and element range, so a checkpoint written by any world size (or bucket_mb)
// loads into any other: re-sharding copies every moment and master element unchanged, which is
// bit-exact. (A run resumed with another world size still differs from one that kept it: each
// rank's batch slice and the gradient sums' order change, so losses agree to fp32 round-off.)
//
// Order of a save (the trainer's): rank 0 creates the folder; every rank writes its shard
// (dist_ckpt_write_shard_err) and calls dist_ckpt_commit_err with its outcome; rank 0 then
// writes the model, config and the checkpoint's COMPLETE marker last.
#pragma once
#include "grads.h"

#define DIST_CKPT_MARKER "SHARDS"

// "DIR/state.rank00001-of00002.safetensors"
void dist_ckpt_shard_path(const char *dir, int rank, int world, char *out, size_t n);
// Writes this rank's shard into dir (through a temporary name, fsync'd). zero = 1 only.
int  dist_ckpt_write_shard_err(const DistGrads *g, const char *dir, char *err, size_t n);
// Every rank, after writing its shard: ok = 1 when it succeeded. When every rank did, rank 0
// writes the SHARDS marker; returns 0 on every rank once the marker is durable, or -1 with a
// message naming the first rank that failed.
int  dist_ckpt_commit_err(Dist *d, const char *dir, int ok, char *err, size_t n);
// 1 when dir has the marker and every shard file it promises (world into *world), else 0.
int  dist_ckpt_shards_complete(const char *dir, int *world);
// Restores the moments (and masters) of this rank's part from the shard files of dir, whatever
// world size wrote them: with zero = 1 this rank's shard, with zero = 0 every parameter. Every
// element must be found. Collective when masters land in the values (an fp32 run resuming a
// bf16 one: the values are all-gathered). Returns 0, or -1 with a message naming the file.
int  dist_ckpt_read_shard_err(DistGrads *g, const char *dir, char *err, size_t n);

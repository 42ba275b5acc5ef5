// Gradient averaging across the ranks of a data-parallel run, and the ZeRO-1 shard of the
// optimizer state.
//
// Buckets: the parameter table keeps every gradient in one fp32 buffer (nn/params.h). It is cut
// into buckets of bucket_mb from its end backwards (bucket 0 holds the last parameters, whose
// gradients backward finishes first). Bucket boundaries fall anywhere, inside a parameter too;
// every bucket but the last (at the buffer's start) is a multiple of world * DIST_ALIGN elements.
// A bucket is launched once the gradients of every trainable parameter overlapping it are final
// (dist_grad_ready), and buckets launch in index order on every rank whatever order the
// readiness comes in (collectives must match across ranks). Buckets that hold no trainable
// parameter are skipped.
//
//   zero = 0: each bucket is all-reduced (average); afterwards every rank holds the same
//             averaged gradient and runs the same optimizer step.
//   zero = 1: each bucket is reduce-scattered (average): rank r receives part r of every bucket
//             (dist_part), and its shard is the union of those parts (seg: pieces of
//             parameters, nn/params.h's ParamSegment). The table keeps moments and fp32 masters
//             for the shard only (params_shard_state: shard-size buffers, the pieces at running
//             offsets); the optimizer steps the shard and dist_gather_values all-gathers the
//             updated parameter values (in their dtype: bf16 on the GPU), which stay whole, and
//             sums the kept-fp32 values (nn/params.h), zeros but for each rank's pieces.
//
// Backends: the CPU backend uses the host collectives (dist/dist.h: sums in rank order, so
// bit-identical across runs); CUDA tensors use NCCL on a communication stream of its own (one
// communicator per process, its unique id broadcast over the host transport, NCCL_NVLS_ENABLE
// defaulting to 0), with each bucket's launch ordered after the main stream's work so far by an
// event, and every wait polled with the deadline (ncclCommGetAsyncError; ncclCommAbort on
// timeout). A CUDA build without NCCL stages buckets through host memory.
//
// The trainer's step: backward (calling dist_grad_ready as parameters finish, or not at all),
// then optimizer_step_dist (train/optimizer.h), which calls dist_wait_grads, the (sharded) AdamW
// and dist_gather_values.
#pragma once
#include "dist.h"
#include "../nn/params.h"

typedef struct DistBucket {
    size_t lo, hi;        // elements [lo, hi) of the gradient buffer
    int first, last;      // parameters overlapping it (table indices), last inclusive; -1 none
    int pending;          // trainable parameters overlapping it not yet ready this step
    bool trainable;       // holds at least one trainable parameter (else never reduced)
    bool launched;
} DistBucket;

struct DistGradsDevice;

typedef struct DistGrads {
    Dist *d;
    ParamTable *t;
    Ctx *ctx;
    int zero;
    size_t bucket_elems;
    DistBucket *buckets;
    int n_buckets;
    int next;                    // the next bucket to launch
    bool in_step;                // readiness counted for the step under way
    unsigned char *ready;        // per parameter: dist_grad_ready called this step
    ParamSegment *seg;            // this rank's ZeRO-1 shard, in table order (zero = 1): the
    int n_seg;                   // table's own t->shard (not a copy; the table frees it)
    size_t shard_elems;          // elements of parameters in the shard (padding excluded)
    float *host;                 // CUDA without NCCL: a bucket staged in host memory
    struct DistGradsDevice *dev; // NCCL: streams and events
} DistGrads;

// Elements per bucket for bucket_mb megabytes (2^20 bytes) of fp32, rounded down to a multiple
// of world * DIST_ALIGN (at least one such multiple).
size_t dist_bucket_elems(double bucket_mb, int world);

// After params_alloc. zero as the config key; bucket_mb <= 0 means one bucket for everything.
// A world of one gives a DistGrads whose calls do nothing. zero = 1 across ranks shards the
// table's optimizer state (params_shard_state): from then on the table keeps moments and masters
// of this rank's shard only, so create it before the first step.
DistGrads *dist_grads_create(Dist *d, ParamTable *t, Ctx *ctx, int zero, double bucket_mb);
void dist_grads_free(DistGrads *g);

// Parameter `param` (its table index) has its final gradient for this step: launches every
// bucket that became complete (in order). Frozen parameters are ignored.
void dist_grad_ready(DistGrads *g, int param);
// The same, for a parameter given by its gradient tensor (as the tape sees it).
void dist_grad_ready_tensor(DistGrads *g, const Tensor *grad);
// Launches the buckets not launched yet and waits for all: afterwards the averaged gradients
// (zero = 0: the whole buffer; zero = 1: this rank's shard) are in the gradient buffer and
// ordered before later work on the context's stream. Resets the readiness for the next step.
void dist_wait_grads(DistGrads *g);
// zero = 1, after the optimizer updated the shard: every rank's updated values to every rank.
void dist_gather_values(DistGrads *g);

// The gradient collectives of the last step on the communication stream (NCCL), read once that
// step has finished (cgspn bench distill --profile). busy: summed span of every bucket's
// collective from the moment the stream reached it; tail: from the main stream's event at the
// last bucket's launch (where backward ended) to that bucket's completion; queued: the longest
// a bucket waited for earlier ones. False (nothing filled) without NCCL or collectives.
typedef struct DistCommProfile {
    int buckets;
    double busy_ms, tail_ms, queued_ms;
} DistCommProfile;
bool dist_grads_comm_profile(const DistGrads *g, DistCommProfile *out);

// The shard of `rank` in a world of `world` for table t with buckets of bucket_elems (zero = 1):
// segments in table order into *seg (malloc'd; caller frees); returns their count.
int dist_shard_segments(const ParamTable *t, size_t bucket_elems, int world, int rank,
                        ParamSegment **seg);
// A 1-D view of elements [start, start + len) of a parameter's value or gradient (the optimizer
// state: params_state_view).
Tensor dist_segment_view(const Tensor *x, size_t start, size_t len);

// Per-step activation memory: a bump allocator over large chunks on one device, reset each step.
// Chunks are kept across resets, so after the first step nothing is allocated.
#pragma once
#include "tensor.h"
#include "ctx.h"

typedef struct ArenaChunk {
    char *base;
    size_t size, used;
} ArenaChunk;

#define ARENA_HOST_BLOCK_BYTES (256u << 10)

typedef struct Arena {
    Ctx *ctx;
    ArenaChunk *host;        // host blocks for Tensor structs and tape records, reused after reset
    int n_host, host_current;
    ArenaChunk *chunks;
    int n_chunks, cap_chunks, current;
    size_t chunk_bytes;      // default size of a new chunk
    size_t peak, in_use;     // bytes handed out (for the memory column of the log)
} Arena;

void arena_init(Arena *a, Ctx *ctx, size_t chunk_bytes);
void arena_free(Arena *a);
void arena_reset(Arena *a);
void *arena_alloc(Arena *a, size_t bytes);   // 256-byte aligned, uninitialized
// Zeroed host memory (Tensor structs, tape records) that lives until the next reset.
void *arena_host_alloc(Arena *a, size_t bytes);
// A tensor of the context's activation dtype (or fp32 when dtype_f32) with arena storage.
Tensor *arena_tensor(Arena *a, int ndim, const int *shape, bool dtype_f32);

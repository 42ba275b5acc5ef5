// Per-step activation memory on one device: large chunks carved into blocks, reset each step.
// Chunks are kept across resets, so after the first step nothing is allocated.
//
// A block can be released before the reset (arena_release) and its bytes reused within the step:
// the tape's memory plan (nn/tape.h) releases each activation after its last reader. Every block
// carries a release time, its stamp: arena_release_from(a, s) releases every block stamped s or
// later. The tape stamps a block with the index of the first record that may read it, so after
// backward has run record s, all blocks stamped s or later are dead. ARENA_KEEP: until the reset.
//
// Placement is a pure function of the sequence of calls (best fit, lowest chunk and offset on
// ties), so the same step gives the same addresses: runs stay deterministic.
#pragma once
#include "tensor.h"
#include "ctx.h"

// The chunk a step's arena grows by (a larger tensor gets a chunk of its own size): what train,
// distill, curriculum and the benches use, so a bench's memory is a run's. Measured on an H100
// against 256 MiB and 1 GiB (2026-11-25, bench vit and bench distill --memory=1): the lowest peak
// for ViT-B/16, so14 ViT and the so14 Stage 2 step; larger chunks leave their tail unused.
#define ARENA_CHUNK_BYTES ((size_t)64 << 20)

#define ARENA_KEEP (-1)
// Blocks of a scope: released together by arena_release_scope (a frozen teacher's block: what
// it makes beyond the taps it hands on is dead once the block has run).
#define ARENA_SCOPE (-2)

typedef struct ArenaChunk {
    char *base;
    size_t size, used;   // used: host blocks only (bump pointer)
    int first;           // device chunks: the slot of the chunk's first span
} ArenaChunk;

#define ARENA_HOST_BLOCK_BYTES (256u << 10)

// One span of a chunk, handed out or free; the spans of a chunk form a list in address order.
typedef struct ArenaBlock {
    size_t offset, size;
    int chunk;
    int prev, next;            // neighbours in the chunk, -1 at the ends
    int stamp;                 // used blocks: release time (ARENA_KEEP: none)
    int stamp_prev, stamp_next;// used blocks with the same stamp
    bool used;
} ArenaBlock;

typedef struct Arena {
    Ctx *ctx;
    ArenaChunk *host;        // host blocks for Tensor structs and tape records, reused after reset
    int n_host, host_current;
    ArenaChunk *chunks;      // device memory: base and size (used: unused)
    int n_chunks, cap_chunks;
    size_t chunk_bytes;      // default size of a new chunk
    size_t peak, in_use;     // bytes handed out: most at once since init, and now
    size_t reserved;         // bytes of the chunks
    ArenaBlock *blocks;      // every span of every chunk, plus unused slots on a free list
    int n_blocks, cap_blocks, spare;     // spare: first unused slot (-1: none)
    int *by_addr;            // open-addressing map: a used block's start address -> its slot
    int cap_addr, n_addr;
    int *stamp_head;         // per stamp, the first used block with it (-1: none)
    int scope_head;          // the first used block stamped ARENA_SCOPE (-1: none)
    int cap_stamps, max_stamp;
    int stamp;               // the stamp of blocks handed out now (the tape sets it)
    bool poison;             // fill released bytes with 0xFF (NaN in fp32 and bf16): finds reads
                             // of released memory; on for CPU arenas
} Arena;

void arena_init(Arena *a, Ctx *ctx, size_t chunk_bytes);
void arena_free(Arena *a);
void arena_reset(Arena *a);
void *arena_alloc(Arena *a, size_t bytes);   // 256-byte aligned, uninitialized, stamped a->stamp
void *arena_alloc_stamped(Arena *a, size_t bytes, int stamp);
// Releases the block that holds p (a start or an inner address; memory not from this arena is
// left alone). Its bytes may be handed out by the next arena_alloc.
void arena_release(Arena *a, const void *p);
// Releases every block stamped `stamp` or later.
void arena_release_from(Arena *a, int stamp);
// Releases every block stamped ARENA_SCOPE.
void arena_release_scope(Arena *a);
// The stamp of the block that holds p; ARENA_KEEP when p is not from this arena.
int  arena_stamp_of(Arena *a, const void *p);
// Gives the block that holds p another release time (nothing when p is not from this arena).
void arena_restamp(Arena *a, const void *p, int stamp);
// Zeroed host memory (Tensor structs, tape records) that lives until the next reset.
void *arena_host_alloc(Arena *a, size_t bytes);
// A tensor of the context's activation dtype (or fp32 when dtype_f32) with arena storage.
Tensor *arena_tensor(Arena *a, int ndim, const int *shape, bool dtype_f32);

#include "arena.h"
#include "device.h"
#include "error.h"
#include "ops.h"

#define ARENA_ALIGN 256

void arena_init(Arena *a, Ctx *ctx, size_t chunk_bytes) {
    memset(a, 0, sizeof(*a));
    a->ctx = ctx;
    a->chunk_bytes = chunk_bytes;
    a->spare = -1;
    a->max_stamp = -1;
    a->scope_head = -1;
    a->poison = ctx->device == DEVICE_CPU;
}

void arena_free(Arena *a) {
    for (int i = 0; i < a->n_chunks; i++) device_free(a->ctx, a->chunks[i].base);
    free(a->chunks);
    for (int i = 0; i < a->n_host; i++) free(a->host[i].base);
    free(a->host);
    free(a->blocks);
    free(a->by_addr);
    free(a->stamp_head);
    memset(a, 0, sizeof(*a));
}

// ---- block slots ---------------------------------------------------------------------------------

static int slot_new(Arena *a) {
    if (a->spare >= 0) {
        int s = a->spare;
        a->spare = a->blocks[s].next;
        return s;
    }
    if (a->n_blocks == a->cap_blocks) {
        a->cap_blocks = a->cap_blocks ? 2 * a->cap_blocks : 256;
        a->blocks = cg_realloc(a->blocks, (size_t)a->cap_blocks * sizeof *a->blocks);
    }
    return a->n_blocks++;
}

static void slot_drop(Arena *a, int s) {
    a->blocks[s].next = a->spare;
    a->spare = s;
}

static char *block_addr(const Arena *a, const ArenaBlock *b) {
    return a->chunks[b->chunk].base + b->offset;
}

// ---- start address -> used block ------------------------------------------------------------------

static size_t addr_slot(const Arena *a, const void *p) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;   // Fibonacci hashing
    return (size_t)(h >> 32) & (size_t)(a->cap_addr - 1);
}

static void addr_put(Arena *a, int s);

static void addr_grow(Arena *a) {
    int *old = a->by_addr, old_cap = a->cap_addr;
    a->cap_addr = old_cap ? 2 * old_cap : 1024;   // a power of two (addr_slot masks)
    a->by_addr = cg_malloc((size_t)a->cap_addr * sizeof(int));
    for (int i = 0; i < a->cap_addr; i++) a->by_addr[i] = -1;
    a->n_addr = 0;
    for (int i = 0; i < old_cap; i++)
        if (old[i] >= 0) addr_put(a, old[i]);
    free(old);
}

static void addr_put(Arena *a, int s) {
    if (2 * (a->n_addr + 1) > a->cap_addr) addr_grow(a);
    size_t k = addr_slot(a, block_addr(a, &a->blocks[s]));
    while (a->by_addr[k] >= 0) k = (k + 1) & (size_t)(a->cap_addr - 1);
    a->by_addr[k] = s;
    a->n_addr++;
}

static size_t addr_find_slot(const Arena *a, const void *p) {
    if (!a->cap_addr) return SIZE_MAX;
    size_t k = addr_slot(a, p);
    while (a->by_addr[k] >= 0) {
        if (block_addr(a, &a->blocks[a->by_addr[k]]) == p) return k;
        k = (k + 1) & (size_t)(a->cap_addr - 1);
    }
    return SIZE_MAX;
}

// Linear probing without tombstones: the entries after the removed one move up as needed.
static void addr_remove(Arena *a, size_t k) {
    size_t mask = (size_t)(a->cap_addr - 1);
    a->by_addr[k] = -1;
    a->n_addr--;
    for (size_t j = (k + 1) & mask; a->by_addr[j] >= 0; j = (j + 1) & mask) {
        int s = a->by_addr[j];
        a->by_addr[j] = -1;
        a->n_addr--;
        addr_put(a, s);
    }
}

// The used block holding p (its start or an inner address), or -1.
static int block_of(const Arena *a, const void *p) {
    size_t k = addr_find_slot(a, p);
    if (k != SIZE_MAX) return a->by_addr[k];
    const char *c = p;
    for (int i = 0; i < a->n_chunks; i++) {
        const ArenaChunk *ch = &a->chunks[i];
        if (c < ch->base || c >= ch->base + ch->size) continue;
        size_t off = (size_t)(c - ch->base);
        for (int s = ch->first; s >= 0; s = a->blocks[s].next) {   
            const ArenaBlock *b = &a->blocks[s];
            if (off >= b->offset && off < b->offset + b->size) return b->used ? s : -1;
        }
    }
    return -1;
}

// ---- stamps --------------------------------------------------------------------------------------

static void stamp_link(Arena *a, int s, int stamp) {
    ArenaBlock *b = &a->blocks[s];
    b->stamp = stamp;
    b->stamp_prev = b->stamp_next = -1;
    if (stamp == ARENA_SCOPE) {
        b->stamp_next = a->scope_head;
        if (a->scope_head >= 0) a->blocks[a->scope_head].stamp_prev = s;
        a->scope_head = s;
        return;
    }
    if (stamp < 0) return;
    if (stamp >= a->cap_stamps) {
        int cap = a->cap_stamps ? a->cap_stamps : 256;
        while (cap <= stamp) cap *= 2;
        a->stamp_head = cg_realloc(a->stamp_head, (size_t)cap * sizeof(int));
        for (int i = a->cap_stamps; i < cap; i++) a->stamp_head[i] = -1;
        a->cap_stamps = cap;
    }
    int h = a->stamp_head[stamp];
    b->stamp_next = h;
    if (h >= 0) a->blocks[h].stamp_prev = s;
    a->stamp_head[stamp] = s;
    if (stamp > a->max_stamp) a->max_stamp = stamp;
}

static void stamp_unlink(Arena *a, int s) {
    ArenaBlock *b = &a->blocks[s];
    if (b->stamp == ARENA_KEEP) return;
    int *head = b->stamp == ARENA_SCOPE ? &a->scope_head : &a->stamp_head[b->stamp];
    if (b->stamp_prev >= 0) a->blocks[b->stamp_prev].stamp_next = b->stamp_next;
    else *head = b->stamp_next;
    if (b->stamp_next >= 0) a->blocks[b->stamp_next].stamp_prev = b->stamp_prev;
    b->stamp = ARENA_KEEP;
}

// ---- chunks and spans ----------------------------------------------------------------------------

static void chunk_add(Arena *a, size_t size) {
    if (a->n_chunks == a->cap_chunks) {
        a->cap_chunks = a->cap_chunks ? 2 * a->cap_chunks : 8;
        a->chunks = cg_realloc(a->chunks, (size_t)a->cap_chunks * sizeof(ArenaChunk));
    }
    int c = a->n_chunks++;
    a->chunks[c] = (ArenaChunk){device_alloc(a->ctx, size), size, 0, -1};
    a->reserved += size;
    int s = slot_new(a);
    a->blocks[s] = (ArenaBlock){0, size, c, -1, -1, ARENA_KEEP, -1, -1, false};
    a->chunks[c].first = s;
}

void arena_reset(Arena *a) {
    // Every chunk becomes one free span again; the slots start over.
    a->n_blocks = 0;
    a->spare = -1;
    for (int c = 0; c < a->n_chunks; c++) {
        int s = slot_new(a);
        a->blocks[s] = (ArenaBlock){0, a->chunks[c].size, c, -1, -1, ARENA_KEEP, -1, -1, false};
        a->chunks[c].first = s;
    }
    for (int i = 0; i < a->cap_addr; i++) a->by_addr[i] = -1;
    a->n_addr = 0;
    for (int i = 0; i <= a->max_stamp && i < a->cap_stamps; i++) a->stamp_head[i] = -1;
    a->max_stamp = -1;
    a->scope_head = -1;
    a->stamp = 0;
    a->in_use = 0;
    for (int i = 0; i < a->n_host; i++) a->host[i].used = 0;
    a->host_current = 0;
}

void *arena_host_alloc(Arena *a, size_t bytes) {
    size_t need = (bytes + 15) / 16 * 16;
    CG_CHECK(need <= ARENA_HOST_BLOCK_BYTES, "", "host record of %zu bytes too large", bytes);
    while (a->host_current < a->n_host) {
        ArenaChunk *c = &a->host[a->host_current];
        if (c->size - c->used >= need) {
            void *p = c->base + c->used;
            c->used += need;
            memset(p, 0, need);
            return p;
        }
        a->host_current++;
    }
    a->host = cg_realloc(a->host, (size_t)(a->n_host + 1) * sizeof(ArenaChunk));
    a->host[a->n_host++] = (ArenaChunk){cg_malloc(ARENA_HOST_BLOCK_BYTES), ARENA_HOST_BLOCK_BYTES, 0, -1};
    a->host_current = a->n_host - 1;
    return arena_host_alloc(a, bytes);
}

// The smallest free span of at least need bytes; ties: the lowest chunk, then offset. -1: none.
static int best_fit(const Arena *a, size_t need) {
    int best = -1;
    for (int c = 0; c < a->n_chunks; c++) {
        for (int s = a->chunks[c].first; s >= 0; s = a->blocks[s].next) {
            const ArenaBlock *b = &a->blocks[s];
            if (b->used || b->size < need) continue;
            if (best < 0 || b->size < a->blocks[best].size) best = s;
        }
    }
    return best;
}

void *arena_alloc_stamped(Arena *a, size_t bytes, int stamp) {
    size_t need = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (need == 0) need = ARENA_ALIGN;
    int s = best_fit(a, need);
    if (s < 0) {
        chunk_add(a, need > a->chunk_bytes ? need : a->chunk_bytes);
        s = a->chunks[a->n_chunks - 1].first;
    }
    ArenaBlock *b = &a->blocks[s];
    if (b->size > need) {   // split: the rest stays free after it
        int r = slot_new(a);
        b = &a->blocks[s];   // slot_new may move the array
        a->blocks[r] = (ArenaBlock){b->offset + need, b->size - need, b->chunk, s, b->next,
                                    ARENA_KEEP, -1, -1, false};
        if (b->next >= 0) a->blocks[b->next].prev = r;
        b->next = r;
        b->size = need;
    }
    b->used = true;
    stamp_link(a, s, stamp);
    addr_put(a, s);
    a->in_use += need;
    if (a->in_use > a->peak) a->peak = a->in_use;
    return block_addr(a, &a->blocks[s]);
}

void *arena_alloc(Arena *a, size_t bytes) {
    return arena_alloc_stamped(a, bytes, a->stamp);
}

// Merges free span s with its free successor.
static void merge_next(Arena *a, int s) {
    ArenaBlock *b = &a->blocks[s];
    int n = b->next;
    if (n < 0 || a->blocks[n].used) return;
    b->size += a->blocks[n].size;
    b->next = a->blocks[n].next;
    if (b->next >= 0) a->blocks[b->next].prev = s;
    slot_drop(a, n);
}

static void release_block(Arena *a, int s) {
    ArenaBlock *b = &a->blocks[s];
    size_t k = addr_find_slot(a, block_addr(a, b));
    if (k != SIZE_MAX) addr_remove(a, k);
    stamp_unlink(a, s);
    if (a->poison) memset(block_addr(a, b), 0xFF, b->size);
    a->in_use -= b->size;
    b->used = false;
    merge_next(a, s);
    int p = a->blocks[s].prev;
    if (p >= 0 && !a->blocks[p].used) merge_next(a, p);
}

void arena_release(Arena *a, const void *p) {
    if (!p) return;
    int s = block_of(a, p);
    if (s >= 0) release_block(a, s);
}

void arena_release_from(Arena *a, int stamp) {
    if (stamp < 0) stamp = 0;
    for (int st = a->max_stamp; st >= stamp; st--) {
        while (a->stamp_head[st] >= 0) release_block(a, a->stamp_head[st]);
    }
    if (a->max_stamp >= stamp) a->max_stamp = stamp - 1;
}

void arena_release_scope(Arena *a) {
    while (a->scope_head >= 0) release_block(a, a->scope_head);
}

int arena_stamp_of(Arena *a, const void *p) {
    int s = p ? block_of(a, p) : -1;
    return s >= 0 ? a->blocks[s].stamp : ARENA_KEEP;
}

void arena_restamp(Arena *a, const void *p, int stamp) {
    int s = p ? block_of(a, p) : -1;
    if (s < 0 || a->blocks[s].stamp == stamp) return;
    stamp_unlink(a, s);
    stamp_link(a, s, stamp);
}

Tensor *arena_tensor(Arena *a, int ndim, const int *shape, bool dtype_f32) {
    Tensor *t = arena_host_alloc(a, sizeof(Tensor));   // host struct even when data is on the GPU
    tensor_set_shape(t, ndim, shape);
    t->dtype = dtype_f32 ? DTYPE_F32 : a->ctx->act_dtype;
    t->device = a->ctx->device;
    t->data = arena_alloc(a, tensor_bytes(t));
    return t;
}

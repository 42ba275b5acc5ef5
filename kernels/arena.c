#include "arena.h"
#include "error.h"
#include "ops.h"

void arena_init(Arena *a, Ctx *ctx, size_t chunk_bytes) {
    memset(a, 0, sizeof(*a));
    a->ctx = ctx;
    a->chunk_bytes = chunk_bytes;
}

void arena_free(Arena *a) {
    for (int i = 0; i < a->n_chunks; i++) device_free(a->ctx, a->chunks[i].base);
    free(a->chunks);
    for (int i = 0; i < a->n_host; i++) free(a->host[i].base);
    free(a->host);
    memset(a, 0, sizeof(*a));
}

void arena_reset(Arena *a) {
    for (int i = 0; i < a->n_chunks; i++) a->chunks[i].used = 0;
    a->current = 0;
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
    a->host[a->n_host++] = (ArenaChunk){cg_malloc(ARENA_HOST_BLOCK_BYTES), ARENA_HOST_BLOCK_BYTES, 0};
    a->host_current = a->n_host - 1;
    return arena_host_alloc(a, bytes);
}

void *arena_alloc(Arena *a, size_t bytes) {
    size_t need = (bytes + 255) / 256 * 256;
    if (need == 0) need = 256;
    while (a->current < a->n_chunks) {
        ArenaChunk *c = &a->chunks[a->current];
        if (c->size - c->used >= need) {
            void *p = c->base + c->used;
            c->used += need;
            a->in_use += need;
            if (a->in_use > a->peak) a->peak = a->in_use;
            return p;
        }
        a->current++;
    }
    if (a->n_chunks == a->cap_chunks) {
        a->cap_chunks = a->cap_chunks ? 2 * a->cap_chunks : 8;
        a->chunks = cg_realloc(a->chunks, (size_t)a->cap_chunks * sizeof(ArenaChunk));
    }
    size_t size = need > a->chunk_bytes ? need : a->chunk_bytes;
    a->chunks[a->n_chunks++] = (ArenaChunk){device_alloc(a->ctx, size), size, 0};
    a->current = a->n_chunks - 1;
    return arena_alloc(a, bytes);
}

Tensor *arena_tensor(Arena *a, int ndim, const int *shape, bool dtype_f32) {
    Tensor *t = arena_host_alloc(a, sizeof(Tensor));   // host struct even when data is on the GPU
    tensor_set_shape(t, ndim, shape);
    t->dtype = dtype_f32 ? DTYPE_F32 : a->ctx->act_dtype;
    t->device = a->ctx->device;
    t->data = arena_alloc(a, tensor_bytes(t));
    return t;
}

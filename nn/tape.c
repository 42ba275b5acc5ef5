#include "tape.h"
#include "../kernels/error.h"
#include "../kernels/ops.h"

void tape_init(Tape *t, Ctx *ctx, Arena *arena) {
    memset(t, 0, sizeof(*t));
    t->ctx = ctx;
    t->arena = arena;
    t->grad_enabled = true;
}

void tape_free(Tape *t) {
    if (t->one) device_free(t->ctx, t->one);
    t->one = NULL;
    free(t->entries);
    free(t->uses);
    free(t->seen);
    t->entries = NULL;
    t->uses = NULL;
    t->seen = NULL;
    t->n = t->cap = t->n_uses = t->cap_uses = t->cap_seen = 0;
}

void tape_reset(Tape *t) {
    t->n = 0;
    t->n_uses = 0;
    if (t->seen) memset(t->seen, 0, (size_t)t->cap_seen * sizeof *t->seen);
    arena_reset(t->arena);   // the arena's clock back to 0: tape_clock() is t->n
}

// The memory plan (tape.h): a block made while the tape holds n records can be read only by
// records n and later, so the arena stamps it n (its release time in backward).
static void tape_clock(Tape *t) { t->arena->stamp = t->n; }

void tape_keep(Tape *t, const Tensor *x) {
    if (x) arena_restamp(t->arena, x->data, ARENA_KEEP);
}

void tape_release(Tape *t, const Tensor *x) {
    if (x) arena_release(t->arena, x->data);
}

void tape_set_param_done(Tape *t, TapeParamDoneFn fn, void *user) {
    t->param_done = fn;
    t->param_done_user = user;
}

// ---- first uses of parameters (for tape_set_param_done) ----------------------------------------

static size_t seen_slot(const Tape *t, const Tensor *g) {
    uint64_t h = (uint64_t)(uintptr_t)g * 0x9E3779B97F4A7C15ull;   // Fibonacci hashing
    return (size_t)(h >> 32) & (size_t)(t->cap_seen - 1);
}

// Inserts g; returns false when it was there already. The set stays at most half full.
static bool seen_insert(Tape *t, const Tensor *g) {
    if (2 * (t->n_uses + 1) > t->cap_seen) {
        const Tensor **old = t->seen;
        int old_cap = t->cap_seen;
        t->cap_seen = old_cap ? 2 * old_cap : 256;   // a power of two (seen_slot masks)
        t->seen = cg_calloc((size_t)t->cap_seen, sizeof *t->seen);
        for (int i = 0; i < old_cap; i++) {
            if (!old[i]) continue;
            size_t k = seen_slot(t, old[i]);
            while (t->seen[k]) k = (k + 1) & (size_t)(t->cap_seen - 1);
            t->seen[k] = old[i];
        }
        free(old);
    }
    size_t k = seen_slot(t, g);
    while (t->seen[k]) {
        if (t->seen[k] == g) return false;
        k = (k + 1) & (size_t)(t->cap_seen - 1);
    }
    t->seen[k] = g;
    return true;
}

// x feeds the record about to be appended (index t->n): note it when it is a parameter seen
// for the first time this step.
static void note_param(Tape *t, const Tensor *x) {
    if (!x || !x->requires_grad || !x->grad) return;
    if (!seen_insert(t, x->grad)) return;
    if (t->n_uses == t->cap_uses) {
        t->cap_uses = t->cap_uses ? 2 * t->cap_uses : 256;
        t->uses = cg_realloc(t->uses, (size_t)t->cap_uses * sizeof *t->uses);
    }
    t->uses[t->n_uses++] = (TapeParamUse){t->n, x->grad};
}

bool tape_set_grad_enabled(Tape *t, bool enabled) {
    bool old = t->grad_enabled;
    t->grad_enabled = enabled;
    return old;
}

Tensor *tape_tensor(Tape *t, int ndim, const int *shape, bool f32) {
    return arena_tensor(t->arena, ndim, shape, f32);
}

Tensor *tape_tensor_like(Tape *t, const Tensor *x) {
    Tensor *y = arena_tensor(t->arena, x->ndim, x->shape, x->dtype == DTYPE_F32);
    y->dtype = x->dtype;
    return y;
}

bool tape_would_track(const Tape *t, const Tensor *a, const Tensor *b, const Tensor *c) {
    return t->grad_enabled &&
           ((a && a->requires_grad) || (b && b->requires_grad) || (c && c->requires_grad));
}

bool tape_track(Tape *t, Tensor *out, const Tensor *a, const Tensor *b, const Tensor *c) {
    out->requires_grad = tape_would_track(t, a, b, c);
    if (out->requires_grad) {   // ops call tape_track before tape_record: t->n is their record
        note_param(t, a);
        note_param(t, b);
        note_param(t, c);
    }
    return out->requires_grad;
}

void *tape_record(Tape *t, TapeBackwardFn fn, size_t bytes) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->entries = cg_realloc(t->entries, (size_t)t->cap * sizeof(TapeEntry));
    }
    void *record = arena_host_alloc(t->arena, bytes);
    t->entries[t->n++] = (TapeEntry){fn, record};
    tape_clock(t);
    return record;
}

// x's gradient buffer (same dtype as the activation, as in llm.c), released with x: x's readers
// are the only records that use it.
static Tensor *new_grad(Tape *t, const Tensor *x) {
    Tensor *g = arena_host_alloc(t->arena, sizeof(Tensor));
    tensor_set_shape(g, x->ndim, x->shape);
    g->dtype = x->dtype;
    g->device = t->ctx->device;
    g->data = arena_alloc_stamped(t->arena, tensor_bytes(g), arena_stamp_of(t->arena, x->data));
    return g;
}

Tensor *tape_grad(Tape *t, Tensor *x) {
    if (!x || !x->requires_grad) return NULL;
    if (!x->grad) {
        Tensor *g = new_grad(t, x);
        op_zero(t->ctx, g);
        x->grad = g;
    }
    return x->grad;
}

Tensor *tape_grad_fresh(Tape *t, Tensor *x, bool *fresh) {
    *fresh = false;
    if (!x || !x->requires_grad) return NULL;
    if (!x->grad) {
        x->grad = new_grad(t, x);
        *fresh = true;
    }
    return x->grad;
}

bool tape_grad_adopt(Tape *t, Tensor *x, Tensor *g) {
    if (!x || !x->requires_grad || x->grad || !g) return false;
    if (g->dtype != x->dtype || g->numel != x->numel || g->device != x->device) return false;
    Tensor *v = arena_host_alloc(t->arena, sizeof(Tensor));
    *v = tensor_view(g, x->ndim, x->shape);
    v->grad = NULL;
    v->requires_grad = false;
    x->grad = v;
    // The buffer now also serves x: it dies when the later of its users does (x + y may adopt
    // dy for both).
    int sx = arena_stamp_of(t->arena, x->data), sg = arena_stamp_of(t->arena, g->data);
    if (sg != ARENA_KEEP && (sx == ARENA_KEEP || sx < sg)) arena_restamp(t->arena, g->data, sx);
    return true;
}

// Record i's backward; then every block stamped i or later is dead (tape_clock): released.
// Temporaries made by the backward are stamped i; gradients take their activation's stamp.
static void run_record(Tape *t, int i) {
    t->arena->stamp = i;
    t->entries[i].backward(t, t->entries[i].record);
    arena_release_from(t->arena, i);
}

// Every record in reverse; after record i, the parameters it read first are reported final.
static void run_backward(Tape *t) {
    int u = t->n_uses - 1;
    // A parameter noted for a record that was never appended feeds nothing: final already.
    for (; t->param_done && u >= 0 && t->uses[u].entry >= t->n; u--)
        t->param_done(t->param_done_user, t->uses[u].grad);
    for (int i = t->n - 1; i >= 0; i--) {
        run_record(t, i);
        for (; t->param_done && u >= 0 && t->uses[u].entry == i; u--)
            t->param_done(t->param_done_user, t->uses[u].grad);
    }
    tape_clock(t);   // what is made after backward (the optimizer's scratch) lives to the reset
}

// ---- activation checkpointing --------------------------------------------------------------------

typedef struct {
    TapeSegmentFn fn;
    const void *arg;         // a copy in the arena's host memory
    Tensor *x;
    int n_out;
    Tensor *outs[TAPE_SEGMENT_MAX_OUTS];
} SegmentRec;

// Runs the segment again from x with gradients on (records appended after the tape's end), seeds
// its outputs with the gradients the first outputs received, runs those records backwards and
// drops them: x and the parameters receive what the segment's records would have given them.
static void segment_backward(Tape *t, void *p) {
    SegmentRec *r = p;
    bool any = false;
    for (int k = 0; k < r->n_out; k++) any |= r->outs[k] && r->outs[k]->grad;
    if (!any) return;
    const int base = t->n;
    bool was = tape_set_grad_enabled(t, true);
    tape_clock(t);
    Tensor *outs[TAPE_SEGMENT_MAX_OUTS] = {0};
    r->fn(t, r->arg, r->x, outs);
    tape_set_grad_enabled(t, was);
    for (int k = 0; k < r->n_out; k++) {
        Tensor *g = r->outs[k] ? r->outs[k]->grad : NULL;
        if (!g || !outs[k] || !outs[k]->requires_grad || tape_grad_adopt(t, outs[k], g)) continue;
        bool fresh;   // not adopted (another dtype or size): written or added like any seed
        Tensor *d = tape_grad_fresh(t, outs[k], &fresh);
        if (fresh) op_scale_fwd(t->ctx, g, 1.0f, d);
        else op_accumulate(t->ctx, g, d);
    }
    for (int i = t->n - 1; i >= base; i--) run_record(t, i);
    t->n = base;
}

void tape_checkpoint(Tape *t, TapeSegmentFn fn, const void *arg, size_t arg_bytes, Tensor *x,
                     int n_out, Tensor **outs) {
    CG_CHECK(n_out >= 1 && n_out <= TAPE_SEGMENT_MAX_OUTS, "", "a checkpointed segment has "
             "%d outputs (1 to %d)", n_out, TAPE_SEGMENT_MAX_OUTS);
    for (int k = 0; k < n_out; k++) outs[k] = NULL;
    if (!t->grad_enabled) {
        fn(t, arg, x, outs);
        return;
    }
    // The segment's record goes first, so what the segment makes is stamped after it.
    const int c = t->n;
    SegmentRec *r = tape_record(t, segment_backward, sizeof(SegmentRec));
    void *copy = arena_host_alloc(t->arena, arg_bytes);
    memcpy(copy, arg, arg_bytes);
    *r = (SegmentRec){fn, copy, x, n_out, {0}};
    fn(t, copy, x, outs);
    // The outputs the segment made live until its record's backward; the rest is released now.
    bool made[TAPE_SEGMENT_MAX_OUTS] = {0};
    for (int k = 0; k < n_out; k++) {
        if (!outs[k] || arena_stamp_of(t->arena, outs[k]->data) <= c) continue;
        made[k] = true;
        arena_restamp(t->arena, outs[k]->data, ARENA_KEEP);
    }
    bool recorded = t->n > c + 1;
    t->n = recorded ? c + 1 : c;
    // Parameters first read inside the segment are final once its record has run.
    for (int u = t->n_uses - 1; u >= 0 && t->uses[u].entry > c; u--) t->uses[u].entry = c;
    arena_release_from(t->arena, c + 1);
    for (int k = 0; k < n_out; k++)
        if (made[k]) arena_restamp(t->arena, outs[k]->data, c);
    tape_clock(t);
    memcpy(r->outs, outs, (size_t)n_out * sizeof *outs);
}

void tape_backward(Tape *t, Tensor *loss) {
    CG_CHECK(loss->numel == 1, "", "backward needs a scalar loss, got %zu elements", loss->numel);
    CG_CHECK(loss->requires_grad, "check that some parameter is trainable",
             "backward: the loss does not depend on any trainable parameter");
    Tensor *g = tape_grad(t, loss);
    if (g->dtype != DTYPE_F32 || t->ctx->device != DEVICE_CUDA) {
        float one = 1.0f;
        tensor_upload_f32(t->ctx, g, &one);
    } else {
        if (!t->one) {
            t->one = device_alloc(t->ctx, sizeof(float));
            Tensor o = *g;
            o.data = t->one;
            float one = 1.0f;
            tensor_upload(t->ctx, &o, &one);
        }
        device_copy(t->ctx, g->data, t->one, sizeof(float));
    }
    run_backward(t);
}

static void backward_from(Tape *t, int n, Tensor **outs, Tensor **grads, bool consume) {
    for (int i = 0; i < n; i++) {
        CG_CHECK(outs[i]->requires_grad, "check that some parameter is trainable",
                 "backward: output %d does not depend on any trainable parameter", i);
        CG_CHECK(grads[i]->numel == outs[i]->numel, "", "backward: gradient %d has %zu elements, "
                 "its output %zu", i, grads[i]->numel, outs[i]->numel);
        if (consume && tape_grad_adopt(t, outs[i], grads[i])) continue;
        // A seed is written (converted to the output's dtype), not added to a zeroed buffer,
        // unless an earlier seed already reached the same output.
        bool fresh;
        Tensor *g = tape_grad_fresh(t, outs[i], &fresh);
        if (fresh) op_scale_fwd(t->ctx, grads[i], 1.0f, g);
        else op_accumulate(t->ctx, grads[i], g);
    }
    run_backward(t);
}

void tape_backward_from(Tape *t, int n, Tensor **outs, Tensor **grads) {
    backward_from(t, n, outs, grads, false);
}

void tape_backward_from_consume(Tape *t, int n, Tensor **outs, Tensor **grads) {
    backward_from(t, n, outs, grads, true);
}

#include "tape.h"
#include "error.h"
#include "../kernels/ops.h"

void tape_init(Tape *t, Ctx *ctx, Arena *arena) {
    memset(t, 0, sizeof(*t));
    t->ctx = ctx;
    t->arena = arena;
    t->grad_enabled = true;
}

void tape_free(Tape *t) {
    free(t->entries);
    t->entries = NULL;
    t->n = t->cap = 0;
}

void tape_reset(Tape *t) {
    t->n = 0;
    arena_reset(t->arena);
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

bool tape_track(Tape *t, Tensor *out, const Tensor *a, const Tensor *b, const Tensor *c) {
    out->requires_grad = t->grad_enabled && ((a && a->requires_grad) || (b && b->requires_grad) ||
                                             (c && c->requires_grad));
    return out->requires_grad;
}

void *tape_record(Tape *t, TapeBackwardFn fn, size_t bytes) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->entries = cg_realloc(t->entries, (size_t)t->cap * sizeof(TapeEntry));
    }
    void *record = arena_host_alloc(t->arena, bytes);
    t->entries[t->n++] = (TapeEntry){fn, record};
    return record;
}

Tensor *tape_grad(Tape *t, Tensor *x) {
    if (!x || !x->requires_grad) return NULL;
    if (!x->grad) {
        Tensor *g = tape_tensor_like(t, x);   // same dtype as the activation, as in llm.c
        op_zero(t->ctx, g);
        x->grad = g;
    }
    return x->grad;
}

Tensor *tape_grad_fresh(Tape *t, Tensor *x, bool *fresh) {
    *fresh = false;
    if (!x || !x->requires_grad) return NULL;
    if (!x->grad) {
        x->grad = tape_tensor_like(t, x);
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
    return true;
}

void tape_backward(Tape *t, Tensor *loss) {
    CG_CHECK(loss->numel == 1, "", "backward needs a scalar loss, got %zu elements", loss->numel);
    CG_CHECK(loss->requires_grad, "check that some parameter is trainable",
             "backward: the loss does not depend on any trainable parameter");
    Tensor *g = tape_grad(t, loss);
    float one = 1.0f;
    tensor_upload(t->ctx, g, &one);
    for (int i = t->n - 1; i >= 0; i--) t->entries[i].backward(t, t->entries[i].record);
}

void tape_backward_from(Tape *t, int n, Tensor **outs, Tensor **grads) {
    for (int i = 0; i < n; i++) {
        CG_CHECK(outs[i]->requires_grad, "check that some parameter is trainable",
                 "backward: output %d does not depend on any trainable parameter", i);
        CG_CHECK(grads[i]->numel == outs[i]->numel, "", "backward: gradient %d has %zu elements, "
                 "its output %zu", i, grads[i]->numel, outs[i]->numel);
        op_accumulate(t->ctx, grads[i], tape_grad(t, outs[i]));
    }
    for (int i = t->n - 1; i >= 0; i--) t->entries[i].backward(t, t->entries[i].record);
}

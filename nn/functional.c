#include "functional.h"
#include "../kernels/error.h"

// A record is the tensors the backward reads; `y` is always the op's output.
#define NEED_GRAD(r) ((r)->y->grad != NULL)

// A tensor of like's shape but the last dim, in like's dtype.
static Tensor *new_shaped(Tape *t, const Tensor *like, int last) {
    int shape[TENSOR_MAX_DIMS];
    memcpy(shape, like->shape, sizeof(shape));
    shape[like->ndim - 1] = last;
    Tensor *y = tape_tensor(t, like->ndim, shape, like->dtype == DTYPE_F32);
    y->dtype = like->dtype;
    return y;
}

// dy into x's gradient for the backward of an identity-like op: x takes dy itself when it has no
// gradient yet and the dtypes agree (tape_grad_adopt), dy converted when they differ (written into
// a fresh gradient, never zeroed), else dy is added.
static void pass_grad(Tape *t, Tensor *x, Tensor *dy) {
    if (!x || !x->requires_grad || tape_grad_adopt(t, x, dy)) return;
    bool fresh;
    Tensor *dx = tape_grad_fresh(t, x, &fresh);
    if (fresh) op_scale_fwd(t->ctx, dy, 1.0f, dx);   // dx = 1 * dy, converting on the way
    else op_accumulate(t->ctx, dy, dx);
}

// The gradient of a residual branch's output from dy, the gradient of res + branch (the fp32
// stream), in the branch's dtype: dy itself when the dtypes agree (db untouched), else a converted
// copy with the branch's last bias gradient db (may be NULL) summed in the same pass (*db_done).
// Called before pass_grad(res, dy): res may adopt dy, and the backward of what produced res then
// writes into it.
static Tensor *branch_grad(Tape *t, Tensor *dy, const Tensor *branch_like, Tensor *db,
                           bool *db_done) {
    *db_done = false;
    if (dy->dtype == branch_like->dtype) return dy;
    Tensor *g = tape_tensor(t, dy->ndim, dy->shape, branch_like->dtype == DTYPE_F32);
    op_cast_colsum(t->ctx, dy, g, db);
    *db_done = db != NULL;
    return g;
}

// ---- linear ----
typedef struct { Tensor *x, *w, *b, *y; } LinearRec;
static void linear_backward(Tape *t, void *p) {
    LinearRec *r = p;
    if (!NEED_GRAD(r)) return;
    bool fresh;   // a dx nothing has written yet is written, not zeroed and added to
    Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
    op_linear_bwd(t->ctx, r->y->grad, r->x, r->w, fresh ? LINEAR_WRITE_DX : 0, NULL, dx,
                  tape_grad(t, r->w), tape_grad(t, r->b));
}
Tensor *nn_linear(Tape *t, Tensor *x, Tensor *w, Tensor *b) {
    CG_CHECK(tensor_last(x) == w->shape[1], "", "linear: input width %d, weight expects %d",
             tensor_last(x), w->shape[1]);
    Tensor *y = new_shaped(t, x, w->shape[0]);
    op_linear_fwd(t->ctx, x, w, b, NULL, y);
    if (tape_track(t, y, x, w, b))
        *(LinearRec *)tape_record(t, linear_backward, sizeof(LinearRec)) = (LinearRec){x, w, b, y};
    return y;
}

// ---- layernorm ----
typedef struct { Tensor *x, *w, *b, *mean, *rstd, *y; } LayerNormRec;
static void layernorm_backward(Tape *t, void *p) {
    LayerNormRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_layernorm_bwd(t->ctx, r->y->grad, r->x, r->w, r->mean, r->rstd, tape_grad(t, r->x),
                     tape_grad(t, r->w), tape_grad(t, r->b), NULL, NULL);
}
// The output y and the statistics of a LayerNorm of x: y in the activation dtype, or fp32 with
// f32; mean and rstd fp32.
static Tensor *layernorm_outputs(Tape *t, const Tensor *x, bool f32, Tensor **mean, Tensor **rstd) {
    int rows[1] = {(int)tensor_rows(x)};
    *mean = tape_tensor(t, 1, rows, true);
    *rstd = tape_tensor(t, 1, rows, true);
    return tape_tensor(t, x->ndim, x->shape, f32);
}
static Tensor *layernorm_into(Tape *t, Tensor *x, Tensor *w, Tensor *b, float eps, bool f32) {
    Tensor *mean, *rstd, *y = layernorm_outputs(t, x, f32, &mean, &rstd);
    op_layernorm_fwd(t->ctx, x, NULL, w, b, eps, NULL, y, mean, rstd);
    if (tape_track(t, y, x, w, b))
        *(LayerNormRec *)tape_record(t, layernorm_backward, sizeof(LayerNormRec)) =
            (LayerNormRec){x, w, b, mean, rstd, y};
    return y;
}
Tensor *nn_layernorm(Tape *t, Tensor *x, Tensor *w, Tensor *b, float eps) {
    return layernorm_into(t, x, w, b, eps, false);
}
Tensor *nn_layernorm_f32(Tape *t, Tensor *x, Tensor *w, Tensor *b, float eps) {
    return layernorm_into(t, x, w, b, eps, true);   // a bf16 x is read as it is (layernorm_fwd)
}

// ---- linear onto a residual: y = res + x w^T + b (linear_fwd onto res) ----
typedef struct { Tensor *x, *w, *b, *res, *y; } LinearResidualRec;
static void linear_residual_backward(Tape *t, void *p) {
    LinearResidualRec *r = p;
    Tensor *dy = r->y->grad;
    if (!dy) return;
    Tensor *dw = tape_grad(t, r->w), *db = tape_grad(t, r->b);
    if (dw || db || r->x->requires_grad) {
        bool fresh;   // dy may be the fp32 stream's gradient under a bf16 x (linear_bwd reads it)
        Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
        op_linear_bwd(t->ctx, dy, r->x, r->w, fresh ? LINEAR_WRITE_DX : 0, NULL, dx, dw, db);
    }
    pass_grad(t, r->res, dy);
}
// Records y = res + x w^T + b where a gradient is wanted (the residual's or the branch's).
static void linear_residual_record(Tape *t, Tensor *x, Tensor *w, Tensor *b, Tensor *res, Tensor *y) {
    bool track = tape_track(t, y, x, w, b);
    if (t->grad_enabled && res->requires_grad) track = y->requires_grad = true;
    if (track)
        *(LinearResidualRec *)tape_record(t, linear_residual_backward, sizeof(LinearResidualRec)) =
            (LinearResidualRec){x, w, b, res, y};
}
Tensor *nn_linear_residual(Tape *t, Tensor *res, Tensor *x, Tensor *w, Tensor *b) {
    CG_CHECK(tensor_last(x) == w->shape[1] && res->numel == tensor_rows(x) * (size_t)w->shape[0],
             "", "linear onto a residual: input width %d, weight (%d, %d), residual of %zu "
             "elements", tensor_last(x), w->shape[0], w->shape[1], res->numel);
    Tensor *y = tape_tensor_like(t, res);
    op_linear_fwd(t->ctx, x, w, b, &(LinearFwdOpts){.res = res}, y);
    linear_residual_record(t, x, w, b, res, y);
    return y;
}

// ---- linear onto a residual, then LayerNorm: h = res + x w^T + b, y = layernorm(h) ----
typedef struct { Tensor *x, *w, *b, *res; LayerNormRec ln; } LinearAddLayerNormRec;   // ln.x: h
static void linear_add_layernorm_backward(Tape *t, void *p) {
    LinearAddLayerNormRec *r = p;
    Tensor *h = r->ln.x;
    Tensor *dw = tape_grad(t, r->w), *db = tape_grad(t, r->b);
    bool branch = dw || db || r->x->requires_grad;
    // The norm's backward completes h's gradient: every other reader of h was recorded after
    // this record, so its backward has run. On the way the norm hands the final gradient on in the
    // branch's dtype, with the branch's bias gradient (when the dtypes differ; else it is h's).
    Tensor *g = NULL;
    bool db_done = false;
    if (r->ln.y->grad) {
        bool handoff = branch && h->dtype != r->x->dtype;
        if (handoff) g = tape_tensor(t, h->ndim, h->shape, r->x->dtype == DTYPE_F32);
        op_layernorm_bwd(t->ctx, r->ln.y->grad, h, r->ln.w, r->ln.mean, r->ln.rstd,
                         tape_grad(t, h), tape_grad(t, r->ln.w), tape_grad(t, r->ln.b), g,
                         handoff ? db : NULL);
        db_done = handoff && db;
    }
    Tensor *dh = h->grad;
    if (!dh) return;
    if (branch && !g) g = branch_grad(t, dh, r->x, db, &db_done);
    if (g) {
        bool fresh;
        Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
        op_linear_bwd(t->ctx, g, r->x, r->w, fresh ? LINEAR_WRITE_DX : 0, NULL, dx, dw,
                      db_done ? NULL : db);
    }
    pass_grad(t, r->res, dh);
}
Tensor *nn_linear_add_layernorm(Tape *t, Tensor *res, Tensor *x, Tensor *w, Tensor *b,
                                Tensor *ln_w, Tensor *ln_b, float eps, Tensor **normed) {
    CG_CHECK(tensor_last(x) == w->shape[1] && res->numel == tensor_rows(x) * (size_t)w->shape[0],
             "", "linear onto a residual: input width %d, weight (%d, %d), residual of %zu "
             "elements", tensor_last(x), w->shape[0], w->shape[1], res->numel);
    // The branch m (res's shape, the activation dtype) is not on the tape: its gradient is
    // formed by the record's backward.
    Tensor *m = tape_tensor(t, res->ndim, res->shape, false);
    op_linear_fwd(t->ctx, x, w, b, NULL, m);
    Tensor *h = tape_tensor_like(t, res);
    Tensor *mean, *rstd, *y = layernorm_outputs(t, h, false, &mean, &rstd);
    op_layernorm_fwd(t->ctx, res, m, ln_w, ln_b, eps, h, y, mean, rstd);
    tape_release(t, m);
    tape_track(t, h, x, w, b);
    if (t->grad_enabled && res->requires_grad) h->requires_grad = true;
    if (tape_track(t, y, h, ln_w, ln_b))   // h needs a gradient, or a norm parameter is trained
        *(LinearAddLayerNormRec *)tape_record(t, linear_add_layernorm_backward,
                                              sizeof(LinearAddLayerNormRec)) =
            (LinearAddLayerNormRec){x, w, b, res, {h, ln_w, ln_b, mean, rstd, y}};
    *normed = y;
    return h;
}

// ---- gelu ----
typedef struct { Tensor *x, *y; GeluKind kind; } GeluRec;
static void gelu_backward(Tape *t, void *p) {
    GeluRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_gelu_bwd(t->ctx, r->y->grad, r->x, r->kind, tape_grad(t, r->x));
}
Tensor *nn_gelu(Tape *t, Tensor *x, GeluKind kind) {
    Tensor *y = tape_tensor_like(t, x);
    op_gelu_fwd(t->ctx, x, kind, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(GeluRec *)tape_record(t, gelu_backward, sizeof(GeluRec)) = (GeluRec){x, y, kind};
    return y;
}

// ---- silu ----
typedef struct { Tensor *x, *y; } SiluRec;
static void silu_backward(Tape *t, void *p) {
    SiluRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_silu_bwd(t->ctx, r->y->grad, r->x, tape_grad(t, r->x));
}
Tensor *nn_silu(Tape *t, Tensor *x) {
    Tensor *y = tape_tensor_like(t, x);
    op_silu_fwd(t->ctx, x, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(SiluRec *)tape_record(t, silu_backward, sizeof(SiluRec)) = (SiluRec){x, y};
    return y;
}

// ---- silu, then linear: y = silu(x) w^T + b (linear_fwd's silu_in), silu's output not stored ----
typedef struct { Tensor *x, *w, *b, *y; } SiluLinearRec;
static void silu_linear_backward(Tape *t, void *p) {
    SiluLinearRec *r = p;
    if (!NEED_GRAD(r)) return;
    bool fresh;   // silu_in's backward writes dx: into x's gradient when new, else added to it
    Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
    Tensor *into = dx && !fresh ? tape_tensor_like(t, r->x) : dx;
    op_linear_bwd(t->ctx, r->y->grad, r->x, r->w, 0, &(LinearBwdOpts){.silu_in = 1}, into,
                  tape_grad(t, r->w), tape_grad(t, r->b));
    if (into != dx) op_accumulate(t->ctx, into, dx);
}
Tensor *nn_silu_linear(Tape *t, Tensor *x, Tensor *w, Tensor *b) {
    CG_CHECK(tensor_last(x) == w->shape[1], "", "silu + linear: input width %d, weight expects %d",
             tensor_last(x), w->shape[1]);
    Tensor *y = new_shaped(t, x, w->shape[0]);
    op_linear_fwd(t->ctx, x, w, b, &(LinearFwdOpts){.silu_in = 1}, y);
    if (tape_track(t, y, x, w, b))
        *(SiluLinearRec *)tape_record(t, silu_linear_backward, sizeof(SiluLinearRec)) =
            (SiluLinearRec){x, w, b, y};
    return y;
}

// ---- MLP: linear + GELU + linear ----
// The record keeps fc1's output pre and, with keep_hidden, h = gelu(pre). Without it backward
// makes h again from pre (one elementwise pass, as torch.compile's partitioner does), so the
// forward keeps 2 bytes less per hidden unit and token (the widest activation of a block). On the
// CPU, and for the erf GELU on the GPU, those bits are the forward's; for the tanh GELU on the GPU
// the forward's h came from the fp32 product (the GEMM's GELU epilogue), the recomputed one from
// pre rounded to the activation dtype.
typedef struct { Tensor *x, *w1, *b1, *w2, *b2, *pre, *h, *y; GeluKind kind; } MlpRec;
// The MLP's backward from dy, the gradient of its output (fc2's y) in the activation dtype.
// db2: fc2's bias gradient, or NULL when the caller has it already (branch_grad).
static void mlp_backward_from(Tape *t, const MlpRec *r, const Tensor *dy, Tensor *db2) {
    bool fresh;
    Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
    Tensor *dw1 = tape_grad(t, r->w1), *db1 = tape_grad(t, r->b1);
    Tensor *h = r->h;
    if (!h) {
        h = tape_tensor_like(t, r->pre);
        op_gelu_fwd(t->ctx, r->pre, r->kind, h);
    }
    // dpre is written by fc2's backward with gelu_in (never zeroed); not needed when fc1 wants
    // nothing. fc1's bias gradient, the column sums of dpre, comes with dpre (one product on the
    // GPU).
    Tensor *dpre = dx || dw1 || db1 ? tape_tensor_like(t, r->pre) : NULL;
    const LinearBwdOpts gelu_in = {.gelu_in = 1, .gelu_kind = r->kind, .pre = r->pre,
                                   .dpre_db = db1};
    op_linear_bwd(t->ctx, dy, h, r->w2, 0, &gelu_in, dpre, tape_grad(t, r->w2), db2);
    if (!r->h) tape_release(t, h);
    if (dpre && (dx || dw1))
        op_linear_bwd(t->ctx, dpre, r->x, r->w1, fresh ? LINEAR_WRITE_DX : 0, NULL, dx, dw1, NULL);
}
static void mlp_backward(Tape *t, void *p) {
    MlpRec *r = p;
    if (NEED_GRAD(r)) mlp_backward_from(t, r, r->y->grad, tape_grad(t, r->b2));
}
Tensor *nn_mlp(Tape *t, Tensor *x, Tensor *w1, Tensor *b1, Tensor *w2, Tensor *b2, GeluKind kind,
               bool keep_hidden) {
    CG_CHECK(tensor_last(x) == w1->shape[1] && w2->shape[1] == w1->shape[0], "",
             "MLP: input width %d, fc1 (%d, %d), fc2 (%d, %d)", tensor_last(x), w1->shape[0],
             w1->shape[1], w2->shape[0], w2->shape[1]);
    Tensor *h = new_shaped(t, x, w1->shape[0]);
    Tensor *y = new_shaped(t, x, w2->shape[0]);
    tape_track(t, h, x, w1, b1);
    bool track = tape_track(t, y, h, w2, b2);
    Tensor *pre = track ? new_shaped(t, x, w1->shape[0]) : NULL;
    op_linear_fwd(t->ctx, x, w1, b1,
                  &(LinearFwdOpts){.gelu_out = 1, .gelu_kind = kind, .pre = pre}, h);
    op_linear_fwd(t->ctx, h, w2, b2, NULL, y);
    const bool keep = track && keep_hidden;
    if (!keep) tape_release(t, h);   // made again from pre in backward
    if (track)
        *(MlpRec *)tape_record(t, mlp_backward, sizeof(MlpRec)) =
            (MlpRec){x, w1, b1, w2, b2, pre, keep ? h : NULL, y, kind};
    return y;
}

// ---- MLP onto a residual: y = res + MLP(x), fc2 writing the sum (linear_fwd onto res) ----
typedef struct { MlpRec m; Tensor *res; } MlpResidualRec;   // m.y: the sum
static void mlp_residual_backward(Tape *t, void *p) {
    MlpResidualRec *r = p;
    Tensor *dy = r->m.y->grad;
    if (!dy) return;
    const MlpRec *m = &r->m;
    if (m->x->requires_grad || m->w1->requires_grad || (m->b1 && m->b1->requires_grad) ||
        m->w2->requires_grad || (m->b2 && m->b2->requires_grad)) {
        Tensor *db2 = tape_grad(t, m->b2);
        bool db2_done;
        Tensor *dm = branch_grad(t, dy, m->pre, db2, &db2_done);
        mlp_backward_from(t, m, dm, db2_done ? NULL : db2);
    }
    pass_grad(t, r->res, dy);
}
Tensor *nn_mlp_residual(Tape *t, Tensor *res, Tensor *x, Tensor *w1, Tensor *b1, Tensor *w2,
                        Tensor *b2, GeluKind kind, bool keep_hidden) {
    CG_CHECK(tensor_last(x) == w1->shape[1] && w2->shape[1] == w1->shape[0] &&
                 res->numel == tensor_rows(x) * (size_t)w2->shape[0], "",
             "MLP on a residual: input width %d, fc1 (%d, %d), fc2 (%d, %d), residual of %zu "
             "elements", tensor_last(x), w1->shape[0], w1->shape[1], w2->shape[0], w2->shape[1],
             res->numel);
    if (!tape_would_track(t, x, w1, b1) && !tape_would_track(t, w2, b2, res)) {   // nothing recorded
        Tensor *y = tape_tensor_like(t, res);
        op_mlp_residual_fwd(t->ctx, x, NULL, w1, b1, w2, b2, kind, res, y);
        return y;
    }
    Tensor *h = new_shaped(t, x, w1->shape[0]);
    Tensor *y = tape_tensor_like(t, res);
    tape_track(t, h, x, w1, b1);
    bool track = tape_track(t, y, h, w2, b2);
    if (t->grad_enabled && res->requires_grad) track = y->requires_grad = true;
    Tensor *pre = track ? new_shaped(t, x, w1->shape[0]) : NULL;
    op_linear_fwd(t->ctx, x, w1, b1,
                  &(LinearFwdOpts){.gelu_out = 1, .gelu_kind = kind, .pre = pre}, h);
    op_linear_fwd(t->ctx, h, w2, b2, &(LinearFwdOpts){.res = res}, y);
    const bool keep = track && keep_hidden;
    if (!keep) tape_release(t, h);   // made again from pre in backward
    if (track)
        *(MlpResidualRec *)tape_record(t, mlp_residual_backward, sizeof(MlpResidualRec)) =
            (MlpResidualRec){{x, w1, b1, w2, b2, pre, keep ? h : NULL, y, kind}, res};
    return y;
}

Tensor *nn_layernorm_mlp_residual(Tape *t, Tensor *res, Tensor *ln_w, Tensor *ln_b, float eps,
                                  Tensor *w1, Tensor *b1, Tensor *w2, Tensor *b2, GeluKind kind,
                                  bool keep_hidden) {
    if (tape_would_track(t, res, ln_w, ln_b) || tape_would_track(t, w1, b1, NULL) ||
        tape_would_track(t, w2, b2, NULL))
        return nn_mlp_residual(t, res, nn_layernorm(t, res, ln_w, ln_b, eps), w1, b1, w2, b2, kind,
                               keep_hidden);
    CG_CHECK(tensor_last(res) == w1->shape[1] && w2->shape[1] == w1->shape[0] &&
                 w2->shape[0] == w1->shape[1], "",
             "MLP after a LayerNorm on a residual: width %d, fc1 (%d, %d), fc2 (%d, %d)",
             tensor_last(res), w1->shape[0], w1->shape[1], w2->shape[0], w2->shape[1]);
    Tensor *y = tape_tensor_like(t, res);
    op_mlp_residual_fwd(t->ctx, NULL, &(MlpInputNorm){ln_w, ln_b, eps}, w1, b1, w2, b2, kind, res, y);
    return y;
}

// ---- softmax ----
typedef struct { Tensor *x, *y; } UnaryRec;
static void softmax_backward(Tape *t, void *p) {
    UnaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_softmax_bwd(t->ctx, r->y->grad, r->y, tape_grad(t, r->x));
}
Tensor *nn_softmax(Tape *t, Tensor *x) {
    Tensor *y = tape_tensor_like(t, x);
    op_softmax_fwd(t->ctx, x, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(UnaryRec *)tape_record(t, softmax_backward, sizeof(UnaryRec)) = (UnaryRec){x, y};
    return y;
}

// ---- attention ----
typedef struct { Tensor *qkv, *lse, *y; int heads; } AttentionRec;
static void attention_backward(Tape *t, void *p) {
    AttentionRec *r = p;
    if (!NEED_GRAD(r)) return;
    bool fresh;
    Tensor *dqkv = tape_grad_fresh(t, r->qkv, &fresh);
    if (dqkv)
        op_attention_bwd(t->ctx, r->y->grad, r->qkv, r->y, r->lse, r->heads,
                         fresh ? ATTENTION_WRITE_DQKV : 0, dqkv);
}
Tensor *nn_attention(Tape *t, Tensor *qkv, int heads) {
    CG_CHECK(qkv->ndim == 3 && qkv->shape[2] % (3 * heads) == 0, "",
             "attention: qkv must be (B,N,3C) with C divisible by heads=%d", heads);
    int B = qkv->shape[0], N = qkv->shape[1], C = qkv->shape[2] / 3;
    Tensor *y = tape_tensor(t, 3, (int[]){B, N, C}, false);
    Tensor *lse = tape_tensor(t, 3, (int[]){B, heads, N}, true);
    op_attention_fwd(t->ctx, qkv, heads, y, lse);
    if (tape_track(t, y, qkv, NULL, NULL))
        *(AttentionRec *)tape_record(t, attention_backward, sizeof(AttentionRec)) =
            (AttentionRec){qkv, lse, y, heads};
    return y;
}

// ---- patch embed ----
typedef struct { Tensor *img, *cols, *w, *b, *y; int patch; } PatchEmbedRec;
static void patch_embed_backward(Tape *t, void *p) {
    PatchEmbedRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_patch_embed_bwd(t->ctx, r->y->grad, r->cols, r->w, r->patch, tape_grad(t, r->img),
                       tape_grad(t, r->w), tape_grad(t, r->b));
}
Tensor *nn_patch_embed(Tape *t, Tensor *img, Tensor *w, Tensor *b, int patch) {
    CG_CHECK(img->ndim == 4, "", "patch embed expects images (B,C,H,W)");
    int B = img->shape[0], Cin = img->shape[1], Hi = img->shape[2], Wi = img->shape[3];
    CG_CHECK(Hi % patch == 0 && Wi % patch == 0, "set img_size to a multiple of patch",
             "image %dx%d is not divisible by patch %d", Hi, Wi, patch);
    CG_CHECK(w->numel == (size_t)w->shape[0] * Cin * patch * patch, "check in_chans and patch",
             "patch embed weight has %zu elements, images need %d x %d x %d x %d", w->numel,
             w->shape[0], Cin, patch, patch);
    int H = Hi / patch, W = Wi / patch, D = w->shape[0];
    Tensor *cols = tape_tensor(t, 2, (int[]){B * H * W, Cin * patch * patch}, false);
    Tensor *y = tape_tensor(t, 4, (int[]){B, H, W, D}, false);
    op_patch_embed_fwd(t->ctx, img, w, b, patch, cols, y);
    if (tape_track(t, y, img, w, b))
        *(PatchEmbedRec *)tape_record(t, patch_embed_backward, sizeof(PatchEmbedRec)) =
            (PatchEmbedRec){img, cols, w, b, y, patch};
    return y;
}

// ---- add, scale, broadcast add, layer scale ----
typedef struct { Tensor *a, *b, *y; } BinaryRec;
static void add_backward(Tape *t, void *p) {
    BinaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    // b first: once a adopts dy, a's later backward may change it (x + x still works: the
    // second pass adds dy into itself).
    pass_grad(t, r->b, r->y->grad);
    pass_grad(t, r->a, r->y->grad);
}
Tensor *nn_add(Tape *t, Tensor *a, Tensor *b) {
    CG_CHECK(a->numel == b->numel, "", "add of %zu and %zu elements", a->numel, b->numel);
    Tensor *y = tape_tensor_like(t, a);
    op_add_fwd(t->ctx, a, b, y);
    if (tape_track(t, y, a, b, NULL))
        *(BinaryRec *)tape_record(t, add_backward, sizeof(BinaryRec)) = (BinaryRec){a, b, y};
    return y;
}

typedef struct { Tensor *x, *y; float s; } ScaleRec;
static void scale_backward(Tape *t, void *p) {
    ScaleRec *r = p;
    if (!NEED_GRAD(r)) return;
    if (r->s == 1.0f) {   // a cast, or a scale by one: an identity
        pass_grad(t, r->x, r->y->grad);
        return;
    }
    bool fresh;
    Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
    if (dx && fresh) op_scale_fwd(t->ctx, r->y->grad, r->s, dx);
    else if (dx) op_scale_bwd(t->ctx, r->y->grad, r->s, dx);
}
Tensor *nn_scale(Tape *t, Tensor *x, float s) {
    Tensor *y = tape_tensor_like(t, x);
    op_scale_fwd(t->ctx, x, s, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(ScaleRec *)tape_record(t, scale_backward, sizeof(ScaleRec)) = (ScaleRec){x, y, s};
    return y;
}

typedef struct { Tensor *x, *y; DropPathArgs a; } DropPathRec;
static void drop_path_backward(Tape *t, void *p) {
    DropPathRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *dx = tape_grad(t, r->x);
    if (dx) op_drop_path_bwd(t->ctx, r->y->grad, &r->a, dx);
}
Tensor *nn_drop_path(Tape *t, Tensor *x, const DropPathArgs *a) {
    if (a->prob <= 0.0f) return x;
    Tensor *y = tape_tensor_like(t, x);
    op_drop_path_fwd(t->ctx, x, a, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(DropPathRec *)tape_record(t, drop_path_backward, sizeof(DropPathRec)) = (DropPathRec){x, y, *a};
    return y;
}

static void add_bcast_backward(Tape *t, void *p) {
    BinaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *dp = tape_grad(t, r->b);
    if (tape_grad_adopt(t, r->a, r->y->grad)) {   // dx is dy itself: only dp to compute
        if (dp) op_add_bcast_bwd(t->ctx, r->y->grad, NULL, dp);
        return;
    }
    op_add_bcast_bwd(t->ctx, r->y->grad, tape_grad(t, r->a), dp);
}
Tensor *nn_add_bcast(Tape *t, Tensor *x, Tensor *p) {
    CG_CHECK(x->numel % p->numel == 0, "", "broadcast add of %zu onto %zu elements", p->numel,
             x->numel);
    Tensor *y = tape_tensor_like(t, x);
    op_add_bcast_fwd(t->ctx, x, p, y);
    if (tape_track(t, y, x, p, NULL))
        *(BinaryRec *)tape_record(t, add_bcast_backward, sizeof(BinaryRec)) = (BinaryRec){x, p, y};
    return y;
}

static void layer_scale_backward(Tape *t, void *p) {
    BinaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_layer_scale_bwd(t->ctx, r->y->grad, r->a, r->b, tape_grad(t, r->a), tape_grad(t, r->b));
}
Tensor *nn_layer_scale(Tape *t, Tensor *x, Tensor *g) {
    Tensor *y = tape_tensor_like(t, x);
    op_layer_scale_fwd(t->ctx, x, g, y);
    if (tape_track(t, y, x, g, NULL))
        *(BinaryRec *)tape_record(t, layer_scale_backward, sizeof(BinaryRec)) = (BinaryRec){x, g, y};
    return y;
}

// ---- token layout ----
static void concat_prefix_backward(Tape *t, void *p) {
    BinaryRec *r = p;   // a = prefix, b = x
    if (!NEED_GRAD(r)) return;
    op_concat_prefix_bwd(t->ctx, r->y->grad, tape_grad(t, r->a), tape_grad(t, r->b));
}
Tensor *nn_concat_prefix(Tape *t, Tensor *prefix, Tensor *x) {
    int B = x->shape[0], N = x->shape[1], C = x->shape[2], P = prefix->shape[0];
    CG_CHECK(x->ndim == 3 && prefix->shape[prefix->ndim - 1] == C, "",
             "prefix tokens of width %d onto tokens of width %d", tensor_last(prefix), C);
    Tensor *y = tape_tensor(t, 3, (int[]){B, P + N, C}, false);
    op_concat_prefix_fwd(t->ctx, prefix, x, y);
    if (tape_track(t, y, prefix, x, NULL))
        *(BinaryRec *)tape_record(t, concat_prefix_backward, sizeof(BinaryRec)) =
            (BinaryRec){prefix, x, y};
    return y;
}

typedef struct { Tensor *x, *y; int start; } SliceRec;
static void slice_backward(Tape *t, void *p) {
    SliceRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *dx = tape_grad(t, r->x);
    if (dx) op_slice_tokens_bwd(t->ctx, r->y->grad, r->start, dx);
}
Tensor *nn_slice_tokens(Tape *t, Tensor *x, int start, int count) {
    CG_CHECK(x->ndim == 3 && start >= 0 && start + count <= x->shape[1], "",
             "token slice [%d, %d) of %d tokens", start, start + count, x->shape[1]);
    // x's dtype: a slice of the fp32 residual stream (fc_norm models' tokens) stays fp32
    Tensor *y = tape_tensor(t, 3, (int[]){x->shape[0], count, x->shape[2]}, x->dtype == DTYPE_F32);
    op_slice_tokens_fwd(t->ctx, x, start, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(SliceRec *)tape_record(t, slice_backward, sizeof(SliceRec)) = (SliceRec){x, y, start};
    return y;
}

static void mean_tokens_backward(Tape *t, void *p) {
    UnaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *dx = tape_grad(t, r->x);
    if (dx) op_mean_tokens_bwd(t->ctx, r->y->grad, dx);
}
Tensor *nn_mean_tokens(Tape *t, Tensor *x) {
    CG_CHECK(x->ndim == 3, "", "mean over tokens expects (B,N,C)");
    Tensor *y = tape_tensor(t, 2, (int[]){x->shape[0], x->shape[2]}, x->dtype == DTYPE_F32);
    op_mean_tokens_fwd(t->ctx, x, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(UnaryRec *)tape_record(t, mean_tokens_backward, sizeof(UnaryRec)) = (UnaryRec){x, y};
    return y;
}

static void resize_backward(Tape *t, void *p) {
    UnaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *dx = tape_grad(t, r->x);
    if (dx) op_resize_bilinear_bwd(t->ctx, r->y->grad, dx);
}
Tensor *nn_resize_bilinear(Tape *t, Tensor *x, int h2, int w2) {
    CG_CHECK(x->ndim == 4, "", "bilinear resize expects a token grid (B,H,W,C)");
    Tensor *y = tape_tensor(t, 4, (int[]){x->shape[0], h2, w2, x->shape[3]}, false);
    op_resize_bilinear_fwd(t->ctx, x, y);
    if (tape_track(t, y, x, NULL, NULL))
        *(UnaryRec *)tape_record(t, resize_backward, sizeof(UnaryRec)) = (UnaryRec){x, y};
    return y;
}

Tensor *nn_cast(Tape *t, Tensor *x, DType dtype) {
    if (x->dtype == dtype) return x;
    Tensor *y = tape_tensor(t, x->ndim, x->shape, dtype == DTYPE_F32);
    y->dtype = dtype;
    op_scale_fwd(t->ctx, x, 1.0f, y);   // y = 1 * x, converting on the way
    if (tape_track(t, y, x, NULL, NULL))
        *(ScaleRec *)tape_record(t, scale_backward, sizeof(ScaleRec)) = (ScaleRec){x, y, 1.0f};
    return y;
}

static void view_backward(Tape *t, void *p) {
    UnaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    pass_grad(t, r->x, r->y->grad);
}
Tensor *nn_view(Tape *t, Tensor *x, int ndim, const int *shape) {
    Tensor *y = arena_host_alloc(t->arena, sizeof(Tensor));
    *y = tensor_view(x, ndim, shape);
    if (tape_track(t, y, x, NULL, NULL))
        *(UnaryRec *)tape_record(t, view_backward, sizeof(UnaryRec)) = (UnaryRec){x, y};
    return y;
}

// ---- losses ----
typedef struct { Tensor *logits, *targets, *probs, *y; } CrossEntropyRec;
static void cross_entropy_backward(Tape *t, void *p) {
    CrossEntropyRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *d = tape_grad(t, r->logits);
    if (d) op_cross_entropy_bwd(t->ctx, r->y->grad, r->probs, r->targets, d);
}
Tensor *nn_cross_entropy(Tape *t, Tensor *logits, Tensor *targets) {
    CG_CHECK(tensor_same_shape(logits, targets), "", "cross-entropy: logits and targets differ");
    Tensor *loss = tape_tensor(t, 1, (int[]){1}, true);
    Tensor *probs = tape_tensor(t, logits->ndim, logits->shape, true);
    op_cross_entropy_fwd(t->ctx, logits, targets, loss, probs);
    if (tape_track(t, loss, logits, NULL, NULL))
        *(CrossEntropyRec *)tape_record(t, cross_entropy_backward, sizeof(CrossEntropyRec)) =
            (CrossEntropyRec){logits, targets, probs, loss};
    return loss;
}

static void mse_backward(Tape *t, void *p) {
    BinaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_mse_bwd(t->ctx, r->y->grad, r->a, r->b, tape_grad(t, r->a), tape_grad(t, r->b));
}
Tensor *nn_mse(Tape *t, Tensor *a, Tensor *b) {
    CG_CHECK(a->numel == b->numel, "", "MSE of %zu and %zu elements", a->numel, b->numel);
    Tensor *loss = tape_tensor(t, 1, (int[]){1}, true);
    op_mse_fwd(t->ctx, a, b, loss);
    if (tape_track(t, loss, a, b, NULL))
        *(BinaryRec *)tape_record(t, mse_backward, sizeof(BinaryRec)) = (BinaryRec){a, b, loss};
    return loss;
}

static void token_kl_backward(Tape *t, void *p) {
    BinaryRec *r = p;
    if (!NEED_GRAD(r)) return;
    op_token_kl_bwd(t->ctx, r->y->grad, r->a, r->b, tape_grad(t, r->a), tape_grad(t, r->b));
}
Tensor *nn_token_kl(Tape *t, Tensor *s, Tensor *target) {
    CG_CHECK(s->numel == target->numel && tensor_last(s) == tensor_last(target), "",
             "KL between tensors of different shapes");
    Tensor *loss = tape_tensor(t, 1, (int[]){1}, true);
    op_token_kl_fwd(t->ctx, s, target, loss);
    if (tape_track(t, loss, s, target, NULL))
        *(BinaryRec *)tape_record(t, token_kl_backward, sizeof(BinaryRec)) =
            (BinaryRec){s, target, loss};
    return loss;
}

// ---- C-GSPN propagation ----
typedef struct { Tensor *xc, *gates, *merge, *hidden, *y; int shared_w; } GspnRec;
static void gspn_backward(Tape *t, void *p) {
    GspnRec *r = p;
    if (!NEED_GRAD(r)) return;
    // In a C-GSPN layer the scan's backward runs before the gate projection's (which also adds
    // into dxc), so both gradients are normally unwritten: the scan writes them, unzeroed.
    if (!r->xc->grad && !r->gates->grad) {
        bool fresh;
        Tensor *dxc = tape_grad_fresh(t, r->xc, &fresh), *dg = tape_grad_fresh(t, r->gates, &fresh);
        op_gspn_scan_bwd(t->ctx, r->y->grad, r->xc, r->gates, r->merge, r->shared_w, r->hidden,
                         GSPN_SCAN_WRITE_GRADS, dxc, dg, tape_grad(t, r->merge));
        return;
    }
    op_gspn_scan_bwd(t->ctx, r->y->grad, r->xc, r->gates, r->merge, r->shared_w, r->hidden, 0,
                     tape_grad(t, r->xc), tape_grad(t, r->gates), tape_grad(t, r->merge));
}
Tensor *nn_gspn_scan(Tape *t, Tensor *xc, Tensor *gates, Tensor *merge, int shared_w) {
    CG_CHECK(xc->ndim == 4, "", "C-GSPN propagation expects xc (B,H,W,Cc)");
    int B = xc->shape[0], H = xc->shape[1], W = xc->shape[2], Cc = xc->shape[3];
    int G = shared_w ? 4 * (2 * Cc + 3) : 20 * Cc;
    CG_CHECK(tensor_last(gates) == G && gates->numel == (size_t)B * H * W * G, "",
             "C-GSPN gates have width %d, expected %d for Cc=%d%s", tensor_last(gates), G, Cc,
             shared_w ? " with shared weights" : "");
    Tensor *y = tape_tensor_like(t, xc);
    bool track = tape_track(t, y, xc, gates, merge);
    Tensor *hidden = track ? tape_tensor(t, 5, (int[]){4, B, H, W, Cc}, true) : NULL;
    op_gspn_scan_fwd(t->ctx, xc, gates, merge, shared_w, y, hidden);
    if (track)
        *(GspnRec *)tape_record(t, gspn_backward, sizeof(GspnRec)) =
            (GspnRec){xc, gates, merge, hidden, y, shared_w};
    return y;
}

Tensor *nn_gspn_scan_proj(Tape *t, Tensor *xc, Tensor *gw, Tensor *gb, Tensor *merge, int shared_w) {
    if (tape_would_track(t, xc, gw, gb) || tape_would_track(t, merge, NULL, NULL))
        return nn_gspn_scan(t, xc, nn_linear(t, xc, gw, gb), merge, shared_w);
    Tensor *y = tape_tensor_like(t, xc);
    op_gspn_scan_proj_fwd(t->ctx, xc, gw, gb, merge, shared_w, y);
    return y;
}

// Forward only: a MAP head runs in frozen teachers and feature extraction, never under training.
Tensor *nn_attention_pool(Tape *t, Tensor *q, Tensor *kv, int heads) {
    CG_CHECK(kv->ndim == 3 && tensor_last(kv) % 2 == 0, "", "attention pooling: kv (B, N, 2C)");
    int B = kv->shape[0], C = tensor_last(kv) / 2;
    Tensor *y = tape_tensor(t, 2, (int[]){B, C}, kv->dtype == DTYPE_F32);
    y->dtype = kv->dtype;
    CG_CHECK(!tape_track(t, y, q, kv, NULL), "distill from a MAP-head teacher, or train with "
             "global_pool = token or avg", "attention pooling (global_pool = map) has no backward: "
             "it runs in frozen teachers and feature extraction");
    op_attention_pool_fwd(t->ctx, q, kv, heads, y);
    return y;
}

// ---- depthwise convolution ----
typedef struct { Tensor *x, *w, *b, *y; int flags; } DwconvRec;
static void dwconv_backward(Tape *t, void *p) {
    DwconvRec *r = p;
    if (!NEED_GRAD(r)) return;
    Tensor *dy = r->y->grad;
    bool fresh = false;
    Tensor *dx = tape_grad_fresh(t, r->x, &fresh), *into = dx;
    int flags = r->flags | (fresh ? DWCONV_WRITE_DX : 0);
    // x + dwconv(x) composed of nn_add and nn_dwconv: the add may have handed dy itself to x as
    // its gradient, and the taps would read neighbours already updated; they go to a buffer of
    // their own, then into dx.
    if (dx && dx->data == dy->data) {
        into = tape_tensor_like(t, dx);
        flags |= DWCONV_WRITE_DX;
    }
    op_dwconv_bwd(t->ctx, dy, r->x, r->w, flags, into, tape_grad(t, r->w), tape_grad(t, r->b));
    if (into != dx) op_accumulate(t->ctx, into, dx);
}
static void dwconv_record(Tape *t, Tensor *x, Tensor *w, Tensor *b, Tensor *y, int flags) {
    if (tape_track(t, y, x, w, b))
        *(DwconvRec *)tape_record(t, dwconv_backward, sizeof(DwconvRec)) = (DwconvRec){x, w, b, y, flags};
}
static Tensor *dwconv_flags(Tape *t, Tensor *x, Tensor *w, Tensor *b, int flags) {
    Tensor *y = tape_tensor_like(t, x);
    op_dwconv_fwd(t->ctx, x, NULL, NULL, NULL, w, b, flags, NULL, y);
    dwconv_record(t, x, w, b, y, flags);
    return y;
}
Tensor *nn_dwconv(Tape *t, Tensor *x, Tensor *w, Tensor *b) { return dwconv_flags(t, x, w, b, 0); }
Tensor *nn_dwconv_silu(Tape *t, Tensor *x, Tensor *w, Tensor *b) {
    // silu's backward reads the convolution's output: recorded, the two ops keep it
    if (tape_would_track(t, x, w, b)) return nn_silu(t, nn_dwconv(t, x, w, b));
    Tensor *y = tape_tensor_like(t, x);
    op_dwconv_fwd(t->ctx, x, NULL, NULL, NULL, w, b, DWCONV_SILU, NULL, y);
    return y;
}
Tensor *nn_dwconv_silu_linear(Tape *t, Tensor *x, Tensor *cw, Tensor *cb, Tensor *w, Tensor *b) {
    if (tape_would_track(t, x, cw, cb)) return nn_silu_linear(t, nn_dwconv(t, x, cw, cb), w, b);
    if (tape_would_track(t, w, b, NULL) || w->shape[0] > DWCONV_PROJ_MAX)
        return nn_linear(t, nn_dwconv_silu(t, x, cw, cb), w, b);
    // nothing recorded and a narrow projection: one op, the convolution's output never stored
    Tensor *y = new_shaped(t, x, w->shape[0]);
    op_dwconv_silu_proj_fwd(t->ctx, x, cw, cb, w, b, y);
    return y;
}
Tensor *nn_dwconv_residual(Tape *t, Tensor *x, Tensor *w, Tensor *b) {
    return dwconv_flags(t, x, w, b, DWCONV_RESIDUAL);
}
Tensor *nn_dwconv_residual_layernorm(Tape *t, Tensor *x, Tensor *w, Tensor *b, Tensor *ln_w,
                                     Tensor *ln_b, float eps, Tensor **stream) {
    if (tape_would_track(t, x, w, b) || tape_would_track(t, ln_w, ln_b, NULL)) {
        *stream = nn_dwconv_residual(t, x, w, b);
        return nn_layernorm(t, *stream, ln_w, ln_b, eps);
    }
    Tensor *h = tape_tensor_like(t, x), *y = tape_tensor(t, x->ndim, x->shape, false);
    op_dwconv_layernorm_fwd(t->ctx, x, w, b, ln_w, ln_b, eps, h, y);
    *stream = h;
    return y;
}
// One pass makes the stream between the two residuals (mid) and the LPU's output; recorded, mid
// is kept and the two records are those of nn_linear_residual and nn_dwconv_residual.
Tensor *nn_linear_residual_dwconv(Tape *t, Tensor *res, Tensor *u, Tensor *uw, Tensor *ub,
                                  Tensor *w, Tensor *b) {
    bool track_mid = tape_would_track(t, u, uw, ub) || (t->grad_enabled && res->requires_grad);
    Tensor *mid = NULL;
    if (track_mid || tape_would_track(t, w, b, NULL)) mid = tape_tensor_like(t, res);
    Tensor *y = tape_tensor_like(t, res);
    op_dwconv_fwd(t->ctx, res, u, uw, ub, w, b, DWCONV_RESIDUAL, mid, y);
    if (!mid) return y;
    linear_residual_record(t, u, uw, ub, res, mid);
    dwconv_record(t, mid, w, b, y, DWCONV_RESIDUAL);
    return y;
}

// ---- convolution ----
// The record keeps the forward's column matrix (the op's workspace for backward), not x: dx needs
// only x's shape and dtype.
typedef struct { Tensor *x, *w, *b, *cols, *y; int nchw, stride, pad; } Conv2dRec;
static void conv2d_backward(Tape *t, void *p) {
    Conv2dRec *r = p;
    if (!NEED_GRAD(r)) return;
    bool fresh;   // a dx nothing has written yet is written, not zeroed and added to
    Tensor *dx = tape_grad_fresh(t, r->x, &fresh);
    op_conv2d_bwd(t->ctx, r->y->grad, r->cols, r->w, r->nchw, r->stride, r->pad,
                  fresh ? CONV2D_WRITE_DX : 0, dx, tape_grad(t, r->w), tape_grad(t, r->b));
}
// y (B,Ho,Wo,Cout) of x under w, in w's dtype; *x as the op reads it: in fp32 (an image, the fp32
// stream) as it is, anything else cast to w's dtype.
static Tensor *conv2d_output(Tape *t, Tensor **x, const Tensor *w, int nchw, int stride, int pad) {
    const Tensor *xi = *x;
    CG_CHECK(xi->ndim == 4 && w->ndim == 4 && w->shape[2] == w->shape[3], "",
             "conv2d: x (B,H,W,C) or (B,C,H,W) and w (Cout, C, k, k)");
    int k = w->shape[3], C = w->shape[1], Cout = w->shape[0], B = xi->shape[0];
    int H = nchw ? xi->shape[2] : xi->shape[1], W = nchw ? xi->shape[3] : xi->shape[2];
    CG_CHECK((nchw ? xi->shape[1] : xi->shape[3]) == C, "", "conv2d: %d input channels, the weight "
             "takes %d", nchw ? xi->shape[1] : xi->shape[3], C);
    int Ho = (H + 2 * pad - k) / stride + 1, Wo = (W + 2 * pad - k) / stride + 1;
    if (xi->dtype != DTYPE_F32) *x = nn_cast(t, *x, w->dtype);
    return tape_tensor(t, 4, (int[]){B, Ho, Wo, Cout}, w->dtype == DTYPE_F32);
}
Tensor *nn_conv2d(Tape *t, Tensor *x, Tensor *w, Tensor *b, int nchw, int stride, int pad) {
    Tensor *y = conv2d_output(t, &x, w, nchw, stride, pad);
    const bool track = tape_track(t, y, x, w, b);
    const int k = w->shape[3];
    Tensor *cols = track ? tape_tensor(t, 2, (int[]){(int)tensor_rows(y), w->shape[1] * k * k},
                                       w->dtype == DTYPE_F32)
                         : NULL;
    op_conv2d_fwd(t->ctx, x, w, b, nchw, stride, pad, NULL, cols, y);
    if (track)
        *(Conv2dRec *)tape_record(t, conv2d_backward, sizeof(Conv2dRec)) =
            (Conv2dRec){x, w, b, cols, y, nchw, stride, pad};
    return y;
}
Tensor *nn_conv2d_layernorm_gelu(Tape *t, Tensor *x, Tensor *w, Tensor *b, int nchw, int stride,
                                 int pad, Tensor *ln_w, Tensor *ln_b, float eps, GeluKind kind) {
    if (tape_would_track(t, x, w, b) || tape_would_track(t, ln_w, ln_b, NULL) ||
        w->dtype != t->ctx->act_dtype)   // the norm writes the activation dtype, the conv w's
        return nn_gelu(t, nn_layernorm(t, nn_conv2d(t, x, w, b, nchw, stride, pad), ln_w, ln_b, eps),
                       kind);
    Tensor *y = conv2d_output(t, &x, w, nchw, stride, pad);
    const Conv2dFwdOpts o = {.ln = 1, .ln_w = ln_w, .ln_b = ln_b, .ln_eps = eps, .gelu_out = 1,
                             .gelu_kind = kind};
    op_conv2d_fwd(t->ctx, x, w, b, nchw, stride, pad, &o, NULL, y);
    return y;
}

// CPU reference: drop path (stochastic depth) and the EMA of weights (kernels/ops.h).
#include "../ops.h"
#include "../drop_path_mask.h"
#include "../error.h"

// Elements per sample of x (B, ...), checking the op's arguments.
static size_t drop_path_per_sample(const char *op, const Tensor *x, const Tensor *y,
                                   const DropPathArgs *a) {
    CG_CHECK(x->ndim >= 1 && x->shape[0] > 0 && x->numel == y->numel, "",
             "op %s: tensors of %zu and %zu elements, batch %d", op, x->numel, y->numel,
             x->ndim ? x->shape[0] : 0);
    CG_CHECK(a->prob >= 0.0f && a->prob < 1.0f, "set drop_path in [0, 1)",
             "op %s: drop probability %g", op, a->prob);
    return x->numel / (size_t)x->shape[0];
}

void cpu_drop_path_fwd(Ctx *ctx, const Tensor *x, const DropPathArgs *a, Tensor *y) {
    size_t per = drop_path_per_sample("drop_path_fwd", x, y, a);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    const int64_t step = drop_path_step(a->step, a->step_at);
    for (int b = 0; b < x->shape[0]; b++) {
        float s = drop_path_scale(a->prob, a->seed, step, a->site, a->first_sample + b);
        const float *xb = px + (size_t)b * per;
        float *yb = py + (size_t)b * per;
        #pragma omp parallel for
        for (size_t i = 0; i < per; i++) yb[i] = xb[i] * s;
    }
}

void cpu_drop_path_bwd(Ctx *ctx, const Tensor *dy, const DropPathArgs *a, Tensor *dx) {
    if (!dx) return;
    size_t per = drop_path_per_sample("drop_path_bwd", dy, dx, a);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    const int64_t step = drop_path_step(a->step, a->step_at);
    for (int b = 0; b < dy->shape[0]; b++) {
        float s = drop_path_scale(a->prob, a->seed, step, a->site, a->first_sample + b);
        if (s == 0.0f) continue;   // adds exact zeros
        const float *gb = pdy + (size_t)b * per;
        float *db = pdx + (size_t)b * per;
        #pragma omp parallel for
        for (size_t i = 0; i < per; i++) db[i] += gb[i] * s;
    }
}

void cpu_ema_update(Ctx *ctx, Tensor *ema, const Tensor *src, float decay, Tensor *out) {
    CG_CHECK(ema->dtype == DTYPE_F32 && ema->numel == src->numel && (!out || out->numel == ema->numel),
             "", "op ema_update: ema (%zu, fp32), src %zu, out %zu elements", ema->numel,
             src->numel, out ? out->numel : ema->numel);
    float *e = tensor_f32(ema);
    const float *s = tensor_f32(src);
    float d = decay, r = 1.0f - decay;
    #pragma omp parallel for
    for (size_t i = 0; i < ema->numel; i++) {
        float a = d * e[i], b = r * s[i];   // two rounded products, then the sum (no FMA)
        e[i] = a + b;
    }
    if (out && out->data != ema->data) memcpy(out->data, e, ema->numel * sizeof(float));
}

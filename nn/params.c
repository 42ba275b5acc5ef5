#include "params.h"
#include "error.h"
#include "../kernels/ops.h"
#include <math.h>

#define PARAM_ALIGN 64   // elements: keeps every parameter 256-byte aligned for vector loads

void params_init_table(ParamTable *t) { memset(t, 0, sizeof(*t)); }

Tensor *params_add(ParamTable *t, const char *name, int ndim, const int *shape, ParamInit init,
                   float init_arg, bool decay) {
    CG_CHECK(t->values == NULL, "", "parameter %s added after params_alloc", name);
    CG_CHECK(strlen(name) < PARAM_NAME_MAX, "", "parameter name too long: %s", name);
    CG_CHECK(params_find(t, name) == NULL, "", "parameter %s registered twice", name);
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->params = cg_realloc(t->params, (size_t)t->cap * sizeof(Param *));
    }
    Param *p = cg_calloc(1, sizeof(Param));
    snprintf(p->name, sizeof(p->name), "%s", name);
    tensor_set_shape(&p->value, ndim, shape);
    p->value.dtype = DTYPE_F32;
    p->trainable = true;
    p->value.requires_grad = true;
    p->decay = decay;
    p->init = init;
    p->init_arg = init_arg;
    p->offset = t->total;
    t->total += (p->value.numel + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
    t->params[t->n++] = p;
    return &p->value;
}

static Tensor bind(const Tensor *shape_of, void *base, size_t offset, Device dev, DType dt) {
    Tensor x = *shape_of;
    x.grad = NULL;
    x.dtype = dt;
    x.device = dev;
    x.requires_grad = false;
    x.data = (char *)base + offset * dtype_size(dt);
    return x;
}

void params_alloc(ParamTable *t, Ctx *ctx) {
    size_t n = t->total ? t->total : 1, bytes = n * sizeof(float);
    t->device = ctx->device;
    t->dtype = ctx->act_dtype;
    t->values = device_alloc(ctx, n * dtype_size(t->dtype));
    t->grads = device_alloc(ctx, bytes);
    t->m = device_alloc(ctx, bytes);
    t->v = device_alloc(ctx, bytes);
    t->masters = t->dtype == DTYPE_F32 ? NULL : device_alloc(ctx, bytes);
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        p->grad = bind(&p->value, t->grads, p->offset, ctx->device, DTYPE_F32);
        p->m = bind(&p->value, t->m, p->offset, ctx->device, DTYPE_F32);
        p->v = bind(&p->value, t->v, p->offset, ctx->device, DTYPE_F32);
        if (t->masters) p->master = bind(&p->value, t->masters, p->offset, ctx->device, DTYPE_F32);
        p->value.data = (char *)t->values + p->offset * dtype_size(t->dtype);
        p->value.dtype = t->dtype;
        p->value.device = ctx->device;
        p->value.grad = &p->grad;
        p->value.requires_grad = p->trainable;
    }
    params_zero_grads(t, ctx);
    params_zero_moments(t, ctx);
}

static uint64_t name_hash(const char *s) {   // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

// Each parameter draws from its own stream (seed, name), so the values do not depend on the
// order or the thread count: the host values are drawn in parallel, then uploaded in order.
void params_initialize(ParamTable *t, Ctx *ctx, uint64_t seed) {
    float **host = cg_calloc((size_t)(t->n ? t->n : 1), sizeof(float *));
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        size_t n = p->value.numel;
        float *h = malloc((n ? n : 1) * sizeof(float));
        host[i] = h;
        if (!h) continue;   // reported below, outside the parallel loop
        Rng rng;
        rng_seed_stream(&rng, seed, 0x9a7a, name_hash(p->name));
        int fan_out = p->value.shape[0];
        int fan_in = p->value.ndim > 1 ? (int)(n / (size_t)fan_out) : fan_out;
        for (size_t k = 0; k < n; k++) {
            switch (p->init) {
            case INIT_ZEROS: h[k] = 0.0f; break;
            case INIT_ONES: h[k] = 1.0f; break;
            case INIT_CONST: h[k] = p->init_arg; break;
            case INIT_TRUNC_NORMAL: h[k] = rng_trunc_normal(&rng, p->init_arg); break;
            case INIT_FAN_IN_UNIFORM: {
                float a = 1.0f / sqrtf((float)(p->init_arg > 0 ? p->init_arg : fan_in));
                h[k] = (2.0f * rng_uniform(&rng) - 1.0f) * a;
                break;
            }
            case INIT_XAVIER_UNIFORM: {
                float a = sqrtf(6.0f / (float)(fan_in + fan_out));
                h[k] = (2.0f * rng_uniform(&rng) - 1.0f) * a;
                break;
            }
            }
        }
    }
    for (int i = 0; i < t->n; i++) {
        CG_CHECK(host[i], "", "out of host memory initializing %s (%zu values)", t->params[i]->name,
                 t->params[i]->value.numel);
        params_set_value(t->params[i], ctx, host[i]);
        free(host[i]);
    }
    free(host);
}

void params_set_value(Param *p, Ctx *ctx, const float *host) {
    tensor_upload_f32(ctx, &p->value, host);
    if (p->master.data) tensor_upload(ctx, &p->master, host);
}

static void zero_buffer(ParamTable *t, Ctx *ctx, void *buf) {
    Tensor all = {0};
    int shape[1] = {(int)t->total};
    tensor_set_shape(&all, 1, shape);
    all.data = buf;
    all.device = ctx->device;
    all.dtype = DTYPE_F32;
    if (t->total) op_zero(ctx, &all);
}

void params_zero_grads(ParamTable *t, Ctx *ctx) { zero_buffer(t, ctx, t->grads); }

void params_zero_moments(ParamTable *t, Ctx *ctx) {
    zero_buffer(t, ctx, t->m);
    zero_buffer(t, ctx, t->v);
}

void params_free(ParamTable *t, Ctx *ctx) {
    if (t->values) {
        device_free(ctx, t->values);
        device_free(ctx, t->grads);
        device_free(ctx, t->m);
        device_free(ctx, t->v);
        if (t->masters) device_free(ctx, t->masters);
    }
    for (int i = 0; i < t->n; i++) free(t->params[i]);
    free(t->params);
    memset(t, 0, sizeof(*t));
}

Param *params_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->params[i]->name, name) == 0) return t->params[i];
    return NULL;
}

size_t params_count(const ParamTable *t, bool trainable_only) {
    size_t n = 0;
    for (int i = 0; i < t->n; i++)
        if (!trainable_only || t->params[i]->trainable) n += t->params[i]->value.numel;
    return n;
}

void params_set_trainable(ParamTable *t, const char *prefix, bool trainable) {
    size_t len = prefix ? strlen(prefix) : 0;
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        if (prefix && strncmp(p->name, prefix, len) != 0) continue;
        p->trainable = trainable;
        p->value.requires_grad = trainable;
    }
}

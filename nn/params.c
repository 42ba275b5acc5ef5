#include "params.h"
#include "../kernels/error.h"
#include "../kernels/ops.h"
#include <math.h>

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

void params_keep_f32(ParamTable *t, Tensor *value) {
    CG_CHECK(t->values == NULL, "", "params_keep_f32 after params_alloc");
    for (int i = 0; i < t->n; i++)
        if (&t->params[i]->value == value) {
            t->params[i]->keep_f32 = true;
            return;
        }
    CG_CHECK(0, "", "params_keep_f32: not a parameter of this table");
}

static Tensor buffer_range(void *buf, size_t at, size_t n, Device dev);
static void zero_buffer(Ctx *ctx, void *buf, size_t n);

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
    t->state_total = t->total;
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        p->grad = bind(&p->value, t->grads, p->offset, ctx->device, DTYPE_F32);
        p->m = bind(&p->value, t->m, p->offset, ctx->device, DTYPE_F32);
        p->v = bind(&p->value, t->v, p->offset, ctx->device, DTYPE_F32);
        if (t->masters) p->master = bind(&p->value, t->masters, p->offset, ctx->device, DTYPE_F32);
        p->value.data = (char *)t->values + p->offset * dtype_size(t->dtype);
        p->value.dtype = t->dtype;
        if (p->keep_f32 && t->masters) {   // the master is the value (params.h, kept fp32)
            p->value.data = p->master.data;
            p->value.dtype = DTYPE_F32;
        }
        p->value.device = ctx->device;
        p->value.grad = &p->grad;
        p->value.requires_grad = p->trainable;
    }
    Tensor values = buffer_range(t->values, 0, n, ctx->device);
    values.dtype = t->dtype;   // kept-fp32 parameters' unused slots read as zeros
    op_zero(ctx, &values);
    // AdamW runs over the whole buffer: the slots no parameter's master fills are read too
    if (t->masters) zero_buffer(ctx, t->masters, n);
    params_zero_grads(t, ctx);
    params_zero_moments(t, ctx);
}

void params_alloc_frozen(ParamTable *t, Ctx *ctx) {
    size_t n = t->total ? t->total : 1;
    t->device = ctx->device;
    t->dtype = ctx->act_dtype;
    t->values = device_alloc(ctx, n * dtype_size(t->dtype));
    t->grads = t->m = t->v = t->masters = NULL;
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        p->value.data = (char *)t->values + p->offset * dtype_size(t->dtype);
        p->value.dtype = t->dtype;
        p->value.device = ctx->device;
        p->value.grad = NULL;
        p->value.requires_grad = false;
        p->trainable = false;
    }
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
        params_set_value(t, i, ctx, host[i]);
        free(host[i]);
    }
    free(host);
}

void params_set_value(ParamTable *t, int i, Ctx *ctx, const float *host) {
    tensor_upload_f32(ctx, &t->params[i]->value, host);
    if (t->masters) params_upload_state(t, ctx, PARAM_STATE_MASTER, i, host);
}

// n fp32 elements of buf from element at.
static Tensor buffer_range(void *buf, size_t at, size_t n, Device dev) {
    Tensor x = {0};
    tensor_set_shape(&x, 1, (int[]){(int)n});
    x.data = (float *)buf + at;
    x.device = dev;
    x.dtype = DTYPE_F32;
    return x;
}

static void zero_buffer(Ctx *ctx, void *buf, size_t n) {
    Tensor all = buffer_range(buf, 0, n, ctx->device);
    if (n && buf) op_zero(ctx, &all);   // a frozen table has no gradients or moments
}

void params_zero_grads(ParamTable *t, Ctx *ctx) { zero_buffer(ctx, t->grads, t->total); }

void params_zero_kept_f32(ParamTable *t, Ctx *ctx) { zero_buffer(ctx, t->values_f32, t->total_f32); }

void params_zero_moments(ParamTable *t, Ctx *ctx) {
    zero_buffer(ctx, t->m, t->state_total);
    zero_buffer(ctx, t->v, t->state_total);
}

// ---- the optimizer state's layout (params.h) ----------------------------------------------------

static void *state_buffer(const ParamTable *t, ParamState kind) {
    return kind == PARAM_STATE_M ? t->m : kind == PARAM_STATE_V ? t->v : t->masters;
}

size_t params_state_bytes(const ParamTable *t, ParamState kind) {
    return state_buffer(t, kind) ? t->state_total * sizeof(float) : 0;
}

// The first piece of the shard at or after (param, start) in table order.
static int shard_lower_bound(const ParamTable *t, int param, size_t start) {
    int lo = 0, hi = t->n_shard;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        const ParamSegment *s = &t->shard[mid];
        if (s->param < param || (s->param == param && s->start + s->len <= start)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

Tensor params_state_view(const ParamTable *t, ParamState kind, int param, size_t start, size_t len) {
    static const char *const kNames[] = {"moment m", "moment v", "master weights"};
    void *buf = state_buffer(t, kind);
    const Param *p = t->params[param];
    CG_CHECK(buf, "", "parameter %s: the table keeps no %s", p->name, kNames[kind]);
    CG_CHECK(start + len <= p->value.numel, "", "parameter %s: elements [%zu, %zu) of %zu", p->name,
             start, start + len, p->value.numel);
    size_t at = p->offset + start;
    if (t->shard) {
        int s = shard_lower_bound(t, param, start);
        const ParamSegment *sg = s < t->n_shard ? &t->shard[s] : NULL;
        CG_CHECK(sg && sg->param == param && sg->start <= start && start + len <= sg->start + sg->len,
                 "", "internal: %s elements [%zu, %zu) are not in this rank's shard of the optimizer "
                 "state", p->name, start, start + len);
        at = sg->at + (start - sg->start);
    }
    return buffer_range(buf, at, len, t->device);
}

void params_upload_state(ParamTable *t, Ctx *ctx, ParamState kind, int param, const float *host) {
    const Param *p = t->params[param];
    if (!t->shard) {
        Tensor x = params_state_view(t, kind, param, 0, p->value.numel);
        tensor_upload(ctx, &x, host);
        return;
    }
    for (int s = shard_lower_bound(t, param, 0); s < t->n_shard && t->shard[s].param == param; s++) {
        const ParamSegment *sg = &t->shard[s];
        Tensor x = params_state_view(t, kind, param, sg->start, sg->len);
        tensor_upload(ctx, &x, host + sg->start);
    }
}

// Before the masters are sharded: the kept-fp32 values (views of the whole masters) move into
// values_f32, laid out in table order.
static void keep_f32_values(ParamTable *t, Ctx *ctx) {
    size_t total = 0, longest = 0;
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        if (!p->keep_f32 || !t->masters) continue;
        p->offset_f32 = total;
        total += (p->value.numel + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
        if (p->value.numel > longest) longest = p->value.numel;
    }
    if (!total) return;
    t->values_f32 = device_alloc(ctx, total * sizeof(float));
    t->total_f32 = total;
    zero_buffer(ctx, t->values_f32, total);
    float *host = cg_malloc(longest * sizeof(float));
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        if (!p->keep_f32) continue;
        Tensor to = buffer_range(t->values_f32, p->offset_f32, p->value.numel, ctx->device);
        tensor_download(ctx, &p->value, host);
        tensor_upload(ctx, &to, host);
        p->value.data = to.data;
    }
    free(host);
}

static bool same_pieces(const ParamSegment *a, const ParamSegment *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].param != b[i].param || a[i].start != b[i].start || a[i].len != b[i].len) return false;
    return true;
}

void params_shard_state(ParamTable *t, Ctx *ctx, const ParamSegment *seg, int n) {
    CG_CHECK(t->m, "", "params_shard_state: the table has no optimizer state (frozen, or before "
             "params_alloc)");
    if (t->shard) {
        CG_CHECK(n == t->n_shard && same_pieces(seg, t->shard, n),
                 "one layout per parameter table: the same world size, rank and bucket_mb",
                 "the optimizer state of this parameter table is already sharded for another layout");
        return;
    }
    ParamSegment *sh = cg_malloc((size_t)(n ? n : 1) * sizeof *sh);
    size_t at = 0, longest = 0;
    for (int i = 0; i < n; i++) {
        const Param *p = t->params[seg[i].param];
        CG_CHECK(seg[i].len && seg[i].start + seg[i].len <= p->value.numel &&
                 (i == 0 || seg[i].param > seg[i - 1].param ||
                  (seg[i].param == seg[i - 1].param && seg[i].start >= seg[i - 1].start + seg[i - 1].len)),
                 "", "params_shard_state: piece %d (%s [%zu, %zu)) is empty, out of range or out of "
                 "order", i, p->name, seg[i].start, seg[i].start + seg[i].len);
        sh[i] = seg[i];
        sh[i].at = at;
        at += (seg[i].len + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
        if (seg[i].len > longest) longest = seg[i].len;
    }
    keep_f32_values(t, ctx);
    // The pieces' current state (masters hold the weights set so far) moves through host memory:
    // exact bits, once per run.
    float *host = cg_malloc((longest ? longest : 1) * sizeof(float));
    void **bufs[3] = {&t->m, &t->v, &t->masters};
    for (int k = 0; k < 3; k++) {
        void *old = *bufs[k];
        if (!old) continue;
        void *fresh = device_alloc(ctx, (at ? at : 1) * sizeof(float));
        zero_buffer(ctx, fresh, at);   // the padding between pieces too
        for (int i = 0; i < n; i++) {
            const Param *p = t->params[sh[i].param];
            Tensor from = buffer_range(old, p->offset + sh[i].start, sh[i].len, ctx->device);
            Tensor to = buffer_range(fresh, sh[i].at, sh[i].len, ctx->device);
            tensor_download(ctx, &from, host);
            tensor_upload(ctx, &to, host);
        }
        device_free(ctx, old);
        *bufs[k] = fresh;
    }
    free(host);
    t->shard = sh;
    t->n_shard = n;
    t->state_total = at;
    for (int i = 0; i < t->n; i++) {   // shapes stay (checkpoint checks read them); no data
        Param *p = t->params[i];
        p->m.data = p->v.data = p->master.data = NULL;
    }
}

// bytes (a multiple of 4) from the host into device memory of ctx's kind.
static void upload_bytes(Ctx *ctx, void *dst, const void *src, size_t bytes) {
    Tensor x = {0};
    tensor_set_shape(&x, 1, (int[]){(int)(bytes / sizeof(float))});
    x.dtype = DTYPE_F32;
    x.device = ctx->device;
    x.data = dst;
    tensor_upload(ctx, &x, src);
}

void params_decay_runs(ParamTable *t, Ctx *ctx) {
    if (t->n_decay_runs > 0 || t->n == 0) return;
    CG_CHECK(t->values, "", "params_decay_runs: the table is not allocated");
    uint64_t *ends = cg_calloc((size_t)t->n, sizeof *ends);
    size_t on_bytes = ((size_t)t->n + 3) / 4 * 4;
    uint8_t *on = cg_calloc(on_bytes, 1);
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        const size_t end = i + 1 < t->n ? t->params[i + 1]->offset : t->total;
        const uint8_t d = t->params[i]->decay ? 1 : 0;
        if (n > 0 && on[n - 1] == d) {
            ends[n - 1] = end;
        } else {
            ends[n] = end;
            on[n++] = d;
        }
    }
    t->decay_ends = device_alloc(ctx, (size_t)n * sizeof *ends);
    t->decay_on = device_alloc(ctx, on_bytes);
    upload_bytes(ctx, t->decay_ends, ends, (size_t)n * sizeof *ends);
    upload_bytes(ctx, t->decay_on, on, on_bytes);
    t->n_decay_runs = n;
    free(ends);
    free(on);
}

void params_free(ParamTable *t, Ctx *ctx) {
    if (t->decay_ends) device_free(ctx, t->decay_ends);
    if (t->decay_on) device_free(ctx, t->decay_on);
    if (t->values) {
        device_free(ctx, t->values);
        if (t->grads) device_free(ctx, t->grads);   // absent in a frozen table
        if (t->m) device_free(ctx, t->m);
        if (t->v) device_free(ctx, t->v);
        if (t->masters) device_free(ctx, t->masters);
        if (t->values_f32) device_free(ctx, t->values_f32);
    }
    free(t->shard);
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
        CG_CHECK(!trainable || t->grads || !t->values, "", "parameter %s belongs to a frozen table",
                 p->name);
        p->trainable = trainable;
        p->value.requires_grad = trainable;
    }
}

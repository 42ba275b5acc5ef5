// Runs one case of bench/op_cases.h on one backend (bench/op_harness.h).
#include "op_harness.h"
#include "../kernels/device.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static DType arg_dtype(const CaseArg *a, const CaseTensors *ct) {
    if (ct->ctx->device == DEVICE_CPU) return DTYPE_F32;   // the reference computes in fp32
    return a->type == TYPE_F32 ? DTYPE_F32 : ct->mode;
}

// The values argument a starts from, as its dtype in mode stores them.
static void fill_values(float *p, size_t n, const CaseArg *a, DType mode, uint64_t seed) {
    if (a->role == ARG_OUT || a->role == ARG_SCRATCH) {
        for (size_t i = 0; i < n; i++) p[i] = NAN;
        return;
    }
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) p[i] = a->lo + (a->hi - a->lo) * rng_uniform(&r);
    if (a->fill == FILL_ROWS_SUM1) {
        const size_t row = (size_t)a->shape[a->ndim - 1];
        for (size_t s = 0; s < n; s += row) {
            double sum = 0;
            for (size_t k = 0; k < row; k++) sum += p[s + k];
            for (size_t k = 0; k < row; k++) p[s + k] = (float)(p[s + k] / sum);
        }
    }
    if (mode == DTYPE_BF16 && (a->type == TYPE_ACT || a->act_values))
        for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

void case_tensors_make(CaseTensors *ct, const OpCase *c, Ctx *ctx, DType mode, uint64_t seed,
                       int keep_init) {
    memset(ct, 0, sizeof *ct);
    ct->ctx = ctx;
    ct->mode = mode;
    for (int i = 0; i < c->nargs; i++) {
        const CaseArg *a = &c->arg[i];
        if (a->role == ARG_ABSENT) continue;
        Tensor *t = calloc(1, sizeof *t);
        CG_CHECK(t, "", "out of host memory for a tensor of case %s", c->title);
        tensor_set_shape(t, a->ndim, a->shape);
        t->dtype = arg_dtype(a, ct);
        t->device = ctx->device;
        t->data = device_alloc(ctx, tensor_bytes(t) ? tensor_bytes(t) : 4);
        float *v = malloc((t->numel ? t->numel : 1) * sizeof(float));
        CG_CHECK(v, "", "out of host memory for %s of case %s", a->name, c->title);
        fill_values(v, t->numel, a, mode, seed * 1000003u + (uint64_t)i);
        tensor_upload_f32(ctx, t, v);
        if (keep_init) {
            ct->init[i] = v;
        } else {
            free(v);
        }
        ct->t[i] = t;
    }
    device_synchronize(ctx);
}

void case_tensors_reset(CaseTensors *ct, const OpCase *c) {
    for (int i = 0; i < c->nargs; i++)
        if (ct->t[i] && c->arg[i].role != ARG_IN) {
            CG_CHECK(ct->init[i], "", "case %s: reset without starting values", c->title);
            tensor_upload_f32(ct->ctx, ct->t[i], ct->init[i]);
        }
    device_synchronize(ct->ctx);
}

void case_tensors_free(CaseTensors *ct) {
    for (int i = 0; i < OPC_MAX_ARGS; i++) {
        if (ct->t[i]) {
            device_free(ct->ctx, ct->t[i]->data);
            free(ct->t[i]);
        }
        free(ct->init[i]);
    }
    memset(ct, 0, sizeof *ct);
}

void case_run(const OpCase *c, CaseTensors *ct, int phases) {
    if (phases & PHASE_FWD) c->fwd(ct->ctx, ct->t, c);
    if ((phases & PHASE_BWD) && c->bwd) c->bwd(ct->ctx, ct->t, c);
}

void case_round_results(const OpCase *c, CaseTensors *ct) {
    if (ct->mode != DTYPE_BF16 || ct->ctx->device != DEVICE_CPU) return;
    for (int i = 0; i < c->nargs; i++) {
        const CaseArg *a = &c->arg[i];
        if (!ct->t[i] || a->type != TYPE_ACT || (a->role != ARG_OUT && a->role != ARG_ACC))
            continue;
        float *p = tensor_f32(ct->t[i]);
        for (size_t k = 0; k < ct->t[i]->numel; k++) p[k] = bf16_to_f32(f32_to_bf16(p[k]));
    }
}

float *case_download(const CaseTensors *ct, int i) {
    return tensor_to_host_f32(ct->ctx, ct->t[i]);
}

// ---- timing --------------------------------------------------------------------------------

typedef struct PhaseCount {
    double bytes, flops;
    int depth;
} PhaseCount;

// The profile hook of kernels/ctx.h, counting the outermost ops' bytes and FLOPs.
static void count_hook(Ctx *ctx, const char *op, int end, double bytes) {
    (void)op;
    PhaseCount *pc = ctx->profile_data;
    if (end == CTX_PROFILE_FLOPS) {
        pc->flops += bytes;
    } else if (!end) {
        if (pc->depth++ == 0) pc->bytes += bytes;
    } else {
        pc->depth--;
    }
}

double case_time_ms(const OpCase *c, CaseTensors *ct, int phase, int reps, double *bytes,
                    double *flops) {
    Ctx *ctx = ct->ctx;
    PhaseCount pc = {0};
    void (*keep_hook)(Ctx *, const char *, int, double) = ctx->profile;
    void *keep_data = ctx->profile_data;
    // A tensor added into is read and written, but the hook counts each argument once: the
    // count adds such a tensor again where this phase changed it.
    void *before[OPC_MAX_ARGS] = {0};
    for (int i = 0; i < c->nargs; i++)
        if (ct->t[i] && c->arg[i].role == ARG_ACC) {
            before[i] = malloc(tensor_bytes(ct->t[i]));
            CG_CHECK(before[i], "", "out of host memory for %s of case %s", c->arg[i].name, c->title);
            tensor_download(ctx, ct->t[i], before[i]);
        }
    ctx->profile = count_hook;
    ctx->profile_data = &pc;
    case_run(c, ct, phase);   // warm-up, and the count
    ctx->profile = keep_hook;
    ctx->profile_data = keep_data;
    *bytes = pc.bytes;
    *flops = pc.flops;
    for (int i = 0; i < c->nargs; i++) {
        if (!before[i]) continue;
        const size_t n = tensor_bytes(ct->t[i]);
        void *after = malloc(n);
        CG_CHECK(after, "", "out of host memory for %s of case %s", c->arg[i].name, c->title);
        tensor_download(ctx, ct->t[i], after);
        if (memcmp(before[i], after, n) != 0) *bytes += (double)n;
        free(after);
        free(before[i]);
    }

    DeviceEvent *start = device_event_create(ctx), *stop = device_event_create(ctx);
    device_event_record(start);
    for (int r = 0; r < reps; r++) case_run(c, ct, phase);
    device_event_record(stop);
    device_event_wait(stop);
    double ms = device_event_ms(start, stop) / reps;
    device_event_free(start);
    device_event_free(stop);
    return ms;
}

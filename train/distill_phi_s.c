// PHI-S statistics of the teachers' features before a Stage 2 run (train/distill.h).
//
// Per standardized feature (a teacher's PP or PB tap of one pair, or its summary), (C) wide:
// mean_c = E[x_c] and E|x|^2 over every token of every image, from per-batch device reductions
// (mean_tokens of the fp32 copy, sumsq) summed on the host in double; across ranks the means
// of equal-sized slices are averaged. Then shift = -mean, scale = 1 / sqrt(trace(cov) / C),
// trace(cov) = E|x|^2 - |mean|^2.
#include "distill.h"
#include "data_parallel.h"
#include "../kernels/error.h"
#include "../kernels/ops.h"
#include <math.h>

typedef struct Moments {
    const PhiS *ps;
    int C;
    double *sum;        // (C) sum over rows of x_c
    double sumsq;       // sum over rows of |x|^2
    double rows;
} Moments;

static void moments_add(Tape *t, Moments *m, Tensor *x, float *host) {
    int C = x->shape[x->ndim - 1];
    int rows = (int)(x->numel / C);
    Tensor *xf = nn_cast(t, x, DTYPE_F32);
    Tensor *mean = nn_mean_tokens(t, nn_view(t, xf, 3, (int[]){1, rows, C}));   // (1, C)
    Tensor *sq = tape_tensor(t, 1, (int[]){1}, true);
    op_zero(t->ctx, sq);
    op_sumsq(t->ctx, xf, sq);
    tensor_download(t->ctx, mean, host);
    tensor_download(t->ctx, sq, host + C);
    for (int c = 0; c < C; c++) m->sum[c] += (double)host[c] * rows;
    m->sumsq += host[C];
    m->rows += rows;
}

static int param_index(const ParamTable *t, const Tensor *value) {
    for (int i = 0; i < t->n; i++)
        if (&t->params[i]->value == value) return i;
    CG_FAIL("", "PHI-S: a statistic that is not a parameter of the run");
}

// The feature's shift and scale from its moments (means across ranks), into its parameters.
// Returns the scale.
static float moments_finish(Distiller *d, DataParallel *dp, const Moments *m, const char *what) {
    int C = m->C;
    float *v = cg_malloc((size_t)(C + 1) * sizeof(float));
    for (int c = 0; c < C; c++) v[c] = (float)(m->sum[c] / m->rows);
    v[C] = (float)(m->sumsq / m->rows);
    dp_mean_f32(dp, v, C + 1, "the PHI-S statistics");
    double mean_sq = 0;
    for (int c = 0; c < C; c++) mean_sq += (double)v[c] * v[c];
    double var = ((double)v[C] - mean_sq) / C;   // trace(cov) / C
    CG_CHECK(isfinite(var) && var > 0, "check the teacher's weights, or set phi_s = 0",
             "PHI-S: %s has variance %g over the gathered batches", what, var);
    float scale = (float)(1.0 / sqrt(var));
    float *shift = cg_malloc((size_t)C * sizeof(float)), *scales = cg_malloc((size_t)C * sizeof(float));
    for (int c = 0; c < C; c++) shift[c] = -v[c], scales[c] = scale;
    params_set_value(&d->params, param_index(&d->params, m->ps->shift), d->ctx, shift);
    params_set_value(&d->params, param_index(&d->params, m->ps->scale), d->ctx, scales);
    free(shift); free(scales); free(v);
    return scale;
}

void distill_phi_s_gather(Distiller *d, Loader *l, ResolutionViews *v, DataParallel *dp,
                          int batches, FILE *f) {
    bool any = false;
    for (int k = 0; k < d->n_teachers; k++) any |= d->teachers[k].phi_s;
    if (!any) return;
    Moments *ms[DISTILL_MAX_TEACHERS] = {0};
    int n_ms[DISTILL_MAX_TEACHERS] = {0};
    int widest = 0;
    for (int k = 0; k < d->n_teachers; k++) {
        DistillTeacher *dt = &d->teachers[k];
        if (!dt->phi_s) continue;
        int C = dt->teacher.enc.cfg.width;
        if (C > widest) widest = C;
        ms[k] = cg_calloc((size_t)2 * dt->n_taps + 1, sizeof(Moments));
        for (int j = 0; j < dt->n_taps; j++) {
            if (dt->tap_pp) ms[k][n_ms[k]++] = (Moments){&dt->phi_pp[j], C, NULL, 0, 0};
            if (dt->tap_pb) ms[k][n_ms[k]++] = (Moments){&dt->phi_pb[j], C, NULL, 0, 0};
        }
        if (dt->trains_summary) ms[k][n_ms[k]++] = (Moments){&dt->phi_summary, C, NULL, 0, 0};
        for (int q = 0; q < n_ms[k]; q++) ms[k][q].sum = cg_calloc((size_t)C, sizeof(double));
    }
    float *host = cg_malloc((size_t)(widest + 1) * sizeof(float));
    Arena arena;
    arena_init(&arena, d->ctx, ARENA_CHUNK_BYTES);
    Tape t;
    tape_init(&t, d->ctx, &arena);
    encoder_set_image_size(&d->student, v->img_size, v->img_size);
    long images = 0;
    char err[1024];
    for (int i = 0; i < batches; i++) {
        const Batch *b = loader_next(l, err, sizeof err);
        if (!b) CG_FAIL("run cgspn data verify on the shards", "PHI-S statistics: %s", err);
        images += b->count;
        tape_reset(&t);
        Tensor *x, *views[DISTILL_MAX_TEACHERS];
        distill_views(d, v, &t, b, v->img_size, &x, views);
        for (int k = 0; k < d->n_teachers; k++) {
            DistillTeacher *dt = &d->teachers[k];
            if (!dt->phi_s) continue;
            TeacherTaps tt;
            distill_teacher_targets(dt, &t, views[k], &d->student, &tt);
            int q = 0;
            for (int j = 0; j < dt->n_taps; j++) {
                if (dt->tap_pp) moments_add(&t, &ms[k][q++], tt.pp[dt->teacher_blocks[j]], host);
                if (dt->tap_pb) moments_add(&t, &ms[k][q++], tt.pb[dt->teacher_blocks[j]], host);
            }
            if (dt->trains_summary) moments_add(&t, &ms[k][q++], tt.summary, host);
        }
    }
    for (int k = 0; k < d->n_teachers; k++) {
        if (!ms[k]) continue;
        float lo = INFINITY, hi = 0;
        for (int q = 0; q < n_ms[k]; q++) {
            char what[64];
            snprintf(what, sizeof what, "teacher %d feature %d", k + 1, q + 1);
            float s = moments_finish(d, dp, &ms[k][q], what);
            lo = fminf(lo, s), hi = fmaxf(hi, s);
            free(ms[k][q].sum);
        }
        free(ms[k]);
        if (f)
            fprintf(f, "phi_s: teacher %d, %d features standardized (mean removed, scale %.4g..%.4g) "
                    "from %d batches (%ld images on this rank)\n", k + 1, n_ms[k], lo, hi, batches,
                    images);
    }
    free(host);
    tape_free(&t);
    arena_free(&arena);
}

// Data parallelism in the training loops (train/data_parallel.h).
#include "data_parallel.h"
#include "data_config.h"
#include "../kernels/error.h"
#include <limits.h>

void dp_open(DataParallel *p, Dist *d, ParamTable *params, Ctx *ctx, const Config *c) {
    memset(p, 0, sizeof *p);
    p->d = d ? d : dist_process();
    p->rank = p->d->rank;
    p->world = p->d->world;
    p->g = dist_grads_create(p->d, params, ctx, c->zero, c->bucket_mb);
    p->zero = p->g->zero;
    p->overlap = true;
    if (p->world > 1 && dp_main(p)) {
        static const char *kBackends[] = {"single", "MPI", "TCP"};
        printf("data parallel: %d ranks (%s%s), zero = %d, %d gradient buckets of up to %.3g MB",
               p->world, kBackends[p->d->backend],
               ctx->device == DEVICE_CUDA ? " bootstrap, NCCL collectives" : " host collectives",
               p->zero, p->g->n_buckets, (double)p->g->bucket_elems * sizeof(float) / 1048576.0);
        if (p->zero)   // the table keeps rank 0's shard of the state (params_shard_state)
            printf(", AdamW moments%s sharded (rank 0 keeps %zu of %zu elements)",
                   params->masters ? " and masters" : "", params->state_total, params->total);
        printf("\n");
    }
}

void dp_close(DataParallel *p) {
    dist_grads_free(p->g);
    p->g = NULL;
}

Loader *dp_loader_open(const DataParallel *p, const Config *c, int train, int global_batch,
                       bool pinned) {
    return loader_open_from_config_rank(c, train, global_batch, pinned, p->rank, p->world);
}

void dp_runlog_open(const DataParallel *p, RunLog *log, const Config *c, const char *command) {
    if (dp_main(p)) {
        runlog_open(log, c, command);
    } else {
        memset(log, 0, sizeof *log);   // metrics NULL: runlog_metrics writes nothing
        log->t_start = now_seconds();
    }
    // A run folder named from the clock must be rank 0's on every rank.
    dist_broadcast(p->d, log->dir, sizeof log->dir, 0, "the run folder's name");
    // mpirun hands rank 0 a terminal-like stream: no progress bar redrawn in place there.
    if (p->world > 1) log->tty = 0;
}

// ---- backward and the step ------------------------------------------------------------------------

static void on_param_done(void *user, const Tensor *grad) {
    DistGrads *g = user;
    const char *base = g->t->grads, *at = grad->data;
    // Only gradients of the stepped table (a frozen teacher's parameters have none anyway).
    if (at >= base && at < base + g->t->total * sizeof(float)) dist_grad_ready_tensor(g, grad);
}

void dp_backward(DataParallel *p, Tape *t, Tensor *loss, bool last) {
    const bool overlap = last && p->world > 1 && p->overlap;
    if (overlap) tape_set_param_done(t, on_param_done, p->g);
    tape_backward(t, loss);
    if (overlap) tape_set_param_done(t, NULL, NULL);
}

StepStats dp_optimizer_step(DataParallel *p, ParamTable *t, Ctx *ctx, Arena *scratch,
                            const OptimizerConfig *o, long step) {
    return optimizer_step_dist(t, ctx, scratch, o, step, p->g);
}

void dp_discard_step(DataParallel *p, ParamTable *t, Ctx *ctx) {
    dist_wait_grads(p->g);
    params_zero_grads(t, ctx);
}

// ---- values across ranks ---------------------------------------------------------------------------

double dp_sum(DataParallel *p, double x, const char *what) {
    return p->world > 1 ? dist_sum_f64(p->d, x, what) : x;
}

double dp_mean(DataParallel *p, double x, const char *what) {
    return p->world > 1 ? dist_sum_f64(p->d, x, what) / p->world : x;
}

void dp_mean_f32(DataParallel *p, float *x, int n, const char *what) {
    if (p->world <= 1 || n <= 0) return;
    const size_t bytes = (size_t)n * sizeof(float);
    float *all = cg_malloc(bytes * (size_t)p->world);   // (world, n): every rank's values
    dist_all_gather_bytes(p->d, x, all, bytes, what);
    for (int k = 0; k < n; k++) {
        double s = 0;
        for (int r = 0; r < p->world; r++) s += all[(size_t)r * n + k];
        x[k] = (float)(s / p->world);
    }
    free(all);
}

// ---- checkpoints ------------------------------------------------------------------------------------

// Every rank learns whether every rank succeeded; all stop when one did not (the failed rank
// with its own message, the others naming it).
static void agree_or_stop(DataParallel *p, int ok, const char *err, const char *what) {
    int bad = dist_first_failed(p->d, ok, what);
    if (bad < 0) return;
    if (!ok) CG_FAIL("", "%s", err);
    CG_FAIL("that rank's own message says why; the previous checkpoints are intact",
            "%s failed on rank %d", what, bad);
}

void dp_save(DataParallel *p, const char *run_dir, const CkptOptions *o, const Config *c,
             const ParamTable *params, const ParamTable *ema, Ctx *ctx, const CkptState *s,
             char *saved, size_t saved_n) {
    if (p->world <= 1) {
        ckpt_save(run_dir, o, c, params, ema, ctx, s, saved, saved_n);
        return;
    }
    char err[4096] = "", tmp[PATH_MAX];
    int ok = 1;
    if (dp_main(p)) ok = ckpt_prepare_err(run_dir, s->step, tmp, sizeof tmp, err, sizeof err) == 0;
    agree_or_stop(p, ok, err, "creating the checkpoint folder");
    ckpt_tmp_dir_name(run_dir, s->step, tmp, sizeof tmp);
    if (p->zero) {   // every rank's optimizer shard, then SHARDS once all are durable
        ok = dist_ckpt_write_shard_err(p->g, tmp, err, sizeof err) == 0;
        char cerr[4096];
        if (dist_ckpt_commit_err(p->d, tmp, ok, cerr, sizeof cerr) != 0)
            CG_FAIL("the previous checkpoints are intact", "%s", ok ? cerr : err);
    }
    CkptOptions full = o ? *o : (CkptOptions){0};
    full.prepared = true;
    full.sharded_state = p->zero;
    ok = 1;
    if (dp_main(p))
        ok = ckpt_save_err(run_dir, &full, c, params, ema, ctx, s, saved, saved_n, err, sizeof err) == 0;
    agree_or_stop(p, ok, err, "writing the checkpoint");
    if (saved) ckpt_dir_name(run_dir, s->step, saved, saved_n);
}

void dp_load(DataParallel *p, const char *ckpt_dir, const Config *c, ParamTable *params,
             ParamTable *ema, Ctx *ctx, CkptState *s) {
    ckpt_load(ckpt_dir, c, params, ema, ctx, s);
    if (!s->optimizer_sharded) return;
    char err[4096];
    int world = 0;
    CG_CHECK(dist_ckpt_shards_complete(ckpt_dir, &world),
             "the checkpoint's optimizer shards are missing; resume an earlier checkpoint",
             "%s: written with zero = 1, but its SHARDS marker or a shard file is missing", ckpt_dir);
    if (dist_ckpt_read_shard_err(p->g, ckpt_dir, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    if (dp_main(p) && world != p->world)
        printf("resume: optimizer state of %d ranks re-sharded onto %d (moments and masters copied "
               "exactly)\n", world, p->world);
}

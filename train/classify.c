#include "classify.h"
#include "checkpoint.h"
#include "config.h"
#include "data_config.h"
#include "data_parallel.h"
#include "device_config.h"
#include "memory_report.h"
#include "mesa.h"
#include "model_config.h"
#include "loop.h"
#include "optimizer.h"
#include "runlog.h"
#include "step_graph.h"
#include "../kernels/error.h"
#include <math.h>
#include <omp.h>

static void train_usage(FILE *f) {
    fprintf(f, "usage: cgspn train CONFIG [--key=value ...]\n"
               "Trains an encoder (model = vit | cgspn | hybrid) for classification on the shards\n"
               "of data_shards (train_split; evaluated on val_split) and reports top-1/top-5.\n"
               "Ctrl-C (SIGINT) or SIGTERM finishes the step, writes a checkpoint and exits 0;\n"
               "--resume=auto continues. Example: cgspn train configs/fmnist_vit.cfg --epochs=1\n\n");
    config_print_help(f);
}

// ---- data ------------------------------------------------------------------------------------


// ---- evaluation ------------------------------------------------------------------------------

EvalResult classify_evaluate(Ctx *ctx, const Encoder *e, Loader *val, bool graph) {
    return classify_evaluate_dp(ctx, e, val, NULL, graph);
}

typedef struct { Tape *tape; const Encoder *e; Tensor *x; } EvalBatch;

// An evaluation batch's forward and head, as step_graph_run captures and replays it.
static Tensor *eval_body(void *self) {
    EvalBatch *b = self;
    Tensor *out = encoder_head(b->tape, b->e, encoder_forward(b->tape, b->e, b->x, NULL));
    tape_keep(b->tape, out);
    return out;
}

EvalResult classify_evaluate_dp(Ctx *ctx, const Encoder *e, Loader *val, DataParallel *dp,
                                bool graph) {
    char err[2048];
    LoaderCursor at = loader_cursor_get(val);
    if (at.step != 0 && loader_cursor_set(val, (LoaderCursor){at.epoch, 0}, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
    Arena arena;
    arena_init(&arena, ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, ctx, &arena);
    tape_set_grad_enabled(&tape, false);
    StepGraph sg;   // the batches replayed as a CUDA graph (train/step_graph.h)
    step_graph_init(&sg, ctx, graph);
    int K = e->cfg.num_classes;
    long correct1 = 0, correct5 = 0, n = 0;
    double loss = 0;
    int64_t steps = loader_steps_per_epoch(val);
    for (int64_t s = 0; s < steps; s++) {
        const Batch *b = loader_next(val, err, sizeof err);
        if (!b) CG_FAIL("run cgspn data verify on the shards", "%s", err);
        if (b->count == 0) continue;
        CG_CHECK(b->classes <= K, "set num_classes to the dataset's class count or more",
                 "the validation split has %d classes, the model's head %d", b->classes, K);
        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 4, (int[]){b->count, b->channels, b->height, b->width}, true);
        tensor_upload(ctx, x, b->images);
        EvalBatch eb = {&tape, e, x};
        float *host = tensor_to_host_f32(ctx, step_graph_run(&sg, &x, 1, eval_body, &eb));
        for (int i = 0; i < b->count; i++) {
            const float *l = host + (size_t)i * K;
            int y = b->labels[i], rank = 0;   // classes ranked above the label (ties: lower index first)
            double mx = l[0], sum = 0;
            for (int k = 0; k < K; k++) {
                rank += l[k] > l[y] || (l[k] == l[y] && k < y);
                mx = fmax(mx, l[k]);
            }
            for (int k = 0; k < K; k++) sum += exp(l[k] - mx);
            loss += mx + log(sum) - l[y];
            correct1 += rank < 1;
            correct5 += rank < 5;
        }
        n += b->count;
        free(host);
    }
    const long graph_batches = sg.replayed;
    step_graph_free(&sg);
    tape_free(&tape);
    arena_free(&arena);
    if (dp && dp->world > 1) {   // every rank's slice: counts and loss sums added in rank order
        correct1 = lround(dp_sum(dp, (double)correct1, "the evaluation's top-1 count"));
        correct5 = lround(dp_sum(dp, (double)correct5, "the evaluation's top-5 count"));
        n = lround(dp_sum(dp, (double)n, "the evaluation's image count"));
        loss = dp_sum(dp, loss, "the evaluation's loss sum");
    }
    return (EvalResult){n ? (double)correct1 / n : 0, n ? (double)correct5 / n : 0,
                        n ? loss / n : 0, n, graph_batches};
}

// ---- EMA of the weights ----------------------------------------------------------------------

// The whole of one parameter buffer as a 1-D tensor.
static Tensor buffer_tensor(const ParamTable *t, void *data, DType dtype) {
    Tensor x = {0};
    tensor_set_shape(&x, 1, (int[]){(int)t->total});
    x.data = data;
    x.dtype = dtype;
    x.device = t->device;
    return x;
}

typedef struct Ema {
    bool on;
    float decay;
    ParamTable table;       // same names and shapes as the model; values in the run's dtype, and
    Encoder enc;            // for a bf16 run fp32 masters holding the average itself
} Ema;

// ema = decay * ema + (1 - decay) * weights, over the whole buffer in one op; the weights are the
// fp32 masters of a bf16 model. A bf16 EMA table gets its values rounded from the average.
static void ema_update(Ema *m, Ctx *ctx, const ParamTable *params, float decay) {
    ParamTable *t = &m->table;
    Tensor avg = t->masters ? buffer_tensor(t, t->masters, DTYPE_F32)
                            : buffer_tensor(t, t->values, DTYPE_F32);
    Tensor src = params->masters ? buffer_tensor(params, params->masters, DTYPE_F32)
                                 : buffer_tensor(params, params->values, params->dtype);
    Tensor out = buffer_tensor(t, t->values, t->dtype);
    op_ema_update(ctx, &avg, &src, decay, t->masters ? &out : NULL);
}

static void ema_init(Ema *m, const Config *c, const EncoderConfig *ecfg, Ctx *ctx,
                     const ParamTable *params) {
    memset(m, 0, sizeof *m);
    m->on = c->ema_decay > 0;
    m->decay = c->ema_decay;
    if (!m->on) return;
    params_init_table(&m->table);
    encoder_register(&m->enc, ecfg, &m->table);
    params_alloc(&m->table, ctx);
    ParamTable *t = &m->table;
    Tensor avg = t->masters ? buffer_tensor(t, t->masters, DTYPE_F32)
                            : buffer_tensor(t, t->values, DTYPE_F32);
    op_zero(ctx, &avg);           // padding included: 0 * (anything) stays finite below
    ema_update(m, ctx, params, 0.0f);   // a copy of the starting weights
}

static void ema_free(Ema *m, Ctx *ctx) {
    if (m->on) params_free(&m->table, ctx);
}

// ---- checkpoints -----------------------------------------------------------------------------

// What a checkpoint needs besides weights and moments to continue bit-exactly: the loader's
// cursor (in micro-batches of micro_batch images), the log window's partial sum (so a resumed run
// prints the same log lines) and the count of skipped steps. Stored as bytes (host little-endian).
typedef struct ClassifyCursor {
    uint32_t version, micro_batch;
    int64_t epoch, step;        // the loader's next batch
    double loss_sum;            // losses of the steps since the last log line
    int64_t loss_n;
    int64_t skipped;            // updates skipped for a non-finite loss or gradient
} ClassifyCursor;
#define CLASSIFY_CURSOR_VERSION 2

// What the loop's hooks (train/loop.h) work on.
typedef struct RunState {
    const Config *c;
    const TrainOptions *o;
    RunLog *log;
    ParamTable *params;
    Ema *ema;
    Mesa *mesa;
    Encoder *enc;
    Ctx *ctx;
    Tape *tape;
    Loader *train, *val;
    int micro_batch;          // global: all ranks
    int accum;                // micro-batches per step
    DataParallel *dp;
    StepGraph graph;          // the step replayed as a CUDA graph (train/step_graph.h)
    Tensor *x, *tgt;          // the micro-batch the step body reads
    EvalResult ev, ev_ema;    // the last evaluation
} RunState;

static void save_checkpoint(void *self, long step, const LoopWindow *w) {
    const RunState *r = self;
    LoaderCursor lc = loader_cursor_get(r->train);
    ClassifyCursor cur = {CLASSIFY_CURSOR_VERSION, (uint32_t)r->micro_batch, lc.epoch, lc.step,
                          w->loss_sum, w->loss_n, w->skipped};
    CkptState st = {.step = step, .cursor_bytes = sizeof cur};
    memcpy(st.cursor, &cur, sizeof cur);
    CkptOptions o = {.keep_last = r->c->keep_last};
    char saved[1024];
    dp_save(r->dp, r->log->dir, &o, r->c, r->params, r->ema->on ? &r->ema->table : NULL, r->ctx, &st,
            saved, sizeof saved);
    if (r->log->tty) printf("\r\033[K");
    printf("checkpoint: %s\n", saved);
}

// ---- logs ------------------------------------------------------------------------------------

static void print_eval(const RunLog *log, long step, const EvalResult *ev, const EvalResult *ema,
                       double seconds) {
    if (log->tty) printf("\r\033[K");
    printf("eval  step %ld | test top1 %.2f%% | top5 %.2f%% | loss %.4f", step, 100 * ev->top1,
           100 * ev->top5, ev->loss);
    if (ema->count)
        printf(" | ema top1 %.2f%% | ema top5 %.2f%% | ema loss %.4f", 100 * ema->top1,
               100 * ema->top5, ema->loss);
    printf(" | %ld images | %.1f s\n", ev->count, seconds);
}

static void log_eval(RunLog *log, long step, const EvalResult *ev, const EvalResult *ema) {
    const char *keys[] = {"test_top1", "test_top5", "test_loss", "ema_top1", "ema_top5", "ema_loss"};
    double vals[] = {ev->top1, ev->top5, ev->loss, ema->top1, ema->top5, ema->loss};
    runlog_metrics(log, step, ema->count ? 6 : 3, keys, vals);
}

// ---- the loop's hooks ------------------------------------------------------------------------

// A step of one micro-batch on one rank without MESA: forward, cross-entropy, backward, as
// step_graph_run captures and replays it.
static Tensor *graph_body(void *self) {
    RunState *r = self;
    Tensor *logits = encoder_head(r->tape, r->enc, encoder_forward(r->tape, r->enc, r->x, NULL));
    Tensor *loss = nn_cross_entropy(r->tape, logits, r->tgt);
    tape_keep(r->tape, loss);   // read after the backward, whose temporaries would reuse it
    dp_backward(r->dp, r->tape, loss, true);
    return loss;
}

// accum micro-batches: forward, cross-entropy (+ MESA), backward. Several ranks: every rank runs
// every backward (the gradient collectives must match); a non-finite loss anywhere makes the
// global loss and norm non-finite on every rank.
static LoopStepResult train_step(void *self, long step, float *flags) {
    RunState *r = self;
    const Config *c = r->c;
    Ctx *ctx = r->ctx;
    Tape *tape = r->tape;
    int A = r->accum, K = c->num_classes;
    double step_loss = 0;
    bool finite = true;
    int64_t epoch = 0;
    char err[4096];
    const bool graph = r->graph.on && A == 1 && r->dp->world == 1 && r->o->nonfinite_at != step + 1;
    for (int a = 0; a < A; a++) {
        const Batch *b = loader_next(r->train, err, sizeof err);
        if (!b) CG_FAIL("run cgspn data verify on the shards", "%s", err);
        epoch = b->epoch;
        tape_reset(tape);
        Tensor *x = tape_tensor(tape, 4, (int[]){b->count, b->channels, b->height, b->width}, true);
        Tensor *tgt = tape_tensor(tape, 2, (int[]){b->count, K}, true);   // K = the shards' classes
        tensor_upload(ctx, x, b->images);
        tensor_upload(ctx, tgt, b->targets);
        if (r->o->nonfinite_at == step + 1 && a == 0) op_scale_fwd(ctx, x, NAN, x);
        r->enc->drop_path.step = step * A + a;
        r->enc->drop_path.step_at = step_graph_set_step(&r->graph, step * A + a);
        r->enc->drop_path.first_sample = r->dp->rank * b->count;   // masks by global sample index
        if (graph && !mesa_active(r->mesa, epoch)) {
            r->x = x;
            r->tgt = tgt;
            float loss_v;
            const Tensor *loss = step_graph_run(&r->graph, (Tensor *[]){x, tgt}, 2, graph_body, r);
            tensor_download(ctx, loss, &loss_v);
            step_loss += loss_v;
            if (!isfinite(loss_v)) finite = false;   // its gradients are discarded with the step
            continue;
        }
        Tensor *logits = encoder_head(tape, r->enc, encoder_forward(tape, r->enc, x, NULL));
        Tensor *loss = nn_cross_entropy(tape, logits, tgt);
        if (mesa_active(r->mesa, epoch))
            loss = nn_add(tape, loss, mesa_loss(tape, r->mesa, &r->ema->enc, x, logits));
        float loss_v;
        tensor_download(ctx, loss, &loss_v);
        step_loss += loss_v;
        if (!isfinite(loss_v)) finite = false;
        if (finite || r->dp->world > 1)
            dp_backward(r->dp, tape, A > 1 ? nn_scale(tape, loss, 1.0f / A) : loss, a == A - 1);
    }
    step_loss /= A;
    // The global batch's loss, and the flags (a stop request, a due checkpoint), in one collective.
    float shared[1 + LOOP_FLAGS] = {(float)step_loss};
    memcpy(shared + 1, flags, LOOP_FLAGS * sizeof(float));
    dp_mean_f32(r->dp, shared, 1 + LOOP_FLAGS, "the step's loss");
    memcpy(flags, shared + 1, LOOP_FLAGS * sizeof(float));
    if (r->dp->world > 1) step_loss = shared[0];
    return (LoopStepResult){step_loss, (long)epoch};
}

static void train_updated(void *self, long step) {
    RunState *r = self;
    if (r->ema->on) ema_update(r->ema, r->ctx, r->params, r->ema->decay);
}

static void train_eval(void *self, long step) {
    RunState *r = self;
    double t0 = now_seconds();
    const bool graph = r->c->cuda_graph;
    r->ev = classify_evaluate_dp(r->ctx, r->enc, r->val, r->dp, graph);
    if (r->ema->on) r->ev_ema = classify_evaluate_dp(r->ctx, &r->ema->enc, r->val, r->dp, graph);
    print_eval(r->log, step, &r->ev, &r->ev_ema, now_seconds() - t0);
    log_eval(r->log, step, &r->ev, &r->ev_ema);
}

// ---- training --------------------------------------------------------------------------------

TrainResult classify_train(const Config *c, const TrainOptions *o) {
    TrainOptions none = {0};
    if (!o) o = &none;
    TrainResult res = {0};
    CG_CHECK(c->num_classes > 0, "set num_classes to the dataset's class count",
             "classification needs a head: num_classes = 0");
    CG_CHECK(c->batch_size % c->accum_steps == 0, "make batch_size a multiple of accum_steps",
             "batch_size %d does not split into %d accumulation micro-batches", c->batch_size,
             c->accum_steps);
    CG_CHECK(c->drop_path >= 0 && c->drop_path < 1, "", "drop_path %g: expected [0, 1)", c->drop_path);
    CG_CHECK(c->ema_decay >= 0 && c->ema_decay < 1, "", "ema_decay %g: expected [0, 1)", c->ema_decay);
    Ctx ctx = device_open(c);
    device_describe(&ctx, stdout);

    EncoderConfig ecfg = encoder_config_from(c);
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ecfg, &params);
    params_alloc(&params, &ctx);
    params_initialize(&params, &ctx, (uint64_t)c->seed);
    encoder_describe(&enc, &params, stdout);
    DataParallel dp;
    dp_open(&dp, o->dist, &params, &ctx, c);
    CG_CHECK(!(dp.zero && params.masters && c->ema_decay > 0),
             "set ema_decay = 0 with zero = 1 on the GPU, or zero = 0",
             "the EMA averages the fp32 master weights, which zero = 1 shards across ranks");

    // Data: global micro-batches of batch_size / accum_steps (each rank reads 1/world of each);
    // an optimizer step takes accum_steps of them.
    int A = c->accum_steps, micro = c->batch_size / A;
    bool gpu = ctx.device == DEVICE_CUDA;
    Loader *train = dp_loader_open(&dp, c, 1, micro, gpu);
    Loader *val = dp_loader_open(&dp, c, 0, c->eval_batch_size > 0 ? c->eval_batch_size : micro, gpu);
    data_check_classes(c, train, val, "cgspn train");
    RunPlan plan = run_plan(c, (long)loader_steps_per_epoch(train), A,
                            (unsigned long long)loader_dataset(train)->m.images);
    long steps_per_epoch = plan.steps_per_epoch, total = plan.total, warmup = plan.warmup;
    long eval_every = plan.eval_every;
    OptimizerConfig opt = plan.opt;
    Ema ema;
    ema_init(&ema, c, &ecfg, &ctx, &params);
    Mesa mesa = {c->mesa, c->mesa_temperature, c->mesa_start_epoch};
    CG_CHECK(mesa.weight >= 0 && mesa.temperature > 0 && mesa.start_epoch >= 0, "e.g. mesa = 0.8, "
             "mesa_temperature = 5, mesa_start_epoch = 25", "mesa %g, mesa_temperature %g, "
             "mesa_start_epoch %d", mesa.weight, mesa.temperature, mesa.start_epoch);
    CG_CHECK(mesa.weight == 0 || ema.on, "set ema_decay (e.g. 0.9999) with mesa",
             "MESA's target is the EMA model: mesa = %g needs ema_decay > 0", mesa.weight);
    enc.drop_path = (EncoderDropPath){.rate = c->drop_path, .seed = (uint64_t)c->seed};

    // Resume: weights, moments, EMA, step and the cursor from a checkpoint. Before the run folder
    // is opened, so a refused resume leaves its config.cfg and logs as they were.
    long first = 0, skipped = 0;
    double loss_sum = 0;
    int loss_n = 0;
    char run_dir[1024] = "", from[1024], err[4096];
    if (c->run_name[0]) snprintf(run_dir, sizeof run_dir, "%s/%s", c->out_dir, c->run_name);
    int found = ckpt_resolve_err(c->resume, run_dir, from, sizeof from, err, sizeof err);
    if (found < 0) CG_FAIL("", "%s", err);
    if (found == 0 && strcmp(c->resume, "auto") == 0)
        printf("resume = auto: no complete checkpoint in %s yet; starting at step 0\n", run_dir);
    if (found == 1) {
        CkptState st;
        dp_load(&dp, from, c, &params, ema.on ? &ema.table : NULL, &ctx, &st);
        ClassifyCursor cur;
        CG_CHECK(st.cursor_bytes == sizeof cur, "the checkpoint was not written by this version of cgspn train",
                 "%s: data cursor of %zu bytes, expected %zu", from, st.cursor_bytes, sizeof cur);
        memcpy(&cur, st.cursor, sizeof cur);
        CG_CHECK(cur.version == CLASSIFY_CURSOR_VERSION, "", "%s: data cursor version %u, expected %d",
                 from, cur.version, CLASSIFY_CURSOR_VERSION);
        first = st.step;
        CG_CHECK(first <= total, "raise max_steps / epochs, or resume an earlier checkpoint",
                 "%s is at step %ld, past the %ld steps of this run", from, first, total);
        loss_sum = cur.loss_sum;
        loss_n = (int)cur.loss_n;
        skipped = (long)cur.skipped;
        LoaderCursor lc = {cur.epoch, cur.step};
        if ((int)cur.micro_batch != micro) {   // the same epoch, at the first image not yet seen
            int64_t spe = loader_steps_per_epoch(train), seen = cur.step * (int64_t)cur.micro_batch;
            lc.step = (seen + micro - 1) / micro;
            if (lc.step >= spe) lc = (LoaderCursor){cur.epoch + 1, 0};
            printf("note: the micro-batch changed from %u to %d images since the checkpoint; data "
                   "continues at epoch %lld, batch %lld\n", cur.micro_batch, micro,
                   (long long)lc.epoch, (long long)lc.step);
        }
        if (loader_cursor_set(train, lc, err, sizeof err) != 0) CG_FAIL("", "%s", err);
        if (ema.on && !st.ema_loaded) {
            printf("note: the checkpoint has no EMA weights; the EMA starts from its weights\n");
            ema_update(&ema, &ctx, &params, 0.0f);
        }
        printf("resumed from %s at step %ld\n", from, first);
    } else if (c->init[0]) {   // fine-tuning from another run (e.g. at another img_size); a
                               // distillation checkpoint's adaptors are ignored
        ckpt_load_init(c->init, &params, &ctx, "adaptors.", "encoder", stdout);
        if (ema.on) ema_update(&ema, &ctx, &params, 0.0f);   // the EMA starts from them
    }
    RunLog log;
    dp_runlog_open(&dp, &log, c, "train");
    snprintf(res.run_dir, sizeof res.run_dir, "%s", log.dir);
    printf("training: %ld steps (%ld per epoch), batch %d", total, steps_per_epoch, c->batch_size);
    if (A > 1) printf(" (%d x %d accumulated)", A, micro);
    if (dp.world > 1) printf(" (%d ranks x %d per micro-batch)", dp.world, micro / dp.world);
    printf(", lr %g", opt.schedule.base_lr);
    if (c->lr_scale_batch > 0) printf(" (%g x %d / %d)", c->lr, c->batch_size, c->lr_scale_batch);
    printf(", warmup %ld steps", warmup);
    if (c->drop_path > 0) printf(", drop_path %g", c->drop_path);
    if (ema.on) printf(", ema %g", c->ema_decay);
    if (mesa.weight > 0)
        printf(", MESA %g (T %g) from epoch %d", mesa.weight, mesa.temperature, mesa.start_epoch);
    if (c->cuda_graph && gpu && A == 1 && dp.world == 1)
        printf(", steps replayed as a CUDA graph%s", mesa.weight > 0 ? " until MESA starts" : "");
    printf("\n");

    Arena arena;
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    const ParamTable *tables[2] = {&params, &ema.table};
    MemoryPlan held = memory_plan(&ctx, tables, ema.on ? 2 : 1, &arena);
    memory_header_print(stdout, &held);
    memory_peak_take(&ctx);   // the window of the first progress line starts here
    RunState rs = {.c = c, .o = o, .log = &log, .params = &params, .ema = &ema, .mesa = &mesa,
                   .enc = &enc, .ctx = &ctx, .tape = &tape, .train = train, .val = val,
                   .micro_batch = micro, .accum = A, .dp = &dp};
    step_graph_init(&rs.graph, &ctx, c->cuda_graph);
    LoopSpec spec = {
        .c = c, .ctx = &ctx, .dp = &dp, .log = &log, .params = &params, .arena = &arena,
        .opt = &opt, .first = first, .total = total, .eval_every = eval_every,
        .stop_after = o->stop_after, .step_losses = o->step_losses,
        .images_per_step = c->batch_size,
        .flops_step = 3.0 * encoder_flops_per_image(&ecfg) * c->batch_size,   // forward + backward
        .peak_flops = device_peak_flops(&ctx, c) * dp.world,   // every rank's GPU
        .tables = tables, .n_tables = ema.on ? 2 : 1};
    LoopHooks hooks = {&rs, train_step, train_updated, NULL, train_eval, save_checkpoint};
    LoopResult lr = loop_run(&spec, &hooks, (LoopWindow){loss_sum, loss_n, skipped});
    long step = lr.step;
    skipped = lr.skipped;
    res.status = lr.status;
    res.nonfinite_step = lr.nonfinite_step;
    EvalResult ev = rs.ev, ev_ema = rs.ev_ema;
    if (res.status == TRAIN_DONE && ev.count == 0) {   // resumed at the end: nothing left to train
        ev = classify_evaluate_dp(&ctx, &enc, val, &dp, c->cuda_graph);
        if (ema.on) ev_ema = classify_evaluate_dp(&ctx, &ema.enc, val, &dp, c->cuda_graph);
        print_eval(&log, step, &ev, &ev_ema, 0);
    }
    char dur[32];
    if (res.status == TRAIN_DONE) {
        printf("done: %ld steps in %s, final test top1 %.2f%% (top5 %.2f%%)", total,
               format_duration(now_seconds() - log.t_start, dur, sizeof(dur)), 100 * ev.top1,
               100 * ev.top5);
        if (ema.on) printf(", ema top1 %.2f%%", 100 * ev_ema.top1);
        if (skipped) printf(", %ld steps skipped (non-finite)", skipped);
        printf("\n");
    }
    res.graph_steps = rs.graph.replayed;
    step_graph_free(&rs.graph);
    tape_free(&tape);
    arena_free(&arena);
    runlog_close(&log);
    loader_close(train);
    loader_close(val);
    ema_free(&ema, &ctx);
    dp_close(&dp);
    params_free(&params, &ctx);
    device_close(&ctx);
    res.step = step;
    res.total = total;
    res.skipped = skipped;
    res.eval = ev;
    res.eval_ema = ev_ema;
    return res;
}

int cmd_train(int argc, char **argv) {
    Config c;
    config_defaults(&c);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            train_usage(stdout);
            return 0;
        }
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn train --help", "unexpected argument '%s'", argv[2]);
    if (c.threads > 0) omp_set_num_threads(c.threads);
    CG_CHECK(strcmp(c.resume, "auto") != 0 || c.run_name[0], "set run_name to the run to continue",
             "resume = auto needs run_name: it continues the run folder out_dir/run_name");
    TrainResult r = classify_train(&c, NULL);
    return r.status == TRAIN_NONFINITE ? 1 : 0;
}

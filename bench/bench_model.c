// `cgspn bench vit` and `cgspn bench block` (bench/bench_model.h).
//
// Timing: CUDA events on the context's stream around each phase, median over the timed
// repetitions after warm-up (first-call setup: GEMM plans, cuDNN graphs, arena chunks). Inputs
// are random, never zeros. A training step is exactly what `cgspn train` runs: tape forward,
// cross-entropy, tape backward, optimizer_step (global norm over all gradients, clipping, AdamW;
// it downloads the norm, the step's one host sync).
//
// MFU: model FLOPs of a step (3 x encoder_flops_per_image x batch: forward + backward) over the
// step time, against 989 TFLOP/s, the dense bf16 tensor-core peak of the H100 and H200 SXM
// (NVIDIA datasheet); not measured here (`cgspn bench gemm` measures what cuBLASLt reaches).
//
// Memory: "act GiB" is the arena's high-water mark (activations, their gradients and tape
// scratch); "GPU GiB" is device_memory_use's peak from the context's opening through the timed
// steps: parameters, gradients, moments, masters, arena, workspaces and the stream-ordered pool,
// this process's own (torch.cuda.max_memory_reserved's counterpart; PyTorch's number also covers
// its model, gradients and AdamW state, allocated before its statistics are reset).
//
// Every case runs twice: grad_checkpoint = 0 and 1 (every block recomputed in backward), beside
// timm's eager/compiled and eager_ckpt/compiled_ckpt (set_grad_checkpointing).
#include "bench_model.h"
#include "../train/config.h"
#include "../train/model_config.h"
#include "op_profile.h"
#include "timm_json.h"
#include "../train/optimizer.h"
#include "../kernels/device.h"
#include "../nn/encoder.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include "cuda/kernel_bench.h"

#pragma weak cuda_bench_copy_gbs

// The device's copy bandwidth, measured once per process (the per-op profile's % copy column).
static double copy_gbs(void) {
    static double gbs = -1;
    if (gbs < 0) gbs = cuda_bench_copy_gbs ? cuda_bench_copy_gbs() : 0;
    return gbs;
}
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_PEAK_TFLOPS 989.0   // H100 / H200 SXM, dense bf16 (datasheet)

enum { VIT_WARMUP = 5, VIT_STEPS = 20 };

// ---- small helpers ----------------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void print_header(FILE *out, const char *what) {
    const DeviceInfo d = device_gpu_info(0);
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    fprintf(out, "cgspn bench %s: %s (%d SMs, %.1f GiB), %s, bf16\n", what, d.name, d.sm_count,
            d.total_bytes / 1073741824.0, date);
}

// A tensor with its own device memory (outside the tape's arena), random in [lo, hi): a random
// block of at most 4M values uploaded once, then copied along the tensor (doubling copies).
static Tensor *random_tensor(Ctx *ctx, int ndim, const int *shape, DType dt, uint64_t seed,
                             float lo, float hi) {
    Tensor *t = cg_calloc(1, sizeof(Tensor));
    tensor_set_shape(t, ndim, shape);
    t->dtype = dt;
    t->device = DEVICE_CUDA;
    t->data = device_alloc(ctx, tensor_bytes(t));
    size_t block = t->numel < ((size_t)1 << 22) ? t->numel : ((size_t)1 << 22);
    float *host = cg_malloc((block ? block : 1) * sizeof(float));
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < block; i++) host[i] = lo + (hi - lo) * rng_uniform(&r);
    Tensor head = *t;
    tensor_set_shape(&head, 1, (int[]){(int)block});
    tensor_upload_f32(ctx, &head, host);
    free(host);
    size_t done = block * dtype_size(dt), total = tensor_bytes(t);
    while (done < total) {
        size_t n = done < total - done ? done : total - done;
        device_copy(ctx, (char *)t->data + done, t->data, n);
        done += n;
    }
    device_synchronize(ctx);
    return t;
}

static void free_tensor(Ctx *ctx, Tensor *t) {
    if (!t) return;
    device_free(ctx, t->data);
    free(t);
}

// ---- bench vit -----------------------------------------------------------------------------------

typedef struct VitCase {
    const char *label, *key, *config;   // key: bench_timm.py's model key
    int batch;
} VitCase;

// so14 at 378 px: batch 32 (the block benchmark's batch; timm's eager step at 64 does not fit an
// 80 GB H100 with room to spare). It gets a 1000-class head on the mean token (avg pooling).
static const VitCase VIT_CASES[] = {
    {"ViT-B/16", "vit_b16", "configs/vit_b16.cfg", 256},
    {"so14 ViT", "vit_so14", "configs/vit_so14.cfg", 32},
};

typedef struct VitRow {
    int img, batch;
    double step_ms, fwd_ms, bwd_ms, opt_ms, wall_ms, flops;
    double act_gib, gpu_gib;   // arena peak; device_memory_use peak
    float loss, grad_norm;
    int ckpt;                  // grad_checkpoint
    double infer_ms;           // forward + head without gradients (eval), when asked for
    double step_graph_ms;      // the step with forward, loss and backward replayed as one graph
    double infer_graph_ms;     // inference replayed as one graph
} VitRow;

typedef struct VitRun {
    Ctx *ctx;
    Encoder *enc;
    ParamTable *params;
    Arena *arena;
    Tape *tape;
    Tensor *img, *tgt;
    OptimizerConfig opt;
} VitRun;

// One training step; ev (4) mark start, forward + loss, backward, optimizer.
static StepStats vit_step(VitRun *r, long step, DeviceEvent **ev, float *loss_out) {
    tape_reset(r->tape);
    device_event_record(ev[0]);
    Tensor *logits = encoder_head(r->tape, r->enc, encoder_forward(r->tape, r->enc, r->img, NULL));
    Tensor *loss = nn_cross_entropy(r->tape, logits, r->tgt);
    tape_keep(r->tape, loss);   // read after the step
    device_event_record(ev[1]);
    tape_backward(r->tape, loss);
    device_event_record(ev[2]);
    StepStats st = optimizer_step(r->params, r->ctx, r->arena, &r->opt, step);
    device_event_record(ev[3]);
    device_event_wait(ev[3]);
    CG_CHECK(st.finite, "", "bench vit: the gradient norm is not finite at step %ld", step + 1);
    if (loss_out) tensor_download(r->ctx, loss, loss_out);
    return st;
}

// ckpt: grad_checkpoint (0 off, 1 every block recomputed in backward).
// Forward + head with gradients off (inference): the median of VIT_STEPS after VIT_WARMUP.
static double infer_median_ms(VitRun *r, DeviceEvent **ev) {
    bool was = tape_set_grad_enabled(r->tape, false);
    double ms[VIT_STEPS];
    for (int i = 0; i < VIT_WARMUP + VIT_STEPS; i++) {
        tape_reset(r->tape);
        device_event_record(ev[0]);
        encoder_head(r->tape, r->enc, encoder_forward(r->tape, r->enc, r->img, NULL));
        device_event_record(ev[1]);
        device_event_wait(ev[1]);
        if (i >= VIT_WARMUP) ms[i - VIT_WARMUP] = device_event_ms(ev[0], ev[1]);
    }
    tape_set_grad_enabled(r->tape, was);
    return median(ms, VIT_STEPS);
}

// The median of VIT_STEPS replays of g after VIT_WARMUP, each followed by `then` (if any).
static double graph_median_ms(VitRun *r, DeviceGraph *g, long *step, DeviceEvent **ev,
                              void (*then)(VitRun *, long)) {
    double ms[VIT_STEPS];
    for (int i = 0; i < VIT_WARMUP + VIT_STEPS; i++) {
        device_event_record(ev[0]);
        device_graph_launch(g);
        if (then) then(r, (*step)++);
        device_event_record(ev[1]);
        device_event_wait(ev[1]);
        if (i >= VIT_WARMUP) ms[i - VIT_WARMUP] = device_event_ms(ev[0], ev[1]);
    }
    return median(ms, VIT_STEPS);
}

// Inference captured once as a graph and replayed: the host's launches drop out of the time.
static double infer_graph_median_ms(VitRun *r, DeviceEvent **ev) {
    bool was = tape_set_grad_enabled(r->tape, false);
    tape_reset(r->tape);
    device_graph_begin(r->ctx);
    encoder_head(r->tape, r->enc, encoder_forward(r->tape, r->enc, r->img, NULL));
    DeviceGraph *g = device_graph_end(r->ctx);
    tape_set_grad_enabled(r->tape, was);
    long unused = 0;
    double ms = graph_median_ms(r, g, &unused, ev, NULL);
    device_graph_free(g);
    return ms;
}

static void graph_step_optimizer(VitRun *r, long step) {
    StepStats st = optimizer_step(r->params, r->ctx, r->arena, &r->opt, step);
    CG_CHECK(st.finite, "", "bench: the gradient norm is not finite at step %ld", step + 1);
}

// A training step whose forward, loss and backward are one captured graph; AdamW (which reads
// the gradient norm on the host) runs as usual after each replay.
static double step_graph_median_ms(VitRun *r, long *step, DeviceEvent **ev) {
    tape_reset(r->tape);
    device_graph_begin(r->ctx);
    Tensor *logits = encoder_head(r->tape, r->enc, encoder_forward(r->tape, r->enc, r->img, NULL));
    Tensor *loss = nn_cross_entropy(r->tape, logits, r->tgt);
    tape_backward(r->tape, loss);
    DeviceGraph *g = device_graph_end(r->ctx);
    double ms = graph_median_ms(r, g, step, ev, graph_step_optimizer);
    device_graph_free(g);
    return ms;
}

// One inference (forward + head, gradients off) under the per-op profile: its op table into out.
static void profile_inference(FILE *out, const char *label, int batch, VitRun *r, DeviceEvent **ev,
                              double infer_ms) {
    bool was = tape_set_grad_enabled(r->tape, false);
    tape_reset(r->tape);
    OpProfile *p = op_profile_start(r->ctx);
    device_event_record(ev[0]);
    encoder_head(r->tape, r->enc, encoder_forward(r->tape, r->enc, r->img, NULL));
    device_event_record(ev[1]);
    op_profile_stop(p);
    tape_set_grad_enabled(r->tape, was);
    double ms = device_event_ms(ev[0], ev[1]);
    fprintf(out, "\nper-op profile of one %s inference (batch %d): %.2f ms with an event pair "
                 "around every op (%.2f ms without)\n", label, batch, ms, infer_ms);
    op_profile_print(out, p, ms, copy_gbs(), BENCH_BF16_PEAK_TFLOPS);
    op_profile_free(p);
}

static void bench_one_vit(FILE *out, const VitCase *vc, int ckpt, VitRow *row, bool profile,
                          bool infer) {
    Config c;
    config_defaults(&c);
    config_load_file(&c, vc->config);
    if (c.num_classes == 0) c.num_classes = 1000;   // the so14 teacher shape has no head
    c.grad_checkpoint = ckpt;
    EncoderConfig ec = encoder_config_from(&c);
    Ctx ctx = device_open_gpu(0, DTYPE_BF16);
    device_memory_reset_peak(&ctx);   // the peak covers everything this run allocates
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ec, &params);
    params_alloc(&params, &ctx);
    params_initialize(&params, &ctx, 1234);
    Arena arena;
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);

    int B = vc->batch, K = ec.num_classes;
    Tensor *img = random_tensor(&ctx, 4, (int[]){B, ec.in_chans, ec.img_h, ec.img_w}, DTYPE_F32,
                                77, -2.0f, 2.0f);
    float *targets = cg_calloc((size_t)B * K, sizeof(float));
    Rng rng;
    rng_seed(&rng, 99);
    for (int b = 0; b < B; b++) targets[(size_t)b * K + rng_below(&rng, (uint32_t)K)] = 1.0f;
    Tensor *tgt = cg_calloc(1, sizeof(Tensor));
    tensor_set_shape(tgt, 2, (int[]){B, K});
    tgt->dtype = DTYPE_F32;
    tgt->device = DEVICE_CUDA;
    tgt->data = device_alloc(&ctx, tensor_bytes(tgt));
    tensor_upload(&ctx, tgt, targets);
    free(targets);

    VitRun run = {&ctx, &enc, &params, &arena, &tape, img, tgt,
                  {.schedule = {1e-4f, 1e-4f, 0, 1000000}, .beta1 = 0.9f, .beta2 = 0.999f,
                   .eps = 1e-8f, .weight_decay = 0.05f, .grad_clip = 1.0f}};
    DeviceEvent *ev[4];
    for (int i = 0; i < 4; i++) ev[i] = device_event_create(&ctx);
    long step = 0;
    for (int i = 0; i < VIT_WARMUP; i++) vit_step(&run, step++, ev, NULL);
    double st_ms[VIT_STEPS], f_ms[VIT_STEPS], b_ms[VIT_STEPS], o_ms[VIT_STEPS];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    StepStats last = {0};
    for (int i = 0; i < VIT_STEPS; i++) {
        last = vit_step(&run, step++, ev, i == VIT_STEPS - 1 ? &row->loss : NULL);
        st_ms[i] = device_event_ms(ev[0], ev[3]);
        f_ms[i] = device_event_ms(ev[0], ev[1]);
        b_ms[i] = device_event_ms(ev[1], ev[2]);
        o_ms[i] = device_event_ms(ev[2], ev[3]);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    row->wall_ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6) / VIT_STEPS;
    row->grad_norm = last.grad_norm;
    row->img = ec.img_h;
    row->batch = B;
    row->step_ms = median(st_ms, VIT_STEPS);
    row->fwd_ms = median(f_ms, VIT_STEPS);
    row->bwd_ms = median(b_ms, VIT_STEPS);
    row->opt_ms = median(o_ms, VIT_STEPS);
    row->flops = 3.0 * encoder_flops_per_image(&ec) * B;
    row->act_gib = arena.peak / 1073741824.0;
    row->gpu_gib = device_memory_use(&ctx).peak / 1073741824.0;
    row->ckpt = ckpt;
    if (infer) {
        row->infer_ms = infer_median_ms(&run, ev);
        row->infer_graph_ms = infer_graph_median_ms(&run, ev);
        row->step_graph_ms = step_graph_median_ms(&run, &step, ev);
    }

    if (profile) {
        OpProfile *p = op_profile_start(&ctx);
        vit_step(&run, step++, ev, NULL);
        op_profile_stop(p);
        double ms = device_event_ms(ev[0], ev[3]);
        fprintf(out, "\nper-op profile of one %s step (batch %d): %.2f ms with an event pair "
                     "around every op (%.2f ms without)\n", vc->label, B, ms, row->step_ms);
        op_profile_print(out, p, ms, copy_gbs(), BENCH_BF16_PEAK_TFLOPS);
        op_profile_free(p);
        if (infer) profile_inference(out, vc->label, B, &run, ev, row->infer_ms);
    }
    for (int i = 0; i < 4; i++) device_event_free(ev[i]);
    free_tensor(&ctx, img);
    free_tensor(&ctx, tgt);
    tape_free(&tape);
    arena_free(&arena);
    params_free(&params, &ctx);
    device_close(&ctx);
}

int bench_vit_run(FILE *out) {
    if (device_gpu_count() == 0) {
        fprintf(out, "bench vit: no CUDA device visible\n");
        return 1;
    }
    print_header(out, "vit");
    fprintf(out, "step = forward + cross-entropy + backward + AdamW (global-norm clip 1.0); median "
                 "of %d steps after %d warm-up (CUDA events)\n", VIT_STEPS, VIT_WARMUP);
    fprintf(out, "MFU = 3 x forward FLOPs (encoder_flops_per_image) x batch / step time / %.0f "
                 "TFLOP/s (H100/H200 SXM dense bf16, datasheet, not measured)\n", BENCH_PEAK_TFLOPS);
    const int n_cases = (int)(sizeof VIT_CASES / sizeof VIT_CASES[0]);
    const int n = 2 * n_cases;   // each case with grad_checkpoint = 0, then 1
    VitRow rows[2 * 8];
    char labels[2 * 8][32];
    const VitCase *cases[2 * 8];
    memset(rows, 0, sizeof rows);
    char *profile_text = NULL;
    size_t profile_len = 0;
    FILE *prof = open_memstream(&profile_text, &profile_len);
    CG_CHECK(prof != NULL, "", "bench vit: open_memstream failed");
    for (int i = 0; i < n; i++) {
        const VitCase *vc = &VIT_CASES[i / 2];
        const int ckpt = i % 2;
        cases[i] = vc;
        snprintf(labels[i], sizeof labels[i], "%s%s", vc->label, ckpt ? " ckpt" : "");
        fprintf(stderr, "bench vit: %s ...\n", labels[i]);
        bench_one_vit(prof, vc, ckpt, &rows[i], i == 0, false);   // the op profile: the first case only
    }
    fclose(prof);
    fprintf(out, "ckpt = grad_checkpoint 1 (every block recomputed in backward); GPU GiB = "
                 "device_memory_use peak (parameters, gradients, AdamW state, arena, workspaces, "
                 "pool), act GiB = the arena's peak\n");
    fprintf(out, "\n%-14s %4s %5s %8s %7s %7s %7s %8s %8s %6s %8s %8s %7s\n", "model", "img",
            "batch", "step ms", "fwd ms", "bwd ms", "opt ms", "img/s", "TFLOP/s", "MFU",
            "act GiB", "GPU GiB", "loss");
    for (int i = 0; i < n; i++) {
        const VitRow *r = &rows[i];
        double tf = r->flops / (r->step_ms * 1e-3) / 1e12;
        fprintf(out, "%-14s %4d %5d %8.2f %7.2f %7.2f %7.2f %8.0f %8.1f %5.1f%% %8.2f %8.2f %7.3f\n",
                labels[i], r->img, r->batch, r->step_ms, r->fwd_ms, r->bwd_ms, r->opt_ms,
                r->batch / (r->step_ms * 1e-3), tf, 100.0 * tf / BENCH_PEAK_TFLOPS, r->act_gib,
                r->gpu_gib, r->loss);
    }
    fprintf(out, "(host wall clock per step, mean of the timed steps:");
    for (int i = 0; i < n; i++) fprintf(out, " %s %.2f ms", labels[i], rows[i].wall_ms);
    fprintf(out, ")\n\n");

    char *json = timm_json_load(out);
    if (json) {
        fprintf(out, "%-14s %5s %9s %9s %11s %11s %9s %9s %9s %11s %14s %9s\n", "model", "batch",
                "eager ms", "eager/s", "compiled ms", "compiled/s", "eager GiB", "comp. GiB",
                "cgspn GiB", "cgspn/eager", "cgspn/compiled", "mem ratio");
        for (int i = 0; i < n; i++) {
            const char *key = cases[i]->key;
            const char *eager = rows[i].ckpt ? "eager_ckpt" : "eager";
            const char *comp = rows[i].ckpt ? "compiled_ckpt" : "compiled";
            int tb = (int)timm_json_numberf(json, "%s/batch", key);
            double e_ms = timm_json_numberf(json, "%s/%s/step_ms", key, eager);
            double c_ms = timm_json_numberf(json, "%s/%s/step_ms", key, comp);
            double e_gib = timm_json_numberf(json, "%s/%s/peak_reserved_gib", key, eager);
            double c_gib = timm_json_numberf(json, "%s/%s/peak_reserved_gib", key, comp);
            double ours = rows[i].batch / (rows[i].step_ms * 1e-3);
            double e_ips = e_ms > 0 ? tb / (e_ms * 1e-3) : 0, c_ips = c_ms > 0 ? tb / (c_ms * 1e-3) : 0;
            fprintf(out, "%-14s %5d %9.2f %9.0f %11.2f %11.0f %9.2f %9.2f %9.2f %10.2fx %13.2fx "
                         "%8.2fx%s\n",
                    labels[i], tb, e_ms, e_ips, c_ms, c_ips, e_gib, c_gib, rows[i].gpu_gib,
                    e_ips > 0 ? ours / e_ips : 0, c_ips > 0 ? ours / c_ips : 0,
                    c_gib > 0 ? rows[i].gpu_gib / c_gib : 0,
                    tb == rows[i].batch ? "" : "  (batch differs)");
        }
        fprintf(out, "(ckpt rows against timm's eager_ckpt and compiled_ckpt, set_grad_checkpointing; "
                     "eager/comp. GiB = torch.cuda.max_memory_reserved over the timed steps; "
                     "mem ratio = cgspn GiB / comp. GiB)\n");
        fprintf(out, "(ratios are img/s over img/s; 0 = not measured)\n");
        free(json);
    }
    if (profile_text) {
        fputs(profile_text, out);
        free(profile_text);
    }
    return 0;
}

// ---- bench classify ------------------------------------------------------------------------------

// The fast GSPN classifiers (C-GSPN paper, Table 2) at 224 px; timm's peers in bench_timm.py
// (CLASSIFY_MODELS), both at batch 128.
static const VitCase CLASSIFY_CASES[] = {
    {"gspn_t", "gspn_t", "configs/gspn_t.cfg", 128},
    {"gspn_s", "gspn_s", "configs/gspn_s.cfg", 128},
    {"gspn_b", "gspn_b", "configs/gspn_b.cfg", 128},
};
static const char *const CLASSIFY_TIMM[] = {"convnext_tiny", "deit_small", "swin_tiny",
                                             "convnext_small", "swin_small", "convnext_base",
                                             "swin_base", "deit_base"};
// Each gspn model's peer: the ratio targets are against it, compiled (1.3x inference, 1.0x step).
static const char *const CLASSIFY_PEER[] = {"convnext_tiny", "convnext_small", "convnext_base"};
#define CLASSIFY_TARGET_INFER 1.3
#define CLASSIFY_TARGET_TRAIN 1.0
// ms per GMAC of a training step: the models' spread (max / min - 1) should stay under this; a
// width that runs off the fast paths shows as a cliff.
#define CLASSIFY_MS_PER_GMAC_SPREAD 0.25

enum { CLASSIFY_N = sizeof CLASSIFY_CASES / sizeof CLASSIFY_CASES[0] };

// The index of the classify model labelled `label`; fails naming the labels otherwise.
static int classify_index(const char *opt, const char *label) {
    for (int i = 0; i < CLASSIFY_N; i++)
        if (strcmp(CLASSIFY_CASES[i].label, label) == 0) return i;
    CG_FAIL("the models are gspn_t, gspn_s and gspn_b", "bench classify: %s names no model '%s'", opt, label);
}

int bench_classify_cmd(int argc, char **argv, int first) {
    ClassifyOptions o = {0};
    char model[16];
    for (int i = first; i < argc; i++) {
        if (strncmp(argv[i], "--only=", 7) == 0) {
            o.only = CLASSIFY_CASES[classify_index("--only", argv[i] + 7)].label;
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            const char *spec = argv[i] + 9, *colon = strchr(spec, ':');
            CG_CHECK(colon && colon > spec && colon[1] && (size_t)(colon - spec) < sizeof model,
                     "for example --config=gspn_b:/tmp/gspn_b_3_7_11_5.cfg",
                     "bench classify: --config=%s is not LABEL:PATH", spec);
            memcpy(model, spec, (size_t)(colon - spec));
            model[colon - spec] = '\0';
            o.model = CLASSIFY_CASES[classify_index("--config", model)].label;
            o.config = colon + 1;
            FILE *f = fopen(o.config, "r");
            CG_CHECK(f != NULL, "give a config file's path", "bench classify: cannot open %s", o.config);
            fclose(f);
        } else {
            CG_FAIL("cgspn bench classify [--only=LABEL] [--config=LABEL:PATH]",
                    "bench classify: unexpected argument '%s'", argv[i]);
        }
    }
    CG_CHECK(!o.only || !o.model || strcmp(o.only, o.model) == 0, "name the same model in both",
             "bench classify: --config reads %s, which --only=%s leaves out", o.model, o.only);
    printf("== cgspn bench classify");
    for (int i = first; i < argc; i++) printf(" %s", argv[i]);
    printf("\n");
    fflush(stdout);
    return bench_classify(stdout, &o);
}

int bench_classify_run(FILE *out) { return bench_classify(out, &(ClassifyOptions){0}); }

int bench_classify(FILE *out, const ClassifyOptions *o) {
    if (device_gpu_count() == 0) {
        fprintf(out, "bench classify: no CUDA device visible\n");
        return 1;
    }
    print_header(out, "classify");
    fprintf(out, "train step = forward + cross-entropy + backward + AdamW (clip 1.0); inference = "
                 "forward + head without gradients; median of %d after %d warm-up (CUDA events)\n",
            VIT_STEPS, VIT_WARMUP);
    enum { N = CLASSIFY_N };
    VitCase cases[N];
    bool on[N];
    int active = 0;
    for (int i = 0; i < N; i++) {
        cases[i] = CLASSIFY_CASES[i];
        on[i] = !o->only || strcmp(o->only, cases[i].label) == 0;
        active += on[i];
        if (o->model && strcmp(o->model, cases[i].label) == 0) {
            cases[i].config = o->config;
            fprintf(out, "%s from %s\n", cases[i].label, o->config);
        }
    }
    VitRow rows[N];
    memset(rows, 0, sizeof rows);
    char *profile_text = NULL;
    size_t profile_len = 0;
    FILE *prof = open_memstream(&profile_text, &profile_len);
    CG_CHECK(prof != NULL, "", "bench classify: open_memstream failed");
    for (int i = 0; i < N; i++) {
        if (!on[i]) continue;
        fprintf(stderr, "bench classify: %s ...\n", cases[i].label);
        bench_one_vit(prof, &cases[i], 0, &rows[i], true, true);
    }
    fclose(prof);
    fprintf(out, "\n%-8s %4s %5s %8s %9s %8s %9s %8s %7s %8s %8s\n", "model", "img", "batch",
            "step ms", "train/s", "infer ms", "infer/s", "GMACs", "GPU GiB", "step g", "infer g");
    for (int i = 0; i < N; i++) {
        if (!on[i]) continue;
        const VitRow *r = &rows[i];
        fprintf(out, "%-8s %4d %5d %8.2f %9.0f %8.2f %9.0f %8.3f %7.2f %8.2f %8.2f\n",
                cases[i].label, r->img, r->batch, r->step_ms, r->batch / (r->step_ms * 1e-3),
                r->infer_ms, r->batch / (r->infer_ms * 1e-3), r->flops / 3.0 / r->batch / 2e9,
                r->gpu_gib, r->step_graph_ms, r->infer_graph_ms);
    }
    fprintf(out, "(step g, infer g: ms with forward and backward, or inference, replayed as one "
                 "CUDA graph)\n");
    char *json = timm_json_load(out);
    if (json) {
        fprintf(out, "\ntimm (same device run, bf16 autocast, batch %d):\n%-14s %10s %10s %10s %10s\n",
                (int)timm_json_numberf(json, "classify/%s/batch", CLASSIFY_TIMM[0]), "model",
                "train/s", "train/s c", "infer/s", "infer/s c");
        for (size_t j = 0; j < sizeof CLASSIFY_TIMM / sizeof *CLASSIFY_TIMM; j++) {
            const char *k = CLASSIFY_TIMM[j];
            const double v[4] = {timm_json_numberf(json, "classify/%s/eager/step_img_per_s", k),
                                 timm_json_numberf(json, "classify/%s/compiled/step_img_per_s", k),
                                 timm_json_numberf(json, "classify/%s/eager/infer_img_per_s", k),
                                 timm_json_numberf(json, "classify/%s/compiled/infer_img_per_s", k)};
            if (v[0] == 0 && v[1] == 0 && v[2] == 0 && v[3] == 0) continue;   // a peer the json lacks
            fprintf(out, "%-14s %10.0f %10.0f %10.0f %10.0f\n", k, v[0], v[1], v[2], v[3]);
        }
        for (int i = 0; i < N; i++) {
            if (!on[i]) continue;
            const char *peer = CLASSIFY_PEER[i];
            double p_train = timm_json_numberf(json, "classify/%s/compiled/step_img_per_s", peer);
            double p_infer = timm_json_numberf(json, "classify/%s/compiled/infer_img_per_s", peer);
            const VitRow *r = &rows[i];
            // as `cgspn train` and `cgspn eval` run them (cuda_graph: replayed)
            double step_ms = r->step_graph_ms > 0 ? r->step_graph_ms : r->step_ms;
            double infer_ms = r->infer_graph_ms > 0 ? r->infer_graph_ms : r->infer_ms;
            double train = r->batch / (step_ms * 1e-3), infer = r->batch / (infer_ms * 1e-3);
            fprintf(out, "%s / %s compiled: inference %.2fx (target %.1fx), training step %.2fx "
                         "(target %.1fx)\n", cases[i].label, peer,
                    p_infer > 0 ? infer / p_infer : 0, CLASSIFY_TARGET_INFER,
                    p_train > 0 ? train / p_train : 0, CLASSIFY_TARGET_TRAIN);
        }
        fprintf(out, "(c = torch.compile; 0 = not measured; cgspn: step g and infer g, replayed as "
                     "`cgspn train` and `cgspn eval` run them)\n");
        free(json);
    }
    // GMACs per image from the step's FLOPs (3 x forward); ms per GMAC of the whole batch.
    double lo = 0, hi = 0;
    fprintf(out, "training step ms per GMAC (batch x GMACs per image):");
    for (int i = 0; i < N; i++) {
        if (!on[i]) continue;
        const VitRow *r = &rows[i];
        double per = r->step_ms / (r->flops / 3.0 / 2e9);
        fprintf(out, " %s %.4f", cases[i].label, per);
        if (lo == 0 || per < lo) lo = per;
        if (per > hi) hi = per;
    }
    if (active == N)
        fprintf(out, "; spread %.0f%% (target: at most %.0f%%)\n", lo > 0 ? 100.0 * (hi / lo - 1) : 0,
                100.0 * CLASSIFY_MS_PER_GMAC_SPREAD);
    else
        fprintf(out, " (the spread needs the three models)\n");
    if (profile_text) {
        fputs(profile_text, out);
        free(profile_text);
    }
    return 0;
}

// ---- bench block ---------------------------------------------------------------------------------

enum { BLOCK_B = 32, BLOCK_C = 1152, BLOCK_MLP = 4304, BLOCK_HEADS = 16, BLOCK_LATENT = 64,
       BLOCK_PATCH = 14 };

// gpu_gib: device_memory_use's peak over the fwd+bwd repetitions (reset before them): the block's
// parameters and their gradients, x, dy and its seed, the arena, workspaces, the pool.
typedef struct BlockTimes { double fwd_ms, fwdbwd_ms, flops_fwd, act_gib, gpu_gib; } BlockTimes;

// dy0: the seed's values; dy, refilled from it before each repetition (outside the timing), is
// consumed by the backward as torch's y.backward(dy) reads its argument (no copy).
static double block_median(Tape *tape, Ctx *ctx, int warmup, int reps, bool backward,
                           const Encoder *enc, Tensor *x, const Tensor *dy0, Tensor *dy) {
    DeviceEvent *a = device_event_create(ctx), *b = device_event_create(ctx);
    double t[32];
    tape_set_grad_enabled(tape, backward);
    for (int i = 0; i < warmup + reps; i++) {
        tape_reset(tape);
        x->grad = NULL;   // last repetition's gradient lived in the arena
        if (backward)
            device_copy(ctx, dy->data, dy0->data, tensor_bytes(dy));
        device_event_record(a);
        Tensor *y = encoder_block_forward(tape, enc, &enc->blocks[0], x, NULL);
        if (backward) tape_backward_from_consume(tape, 1, &y, &dy);
        device_event_record(b);
        device_event_wait(b);
        if (i >= warmup) t[i - warmup] = device_event_ms(a, b);
    }
    tape_set_grad_enabled(tape, true);
    x->grad = NULL;
    device_event_free(a);
    device_event_free(b);
    return median(t, reps);
}

// One profiled forward + backward of the block (after the timed ones): the op table into prof.
static void block_profile(FILE *prof, const char *label, Tape *tape, Ctx *ctx, const Encoder *enc,
                          Tensor *x, const Tensor *dy0, Tensor *dy, double timed_ms) {
    tape_reset(tape);
    x->grad = NULL;
    device_copy(ctx, dy->data, dy0->data, tensor_bytes(dy));
    OpProfile *p = op_profile_start(ctx);
    op_profile_mark(p, "forward");
    Tensor *y = encoder_block_forward(tape, enc, &enc->blocks[0], x, NULL);
    op_profile_mark(p, "backward");
    tape_backward_from_consume(tape, 1, &y, &dy);
    op_profile_stop(p);
    x->grad = NULL;
    OpPhase ph[2];
    int n = op_profile_phases(p, ph, 2);
    double ms = op_profile_total_ms(p);
    fprintf(prof, "\nper-op profile of one %s forward + backward: %.2f ms with an event pair around "
                  "every op (%.2f ms without)", label, ms, timed_ms);
    for (int k = 0; k < n; k++) fprintf(prof, "; %s %.2f ms", ph[k].name, ph[k].ms);
    fprintf(prof, "\n");
    op_profile_print(prof, p, ms, copy_gbs(), BENCH_BF16_PEAK_TFLOPS);
    fprintf(prof, "the calls in order (ms):\n");
    op_profile_print_calls(prof, p, 4);
    op_profile_free(p);
}

// One block of the given kind at px x px (patch 14), forward alone (no tape) and forward +
// backward (weight gradients too) from a random fp32 dy. prof: the per-op profile (NULL: none).
static BlockTimes bench_one_block(EncoderKind kind, int px, int warmup, int reps, FILE *prof) {
    EncoderConfig ec = {0};
    ec.kind = kind;
    ec.img_h = ec.img_w = px;
    ec.in_chans = 3;
    ec.patch = BLOCK_PATCH;
    ec.width = BLOCK_C;
    ec.depth = 1;
    ec.heads = BLOCK_HEADS;
    ec.mlp_hidden = BLOCK_MLP;
    ec.gelu = GELU_TANH;
    ec.ln_eps = 1e-6f;
    ec.avg_pool = 1;
    ec.qkv_bias = 1;
    ec.gspn_latent = BLOCK_LATENT;
    ec.gspn_out_norm = 1;
    Ctx ctx = device_open_gpu(0, DTYPE_BF16);
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ec, &params);
    params_alloc(&params, &ctx);
    params_initialize(&params, &ctx, 4321);
    Arena arena;
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    int N = (px / BLOCK_PATCH) * (px / BLOCK_PATCH);
    int shape[3] = {BLOCK_B, N, BLOCK_C};
    Tensor *x = random_tensor(&ctx, 3, shape, DTYPE_F32, 5, -2.0f, 2.0f);
    Tensor *dy0 = random_tensor(&ctx, 3, shape, DTYPE_F32, 6, -1.0f, 1.0f);
    Tensor *dy = random_tensor(&ctx, 3, shape, DTYPE_F32, 6, -1.0f, 1.0f);   // consumed copy
    x->requires_grad = true;
    BlockTimes bt;
    bt.fwd_ms = block_median(&tape, &ctx, warmup, reps, false, &enc, x, dy0, dy);
    // A fresh arena for the other allocation sequence: its chunks are those this sequence needs,
    // as in a run that only trains.
    tape_free(&tape);
    arena_free(&arena);
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    tape_init(&tape, &ctx, &arena);
    device_memory_reset_peak(&ctx);   // PyTorch's block peak: its fwd+bwd calls alone
    bt.fwdbwd_ms = block_median(&tape, &ctx, warmup, reps, true, &enc, x, dy0, dy);
    bt.act_gib = arena.peak / 1073741824.0;
    bt.gpu_gib = device_memory_use(&ctx).peak / 1073741824.0;
    if (prof) {
        char label[64];
        snprintf(label, sizeof label, "%s block at %d px", kind == ENCODER_CGSPN ? "C-GSPN" : "attention", px);
        block_profile(prof, label, &tape, &ctx, &enc, x, dy0, dy, bt.fwdbwd_ms);
    }
    // the block's FLOPs: the encoder's, less its patch embedding
    bt.flops_fwd = (encoder_flops_per_image(&ec) -
                    2.0 * N * BLOCK_C * 3 * BLOCK_PATCH * BLOCK_PATCH) * BLOCK_B;
    free_tensor(&ctx, x);
    free_tensor(&ctx, dy);
    free_tensor(&ctx, dy0);
    tape_free(&tape);
    arena_free(&arena);
    params_free(&params, &ctx);
    device_close(&ctx);
    return bt;
}

int bench_block_run(FILE *out) {
    if (device_gpu_count() == 0) {
        fprintf(out, "bench block: no CUDA device visible\n");
        return 1;
    }
    print_header(out, "block");
    fprintf(out, "one so14-width block: B=%d, C=%d, MLP %d, GELU tanh; attention: %d heads (cuDNN "
                 "flash attention); C-GSPN: Cc=%d; fp32 residual in and out, bf16 inside\n",
            BLOCK_B, BLOCK_C, BLOCK_MLP, BLOCK_HEADS, BLOCK_LATENT);
    fprintf(out, "fwd = forward without the tape; fwd+bwd = forward with the tape + backward from a "
                 "random dy (input and weight gradients; dy used in place, as torch's backward(dy)); "
                 "medians after warm-up (CUDA events)\n");
    fprintf(out, "GPU GiB = peak over the fwd+bwd calls (cgspn: device_memory_use; PyTorch: "
                 "max_memory_reserved); no recomputation here: one block, nothing to recompute\n");
    const int pxs[2] = {1036, 2058};
    const int warm[2] = {2, 1}, reps[2] = {10, 5};
    BlockTimes t[2][2];   // [px][0 = C-GSPN, 1 = attention]
    char *profile_text = NULL;   // the C-GSPN block's op table at 2058 px, printed last
    size_t profile_len = 0;
    FILE *prof = open_memstream(&profile_text, &profile_len);
    CG_CHECK(prof != NULL, "", "bench block: open_memstream failed");
    for (int i = 0; i < 2; i++) {
        fprintf(stderr, "bench block: %d px ...\n", pxs[i]);
        t[i][0] = bench_one_block(ENCODER_CGSPN, pxs[i], warm[i], reps[i], i == 1 ? prof : NULL);
        t[i][1] = bench_one_block(ENCODER_VIT, pxs[i], warm[i], reps[i], NULL);
    }
    fclose(prof);
    char *json = NULL;
    {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        json = timm_json_load(m);
        fclose(m);
        fputs(buf, out);
        free(buf);
    }
    fprintf(out, "\n%5s %8s %-28s %9s %9s %11s %9s %9s %9s\n", "px", "tokens", "block", "fwd ms",
            "TFLOP/s", "fwd+bwd ms", "TFLOP/s", "act GiB", "GPU GiB");
    for (int i = 0; i < 2; i++) {
        int g = pxs[i] / BLOCK_PATCH;
        char tok[32];
        snprintf(tok, sizeof tok, "%dx%d", g, g);
        const char *names[2] = {"C-GSPN (cgspn)", "attention (cgspn)"};
        for (int k = 0; k < 2; k++) {
            BlockTimes *b = &t[i][k];
            fprintf(out, "%5d %8s %-28s %9.2f %9.1f %11.2f %9.1f %9.2f %9.2f\n", pxs[i], tok,
                    names[k], b->fwd_ms, b->flops_fwd / (b->fwd_ms * 1e-3) / 1e12, b->fwdbwd_ms,
                    3 * b->flops_fwd / (b->fwdbwd_ms * 1e-3) / 1e12, b->act_gib, b->gpu_gib);
        }
        const char *modes[2] = {"eager", "compiled"};
        for (int m = 0; m < 2; m++) {
            char k1[96], k2[96], label[64];
            snprintf(k1, sizeof k1, "block/%d/%s/fwd_ms", pxs[i], modes[m]);
            snprintf(k2, sizeof k2, "block/%d/%s/fwdbwd_ms", pxs[i], modes[m]);
            double f = timm_json_number(json, k1), fb = timm_json_number(json, k2);
            double gib = timm_json_numberf(json, "block/%d/%s/peak_reserved_gib", pxs[i], modes[m]);
            snprintf(label, sizeof label, "PyTorch SDPA (timm, %s)", modes[m]);
            if (f > 0 || fb > 0)
                fprintf(out, "%5d %8s %-28s %9.2f %9.1f %11.2f %9.1f %9s %9.2f\n", pxs[i], tok,
                        label, f, f > 0 ? t[i][1].flops_fwd / (f * 1e-3) / 1e12 : 0, fb,
                        fb > 0 ? 3 * t[i][1].flops_fwd / (fb * 1e-3) / 1e12 : 0, "", gib);
        }
    }
    fprintf(out, "\nspeed-ups (time of the other / time of the C-GSPN block; targets: fwd+bwd "
                 ">= 3x the compiled PyTorch block at 1036 px, >= 10x at 2058 px)\n");
    fprintf(out, "(mem = the C-GSPN block's GPU GiB / the other's: below 1 = C-GSPN needs less)\n");
    fprintf(out, "%5s %-34s %8s %9s %7s\n", "px", "against", "fwd", "fwd+bwd", "mem");
    for (int i = 0; i < 2; i++) {
        const BlockTimes *c = &t[i][0];
        fprintf(out, "%5d %-34s %7.2fx %8.2fx %6.2fx\n", pxs[i], "attention block (cgspn)",
                t[i][1].fwd_ms / c->fwd_ms, t[i][1].fwdbwd_ms / c->fwdbwd_ms,
                t[i][1].gpu_gib > 0 ? c->gpu_gib / t[i][1].gpu_gib : 0);
        const char *modes[2] = {"eager", "compiled"};
        for (int m = 0; m < 2; m++) {
            char k1[96], k2[96], label[64];
            snprintf(k1, sizeof k1, "block/%d/%s/fwd_ms", pxs[i], modes[m]);
            snprintf(k2, sizeof k2, "block/%d/%s/fwdbwd_ms", pxs[i], modes[m]);
            double f = timm_json_number(json, k1), fb = timm_json_number(json, k2);
            double gib = timm_json_numberf(json, "block/%d/%s/peak_reserved_gib", pxs[i], modes[m]);
            snprintf(label, sizeof label, "PyTorch SDPA block (%s)", modes[m]);
            if (f > 0 || fb > 0)
                fprintf(out, "%5d %-34s %7.2fx %8.2fx %6.2fx\n", pxs[i], label, f / c->fwd_ms,
                        fb / c->fwdbwd_ms, gib > 0 ? c->gpu_gib / gib : 0);
        }
    }
    free(json);
    fputs(profile_text, out);
    free(profile_text);
    return 0;
}

#include "features.h"
#include "cli_args.h"
#include "config.h"
#include "device_config.h"
#include "model_config.h"
#include "../kernels/error.h"
#include "../nn/params_io.h"
#include "../nn/safetensors.h"

static void features_usage(FILE *f) {
    fprintf(f,
        "usage: cgspn features CONFIG --weights W.safetensors --images X.safetensors\n"
        "                      --out F.safetensors [--grads G.safetensors] [--key=value ...]\n"
        "Runs the encoder of CONFIG with the weights of W (timm names; teacher_prefix is\n"
        "stripped; a pos_embed made for another grid is resampled to this one, as timm's\n"
        "resample_abs_pos_embed) on X's tensor \"images\" (B, in_chans, H, W), float, and\n"
        "writes to F:\n"
        "  blocks.N.pp   (B, T, C)  mixing-layer output before the residual add (PP tap)\n"
        "  blocks.N.pb   (B, T, C)  block output (PB tap)\n"
        "  norm          (B, T, C)  tokens after the final norm (T includes the class and\n"
        "                           register tokens; with fc_norm not normed, as timm's)\n"
        "  pooled        (B, C)     the summary: class token or mean of the patch tokens, then\n"
        "                           fc_norm when the model has it, or the MAP head's output\n"
        "                           (global_pool = map) (timm pre_logits)\n"
        "  logits        (B, K)     when the model has a head (num_classes > 0)\n"
        "With --grads, X must also hold \"probe_norm\" (shape of norm) and, with a head,\n"
        "\"probe_logits\" (and may hold \"probe_pooled\"): the loss sum(norm * probe_norm) +\n"
        "sum(logits * probe_logits) (+ sum(pooled * probe_pooled)) is backpropagated and every\n"
        "parameter's gradient is written to G under its name. A MAP head runs forward only:\n"
        "its model backpropagates probe_norm alone (no probe_logits, no probe_pooled).\n"
        "All outputs are F32.\n");
}

typedef struct Outputs {
    StWriteTensor *t;
    float **data;
    int n, cap;
} Outputs;

static void outputs_add(Outputs *o, Ctx *ctx, const char *name, const Tensor *x, int ndim,
                        const int *shape) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 64;
        o->t = cg_realloc(o->t, (size_t)o->cap * sizeof(StWriteTensor));
        o->data = cg_realloc(o->data, (size_t)o->cap * sizeof(float *));
    }
    StWriteTensor *w = &o->t[o->n];
    memset(w, 0, sizeof(*w));
    w->name = cg_strdup(name);
    w->dtype = ST_F32;
    w->ndim = ndim;
    for (int i = 0; i < ndim; i++) w->shape[i] = shape[i];
    o->data[o->n] = tensor_to_host_f32(ctx, x);
    w->data = o->data[o->n];
    o->n++;
}

static void outputs_write(Outputs *o, const char *path) {
    char err[2048];
    if (st_write_err(path, o->t, o->n, NULL, 0, NULL, NULL, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
    for (int i = 0; i < o->n; i++) {
        free((char *)o->t[i].name);
        free(o->data[i]);
    }
    free(o->t);
    free(o->data);
    memset(o, 0, sizeof(*o));
}

// A float tensor of the images file as a tensor of the run (fp32, or of the activation dtype
// when act), or NULL when absent.
static Tensor *read_input(StFile *f, Tape *t, const char *name, int want_ndim, bool act) {
    const StTensor *s = st_find(f, name);
    if (!s) return NULL;
    CG_CHECK(s->ndim == want_ndim, "", "%s: tensor %s has %d dims, expected %d", f->path, name,
             s->ndim, want_ndim);
    int shape[TENSOR_MAX_DIMS];
    for (int i = 0; i < s->ndim; i++) shape[i] = (int)s->shape[i];
    float *host = cg_malloc(s->numel * sizeof(float));
    char err[1024];
    if (st_read_f32_err(f, s, host, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    Tensor *x = tape_tensor(t, s->ndim, shape, !act);
    tensor_upload_f32(t->ctx, x, host);
    free(host);
    return x;
}

static void check_same_shape(const char *path, const char *name, const Tensor *probe,
                             const Tensor *out) {
    char a[64], b[64];
    CG_CHECK(tensor_same_shape(probe, out), "", "%s: %s has shape %s, the output has %s", path,
             name, tensor_shape_str(probe, a, sizeof a), tensor_shape_str(out, b, sizeof b));
}

int cmd_features(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        features_usage(stdout);
        return 0;
    }
    const char *weights = cli_take_flag(&argc, argv, 2, "--weights");
    const char *images = cli_take_flag(&argc, argv, 2, "--images");
    const char *out = cli_take_flag(&argc, argv, 2, "--out");
    const char *grads = cli_take_flag(&argc, argv, 2, "--grads");
    if (!weights || !images || !out) {
        features_usage(stderr);
        CG_FAIL("see the usage above", "cgspn features needs --weights, --images and --out");
    }
    Config c;
    config_defaults(&c);
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn features --help", "unexpected argument '%s'", argv[2]);

    Ctx ctx = device_open(&c);
    device_describe(&ctx, stdout);
    StFile imgs;
    st_open(&imgs, images);
    const StTensor *it = st_find(&imgs, "images");
    CG_CHECK(it && it->ndim == 4, "write the batch as a float tensor named \"images\" (B,C,H,W)",
             "%s: no 4-D tensor \"images\"", images);
    // The images' own H x W, square or not: the token grid follows, and a pos_embed of another
    // grid is resampled to it (below).
    c.img_size = (int)it->shape[2];
    EncoderConfig ecfg = encoder_config_from(&c);
    ecfg.img_w = (int)it->shape[3];
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ecfg, &params);
    params_alloc(&params, &ctx);
    // Weights made for another token grid (a timm ViT at its own resolution): pos_embed is
    // resampled to this grid, as timm's resample_abs_pos_embed does.
    LoadReport report = {.pos_grid_h = enc.grid_h, .pos_grid_w = enc.grid_w};
    params_load_safetensors(&params, &ctx, weights, c.teacher_prefix, &report);
    load_report_print(&report, stdout);
    load_report_free(&report);
    encoder_describe(&enc, &params, stdout);

    Arena arena;
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    tape_set_grad_enabled(&tape, grads != NULL);
    Tensor *x = read_input(&imgs, &tape, "images", 4, false);
    EncoderTaps taps;
    Tensor *norm = encoder_forward(&tape, &enc, x, &taps);
    // A MAP head (global_pool = map) runs forward only: its pooled vector and logits are not
    // recorded, and --grads then backpropagates probe_norm alone.
    bool recorded_head = !ecfg.map_pool;
    bool was = tape_set_grad_enabled(&tape, tape.grad_enabled && recorded_head);
    Tensor *pooled = encoder_pool(&tape, &enc, norm);
    Tensor *logits = ecfg.num_classes > 0 ? encoder_head(&tape, &enc, norm) : NULL;
    tape_set_grad_enabled(&tape, was);

    Outputs o = {0};
    int B = norm->shape[0], T = norm->shape[1], C = norm->shape[2];
    char name[64];
    for (int i = 0; i < ecfg.depth; i++) {
        // (B, tokens, C) of the block's own stage: a hierarchical encoder's grids and widths
        // change from stage to stage.
        int Ci = taps.pb[i]->shape[taps.pb[i]->ndim - 1], Ti = (int)(taps.pb[i]->numel / ((size_t)B * Ci));
        snprintf(name, sizeof name, "blocks.%d.pp", i);
        outputs_add(&o, &ctx, name, taps.pp[i], 3, (int[]){B, Ti, Ci});
        snprintf(name, sizeof name, "blocks.%d.pb", i);
        outputs_add(&o, &ctx, name, taps.pb[i], 3, (int[]){B, Ti, Ci});
    }
    outputs_add(&o, &ctx, "norm", norm, 3, (int[]){B, T, C});
    outputs_add(&o, &ctx, "pooled", pooled, 2, (int[]){B, C});
    if (logits) outputs_add(&o, &ctx, "logits", logits, 2, (int[]){B, ecfg.num_classes});
    outputs_write(&o, out);
    printf("wrote %s: %d blocks x (pp, pb), norm, pooled%s for %d images\n", out, ecfg.depth,
           logits ? ", logits" : "", B);

    if (grads) {
        // d(sum(norm * probe))/dnorm = probe: the probes seed the backward pass directly.
        Tensor *outs[3] = {norm, recorded_head ? logits : NULL, pooled}, *seeds[3];
        seeds[0] = read_input(&imgs, &tape, "probe_norm", 3, norm->dtype != DTYPE_F32);
        CG_CHECK(seeds[0], "add a tensor probe_norm of the norm output's shape", "%s: --grads "
                 "needs the tensor probe_norm", images);
        check_same_shape(images, "probe_norm", seeds[0], norm);
        if (logits && recorded_head) {
            seeds[1] = read_input(&imgs, &tape, "probe_logits", 2, true);
            CG_CHECK(seeds[1], "add a tensor probe_logits of the logits' shape", "%s: --grads "
                     "needs probe_logits for a model with a head", images);
            check_same_shape(images, "probe_logits", seeds[1], logits);
        }
        int n_out = 1;
        if (outs[1]) outs[n_out] = logits, seeds[n_out++] = seeds[1];
        Tensor *probe_pooled = read_input(&imgs, &tape, "probe_pooled", 2, pooled->dtype != DTYPE_F32);
        CG_CHECK(!probe_pooled || recorded_head, "leave probe_pooled out for a MAP-head model",
                 "%s: probe_pooled with global_pool = map, whose head has no backward", images);
        if (probe_pooled) {
            check_same_shape(images, "probe_pooled", probe_pooled, pooled);
            outs[n_out] = pooled, seeds[n_out++] = probe_pooled;
        }
        params_zero_grads(&params, &ctx);
        tape_backward_from(&tape, n_out, outs, seeds);
        for (int i = 0; i < params.n; i++) {
            Param *p = params.params[i];
            outputs_add(&o, &ctx, p->name, &p->grad, p->value.ndim, p->value.shape);
        }
        outputs_write(&o, grads);
        printf("wrote %s: gradients of %d parameters\n", grads, params.n);
    }
    st_close(&imgs);
    tape_free(&tape);
    arena_free(&arena);
    params_free(&params, &ctx);
    device_close(&ctx);
    return 0;
}

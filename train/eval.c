// `cgspn eval CONFIG --weights W`: top-1/top-5 and cross-entropy of given weights on the
// validation split of data_shards, through the loader's eval path (resize the shorter side to
// img_size / eval_crop_pct, centre-crop img_size).
#include "checkpoint.h"
#include "classify.h"
#include "cli_args.h"
#include "data_config.h"
#include "device_config.h"
#include "model_config.h"
#include "runlog.h"
#include "../kernels/error.h"
#include "../nn/params_io.h"
#include <omp.h>
#include <sys/stat.h>

static void eval_usage(FILE *f) {
    fprintf(f,
        "usage: cgspn eval CONFIG --weights W [--ema] [--key=value ...]\n"
        "       cgspn eval RUN [--ema] [--key=value ...]\n"
        "Top-1/top-5 accuracy and loss of the encoder of CONFIG on val_split of data_shards\n"
        "(shorter side resized to img_size / eval_crop_pct, centre crop img_size). W is\n"
        "  a safetensors weight file (cgspn or timm names; teacher_prefix is stripped),\n"
        "  a checkpoint folder (its model.safetensors), or a run folder (its newest checkpoint).\n"
        "--ema evaluates the EMA weights a checkpoint holds (ema_decay > 0 while training).\n"
        "RUN, a run or checkpoint folder alone, reads the run's own config.cfg (every key it\n"
        "was trained with, command-line overrides included) and its newest checkpoint.\n"
        "Example: cgspn eval configs/fmnist_vit.cfg --weights checkpoints/demo_vit\n");
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

// The config.cfg of a run folder, or of the run folder a checkpoint folder is in, into out;
// false when there is none.
static bool run_config_of(const char *dir, char *out, size_t n) {
    snprintf(out, n, "%s/config.cfg", dir);
    if (is_file(out)) return true;
    snprintf(out, n, "%s/../config.cfg", dir);
    return is_file(out);
}

int cmd_eval(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        eval_usage(stdout);
        return 0;
    }
    const char *weights = cli_take_flag(&argc, argv, 2, "--weights");
    bool use_ema = cli_take_switch(&argc, argv, 2, "--ema");
    char run_cfg[1200];
    if (!weights && argc >= 3 && is_dir(argv[2])) {   // cgspn eval RUN
        CG_CHECK(run_config_of(argv[2], run_cfg, sizeof run_cfg),
                 "pass a run folder (cgspn train / distill write config.cfg there), or CONFIG "
                 "--weights W", "%s has no config.cfg, nor has its parent folder", argv[2]);
        weights = argv[2];
        argv[2] = run_cfg;
        printf("config: %s\n", run_cfg);
    }
    if (!weights) {
        eval_usage(stderr);
        CG_FAIL("see the usage above", "cgspn eval needs --weights");
    }
    Config c;
    config_defaults(&c);
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn eval --help", "unexpected argument '%s'", argv[2]);
    CG_CHECK(c.num_classes > 0, "set num_classes", "eval needs a classification head: num_classes = 0");
    if (c.threads > 0) omp_set_num_threads(c.threads);

    // The file to read: a weight file, or model.safetensors / state.safetensors of a checkpoint.
    char ckpt[1024], path[1200], err[2048];
    const char *prefix = c.teacher_prefix;
    if (is_dir(weights)) {
        int found = ckpt_resolve_err(weights, "", ckpt, sizeof ckpt, err, sizeof err);
        CG_CHECK(found == 1, "pass a checkpoint folder, a run folder or a .safetensors file", "%s",
                 found < 0 ? err : "no complete checkpoint there");
        snprintf(path, sizeof path, "%s/%s", ckpt, use_ema ? "state.safetensors" : "model.safetensors");
        if (use_ema) prefix = "ema.";
    } else {
        CG_CHECK(!use_ema, "pass the checkpoint folder with --ema",
                 "--ema reads a checkpoint's training state; %s is a file", weights);
        snprintf(path, sizeof path, "%s", weights);
    }

    // The shards first: a head that does not match their classes is refused by num_classes
    // before the weights (of that head's shape) are read.
    Loader *val = loader_open_from_config(&c, 0, c.eval_batch_size > 0 ? c.eval_batch_size
                                                                      : c.batch_size, false);
    data_check_classes(&c, NULL, val, "cgspn eval");

    Ctx ctx = device_open(&c);
    device_describe(&ctx, stdout);
    EncoderConfig ecfg = encoder_config_from(&c);
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ecfg, &params);
    params_alloc(&params, &ctx);
    LoadReport report = {0};
    if (params_load_safetensors_err(&params, &ctx, path, prefix, &report, err, sizeof err) != 0)
        CG_FAIL(use_ema ? "was the run trained with ema_decay > 0?" : "", "%s", err);
    printf("weights: %s (%d tensors%s)\n", path, report.n_loaded, use_ema ? ", EMA" : "");
    load_report_free(&report);
    encoder_describe(&enc, &params, stdout);

    double t0 = now_seconds();
    EvalResult ev = classify_evaluate(&ctx, &enc, val, c.cuda_graph);
    printf("eval %s | %s top1 %.2f%% | top5 %.2f%% | loss %.4f | %ld images | %.1f s\n",
           c.val_split, use_ema ? "ema" : "weights", 100 * ev.top1, 100 * ev.top5, ev.loss,
           ev.count, now_seconds() - t0);
    loader_close(val);
    params_free(&params, &ctx);
    device_close(&ctx);
    return 0;
}
